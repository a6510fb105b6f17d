/* conv2d forward and backward on sgemm. 3x3 stride-1 convs with 32+ input
 * channels run as Winograd F(2x2, 3x3) (conv_wino.c), forward and input
 * gradient. The rest is GEMM over im2col tiles: y[cout, P] = w[cout, K]
 * col[K, P] with K = cin*kh*kw, built a few output rows at a time in a
 * bounded per-worker scratch (1x1 stride-1 unpadded convs use x itself as
 * col). Work is cut into units of a fixed shape that depends on the conv
 * shape only (output-row tiles forward, input-channel blocks backward),
 * each unit owns its outputs and calls single-threaded sgemm, so results
 * are bit-identical for any thread count. The direct loops first in this
 * file are the reference and the fallback when scratch cannot be
 * allocated. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "act_store.h"
#include "conv_wino.h"
#include "dtype.h"
#include "gemm.h"
#include "ops_ref.h"

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
} ref_ctx;

/* Forward: each unit is one output plane (image, out channel). */
static void ref_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
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

/* Reference y = conv(x, w) + b for the whole batch, by direct loops. */
void sd_conv2d_fwd_ref(sd_pool *pool, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                   const float *b)
{
    ref_ctx c = {.s = s, .oh = sd_conv2d_out_h(s), .ow = sd_conv2d_out_w(s), .y = y, .x = x, .w = w, .b = b};
    sd_pool_for(pool, (size_t)s->n * (size_t)s->cout, ref_fwd_range, &c);
}

/* Input gradient: each unit is one input plane (image, in channel), so
 * every dx element is written by exactly one thread. */
static void ref_bwd_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
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
static void ref_bwd_dw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
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

/* Reference dx += conv^T(dy, w); dw += dy (x) x; db += sum(dy), by direct loops. */
void sd_conv2d_bwd_ref(sd_pool *pool, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w)
{
    ref_ctx c = {.s = s, .oh = sd_conv2d_out_h(s), .ow = sd_conv2d_out_w(s), .dx = dx, .dw = dw, .db = db,
                  .x = x, .w = w, .dy = dy};
    if (dx) sd_pool_for(pool, (size_t)s->n * (size_t)s->cin, ref_bwd_dx_range, &c);
    if (dw || db) sd_pool_for(pool, (size_t)s->cout, ref_bwd_dw_range, &c);
}

/* ---- GEMM path ---- */

enum {
    TILE_PIXELS = 2048,         /* output pixels per im2col tile, at most */
    SCRATCH_FLOATS = 1u << 21,  /* im2col floats per worker, at most (8 MiB) */
    MIN_UNITS = 8,              /* tiles or channel blocks per image, at least, when the shape allows */
    MIN_TILE_PIXELS = 256       /* tile units narrower than this split channels instead (plan_tiles) */
};

typedef struct {
    const sd_conv2d_shape *s;
    int oh, ow;
    size_t P, HW, K, khw; /* output pixels, input pixels, cin*kh*kw, kh*kw */
    int pointwise;        /* 1x1, stride 1, no padding: x is its own col */
    int rows, ntiles;     /* output rows per tile, tiles per image */
    int cb, nblocks;      /* input channels per backward block, blocks */
    int ob, noblocks;     /* output channels per pointwise dw block, blocks */
    int fb, nfblocks;     /* channels a tile unit writes (plan_tiles), blocks of them */
    float *scratch;
    size_t sstride;
    float *y, *dx, *dw, *db;
    const float *x, *w, *b, *dy;
    int xdt, ydt; /* the forward's storage of xs / ys (sd_conv2d_fwd_st) */
    const void *xs;
    void *ys;
} gconv;

/* Output rows per tile so a tile's col block (kdim rows) fits the scratch
 * bound and, with capped set, an image has at least MIN_UNITS tiles when it
 * has the rows for them. Depends on the shape only, never on the thread
 * count. */
