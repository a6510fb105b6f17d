/* The ops a 16-bit-activation forward needs beyond the convolution
 * (sd_conv2d_fwd_st, ops_conv.c): group norm (with SiLU after it, as the
 * VAE's resnets use it), residual add and a plain storage conversion.
 * Inputs and outputs are stored as SD_DT_F32, F16 or BF16 (act_store.h);
 * values are widened a chunk at a time into fp32 on the stack, computed
 * with the fp32 ops' formulas in their order, and rounded once when
 * stored, so each op gives the fp32 op's result for the widened inputs,
 * rounded. */
#include "act_store.h"
#include "dtype.h"
#include "ops_cpu.h"
#include "ops_math.h"

enum { CHUNK = 1024 }; /* floats widened at a time, per operand */

typedef struct {
    const sd_gn_shape *s;
    int silu, xdt, ydt;
    void *y;
    float *mean, *rstd;
    const void *x;
    const float *gamma, *beta;
} gn_st_ctx;

/* One (image, group) per unit, as sd_group_norm_fwd: the two passes over
 * the widened values summed in double, then y = (x - mean) * rstd * gamma
 * + beta, SiLU'd when asked, rounded into y (which may be x). */
static void gn_st_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gn_st_ctx *c = vctx;
    const sd_gn_shape *s = c->s;
    (void)worker;
    size_t cg = (size_t)(s->c / s->groups), hw = (size_t)s->hw, m = cg * hw;
    float buf[CHUNK];
    for (size_t u = begin; u < end; u++) {
        size_t base = u * m;
        double sum = 0.0;
        for (size_t i = 0; i < m; i += CHUNK) {
            size_t k = m - i < CHUNK ? m - i : CHUNK;
            sd_act_widen(buf, c->x, base + i, k, c->xdt);
            for (size_t j = 0; j < k; j++) sum += buf[j];
        }
        float mu = (float)(sum / (double)m);
        double var = 0.0;
        for (size_t i = 0; i < m; i += CHUNK) {
            size_t k = m - i < CHUNK ? m - i : CHUNK;
            sd_act_widen(buf, c->x, base + i, k, c->xdt);
            for (size_t j = 0; j < k; j++) {
                double d = (double)buf[j] - (double)mu;
                var += d * d;
            }
        }
        float rs = (float)(1.0 / sqrt(var / (double)m + (double)s->eps));
        c->mean[u] = mu;
        c->rstd[u] = rs;
        size_t c0 = (u % (size_t)s->groups) * cg;
        for (size_t ch = 0; ch < cg; ch++) {
            float g = c->gamma ? c->gamma[c0 + ch] : 1.0f, b = c->beta ? c->beta[c0 + ch] : 0.0f;
            for (size_t i = 0; i < hw; i += CHUNK) {
                size_t k = hw - i < CHUNK ? hw - i : CHUNK, at = base + ch * hw + i;
                sd_act_widen(buf, c->x, at, k, c->xdt);
                for (size_t j = 0; j < k; j++) buf[j] = (buf[j] - mu) * rs * g + b;
                if (c->silu)
                    for (size_t j = 0; j < k; j++) buf[j] = sdm_silu(buf[j]);
                sd_act_narrow(c->y, at, buf, k, c->ydt);
            }
        }
    }
}

/* y = group_norm(x) (then SiLU with silu set) with typed x and y; the
 * statistics are fp32 as sd_group_norm_fwd saves them. */
void sd_group_norm_fwd_st(sd_pool *pool, const sd_gn_shape *s, int silu, int ydt, void *y, float *mean, float *rstd,
                          int xdt, const void *x, const float *gamma, const float *beta)
{
    gn_st_ctx c = {.s = s, .silu = silu, .xdt = xdt, .ydt = ydt, .y = y, .mean = mean, .rstd = rstd, .x = x,
                   .gamma = gamma, .beta = beta};
    sd_pool_for(pool, (size_t)s->n * (size_t)s->groups, gn_st_range, &c);
}

typedef struct {
    int dt, xdt;
    void *y;
    const void *a, *b;
} elem_st_ctx;

/* Chunks of [begin, end): y = a + b (b set) or y = a converted. */
static void elem_st_range(void *vctx, int worker, size_t begin, size_t end)
{
    const elem_st_ctx *c = vctx;
    (void)worker;
    float va[CHUNK], vb[CHUNK];
    for (size_t i = begin; i < end; i += CHUNK) {
        size_t k = end - i < CHUNK ? end - i : CHUNK;
        sd_act_widen(va, c->a, i, k, c->xdt);
        if (c->b) {
            sd_act_widen(vb, c->b, i, k, c->xdt);
            for (size_t j = 0; j < k; j++) va[j] = va[j] + vb[j];
        }
        sd_act_narrow(c->y, i, va, k, c->dt);
    }
}

/* y = a + b, all three stored as dt; y may alias a or b. */
void sd_add_fwd_st(sd_pool *pool, size_t n, int dt, void *y, const void *a, const void *b)
{
    elem_st_ctx c = {.dt = dt, .xdt = dt, .y = y, .a = a, .b = b};
    sd_pool_for(pool, n, elem_st_range, &c);
}

/* y (ydt) = x (xdt), n values: widening is exact, narrowing rounds. */
void sd_convert_st(sd_pool *pool, size_t n, int ydt, void *y, int xdt, const void *x)
{
    elem_st_ctx c = {.dt = ydt, .xdt = xdt, .y = y, .a = x};
    sd_pool_for(pool, n, elem_st_range, &c);
}
