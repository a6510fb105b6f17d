/* Group normalisation (torch.nn.GroupNorm) and layer normalisation over
 * the last dim (torch.nn.LayerNorm) forward and backward. */
#include <math.h>

#include "clones.h"
#include "ops_cpu.h"

/* Channels must split evenly into groups, as torch requires. */
sd_status sd_group_norm_check(const sd_gn_shape *s, sd_error *err)
{
    if (s->n <= 0 || s->c <= 0 || s->hw <= 0 || s->groups <= 0)
        return sd_err_set(err, SD_EINVAL, "group_norm: non-positive dimension");
    if (s->c % s->groups)
        return sd_err_set(err, SD_EINVAL, "group_norm: %d channels not divisible by %d groups", s->c, s->groups);
    if (!(s->eps > 0.0f)) return sd_err_set(err, SD_EINVAL, "group_norm: eps must be positive");
    return SD_OK;
}

typedef struct {
    const sd_gn_shape *s;
    float *y, *mean, *rstd, *dx, *dgamma, *dbeta;
    const float *x, *gamma, *beta, *dy, *cmean, *crstd;
} gn_ctx;

/* Forward: each unit is one (image, group), a contiguous run of cg*hw
 * floats. Two-pass mean then variance, both summed in double: a VAE group
 * holds up to millions of values, and a float running sum over them loses
 * the mean of a smooth image (then the variance of nearly constant
 * activations is mostly that error, which rstd amplifies). */
static void gn_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gn_ctx *c = vctx;
    const sd_gn_shape *s = c->s;
    (void)worker;
    size_t cg = (size_t)(s->c / s->groups), hw = (size_t)s->hw, m = cg * hw;
    for (size_t u = begin; u < end; u++) {
        const float *xp = c->x + u * m;
        float *yp = c->y + u * m;
        double sum = 0.0;
        for (size_t i = 0; i < m; i++) sum += xp[i];
        float mu = (float)(sum / (double)m);
        double var = 0.0;
        for (size_t i = 0; i < m; i++) {
            double d = (double)xp[i] - (double)mu;
            var += d * d;
        }
        float rs = (float)(1.0 / sqrt(var / (double)m + (double)s->eps));
        c->mean[u] = mu;
        c->rstd[u] = rs;
        size_t c0 = (u % (size_t)s->groups) * cg;
        for (size_t j = 0; j < cg; j++) {
            float g = c->gamma ? c->gamma[c0 + j] : 1.0f, b = c->beta ? c->beta[c0 + j] : 0.0f;
            for (size_t i = 0; i < hw; i++) yp[j * hw + i] = (xp[j * hw + i] - mu) * rs * g + b;
        }
    }
}

/* y = (x - mean) * rstd * gamma + beta per group; saves mean and rstd. */
void sd_group_norm_fwd(sd_pool *pool, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x,
                       const float *gamma, const float *beta)
{
    gn_ctx c = {.s = s, .y = y, .mean = mean, .rstd = rstd, .x = x, .gamma = gamma, .beta = beta};
    sd_pool_for(pool, (size_t)s->n * (size_t)s->groups, gn_fwd_range, &c);
}

/* Input gradient per (image, group):
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma. */
static void gn_bwd_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gn_ctx *c = vctx;
    const sd_gn_shape *s = c->s;
    (void)worker;
    size_t cg = (size_t)(s->c / s->groups), hw = (size_t)s->hw, m = cg * hw;
    for (size_t u = begin; u < end; u++) {
        const float *xp = c->x + u * m, *dyp = c->dy + u * m;
        float *dxp = c->dx + u * m;
        float mu = c->cmean[u], rs = c->crstd[u];
        size_t c0 = (u % (size_t)s->groups) * cg;
        double sgd = 0.0, sgxd = 0.0; /* group sums in double, as the forward's */
        for (size_t j = 0; j < cg; j++) {
            float g = c->gamma ? c->gamma[c0 + j] : 1.0f;
            for (size_t i = 0; i < hw; i++) {
                float gi = dyp[j * hw + i] * g;
                sgd += gi;
                sgxd += gi * (xp[j * hw + i] - mu) * rs;
            }
        }
        float sg = (float)(sgd / (double)m), sgx = (float)(sgxd / (double)m);
        for (size_t j = 0; j < cg; j++) {
            float g = c->gamma ? c->gamma[c0 + j] : 1.0f;
            for (size_t i = 0; i < hw; i++) {
                size_t k = j * hw + i;
                float xhat = (xp[k] - mu) * rs;
                dxp[k] += rs * (dyp[k] * g - sg - xhat * sgx);
            }
        }
    }
}

/* Affine gradients: each unit is one channel, summed over the batch. */
static void gn_bwd_affine_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gn_ctx *c = vctx;
    const sd_gn_shape *s = c->s;
    (void)worker;
    size_t cg = (size_t)(s->c / s->groups), hw = (size_t)s->hw;
    for (size_t ch = begin; ch < end; ch++) {
        double sdg = 0.0, sdb = 0.0;
        for (int ni = 0; ni < s->n; ni++) {
            size_t u = (size_t)ni * (size_t)s->groups + ch / cg;
            const float *xp = c->x + ((size_t)ni * (size_t)s->c + ch) * hw;
            const float *dyp = c->dy + ((size_t)ni * (size_t)s->c + ch) * hw;
            float mu = c->cmean[u], rs = c->crstd[u];
            for (size_t i = 0; i < hw; i++) {
                sdg += dyp[i] * (xp[i] - mu) * rs;
                sdb += dyp[i];
            }
        }
        if (c->dgamma) c->dgamma[ch] += (float)sdg;
        if (c->dbeta) c->dbeta[ch] += (float)sdb;
    }
}

