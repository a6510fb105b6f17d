/* Linear layer y = x w^T + b (torch layout) forward and backward by
 * plain loops; an OpenBLAS/oneDNN GEMM replaces them later. */
#include "ops_cpu.h"

/* All three dims must be positive. */
sd_status sd_linear_check(const sd_linear_shape *s, sd_error *err)
{
    if (s->m <= 0 || s->k <= 0 || s->n <= 0) return sd_err_set(err, SD_EINVAL, "linear: non-positive dimension");
    return SD_OK;
}

typedef struct {
    const sd_linear_shape *s;
    float *y, *dx, *dw, *db;
    const float *x, *w, *b, *dy;
} lin_ctx;

/* Forward: each unit is one row of y. */
static void lin_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const lin_ctx *c = vctx;
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

/* y[m, n] = x[m, k] w[n, k]^T + b[n]. */
void sd_linear_fwd(sd_pool *pool, const sd_linear_shape *s, float *y, const float *x, const float *w,
                   const float *b)
{
    lin_ctx c = {.s = s, .y = y, .x = x, .w = w, .b = b};
    sd_pool_for(pool, (size_t)s->m, lin_fwd_range, &c);
}

/* Input gradient: each unit is one row, dx[r] += dy[r] w. */
static void lin_bwd_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const lin_ctx *c = vctx;
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
static void lin_bwd_dw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const lin_ctx *c = vctx;
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

/* dx += dy w; dw += dy^T x; db += column sums of dy. */
void sd_linear_bwd(sd_pool *pool, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w)
{
    lin_ctx c = {.s = s, .dx = dx, .dw = dw, .db = db, .x = x, .w = w, .dy = dy};
    if (dx) sd_pool_for(pool, (size_t)s->m, lin_bwd_dx_range, &c);
    if (dw || db) sd_pool_for(pool, (size_t)s->n, lin_bwd_dw_range, &c);
}
