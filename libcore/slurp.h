/* Reading a whole (small to medium) file into memory: rules files, JSON
 * documents, kohya metadata, class maps. */
#ifndef SDTK_SLURP_H
#define SDTK_SLURP_H

#include "arena.h"
#include "buf.h"
#include "err.h"
#include "json.h"

sd_status sd_read_file(const char *path, sd_buf *out, sd_error *err);
sd_status sd_parse_json_file(const char *path, sd_buf *text, sd_arena *a, sd_json **root, sd_error *err);

#endif
