/* sd-bucket: assign every metadata record an aspect-ratio bucket, the resize
 * and the crop, report the bucket distribution, and optionally split the
 * records into balanced parts. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "bucket.h"
#include "bucket_rec.h"
#include "bucket_split.h"
#include "buf.h"
#include "cli.h"
#include "err.h"
#include "lines.h"
#include "log.h"
#include "outfile.h"
#include "pool.h"
#include "progress.h"
#include "svgplot.h"
#include "tally.h"

enum { BATCH_LINES = 8192, BLOCK_BYTES = 4 << 20 };

typedef struct {
    const char *plan, *resolution, *buckets, *output, *report, *plot, *root;
    long min_bucket, max_bucket, steps, min_res, max_res, split, seed, threads;
    int no_upscale, upscale, strict, quiet, verbose;
} options;

/* Buckets seen so far, in first-seen order, with an open-addressing index. */
typedef struct {
    int *w, *h;
    uint64_t *count;
    size_t n, cap;
    int32_t *slot; /* index+1, 0 = empty */
    size_t nslot;
} bucket_table;

/* One record's place in the temporary file when splitting. */
typedef struct {
    const options *opt;
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
} run;

typedef struct {
    run *r;
    size_t n;
} batch;

/* Find or add bucket (w, h); returns its id or -1 when out of memory. */
static long bucket_id(bucket_table *t, int w, int h)
{
    uint64_t key = (uint64_t)(uint32_t)w << 32 | (uint32_t)h;
    if (t->nslot) {
        size_t m = t->nslot - 1, i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & m;
        for (; t->slot[i]; i = (i + 1) & m) {
            size_t id = (size_t)t->slot[i] - 1;
            if (t->w[id] == w && t->h[id] == h) return (long)id;
        }
    }
    if (t->n * 2 + 2 > t->nslot) { /* grow and rehash */
        size_t ns = t->nslot ? t->nslot * 2 : 64;
        int32_t *sl = calloc(ns, sizeof *sl);
        if (!sl) return -1;
        for (size_t id = 0; id < t->n; id++) {
            uint64_t k = (uint64_t)(uint32_t)t->w[id] << 32 | (uint32_t)t->h[id];
            size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull >> 20) & (ns - 1);
            while (sl[i]) i = (i + 1) & (ns - 1);
            sl[i] = (int32_t)id + 1;
        }
        free(t->slot);
        t->slot = sl;
        t->nslot = ns;
    }
    if (t->n == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 64;
        int *nw = realloc(t->w, nc * sizeof *nw);
        if (nw) t->w = nw;
        int *nh = realloc(t->h, nc * sizeof *nh);
        if (nh) t->h = nh;
        uint64_t *ncount = realloc(t->count, nc * sizeof *ncount);
        if (ncount) t->count = ncount;
        if (!nw || !nh || !ncount) return -1;
        t->cap = nc;
    }
    size_t id = t->n++;
    t->w[id] = w;
    t->h[id] = h;
    t->count[id] = 0;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & (t->nslot - 1);
    while (t->slot[i]) i = (i + 1) & (t->nslot - 1);
    t->slot[i] = (int32_t)id + 1;
    return (long)id;
}

/* Worker body: bucket lines [b, e) into this worker's output buffer. */
static void batch_fn(void *ctx, int worker, size_t b, size_t e)
{
    batch *bt = ctx;
    run *r = bt->r;
    sd_buf *out = &r->wk[worker].out;
    for (size_t i = b; i < e; i++) {
        r->off[i] = out->len;
        r->wid[i] = worker;
        sd_bucket_record(&r->plan, r->opt->root, &r->wk[worker], r->lines[i], r->lens[i], out, &r->res[i]);
        r->olen[i] = out->len - r->off[i];
    }
}

/* Split sink: append one record to its part file, count and hash it; a
 * failed write remembers the part and errno for the message. */
