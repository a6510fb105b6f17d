/* Winograd F(2x2, 3x3): each 2x2 output tile comes from a 4x4 input tile d
 * as y = A^T [(G g G^T) . (B^T d B)] A, so a conv becomes 16 independent
 * GEMMs (one per position of the 4x4 transformed tile) over channels:
 * M_f[cout, tiles] = U_f[cout, cin] V_f[cin, tiles]. The transforms only
 * add, subtract and halve (exact in fp32 but for the rounding of the sums),
 * so the result stays within a few ulps of the direct sum.
 *
 * Work is cut into units of whole tile rows of one image, their count and
 * size a function of the shape only; each unit transforms its input tiles
 * into per-worker scratch, runs the 16 single-threaded sgemm calls and
 * writes its own output rows, so results are bit-identical for any thread
 * count. The transforms are element-wise loops over a row of tiles, which
 * the compiler vectorises (the file is built with -O3). */
#include "conv_wino.h"

#include <stdlib.h>
#include <string.h>

#include "act_store.h"
#include "dtype.h"
#include "gemm.h"
#include "gemm_rows.h"
#include "transpose8.h"

enum {
    TILE_N = 256,            /* tiles per unit (the GEMMs' m), target */
    SCRATCH = 1u << 22,      /* transformed floats per worker, at most, when a tile row allows */
    MIN_TILES = 32,          /* tiles per unit, at least, when units are cut smaller for the workers */
    MIN_CIN = 32,            /* input channels below which im2col is faster */
    MIN_IMAGE_TILES = 128    /* tiles per image below which im2col is faster */
};

typedef struct {
    const sd_wino_shape *s;
    int oh, ow;
    int ntx, nty;       /* tiles per row, tile rows */
    int rows, nblk;     /* tile rows per unit, units per image */
    size_t ntp;         /* tiles per unit: rows * ntx */
    float *U;           /* transformed weights: 16 planes U_f [cout, cin] in gemm_rows' packed panels */
    size_t uplane;      /* floats per plane: sd_gemm_rows_packed_floats(cout, cin) */
    sd_gemm_rows_isa isa;
    int tr8;            /* sd_transpose8_ok() */
    float *scratch;
    size_t sstride;
    float *y;
    const float *x, *w, *b;
    int xdt, ydt;  /* storage of xs and ys (sd_wino_conv_st); SD_DT_F32 reads x and writes y */
    const void *xs;
    void *ys;
} wctx;

/* Output size, tiles, and the units: whole tile rows of one image, about
 * TILE_N tiles each within the scratch bound, and cut smaller (to no less
 * than MIN_TILES) until each of nworkers workers has one. Bigger units read
 * the transformed weights fewer times: 1 unit per image instead of 8 at
 * 640 channels 32x32 was 1.33x faster (bench/RESULTS.md). The results do
 * not depend on the plan (each output is one chain over cin in order),
 * so it may depend on the worker count. */
static void wino_plan(wctx *c, const sd_wino_shape *s, int nworkers)
{
    c->s = s;
    c->oh = s->h + s->pt + s->pb - 2;
    c->ow = s->w + s->pl + s->pr - 2;
    c->ntx = (c->ow + 1) / 2;
    c->nty = (c->oh + 1) / 2;
    size_t per_row = 16 * ((size_t)s->cin + (size_t)s->cout) * (size_t)c->ntx;
    int rows = TILE_N / c->ntx;
    if ((size_t)rows > SCRATCH / per_row) rows = (int)(SCRATCH / per_row);
    int per_img = (nworkers + s->n - 1) / s->n, least = (MIN_TILES + c->ntx - 1) / c->ntx;
    if (per_img > 1) {
        int cut = (c->nty + per_img - 1) / per_img;
        if (cut < least) cut = least;
        if (cut < rows) rows = cut;
    }
    c->rows = rows < 1 ? 1 : rows;
    c->nblk = (c->nty + c->rows - 1) / c->rows;
    c->ntp = (size_t)c->rows * (size_t)c->ntx;
}

/* Pads 0..2 (so the flipped conv of the input gradient is one too), a
 * non-empty output, and a shape where the 16 GEMMs beat one im2col GEMM:
 * enough input channels (measured: cin 16 is still slower, cin 32 faster,
 * 128 output channels at 256x256; the conv_in of a VAE, cin 3, is 2x
 * slower) and enough tiles per image, since the weights are transformed
 * on every call (16 cout x cin floats written) and each unit's GEMMs read
 * all of them: measured at 1280 channels (1 thread), 64 tiles (16x16
 * images) take 1.5x the time of im2col, 144 tiles (24x24) 0.91x, 256
 * (32x32) 0.67x; at 640 channels 144 tiles 0.80x. */