static int tile_rows(int oh, int ow, size_t kdim, int capped)
{
    size_t px = TILE_PIXELS;
    if (px > SCRATCH_FLOATS / kdim) px = SCRATCH_FLOATS / kdim;
    size_t rows = px / (size_t)ow;
    size_t most = ((size_t)oh + MIN_UNITS - 1) / MIN_UNITS;
    if (capped && rows > most) rows = most;
    return rows < 1 ? 1 : (int)rows;
}

/* Row tiles and channel blocks for units that each own a tile of rows
 * and a block of the nch channels they write (forward: output channels;
 * pointwise input gradient: input channels): tiles of MIN_TILE_PIXELS or
 * more, MIN_UNITS per image when the image has the rows. An image too
 * small for that (the UNet's 16x16 and 8x8 levels) gets fewer, wider tiles
 * and its channels cut into blocks instead, so each GEMM still multiplies a
 * wide tile (a narrow one spends its time packing the weights). */
static void plan_tiles(gconv *g, size_t kdim, int nch)
{
    g->fb = nch;
    g->nfblocks = 1;
    g->rows = tile_rows(g->oh, g->ow, kdim, 1);
    if ((size_t)g->rows * (size_t)g->ow < MIN_TILE_PIXELS && g->rows < g->oh) {
        g->rows = tile_rows(g->oh, g->ow, kdim, 0);
        size_t tiles = (size_t)g->s->n * (size_t)((g->oh + g->rows - 1) / g->rows);
        if (tiles < MIN_UNITS) {
            size_t want = (MIN_UNITS + tiles - 1) / tiles;
            g->fb = (int)(((size_t)nch + want - 1) / want);
            g->nfblocks = (nch + g->fb - 1) / g->fb;
        }
    }
}

/* Fill in the derived sizes and the tiling for forward (bwd = 0) or
 * backward (bwd = 1). Backward units are input-channel blocks (but for the
 * pointwise input gradient), so tiles there are as wide as one block's col
 * rows in scratch allow. */
static void gconv_plan(gconv *g, const sd_conv2d_shape *s, int bwd)
{
    g->s = s;
    g->oh = sd_conv2d_out_h(s);
    g->ow = sd_conv2d_out_w(s);
    g->P = (size_t)g->oh * (size_t)g->ow;
    g->HW = (size_t)s->h * (size_t)s->w;
    g->khw = (size_t)s->kh * (size_t)s->kw;
    g->K = (size_t)s->cin * g->khw;
    g->pointwise = s->kh == 1 && s->kw == 1 && s->stride == 1 && !s->pad_t && !s->pad_b && !s->pad_l && !s->pad_r;
    g->cb = (s->cin + MIN_UNITS - 1) / MIN_UNITS;
    g->nblocks = (s->cin + g->cb - 1) / g->cb;
    g->ob = (s->cout + MIN_UNITS - 1) / MIN_UNITS;
    g->noblocks = (s->cout + g->ob - 1) / g->ob;
    if (!bwd)
        plan_tiles(g, g->K, s->cout);
    else if (g->pointwise)
        plan_tiles(g, (size_t)s->cout, s->cin);
    else
        g->rows = tile_rows(g->oh, g->ow, (size_t)g->cb * g->khw, 0);
    g->ntiles = (g->oh + g->rows - 1) / g->rows;
}

/* sgemm takes int sizes and strides: planes and K must fit (they do for
 * any image below 46k x 46k); larger shapes take the reference loops. */
static int gemm_dims_fit(const gconv *g)
{
    return g->P <= INT_MAX && g->HW <= INT_MAX && g->K <= INT_MAX;
}

/* Columns [r0*ow, r1*ow) of the col matrix for input channels [c0, c1) of
 * one image: row ((ci-c0)*kh + ky)*kw + kx holds x[ci] at the input pixel
 * each output pixel's tap (ky, kx) reads, 0 in the padding. x holds input
 * rows from row0 on, channels cstride floats apart (the whole image: 0 and
 * HW; a widened band of rows: its first row and size). */
