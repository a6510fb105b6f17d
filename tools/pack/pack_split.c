/* sd-pack split: one shard into N, balanced by bucket with sd-bucket's
 * splitter (per-bucket counts differ by at most 1 between parts, totals
 * too), each part with the text embeddings its records reference and the
 * empty caption's embedding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bucket_split.h"
#include "cli.h"
#include "log.h"
#include "outfile.h"
#include "pack.h"

enum { MAX_OPEN = 64 }; /* output shards open at once; more parts take more passes */

typedef struct {
    const char *input, *pattern;
    long parts, seed;
    int force;       /* --force: parts may replace existing files */
    pack_common pc;
    char set_id[64]; /* this run's identity, in every part's split_set */
} options;

/* The buckets of the records themselves (not of the bucket index, which may
 * be damaged), sorted by (w, h), with their record counts. */
typedef struct {
    sd_shard_bucket *v;
    size_t n, cap;
    uint64_t records, corrupt;
} bucket_table;

/* Index of bucket (w, h) in the sorted table, or where it would go. */
static size_t bucket_find(const bucket_table *bt, uint32_t w, uint32_t h)
{
    size_t lo = 0, hi = bt->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const sd_shard_bucket *b = &bt->v[mid];
        if (b->w < w || (b->w == w && b->h < h)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Count one record of bucket (w, h), adding the bucket when it is new. */
static sd_status bucket_add(bucket_table *bt, uint32_t w, uint32_t h, sd_error *err)
{
    size_t i = bucket_find(bt, w, h);
    if (i < bt->n && bt->v[i].w == w && bt->v[i].h == h) {
        bt->v[i].count++;
        return SD_OK;
    }
    if (bt->n == bt->cap) {
        size_t nc = bt->cap ? bt->cap * 2 : 64;
        sd_shard_bucket *nv = realloc(bt->v, nc * sizeof *nv);
        if (!nv) return sd_err_set(err, SD_ENOMEM, "out of memory");
        bt->v = nv;
        bt->cap = nc;
    }
    memmove(&bt->v[i + 1], &bt->v[i], (bt->n - i) * sizeof *bt->v);
    bt->v[i] = (sd_shard_bucket){w, h, 1};
    bt->n++;
    return SD_OK;
}

/* Walk every latent record (header only) and count them by bucket. */
static sd_status count_buckets(sd_shard_txn *t, bucket_table *bt, sd_error *err)
{
    sd_shard_cursor *c;
    sd_status st = sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, err);
    const void *k, *v;
    size_t kl, vl;
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_shard_rec rec;
        sd_error e;
        bt->records++;
        if (sd_shard_rec_parse(v, vl, &rec, &e) || rec.kind != SD_REC_LATENT) bt->corrupt++;
        else st = bucket_add(bt, rec.bucket_w, rec.bucket_h, err);
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    sd_shard_cursor_close(c);
    return st;
}

/* Warn when the bucket index (bucket counts, bindex entries) does not
 * describe the records: the split follows the records, but a trainer
 * reading the index would not. */
static void compare_index(const options *o, sd_shard_txn *t, const bucket_table *bt)
{
    sd_shard_bucket *ix = NULL;
    size_t n = 0;
    uint64_t bindex = 0, counted = 0, readable = bt->records - bt->corrupt;
    sd_error e;
    if (sd_shard_buckets(t, &ix, &n, &e) || sd_shard_count(t, SD_SHARD_DB_BINDEX, &bindex, &e)) {
        sd_log(SD_LOG_WARN, "%s: cannot read the bucket index (%s); splitting by the records", o->input, e.msg);
        free(ix);
        return;
    }
    int same = n == bt->n && bindex == readable;
    for (size_t i = 0; i < n; i++) {
        counted += ix[i].count;
        if (same && (ix[i].w != bt->v[i].w || ix[i].h != bt->v[i].h || ix[i].count != bt->v[i].count)) same = 0;
    }
    free(ix);
    if (!same)
        sd_log(SD_LOG_WARN,
               "%s: the bucket index does not match the records (%llu readable records in %zu buckets; the index "
               "holds %llu entries, its counts say %llu in %zu buckets); the split follows the records: run "
               "sd-verify --repair on %s before training from it",
               o->input, (unsigned long long)readable, bt->n, (unsigned long long)bindex, (unsigned long long)counted,
               n, o->input);
}

/* Copy one record into its part with its text embedding; *skip gets the
 * reason (with the detail in *why) when it cannot be copied. */
static sd_status copy_record(sd_shard_txn *t, pack_out *out, const void *k, size_t kl, const void *v, size_t vl,
                             const sd_shard_rec *rec, const char **skip, sd_error *why, sd_error *err)
{
    *skip = NULL;
    if (sd_shard_rec_check_payload(rec, why)) {
        *skip = "corrupt record";
        return SD_OK;
    }
    if (pack_has_text_ref(rec->text_ref)) {
        sd_status st = pack_copy_text(t, out, rec->text_ref, skip, why, err);
        if (st || *skip) return st;
    }
    sd_status st = pack_out_put(out, k, kl, v, vl, err);
    uint64_t dropped = 0; /* sd-verify names a variant whose embedding is gone in the input */
    if (!st && pack_has_text_ref(rec->text_ref)) st = pack_copy_variants(t, out, k, kl, rec->text_ref, &dropped, err);
    return st;
}

/* One pass over the latent records in key order (within a bucket the order
 * of its bucket-index entries): route each through a fresh splitter and
 * write those whose part is in [first, first+n). */
static sd_status split_pass(const options *o, sd_shard_txn *t, const bucket_table *bt, pack_out *outs, int first,
                            int n, uint64_t *counts, sd_tally *tally, sd_progress *prog, uint64_t *done, sd_error *err)
{
    size_t nb = bt->n;
    uint64_t *cnt = malloc((nb ? nb : 1) * sizeof *cnt), *keys = malloc((nb ? nb : 1) * sizeof *keys);
    if (!cnt || !keys) {
        free(cnt);
        free(keys);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (size_t b = 0; b < nb; b++) {
        cnt[b] = bt->v[b].count;
        keys[b] = (uint64_t)bt->v[b].w << 32 | bt->v[b].h;
    }
    sd_splitter sp;
    sd_status st = sd_splitter_init(&sp, cnt, keys, nb, (int)o->parts, (uint64_t)o->seed, err);
    free(cnt);
    free(keys);
    sd_shard_cursor *c = NULL;
    if (!st) st = sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, err);
    const void *k, *v;
    size_t kl, vl;
    char label[512];
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_shard_rec rec;
        sd_error why;
        int bad = sd_shard_rec_parse(v, vl, &rec, &why) != SD_OK;
        if (!bad && rec.kind != SD_REC_LATENT) bad = (sd_err_set(&why, SD_EFORMAT, "not a latent record"), 1);
        if (bad) {
            if (first == 0) { /* it has no part: report it in the first pass only */
                pack_rec_label(k, kl, v, vl, label, sizeof label); /* named only when skipped: off the copy loop */
                sd_skip(tally, "corrupt record", "%s: record %s: %s", o->input, label, why.msg);
            }
            continue;
        }
        int part = sd_splitter_next(&sp, bucket_find(bt, rec.bucket_w, rec.bucket_h));
        if (part < first || part >= first + n) continue;
        sd_progress_update(prog, ++*done, tally->total);
        const char *skip;
        st = copy_record(t, &outs[part], k, kl, v, vl, &rec, &skip, &why, err); /* outs is indexed by part */
        if (!st && skip) {
            pack_rec_label(k, kl, v, vl, label, sizeof label);
            sd_skip(tally, skip, "%s: record %s: %s", o->input, label, why.msg);
        } else if (!st) {
            counts[part]++;
        }
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    sd_shard_cursor_close(c);
    sd_splitter_free(&sp);
    return st;
}

/* Open parts [first, first+n) under temporary names with the input's meta,
 * the empty caption's embedding its empty_text names (empty: its key, NULL
 * when the input has none that is sound) and their place in this split
 * (split_set "<set id> <i>/<N>"). */
static sd_status open_parts(const options *o, sd_shard_txn *t, pack_out *outs, int first, int n,
                            const uint8_t *empty, sd_error *err)
{
    sd_status st = SD_OK;
    for (int i = first; !st && i < first + n; i++) {
        char name[4096], place[128];
        if (sd_part_name(o->pattern, i, name, sizeof name))
            return sd_err_set(err, SD_EINVAL, "output pattern %s: name too long", o->pattern);
        st = pack_out_open(&outs[i], name, o->force ? PACK_OUT_REPLACE : 0, err);
        if (!st) st = pack_copy_meta(t, &outs[i], "sd-pack split", err);
        if (!st && empty) st = pack_put_empty_text(t, &outs[i], empty, err);
        snprintf(place, sizeof place, "%s %d/%ld", o->set_id, i, o->parts);
        if (!st) st = sd_shard_meta_set(outs[i].s, PACK_META_SPLIT_SET, place, err);
    }
    return st;
}

/* Write every part under a temporary name, MAX_OPEN at a time, closing
 * (syncing) each; only when all are complete are they renamed into place,
 * back to back, so a failure while writing leaves every existing file as
 * it was (a kill or a failing rename among the renames would leave the
 * parts renamed before it: their split_set tells them from the others). */
static sd_status split_all(const options *o, uint64_t *counts, sd_tally *tally, sd_error *err)
{
    sd_shard *s;
    sd_shard_txn *t;
    sd_status st = pack_open_ro(&s, &t, o->input, err);
    if (st) return st;
    bucket_table bt = {0};
    pack_out *outs = calloc((size_t)o->parts, sizeof *outs);
    if (!outs) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    if (!st) st = count_buckets(t, &bt, err);
    if (!st) compare_index(o, t, &bt);
    uint8_t empty[16];
    int has_empty = 0;
    const char *skip = NULL;
    sd_error why;
    if (!st) st = pack_find_empty_text(s, t, empty, &has_empty, &skip, &why, err);
    if (!st && skip) sd_skip(tally, skip, "%s: %s", o->input, why.msg);
    uint64_t done = 0;
    sd_progress prog;
    sd_progress_init(&prog, "sd-pack split", "records", bt.records, !o->pc.quiet);
    for (int first = 0; !st && first < o->parts; first += MAX_OPEN) {
        int n = (int)(o->parts - first < MAX_OPEN ? o->parts - first : MAX_OPEN);
        st = open_parts(o, t, outs, first, n, has_empty ? empty : NULL, err);
        if (!st) st = split_pass(o, t, &bt, outs, first, n, counts, tally, &prog, &done, err);
        for (int i = first; !st && i < first + n; i++) st = pack_out_close(&outs[i], err);
    }
    pack_progress_finish(&prog, tally);
    if (!st) st = pack_out_publish_set(outs, o->parts, err);
    for (long i = 0; outs && i < o->parts; i++) pack_out_abort(&outs[i], 0);
    free(outs);
    free(bt.v);
    pack_close_ro(s, t);
    return st;
}

/* A usage problem with the part names, written into msg: one of them is
 * the input (the split would replace what it reads) or an existing
 * directory, or, without --force, some exist (a rerun of a split into the
 * same pattern: the message says how many and that --force replaces
 * them). 0 when all are fine. */
static int check_part_names(const options *o, char *msg, size_t cap)
{
    char first[4096] = "";
    long taken = 0;
    for (long p = 0; p < o->parts; p++) {
        char name[4096];
        struct stat sb;
        if (sd_part_name(o->pattern, (int)p, name, sizeof name))
            return snprintf(msg, cap, "-o %s: part name too long", o->pattern), 1;
        if (pack_same_file(name, o->input))
            return snprintf(msg, cap, "part %s is the input SHARD: choose another -o pattern", name), 1;
        if (stat(name, &sb) == 0 && S_ISDIR(sb.st_mode)) return snprintf(msg, cap, "part %s is a directory", name), 1;
        sd_error re = {0};
        if (o->force && sd_shard_replaceable(name, &re) == SD_EFORMAT) return snprintf(msg, cap, "%s", re.msg), 1;
        if (!o->force && pack_path_taken(name) && !taken++) memcpy(first, name, sizeof first);
    }
    if (taken)
        return snprintf(msg, cap, "part %s exists (%ld of the %ld parts do, as after an earlier split into this "
                        "pattern): --force replaces them", first, taken, o->parts), 1;
    return 0;
}

/* The first part another process is writing (it holds that shard's writer
 * lock) into name, 1; 0 when none is. Such a part is refused even with
 * --force, here before the work and again at the publish. */
static int busy_part(const options *o, char *name, size_t cap)
{
    for (long p = 0; p < o->parts; p++)
        if (!sd_part_name(o->pattern, (int)p, name, cap) && pack_path_busy(name)) return 1;
    return 0;
}

/* sd-pack split -n N -o 'part-%d.lmdb' SHARD */
int pack_split(int argc, char **argv)
{
    options o = {0};
    const sd_opt opts[] = {
        {"parts", 'n', SD_OPT_INT, &o.parts, "N", "number of parts"},
        {"output", 'o', SD_OPT_STR, &o.pattern, "PATTERN", "part names with one %d, e.g. 'part-%d.lmdb'"},
        {"seed", 0, SD_OPT_INT, &o.seed, "N", "seed for the splitter's part rotation (default 0, as sd-bucket)"},
        {"force", 0, SD_OPT_FLAG, &o.force, NULL,
         "replace existing parts (a rerun); never one being written"},
        {"strict", 0, SD_OPT_FLAG, &o.pc.strict, NULL, "exit 1 if any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &o.pc.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.pc.verbose, NULL, "show every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-pack split", "-n N -o 'part-%d.lmdb' SHARD",
        "Split a shard into N shards balanced by bucket, with the guarantee of sd-bucket --split:\n"
        "within every bucket the records (in key order, as the bucket index lists them) go\n"
        "round-robin from a seeded start, so per-bucket counts differ by at most 1 between parts and\n"
        "so do the totals. Buckets are read from the records themselves, not from the bucket index\n"
        "(an index that disagrees is reported).\n"
        "Each part carries the text embeddings its records reference, the empty caption's embedding\n"
        "the input's empty_text names (for conditioning dropout) and the input's meta entries;\n"
        "records that are corrupt or whose text embedding is missing or corrupt are skipped and\n"
        "counted. Parts are written under temporary names and renamed into place only when all are\n"
        "complete; a part name may not be SHARD itself. Existing parts (a rerun into the same pattern)\n"
        "are refused unless --force, which replaces them; even with --force, none is replaced while\n"
        "another process (sd-latents, import-kohya) is writing one.\n"
        "Each part's meta split_set is \"<run id> <i>/<N>\": parts with different run ids come from\n"
        "different splits (a kill among the renames, or parts left by an earlier split into more\n"
        "parts, which is warned about).",
        opts, "Example:\n  sd-pack split -n 8 -o 'rank-%d.lmdb' cache.lmdb", NULL};
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
    char msg[4200];
    if (rc < 0) o.input = pos.v[0];
    if (rc < 0 && check_part_names(&o, msg, sizeof msg)) rc = (sd_cli_usage_error(&cli, "%s", msg), SD_EXIT_USAGE);
    if (rc < 0 && busy_part(&o, msg, sizeof msg)) {
        sd_log(SD_LOG_ERROR, "part %s is being written by another process (it holds the shard's writer lock): no "
               "part replaced, even with --force", msg);
        rc = SD_EXIT_FATAL;
    }
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    uint64_t *counts = calloc((size_t)o.parts, sizeof *counts);
    sd_tally tally;
    sd_tally_init(&tally, o.pc.verbose ? -1 : 10);
    sd_error err;
    sd_output_set_id(o.set_id, sizeof o.set_id);
    sd_status st = counts ? split_all(&o, counts, &tally, &err) : sd_err_set(&err, SD_ENOMEM, "out of memory");
    if (st) sd_log(SD_LOG_ERROR, "%s", err.msg);
    uint64_t written = 0;
    for (long p = 0; !st && p < o.parts; p++) {
        char name[4096];
        sd_part_name(o.pattern, (int)p, name, sizeof name);
        sd_log(SD_LOG_INFO, "%s: %llu records", name, (unsigned long long)counts[p]);
        written += counts[p];
    }
    if (!st)
        sd_log(SD_LOG_INFO, "%llu records written to %ld parts, %llu skipped", (unsigned long long)written, o.parts,
               (unsigned long long)tally.total);
    if (!st) sd_part_warn_leftovers(o.pattern, (int)o.parts, "split into more parts");
    free(counts);
    sd_strlist_free(&pos);
    return st ? SD_EXIT_FATAL : pack_finish(&tally, &o.pc, "skipped");
}