int sd_wino_ok(const sd_wino_shape *s)
{
    if (s->cin < MIN_CIN) return 0;
    if (s->pt < 0 || s->pb < 0 || s->pl < 0 || s->pr < 0) return 0;
    if (s->pt > 2 || s->pb > 2 || s->pl > 2 || s->pr > 2) return 0;
    if (s->h + s->pt + s->pb < 3 || s->w + s->pl + s->pr < 3) return 0;
    int ow = s->w + s->pl + s->pr - 2, oh = s->h + s->pt + s->pb - 2;
    return (size_t)((ow + 1) / 2) * (size_t)((oh + 1) / 2) >= MIN_IMAGE_TILES;
}

/* U_f[m][k] = (G g G^T)_f for the output channels m of panels [begin,
 * end) (16 channels each, the packed layout's panels: gemm_rows.h) and
 * every input channel k, g the 3x3 filter, G = [1 0 0; .5 .5 .5; .5 -.5 .5;
 * 0 0 1]. KB input channels at a time: per channel m their filters
 * gathered into g[tap][kk], the transform run across kk (loops the
 * compiler vectorises, each element's operations the scalar ones in the
 * same order, so the same bits), the results gathered into blk[f][kk][lane]
 * and each run of 16 lanes stored at its place in U_f's panels (one cache
 * line; lanes past cout stay zero), so no unit packs anything. Run once
 * per call. */
static void weights_range(void *vctx, int worker, size_t begin, size_t end)
{
    enum { KB = 16, NR = SD_GEMM_ROWS_NR };
    const wctx *c = vctx;
    const sd_wino_shape *s = c->s;
    (void)worker;
    for (size_t pn = begin; pn < end; pn++) {
        int m0 = (int)pn * NR, lanes = s->cout - m0 < NR ? s->cout - m0 : NR;
        for (int k0 = 0; k0 < s->cin; k0 += KB) {
            int nk = s->cin - k0 < KB ? s->cin - k0 : KB;
            float blk[16][KB][NR] = {{{0}}};
            for (int mm = 0; mm < lanes; mm++) {
                size_t m = (size_t)(m0 + mm);
                float g[9][KB] = {{0}}, t[4][3][KB], r[16][KB];
                for (int kk = 0; kk < nk; kk++) {
                    size_t k = (size_t)(k0 + kk);
                    if (!s->flip) {
                        const float *src = c->w + (m * (size_t)s->cin + k) * 9;
                        for (int q = 0; q < 9; q++) g[q][kk] = src[q];
                    } else {
                        const float *src = c->w + (k * (size_t)s->cout + m) * 9;
                        for (int q = 0; q < 9; q++) g[q][kk] = src[8 - q];
                    }
                }
                for (int j = 0; j < 3; j++)
                    for (int kk = 0; kk < KB; kk++) {
                        t[0][j][kk] = g[j][kk];
                        t[1][j][kk] = 0.5f * (g[j][kk] + g[3 + j][kk] + g[6 + j][kk]);
                        t[2][j][kk] = 0.5f * (g[j][kk] - g[3 + j][kk] + g[6 + j][kk]);
                        t[3][j][kk] = g[6 + j][kk];
                    }
                for (int i = 0; i < 4; i++)
                    for (int kk = 0; kk < KB; kk++) {
                        r[i * 4 + 0][kk] = t[i][0][kk];
                        r[i * 4 + 1][kk] = 0.5f * (t[i][0][kk] + t[i][1][kk] + t[i][2][kk]);
                        r[i * 4 + 2][kk] = 0.5f * (t[i][0][kk] - t[i][1][kk] + t[i][2][kk]);
                        r[i * 4 + 3][kk] = t[i][2][kk];
                    }
                for (int f = 0; f < 16; f++)
                    for (int kk = 0; kk < KB; kk++) blk[f][kk][mm] = r[f][kk];
            }
            for (int kk = 0; kk < nk; kk++) {
                float *u = c->U + sd_gemm_rows_packed_index(s->cout, s->cin, m0, k0 + kk);
                for (int f = 0; f < 16; f++) memcpy(u + (size_t)f * c->uplane, blk[f][kk], sizeof blk[f][kk]);
            }
        }
    }
}

/* Even and odd columns of one zero-padded input row: ev[j] = row[2j - pl],
 * od[j] = row[2j + 1 - pl] for j in [0, n), 0 outside the image; the
 * columns where both lie inside are copied without bounds checks. */