/* dx, dgamma, dbeta from dy and the forward's saved mean/rstd. */
void sd_group_norm_bwd(sd_pool *pool, const sd_gn_shape *s, float *dx, float *dgamma, float *dbeta,
                       const float *dy, const float *x, const float *mean, const float *rstd, const float *gamma)
{
    gn_ctx c = {.s = s, .dx = dx, .dgamma = dgamma, .dbeta = dbeta, .x = x, .gamma = gamma, .dy = dy,
                .cmean = mean, .crstd = rstd};
    if (dx) sd_pool_for(pool, (size_t)s->n * (size_t)s->groups, gn_bwd_dx_range, &c);
    if (dgamma || dbeta) sd_pool_for(pool, (size_t)s->c, gn_bwd_affine_range, &c);
}

/* Layer norm of [m, c] is group norm of [m, c, 1] with one group: the same
 * per-row statistics and per-channel affine, so it shares that code. */
static sd_gn_shape ln_as_gn(const sd_ln_shape *s)
{
    return (sd_gn_shape){.n = s->m, .c = s->c, .hw = 1, .groups = 1, .eps = s->eps};
}

/* Positive dims and eps, reported under the layer norm's own name. */
sd_status sd_layer_norm_check(const sd_ln_shape *s, sd_error *err)
{
    if (s->m <= 0 || s->c <= 0) return sd_err_set(err, SD_EINVAL, "layer_norm: non-positive dimension");
    if (!(s->eps > 0.0f)) return sd_err_set(err, SD_EINVAL, "layer_norm: eps must be positive");
    return SD_OK;
}

/* Sum of a[0..n) in double, in four interleaved partial sums added in a
 * fixed order: a quarter of the serial chain of one running sum (a
 * layer-norm row of a batch of CLIP captions spent most of its time
 * waiting on that chain). */
SD_CLONES static double sum4(const float *a, size_t n)
{
    double p0 = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        p0 += (double)a[i];
        p1 += (double)a[i + 1];
        p2 += (double)a[i + 2];
        p3 += (double)a[i + 3];
    }
    for (; i < n; i++) p0 += (double)a[i];
    return (p0 + p2) + (p1 + p3);
}

/* Sum of (a[i] - mu)^2 in double, the same way. */
SD_CLONES static double sumsq4(const float *a, size_t n, double mu)
{
    double p0 = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        double d0 = (double)a[i] - mu, d1 = (double)a[i + 1] - mu;
        double d2 = (double)a[i + 2] - mu, d3 = (double)a[i + 3] - mu;
        p0 += d0 * d0;
        p1 += d1 * d1;
        p2 += d2 * d2;
        p3 += d3 * d3;
    }
    for (; i < n; i++) p0 += ((double)a[i] - mu) * ((double)a[i] - mu);
    return (p0 + p2) + (p1 + p3);
}

/* y[j] = (x[j] - mu) * rs * g[j] + b[j], in groups of 8 that the
 * compiler turns into vector code at -O2 (each element's operations in the
 * written order, so the same bits as the plain loop). */
SD_CLONES static void ln_affine(float *restrict y, const float *restrict x, const float *restrict g,
                                const float *restrict b, size_t n, float mu, float rs)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (size_t l = 0; l < 8; l++) y[j + l] = (x[j + l] - mu) * rs * g[j + l] + b[j + l];
    for (; j < n; j++) y[j] = (x[j] - mu) * rs * g[j] + b[j];
}

/* Layer norm forward: each unit is one row of c floats; mean, then
 * variance around it, in double (as the group norm), then the affine
 * output in one pass over the row. */
static void ln_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gn_ctx *c = vctx;
    size_t n = (size_t)c->s->c;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        const float *xp = c->x + u * n;
        float *yp = c->y + u * n;
        float mu = (float)(sum4(xp, n) / (double)n);
        float rs = (float)(1.0 / sqrt(sumsq4(xp, n, (double)mu) / (double)n + (double)c->s->eps));
        c->mean[u] = mu;
        c->rstd[u] = rs;
        if (c->gamma && c->beta)
            ln_affine(yp, xp, c->gamma, c->beta, n, mu, rs);
        else
            for (size_t j = 0; j < n; j++)
                yp[j] = (xp[j] - mu) * rs * (c->gamma ? c->gamma[j] : 1.0f) + (c->beta ? c->beta[j] : 0.0f);
    }
}

/* y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd [m]. */
void sd_layer_norm_fwd(sd_pool *pool, const sd_ln_shape *s, float *y, float *mean, float *rstd, const float *x,
                       const float *gamma, const float *beta)
{
    sd_gn_shape g = ln_as_gn(s);
    gn_ctx c = {.s = &g, .y = y, .mean = mean, .rstd = rstd, .x = x, .gamma = gamma, .beta = beta};
    sd_pool_for(pool, (size_t)s->m, ln_fwd_range, &c);
}

/* dx per row, dgamma and dbeta per channel summed over rows in order. */
void sd_layer_norm_bwd(sd_pool *pool, const sd_ln_shape *s, float *dx, float *dgamma, float *dbeta,
                       const float *dy, const float *x, const float *mean, const float *rstd, const float *gamma)
{
    sd_gn_shape g = ln_as_gn(s);
    sd_group_norm_bwd(pool, &g, dx, dgamma, dbeta, dy, x, mean, rstd, gamma);
}
