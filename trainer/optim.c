/* AdamW, gradient clipping and learning-rate schedules. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NORM_CHUNK = 1 << 16 };

/* Work of one AdamW call. */
typedef struct {
    const sd_adamw_opts *o;
    float *p, *m, *v;
    const float *g;
    float decay, b1, b2, step_size, bc2_sqrt, eps;
} adamw_ctx;

/* torch's single-tensor AdamW arithmetic in fp32 on one slice. */
static void adamw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const adamw_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) {
        float g = c->g[i];
        float p = c->p[i] * c->decay;
        float m = c->m[i] + (g - c->m[i]) * (1.0f - c->b1);
        float v = c->v[i] * c->b2 + (1.0f - c->b2) * g * g;
        float denom = sqrtf(v) / c->bc2_sqrt + c->eps;
        c->p[i] = p - c->step_size * (m / denom);
        c->m[i] = m;
        c->v[i] = v;
    }
}

/* Bias corrections in double, the element loop in fp32. */
void sd_adamw_step(sd_pool *pool, const sd_adamw_opts *o, double lr, long step, float *p, float *m, float *v,
                   const float *g, size_t n)
{
    double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    adamw_ctx c = {.o = o, .p = p, .m = m, .v = v, .g = g, .decay = (float)(1.0 - lr * o->weight_decay),
                   .b1 = (float)o->beta1, .b2 = (float)o->beta2, .step_size = (float)(lr / bc1),
                   .bc2_sqrt = (float)sqrt(bc2), .eps = (float)o->eps};
    sd_pool_for(pool, n, adamw_range, &c);
}

/* Work of one norm or scale call. */
typedef struct {
    float *g;
    size_t n;
    double *part;
    float scale;
} norm_ctx;

/* Sum of squares of fixed chunks, in double. */
static void sumsq_range(void *vctx, int worker, size_t begin, size_t end)
{
    const norm_ctx *c = vctx;
    (void)worker;
    for (size_t k = begin; k < end; k++) {
        size_t a = k * NORM_CHUNK, b = a + NORM_CHUNK < c->n ? a + NORM_CHUNK : c->n;
        double s = 0;
        for (size_t i = a; i < b; i++) s += (double)c->g[i] * (double)c->g[i];
        c->part[k] = s;
    }
}

/* g *= scale on one slice. */
static void scale_range(void *vctx, int worker, size_t begin, size_t end)
{
    const norm_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->g[i] *= c->scale;
}

/* Chunk sums added in order: the same norm for any thread count. */
double sd_grad_clip(sd_pool *pool, float *g, size_t n, double max_norm)
{
    size_t nk = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double *part = calloc(nk ? nk : 1, sizeof(double)), total = 0;
    if (!part) {
        /* no memory for the partials: one thread, same chunk order */
        for (size_t k = 0; k < nk; k++) {
            double s = 0;
            for (size_t i = k * NORM_CHUNK; i < n && i < (k + 1) * NORM_CHUNK; i++) s += (double)g[i] * g[i];
            total += s;
        }
    } else {
        norm_ctx c = {.g = g, .n = n, .part = part};
        sd_pool_for(pool, nk, sumsq_range, &c);
        for (size_t k = 0; k < nk; k++) total += part[k];
        free(part);
    }
    double norm = sqrt(total);
    if (max_norm > 0 && isfinite(norm)) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) {
            norm_ctx c = {.g = g, .n = n, .scale = (float)coef};
            sd_pool_for(pool, n, scale_range, &c);
        }
    }
    return norm;
}

/* EMAModel.get_decay without warmup, update_after_step 0, min_decay 0. */
double sd_ema_decay(double max_decay, long n)
{
    long k = n - 1;
    if (k <= 0) return 0.0;
    double d = (1.0 + (double)k) / (10.0 + (double)k);
    return d < max_decay ? d : max_decay;
}

/* Work of one EMA update. */
typedef struct {
    float *ema;
    const float *p;
    float w;
} ema_ctx;

/* The shadow weights pulled towards the model's by 1 - decay. */
static void ema_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ema_ctx *c = vctx;
    (void)worker;
    for (size_t i = begin; i < end; i++) c->ema[i] -= c->w * (c->ema[i] - c->p[i]);
}

/* One EMAModel.step over the flat buffers. */
void sd_ema_update(sd_pool *pool, float *ema, const float *p, size_t n, double decay)
{
    ema_ctx c = {.ema = ema, .p = p, .w = (float)(1.0 - decay)};
    sd_pool_for(pool, n, ema_range, &c);
}

/* diffusers' schedule lambdas times the base rate. */
double sd_lr_at(const sd_lr_sched *l, long s)
{
    double w = (double)l->warmup, t = (double)l->total, x = (double)s;
    if (l->kind != SD_LR_CONSTANT && s < l->warmup) return l->base * x / (w > 1 ? w : 1);
    switch (l->kind) {
    case SD_LR_CONSTANT:
    case SD_LR_CONSTANT_WARMUP: return l->base;
    case SD_LR_COSINE: {
        double prog = (x - w) / (t - w > 1 ? t - w : 1);
        double f = 0.5 * (1.0 + cos(3.14159265358979323846 * prog));
        return l->base * (f > 0 ? f : 0);
    }
    case SD_LR_LINEAR: {
        double f = (t - x) / (t - w > 1 ? t - w : 1);
        return l->base * (f > 0 ? f : 0);
    }
    }
    return l->base;
}

/* Schedule names as diffusers spells them. */
int sd_lr_kind_parse(const char *name, sd_lr_kind *out)
{
    static const char *names[] = {"constant", "constant_with_warmup", "cosine", "linear"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (sd_lr_kind)i;
            return 1;
        }
    return 0;
}
