/* Scaled dot-product attention forward and backward. Scores are never
 * stored: forward keeps the log-sum-exp of each row, backward recomputes
 * the probabilities from it (the flash-attention recipe, without tiling
 * yet), so memory is O(T*d) even for the VAE's 16k-token attention. */
#include <math.h>

#include "ops_cpu.h"

/* Positive dims and a positive, finite scale. */
sd_status sd_attn_check(const sd_attn_shape *s, sd_error *err)
{
    if (s->b <= 0 || s->heads <= 0 || s->tq <= 0 || s->tk <= 0 || s->d <= 0)
        return sd_err_set(err, SD_EINVAL, "attention: non-positive dimension");
    if (!(s->scale > 0.0f) || isinf(s->scale)) return sd_err_set(err, SD_EINVAL, "attention: bad scale");
    return SD_OK;
}

typedef struct {
    const sd_attn_shape *s;
    float *y, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dy, *cy, *clse;
} attn_ctx;

/* Plain dot product of two d-vectors. */
static float dot(const float *a, const float *b, int d)
{
    float acc = 0.0f;
    for (int i = 0; i < d; i++) acc += a[i] * b[i];
    return acc;
}

/* Keys a query row may see: all of them, or j <= i under the causal mask. */
static int keys_for_row(const sd_attn_shape *s, int i)
{
    if (!s->causal) return s->tk;
    return i + 1 < s->tk ? i + 1 : s->tk;
}

/* Forward: each unit is one query row (batch, head, i). Two passes over
 * the keys: the row maximum, then exp-sum and the weighted sum of values. */
static void attn_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const attn_ctx *c = vctx;
    const sd_attn_shape *s = c->s;
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / tq;
        int i = (int)(u % tq), nk = keys_for_row(s, i);
        const float *qr = c->q + u * d, *kb = c->k + bh * tk * d, *vb = c->v + bh * tk * d;
        float *yr = c->y + u * d;
        float mx = -INFINITY;
        for (int j = 0; j < nk; j++) {
            float sc = dot(qr, kb + (size_t)j * d, s->d) * s->scale;
            if (sc > mx) mx = sc;
        }
        for (size_t t = 0; t < d; t++) yr[t] = 0.0f;
        float l = 0.0f;
        for (int j = 0; j < nk; j++) {
            float p = expf(dot(qr, kb + (size_t)j * d, s->d) * s->scale - mx);
            l += p;
            const float *vr = vb + (size_t)j * d;
            for (size_t t = 0; t < d; t++) yr[t] += p * vr[t];
        }
        for (size_t t = 0; t < d; t++) yr[t] /= l;
        c->lse[u] = mx + logf(l);
    }
}

/* y = softmax(q k^T * scale) v; lse saved for backward. */
void sd_attn_fwd(sd_pool *pool, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                 const float *v)
{
    attn_ctx c = {.s = s, .y = y, .lse = lse, .q = q, .k = k, .v = v};
    sd_pool_for(pool, (size_t)s->b * (size_t)s->heads * (size_t)s->tq, attn_fwd_range, &c);
}

/* dq for one query row: dq_i += scale * sum_j p_ij (dy_i.v_j - dy_i.y_i) k_j. */
static void attn_bwd_dq_range(void *vctx, int worker, size_t begin, size_t end)
{
    const attn_ctx *c = vctx;
    const sd_attn_shape *s = c->s;
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / tq;
        int i = (int)(u % tq), nk = keys_for_row(s, i);
        const float *qr = c->q + u * d, *dyr = c->dy + u * d;
        const float *kb = c->k + bh * tk * d, *vb = c->v + bh * tk * d;
        float *dqr = c->dq + u * d;
        float dd = dot(dyr, c->cy + u * d, s->d);
        for (int j = 0; j < nk; j++) {
            const float *kr = kb + (size_t)j * d;
            float p = expf(dot(qr, kr, s->d) * s->scale - c->clse[u]);
            float ds = p * (dot(dyr, vb + (size_t)j * d, s->d) - dd) * s->scale;
            for (size_t t = 0; t < d; t++) dqr[t] += ds * kr[t];
        }
    }
}

/* dk and dv for one key row j, summing over the query rows that see it:
 * dv_j += sum_i p_ij dy_i; dk_j += scale * sum_i p_ij (dy_i.v_j - D_i) q_i. */
static void attn_bwd_dkv_range(void *vctx, int worker, size_t begin, size_t end)
{
    const attn_ctx *c = vctx;
    const sd_attn_shape *s = c->s;
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / tk;
        int j = (int)(u % tk);
        const float *kr = c->k + u * d, *vr = c->v + u * d;
        float *dkr = c->dk ? c->dk + u * d : NULL, *dvr = c->dv ? c->dv + u * d : NULL;
        for (int i = s->causal ? j : 0; i < s->tq; i++) {
            size_t row = bh * tq + (size_t)i;
            const float *qr = c->q + row * d, *dyr = c->dy + row * d;
            float p = expf(dot(qr, kr, s->d) * s->scale - c->clse[row]);
            if (dvr)
                for (size_t t = 0; t < d; t++) dvr[t] += p * dyr[t];
            if (dkr) {
                float ds = p * (dot(dyr, vr, s->d) - dot(dyr, c->cy + row * d, s->d)) * s->scale;
                for (size_t t = 0; t < d; t++) dkr[t] += ds * qr[t];
            }
        }
    }
}

/* Gradients for q, k, v from dy, the inputs, and the forward's y and lse. */
void sd_attn_bwd(sd_pool *pool, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                 const float *q, const float *k, const float *v, const float *y, const float *lse)
{
    attn_ctx c = {.s = s, .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dy = dy, .cy = y, .clse = lse};
    size_t bh = (size_t)s->b * (size_t)s->heads;
    if (dq) sd_pool_for(pool, bh * (size_t)s->tq, attn_bwd_dq_range, &c);
    if (dk || dv) sd_pool_for(pool, bh * (size_t)s->tk, attn_bwd_dkv_range, &c);
}
