/* conv2d forward and backward by direct loops (correctness first; a GEMM or
 * oneDNN path replaces the inner loops later, behind the same signature). */
#include "ops_cpu.h"

/* Output height: floor((h + pads - kh) / stride) + 1, as torch computes it. */
int sd_conv2d_out_h(const sd_conv2d_shape *s)
{
    return (s->h + s->pad_t + s->pad_b - s->kh) / s->stride + 1;
}

/* Output width, same rule as the height. */
int sd_conv2d_out_w(const sd_conv2d_shape *s)
{
    return (s->w + s->pad_l + s->pad_r - s->kw) / s->stride + 1;
}

/* Reject shapes the loops below would index out of bounds with. */
sd_status sd_conv2d_check(const sd_conv2d_shape *s, sd_error *err)
{
    if (s->n <= 0 || s->cin <= 0 || s->h <= 0 || s->w <= 0 || s->cout <= 0 || s->kh <= 0 || s->kw <= 0)
        return sd_err_set(err, SD_EINVAL, "conv2d: non-positive dimension");
    if (s->stride <= 0) return sd_err_set(err, SD_EINVAL, "conv2d: stride %d", s->stride);
    if (s->pad_t < 0 || s->pad_b < 0 || s->pad_l < 0 || s->pad_r < 0)
        return sd_err_set(err, SD_EINVAL, "conv2d: negative padding");
    if (s->h + s->pad_t + s->pad_b < s->kh || s->w + s->pad_l + s->pad_r < s->kw)
        return sd_err_set(err, SD_EINVAL, "conv2d: kernel larger than the padded input");
    return SD_OK;
}

/* The output positions o in [0, out) whose input index o*stride + off lies
 * in [0, in): [*lo, *hi). Hoisting the bounds keeps the inner loops clean. */
static void valid_range(int off, int stride, int in, int out, int *lo, int *hi)
{
    int l = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int h = in - 1 - off < 0 ? 0 : (in - 1 - off) / stride + 1;
    if (h > out) h = out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

typedef struct {
    const sd_conv2d_shape *s;
    int oh, ow;
    float *y, *dx, *dw, *db;
    const float *x, *w, *b, *dy;
} conv_ctx;

/* Forward: each unit is one output plane (image, out channel). */
static void conv_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const conv_ctx *c = vctx;
    const sd_conv2d_shape *s = c->s;
    (void)worker;
    size_t ohw = (size_t)c->oh * (size_t)c->ow, hw = (size_t)s->h * (size_t)s->w;
    for (size_t u = begin; u < end; u++) {
        size_t ni = u / (size_t)s->cout, co = u % (size_t)s->cout;
        float *yp = c->y + u * ohw;
        float bias = c->b ? c->b[co] : 0.0f;
        for (size_t i = 0; i < ohw; i++) yp[i] = bias;
        for (int ci = 0; ci < s->cin; ci++) {
            const float *xp = c->x + (ni * (size_t)s->cin + (size_t)ci) * hw;
            const float *wp = c->w + ((co * (size_t)s->cin + (size_t)ci) * (size_t)s->kh) * (size_t)s->kw;
            for (int ky = 0; ky < s->kh; ky++) {
                int oy0, oy1;
                valid_range(ky - s->pad_t, s->stride, s->h, c->oh, &oy0, &oy1);
                for (int kx = 0; kx < s->kw; kx++) {
                    int ox0, ox1;
                    valid_range(kx - s->pad_l, s->stride, s->w, c->ow, &ox0, &ox1);
                    float wv = wp[ky * s->kw + kx];
                    for (int oy = oy0; oy < oy1; oy++) {
                        const float *xr = xp + (size_t)(oy * s->stride - s->pad_t + ky) * (size_t)s->w;
                        float *yr = yp + (size_t)oy * (size_t)c->ow;
                        for (int ox = ox0; ox < ox1; ox++) yr[ox] += wv * xr[ox * s->stride - s->pad_l + kx];
                    }
                }
            }
        }
    }
}

/* y = conv(x, w) + b for the whole batch. */
void sd_conv2d_fwd(sd_pool *pool, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                   const float *b)
{
    conv_ctx c = {.s = s, .oh = sd_conv2d_out_h(s), .ow = sd_conv2d_out_w(s), .y = y, .x = x, .w = w, .b = b};
    sd_pool_for(pool, (size_t)s->n * (size_t)s->cout, conv_fwd_range, &c);
}

/* Input gradient: each unit is one input plane (image, in channel), so
 * every dx element is written by exactly one thread. */
