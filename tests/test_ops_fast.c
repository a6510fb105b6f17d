/* The GEMM-backed ops (im2col and Winograd convs, linear, blockwise
 * attention) against their direct-loop references (ops_ref.h) on shapes
 * big enough for many tiles, channel blocks and ragged edges, which the
 * small golden and finite-difference cases of test_ops.c do not reach;
 * backward adds into non-zero gradients and skips NULL ones; results are
 * bit-identical for 1, 2 and 3 threads. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "conv_wino.h"
#include "dtype.h"
#include "f16.h"
#include "ops_ref.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

/* Deterministic uniform floats in [-1, 1) (xorshift64*). */
static float frand(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* n random floats (calloc'd when zero is set), aborting on no memory. */
static float *buf(size_t n, int zero)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) abort();
    if (!zero)
        for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

/* A copy of n floats. */
static float *dup(const float *src, size_t n)
{
    float *p = buf(n, 1);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* max |got - want| over max(1, max |want|): the error relative to the
 * tensor's scale (sums of many products are large, their parts are not). */
static double err(const float *got, const float *want, size_t n)
{
    double worst = 0.0, scale = 1.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= worst)) worst = e;
    }
    return worst / scale;
}

/* One tensor's check: error against the reference within tol. */
static void expect(const char *name, const char *what, const float *got, const float *want, size_t n, double tol)
{
    double e = err(got, want, n);
    if (!CHECK(e <= tol)) fprintf(stderr, "  %s %s: error %.3g > %.3g\n", name, what, e, tol);
}

/* Bit equality of two runs. */
static void same(const char *name, const char *what, int threads, const float *a, const float *b, size_t n)
{
    if (!CHECK(memcmp(a, b, n * sizeof(float)) == 0))
        fprintf(stderr, "  %s %s: %d threads differ from 1\n", name, what, threads);
}

static sd_pool *pools[3];

/* conv2d: forward and all gradients (added onto random initial values)
 * against the reference, NULL gradients skipped, 1/2/3 threads equal. */
/* Whether the conv's forward (bwd 0) or input gradient (bwd 1) runs as
 * Winograd, as ops_conv.c decides it. */
static int takes_wino(const sd_conv2d_shape *s, int bwd)
{
    if (s->kh != 3 || s->kw != 3 || s->stride != 1) return 0;
    sd_wino_shape w = {.n = s->n, .cin = bwd ? s->cout : s->cin, .cout = bwd ? s->cin : s->cout,
                       .h = bwd ? sd_conv2d_out_h(s) : s->h, .w = bwd ? sd_conv2d_out_w(s) : s->w,
                       .pt = bwd ? 2 - s->pad_t : s->pad_t, .pb = bwd ? 2 - s->pad_b : s->pad_b,
                       .pl = bwd ? 2 - s->pad_l : s->pad_l, .pr = bwd ? 2 - s->pad_r : s->pad_r, .flip = bwd};
    return sd_wino_ok(&w);
}

