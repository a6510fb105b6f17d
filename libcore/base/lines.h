/* Reading a text file (or stdin) in large blocks of whole lines, so a
 * multi-gigabyte JSONL stream is parsed in parallel without per-line I/O. */
#ifndef SDTK_LINES_H
#define SDTK_LINES_H

#include <stddef.h>

#include "err.h"

typedef struct {
    int fd;
    const char *name;
    char *buf;
    size_t cap, len;  /* bytes held in buf */
    size_t keep;      /* bytes of the previous block's incomplete tail */
    long next_line;   /* line number of the first line of the next block */
    int eof;
    int started;      /* the first block was handed out (its BOM dropped) */
} sd_lines;

sd_status sd_lines_open(sd_lines *l, const char *path, size_t block, sd_error *err);
sd_status sd_lines_next(sd_lines *l, char **start, size_t *len, long *first_line, sd_error *err);
void sd_lines_close(sd_lines *l);
size_t sd_split_lines(char *block, size_t len, char **lines, size_t *lens, size_t max, size_t *used);

#endif
