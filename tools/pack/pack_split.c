/* sd-pack split: one shard into N, balanced by bucket with sd-bucket's
 * splitter (per-bucket counts differ by at most 1 between parts, totals
 * too), each part with the text embeddings its records reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket_split.h"
#include "cli.h"
#include "log.h"
#include "pack.h"

enum { MAX_OPEN = 64 }; /* output shards open at once; more parts take more passes */

typedef struct {
    const char *input, *pattern;
    long parts, seed;
    pack_common pc;
} options;

/* One pass: route every record (bucket by bucket, in bindex order) through
 * a fresh splitter and write those whose part is in [first, first+n). */
static sd_status split_pass(const options *o, sd_shard_txn *t, const sd_shard_bucket *bk, size_t nb, pack_out *outs,
                            int first, int n, uint64_t *counts, sd_tally *tally, sd_progress *prog, uint64_t *done,
                            sd_error *err)
{
    uint64_t *cnt = malloc((nb ? nb : 1) * sizeof *cnt), *keys = malloc((nb ? nb : 1) * sizeof *keys);
    if (!cnt || !keys) {
        free(cnt);
        free(keys);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (size_t b = 0; b < nb; b++) {
        cnt[b] = bk[b].count;
        keys[b] = (uint64_t)bk[b].w << 32 | bk[b].h;
    }
    sd_splitter sp;
    sd_status st = sd_splitter_init(&sp, cnt, keys, nb, (int)o->parts, (uint64_t)o->seed, err);
    free(cnt);
    free(keys);
    char hex[80];
    for (size_t b = 0; !st && b < nb; b++) {
        sd_shard_cursor *c;
        st = sd_shard_cursor_bucket(t, bk[b].w, bk[b].h, &c, err);
        const void *k, *v;
        size_t kl, vl;
        while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
            int part = sd_splitter_next(&sp, b);
            if (part < first || part >= first + n) continue;
            sd_progress_update(prog, ++*done, tally->total);
            pack_hex(k, kl, hex, sizeof hex);
            sd_shard_rec rec;
            sd_error e;
            if (!v || sd_shard_rec_parse(v, vl, &rec, &e) || sd_shard_rec_check_payload(&rec, &e)) {
                sd_skip(tally, "corrupt or missing record", "%s: record %s (%s)", o->input, hex, v ? e.msg : "not found");
                continue;
            }
            pack_out *out = &outs[part - first];
            if (pack_has_text_ref(rec.text_ref)) {
                sd_status ts = pack_copy_text(t, out, rec.text_ref, &e);
                if (ts == SD_ENOMEM || ts == SD_EIO) {
                    *err = e;
                    st = ts;
                    break;
                }
                if (ts) {
                    sd_skip(tally, "text embedding missing or corrupt", "%s: record %s (%s)", o->input, hex, e.msg);
                    continue;
                }
            }
            st = pack_out_put(out, k, kl, v, vl, err);
            if (!st) counts[part]++;
        }
        if (st == SD_ENOTFOUND) st = SD_OK;
        sd_shard_cursor_close(c);
    }
    sd_splitter_free(&sp);
    return st;
}