static void im2col(const gconv *g, const float *x, size_t cstride, int row0, int c0, int c1, int r0, int r1,
                   float *col)
{
    const sd_conv2d_shape *s = g->s;
    size_t T = (size_t)(r1 - r0) * (size_t)g->ow, ow = (size_t)g->ow;
    float *dst = col;
    for (int ci = c0; ci < c1; ci++) {
        const float *xp = x + (size_t)ci * cstride;
        for (int ky = 0; ky < s->kh; ky++) {
            for (int kx = 0; kx < s->kw; kx++, dst += T) {
                int ox0, ox1, off = kx - s->pad_l;
                valid_range(off, s->stride, s->w, g->ow, &ox0, &ox1);
                for (int oy = r0; oy < r1; oy++) {
                    float *d = dst + (size_t)(oy - r0) * ow;
                    int iy = oy * s->stride - s->pad_t + ky;
                    if (iy < 0 || iy >= s->h || ox0 >= ox1) {
                        memset(d, 0, ow * sizeof(float));
                        continue;
                    }
                    const float *xr = xp + (size_t)(iy - row0) * (size_t)s->w;
                    memset(d, 0, (size_t)ox0 * sizeof(float));
                    if (s->stride == 1)
                        memcpy(d + ox0, xr + ox0 + off, (size_t)(ox1 - ox0) * sizeof(float));
                    else
                        for (int ox = ox0; ox < ox1; ox++) d[ox] = xr[ox * s->stride + off];
                    memset(d + ox1, 0, (size_t)(g->ow - ox1) * sizeof(float));
                }
            }
        }
    }
}

/* The adjoint of im2col: add each col entry into the dx pixel it was read
 * from, in a fixed order (channel, tap, row, column). */
static void col2im_add(const gconv *g, float *dx, int c0, int c1, int r0, int r1, const float *col)
{
    const sd_conv2d_shape *s = g->s;
    size_t T = (size_t)(r1 - r0) * (size_t)g->ow, ow = (size_t)g->ow;
    const float *src = col;
    for (int ci = c0; ci < c1; ci++) {
        float *xp = dx + (size_t)ci * g->HW;
        for (int ky = 0; ky < s->kh; ky++) {
            for (int kx = 0; kx < s->kw; kx++, src += T) {
                int ox0, ox1, off = kx - s->pad_l;
                valid_range(off, s->stride, s->w, g->ow, &ox0, &ox1);
                for (int oy = r0; oy < r1; oy++) {
                    int iy = oy * s->stride - s->pad_t + ky;
                    if (iy < 0 || iy >= s->h) continue;
                    const float *d = src + (size_t)(oy - r0) * ow;
                    float *xr = xp + (size_t)iy * (size_t)s->w;
                    for (int ox = ox0; ox < ox1; ox++) xr[ox * s->stride + off] += d[ox];
                }
            }
        }
    }
}

/* A forward unit: image ni, output rows [r0, r1) (T pixels), output
 * channels [co0, co0 + nco). */
typedef struct {
    size_t ni, T;
    int r0, r1, co0, nco;
} fwd_unit;

/* Unit u of the forward's numbering (image, row tile, channel block). */
static fwd_unit fwd_unit_of(const gconv *g, size_t u)
{
    const sd_conv2d_shape *s = g->s;
    size_t per = (size_t)g->ntiles * (size_t)g->nfblocks, rest = u % per;
    fwd_unit f = {.ni = u / per};
    f.r0 = (int)(rest / (size_t)g->nfblocks) * g->rows;
    f.r1 = f.r0 + g->rows < g->oh ? f.r0 + g->rows : g->oh;
    f.co0 = (int)(rest % (size_t)g->nfblocks) * g->fb;
    f.nco = s->cout - f.co0 < g->fb ? s->cout - f.co0 : g->fb;
    f.T = (size_t)(f.r1 - f.r0) * (size_t)g->ow;
    return f;
}

/* Forward: each unit is one tile of output rows of one image and one
 * block of output channels (all of them but for small images):
 * y_tile[block] = w[block] col_tile (+ bias, written first). */