static void conv_bwd_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const conv_ctx *c = vctx;
    const sd_conv2d_shape *s = c->s;
    (void)worker;
    size_t ohw = (size_t)c->oh * (size_t)c->ow, hw = (size_t)s->h * (size_t)s->w;
    for (size_t u = begin; u < end; u++) {
        size_t ni = u / (size_t)s->cin, ci = u % (size_t)s->cin;
        float *dxp = c->dx + u * hw;
        for (int co = 0; co < s->cout; co++) {
            const float *dyp = c->dy + (ni * (size_t)s->cout + (size_t)co) * ohw;
            const float *wp = c->w + (((size_t)co * (size_t)s->cin + ci) * (size_t)s->kh) * (size_t)s->kw;
            for (int ky = 0; ky < s->kh; ky++) {
                int oy0, oy1;
                valid_range(ky - s->pad_t, s->stride, s->h, c->oh, &oy0, &oy1);
                for (int kx = 0; kx < s->kw; kx++) {
                    int ox0, ox1;
                    valid_range(kx - s->pad_l, s->stride, s->w, c->ow, &ox0, &ox1);
                    float wv = wp[ky * s->kw + kx];
                    for (int oy = oy0; oy < oy1; oy++) {
                        float *xr = dxp + (size_t)(oy * s->stride - s->pad_t + ky) * (size_t)s->w;
                        const float *dyr = dyp + (size_t)oy * (size_t)c->ow;
                        for (int ox = ox0; ox < ox1; ox++) xr[ox * s->stride - s->pad_l + kx] += wv * dyr[ox];
                    }
                }
            }
        }
    }
}

/* Weight and bias gradients: each unit is one output channel, summing over
 * the batch in a fixed order, so no cross-thread reduction is needed. */
static void conv_bwd_dw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const conv_ctx *c = vctx;
    const sd_conv2d_shape *s = c->s;
    (void)worker;
    size_t ohw = (size_t)c->oh * (size_t)c->ow, hw = (size_t)s->h * (size_t)s->w;
    for (size_t co = begin; co < end; co++) {
        if (c->db) {
            float acc = 0.0f;
            for (int ni = 0; ni < s->n; ni++) {
                const float *dyp = c->dy + ((size_t)ni * (size_t)s->cout + co) * ohw;
                for (size_t i = 0; i < ohw; i++) acc += dyp[i];
            }
            c->db[co] += acc;
        }
        if (!c->dw) continue;
        for (int ci = 0; ci < s->cin; ci++) {
            float *dwp = c->dw + ((co * (size_t)s->cin + (size_t)ci) * (size_t)s->kh) * (size_t)s->kw;
            for (int ky = 0; ky < s->kh; ky++) {
                int oy0, oy1;
                valid_range(ky - s->pad_t, s->stride, s->h, c->oh, &oy0, &oy1);
                for (int kx = 0; kx < s->kw; kx++) {
                    int ox0, ox1;
                    valid_range(kx - s->pad_l, s->stride, s->w, c->ow, &ox0, &ox1);
                    float acc = 0.0f;
                    for (int ni = 0; ni < s->n; ni++) {
                        const float *dyp = c->dy + ((size_t)ni * (size_t)s->cout + co) * ohw;
                        const float *xp = c->x + ((size_t)ni * (size_t)s->cin + (size_t)ci) * hw;
                        for (int oy = oy0; oy < oy1; oy++) {
                            const float *xr = xp + (size_t)(oy * s->stride - s->pad_t + ky) * (size_t)s->w;
                            const float *dyr = dyp + (size_t)oy * (size_t)c->ow;
                            for (int ox = ox0; ox < ox1; ox++) acc += dyr[ox] * xr[ox * s->stride - s->pad_l + kx];
                        }
                    }
                    dwp[ky * s->kw + kx] += acc;
                }
            }
        }
    }
}

/* dx += conv^T(dy, w); dw += dy (x) x; db += sum(dy). */
void sd_conv2d_bwd(sd_pool *pool, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w)
{
    conv_ctx c = {.s = s, .oh = sd_conv2d_out_h(s), .ow = sd_conv2d_out_w(s), .dx = dx, .dw = dw, .db = db,
                  .x = x, .w = w, .dy = dy};
    if (dx) sd_pool_for(pool, (size_t)s->n * (size_t)s->cin, conv_bwd_dx_range, &c);
    if (dw || db) sd_pool_for(pool, (size_t)s->cout, conv_bwd_dw_range, &c);
}
