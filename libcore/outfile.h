/* Output files that appear whole or not at all: written to a temporary name
 * in the same directory, fsync'ed, then renamed over the target. */
#ifndef SDTK_OUTFILE_H
#define SDTK_OUTFILE_H

#include <stdio.h>

#include "err.h"

typedef struct {
    FILE *f;
    char *path; /* NULL for stdout */
    char *tmp;
    int special; /* writing straight into a device or FIFO */
    long long flushed; /* bytes handed to the kernel's write-back so far */
    char *iobuf;       /* the stream's 1 MiB buffer */
} sd_outfile;

sd_status sd_outfile_open(sd_outfile *o, const char *path, sd_error *err);
sd_status sd_outfile_commit(sd_outfile *o, sd_error *err);
/* commit in two halves, for a set of files that must all be whole first */
sd_status sd_outfile_finish(sd_outfile *o, sd_error *err);
sd_status sd_outfile_publish(sd_outfile *o, sd_error *err);
void sd_outfile_abort(sd_outfile *o);
void sd_outfile_writeback(sd_outfile *o);
sd_status sd_write_file_atomic(const char *path, const void *data, size_t len, sd_error *err);
/* mkdir -p: path and every missing parent (0777 less the umask). */
sd_status sd_make_dirs(const char *path, sd_error *err);

#endif
