/* Layout and posterior ops the VAE used to run as host loops, moved into
 * the backend table so the model never touches tensor memory itself (a
 * device backend's memory is not host-readable): a batched transpose and
 * the posterior's std. Each thread owns whole output rows or a slice. */
#include "ops_cpu.h"
#include "ops_math.h"
#include "transpose8.h"

typedef struct {
    float *out;
    const float *in, *dy;
    size_t rows, cols; /* of the forward's input */
    int avx2;          /* forward: 8 x 8 blocks by sd_transpose8_avx2 */
} layout_ctx;

/* One tile, x's rows [r0, r1) by columns [c0, c1), into y: whole 8 x 8
 * blocks through AVX2 registers when the CPU has it, the ragged rest (or
 * everything) by the plain loop. A copy, so both ways give the same y. */
static void tr_tile(const layout_ctx *c, float *yb, const float *xb, size_t r0, size_t r1, size_t c0, size_t c1)
{
    size_t r8 = r0, c8 = c0;
    if (c->avx2) {
        r8 = r0 + (r1 - r0) / 8 * 8;
        c8 = c0 + (c1 - c0) / 8 * 8;
        for (size_t col = c0; col < c8; col += 8)
            for (size_t r = r0; r < r8; r += 8)
                sd_transpose8_avx2(yb + col * c->rows + r, c->rows, xb + r * c->cols + col, c->cols);
    }
    for (size_t col = c0; col < c1; col++)
        for (size_t r = col < c8 ? r8 : r0; r < r1; r++) yb[col * c->rows + r] = xb[r * c->cols + col];
}

/* Transpose forward: unit u is a block of 32 output rows (image b, x's
 * columns col0..col0+32), filled 32x32 tile by tile so both sides stay in
 * cache. */
static void tr_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const layout_ctx *c = vctx;
    size_t nb = (c->cols + 31) / 32;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t b = u / nb, c0 = (u % nb) * 32, c1 = c0 + 32 < c->cols ? c0 + 32 : c->cols;
        const float *xb = c->in + b * c->rows * c->cols;
        float *yb = c->out + b * c->rows * c->cols;
        for (size_t r0 = 0; r0 < c->rows; r0 += 32)
            tr_tile(c, yb, xb, r0, r0 + 32 < c->rows ? r0 + 32 : c->rows, c0, c1);
    }
}

/* y [n, cols, rows] = x [n, rows, cols] transposed per image. */
void sd_transpose_fwd(sd_pool *pool, int n, int rows, int cols, float *y, const float *x)
{
    layout_ctx c = {.out = y, .in = x, .rows = (size_t)rows, .cols = (size_t)cols, .avx2 = sd_transpose8_ok()};
    sd_pool_for(pool, (size_t)n * (((size_t)cols + 31) / 32), tr_fwd_range, &c);
}

/* Transpose backward: unit u is a block of 32 dx rows (image b, x's rows
 * r0..r0+32), gathered tile by tile from dy. */
static void tr_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const layout_ctx *c = vctx;
    size_t nb = (c->rows + 31) / 32;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t b = u / nb, r0 = (u % nb) * 32, r1 = r0 + 32 < c->rows ? r0 + 32 : c->rows;
        const float *gb = c->dy + b * c->rows * c->cols;
        float *db = c->out + b * c->rows * c->cols;
        for (size_t c0 = 0; c0 < c->cols; c0 += 32) {
            size_t c1 = c0 + 32 < c->cols ? c0 + 32 : c->cols;
            for (size_t r = r0; r < r1; r++)
                for (size_t col = c0; col < c1; col++) db[r * c->cols + col] += gb[col * c->rows + r];
        }
    }
}

/* dx [n, rows, cols] += dy [n, cols, rows] transposed back. */
void sd_transpose_bwd(sd_pool *pool, int n, int rows, int cols, float *dx, const float *dy)
{
    layout_ctx c = {.out = dx, .dy = dy, .rows = (size_t)rows, .cols = (size_t)cols};
    if (dx) sd_pool_for(pool, (size_t)n * (((size_t)rows + 31) / 32), tr_bwd_range, &c);
}

/* std = exp(0.5 * clamp(logvar)) over one slice. */
static void gstd_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const layout_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] = sdm_gauss_std(c->in[i]);
}

/* The posterior's std from its logvar; y may be x. */
void sd_gauss_std_fwd(sd_pool *pool, size_t n, float *y, const float *x)
{
    layout_ctx c = {.out = y, .in = x};
    sd_pool_for(pool, n, gstd_fwd_range, &c);
}

/* dx += dy * d std / d logvar over one slice. */
static void gstd_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const layout_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] += c->dy[i] * sdm_gauss_std_grad(c->in[i]);
}

/* Zero gradient where the clamp was active; needs the forward's input. */
void sd_gauss_std_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x)
{
    layout_ctx c = {.out = dx, .in = x, .dy = dy};
    if (dx) sd_pool_for(pool, n, gstd_bwd_range, &c);
}
