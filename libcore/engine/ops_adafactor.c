/* Adafactor as transformers' Adafactor computes it with relative_step,
 * scale_parameter and warmup_init off and a given rate: for a tensor of
 * rank >= 2 the second moment is factored over its last two dimensions
 * (a conv kernel [o, i, kh, kw] keeps a row state [o, i, kh] and a column
 * state [o, i, kw]), for rank 1 it is kept whole; eps 1e-30 is added to
 * the squared gradient, decay 1 - step^-0.8, the update clipped to RMS 1,
 * an optional first moment over the scaled update, weight decay as
 * p -= p * wd * lr. Means and norms are summed in double. The update is
 * computed twice, once for its RMS and once to apply it (the same bits
 * both times), so no tensor-sized scratch is held. */
#include <math.h>

#include "ops_cpu.h"

/* Columns summed together in one sweep over the rows (each column's sum
 * still in row order): a wide matrix is read row by row, not a column at
 * a time across all rows. */
enum { COL_CHUNK = 64 };

/* The second moment's new factors of one factored tensor (batch x rows x
 * cols values): rows and columns of g^2 + 1e-30 averaged into them. */
static void update_factors(const sd_adafactor_args *a, const sd_adafactor_tensor *x, const float *g, size_t batch,
                           size_t rows, size_t cols)
{
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
        for (size_t c0 = 0; c0 < cols; c0 += COL_CHUNK) { /* update.mean(dim=-2), a chunk of columns at a time */
            size_t nc = cols - c0 < COL_CHUNK ? cols - c0 : COL_CHUNK;
            double s[COL_CHUNK] = {0};
            for (size_t r = 0; r < rows; r++)
                for (size_t c = 0; c < nc; c++) {
                    float gi = gb[r * cols + c0 + c] * a->gscale;
                    s[c] += (double)(gi * gi + 1e-30f);
                }
            for (size_t c = 0; c < nc; c++) {
                float *cs = &x->col[b * cols + c0 + c];
                *cs = fmaf((float)(s[c] / (double)rows), one_b2, *cs * b2);
            }
        }
    }
}

/* One tensor's pass over its preconditioned update u: with p NULL the sum
 * of u^2 is returned; else u / d * lr goes through the first moment (when
 * there is one) and, after the weight decay, out of p. u is
 * rsqrt(row / mean(row)) * rsqrt(col) * g for a factored tensor (the row
 * mean per leading index), rsqrt(v) * g for the rest. */
static double pass(const sd_adafactor_args *a, const sd_adafactor_tensor *x, const float *g, float d, float *p)
{
    size_t cols = x->row ? (size_t)x->shape[x->ndim - 1] : x->n, rows = x->row ? (size_t)x->shape[x->ndim - 2] : 1;
    size_t batch = x->n / (rows * cols);
    double ss = 0;
    for (size_t b = 0; b < batch; b++) {
        float mean = 0;
        if (x->row) {
            double s = 0; /* exp_avg_sq_row.mean(dim=-1) */
            for (size_t r = 0; r < rows; r++) s += x->row[b * rows + r];
            mean = (float)(s / (double)rows);
        }
        for (size_t r = 0; r < rows; r++) {
            float rf = x->row ? 1.0f / sqrtf(x->row[b * rows + r] / mean) : 1.0f;
            for (size_t c = 0; c < cols; c++) {
                size_t i = (b * rows + r) * cols + c;
                float gi = g[i] * a->gscale;
                float u = x->row ? rf * (1.0f / sqrtf(x->col[b * cols + c])) * gi : 1.0f / sqrtf(x->v[i]) * gi;
                if (!p) {
                    ss += (double)u * (double)u;
                    continue;
                }
                u = u / d * a->lr;
                if (x->m) {
                    x->m[i] = fmaf(u, a->one_beta1, x->m[i] * a->beta1);
                    u = x->m[i];
                }
                float w = p[i];
                if (a->decay_on) w = fmaf(w, a->neg_wd_lr, w); /* add_(p, alpha=-wd * lr) */
                p[i] = w - u;
            }
        }
    }
    return ss;
}

/* One tensor's step: the second moment, the update's RMS, then the
 * update clipped by it, scaled by lr, through the first moment, weight
 * decay and the update applied to p. */
static void adafactor_tensor(const sd_adafactor_args *a, const sd_adafactor_tensor *x, float *p, const float *g)
{
    if (x->row) {
        size_t cols = (size_t)x->shape[x->ndim - 1], rows = (size_t)x->shape[x->ndim - 2];
        update_factors(a, x, g, x->n / (rows * cols), rows, cols);
    } else {
        for (size_t i = 0; i < x->n; i++) {
            float gi = g[i] * a->gscale;
            x->v[i] = fmaf(gi * gi + 1e-30f, a->one_beta2t, x->v[i] * a->beta2t);
        }
    }
    double rms = sqrt(pass(a, x, g, 1.0f, NULL)) / sqrt((double)x->n), div = rms / a->clip_threshold;
    pass(a, x, g, (float)(div > 1.0 ? div : 1.0), p);
}

/* Work of one Adafactor call: tensors split over the pool. */
typedef struct {
    const sd_adafactor_args *a;
    const sd_adafactor_tensor *ts;
    float *p;
    const float *g;
} adafactor_ctx;

/* A range of tensors, each whole on one worker (the same bits for any
 * thread count). */
static void adafactor_range(void *vctx, int worker, size_t begin, size_t end)
{
    const adafactor_ctx *c = vctx;
    (void)worker;
    for (size_t k = begin; k < end; k++) adafactor_tensor(c->a, &c->ts[k], c->p + c->ts[k].off, c->g + c->ts[k].off);
}

/* One Adafactor step over every tensor. */
void sd_adafactor_fwd(sd_pool *pool, const sd_adafactor_args *a, size_t ntensors, const sd_adafactor_tensor *ts,
                      float *p, const float *g)
{
    adafactor_ctx c = {.a = a, .ts = ts, .p = p, .g = g};
    sd_pool_for(pool, ntensors, adafactor_range, &c);
}