static void conv_case(const char *name, sd_conv2d_shape s)
{
    sd_error e;
    if (!CHECK(sd_conv2d_check(&s, &e) == SD_OK)) return;
    size_t nx = (size_t)s.n * s.cin * s.h * s.w, nw = (size_t)s.cout * s.cin * s.kh * s.kw;
    size_t ny = (size_t)s.n * s.cout * sd_conv2d_out_h(&s) * sd_conv2d_out_w(&s);
    float *x = buf(nx, 0), *w = buf(nw, 0), *b = buf((size_t)s.cout, 0), *dy = buf(ny, 0);
    float *g0x = buf(nx, 0), *g0w = buf(nw, 0), *g0b = buf((size_t)s.cout, 0);
    float *yr = buf(ny, 1), *dxr = dup(g0x, nx), *dwr = dup(g0w, nw), *dbr = dup(g0b, (size_t)s.cout);
    sd_conv2d_fwd_ref(NULL, &s, yr, x, w, b);
    sd_conv2d_bwd_ref(NULL, &s, dxr, dwr, dbr, dy, x, w);
    float *y1 = NULL, *dx1 = NULL, *dw1 = NULL, *db1 = NULL;
    for (int t = 0; t < 3; t++) {
        float *y = buf(ny, 1), *dx = dup(g0x, nx), *dw = dup(g0w, nw), *db = dup(g0b, (size_t)s.cout);
        sd_conv2d_fwd(pools[t], &s, y, x, w, b);
        sd_conv2d_bwd(pools[t], &s, dx, dw, db, dy, x, w);
        if (t == 0) {
            expect(name, "y", y, yr, ny, 1e-5);
            expect(name, "dx", dx, dxr, nx, 1e-5);
            expect(name, "dw", dw, dwr, nw, 1e-5);
            expect(name, "db", db, dbr, (size_t)s.cout, 1e-5);
            y1 = y, dx1 = dx, dw1 = dw, db1 = db;
            continue;
        }
        int nt = sd_pool_size(pools[t]);
        same(name, "y", nt, y, y1, ny);
        same(name, "dx", nt, dx, dx1, nx);
        same(name, "dw", nt, dw, dw1, nw);
        same(name, "db", nt, db, db1, (size_t)s.cout);
        free(y), free(dx), free(dw), free(db);
    }
    /* one gradient at a time: the others stay NULL and nothing else moves */
    float *dx = dup(g0x, nx), *dw = dup(g0w, nw), *db = dup(g0b, (size_t)s.cout);
    sd_conv2d_bwd(pools[1], &s, dx, NULL, NULL, dy, x, w);
    sd_conv2d_bwd(pools[1], &s, NULL, dw, NULL, dy, x, w);
    sd_conv2d_bwd(pools[1], &s, NULL, NULL, db, dy, x, w);
    same(name, "dx alone", 2, dx, dx1, nx);
    same(name, "dw alone", 2, dw, dw1, nw);
    same(name, "db alone", 2, db, db1, (size_t)s.cout);
    sd_conv2d_fwd(pools[1], &s, yr, x, w, NULL);
    for (size_t i = 0; i < ny; i++) yr[i] += b[i / (ny / (size_t)s.n / (size_t)s.cout) % (size_t)s.cout];
    expect(name, "y without bias", yr, y1, ny, 1e-5);
    printf("conv   %-10s ok\n", name);
    free(x), free(w), free(b), free(dy), free(g0x), free(g0w), free(g0b), free(yr), free(dxr), free(dwr), free(dbr);
    free(y1), free(dx1), free(dw1), free(db1), free(dx), free(dw), free(db);
}

/* linear: same checks as conv_case. */
static void linear_case(const char *name, sd_linear_shape s)
{
    size_t nx = (size_t)s.m * s.k, nw = (size_t)s.n * s.k, ny = (size_t)s.m * s.n;
    float *x = buf(nx, 0), *w = buf(nw, 0), *b = buf((size_t)s.n, 0), *dy = buf(ny, 0);
    float *g0x = buf(nx, 0), *g0w = buf(nw, 0), *g0b = buf((size_t)s.n, 0);
    float *yr = buf(ny, 1), *dxr = dup(g0x, nx), *dwr = dup(g0w, nw), *dbr = dup(g0b, (size_t)s.n);
    sd_linear_fwd_ref(NULL, &s, yr, x, w, b);
    sd_linear_bwd_ref(NULL, &s, dxr, dwr, dbr, dy, x, w);
    float *y1 = NULL, *dx1 = NULL, *dw1 = NULL, *db1 = NULL;
    for (int t = 0; t < 3; t++) {
        float *y = buf(ny, 1), *dx = dup(g0x, nx), *dw = dup(g0w, nw), *db = dup(g0b, (size_t)s.n);
        sd_linear_fwd(pools[t], &s, y, x, w, b);
        sd_linear_bwd(pools[t], &s, dx, dw, db, dy, x, w);
        if (t == 0) {
            expect(name, "y", y, yr, ny, 1e-5);
            expect(name, "dx", dx, dxr, nx, 1e-5);
            expect(name, "dw", dw, dwr, nw, 1e-5);
            expect(name, "db", db, dbr, (size_t)s.n, 1e-5);
            y1 = y, dx1 = dx, dw1 = dw, db1 = db;
            continue;
        }
        int nt = sd_pool_size(pools[t]);
        same(name, "y", nt, y, y1, ny);
        same(name, "dx", nt, dx, dx1, nx);
        same(name, "dw", nt, dw, dw1, nw);
        same(name, "db", nt, db, db1, (size_t)s.n);
        free(y), free(dx), free(dw), free(db);
    }
    float *dw = dup(g0w, nw);
    sd_linear_bwd(pools[2], &s, NULL, dw, NULL, dy, x, w);
    same(name, "dw alone", 3, dw, dw1, nw);
    printf("linear %-10s ok\n", name);
    free(x), free(w), free(b), free(dy), free(g0x), free(g0w), free(g0b), free(yr), free(dxr), free(dwr), free(dbr);
    free(y1), free(dx1), free(dw1), free(db1), free(dw);
}

