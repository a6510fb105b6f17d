/* The GELU family of activations, forward and backward: exact GELU (the
 * UNet's feed-forward), CLIP's quick_gelu, and GEGLU (a gated GELU over a
 * projection split in two halves). Each thread owns a contiguous slice of
 * the output (elements, or rows for GEGLU). The scalar formulas live in
 * ops_math.h, shared with the CUDA kernels. */
#include "clones.h"
#include "ops_cpu.h"
#include "ops_math.h"
#include "vexp.h"

typedef struct {
    float *out;
    const float *x, *dy;
    size_t n; /* GEGLU: output columns per row */
} act_ctx;

/* out[i] = gelu(x[i]) for i < n. */
static void gelu_slice(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = sdm_gelu(x[i]);
}

/* y = gelu(x) over one slice. */
static void gelu_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const act_ctx *c = vctx;
    (void)worker;
    gelu_slice(c->out + begin, c->x + begin, end - begin);
}

/* Exact (erf) GELU, torch's default F.gelu; y may be x. */
void sd_gelu_fwd(sd_pool *pool, size_t n, float *y, const float *x)
{
    act_ctx c = {.out = y, .x = x};
    sd_pool_for(pool, n, gelu_fwd_range, &c);
}

/* dx += dy * gelu'(x) over one slice. */
static void gelu_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const act_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] += c->dy[i] * sdm_gelu_grad(c->x[i]);
}

/* Needs the forward's input, not its output. */
void sd_gelu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x)
{
    act_ctx c = {.out = dx, .x = x, .dy = dy};
    if (dx) sd_pool_for(pool, n, gelu_bwd_range, &c);
}

/* y = x * sigmoid(1.702 x) over one slice, as x / (1 + e^(-1.702 x)) with
 * the polynomial exp (vexp.h) so the loop vectorises: glibc's expf call per
 * element took 6% of a CLIP-L encode. Built for AVX2 and for any x86-64
 * (target_clones; this file is compiled with -O3 -fno-trapping-math); both
 * give the same bits, as nothing is contracted into an FMA in ISO C mode. */
SD_CLONES static void qgelu_slice(float *out, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = x[i] / (1.0f + sd_vexpf(-SDM_QUICK_GELU_K * x[i]));
}

/* y = quick_gelu(x) over one slice of the op. */
static void qgelu_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const act_ctx *c = vctx;
    (void)worker;
    qgelu_slice(c->out + begin, c->x + begin, end - begin);
}

/* CLIP's quick_gelu (OpenAI CLIP, SD 1.x text encoder); y may be x. */
void sd_quick_gelu_fwd(sd_pool *pool, size_t n, float *y, const float *x)
{
    act_ctx c = {.out = y, .x = x};
    sd_pool_for(pool, n, qgelu_fwd_range, &c);
}

/* The activation on a block of rows, through the same slice functions as
 * the ops, so the fused linear gives their bits. */
void sd_act_rows(sd_act act, float *y, size_t ldy, int rows, int cols)
{
    for (int r = 0; r < rows && act != SD_ACT_NONE; r++) {
        float *yr = y + (size_t)r * ldy;
        if (act == SD_ACT_GELU) gelu_slice(yr, yr, (size_t)cols);
        else qgelu_slice(yr, yr, (size_t)cols);
    }
}

/* d/dx = s + k x s (1 - s) with s = sigmoid(k x), k = 1.702. */
static void qgelu_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const act_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->out[i] += c->dy[i] * sdm_quick_gelu_grad(c->x[i]);
}

/* Needs the forward's input, not its output. */
void sd_quick_gelu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x)
{
    act_ctx c = {.out = dx, .x = x, .dy = dy};
    if (dx) sd_pool_for(pool, n, qgelu_bwd_range, &c);
}

/* GEGLU forward: each unit is one row, y[j] = a[j] * gelu(gate[j]). */
static void geglu_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const act_ctx *c = vctx;
    size_t n = c->n;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        const float *a = c->x + r * 2 * n, *gate = a + n;
        float *yr = c->out + r * n;
        for (size_t j = 0; j < n; j++) yr[j] = a[j] * sdm_gelu(gate[j]);
    }
}

/* diffusers' GEGLU after its projection: hidden, gate = x.chunk(2, -1);
 * y = hidden * gelu(gate). */
void sd_geglu_fwd(sd_pool *pool, size_t m, size_t n, float *y, const float *x)
{
    act_ctx c = {.out = y, .x = x, .n = n};
    sd_pool_for(pool, m, geglu_fwd_range, &c);
}

/* GEGLU backward per row: da += dy * gelu(gate), dgate += dy * a * gelu'(gate). */
static void geglu_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const act_ctx *c = vctx;
    size_t n = c->n;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        const float *a = c->x + r * 2 * n, *gate = a + n, *dyr = c->dy + r * n;
        float *da = c->out + r * 2 * n, *dgate = da + n;
        for (size_t j = 0; j < n; j++) {
            da[j] += dyr[j] * sdm_gelu(gate[j]);
            dgate[j] += dyr[j] * a[j] * sdm_gelu_grad(gate[j]);
        }
    }
}

/* dx [m, 2n] gets both halves' gradients; needs the forward's input. */
void sd_geglu_bwd(sd_pool *pool, size_t m, size_t n, float *dx, const float *dy, const float *x)
{
    act_ctx c = {.out = dx, .x = x, .dy = dy, .n = n};
    if (dx) sd_pool_for(pool, m, geglu_bwd_range, &c);
}