static void split_row(const float *restrict xr, int w, int pl, int n, float *restrict ev, float *restrict od)
{
    int lo = (pl + 1) / 2, hi = (w + pl) / 2;
    if (hi > n) hi = n;
    if (lo > hi) lo = hi;
    for (int j = 0; j < n; j++) {
        if (j == lo) j = hi;
        if (j >= n) break;
        int i0 = 2 * j - pl, i1 = i0 + 1;
        ev[j] = i0 >= 0 && i0 < w ? xr[i0] : 0.0f;
        od[j] = i1 >= 0 && i1 < w ? xr[i1] : 0.0f;
    }
    for (int j = lo; j < hi; j++) {
        ev[j] = xr[2 * j - pl];
        od[j] = xr[2 * j + 1 - pl];
    }
}

/* The row pass of B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
 * element-wise over n columns of the four input rows d0..d3. restrict
 * parameters (not locals) are what lets the compiler vectorise. */
static void input_rows(size_t n, const float *restrict d0, const float *restrict d1, const float *restrict d2,
                       const float *restrict d3, float *restrict e0, float *restrict e1, float *restrict e2,
                       float *restrict e3)
{
    for (size_t j = 0; j < n; j++) {
        e0[j] = d0[j] - d2[j];
        e1[j] = d1[j] + d2[j];
        e2[j] = d2[j] - d1[j];
        e3[j] = d1[j] - d3[j];
    }
}

/* The column pass on one row-pass row split into even and odd columns:
 * tile t's columns 2t..2t+3 are ev[t], od[t], ev[t+1], od[t+1]; v0..v3
 * receive the row's four transformed positions of tiles [0, n). */
static void input_cols(int n, const float *restrict ev, const float *restrict od, float *restrict v0,
                       float *restrict v1, float *restrict v2, float *restrict v3)
{
    for (int t = 0; t < n; t++) {
        v0[t] = ev[t] - ev[t + 1];
        v1[t] = od[t] + ev[t + 1];
        v2[t] = ev[t + 1] - od[t];
        v3[t] = od[t] - od[t + 1];
    }
}

/* Transform the input tiles of tile rows [ty0, ty1) of image ni into
 * V[16][cin][ntp]: per tile row, its four input rows split into even and
 * odd columns (rows[r], rows[r] + n), the row pass into e, the column pass
 * into V. */
static void transform_input(const wctx *c, size_t ni, int ty0, int ty1, float *V, float *work)
{
    const sd_wino_shape *s = c->s;
    size_t hw = (size_t)s->h * (size_t)s->w, n = (size_t)c->ntx + 1;
    float *rows[4] = {work, work + 2 * n, work + 4 * n, work + 6 * n}, *e = work + 8 * n, *wide = work + 16 * n;
    for (int ci = 0; ci < s->cin; ci++) {
        size_t plane = (ni * (size_t)s->cin + (size_t)ci) * hw;
        const float *xp = c->xdt == SD_DT_F32 ? c->x + plane : NULL;
        for (int ty = ty0; ty < ty1; ty++) {
            for (int r = 0; r < 4; r++) {
                int iy = 2 * ty - s->pt + r;
                if (iy >= 0 && iy < s->h) {
                    const float *xr = wide;
                    if (xp) xr = xp + (size_t)iy * (size_t)s->w;
                    else sd_act_widen(wide, c->xs, plane + (size_t)iy * (size_t)s->w, (size_t)s->w, c->xdt);
                    split_row(xr, s->w, s->pl, (int)n, rows[r], rows[r] + n);
                } else
                    memset(rows[r], 0, 2 * n * sizeof(float));
            }
            input_rows(2 * n, rows[0], rows[1], rows[2], rows[3], e, e + 2 * n, e + 4 * n, e + 6 * n);
            float *v = V + (size_t)ci * c->ntp + (size_t)(ty - ty0) * (size_t)c->ntx;
            size_t fs = (size_t)s->cin * c->ntp;
            for (int r = 0; r < 4; r++) {
                float *vr = v + (size_t)(4 * r) * fs;
                input_cols(c->ntx, e + 2 * n * (size_t)r, e + 2 * n * (size_t)r + n, vr, vr + fs, vr + 2 * fs,
                           vr + 3 * fs);
            }
        }
    }
}

/* The row pass of A^T m A, A^T = [1 1 1 0; 0 1 -1 -1], element-wise over
 * n tiles of one column position: m0..m3 are the planes of rows 0..3. */