/* linear + activation in one pass: bit-identical to the linear followed by
 * the activation op, for both activations and 1/2/3 threads (several k
 * blocks, ragged rows and columns), and with no activation to the linear. */
static void linear_act_case(const char *name, sd_linear_shape s)
{
    size_t nx = (size_t)s.m * s.k, nw = (size_t)s.n * s.k, ny = (size_t)s.m * s.n;
    float *x = buf(nx, 0), *w = buf(nw, 0), *b = buf((size_t)s.n, 0), *want = buf(ny, 1), *got = buf(ny, 1);
    for (int a = 0; a < 3; a++) {
        sd_linear_fwd(pools[0], &s, want, x, w, b);
        if (a == SD_ACT_GELU) sd_gelu_fwd(pools[0], ny, want, want);
        if (a == SD_ACT_QUICK_GELU) sd_quick_gelu_fwd(pools[0], ny, want, want);
        for (int t = 0; t < 3; t++) {
            memset(got, 0, ny * sizeof(float));
            sd_linear_act_fwd(pools[t], &s, (sd_act)a, SD_DT_F32, got, x, w, b);
            same(name, a == 0 ? "no act" : a == 1 ? "gelu" : "quick_gelu", sd_pool_size(pools[t]), got, want, ny);
        }
    }
    /* 16-bit weights: the bits of float weights holding the same values */
    uint16_t *h = malloc(nw * sizeof(uint16_t));
    if (!h) abort();
    for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++) {
        for (size_t i = 0; i < nw; i++) {
            h[i] = dt == SD_DT_F16 ? sd_f32_to_f16(w[i]) : sd_f32_to_bf16(w[i]);
            w[i] = dt == SD_DT_F16 ? sd_f16_to_f32(h[i]) : sd_bf16_to_f32(h[i]);
        }
        sd_linear_act_fwd(pools[0], &s, SD_ACT_QUICK_GELU, SD_DT_F32, want, x, w, b);
        for (int t = 0; t < 3; t++) {
            memset(got, 0, ny * sizeof(float));
            sd_linear_act_fwd(pools[t], &s, SD_ACT_QUICK_GELU, dt, got, x, h, b);
            same(name, sd_dtype_name(dt), sd_pool_size(pools[t]), got, want, ny);
        }
    }
    printf("linear %-10s act ok, fp16/bf16 weights ok\n", name);
    free(x), free(w), free(b), free(want), free(got), free(h);
}

/* attention: y, lse and dq, dk, dv against the reference, dk alone and dv
 * alone equal to the full backward's, 1/2/3 threads equal. */
