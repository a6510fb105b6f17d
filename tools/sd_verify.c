/* sd-verify: check every record of one or more shards (header, checksum,
 * shape vs bucket, NaN/Inf, text references, bucket index, names, two
 * records of one name, the empty caption's embedding, and optionally a
 * manifest), report problems by kind, and with --repair delete the bad
 * records so the next writer run recomputes exactly those, then rebuild the
 * indexes (index problems alone never cost a record; a record of a newer
 * format version is never deleted). The checks and the repair live in
 * tools/verify/; this file is the command line. */
#include <stdlib.h>

#include "buf.h"
#include "cli.h"
#include "err.h"
#include "log.h"
#include "outfile.h"
#include "pool.h"
#include "progress.h"
#include "tally.h"
#include "verify.h"

/* Options, then each shard verified (and with --repair repaired) in turn, a summary per shard
 * and overall, and the JSON report. */
int main(int argc, char **argv)
{
    verify_opts o = {0};
    o.examples = 10;
    const sd_opt opts[] = {
        {"manifest", 'm', SD_OPT_STR, &o.manifest, "FILE.jsonl", "also require every record name (`key`) of this manifest"},
        {"report", 0, SD_OPT_STR, &o.report, "FILE", "write a JSON report (atomically)"},
        {"repair", 0, SD_OPT_FLAG, &o.repair, NULL,
         "delete bad records and rebuild the indexes (needs write access); see below"},
        {"examples", 0, SD_OPT_INT, &o.examples, "N", "problems shown (and reported) per kind (default 10)"},
        {"threads", 'j', SD_OPT_INT, &o.threads, "N", "worker threads (default: all CPUs)"},
        {"quiet", 'q', SD_OPT_FLAG, &o.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.verbose, NULL, "show every problem"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-verify", "[OPTIONS] SHARD...",
                  "Check every record of each shard: header sanity, payload checksum (XXH3), latent shape vs "
                  "bucket, NaN/Inf, a loss mask's shape (the bucket's or the latent size, fp32) and values (0..1), "
                  "text-embedding references, the bucket index and the names index (and that "
                  "no two records carry one name, and that each name leads to a record of that name), that the "
                  "meta empty_text names a text embedding the shard holds, and with --manifest that every record "
                  "name of a JSONL manifest is present. Problems are counted by kind.",
                  opts,
                  "--repair deletes the records that are bad themselves (bad_header, truncated, bad_checksum, "
                  "nan_inf, shape_mismatch, bad_mask (loss mask values outside 0..1), wrong_kind, text_ref_missing: the record whose text embedding is gone, "
                  "duplicate_name: the copy the names index does not lead to), then rebuilds the bucket index and "
                  "the names index from the records. Index problems (index_missing, name_missing, name_misindexed, "
                  "index_dangling, index_wrong_bucket, name_dangling, name_wrong_record, bucket_count) are fixed by "
                  "that rebuild alone: their records are kept. Two kinds are reported only and never repaired "
                  "(they count as problems left after --repair): newer_version, a record of a newer format version "
                  "(sound for a newer sdtk, so never deleted), and empty_text_missing, a meta empty_text naming a "
                  "text embedding the shard lacks (sd-train's conditioning dropout needs it).\n\n"
                  "Before the records, every page of the file's B-trees is checked (bounds of page headers, nodes "
                  "and overflow runs, pages used twice or both used and free, entry counts): damage there is one "
                  "damaged_page problem, and a file whose pages LMDB cannot read safely is not read. --repair then "
                  "replaces the file with a new one holding every record, text embedding and meta entry of its "
                  "intact pages (the indexes rebuilt), keeping the damaged file as SHARD.damaged (remove it when "
                  "done); what the damaged pages hide is taken from the snapshot before the last commit (LMDB's "
                  "other meta page) where that one still reaches it; the records damaged in both are missing from "
                  "the new file, and a rerun of sd-latents computes them again. It refuses, leaving the file as it "
                  "is, when LMDB's directory of databases is damaged in both snapshots or the file holds a newer "
                  "format.\n\n"
                  "Examples:\n"
                  "  sd-verify cache/*.shard --report verify.json\n"
                  "  sd-verify cache/latents.shard --manifest meta.jsonl --repair   # then rerun sd-latents\n",
        "0 every record sound, 1 problems found (also when --repair fixed them), 2 usage error, 3 a "
        "shard cannot be opened or another fatal error."};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) return rc;
    sd_log_setup("sd-verify", o.quiet ? SD_LOG_WARN : o.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    const char *bad = pos.n == 0 ? "no shard given"
                      : o.threads < 0 || o.examples < 0 ? "--threads and --examples must not be negative"
                                                          : NULL;
    if (bad) {
        sd_cli_usage_error(&cli, "%s", bad);
        sd_strlist_free(&pos);
        return SD_EXIT_USAGE;
    }
    sd_pool *pool = sd_pool_create(o.threads > 0 ? (int)o.threads : sd_default_threads());
    shard_result *rs = calloc((size_t)pos.n, sizeof *rs);
    if (!pool || !rs) {
        sd_log(SD_LOG_ERROR, "out of memory");
        return SD_EXIT_FATAL;
    }
    int exit_code = SD_EXIT_OK;
    uint64_t total_problems = 0, total_bytes = 0;
    double t0 = sd_now();
    for (int i = 0; i < pos.n; i++) {
        verify_shard(pos.v[i], &o, pool, &rs[i]);
        if (!rs[i].opened) exit_code = SD_EXIT_FATAL;
        else {
            total_problems += rs[i].tally.total;
            total_bytes += rs[i].bytes;
            sd_tally_log(&rs[i].tally, "problems");
            sd_log(SD_LOG_INFO, "%s: %llu records, %llu text records, %.2f GB in %.2f s (%.2f GB/s): %llu problems%s",
                   rs[i].path, (unsigned long long)rs[i].latents, (unsigned long long)rs[i].texts, rs[i].bytes / 1e9,
                   rs[i].seconds, rs[i].seconds > 0 ? rs[i].bytes / 1e9 / rs[i].seconds : 0.0,
                   (unsigned long long)rs[i].tally.total,
                   o.repair && rs[i].tally.total && !rs[i].after_repair ? " (repaired)" : "");
            if (o.repair && rs[i].after_repair)
                sd_log(SD_LOG_ERROR, "%s: %llu problems remain after repair", rs[i].path,
                       (unsigned long long)rs[i].after_repair);
        }
    }
    if (exit_code == SD_EXIT_OK && total_problems) exit_code = SD_EXIT_SKIPPED;
    if (pos.n > 1)
        sd_log(SD_LOG_INFO, "%d shards, %.2f GB in %.2f s: %llu problems", pos.n, total_bytes / 1e9, sd_now() - t0,
               (unsigned long long)total_problems);
    if (o.report) {
        sd_buf b;
        sd_buf_init(&b);
        verify_build_report(rs, pos.n, &o, &b);
        sd_error err;
        if (b.oom || sd_write_file_atomic(o.report, b.data, b.len, &err)) {
            sd_log(SD_LOG_ERROR, "%s: %s", o.report, b.oom ? "out of memory" : err.msg);
            exit_code = SD_EXIT_FATAL;
        }
        sd_buf_free(&b);
    }
    for (int i = 0; i < pos.n; i++) {
        verify_free_problems(&rs[i].probs);
        sd_buf_free(&rs[i].examples);
    }
    free(rs);
    sd_pool_destroy(pool);
    sd_strlist_free(&pos);
    return exit_code;
}