static void gconv_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    float *col = g->scratch ? g->scratch + (size_t)worker * g->sstride : NULL;
    for (size_t u = begin; u < end; u++) {
        fwd_unit f = fwd_unit_of(g, u);
        size_t ni = f.ni, T = f.T;
        int r0 = f.r0, r1 = f.r1, co0 = f.co0, nco = f.nco;
        float *yt = g->y + (ni * (size_t)s->cout + (size_t)co0) * g->P + (size_t)r0 * (size_t)g->ow;
        if (g->b)
            for (int co = 0; co < nco; co++) {
                float *yr = yt + (size_t)co * g->P, bv = g->b[co0 + co];
                for (size_t i = 0; i < T; i++) yr[i] = bv;
            }
        const float *xi = g->x + ni * (size_t)s->cin * g->HW;
        const float *bm;
        size_t ldb;
        if (g->pointwise) {
            bm = xi + (size_t)r0 * (size_t)g->ow;
            ldb = g->HW;
        } else {
            im2col(g, xi, g->HW, 0, 0, s->cin, r0, r1, col);
            bm = col;
            ldb = T;
        }
        sd_sgemm(0, 0, nco, (int)T, (int)g->K, 1.0f, g->w + (size_t)co0 * g->K, (int)g->K, bm, (int)ldb,
                 g->b ? 1.0f : 0.0f, yt, (int)g->P);
    }
}

/* The forward's Winograd shape; 0 when the forward does not take it. */
static int wino_fwd_shape(const sd_conv2d_shape *s, sd_wino_shape *ws)
{
    if (!(s->kh == 3 && s->kw == 3 && s->stride == 1)) return 0;
    *ws = (sd_wino_shape){.n = s->n, .cin = s->cin, .cout = s->cout, .h = s->h, .w = s->w, .pt = s->pad_t,
                          .pb = s->pad_b, .pl = s->pad_l, .pr = s->pad_r};
    return sd_wino_ok(ws);
}

/* The input gradient's Winograd shape (a 3x3 stride-1 conv of dy with the
 * flipped, transposed weights and pads 2 - pad); 0 when not taken. */
static int wino_dx_shape(const sd_conv2d_shape *s, int oh, int ow, sd_wino_shape *ws)
{
    if (!(s->kh == 3 && s->kw == 3 && s->stride == 1)) return 0;
    *ws = (sd_wino_shape){.n = s->n, .cin = s->cout, .cout = s->cin, .h = oh, .w = ow, .pt = 2 - s->pad_t,
                          .pb = 2 - s->pad_b, .pl = 2 - s->pad_l, .pr = 2 - s->pad_r, .flip = 1, .acc = 1};
    return sd_wino_ok(ws);
}

/* Floats of one worker's im2col tile in the forward. */
static size_t fwd_per_worker(const gconv *g)
{
    return g->K * (size_t)g->rows * (size_t)g->ow;
}

/* Floats of one worker's col block in the backward. */
static size_t bwd_per_worker(const gconv *g)
{
    return (size_t)g->cb * g->khw * (size_t)g->rows * (size_t)g->ow;
}

/* The scratch sd_conv2d_fwd allocates on nworkers (ops_cpu.h). */
size_t sd_conv2d_fwd_scratch_bytes(int nworkers, const sd_conv2d_shape *s)
{
    sd_wino_shape ws;
    if (wino_fwd_shape(s, &ws)) return sd_wino_scratch_bytes(nworkers, &ws);
    gconv g = {0};
    gconv_plan(&g, s, 0);
    if (!gemm_dims_fit(&g) || g.pointwise) return 0;
    return sd_scratch_bytes(nworkers, fwd_per_worker(&g));
}

/* The most scratch sd_conv2d_bwd holds at once (ops_cpu.h): the Winograd
 * input gradient's, freed before the col blocks of the rest. */
size_t sd_conv2d_bwd_scratch_bytes(int nworkers, const sd_conv2d_shape *s, int dx, int dw)
{
    gconv g = {0};
    gconv_plan(&g, s, 1);
    size_t wino = 0, cols = 0;
    sd_wino_shape ws;
    if (dx && wino_dx_shape(s, g.oh, g.ow, &ws)) {
        wino = sd_wino_scratch_bytes(nworkers, &ws);
        dx = 0;
    }
    if (gemm_dims_fit(&g) && !g.pointwise && (dx || dw)) cols = sd_scratch_bytes(nworkers, bwd_per_worker(&g));
    return wino > cols ? wino : cols;
}