static void attn_case(const char *name, sd_attn_shape s)
{
    sd_error e;
    s.scale = 1.0f / sqrtf((float)s.d);
    if (!CHECK(sd_attn_check(&s, &e) == SD_OK)) return;
    size_t bh = (size_t)s.b * s.heads, nq = bh * s.tq * s.d, nk = bh * s.tk * s.d;
    float *q = buf(nq, 0), *k = buf(nk, 0), *v = buf(nk, 0), *dy = buf(nq, 0);
    for (size_t i = 0; i < nq; i++) q[i] *= 3.0f; /* peaky rows: the running maximum moves */
    float *g0q = buf(nq, 0), *g0k = buf(nk, 0), *g0v = buf(nk, 0);
    float *yr = buf(nq, 1), *lr = buf(bh * s.tq, 1), *dqr = dup(g0q, nq), *dkr = dup(g0k, nk), *dvr = dup(g0v, nk);
    sd_attn_fwd_ref(NULL, &s, yr, lr, q, k, v);
    sd_attn_bwd_ref(NULL, &s, dqr, dkr, dvr, dy, q, k, v, yr, lr);
    float *y1 = NULL, *l1 = NULL, *dq1 = NULL, *dk1 = NULL, *dv1 = NULL;
    for (int t = 0; t < 3; t++) {
        float *y = buf(nq, 1), *l = buf(bh * s.tq, 1), *dq = dup(g0q, nq), *dk = dup(g0k, nk), *dv = dup(g0v, nk);
        sd_attn_fwd(pools[t], &s, y, l, q, k, v);
        sd_attn_bwd(pools[t], &s, dq, dk, dv, dy, q, k, v, y, l);
        if (t == 0) {
            expect(name, "y", y, yr, nq, 1e-5);
            expect(name, "lse", l, lr, bh * s.tq, 1e-5);
            expect(name, "dq", dq, dqr, nq, 1e-5);
            expect(name, "dk", dk, dkr, nk, 1e-5);
            expect(name, "dv", dv, dvr, nk, 1e-5);
            y1 = y, l1 = l, dq1 = dq, dk1 = dk, dv1 = dv;
            continue;
        }
        int nt = sd_pool_size(pools[t]);
        same(name, "y", nt, y, y1, nq);
        same(name, "lse", nt, l, l1, bh * s.tq);
        same(name, "dq", nt, dq, dq1, nq);
        same(name, "dk", nt, dk, dk1, nk);
        same(name, "dv", nt, dv, dv1, nk);
        free(y), free(l), free(dq), free(dk), free(dv);
    }
    float *dk = dup(g0k, nk), *dv = dup(g0v, nk);
    sd_attn_bwd(pools[1], &s, NULL, dk, NULL, dy, q, k, v, y1, l1);
    sd_attn_bwd(pools[1], &s, NULL, NULL, dv, dy, q, k, v, y1, l1);
    same(name, "dk alone", 2, dk, dk1, nk);
    same(name, "dv alone", 2, dv, dv1, nk);
    printf("attn   %-10s ok\n", name);
    free(q), free(k), free(v), free(dy), free(g0q), free(g0k), free(g0v), free(yr), free(lr), free(dqr), free(dkr);
    free(dvr), free(y1), free(l1), free(dq1), free(dk1), free(dv1), free(dk), free(dv);
}

/* Element (n, h, i, c) of a token-major tensor (rows ld apart, head h's
 * d columns at h * d + off) copied to and from head-major [b, heads, t, d]. */
static void to_head_major(const sd_attn_shape *s, int t, const float *rows, size_t ld, size_t off, float *hm, int back)
{
    for (int n = 0; n < s->b; n++)
        for (int h = 0; h < s->heads; h++)
            for (int i = 0; i < t; i++)
                for (int c = 0; c < s->d; c++) {
                    float *r = (float *)rows + ((size_t)n * t + i) * ld + off + (size_t)h * s->d + c;
                    float *m = hm + (((size_t)n * s->heads + h) * t + i) * s->d + c;
                    if (back) *r = *m;
                    else *m = *r;
                }
}

/* attention on token-major rows (q|k|v side by side in one row, as the
 * CLIP encoder's fused projection leaves them; y with the heads side by
 * side): y and lse bit-identical to the head-major op on the same data
 * transposed, 1/2/3 threads, and the row-major reference to the head-major
 * reference. */
