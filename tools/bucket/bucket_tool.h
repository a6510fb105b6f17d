/* sd-bucket internals: the run over the input (bucket_run.c), the parts and
 * manifest of --split (bucket_parts.c) and the summary, --report and --plot
 * at the end (bucket_report.c). tools/sd_bucket.c is only the command line
 * and the plan it asks for. */
#ifndef SDTK_BUCKET_TOOL_H
#define SDTK_BUCKET_TOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <xxhash.h>

#include "bucket.h"
#include "bucket_rec.h"
#include "bucket_split.h"
#include "buf.h"
#include "err.h"
#include "outfile.h"
#include "pool.h"
#include "progress.h"
#include "tally.h"

/* Everything the run needs from the command line. */
typedef struct {
    const char *plan, *resolution, *buckets, *output, *report, *plot, *root;
    long min_bucket, max_bucket, steps, min_res, max_res, split, seed, threads;
    int no_upscale, upscale, strict, quiet, verbose, read_sizes, allow_empty;
} bucket_opts;

/* Buckets seen so far, in first-seen order, with an open-addressing index. */
typedef struct {
    int *w, *h;
    uint64_t *count;
    size_t n, cap;
    int32_t *slot; /* index+1, 0 = empty */
    size_t nslot;
} bucket_table;

/* One run: the plan, the workers and their batch scratch, what was counted,
 * and where the records go (the output, or the parts of a split). */
typedef struct {
    const bucket_opts *opt;
    sd_plan plan;
    sd_pool *pool;
    int nworkers;
    sd_brec_worker *wk;
    /* batch scratch */
    char **lines;
    size_t *lens;
    sd_brec_result *res;
    size_t *off, *olen;
    int *wid;
    /* results */
    bucket_table bt;
    sd_tally tally;
    uint64_t in, out;
    double sum_abs_err;
    FILE *sink; /* output stream when not splitting */
    sd_outfile *out_file; /* ... and its file, for early write-back */
    sd_stream_splitter ss; /* with --split: records go through here to parts */
    sd_outfile *parts;
    int nparts;
    uint64_t *part_counts;
    uint64_t *part_bytes;     /* for the manifest: each part's size ... */
    XXH3_state_t **part_hash; /* ... and XXH3-64 of its bytes */
    int bad_part, bad_errno;  /* the part whose write failed, and why */
    sd_progress prog;
} bucket_run;

/* The run over the input (bucket_run.c). */
sd_status bucket_run_init(bucket_run *r, const bucket_opts *o, sd_error *err);
sd_status bucket_run_file(bucket_run *r, const char *path, sd_error *err);
void bucket_run_free(bucket_run *r);

/* The parts of --split (bucket_parts.c). */
sd_status bucket_open_parts(bucket_run *r, sd_error *err);
int bucket_write_part(void *ctx, int part, const char *data, size_t len);
sd_status bucket_part_write_error(const bucket_run *r, sd_error *err);
sd_status bucket_close_parts(bucket_run *r, sd_status st, sd_error *err);

/* The summary, --report and --plot (bucket_report.c). */
sd_status bucket_finish_outputs(const bucket_run *r, const uint64_t *part_counts, sd_error *err);

#endif