/* y = conv(x, w) + b for the whole batch. */
void sd_conv2d_fwd(sd_pool *pool, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                   const float *b)
{
    sd_wino_shape ws;
    if (wino_fwd_shape(s, &ws) && sd_wino_conv(pool, &ws, y, x, w, b)) return;
    gconv g = {.y = y, .x = x, .w = w, .b = b};
    gconv_plan(&g, s, 0);
    if (!gemm_dims_fit(&g)) {
        sd_conv2d_fwd_ref(pool, s, y, x, w, b);
        return;
    }
    if (!g.pointwise) {
        size_t per = fwd_per_worker(&g);
        g.sstride = sd_scratch_stride(per);
        g.scratch = sd_scratch_alloc(sd_pool_size(pool), per);
        if (!g.scratch) {
            sd_conv2d_fwd_ref(pool, s, y, x, w, b);
            return;
        }
    }
    sd_pool_for(pool, (size_t)s->n * (size_t)g.ntiles * (size_t)g.nfblocks, gconv_fwd_range, &g);
    free(g.scratch);
}

/* The input rows [*lo, *hi) that output rows [r0, r1) read, clipped to
 * the image. */
static void input_band(const gconv *g, int r0, int r1, int *lo, int *hi)
{
    const sd_conv2d_shape *s = g->s;
    int a = r0 * s->stride - s->pad_t, b = (r1 - 1) * s->stride - s->pad_t + s->kh;
    *lo = a < 0 ? 0 : a;
    *hi = b > s->h ? s->h : b;
    if (*hi < *lo) *hi = *lo;
}

/* Floats of a typed forward unit's scratch: the widened input band (every
 * channel), the col block (not pointwise) and the output tile. */
static void st_scratch(const gconv *g, size_t *band, size_t *col, size_t *out)
{
    const sd_conv2d_shape *s = g->s;
    size_t rows_in = (size_t)(g->rows - 1) * (size_t)s->stride + (size_t)s->kh;
    if (rows_in > (size_t)s->h) rows_in = (size_t)s->h;
    size_t T = (size_t)g->rows * (size_t)g->ow;
    *band = (size_t)s->cin * rows_in * (size_t)s->w;
    *col = g->pointwise ? 0 : g->K * T;
    *out = (size_t)g->fb * T;
}

/* Typed forward units (sd_conv2d_fwd_st): the tile's input band widened to
 * fp32, then the fp32 unit's col, bias and GEMM into an fp32 tile, each
 * output row narrowed once. The GEMM sees the values the fp32 forward
 * would for the widened input. */
static void gconv_fwd_st_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    size_t nband, ncol, nout;
    st_scratch(g, &nband, &ncol, &nout);
    float *band = g->scratch + (size_t)worker * g->sstride, *col = band + nband, *tile = col + ncol;
    for (size_t u = begin; u < end; u++) {
        fwd_unit f = fwd_unit_of(g, u);
        size_t ni = f.ni, T = f.T;
        int r0 = f.r0, r1 = f.r1, co0 = f.co0, nco = f.nco;
        int lo, hi;
        input_band(g, r0, r1, &lo, &hi);
        size_t cstride = (size_t)(hi - lo) * (size_t)s->w;
        for (int ci = 0; ci < s->cin; ci++)
            sd_act_widen(band + (size_t)ci * cstride, g->xs,
                         (ni * (size_t)s->cin + (size_t)ci) * g->HW + (size_t)lo * (size_t)s->w, cstride, g->xdt);
        const float *bm = band;
        if (!g->pointwise) {
            im2col(g, band, cstride, lo, 0, s->cin, r0, r1, col);
            bm = col;
        }
        for (int co = 0; co < nco; co++) {
            float *yr = tile + (size_t)co * T, bv = g->b ? g->b[co0 + co] : 0.0f;
            for (size_t i = 0; i < T; i++) yr[i] = bv;
        }
        sd_sgemm(0, 0, nco, (int)T, (int)g->K, 1.0f, g->w + (size_t)co0 * g->K, (int)g->K, bm, (int)T,
                 g->b ? 1.0f : 0.0f, tile, (int)T);
        for (int co = 0; co < nco; co++)
            sd_act_narrow(g->ys, (ni * (size_t)s->cout + (size_t)(co0 + co)) * g->P + (size_t)r0 * (size_t)g->ow,
                          tile + (size_t)co * T, T, g->ydt);
    }
}