static void output_rows(int n, const float *restrict m0, const float *restrict m1, const float *restrict m2,
                        const float *restrict m3, float *restrict t0, float *restrict t1)
{
    for (int t = 0; t < n; t++) {
        t0[t] = m0[t] + m1[t] + m2[t];
        t1[t] = m1[t] - m2[t] - m3[t];
    }
}

/* The column pass for one output row: tile t's two pixels from its
 * row-pass values t0..t3 plus the bias, stored into y[2t], y[2t + 1] for
 * n tiles (and y[2n] from tile n when odd is set: an odd-width row). */
static void output_cols(int n, int odd, const float *restrict t0, const float *restrict t1,
                        const float *restrict t2, const float *restrict t3, float bias, float *restrict y)
{
    for (int t = 0; t < n; t++) {
        y[2 * t] = t0[t] + t1[t] + t2[t] + bias;
        y[2 * t + 1] = t1[t] - t2[t] - t3[t] + bias;
    }
    if (odd) y[2 * n] = t0[n] + t1[n] + t2[n] + bias;
}

/* output_cols adding into y (the input gradient) instead of storing. */
static void output_cols_acc(int n, int odd, const float *restrict t0, const float *restrict t1,
                            const float *restrict t2, const float *restrict t3, float bias, float *restrict y)
{
    for (int t = 0; t < n; t++) {
        y[2 * t] += t0[t] + t1[t] + t2[t] + bias;
        y[2 * t + 1] += t1[t] - t2[t] - t3[t] + bias;
    }
    if (odd) y[2 * n] += t0[n] + t1[n] + t2[n] + bias;
}

/* Inverse-transform M[16][cout][ntp] of tile rows [ty0, ty1) of image ni
 * into its output rows (row pass into work, then the column pass), adding
 * the bias, storing or adding into y. */
static void transform_output(const wctx *c, size_t ni, int ty0, int ty1, const float *Mb, float *work)
{
    const sd_wino_shape *s = c->s;
    size_t ohw = (size_t)c->oh * (size_t)c->ow, fs = (size_t)s->cout * c->ntp, np = (size_t)c->ntx;
    int full = c->ow / 2, odd = c->ow & 1;
    float *row = work + 8 * np; /* one output row before it is narrowed to ys */
    for (int co = 0; co < s->cout; co++) {
        size_t plane = (ni * (size_t)s->cout + (size_t)co) * ohw;
        float *yp = c->ydt == SD_DT_F32 ? c->y + plane : NULL, bias = c->b ? c->b[co] : 0.0f;
        for (int ty = ty0; ty < ty1; ty++) {
            const float *m = Mb + (size_t)co * c->ntp + (size_t)(ty - ty0) * np;
            for (int cc = 0; cc < 4; cc++)
                output_rows(c->ntx, m + (size_t)cc * fs, m + (size_t)(4 + cc) * fs, m + (size_t)(8 + cc) * fs,
                            m + (size_t)(12 + cc) * fs, work + (size_t)cc * np, work + (size_t)(4 + cc) * np);
            for (int a = 0; a < 2 && 2 * ty + a < c->oh; a++) {
                const float *t = work + (size_t)(4 * a) * np;
                size_t at = (size_t)(2 * ty + a) * (size_t)c->ow;
                float *yr = yp ? yp + at : row;
                (s->acc ? output_cols_acc : output_cols)(full, odd, t, t + np, t + 2 * np, t + 3 * np, bias, yr);
                if (!yp) sd_act_narrow(c->ys, plane + at, row, (size_t)c->ow, c->ydt);
            }
        }
    }
}

/* dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: 8 x 8
 * blocks in AVX2 registers where tr8, the rest by loops (a copy either
 * way). */
static void transpose(int tr8, float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int rows,
                      int cols)
{
    int r8 = tr8 ? rows / 8 * 8 : 0, c8 = tr8 ? cols / 8 * 8 : 0;
    for (int i = 0; i < r8; i += 8)
        for (int j = 0; j < c8; j += 8)
            sd_transpose8_avx2(dst + (size_t)j * ldd + (size_t)i, ldd, src + (size_t)i * lds + (size_t)j, lds);
    for (int i = 0; i < rows; i++)
        for (int j = i < r8 ? c8 : 0; j < cols; j++) dst[(size_t)j * ldd + (size_t)i] = src[(size_t)i * lds + (size_t)j];
}

/* One unit: tile rows of one image through transform, 16 GEMMs, inverse.
 * Each GEMM is gemm_rows' form, Mt[tile, cout] = Vt[tile, cin] U_f^T on
 * the packed U_f: V_f is transposed into Vt before it and Mt back into
 * M_f after it (every output element one fmaf chain over cin in order). */
