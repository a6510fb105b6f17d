/* Reading a whole (small to medium) file into memory: rules files, JSON
 * documents, kohya metadata, class maps; and opening a file whose bytes
 * must be a regular file's (images, tar shards). */
#ifndef SDTK_SLURP_H
#define SDTK_SLURP_H

#include <sys/types.h>

#include "arena.h"
#include "buf.h"
#include "err.h"
#include "json.h"

sd_status sd_read_file(const char *path, sd_buf *out, sd_error *err);
/* Open path for reading only if it is a regular file: a FIFO (which would
 * block the open), a device or a directory gets an error without the path
 * (callers name the file); *fd is -1 then. *size (may be NULL): its bytes. */
sd_status sd_open_regular(const char *path, int *fd, off_t *size, sd_error *err);
sd_status sd_parse_json_file(const char *path, sd_buf *text, sd_arena *a, sd_json **root, sd_error *err);

#endif
