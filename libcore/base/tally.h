/* Counting skipped records by reason, with the first few of each reason
 * reported in full (file/line/member and why) and a summary at the end. */
#ifndef SDTK_TALLY_H
#define SDTK_TALLY_H

#include <stdint.h>

#include "buf.h"

enum { SD_TALLY_MAX = 48 };

typedef struct {
    const char *reason; /* a string literal: compared by content, never freed */
    uint64_t n;
} sd_tally_entry;

typedef struct {
    sd_tally_entry e[SD_TALLY_MAX];
    int n;
    uint64_t total;
    int show_limit; /* messages shown per reason; -1 = all */
    const char *verb; /* first word of each message: "skip" (default), "problem", ... */
} sd_tally;

void sd_tally_init(sd_tally *t, int show_limit);
void sd_tally_add(sd_tally *t, const char *reason, uint64_t n);
void sd_skip(sd_tally *t, const char *reason, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sd_tally_merge(sd_tally *into, const sd_tally *from);
uint64_t sd_tally_count(const sd_tally *t, const char *reason);
void sd_tally_log(const sd_tally *t, const char *what);
void sd_tally_json(const sd_tally *t, sd_buf *b);

#endif
