/* Linear layer y = x w^T + b (torch layout). The forward runs on the
 * engine's own sgemm (gemm_rows.h), whose every output element is one
 * fused multiply-add chain over k: a row's result depends on nothing but
 * that row, the weight and the bias (not on the row count, the thread
 * count or the split). The backward runs on OpenBLAS sgemm, cut into
 * blocks whose size depends on the shape only (rows of dx, or its columns
 * when there are few rows; output features for dw and db); each block is
 * owned by one worker and computed by one single-threaded sgemm call, so
 * results are bit-identical for any thread count. The plain loops at the end are the reference (tests,
 * benches). */
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gemm.h"
#include "gemm_rows.h"
#include "ops_ref.h"

/* All three dims must be positive. */
sd_status sd_linear_check(const sd_linear_shape *s, sd_error *err)
{
    if (s->m <= 0 || s->k <= 0 || s->n <= 0) return sd_err_set(err, SD_EINVAL, "linear: non-positive dimension");
    return SD_OK;
}

enum {
    ROW_BLOCK = 256, /* rows of dx per unit, at most */
    FEAT_BLOCK = 64, /* output features per dw / db unit, at most */
    MIN_UNITS = 8,   /* units per op, at least, when the shape allows */
    FEW_ROWS = 512   /* below this many rows, dx splits columns */
};

typedef struct {
    const sd_linear_shape *s;
    int rb, cb, ncb; /* dx unit: rows, columns, column blocks */
    int fb;          /* dw / db unit: output features */
    float *dx, *dw, *db;
    const float *x, *w, *dy;
} glin;

/* Block size for a dimension of length len: at most cap, small enough for
 * MIN_UNITS blocks; a function of the shape only. */
static int block_of(int len, int cap)
{
    int b = (len + MIN_UNITS - 1) / MIN_UNITS;
    return b > cap ? cap : b < 1 ? 1 : b;
}

/* Units of dx (cols columns): blocks of rows when there are many; with
 * few rows all rows and blocks of columns instead, so each unit packs only
 * its slice of the weight rather than every unit the whole of it. Returns
 * the unit count. */
static size_t plan_units(glin *g, int cols)
{
    const sd_linear_shape *s = g->s;
    if (s->m >= FEW_ROWS) {
        g->rb = block_of(s->m, ROW_BLOCK);
        g->cb = cols;
    } else {
        g->rb = s->m;
        g->cb = block_of(cols, cols);
    }
    g->ncb = (cols + g->cb - 1) / g->cb;
    return (size_t)((s->m + g->rb - 1) / g->rb) * (size_t)g->ncb;
}

/* Unit u's rows [*r0, *r0 + *nr) and columns [*c0, *c0 + *nc) of an output
 * with cols columns. */
static void unit_span(const glin *g, size_t u, int cols, int *r0, int *nr, int *c0, int *nc)
{
    *r0 = (int)(u / (size_t)g->ncb) * g->rb;
    *c0 = (int)(u % (size_t)g->ncb) * g->cb;
    *nr = g->s->m - *r0 < g->rb ? g->s->m - *r0 : g->rb;
    *nc = cols - *c0 < g->cb ? cols - *c0 : g->cb;
}

/* The forward's split: one unit per worker, a contiguous slice of output
 * columns (a multiple of 16) over all rows, so each worker packs only its
 * slice of w. Any split gives the same bits (gemm_rows.h), so the slices
 * may follow the thread count. */
typedef struct {
    const sd_linear_shape *s;
    int units, cols; /* units and columns per unit */
    sd_gemm_rows_isa isa;
    sd_act act;
    int wdtype;     /* SD_DT_F32, SD_DT_F16 or SD_DT_BF16 */
    float *scratch; /* per worker, or NULL: the unpacked loops */
    float *y;
    const float *x, *b;
    const void *w;
} grows;

/* gemm_rows' finish hook: the activation on a completed block of y. */
static void act_block(const void *ctx, float *y, size_t ldy, int rows, int cols)
{
    sd_act_rows(*(const sd_act *)ctx, y, ldy, rows, cols);
}

/* Unit u's columns through sd_gemm_rows (or, without scratch, the
 * reference loops that give the same bits). */
