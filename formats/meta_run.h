/* The sd-meta pipeline: source readers add inputs to a batch; a full batch is
 * built, filtered and serialised by the worker pool, then emitted in input
 * order with duplicate keys dropped. Output order never depends on threads. */
#ifndef SDTK_META_RUN_H
#define SDTK_META_RUN_H

#include <stdio.h>

#include "keyset.h"
#include "outfile.h"
#include "pool.h"
#include "progress.h"
#include "rules.h"
#include "source.h"
#include "tally.h"

typedef struct sd_meta_worker sd_meta_worker;
typedef struct sd_meta_result sd_meta_result;

typedef enum { SD_OUT_JSONL, SD_OUT_KOHYA } sd_out_format;

typedef struct {
    /* settings */
    const sd_rules *rules;
    const sd_build_opts *bopts;
    sd_pool *pool;
    FILE *out;
    sd_outfile *out_file; /* optional: for early write-back of big outputs */
    sd_out_format format;
    int with_extra;
    size_t batch_cap;
    /* batch */
    sd_input *in;
    size_t n;
    sd_arena arena;     /* strings of the inputs in the batch */
    sd_arena run_arena; /* strings that live for the whole run (file names) */
    sd_meta_result *res;
    sd_meta_worker *workers;
    /* run state */
    sd_keyset keys;
    uint64_t read, written, next_ordinal;
    uint64_t written_out; /* records known to have reached stdout or a device (flushed without error) */
    uint64_t val_left_out; /* val records not written (kohya output has no split) */
    sd_tally skips;
    sd_tally ignored; /* files left out that are not errors (sd_meta_note_ignored) */
    sd_tally notes;   /* records kept with something to say (an unclosed '{' kept as a literal) */
    sd_progress progress;
    int write_failed, write_errno; /* the first failed write's errno */
} sd_meta_run;

sd_status sd_meta_run_init(sd_meta_run *m, const sd_rules *rules, const sd_build_opts *bopts, sd_pool *pool, FILE *out,
                           sd_out_format format, int show_limit, int progress, sd_error *err);
sd_input *sd_meta_add(sd_meta_run *m, sd_input_kind kind, const char *origin, long line);
void sd_meta_flush(sd_meta_run *m);
void sd_meta_skip_input(sd_meta_run *m, const char *reason, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sd_meta_note_ignored(sd_meta_run *m, const char *reason, const char *path);
const char *sd_meta_keep(sd_meta_run *m, const char *s);
const char *sd_meta_entry_origin(sd_meta_run *m, const char *file, long idx, const char *key, size_t klen);
sd_status sd_meta_finish(sd_meta_run *m, sd_error *err);
void sd_meta_run_free(sd_meta_run *m);

#endif
