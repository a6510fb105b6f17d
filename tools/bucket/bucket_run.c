/* sd-bucket: the run over the input: lines in batches bucketed by the
 * thread pool, then counted, tallied and written in input order (to the
 * output, or through the splitter to the parts). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket_tool.h"
#include "lines.h"
#include "outfile.h"

enum { BATCH_LINES = 8192, BLOCK_BYTES = 4 << 20 };

/* What batch_fn's workers share: the run and the batch's line count. */
typedef struct {
    bucket_run *r;
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
    bucket_run *r = bt->r;
    sd_buf *out = &r->wk[worker].out;
    for (size_t i = b; i < e; i++) {
        r->off[i] = out->len;
        r->wid[i] = worker;
        sd_bucket_record(&r->plan, r->opt->root, &r->wk[worker], r->lines[i], r->lens[i], out, &r->res[i]);
        r->olen[i] = out->len - r->off[i];
    }
}

/* Process n split lines (the first is line first_line of name): bucket them in
 * parallel, then count, report skips and write outputs in input order. */
static sd_status run_batch(bucket_run *r, size_t n, const char *name, long first_line, sd_error *err)
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
            if (sd_stream_splitter_add(&r->ss, (size_t)id, key, wb->data + r->off[i], len, bucket_write_part, r))
                return bucket_part_write_error(r, err);
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
sd_status bucket_run_file(bucket_run *r, const char *path, sd_error *err)
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

/* Allocate workers, scratch arrays and the output. */
sd_status bucket_run_init(bucket_run *r, const bucket_opts *o, sd_error *err)
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
        r->wk[w].read_sizes = o->read_sizes;
        sd_buf_init(&r->wk[w].out);
    }
    sd_tally_init(&r->tally, o->verbose ? -1 : 10);
    sd_progress_init(&r->prog, "sd-bucket", "records", 0, !o->quiet);
    return SD_OK;
}

/* Free everything bucket_run_init and the run allocated. */
void bucket_run_free(bucket_run *r)
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