static void grows_range(void *vctx, int worker, size_t begin, size_t end)
{
    const grows *g = vctx;
    const sd_linear_shape *s = g->s;
    for (size_t u = begin; u < end; u++) {
        int c0 = (int)u * g->cols, nc = s->n - c0 < g->cols ? s->n - c0 : g->cols;
        if (nc <= 0) continue;
        const void *w = (const char *)g->w + (size_t)c0 * (size_t)s->k * sd_dtype_size(g->wdtype);
        const float *b = g->b ? g->b + c0 : NULL;
        float *y = g->y + c0;
        sd_gemm_rows_mode mode = {.w_dtype = g->wdtype, .finish = g->act ? act_block : NULL, .finish_ctx = &g->act};
        if (g->scratch) {
            sd_gemm_rows_ex(g->isa, s->m, nc, s->k, g->x, (size_t)s->k, w, (size_t)s->k, mode, b, y, (size_t)s->n,
                            g->scratch + (size_t)worker * sd_scratch_stride(sd_gemm_rows_scratch_floats()));
        } else {
            sd_gemm_rows_ref(s->m, nc, s->k, g->x, (size_t)s->k, w, (size_t)s->k, g->wdtype, b, y, (size_t)s->n);
            sd_act_rows(g->act, y, (size_t)s->n, s->m, nc);
        }
    }
}

/* y[m, n] = x[m, k] w[n, k]^T + b[n] on gemm_rows: a row of y is the same
 * bits whatever m, so a caller may batch independent rows (the CLIP text
 * encoder batches captions). The kernel is chosen here, once per call. */
void sd_linear_fwd(sd_pool *pool, const sd_linear_shape *s, float *y, const float *x, const float *w,
                   const float *b)
{
    sd_linear_act_fwd(pool, s, SD_ACT_NONE, SD_DT_F32, y, x, w, b);
}

/* Workers of sd_linear_act_fwd: the pool's, at least one. */
static int linear_units(int workers)
{
    return workers > 0 ? workers : 1;
}

/* The scratch sd_linear_fwd allocates on nworkers (ops_cpu.h): one packed
 * block of w per worker, whatever the shape. */
size_t sd_linear_fwd_scratch_bytes(int nworkers)
{
    return sd_scratch_bytes(linear_units(nworkers), sd_gemm_rows_scratch_floats());
}

/* The same with an activation on each finished block of y and weights of
 * any dtype (ops_cpu.h). */
void sd_linear_act_fwd(sd_pool *pool, const sd_linear_shape *s, sd_act act, int wdtype, float *y, const float *x,
                       const void *w, const float *b)
{
    int workers = sd_pool_size(pool);
    grows g = {.s = s, .units = linear_units(workers), .isa = sd_gemm_rows_best_isa(), .act = act,
               .wdtype = wdtype, .y = y, .x = x, .w = w, .b = b};
    int per = (s->n + g.units - 1) / g.units;
    g.cols = (per + SD_GEMM_ROWS_NR - 1) / SD_GEMM_ROWS_NR * SD_GEMM_ROWS_NR;
    g.scratch = sd_scratch_alloc(g.units, sd_gemm_rows_scratch_floats());
    sd_pool_for(pool, (size_t)g.units, grows_range, &g);
    free(g.scratch);
}

/* Input gradient: one unit is a block of dx, dx += dy w. */
static void glin_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const glin *g = vctx;
    const sd_linear_shape *s = g->s;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        int r0, nr, c0, nc;
        unit_span(g, u, s->k, &r0, &nr, &c0, &nc);
        sd_sgemm(0, 0, nr, nc, s->n, 1.0f, g->dy + (size_t)r0 * (size_t)s->n, s->n, g->w + c0, s->k, 1.0f,
                 g->dx + (size_t)r0 * (size_t)s->k + (size_t)c0, s->k);
    }
}

/* Weight and bias gradients: one unit is a block of output features,
 * dw[block] += dy[:, block]^T x (the whole row sum in one sgemm call);
 * db sums each feature's column over the rows in order. */
