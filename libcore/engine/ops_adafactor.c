/* Adafactor as transformers' Adafactor computes it with relative_step,
 * scale_parameter and warmup_init off and a given rate: for a tensor of
 * rank >= 2 the second moment is factored over its last two dimensions
 * (a conv kernel [o, i, kh, kw] keeps a row state [o, i, kh] and a column
 * state [o, i, kw]), for rank 1 it is kept whole; eps 1e-30 is added to
 * the squared gradient, decay 1 - step^-0.8, the update clipped to RMS 1,
 * an optional first moment over the scaled update, weight decay as
 * p -= p * wd * lr. Means and norms are summed in double. */
#include <math.h>

#include "ops_cpu.h"

/* One factored tensor: batch x rows x cols values; u gets the
 * preconditioned gradient (n values). */
static void factored(const sd_adafactor_args *a, const sd_adafactor_tensor *x, const float *g, float *u)
{
    size_t cols = (size_t)x->shape[x->ndim - 1], rows = (size_t)x->shape[x->ndim - 2], batch = x->n / (rows * cols);
    float b2 = a->beta2t, one_b2 = a->one_beta2t;
    for (size_t b = 0; b < batch; b++) {
        const float *gb = g + b * rows * cols;
        for (size_t r = 0; r < rows; r++) { /* update.mean(dim=-1) */
            double s = 0;
            for (size_t c = 0; c < cols; c++) {
                float gi = gb[r * cols + c] * a->gscale;
                s += (double)(gi * gi + 1e-30f);
            }
            float *rs = &x->row[b * rows + r];
            *rs = fmaf((float)(s / (double)cols), one_b2, *rs * b2);
        }
        for (size_t c = 0; c < cols; c++) { /* update.mean(dim=-2) */
            double s = 0;
            for (size_t r = 0; r < rows; r++) {
                float gi = gb[r * cols + c] * a->gscale;
                s += (double)(gi * gi + 1e-30f);
            }
            float *cs = &x->col[b * cols + c];
            *cs = fmaf((float)(s / (double)rows), one_b2, *cs * b2);
        }
    }
    for (size_t b = 0; b < batch; b++) {
        double s = 0; /* exp_avg_sq_row.mean(dim=-1) */
        for (size_t r = 0; r < rows; r++) s += x->row[b * rows + r];
        float mean = (float)(s / (double)rows);
        for (size_t r = 0; r < rows; r++) {
            float rf = 1.0f / sqrtf(x->row[b * rows + r] / mean);
            for (size_t c = 0; c < cols; c++) {
                size_t i = (b * rows + r) * cols + c;
                float cf = 1.0f / sqrtf(x->col[b * cols + c]);
                u[i] = rf * cf * (g[i] * a->gscale);
            }
        }
    }
}

/* One unfactored tensor (rank 1): the whole second moment. */
static void unfactored(const sd_adafactor_args *a, const sd_adafactor_tensor *x, const float *g, float *u)
{
    for (size_t i = 0; i < x->n; i++) {
        float gi = g[i] * a->gscale;
        x->v[i] = fmaf(gi * gi + 1e-30f, a->one_beta2t, x->v[i] * a->beta2t);
        u[i] = 1.0f / sqrtf(x->v[i]) * gi;
    }
}

/* One tensor's step: the preconditioned update, clipped by its RMS,
 * scaled by lr, through the first moment when there is one, then weight
 * decay and the update applied to p. */
static void adafactor_tensor(const sd_adafactor_args *a, const sd_adafactor_tensor *x, float *p, const float *g,
                             float *u)
{
    if (x->row) factored(a, x, g, u);
    else unfactored(a, x, g, u);
    double ss = 0;
    for (size_t i = 0; i < x->n; i++) ss += (double)u[i] * (double)u[i];
    double rms = sqrt(ss) / sqrt((double)x->n), div = rms / a->clip_threshold;
    float d = (float)(div > 1.0 ? div : 1.0);
    for (size_t i = 0; i < x->n; i++) {
        float ui = u[i] / d * a->lr;
        if (x->m) {
            x->m[i] = fmaf(ui, a->one_beta1, x->m[i] * a->beta1);
            ui = x->m[i];
        }
        float w = p[i];
        if (a->decay_on) w = fmaf(w, a->neg_wd_lr, w); /* add_(p, alpha=-wd * lr) */
        p[i] = w - ui;
    }
}

/* Work of one Adafactor call: tensors split over the pool, each worker
 * with its own scratch. */
typedef struct {
    const sd_adafactor_args *a;
    const sd_adafactor_tensor *ts;
    float *p, *scratch;
    const float *g;
    size_t stride;
} adafactor_ctx;

/* A range of tensors, each whole on one worker (the same bits for any
 * thread count). */
static void adafactor_range(void *vctx, int worker, size_t begin, size_t end)
{
    const adafactor_ctx *c = vctx;
    float *u = c->scratch + (size_t)worker * c->stride;
    for (size_t k = begin; k < end; k++) adafactor_tensor(c->a, &c->ts[k], c->p + c->ts[k].off, c->g + c->ts[k].off, u);
}

/* The scratch floats sd_adafactor_fwd needs: the largest tensor's size
 * for each worker of the pool. */
size_t sd_adafactor_scratch_floats(const sd_pool *pool, size_t ntensors, const sd_adafactor_tensor *ts)
{
    size_t most = 1;
    for (size_t k = 0; k < ntensors; k++)
        if (ts[k].n > most) most = ts[k].n;
    return most * (size_t)sd_pool_size(pool);
}

/* One Adafactor step over every tensor. */
void sd_adafactor_fwd(sd_pool *pool, const sd_adafactor_args *a, size_t ntensors, const sd_adafactor_tensor *ts,
                      float *p, const float *g, float *scratch)
{
    adafactor_ctx c = {.a = a, .ts = ts, .p = p, .g = g, .scratch = scratch,
                       .stride = sd_adafactor_scratch_floats(pool, ntensors, ts) / (size_t)sd_pool_size(pool)};
    sd_pool_for(pool, ntensors, adafactor_range, &c);
}