static int write_part(void *ctx, int part, const char *data, size_t len)
{
    run *r = ctx;
    r->part_counts[part]++;
    r->part_bytes[part] += len;
    XXH3_64bits_update(r->part_hash[part], data, len);
    if (fwrite(data, 1, len, r->parts[part].f) == len) return 0;
    r->bad_part = part;
    r->bad_errno = errno;
    return -1;
}

/* The error for a part write that failed, naming the part's file (the
 * splitter fails by itself only when out of memory). */
static sd_status part_write_error(const run *r, sd_error *err)
{
    char name[4096];
    if (r->bad_part < 0) return sd_err_set(err, SD_ENOMEM, "splitting: out of memory");
    if (sd_part_name(r->opt->output, r->bad_part, name, sizeof name) != 0)
        snprintf(name, sizeof name, "part %d", r->bad_part);
    return sd_err_set(err, SD_EIO, "%s: write failed: %s", name, strerror(r->bad_errno));
}

/* Process n split lines (the first is line first_line of name): bucket them in
 * parallel, then count, report skips and write outputs in input order. */
static sd_status run_batch(run *r, size_t n, const char *name, long first_line, sd_error *err)
{
    for (int w = 0; w < r->nworkers; w++) sd_buf_clear(&r->wk[w].out);
    batch bt = {r, n};
    sd_pool_for(r->pool, n, batch_fn, &bt);
    for (int w = 0; w < r->nworkers; w++)
        if (r->wk[w].out.oom) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        sd_brec_result *res = &r->res[i];
        if (res->blank) continue;
        r->in++;
        if (res->reason) {
            sd_skip(&r->tally, res->reason, "%s:%ld (%s)", name, first_line + (long)i, res->detail);
            continue;
        }
        long id = bucket_id(&r->bt, res->fit.bw, res->fit.bh);
        if (id < 0) return sd_err_set(err, SD_ENOMEM, "out of memory");
        r->bt.count[id]++;
        r->out++;
        r->sum_abs_err += fabs(res->fit.ar_error);
        const sd_buf *wb = &r->wk[r->wid[i]].out;
        size_t len = r->olen[i];
        if (r->nparts) {
            uint64_t key = (uint64_t)(uint32_t)res->fit.bw << 32 | (uint32_t)res->fit.bh;
            if (sd_stream_splitter_add(&r->ss, (size_t)id, key, wb->data + r->off[i], len, write_part, r))
                return part_write_error(r, err);
        } else if (fwrite(wb->data + r->off[i], 1, len, r->sink) != len) {
            const char *o = r->opt->output && strcmp(r->opt->output, "-") ? r->opt->output : "stdout";
            return sd_err_set(err, SD_EIO, "%s: write failed: %s", o, strerror(errno));
        }
    }
    sd_progress_update(&r->prog, r->in, r->tally.total);
    if (r->out_file) sd_outfile_writeback(r->out_file);
    for (int p = 0; p < r->nparts; p++) sd_outfile_writeback(&r->parts[p]);
    return SD_OK;
}

/* Stream one input file (or stdin) through the bucketer in blocks. */
static sd_status run_file(run *r, const char *path, sd_error *err)
{
    sd_lines lr;
    sd_status st = sd_lines_open(&lr, path, BLOCK_BYTES, err);
    if (st) return st;
    for (;;) {
        char *block;
        size_t len;
        long first;
        st = sd_lines_next(&lr, &block, &len, &first, err);
        if (st || len == 0) break;
        size_t pos = 0;
        while (!st && pos < len) {
            size_t used;
            size_t n = sd_split_lines(block + pos, len - pos, r->lines, r->lens, BATCH_LINES, &used);
            st = run_batch(r, n, lr.name, first, err);
            first += (long)n;
            pos += used;
        }
        if (st) break;
    }
    sd_lines_close(&lr);
    return st;
}