static void glin_dw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const glin *g = vctx;
    const sd_linear_shape *s = g->s;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        int o0 = (int)u * g->fb, nf = s->n - o0 < g->fb ? s->n - o0 : g->fb;
        if (g->dw)
            sd_sgemm(1, 0, nf, s->k, s->m, 1.0f, g->dy + o0, s->n, g->x, s->k, 1.0f,
                     g->dw + (size_t)o0 * (size_t)s->k, s->k);
        if (!g->db) continue;
        float acc[FEAT_BLOCK] = {0};
        int nf8 = nf & ~7;
        for (int r = 0; r < s->m; r++) {
            const float *dyr = g->dy + (size_t)r * (size_t)s->n + o0;
            for (int o0v = 0; o0v < nf8; o0v += 8) /* groups of 8: vectorised at -O2 */
                for (int l = 0; l < 8; l++) acc[o0v + l] += dyr[o0v + l];
            for (int o = nf8; o < nf; o++) acc[o] += dyr[o];
        }
        for (int o = 0; o < nf; o++) g->db[o0 + o] += acc[o];
    }
}

/* dx += dy w; dw += dy^T x; db += column sums of dy. */
void sd_linear_bwd(sd_pool *pool, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w)
{
    glin g = {.s = s, .fb = block_of(s->n, FEAT_BLOCK), .dx = dx, .dw = dw, .db = db, .x = x, .w = w, .dy = dy};
    if (dx) {
        size_t units = plan_units(&g, s->k);
        sd_pool_for(pool, units, glin_dx_range, &g);
    }
    if (dw || db) sd_pool_for(pool, (size_t)((s->n + g.fb - 1) / g.fb), glin_dw_range, &g);
}

typedef struct {
    const sd_linear_shape *s;
    float *y, *dx, *dw, *db;
    const float *x, *w, *b, *dy;
} ref_ctx;

/* Forward: each unit is one row of y. */
static void ref_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
    size_t k = (size_t)c->s->k, n = (size_t)c->s->n;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        const float *xr = c->x + r * k;
        for (size_t o = 0; o < n; o++) {
            const float *wr = c->w + o * k;
            float acc = c->b ? c->b[o] : 0.0f;
            for (size_t i = 0; i < k; i++) acc += xr[i] * wr[i];
            c->y[r * n + o] = acc;
        }
    }
}

/* Reference y[m, n] = x[m, k] w[n, k]^T + b[n] by loops. */
void sd_linear_fwd_ref(sd_pool *pool, const sd_linear_shape *s, float *y, const float *x, const float *w,
                   const float *b)
{
    ref_ctx c = {.s = s, .y = y, .x = x, .w = w, .b = b};
    sd_pool_for(pool, (size_t)s->m, ref_fwd_range, &c);
}

/* Input gradient: each unit is one row, dx[r] += dy[r] w. */
static void ref_bwd_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
    size_t k = (size_t)c->s->k, n = (size_t)c->s->n;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        float *dxr = c->dx + r * k;
        for (size_t o = 0; o < n; o++) {
            float g = c->dy[r * n + o];
            const float *wr = c->w + o * k;
            for (size_t i = 0; i < k; i++) dxr[i] += g * wr[i];
        }
    }
}

/* Weight and bias gradients: each unit is one output feature, summing
 * over rows in order, so no cross-thread reduction. */
static void ref_bwd_dw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
    size_t m = (size_t)c->s->m, k = (size_t)c->s->k, n = (size_t)c->s->n;
    (void)worker;
    for (size_t o = begin; o < end; o++) {
        float *dwr = c->dw ? c->dw + o * k : NULL;
        float bsum = 0.0f;
        for (size_t r = 0; r < m; r++) {
            float g = c->dy[r * n + o];
            bsum += g;
            if (!dwr) continue;
            const float *xr = c->x + r * k;
            for (size_t i = 0; i < k; i++) dwr[i] += g * xr[i];
        }
        if (c->db) c->db[o] += bsum;
    }
}

/* Reference dx += dy w; dw += dy^T x; db += column sums of dy, by loops. */
void sd_linear_bwd_ref(sd_pool *pool, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w)
{
    ref_ctx c = {.s = s, .dx = dx, .dw = dw, .db = db, .x = x, .w = w, .dy = dy};
    if (dx) sd_pool_for(pool, (size_t)s->m, ref_bwd_dx_range, &c);
    if (dw || db) sd_pool_for(pool, (size_t)s->n, ref_bwd_dw_range, &c);
}
