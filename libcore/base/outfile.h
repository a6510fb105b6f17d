/* Output files that appear whole or not at all: written to a temporary name
 * in the same directory, fsync'ed, then renamed over the target. */
#ifndef SDTK_OUTFILE_H
#define SDTK_OUTFILE_H

#include <stdio.h>

#include "err.h"

typedef struct {
    FILE *f;
    char *path; /* NULL for stdout (a device or FIFO keeps it for messages) */
    char *tmp;
    int special; /* writing straight into a device or FIFO */
    long long flushed; /* bytes handed to the kernel's write-back so far */
    char *iobuf;       /* the stream's 1 MiB buffer */
} sd_outfile;

sd_status sd_outfile_open(sd_outfile *o, const char *path, sd_error *err);
/* Warn about each file beside path named path's base name + infix + more
 * (a killed run's temporary output, e.g. sd_outfile_open's PATH.tmp.*, or
 * one a running run is writing: the warning says which; never removed);
 * also is appended to the advice, e.g. " (and its -lock)". Tools call it
 * once per output they name (a readdir each: not per file of an export). */
void sd_outfile_warn_leftovers(const char *path, const char *infix, const char *also);
/* That warning for one such file. */
void sd_outfile_warn_leftover(const char *path, const char *also);
/* Whether a live process is writing the temporary output at path (holds
 * its writer's flock): 1 yes, 0 no (a leftover, or gone), -1 cannot tell
 * (errno says why). */
int sd_outfile_held(const char *path);
/* The same for sd_outfile_open's own PATH.tmp.* names; NULL or "-": nothing. */
void sd_outfile_warn_own_leftovers(const char *path);
sd_status sd_outfile_commit(sd_outfile *o, sd_error *err);
/* commit in two halves, for a set of files that must all be whole first */
sd_status sd_outfile_finish(sd_outfile *o, sd_error *err);
sd_status sd_outfile_publish(sd_outfile *o, sd_error *err);
/* publish n finished files as one set: renames back to back, then one
 * fsync per directory (a kill between the renames can still mix sets) */
sd_status sd_outfile_publish_set(sd_outfile *v, int n, sd_error *err);
/* The renames under every set publish (files here, shards in sd-pack):
 * tmp[i] onto final[i] for i in [0, n) (a NULL tmp is skipped) back to
 * back, then each directory fsynced once. *tried: how many were reached
 * (the one whose rename failed is the last); the error names it and says
 * how many before it were already replaced. */
sd_status sd_rename_set(char *const *tmp, char *const *final, int n, int *tried, sd_error *err);
void sd_outfile_abort(sd_outfile *o);
void sd_outfile_writeback(sd_outfile *o);
/* an identity for the files one run publishes together, e.g.
 * "20260101T120000Z-3f9a1c2e" (cap >= 32) */
void sd_output_set_id(char *out, size_t cap);
sd_status sd_write_file_atomic(const char *path, const void *data, size_t len, sd_error *err);
/* mkdir -p: path and every missing parent (0777 less the umask). */
sd_status sd_make_dirs(const char *path, sd_error *err);

#endif