/* Write all parts, MAX_OPEN at a time. */
static sd_status split_all(const options *o, uint64_t *counts, sd_tally *tally, sd_error *err)
{
    sd_shard *s;
    sd_shard_txn *t;
    sd_status st = pack_open_ro(&s, &t, o->input, err);
    if (st) return st;
    sd_shard_bucket *bk = NULL;
    size_t nb = 0;
    st = sd_shard_buckets(t, &bk, &nb, err);
    uint64_t total = 0, done = 0;
    for (size_t b = 0; b < nb; b++) total += bk[b].count;
    sd_progress prog;
    sd_progress_init(&prog, "sd-pack split", "records", total, !o->pc.quiet);
    pack_out outs[MAX_OPEN];
    for (int first = 0; !st && first < o->parts; first += MAX_OPEN) {
        int n = (int)(o->parts - first < MAX_OPEN ? o->parts - first : MAX_OPEN), opened = 0;
        for (; !st && opened < n; opened++) {
            char name[4096];
            if (sd_part_name(o->pattern, first + opened, name, sizeof name))
                st = sd_err_set(err, SD_EINVAL, "output pattern %s: name too long", o->pattern);
            if (!st) st = pack_out_open(&outs[opened], name, 0, err);
            if (!st) st = pack_copy_meta(t, &outs[opened], "sd-pack split", err);
            if (st && outs[opened].s) pack_out_abort(&outs[opened], 0);
            if (st) break;
        }
        if (!st) st = split_pass(o, t, bk, nb, outs, first, n, counts, tally, &prog, &done, err);
        for (int i = 0; i < opened; i++) {
            if (st) pack_out_abort(&outs[i], 0);
            else st = pack_out_commit(&outs[i], err);
        }
    }
    sd_progress_finish(&prog);
    free(bk);
    pack_close_ro(s, t);
    return st;
}

/* sd-pack split -n N -o 'part-%d.lmdb' SHARD */
int pack_split(int argc, char **argv)
{
    options o = {0};
    const sd_opt opts[] = {
        {"parts", 'n', SD_OPT_INT, &o.parts, "N", "number of parts"},
        {"output", 'o', SD_OPT_STR, &o.pattern, "PATTERN", "part names with one %d, e.g. 'part-%d.lmdb'"},
        {"seed", 0, SD_OPT_INT, &o.seed, "N", "seed for the splitter's part rotation (default 0, as sd-bucket)"},
        {"strict", 0, SD_OPT_FLAG, &o.pc.strict, NULL, "exit 1 if any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &o.pc.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.pc.verbose, NULL, "show every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-pack split", "-n N -o 'part-%d.lmdb' SHARD",
        "Split a shard into N shards balanced by bucket, with the guarantee of sd-bucket --split:\n"
        "within every bucket the records (in bucket-index order) go round-robin from a seeded start,\n"
        "so per-bucket counts differ by at most 1 between parts and so do the totals. Each part\n"
        "carries the text embeddings its records reference and the input's meta entries.",
        opts, "Example:\n  sd-pack split -n 8 -o 'rank-%d.lmdb' cache.lmdb"};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    sd_log_setup("sd-pack split", o.pc.quiet ? SD_LOG_WARN : o.pc.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    rc = -1;
    if (pos.n != 1) rc = (sd_cli_usage_error(&cli, "give exactly one SHARD"), SD_EXIT_USAGE);
    else if (o.parts < 1 || o.parts > 10000) rc = (sd_cli_usage_error(&cli, "-n must be 1..10000"), SD_EXIT_USAGE);
    else if (!o.pattern || !sd_part_pattern_ok(o.pattern))
        rc = (sd_cli_usage_error(&cli, "-o needs a pattern with exactly one %%d, e.g. 'part-%%d.lmdb'"), SD_EXIT_USAGE);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    o.input = pos.v[0];
    uint64_t *counts = calloc((size_t)o.parts, sizeof *counts);
    sd_tally tally;
    sd_tally_init(&tally, o.pc.verbose ? -1 : 10);
    sd_error err;
    sd_status st = counts ? split_all(&o, counts, &tally, &err) : sd_err_set(&err, SD_ENOMEM, "out of memory");
    if (st) sd_log(SD_LOG_ERROR, "%s", err.msg);
    else
        for (long p = 0; p < o.parts; p++) {
            char name[4096];
            sd_part_name(o.pattern, (int)p, name, sizeof name);
            sd_log(SD_LOG_INFO, "%s: %llu records", name, (unsigned long long)counts[p]);
        }
    free(counts);
    sd_strlist_free(&pos);
    return st ? SD_EXIT_FATAL : pack_finish(&tally, &o.pc, "skipped");
}