/* One element of a dt buffer as a float (the typed fallback's loads). */
static float load1(const void *p, size_t i, int dt)
{
    float f;
    sd_act_widen(&f, p, i, 1, dt);
    return f;
}

/* The typed fallback when no scratch can be had: each output value summed
 * directly in the reference's order (bias, then channel, tap row, tap
 * column), which gives sd_conv2d_fwd_ref's bits, then narrowed. Those are
 * not the GEMM's bits; the fp32 1x1 conv needs no scratch and keeps its
 * GEMM, so only there does running out of memory change the result. */
static void ref_fwd_st_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t ni = u / (size_t)s->cout, co = u % (size_t)s->cout;
        for (int oy = 0; oy < g->oh; oy++)
            for (int ox = 0; ox < g->ow; ox++) {
                float acc = g->b ? g->b[co] : 0.0f;
                for (int ci = 0; ci < s->cin; ci++) {
                    size_t xp = (ni * (size_t)s->cin + (size_t)ci) * g->HW;
                    const float *wp = g->w + (co * (size_t)s->cin + (size_t)ci) * g->khw;
                    for (int ky = 0; ky < s->kh; ky++) {
                        int iy = oy * s->stride - s->pad_t + ky;
                        if (iy < 0 || iy >= s->h) continue;
                        for (int kx = 0; kx < s->kw; kx++) {
                            int ix = ox * s->stride - s->pad_l + kx;
                            if (ix < 0 || ix >= s->w) continue;
                            acc += wp[ky * s->kw + kx] * load1(g->xs, xp + (size_t)iy * (size_t)s->w + (size_t)ix, g->xdt);
                        }
                    }
                }
                sd_act_narrow(g->ys, u * g->P + (size_t)oy * (size_t)g->ow + (size_t)ox, &acc, 1, g->ydt);
            }
    }
}

/* y = conv(x, w) + b with x stored as xdt and y as ydt (act_store.h),
 * computed in fp32 with fp32 weights: Winograd where sd_conv2d_fwd takes
 * it, else im2col tiles over a widened band of input rows. */
void sd_conv2d_fwd_st(sd_pool *pool, const sd_conv2d_shape *s, int ydt, void *y, int xdt, const void *x,
                      const float *w, const float *b)
{
    if (ydt == SD_DT_F32 && xdt == SD_DT_F32) {
        sd_conv2d_fwd(pool, s, y, x, w, b);
        return;
    }
    if (s->kh == 3 && s->kw == 3 && s->stride == 1) {
        sd_wino_shape ws = {.n = s->n, .cin = s->cin, .cout = s->cout, .h = s->h, .w = s->w, .pt = s->pad_t,
                            .pb = s->pad_b, .pl = s->pad_l, .pr = s->pad_r};
        if (sd_wino_ok(&ws) && sd_wino_conv_st(pool, &ws, ydt, y, xdt, x, w, b)) return;
    }
    gconv g = {.w = w, .b = b, .xdt = xdt, .ydt = ydt, .xs = x, .ys = y};
    gconv_plan(&g, s, 0);
    if (gemm_dims_fit(&g)) {
        size_t band, col, out;
        st_scratch(&g, &band, &col, &out);
        g.sstride = sd_scratch_stride(band + col + out);
        g.scratch = sd_scratch_alloc(sd_pool_size(pool), band + col + out);
    }
    if (!g.scratch) {
        sd_pool_for(pool, (size_t)s->n * (size_t)s->cout, ref_fwd_st_range, &g);
        return;
    }
    sd_pool_for(pool, (size_t)s->n * (size_t)g.ntiles * (size_t)g.nfblocks, gconv_fwd_st_range, &g);
    free(g.scratch);
}

