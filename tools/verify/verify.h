/* sd-verify internals: the problems a check finds (verify_problem.c), the
 * checks of one record (verify_record.c), the parallel scan of a database
 * (verify_scan.c), the indexes, empty_text and manifest checks
 * (verify_index.c), one shard's verification and repair (verify_shard.c)
 * and the tally and JSON report (verify_report.c). tools/sd_verify.c is
 * only the command line. */
#ifndef SDTK_VERIFY_H
#define SDTK_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "err.h"
#include "pool.h"
#include "progress.h"
#include "shard.h"
#include "tally.h"

enum { VERIFY_DB_PAGES = -2 /* problem.db of damaged_page */ };

/* Everything a verification needs from the command line. */
typedef struct {
    const char *manifest, *report;
    long threads, examples;
    int repair, quiet, verbose;
} verify_opts;

/* One problem found: what, which record, and whether deleting it repairs it. */
typedef struct {
    const char *reason;
    int db; /* SD_SHARD_DB_LATENTS, _TEXT: --repair deletes the record (unless report_only);
             * SD_SHARD_DB_VARIANTS: --repair rewrites or deletes the variants entry (verify_fix_variants);
             * SD_SHARD_DB_META: a meta entry (report only); -1: an index, name or manifest
             * problem (the reindex fixes the indexes, the record stays); VERIFY_DB_PAGES:
             * damaged pages (the salvage replaces the file) */
    uint8_t *key;
    size_t klen;
    char *name;
    char detail[200];
} problem;

typedef struct {
    problem *v;
    size_t n, cap;
} problem_list;

/* Per-shard results. */
typedef struct {
    const char *path;
    int opened;
    char open_error[1024]; /* an sd_error message */
    uint64_t latents, texts, bytes;
    double seconds;
    sd_tally tally;
    problem_list probs;
    uint64_t repaired_latents, repaired_texts, repaired_variants;
    int reindexed;
    uint64_t after_repair; /* problems left after --repair */
    int salvaged;          /* damaged pages: --repair replaced the file with the intact entries */
    sd_shard_salvage_counts salvage;
    sd_buf examples;       /* JSON array items: the first few problems of each kind */
} shard_result;

/* The problem list (verify_problem.c). */
void verify_add_problem(problem_list *l, const char *reason, int db, const void *key, size_t klen, const char *name,
                        size_t nlen, const char *fmt, const char *detail);
void verify_free_problems(problem_list *l);
void verify_key_str(const uint8_t *k, size_t n, char *out, size_t cap);

/* The checks (verify_record.c, verify_scan.c, verify_index.c). */
void verify_check_record(sd_shard_txn *t, int db, const void *key, size_t klen, const void *val, size_t vlen,
                         problem_list *l);
sd_status verify_scan_db(sd_shard *s, int db, sd_pool *pool, sd_progress *prog, uint64_t prog_base, problem_list *out,
                         uint64_t *nrec, uint64_t *nbytes, sd_error *err);
sd_status verify_check_indexes(sd_shard *s, problem_list *out, sd_error *err);
sd_status verify_check_empty_text(sd_shard *s, problem_list *out, sd_error *err);
/* The caption variants entries (verify_variants.c): variant_missing (a
 * variant's embedding gone), bad_variants (malformed, or not starting with
 * the record's text_ref), variants_orphan (no record). */
sd_status verify_check_variants(sd_shard *s, problem_list *out, sd_error *err);
/* --repair: each unsound entry rewritten with the variants whose embedding
 * is there, or deleted (fewer than two left, malformed, no record); the
 * record stays. *fixed: entries changed. */
sd_status verify_fix_variants(sd_shard *s, uint64_t *fixed, sd_error *err);
sd_status verify_check_manifest(sd_shard *s, const char *path, problem_list *out, sd_error *err);

/* One shard (verify_shard.c) and what is told of it (verify_report.c). */
void verify_shard(const char *path, const verify_opts *o, sd_pool *pool, shard_result *res);
void verify_tally_problems(shard_result *res);
void verify_build_report(const shard_result *rs, int n, const verify_opts *o, sd_buf *b);

#endif