static void units_range(void *vctx, int worker, size_t begin, size_t end)
{
    const wctx *c = vctx;
    const sd_wino_shape *s = c->s;
    float *V = c->scratch + (size_t)worker * c->sstride;
    float *Mb = V + 16 * (size_t)s->cin * c->ntp, *Vt = Mb + 16 * (size_t)s->cout * c->ntp;
    float *Mt = Vt + (size_t)s->cin * c->ntp, *work = Mt + (size_t)s->cout * c->ntp;
    for (size_t u = begin; u < end; u++) {
        size_t ni = u / (size_t)c->nblk;
        int ty0 = (int)(u % (size_t)c->nblk) * c->rows;
        int ty1 = ty0 + c->rows < c->nty ? ty0 + c->rows : c->nty;
        transform_input(c, ni, ty0, ty1, V, work);
        int n = (ty1 - ty0) * c->ntx;
        for (int f = 0; f < 16; f++) {
            transpose(c->tr8, Vt, (size_t)s->cin, V + (size_t)f * (size_t)s->cin * c->ntp, c->ntp, s->cin, n);
            sd_gemm_rows_packed(c->isa, n, s->cout, s->cin, Vt, (size_t)s->cin, c->U + (size_t)f * c->uplane, NULL,
                                Mt, (size_t)s->cout);
            transpose(c->tr8, Mb + (size_t)f * (size_t)s->cout * c->ntp, c->ntp, Mt, (size_t)s->cout, n, s->cout);
        }
        transform_output(c, ni, ty0, ty1, Mb, work);
    }
}

/* Plan, transform the weights, run the units (see conv_wino.h). */
int sd_wino_conv(sd_pool *pool, const sd_wino_shape *s, float *y, const float *x, const float *w, const float *b)
{
    return sd_wino_conv_st(pool, s, SD_DT_F32, y, SD_DT_F32, x, w, b);
}

/* Floats of one worker's area (see sd_wino_conv_st). */
static size_t wino_per_worker(const wctx *c, const sd_wino_shape *s)
{
    size_t per_row = 17 * ((size_t)s->cin + (size_t)s->cout) * (size_t)c->ntx;
    return per_row * (size_t)c->rows + 16 * ((size_t)c->ntx + 1) + (size_t)s->w;
}

/* Floats of the transformed weights (packed: cout rounded up to 16). */
static size_t wino_u_floats(const sd_wino_shape *s)
{
    return 16 * sd_gemm_rows_packed_floats(s->cout, s->cin);
}

/* The bytes sd_wino_conv_st allocates: the same plan and sizes. */
size_t sd_wino_scratch_bytes(int nworkers, const sd_wino_shape *s)
{
    wctx c = {0};
    wino_plan(&c, s, nworkers);
    return sd_scratch_bytes(1, wino_u_floats(s)) + sd_scratch_bytes(nworkers, wino_per_worker(&c, s));
}

/* The same with x and y stored as xdt / ydt (not with acc): input rows are
 * widened as the transform reads them, output rows narrowed as the inverse
 * writes them; the arithmetic is sd_wino_conv's. The work area grows by an
 * input row and (inside it) an output row. */
int sd_wino_conv_st(sd_pool *pool, const sd_wino_shape *s, int ydt, void *y, int xdt, const void *x, const float *w,
                    const float *b)
{
    wctx c = {.y = y, .x = x, .w = w, .b = b, .xdt = xdt, .ydt = ydt, .xs = x, .ys = y};
    if (s->acc && ydt != SD_DT_F32) return 0;
    wino_plan(&c, s, sd_pool_size(pool));
    size_t per = wino_per_worker(&c, s);
    c.sstride = sd_scratch_stride(per);
    c.uplane = sd_gemm_rows_packed_floats(s->cout, s->cin);
    c.isa = sd_gemm_rows_best_isa();
    c.tr8 = sd_transpose8_ok();
    c.U = sd_scratch_alloc(1, wino_u_floats(s)); /* aligned: the kernels load panels aligned */
    c.scratch = sd_scratch_alloc(sd_pool_size(pool), per);
    if (!c.U || !c.scratch) {
        free(c.U);
        free(c.scratch);
        return 0;
    }
    sd_pool_for(pool, ((size_t)s->cout + SD_GEMM_ROWS_NR - 1) / SD_GEMM_ROWS_NR, weights_range, &c);
    sd_pool_for(pool, (size_t)s->n * (size_t)c.nblk, units_range, &c);
    free(c.U);
    free(c.scratch);
    return 1;
}
