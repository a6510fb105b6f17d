/* The optimizer's element-wise work on the CPU: the global gradient norm's
 * sum of squares, the AdamW update and the EMA of the weights, split over
 * the pool. The formulas are ops_math.h's, shared with the CUDA kernels. */
#include <stdlib.h>

#include "clones.h"
#include "ops_cpu.h"
#include "ops_math.h"

enum { SUMSQ_CHUNK = 1 << 16 };

/* Work of one sum-of-squares call. */
typedef struct {
    const float *x;
    size_t n;
    double *part;
} sumsq_ctx;

/* Sum of squares of x[a, b) in double: eight running sums (element i into
 * sum i % 8, which the compiler keeps in vector registers instead of one
 * serial chain of additions), added in a fixed order at the end. */
SD_CLONES static double chunk_sumsq(const float *x, size_t a, size_t b)
{
    double acc[8] = {0};
    size_t i = a;
    for (; i + 8 <= b; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    for (int j = 0; i < b; i++, j++) acc[j] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Sum of squares of whole chunks, each in double. */
static void sumsq_range(void *vctx, int worker, size_t begin, size_t end)
{
    const sumsq_ctx *c = vctx;
    (void)worker;
    for (size_t k = begin; k < end; k++) {
        size_t a = k * SUMSQ_CHUNK, b = a + SUMSQ_CHUNK < c->n ? a + SUMSQ_CHUNK : c->n;
        c->part[k] = chunk_sumsq(c->x, a, b);
    }
}

/* Chunk sums added in order: the same total for any thread count (and
 * without memory for the partials, one thread in the same order). */
double sd_sum_squares(sd_pool *pool, size_t n, const float *x)
{
    size_t nk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *part = calloc(nk ? nk : 1, sizeof(double)), total = 0;
    if (!part) {
        for (size_t k = 0; k < nk; k++)
            total += chunk_sumsq(x, k * SUMSQ_CHUNK, (k + 1) * SUMSQ_CHUNK < n ? (k + 1) * SUMSQ_CHUNK : n);
        return total;
    }
    sumsq_ctx c = {.x = x, .n = n, .part = part};
    sd_pool_for(pool, nk, sumsq_range, &c);
    for (size_t k = 0; k < nk; k++) total += part[k];
    free(part);
    return total;
}

/* Work of one AdamW call. */
typedef struct {
    const sd_adamw_args *a;
    float *p, *m, *v;
    const float *g;
} adamw_ctx;

/* AdamW on one slice; gscale = 1 leaves g exactly as it is. */
SD_CLONES static void adamw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const adamw_ctx *c = vctx;
    const sd_adamw_args *a = c->a;
    (void)worker;
    for (size_t i = begin; i < end; i++)
        sdm_adamw(c->p + i, c->m + i, c->v + i, c->g[i] * a->gscale, a->decay, a->b1, a->b2, a->step_size,
                  a->bc2_sqrt, a->eps);
}

/* One AdamW step over the pool. */
void sd_adamw_fwd(sd_pool *pool, const sd_adamw_args *a, size_t n, float *p, float *m, float *v, const float *g)
{
    adamw_ctx c = {.a = a, .p = p, .m = m, .v = v, .g = g};
    sd_pool_for(pool, n, adamw_range, &c);
}

/* Work of one AdamW call with bf16 moments. */
typedef struct {
    const sd_adamw_args *a;
    size_t index0;
    float *p;
    uint16_t *m, *v;
    const float *g;
} adamw_bf16_ctx;

/* AdamW with bf16 moments on one slice; element i's rounding bits come
 * from its global index, not the slice. */
SD_CLONES static void adamw_bf16_range(void *vctx, int worker, size_t begin, size_t end)
{
    const adamw_bf16_ctx *c = vctx;
    const sd_adamw_args *a = c->a;
    (void)worker;
    for (size_t i = begin; i < end; i++)
        sdm_adamw_bf16(c->p + i, c->m + i, c->v + i, c->g[i] * a->gscale, a->decay, a->b1, a->b2, a->step_size,
                       a->bc2_sqrt, a->eps, sdm_mix32(a->sr_key, c->index0 + i));
}

/* One AdamW step with bf16 moments over the pool. */
void sd_adamw_bf16_fwd(sd_pool *pool, const sd_adamw_args *a, size_t n, size_t index0, float *p, uint16_t *m,
                       uint16_t *v, const float *g)
{
    adamw_bf16_ctx c = {.a = a, .index0 = index0, .p = p, .m = m, .v = v, .g = g};
    sd_pool_for(pool, n, adamw_bf16_range, &c);
}

/* Work of one EMA update. */
typedef struct {
    float *ema;
    const float *p;
    float w;
} ema_ctx;

/* The shadow weights of one slice pulled towards the model's. */
SD_CLONES static void ema_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ema_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->ema[i] = sdm_ema(c->ema[i], c->p[i], c->w);
}

/* One EMAModel.step over the pool. */
void sd_ema_fwd(sd_pool *pool, size_t n, float *ema, const float *p, float one_minus_decay)
{
    ema_ctx c = {.ema = ema, .p = p, .w = one_minus_decay};
    sd_pool_for(pool, n, ema_range, &c);
}

/* Work of one bf16 widening or store. */
typedef struct {
    size_t index0;
    uint32_t key;
    float *f;
    const float *cf;
    uint16_t *h;
    const uint16_t *ch;
} bf16_ctx;

/* bf16 values of one slice widened exactly. */
static void widen_range(void *vctx, int worker, size_t begin, size_t end)
{
    const bf16_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->f[i] = sdm_bf16_widen(c->ch[i]);
}

/* n bf16 values widened over the pool. */
void sd_bf16_widen_fwd(sd_pool *pool, size_t n, float *dst, const uint16_t *src)
{
    bf16_ctx c = {.f = dst, .ch = src};
    sd_pool_for(pool, n, widen_range, &c);
}

/* fp32 values of one slice stored as bf16, each rounded with the bits of
 * its global index. */
static void store_sr_range(void *vctx, int worker, size_t begin, size_t end)
{
    const bf16_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->h[i] = sdm_bf16_sr(c->cf[i], sdm_mix32(c->key, c->index0 + i));
}

/* n fp32 values stored as bf16 with keyed stochastic rounding over the
 * pool. */
void sd_bf16_store_sr_fwd(sd_pool *pool, size_t n, size_t index0, uint32_t key, uint16_t *dst, const float *src)
{
    bf16_ctx c = {.index0 = index0, .key = key, .h = dst, .cf = src};
    sd_pool_for(pool, n, store_sr_range, &c);
}