/* Input channels [c0, c1) of backward block blk. */
static void block_channels(const gconv *g, size_t blk, int *c0, int *c1)
{
    *c0 = (int)blk * g->cb;
    *c1 = *c0 + g->cb < g->s->cin ? *c0 + g->cb : g->s->cin;
}

/* Input gradient: each unit is one block of input channels of one image,
 * which it owns: per tile, dcol = w[:, block]^T dy_tile, then col2im adds
 * it into dx. */
static void gconv_dx_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    float *col = g->scratch ? g->scratch + (size_t)worker * g->sstride : NULL;
    for (size_t u = begin; u < end; u++) {
        size_t ni = u / (size_t)g->nblocks;
        int c0, c1;
        block_channels(g, u % (size_t)g->nblocks, &c0, &c1);
        int kb = (c1 - c0) * (int)g->khw;
        float *dxi = g->dx + ni * (size_t)s->cin * g->HW;
        for (int r0 = 0; r0 < g->oh; r0 += g->rows) {
            int r1 = r0 + g->rows < g->oh ? r0 + g->rows : g->oh;
            size_t T = (size_t)(r1 - r0) * (size_t)g->ow;
            const float *dyt = g->dy + ni * (size_t)s->cout * g->P + (size_t)r0 * (size_t)g->ow;
            sd_sgemm(1, 0, kb, (int)T, s->cout, 1.0f, g->w + (size_t)c0 * g->khw, (int)g->K, dyt, (int)g->P, 0.0f,
                     col, (int)T);
            col2im_add(g, dxi, c0, c1, r0, r1, col);
        }
    }
}

/* Input gradient of a pointwise conv: tiles do not overlap there, so each
 * unit is a tile of one image and a block of input channels (all of them
 * but for small images): dx_tile[block] += w[:, block]^T dy_tile. */
static void gconv_dx_pointwise_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t ni = u / ((size_t)g->ntiles * (size_t)g->nfblocks), rest = u % ((size_t)g->ntiles * (size_t)g->nfblocks);
        int r0 = (int)(rest / (size_t)g->nfblocks) * g->rows;
        int r1 = r0 + g->rows < g->oh ? r0 + g->rows : g->oh;
        int c0 = (int)(rest % (size_t)g->nfblocks) * g->fb, nc = s->cin - c0 < g->fb ? s->cin - c0 : g->fb;
        size_t T = (size_t)(r1 - r0) * (size_t)g->ow, off = (size_t)r0 * (size_t)g->ow;
        sd_sgemm(1, 0, nc, (int)T, s->cout, 1.0f, g->w + c0, s->cin, g->dy + ni * (size_t)s->cout * g->P + off,
                 (int)g->P, 1.0f, g->dx + (ni * (size_t)s->cin + (size_t)c0) * g->HW + off, (int)g->HW);
    }
}

/* Weight gradient: each unit is one block of input channels, i.e. the
 * columns [c0*kh*kw, c1*kh*kw) of dw, summed over images and tiles in
 * order: dw[:, block] += dy_tile col_tile[block]^T. Each col element is
 * built once; the GEMM repacks dy_tile once per block, cheap next to its
 * cout * kb * T multiply-adds while kb = cb*kh*kw is large. */
static void gconv_dw_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    float *col = g->scratch ? g->scratch + (size_t)worker * g->sstride : NULL;
    for (size_t blk = begin; blk < end; blk++) {
        int c0, c1;
        block_channels(g, blk, &c0, &c1);
        int kb = (c1 - c0) * (int)g->khw;
        for (int ni = 0; ni < s->n; ni++) {
            const float *xi = g->x + (size_t)ni * (size_t)s->cin * g->HW;
            for (int r0 = 0; r0 < g->oh; r0 += g->rows) {
                int r1 = r0 + g->rows < g->oh ? r0 + g->rows : g->oh;
                size_t T = (size_t)(r1 - r0) * (size_t)g->ow;
                const float *dyt = g->dy + (size_t)ni * (size_t)s->cout * g->P + (size_t)r0 * (size_t)g->ow;
                im2col(g, xi, g->HW, 0, c0, c1, r0, r1, col);
                sd_sgemm(0, 1, s->cout, kb, (int)T, 1.0f, dyt, (int)g->P, col, (int)T, 1.0f,
                         g->dw + (size_t)c0 * g->khw, (int)g->K);
            }
        }
    }
}