/* Buckets in (w, h) order, for the summary, the report and the plot. */
static size_t *sorted_buckets(const bucket_table *t)
{
    size_t *o = malloc((t->n ? t->n : 1) * sizeof *o);
    if (!o) return NULL;
    for (size_t i = 0; i < t->n; i++) o[i] = i;
    for (size_t i = 1; i < t->n; i++) { /* insertion sort: bucket counts are small */
        size_t v = o[i], j = i;
        while (j > 0 && (t->w[o[j - 1]] > t->w[v] || (t->w[o[j - 1]] == t->w[v] && t->h[o[j - 1]] > t->h[v]))) {
            o[j] = o[j - 1];
            j--;
        }
        o[j] = v;
    }
    return o;
}

/* Open the N part files (atomic: they appear only when all are committed). */
static sd_status open_parts(run *r, sd_error *err)
{
    const options *o = r->opt;
    sd_status st = sd_stream_splitter_init(&r->ss, (int)o->split, (uint64_t)o->seed, err);
    if (st) return st;
    r->parts = calloc((size_t)o->split, sizeof *r->parts);
    r->part_counts = calloc((size_t)o->split, sizeof *r->part_counts);
    r->part_bytes = calloc((size_t)o->split, sizeof *r->part_bytes);
    r->part_hash = calloc((size_t)o->split, sizeof *r->part_hash);
    r->bad_part = -1;
    if (!r->parts || !r->part_counts || !r->part_bytes || !r->part_hash)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (long p = 0; p < o->split; p++) {
        r->part_hash[p] = XXH3_createState();
        if (!r->part_hash[p] || XXH3_64bits_reset(r->part_hash[p]) != XXH_OK)
            return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (; r->nparts < (int)o->split; r->nparts++) {
        char name[4096];
        if (sd_part_name(o->output, r->nparts, name, sizeof name) != 0)
            return sd_err_set(err, SD_EINVAL, "part file name too long");
        sd_outfile_warn_own_leftovers(name);
        if ((st = sd_outfile_open(&r->parts[r->nparts], name, err))) return st;
    }
    return SD_OK;
}

/* The manifest of a split: in part 0's directory, the -o pattern's last
 * component as given plus ".parts.json" (docs/FORMATS.md). */
static int manifest_name(const options *o, char *out, size_t cap)
{
    /* beside part 0, which exists: -o 'rank-%d/train.jsonl' has no directory
     * 'rank-%d'; named by the pattern's last component */
    char first[4096];
    if (sd_part_name(o->output, 0, first, sizeof first) != 0) return -1;
    const char *pslash = strrchr(o->output, '/'), *fslash = strrchr(first, '/');
    int dirlen = fslash ? (int)(fslash - first + 1) : 0;
    const char *base = pslash ? pslash + 1 : o->output;
    return snprintf(out, cap, "%.*s%s.parts.json", dirlen, first, base) < (int)cap ? 0 : -1;
}

/* The manifest's text: the set's identity and every part's name, records,
 * bytes and XXH3-64, so a set whose parts come from two runs (a kill
 * between the renames) or were changed later can be told from a whole one. */
static void build_manifest(const run *r, const char *set_id, sd_buf *b)
{
    const options *o = r->opt;
    sd_buf_puts(b, "{\"tool\":\"sd-bucket\",\"version\":");
    sd_buf_json_cstr(b, sd_version());
    sd_buf_puts(b, ",\"set\":");
    sd_buf_json_cstr(b, set_id);
    sd_buf_puts(b, ",\"pattern\":");
    sd_buf_json_cstr(b, o->output);
    sd_buf_puts(b, ",\"parts\":[");
    for (int p = 0; p < (int)o->split; p++) {
        char name[4096];
        sd_part_name(o->output, p, name, sizeof name);
        sd_buf_printf(b, "%s{\"file\":", p ? "," : "");
        sd_buf_json_cstr(b, name);
        sd_buf_printf(b, ",\"records\":%llu,\"bytes\":%llu,\"xxh3_64\":\"%016llx\"}",
                      (unsigned long long)r->part_counts[p], (unsigned long long)r->part_bytes[p],
                      (unsigned long long)XXH3_64bits_digest(r->part_hash[p]));
    }
    sd_buf_puts(b, "]}\n");
}

/* Publish the finished parts as a set and vouch for it: the old manifest
 * goes first (it must never describe a mix of its parts and new ones), the
 * renames run back to back, and the new manifest is written last, so a
 * set without a manifest, or whose parts do not match it, was interrupted. */
static sd_status publish_parts(run *r, sd_error *err)
{
    char mname[4200];
    if (manifest_name(r->opt, mname, sizeof mname) != 0) return sd_err_set(err, SD_EINVAL, "-o pattern too long");
    if (unlink(mname) != 0 && errno != ENOENT)
        return sd_err_set(err, SD_EIO, "%s: cannot remove the earlier split's manifest: %s", mname, strerror(errno));
    sd_status st = sd_outfile_publish_set(r->parts, r->nparts, err);
    if (st) return st;
    char set_id[64];
    sd_output_set_id(set_id, sizeof set_id);
    sd_buf b;
    sd_buf_init(&b);
    build_manifest(r, set_id, &b);
    st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(mname, b.data, b.len, err);
    sd_buf_free(&b);
    return st;
}

/* Release the held records, then commit the parts: every one written and
 * synced first, then all renamed into place back to back, so a failure
 * while writing (disk full, a kill) leaves the earlier set of parts
 * untouched; the manifest written last vouches for the new set. */
static sd_status close_parts(run *r, sd_status st, sd_error *err)
{
    if (!st && sd_stream_splitter_finish(&r->ss, write_part, r)) st = part_write_error(r, err);
    for (int p = 0; p < r->nparts && !st; p++) st = sd_outfile_finish(&r->parts[p], err);
    if (!st) st = publish_parts(r, err);
    for (int p = 0; p < r->nparts; p++) sd_outfile_abort(&r->parts[p]); /* temp files a failure left */
    if (!st) sd_part_warn_leftovers(r->opt->output, (int)r->opt->split, "split into more parts");
    for (long p = 0; r->part_hash && p < r->opt->split; p++) XXH3_freeState(r->part_hash[p]);
    free(r->part_hash);
    free(r->part_bytes);
    r->part_hash = NULL;
    r->part_bytes = NULL;
    sd_stream_splitter_free(&r->ss);
    free(r->parts);
    r->parts = NULL;
    r->nparts = 0;
    return st;
}

/* The JSON report: plan, counts, skips, buckets and parts. */
static void build_report(const run *r, const size_t *order, const uint64_t *part_counts, sd_buf *b)
{
    const options *o = r->opt;
    const sd_plan *p = &r->plan;
    sd_buf_printf(b, "{\"tool\":\"sd-bucket\",\"version\":");
    sd_buf_json_cstr(b, sd_version());
    sd_buf_printf(b, ",\"plan\":{\"name\":\"%s\"", sd_plan_name(p));
    if (p->kind == SD_PLAN_KOHYA)
        sd_buf_printf(b, ",\"resolution\":[%d,%d],\"min_bucket\":%d,\"max_bucket\":%d,\"steps\":%d,\"no_upscale\":%s",
                      p->max_w, p->max_h, p->min_size, p->max_size, p->steps, p->no_upscale ? "true" : "false");
    else if (p->kind == SD_PLAN_MULTIRES)
        sd_buf_printf(b, ",\"min_res\":%d,\"max_res\":%d,\"steps\":%d,\"upscale\":%s", p->min_res, p->max_res, p->steps,
                      p->upscale ? "true" : "false");
    else
        sd_buf_printf(b, ",\"no_upscale\":%s", p->no_upscale ? "true" : "false");
    sd_buf_printf(b, "},\"records_in\":%llu,\"records_out\":%llu,\"skipped\":%llu,\"skip_reasons\":",
                  (unsigned long long)r->in, (unsigned long long)r->out, (unsigned long long)r->tally.total);
    sd_tally_json(&r->tally, b);
    sd_buf_puts(b, ",\"mean_ar_error\":");
    if (r->out) sd_buf_json_num(b, r->sum_abs_err / (double)r->out);
    else sd_buf_puts(b, "null");
    sd_buf_puts(b, ",\"buckets\":[");
    for (size_t k = 0; k < r->bt.n; k++) {
        size_t i = order[k];
        sd_buf_printf(b, "%s{\"bucket\":[%d,%d],\"count\":%llu}", k ? "," : "", r->bt.w[i], r->bt.h[i],
                      (unsigned long long)r->bt.count[i]);
    }
    sd_buf_puts(b, "]");
    if (part_counts) {
        sd_buf_puts(b, ",\"parts\":[");
        for (long q = 0; q < o->split; q++) sd_buf_printf(b, "%s%llu", q ? "," : "", (unsigned long long)part_counts[q]);
        sd_buf_puts(b, "]");
    }
    sd_buf_puts(b, "}\n");
}

/* Print the summary, write --report and --plot. */
static sd_status finish_outputs(const run *r, const uint64_t *part_counts, sd_error *err)
{
    const options *o = r->opt;
    size_t *order = sorted_buckets(&r->bt);
    if (!order) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_log(SD_LOG_INFO, "%llu records: %llu bucketed into %zu buckets, %llu skipped", (unsigned long long)r->in,
           (unsigned long long)r->out, r->bt.n, (unsigned long long)r->tally.total);
    if (r->out) sd_log(SD_LOG_INFO, "mean ar error: %.6f", r->sum_abs_err / (double)r->out);
    for (size_t k = 0; k < r->bt.n; k++) {
        size_t i = order[k];
        sd_log(SD_LOG_INFO, "  bucket %5dx%-5d (ar %.3f): %llu", r->bt.w[i], r->bt.h[i], (double)r->bt.w[i] / r->bt.h[i],
               (unsigned long long)r->bt.count[i]);
    }
    if (part_counts)
        for (long q = 0; q < o->split; q++) sd_log(SD_LOG_INFO, "  part %ld: %llu records", q, (unsigned long long)part_counts[q]);
    sd_tally_log(&r->tally, "skipped");
    sd_status st = SD_OK;
    sd_buf b;
    sd_buf_init(&b);
    if (o->report) {
        build_report(r, order, part_counts, &b);
        st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(o->report, b.data, b.len, err);
    }
    if (!st && o->plot) {
        sd_buf_clear(&b);
        char **labels = calloc(r->bt.n ? r->bt.n : 1, sizeof *labels);
        uint64_t *counts = calloc(r->bt.n ? r->bt.n : 1, sizeof *counts);
        char *store = malloc((r->bt.n ? r->bt.n : 1) * 16);
        if (!labels || !counts || !store) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        for (size_t k = 0; !st && k < r->bt.n; k++) {
            labels[k] = store + 16 * k;
            snprintf(labels[k], 16, "%dx%d", r->bt.w[order[k]], r->bt.h[order[k]]);
            counts[k] = r->bt.count[order[k]];
        }
        if (!st) {
            char title[128];
            snprintf(title, sizeof title, "sd-bucket: %llu records in %zu buckets (plan %s)", (unsigned long long)r->out,
                     r->bt.n, sd_plan_name(&r->plan));
            sd_svg_bars(&b, title, (const char *const *)labels, counts, r->bt.n);
            st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(o->plot, b.data, b.len, err);
        }
        free(labels);
        free(counts);
        free(store);
    }
    sd_buf_free(&b);
    free(order);
    return st;
}

/* Say which given options the chosen plan does not use, rather than
 * ignore them without a word (the defaults are those of main). */
static void warn_unused(const options *o, const char *plan)
{
    int kohya = strcmp(plan, "kohya") == 0, multires = strcmp(plan, "multires") == 0;
    const struct {
        int given, used;
        const char *name;
    } opts[] = {
        {strcmp(o->resolution, "1024x1024") != 0, kohya, "--resolution"},
        {o->steps != 64, kohya || multires, "--steps"},
        {o->min_bucket != 256 || o->max_bucket != 2048, kohya, "--min-bucket/--max-bucket"},
        {o->no_upscale, !multires, "--no-upscale"},
        {o->upscale, multires, "--upscale"},
        {o->min_res || o->max_res, multires, "--min-res/--max-res"},
        {o->buckets != NULL, strcmp(plan, "list") == 0, "--buckets"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++)
        if (opts[i].given && !opts[i].used) sd_log(SD_LOG_WARN, "%s does nothing with --plan %s", opts[i].name, plan);
}

/* Latents are an eighth of the image on each side: a bucket side that is
 * not a multiple of 8 could never be encoded (sd-latents skips it). */
static const char *not_eighths(const sd_plan *p)
{
    if ((p->kind == SD_PLAN_KOHYA || p->kind == SD_PLAN_MULTIRES) && p->steps % 8)
        return "--steps must be a multiple of 8 (latents are 1/8 of the image per side)";
    for (size_t i = 0; i < p->n; i++)
        if (p->resos[i].w % 8 || p->resos[i].h % 8)
            return "every bucket side must be a multiple of 8 (latents are 1/8 of the image per side)";
    return NULL;
}

/* Build the bucket plan the options ask for; a usage error on bad values. */
static int make_plan(const sd_cli *cli, const options *o, sd_plan *p)
{
    sd_error err;
    sd_err_clear(&err);
    sd_status st;
    const char *name = o->plan;
    if (!name) name = o->buckets ? "list" : (o->min_res || o->max_res) ? "multires" : "kohya";
    warn_unused(o, name);
    if (strcmp(name, "kohya") == 0) {
        sd_reso r;
        const char *end;
        if (sd_parse_reso(o->resolution, &end, &r) != 0 || *end) {
            sd_cli_usage_error(cli, "--resolution needs WxH, got '%s'", o->resolution);
            return SD_EXIT_USAGE;
        }
        st = sd_plan_kohya(p, r.w, r.h, (int)o->min_bucket, (int)o->max_bucket, (int)o->steps, o->no_upscale, &err);
    } else if (strcmp(name, "sdxl") == 0) {
        st = sd_plan_sdxl(p, o->no_upscale, &err);
    } else if (strcmp(name, "list") == 0) {
        if (!o->buckets) {
            sd_cli_usage_error(cli, "--plan list needs --buckets WxH,...");
            return SD_EXIT_USAGE;
        }
        st = sd_plan_list(p, o->buckets, o->no_upscale, &err);
    } else if (strcmp(name, "multires") == 0) {
        st = sd_plan_multires(p, o->min_res ? (int)o->min_res : 512, o->max_res ? (int)o->max_res : 1024, (int)o->steps,
                              o->upscale, &err);
    } else {
        sd_cli_usage_error(cli, "unknown --plan '%s' (kohya, sdxl, list, multires)", name);
        return SD_EXIT_USAGE;
    }
    if (st) {
        sd_cli_usage_error(cli, "%s", err.msg);
        return SD_EXIT_USAGE;
    }
    const char *bad = not_eighths(p);
    if (bad) {
        sd_plan_free(p);
        sd_cli_usage_error(cli, "%s", bad);
        return SD_EXIT_USAGE;
    }
    /* only for a plan that is used: a refused one needs no adjusting note */
    if (strcmp(name, "kohya") == 0 && (o->min_bucket != p->min_size || o->max_bucket != p->max_size))
        sd_log(SD_LOG_WARN, "bucket sizes adjusted to multiples of %ld: min %d, max %d", o->steps, p->min_size,
               p->max_size);
    return -1;
}

/* Allocate workers, scratch arrays and the output. */
static sd_status run_init(run *r, const options *o, sd_error *err)
{
    r->opt = o;
    int nt = o->threads > 0 ? (int)o->threads : sd_default_threads();
    if (nt > 256) nt = 256;
    r->pool = nt > 1 ? sd_pool_create(nt) : NULL;
    r->nworkers = r->pool ? sd_pool_size(r->pool) : 1;
    r->wk = sd_worker_array((size_t)r->nworkers, sizeof *r->wk);
    r->lines = malloc(BATCH_LINES * sizeof *r->lines);
    r->lens = malloc(BATCH_LINES * sizeof *r->lens);
    r->res = malloc(BATCH_LINES * sizeof *r->res);
    r->off = malloc(BATCH_LINES * sizeof *r->off);
    r->olen = malloc(BATCH_LINES * sizeof *r->olen);
    r->wid = malloc(BATCH_LINES * sizeof *r->wid);
    if ((nt > 1 && !r->pool) || !r->wk || !r->lines || !r->lens || !r->res || !r->off || !r->olen || !r->wid)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (int w = 0; w < r->nworkers; w++) {
        sd_brec_worker_init(&r->wk[w]);
        sd_buf_init(&r->wk[w].out);
    }
    sd_tally_init(&r->tally, o->verbose ? -1 : 10);
    sd_progress_init(&r->prog, "sd-bucket", "records", 0, !o->quiet);
    return SD_OK;
}

/* Free everything run_init and the run allocated. */
static void run_free(run *r)
{
    for (int w = 0; r->wk && w < r->nworkers; w++) {
        sd_brec_worker_free(&r->wk[w]);
        sd_buf_free(&r->wk[w].out);
    }
    sd_pool_destroy(r->pool);
    free(r->wk);
    free(r->lines);
    free(r->lens);
    free(r->res);
    free(r->off);
    free(r->olen);
    free(r->wid);
    free(r->bt.w);
    free(r->bt.h);
    free(r->bt.count);
    free(r->bt.slot);
    sd_plan_free(&r->plan);
}

int main(int argc, char **argv)
{
    options o = {.plan = NULL, .resolution = "1024x1024", .min_bucket = 256, .max_bucket = 2048, .steps = 64};
    const sd_opt opts[] = {
        {"plan", 0, SD_OPT_STR, &o.plan, "NAME", "bucket plan: kohya, sdxl, list, multires (default: list with --buckets, multires with --min-res/--max-res, else kohya)"},
        {"resolution", 'r', SD_OPT_STR, &o.resolution, "WxH", "kohya: max resolution (default 1024x1024)"},
        {"min-bucket", 0, SD_OPT_INT, &o.min_bucket, "N", "kohya: smallest bucket side (default 256)"},
        {"max-bucket", 0, SD_OPT_INT, &o.max_bucket, "N", "kohya: largest bucket side (default 2048)"},
        {"steps", 0, SD_OPT_INT, &o.steps, "N", "kohya/multires: bucket sides are multiples of N, itself a multiple of 8 (default 64)"},
        {"no-upscale", 0, SD_OPT_FLAG, &o.no_upscale, NULL,
         "kohya: bucket_no_upscale; sdxl/list: skip images that would need enlarging"},
        {"buckets", 0, SD_OPT_STR, &o.buckets, "LIST", "list plan: buckets as WxH,WxH,..."},
        {"min-res", 0, SD_OPT_INT, &o.min_res, "R", "multires: smallest training area R*R (default 512)"},
        {"max-res", 0, SD_OPT_INT, &o.max_res, "R", "multires: largest training area R*R (default 1024)"},
        {"upscale", 0, SD_OPT_FLAG, &o.upscale, NULL, "multires: upscale images below min-res instead of skipping"},
        {"root", 0, SD_OPT_STR, &o.root, "DIR", "resolve relative image paths against DIR (default: current dir)"},
        {"split", 0, SD_OPT_INT, &o.split, "N", "write N bucket-balanced parts (-o must hold %d) and, last, their manifest (PATTERN.parts.json beside part 0)"},
        {"output", 'o', SD_OPT_STR, &o.output, "FILE", "output JSONL (default stdout); with --split a pattern like part-%d.jsonl"},
        {"seed", 0, SD_OPT_INT, &o.seed, "N", "seed for the split's part rotation (default 0)"},
        {"report", 0, SD_OPT_STR, &o.report, "FILE", "write a JSON report of buckets and skips"},
        {"plot", 0, SD_OPT_STR, &o.plot, "FILE", "write an SVG bar chart of bucket counts"},
        {"threads", 'j', SD_OPT_INT, &o.threads, "N", "worker threads (default: all CPUs)"},
        {"strict", 0, SD_OPT_FLAG, &o.strict, NULL, "exit 1 if any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &o.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.verbose, NULL, "more detail; show every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-bucket", "[OPTIONS] [FILE.jsonl...]",
        "Assign each metadata record (JSONL, from sd-meta) an aspect-ratio bucket, the resize and the crop.\n"
        "Adds width/height (if missing, read from the image header), original_size, bucket, resize, crop\n"
        "(the box actually cut from the resized image: SDXL crop_coords_top_left = (crop[1], crop[0])) and\n"
        "kohya_crop_ltrb (sd-scripts' letterbox values). Reads stdin when no FILE or '-' is given.",
        opts,
        "Plans:\n"
        "  kohya     sd-scripts make_bucket_resolutions/select_bucket, bit-compatible (but for EXIF-rotated\n"
        "            images: sdtk buckets the displayed size, sd-scripts the stored one). sd-scripts' own CLI\n"
        "            defaults are --min-bucket 256 --max-bucket 1024; 2048 here admits the SDXL-style wide buckets.\n"
        "  sdxl      the 41 SDXL training resolutions; nearest aspect, ties to the first in (w,h) order.\n"
        "  list      --buckets WxH,...; chosen like sdxl.\n"
        "  multires  each image keeps its aspect; its area is clamped into [min-res^2, max-res^2]\n"
        "            (larger: downscaled; smaller: skipped, or upscaled with --upscale); the bucket is the\n"
        "            resized size floored to --steps, so under --steps px per axis are cropped.\n"
        "Examples:\n"
        "  sd-bucket meta.jsonl -o bucketed.jsonl --report buckets.json --plot buckets.svg\n"
        "  sd-bucket --plan sdxl --split 8 -o 'part-%d.jsonl' meta.jsonl", NULL};
    sd_strlist files = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &files);
    if (rc >= 0) {
        sd_strlist_free(&files);
        return rc;
    }
    sd_log_setup("sd-bucket", o.quiet ? SD_LOG_WARN : o.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    if (o.split < 0 || o.split > 10000) {
        sd_cli_usage_error(&cli, "--split must be 1..10000");
        sd_strlist_free(&files);
        return SD_EXIT_USAGE;
    }
    if (o.split > 0 && (!o.output || !sd_part_pattern_ok(o.output))) {
        sd_cli_usage_error(&cli, "--split needs -o with exactly one %%d, e.g. -o 'part-%%d.jsonl'");
        sd_strlist_free(&files);
        return SD_EXIT_USAGE;
    }
    if (o.threads < 0) {
        sd_cli_usage_error(&cli, "--threads must be positive");
        sd_strlist_free(&files);
        return SD_EXIT_USAGE;
    }
    run r;
    memset(&r, 0, sizeof r);
    rc = make_plan(&cli, &o, &r.plan);
    if (rc >= 0) {
        sd_strlist_free(&files);
        return rc;
    }
    if (files.n == 0) sd_strlist_push(&files, "-");

    sd_error err;
    sd_err_clear(&err);
    sd_outfile out = {0};
    sd_status st = run_init(&r, &o, &err);
    if (!st) {
        if (o.split > 0) {
            st = open_parts(&r, &err);
        } else {
            sd_outfile_warn_own_leftovers(o.output);
            st = sd_outfile_open(&out, o.output, &err);
            r.sink = out.f;
            r.out_file = &out;
        }
    }
    for (int i = 0; !st && i < files.n; i++) st = run_file(&r, files.v[i], &err);
    sd_progress_finish(&r.prog);
    if (o.split > 0) {
        st = close_parts(&r, st, &err);
    } else if (out.f) {
        if (!st) st = sd_outfile_commit(&out, &err);
        else sd_outfile_abort(&out);
    }
    if (!st) st = finish_outputs(&r, r.part_counts, &err);
    uint64_t skipped = r.tally.total;
    free(r.part_counts);
    run_free(&r);
    sd_strlist_free(&files);
    if (st) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return SD_EXIT_FATAL;
    }
    return o.strict && skipped ? SD_EXIT_SKIPPED : SD_EXIT_OK;
}
