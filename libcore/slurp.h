/* Reading a whole (small to medium) file into memory: rules files, JSON
 * documents, kohya metadata, class maps. */
#ifndef SDTK_SLURP_H
#define SDTK_SLURP_H

#include "buf.h"
#include "err.h"

sd_status sd_read_file(const char *path, sd_buf *out, sd_error *err);

#endif
