/* Element-wise ops (SiLU, add, scale, mul) and nearest 2x upsampling,
 * forward and backward. Each thread owns a contiguous slice of the output.
 * The GELU family lives in ops_act.c. */
#include "ops_cpu.h"
#include "ops_math.h"

typedef struct {
    float *out, *out2;
    const float *a, *b, *c;
    float alpha;
    int h, w;
} elem_ctx;

/* silu(x) = x * sigmoid(x). */
static void silu_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] = sdm_silu(c->a[i]);
}

/* y = silu(x); y may be x. */
void sd_silu_fwd(sd_pool *pool, size_t n, float *y, const float *x)
{
    elem_ctx c = {.out = y, .a = x};
    sd_pool_for(pool, n, silu_fwd_range, &c);
}

/* d silu / dx = s * (1 + x * (1 - s)) with s = sigmoid(x). */
static void silu_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] += c->a[i] * sdm_silu_grad(c->b[i]);
}

/* dx += dy * silu'(x); needs the forward's input, not its output. */
void sd_silu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x)
{
    if (!dx) return;
    elem_ctx c = {.out = dx, .a = dy, .b = x};
    sd_pool_for(pool, n, silu_bwd_range, &c);
}

/* y = a + b. */
static void add_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] = c->a[i] + c->b[i];
}

/* y = a + b, same shapes (residual connections); y may alias a or b. */
void sd_add_fwd(sd_pool *pool, size_t n, float *y, const float *a, const float *b)
{
    elem_ctx c = {.out = y, .a = a, .b = b};
    sd_pool_for(pool, n, add_fwd_range, &c);
}

/* da += dy, db += dy. */
static void add_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) {
        if (c->out) c->out[i] += c->a[i];
        if (c->out2) c->out2[i] += c->a[i];
    }
}

/* The gradient of a sum flows unchanged to both inputs. */
void sd_add_bwd(sd_pool *pool, size_t n, float *da, float *db, const float *dy)
{
    elem_ctx c = {.out = da, .out2 = db, .a = dy};
    if (da || db) sd_pool_for(pool, n, add_bwd_range, &c);
}

/* y = alpha * x. */
static void scale_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] = c->alpha * c->a[i];
}

/* y = alpha * x with a constant alpha (the VAE latent scale, the
 * attention scale); y may be x. */
void sd_scale_fwd(sd_pool *pool, size_t n, float *y, const float *x, float alpha)
{
    elem_ctx c = {.out = y, .a = x, .alpha = alpha};
    sd_pool_for(pool, n, scale_fwd_range, &c);
}

/* dx += alpha * dy. */
static void scale_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] += c->alpha * c->a[i];
}

/* alpha is a constant, not a parameter, so only x gets a gradient. */
void sd_scale_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, float alpha)
{
    elem_ctx c = {.out = dx, .a = dy, .alpha = alpha};
    if (dx) sd_pool_for(pool, n, scale_bwd_range, &c);
}

/* y = a * b. */
static void mul_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] = c->a[i] * c->b[i];
}

/* Element-wise product of two same-shaped tensors (gates); y may alias a
 * or b only when backward is not needed, since it reads both. */
void sd_mul_fwd(sd_pool *pool, size_t n, float *y, const float *a, const float *b)
{
    elem_ctx c = {.out = y, .a = a, .b = b};
    sd_pool_for(pool, n, mul_fwd_range, &c);
}

/* da += dy * b, db += dy * a. */
static void mul_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) {
        if (c->out) c->out[i] += c->c[i] * c->b[i];
        if (c->out2) c->out2[i] += c->c[i] * c->a[i];
    }
}

/* Each factor's gradient is dy times the other factor. */
void sd_mul_bwd(sd_pool *pool, size_t n, float *da, float *db, const float *dy, const float *a, const float *b)
{
    elem_ctx c = {.out = da, .out2 = db, .a = a, .b = b, .c = dy};
    if (da || db) sd_pool_for(pool, n, mul_bwd_range, &c);
}

/* Upsample forward: each unit is one input row, written to two output rows. */
static void up_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    size_t w = (size_t)c->w;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        const float *xr = c->a + r * w;
        float *y0 = c->out + r * 4 * w, *y1 = y0 + 2 * w;
        for (size_t i = 0; i < w; i++) y0[2 * i] = y0[2 * i + 1] = y1[2 * i] = y1[2 * i + 1] = xr[i];
    }
}

/* y[p, 2i+a, 2j+b] = x[p, i, j] (torch's nearest, scale factor 2). */
void sd_upsample2x_fwd(sd_pool *pool, int planes, int h, int w, float *y, const float *x)
{
    elem_ctx c = {.out = y, .a = x, .h = h, .w = w};
    sd_pool_for(pool, (size_t)planes * (size_t)h, up_fwd_range, &c);
}

/* Upsample backward: each input pixel sums its 2x2 output block. */
static void up_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_ctx *c = vctx;
    size_t w = (size_t)c->w;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        float *dxr = c->out + r * w;
        const float *d0 = c->a + r * 4 * w, *d1 = d0 + 2 * w;
        for (size_t i = 0; i < w; i++) dxr[i] += (d0[2 * i] + d0[2 * i + 1]) + (d1[2 * i] + d1[2 * i + 1]);
    }
}

/* dx += 2x2 block sums of dy. */
void sd_upsample2x_bwd(sd_pool *pool, int planes, int h, int w, float *dx, const float *dy)
{
    if (!dx) return;
    elem_ctx c = {.out = dx, .a = dy, .h = h, .w = w};
    sd_pool_for(pool, (size_t)planes * (size_t)h, up_bwd_range, &c);
}
