/* Channel-wise ops on NCHW tensors, forward and backward: concat along
 * channels (the UNet's skip connections) and the per-channel broadcast
 * add (the UNet's time embedding). Each unit of work is one output plane
 * (image, channel), so each thread owns whole planes. */
#include <string.h>

#include "ops_cpu.h"

/* All dims positive (a zero-channel input is not a concat). */
sd_status sd_concat_check(const sd_concat_shape *s, sd_error *err)
{
    if (s->n <= 0 || s->c1 <= 0 || s->c2 <= 0 || s->hw <= 0)
        return sd_err_set(err, SD_EINVAL, "concat: non-positive dimension");
    return SD_OK;
}

typedef struct {
    const sd_concat_shape *s;
    float *y, *da, *db;
    const float *a, *b, *dy;
    size_t hw; /* broadcast add: plane size */
} shape_ctx;

/* Where output plane u of the concat comes from: input a or b (*from_b)
 * and the plane index inside that input. */
static size_t concat_src(const sd_concat_shape *s, size_t u, int *from_b)
{
    size_t ct = (size_t)s->c1 + (size_t)s->c2, img = u / ct, ch = u % ct;
    *from_b = ch >= (size_t)s->c1;
    return *from_b ? img * (size_t)s->c2 + (ch - (size_t)s->c1) : img * (size_t)s->c1 + ch;
}

/* Forward: copy each output plane from its source plane. */
static void concat_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const shape_ctx *c = vctx;
    size_t hw = (size_t)c->s->hw;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        int from_b;
        size_t src = concat_src(c->s, u, &from_b);
        memcpy(c->y + u * hw, (from_b ? c->b : c->a) + src * hw, hw * sizeof(float));
    }
}

/* y [n, c1 + c2, hw] = cat(a [n, c1, hw], b [n, c2, hw]) along channels. */
void sd_concat_fwd(sd_pool *pool, const sd_concat_shape *s, float *y, const float *a, const float *b)
{
    shape_ctx c = {.s = s, .y = y, .a = a, .b = b};
    sd_pool_for(pool, (size_t)s->n * ((size_t)s->c1 + (size_t)s->c2), concat_fwd_range, &c);
}

/* Backward: add each dy plane into the gradient of its source plane. */
static void concat_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const shape_ctx *c = vctx;
    size_t hw = (size_t)c->s->hw;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        int from_b;
        size_t src = concat_src(c->s, u, &from_b);
        float *d = from_b ? c->db : c->da;
        if (!d) continue;
        d += src * hw;
        const float *g = c->dy + u * hw;
        for (size_t i = 0; i < hw; i++) d[i] += g[i];
    }
}

/* da += dy[:, :c1], db += dy[:, c1:]; either may be NULL. */
void sd_concat_bwd(sd_pool *pool, const sd_concat_shape *s, float *da, float *db, const float *dy)
{
    shape_ctx c = {.s = s, .da = da, .db = db, .dy = dy};
    if (da || db) sd_pool_for(pool, (size_t)s->n * ((size_t)s->c1 + (size_t)s->c2), concat_bwd_range, &c);
}

/* Broadcast add forward: plane u gets the one value b[u] added. */
static void bcast_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const shape_ctx *c = vctx;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        const float *xp = c->a + u * c->hw;
        float *yp = c->y + u * c->hw, bu = c->b[u];
        for (size_t i = 0; i < c->hw; i++) yp[i] = xp[i] + bu;
    }
}

/* y[n, c, hw] = x[n, c, hw] + b[n, c]; y may be x (in-place add). */
void sd_add_bcast_channel_fwd(sd_pool *pool, int n, int c, int hw, float *y, const float *x, const float *b)
{
    shape_ctx ctx = {.y = y, .a = x, .b = b, .hw = (size_t)hw};
    sd_pool_for(pool, (size_t)n * (size_t)c, bcast_fwd_range, &ctx);
}

/* Broadcast add backward per plane: dx += dy, db[u] += sum of dy's plane
 * (summed in order by the plane's owner, so no cross-thread reduction). */
static void bcast_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const shape_ctx *c = vctx;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        const float *g = c->dy + u * c->hw;
        float *dxp = c->da ? c->da + u * c->hw : NULL, sum = 0.0f;
        for (size_t i = 0; i < c->hw; i++) {
            sum += g[i];
            if (dxp) dxp[i] += g[i];
        }
        if (c->db) c->db[u] += sum;
    }
}

/* dx += dy; db[n, c] += dy summed over each plane; either may be NULL. */
void sd_add_bcast_channel_bwd(sd_pool *pool, int n, int c, int hw, float *dx, float *db, const float *dy)
{
    shape_ctx ctx = {.da = dx, .db = db, .dy = dy, .hw = (size_t)hw};
    if (dx || db) sd_pool_for(pool, (size_t)n * (size_t)c, bcast_bwd_range, &ctx);
}