/* Weight gradient of a pointwise conv: there kb would be just cb, so the
 * blocks are of output channels instead (rows [co0, co1) of dw, all its
 * columns): dw[block] += dy_tile[block] x_tile^T, x read in place. */
static void gconv_dw_pointwise_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    (void)worker;
    for (size_t blk = begin; blk < end; blk++) {
        int co0 = (int)blk * g->ob, nco = s->cout - co0 < g->ob ? s->cout - co0 : g->ob;
        for (int ni = 0; ni < s->n; ni++) {
            const float *xi = g->x + (size_t)ni * (size_t)s->cin * g->HW;
            const float *dyi = g->dy + ((size_t)ni * (size_t)s->cout + (size_t)co0) * g->P;
            for (int r0 = 0; r0 < g->oh; r0 += g->rows) {
                int r1 = r0 + g->rows < g->oh ? r0 + g->rows : g->oh;
                size_t T = (size_t)(r1 - r0) * (size_t)g->ow, off = (size_t)r0 * (size_t)g->ow;
                sd_sgemm(0, 1, nco, s->cin, (int)T, 1.0f, dyi + off, (int)g->P, xi + off, (int)g->HW, 1.0f,
                         g->dw + (size_t)co0 * (size_t)s->cin, s->cin);
            }
        }
    }
}

/* Sum of n floats in 8 interleaved partial sums added up in a fixed order:
 * vectorisable, and the same result wherever it runs. */
static float sum_f32(const float *p, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += p[i + (size_t)l];
    for (; i < n; i++) acc[i & 7] += p[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Bias gradient: each unit is one output channel, images in order. */
static void gconv_db_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gconv *g = vctx;
    const sd_conv2d_shape *s = g->s;
    (void)worker;
    for (size_t co = begin; co < end; co++) {
        float acc = 0.0f;
        for (int ni = 0; ni < s->n; ni++) acc += sum_f32(g->dy + ((size_t)ni * (size_t)s->cout + co) * g->P, g->P);
        g->db[co] += acc;
    }
}

/* dx += conv^T(dy, w); dw += dy (x) x; db += sum(dy). */
void sd_conv2d_bwd(sd_pool *pool, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w)
{
    gconv g = {.dw = dw, .db = db, .x = x, .w = w, .dy = dy};
    gconv_plan(&g, s, 1);
    sd_wino_shape ws;
    if (dx && wino_dx_shape(s, g.oh, g.ow, &ws) && sd_wino_conv(pool, &ws, dx, dy, w, NULL)) dx = NULL;
    g.dx = dx;
    if (!gemm_dims_fit(&g)) {
        sd_conv2d_bwd_ref(pool, s, dx, dw, db, dy, x, w);
        return;
    }
    if (!g.pointwise && (dx || dw)) {
        size_t per = bwd_per_worker(&g);
        g.sstride = sd_scratch_stride(per);
        g.scratch = sd_scratch_alloc(sd_pool_size(pool), per);
        if (!g.scratch) {
            sd_conv2d_bwd_ref(pool, s, dx, dw, db, dy, x, w);
            return;
        }
    }
    if (dx && g.pointwise)
        sd_pool_for(pool, (size_t)s->n * (size_t)g.ntiles * (size_t)g.nfblocks, gconv_dx_pointwise_range, &g);
    else if (dx)
        sd_pool_for(pool, (size_t)s->n * (size_t)g.nblocks, gconv_dx_range, &g);
    if (dw && g.pointwise)
        sd_pool_for(pool, (size_t)g.noblocks, gconv_dw_pointwise_range, &g);
    else if (dw)
        sd_pool_for(pool, (size_t)g.nblocks, gconv_dw_range, &g);
    if (db) sd_pool_for(pool, (size_t)s->cout, gconv_db_range, &g);
    free(g.scratch);
}