static void attn_rows_case(const char *name, sd_attn_shape s)
{
    s.scale = 1.0f / sqrtf((float)s.d);
    int W = s.heads * s.d, t = s.tq > s.tk ? s.tq : s.tk;
    size_t ld = 3 * (size_t)W + 5, bh = (size_t)s.b * s.heads; /* a ragged row stride too */
    size_t nq = bh * s.tq * s.d, nk = bh * s.tk * s.d;
    float *rows = buf((size_t)s.b * t * ld, 0), *q = buf(nq, 1), *k = buf(nk, 1), *v = buf(nk, 1);
    to_head_major(&s, s.tq, rows, ld, 0, q, 0);
    to_head_major(&s, s.tk, rows, ld, (size_t)W, k, 0);
    to_head_major(&s, s.tk, rows, ld, 2 * (size_t)W, v, 0);
    float *y = buf(nq, 1), *l = buf(bh * s.tq, 1), *yr = buf(nq, 1), *lr = buf(bh * s.tq, 1);
    float *yt = buf(nq, 1), *want = buf(nq, 1);
    sd_attn_fwd(pools[0], &s, y, l, q, k, v);
    to_head_major(&s, s.tq, want, (size_t)W, 0, y, 1); /* y as [b, tq, W] */
    for (int th = 0; th < 3; th++) {
        sd_attn_rows_fwd(pools[th], &s, (int)ld, yt, lr, rows, rows + W, rows + 2 * W);
        same(name, "rows y", sd_pool_size(pools[th]), yt, want, nq);
        same(name, "rows lse", sd_pool_size(pools[th]), lr, l, bh * s.tq);
    }
    sd_attn_fwd_ref(NULL, &s, y, l, q, k, v);
    to_head_major(&s, s.tq, want, (size_t)W, 0, y, 1);
    sd_attn_rows_fwd_ref(NULL, &s, (int)ld, yr, lr, rows, rows + W, rows + 2 * W);
    same(name, "rows ref y", 1, yr, want, nq);
    same(name, "rows ref lse", 1, lr, l, bh * s.tq);
    printf("attn   %-10s rows ok\n", name);
    free(rows), free(q), free(k), free(v), free(y), free(l), free(yr), free(lr), free(yt), free(want);
}

int main(void)
{
    for (int i = 0; i < 3; i++) pools[i] = sd_pool_create(i + 1);
    if (!CHECK(pools[0] && pools[1] && pools[2])) return 1;
    /* Winograd forward and input gradient (32+ channels, 128+ tiles per
     * image): ragged tile rows and columns, several units of several tile
     * rows (cut differently for 1, 2 and 3 workers, the same bits), pads
     * 0..2; a 3-channel input takes im2col forward and Winograd for its
     * input gradient */
    sd_conv2d_shape wino = {.n = 2, .cin = 33, .h = 37, .w = 41, .cout = 35, .kh = 3, .kw = 3, .stride = 1,
                            .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    sd_conv2d_shape wpads = {.n = 1, .cin = 32, .h = 40, .w = 23, .cout = 32, .kh = 3, .kw = 3, .stride = 1,
                             .pad_t = 0, .pad_b = 2, .pad_l = 2, .pad_r = 0};
    sd_conv2d_shape wwide = {.n = 1, .cin = 32, .h = 5, .w = 300, .cout = 40, .kh = 3, .kw = 3, .stride = 1,
                             .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    sd_conv2d_shape rgb = {.n = 1, .cin = 3, .h = 46, .w = 26, .cout = 40, .kh = 3, .kw = 3, .stride = 1,
                           .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    CHECK(takes_wino(&wino, 0) && takes_wino(&wino, 1) && takes_wino(&wpads, 0) && takes_wino(&wpads, 1));
    CHECK(takes_wino(&wwide, 0) && !takes_wino(&rgb, 0) && takes_wino(&rgb, 1));
    conv_case("wino", wino);
    conv_case("wino-pads", wpads);
    conv_case("wino-wide", wwide);
    conv_case("rgb-in", rgb);
    /* Winograd from 128 tiles per image: a 24x24 image (144) takes it, a
     * 16x16 one (64, the UNet's 1280-channel level) does not */
    sd_conv2d_shape at24 = {.n = 2, .cin = 64, .h = 24, .w = 24, .cout = 64, .kh = 3, .kw = 3, .stride = 1,
                            .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    sd_conv2d_shape at16 = at24;
    at16.h = at16.w = 16;
    CHECK(takes_wino(&at24, 0) && takes_wino(&at24, 1) && !takes_wino(&at16, 0) && !takes_wino(&at16, 1));
    /* small images (the UNet's 16x16 and 8x8 levels): too few tiles per
     * image for Winograd, so im2col, whose forward (and the pointwise input
     * gradient) cut output (input) channels into blocks there, one image
     * or several */
    sd_conv2d_shape small = {.n = 1, .cin = 40, .h = 6, .w = 6, .cout = 45, .kh = 3, .kw = 3, .stride = 1,
                             .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    CHECK(!takes_wino(&small, 0) && !takes_wino(&small, 1));
    conv_case("small", small);
    small.n = 3;
    conv_case("small-n3", small);
    conv_case("small-1x1", (sd_conv2d_shape){.n = 2, .cin = 45, .h = 7, .w = 5, .cout = 38, .kh = 1, .kw = 1,
                                             .stride = 1});
    /* im2col: the VAE downsample, stride 2 with pad 1, a 3x3 with pad 3
     * (too much for Winograd), a 4x5 kernel; channel blocks with a ragged
     * last block */
    conv_case("down", (sd_conv2d_shape){.n = 2, .cin = 17, .h = 34, .w = 29, .cout = 12, .kh = 3, .kw = 3,
                                        .stride = 2, .pad_b = 1, .pad_r = 1});
    conv_case("s2p1", (sd_conv2d_shape){.n = 1, .cin = 9, .h = 23, .w = 30, .cout = 7, .kh = 3, .kw = 3, .stride = 2,
                                        .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1});
    conv_case("pad3", (sd_conv2d_shape){.n = 1, .cin = 4, .h = 12, .w = 10, .cout = 5, .kh = 3, .kw = 3, .stride = 1,
                                        .pad_t = 3, .pad_b = 3, .pad_l = 3, .pad_r = 3});
    conv_case("k4x5", (sd_conv2d_shape){.n = 2, .cin = 5, .h = 19, .w = 23, .cout = 6, .kh = 4, .kw = 5, .stride = 3,
                                        .pad_t = 2, .pad_b = 1, .pad_l = 0, .pad_r = 2});
    /* 1x1: x is its own im2col */
    conv_case("1x1", (sd_conv2d_shape){.n = 2, .cin = 33, .h = 21, .w = 19, .cout = 40, .kh = 1, .kw = 1, .stride = 1});
    linear_case("blocks", (sd_linear_shape){.m = 2100, .k = 70, .n = 130});
    linear_case("tiny", (sd_linear_shape){.m = 3, .k = 1, .n = 2});
    linear_case("few-rows", (sd_linear_shape){.m = 77, .k = 45, .n = 101}); /* column blocks */
    linear_act_case("act", (sd_linear_shape){.m = 37, .k = 1100, .n = 230});
    linear_act_case("act-tiny", (sd_linear_shape){.m = 1, .k = 3, .n = 5});
    /* attention: tiles capped at 256 with ragged ends, cross lengths, causal */
    attn_case("long", (sd_attn_shape){.b = 1, .heads = 1, .tq = 2100, .tk = 2300, .d = 3});
    attn_case("causal", (sd_attn_shape){.b = 1, .heads = 2, .tq = 300, .tk = 300, .d = 16, .causal = 1});
    attn_case("causal-x", (sd_attn_shape){.b = 2, .heads = 1, .tq = 37, .tk = 53, .d = 8, .causal = 1});
    attn_case("causal-y", (sd_attn_shape){.b = 1, .heads = 2, .tq = 61, .tk = 19, .d = 5, .causal = 1});
    attn_case("cross", (sd_attn_shape){.b = 2, .heads = 3, .tq = 77, .tk = 9, .d = 40});
    attn_rows_case("clip", (sd_attn_shape){.b = 3, .heads = 4, .tq = 77, .tk = 77, .d = 16, .causal = 1});
    attn_rows_case("one-head", (sd_attn_shape){.b = 1, .heads = 1, .tq = 600, .tk = 600, .d = 8, .causal = 1});
    attn_rows_case("cross", (sd_attn_shape){.b = 2, .heads = 3, .tq = 40, .tk = 9, .d = 24});
    /* 8+ (batch, head) pairs: the fused backward, one unit per head */
    attn_case("fused", (sd_attn_shape){.b = 2, .heads = 4, .tq = 300, .tk = 300, .d = 16, .causal = 1});
    attn_case("fused-x", (sd_attn_shape){.b = 1, .heads = 8, .tq = 130, .tk = 77, .d = 40});
    attn_case("fused-long", (sd_attn_shape){.b = 1, .heads = 8, .tq = 600, .tk = 1100, .d = 5});
    for (int i = 0; i < 3; i++) sd_pool_destroy(pools[i]);
    return check_done("test_ops_fast");
}
