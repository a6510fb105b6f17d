/* 16-bit activation storage (act_store.h, ops_store.c, sd_conv2d_fwd_st):
 * the conversions against the scalar fp16/bf16 routines (every fp16 value,
 * a million floats including halfway cases, subnormals, overflow), and
 * each typed op bit for bit against the fp32 op on the widened input,
 * rounded once, for bf16 and fp16, typed input or output alone, Winograd,
 * im2col (3-channel, stride 2 with the VAE's (0,1,0,1) padding) and 1x1
 * convs, on 1 and 3 threads. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "act_store.h"
#include "check.h"
#include "conv_wino.h"
#include "dtype.h"
#include "f16.h"
#include "ops_cpu.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* Deterministic 64-bit values (xorshift64*). */
static uint64_t next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* Uniform floats in [-scale, scale). */
static float frand(float scale)
{
    return (float)((double)(next() >> 40) / (double)(1ull << 24) * 2.0 - 1.0) * scale;
}

/* n elements of dtype dt (calloc'd), aborting on no memory. */
static void *alloc(size_t n, int dt)
{
    void *p = calloc(n ? n : 1, sd_dtype_size(dt));
    if (!p) abort();
    return p;
}

/* A dt buffer of n random values in [-scale, scale), and its widened floats. */
static void *rand_typed(size_t n, int dt, float scale, float **wide)
{
    float *f = alloc(n, SD_DT_F32);
    for (size_t i = 0; i < n; i++) f[i] = frand(scale);
    void *t = alloc(n, dt);
    sd_act_narrow(t, 0, f, n, dt);
    sd_act_widen(f, t, 0, n, dt);
    *wide = f;
    return t;
}

/* Widening every fp16 and bf16 value is the scalar conversion's; narrowing
 * random bit patterns, values near the rounding midpoints, fp16 subnormals
 * and overflow gives the scalar routines' bits (NaN aside: any quiet NaN). */
static void test_conversions(void)
{
    enum { N = 1 << 16 };
    uint16_t *h = alloc(N, SD_DT_F16);
    float *w = alloc(N, SD_DT_F32);
    for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++) {
        for (size_t i = 0; i < N; i++) h[i] = (uint16_t)i;
        sd_act_widen(w, h, 0, N, dt);
        int bad = 0;
        for (size_t i = 0; i < N; i++) {
            float want = dt == SD_DT_F16 ? sd_f16_to_f32(h[i]) : sd_bf16_to_f32(h[i]);
            if (memcmp(&want, &w[i], 4) && !(isnan(want) && isnan(w[i]))) bad++;
        }
        CHECK(bad == 0);
    }
    enum { M = 1 << 20 };
    float *f = alloc(M, SD_DT_F32);
    uint16_t *got = alloc(M, SD_DT_F16);
    for (size_t i = 0; i < M; i++) {
        uint32_t u = (uint32_t)next();
        switch (i % 4) {
        case 0: break;                                          /* any bit pattern */
        case 1: u = (u & 0x80000000u) | (0x33000000u + (u & 0x0fffffffu) % 0x0c000000u); break; /* fp16's range, subnormals to overflow */
        case 2: u = (u & 0xffffe000u) | 0x1000u; break;         /* fp16 halfway */
        default: u = (u & 0xffff0000u) | 0x8000u; break;        /* bf16 halfway */
        }
        memcpy(&f[i], &u, 4);
    }
    for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++) {
        sd_act_narrow(got, 0, f, M, dt);
        int bad = 0;
        for (size_t i = 0; i < M; i++) {
            uint16_t want = dt == SD_DT_F16 ? sd_f32_to_f16(f[i]) : sd_f32_to_bf16(f[i]);
            if (isnan(f[i])) continue;
            if (got[i] != want) bad++;
        }
        if (!CHECK(bad == 0)) fprintf(stderr, "  %s narrowing: %d of %d differ\n", sd_dtype_name(dt), bad, M);
        /* an unaligned start and a ragged tail take the scalar edges */
        sd_act_narrow(got, 3, f + 5, 13, dt);
        for (int i = 0; i < 13; i++)
            if (!isnan(f[5 + i]))
                CHECK(got[3 + i] == (dt == SD_DT_F16 ? sd_f32_to_f16(f[5 + i]) : sd_f32_to_bf16(f[5 + i])));
    }
    free(h);
    free(w);
    free(f);
    free(got);
}

/* Whether a typed result equals the fp32 result narrowed once. */
static int same_as_narrowed(const void *got, const float *want32, size_t n, int dt)
{
    void *want = alloc(n, dt);
    sd_act_narrow(want, 0, want32, n, dt);
    int ok = memcmp(got, want, n * sd_dtype_size(dt)) == 0;
    free(want);
    return ok;
}

static sd_pool *pools[2];

/* A conv with typed input and output against sd_conv2d_fwd of the widened
 * input, narrowed; both thread counts. */
static void conv_case(const char *name, sd_conv2d_shape s, int xdt, int ydt)
{
    sd_error e;
    if (!CHECK(sd_conv2d_check(&s, &e) == SD_OK)) return;
    size_t nx = (size_t)s.n * s.cin * s.h * s.w, nw = (size_t)s.cout * s.cin * s.kh * s.kw;
    size_t ny = (size_t)s.n * s.cout * sd_conv2d_out_h(&s) * sd_conv2d_out_w(&s);
    float *xw, *w = alloc(nw, SD_DT_F32), *b = alloc((size_t)s.cout, SD_DT_F32), *want = alloc(ny, SD_DT_F32);
    void *x = rand_typed(nx, xdt, 2.0f, &xw);
    for (size_t i = 0; i < nw; i++) w[i] = frand(0.3f);
    for (int i = 0; i < s.cout; i++) b[i] = frand(0.5f);
    sd_conv2d_fwd(NULL, &s, want, xw, w, b);
    for (int p = 0; p < 2; p++) {
        void *y = alloc(ny, ydt);
        sd_conv2d_fwd_st(pools[p], &s, ydt, y, xdt, x, w, b);
        if (!CHECK(same_as_narrowed(y, want, ny, ydt)))
            fprintf(stderr, "  conv %s %s -> %s, pool %d: not the fp32 result rounded\n", name, sd_dtype_name(xdt),
                    sd_dtype_name(ydt), p);
        free(y);
    }
    free(x);
    free(xw);
    free(w);
    free(b);
    free(want);
}

/* The conv paths: Winograd, im2col (VAE conv_in, downsample), pointwise. */
static void test_conv(void)
{
    sd_conv2d_shape wino = {.n = 2, .cin = 32, .h = 63, .w = 41, .cout = 24, .kh = 3, .kw = 3, .stride = 1,
                            .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    sd_wino_shape ws = {.n = 2, .cin = 32, .cout = 24, .h = 63, .w = 41, .pt = 1, .pb = 1, .pl = 1, .pr = 1};
    CHECK(sd_wino_ok(&ws));
    sd_conv2d_shape in = {.n = 1, .cin = 3, .h = 40, .w = 33, .cout = 16, .kh = 3, .kw = 3, .stride = 1,
                          .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    sd_conv2d_shape down = {.n = 2, .cin = 8, .h = 30, .w = 26, .cout = 8, .kh = 3, .kw = 3, .stride = 2,
                            .pad_t = 0, .pad_b = 1, .pad_l = 0, .pad_r = 1};
    sd_conv2d_shape pw = {.n = 2, .cin = 16, .h = 19, .w = 23, .cout = 12, .kh = 1, .kw = 1, .stride = 1};
    const struct {
        const char *name;
        sd_conv2d_shape s;
    } cases[] = {{"winograd", wino}, {"im2col", in}, {"stride-2", down}, {"1x1", pw}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        conv_case(cases[i].name, cases[i].s, SD_DT_BF16, SD_DT_BF16);
        conv_case(cases[i].name, cases[i].s, SD_DT_F16, SD_DT_F16);
        conv_case(cases[i].name, cases[i].s, SD_DT_F32, SD_DT_BF16);
        conv_case(cases[i].name, cases[i].s, SD_DT_F16, SD_DT_F32);
    }
}

/* Group norm (+ SiLU) with typed input and output, in place too, against
 * sd_group_norm_fwd (+ sd_silu_fwd) on the widened input, rounded; the
 * saved statistics equal the fp32 op's. */
static void test_group_norm(void)
{
    sd_gn_shape s = {.n = 2, .c = 12, .hw = 700, .groups = 3, .eps = 1e-6f};
    size_t n = (size_t)s.n * s.c * s.hw, ng = (size_t)s.n * s.groups;
    float *g = alloc((size_t)s.c, SD_DT_F32), *b = alloc((size_t)s.c, SD_DT_F32);
    for (int i = 0; i < s.c; i++) {
        g[i] = 1.0f + frand(0.5f);
        b[i] = frand(0.5f);
    }
    for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++)
        for (int silu = 0; silu < 2; silu++)
            for (int p = 0; p < 2; p++) {
                float *xw, *want = alloc(n, SD_DT_F32), *m0 = alloc(ng, SD_DT_F32), *r0 = alloc(ng, SD_DT_F32);
                float *m1 = alloc(ng, SD_DT_F32), *r1 = alloc(ng, SD_DT_F32);
                void *x = rand_typed(n, dt, 3.0f, &xw), *y = alloc(n, dt);
                sd_group_norm_fwd(NULL, &s, want, m0, r0, xw, g, b);
                if (silu) sd_silu_fwd(NULL, n, want, want);
                sd_group_norm_fwd_st(pools[p], &s, silu, dt, y, m1, r1, dt, x, g, b);
                CHECK(same_as_narrowed(y, want, n, dt));
                CHECK(!memcmp(m0, m1, ng * 4) && !memcmp(r0, r1, ng * 4));
                sd_group_norm_fwd_st(pools[p], &s, silu, dt, x, m1, r1, dt, x, g, b); /* in place */
                CHECK(same_as_narrowed(x, want, n, dt));
                free(xw);
                free(want);
                free(m0);
                free(r0);
                free(m1);
                free(r1);
                free(x);
                free(y);
            }
    free(g);
    free(b);
}

/* add and convert: a + b of the widened values rounded once (in place as
 * the residuals run it); a conversion both ways. */
static void test_add_convert(void)
{
    size_t n = 5000;
    for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++) {
        float *aw, *bw, *sum = alloc(n, SD_DT_F32), *back = alloc(n, SD_DT_F32);
        void *a = rand_typed(n, dt, 4.0f, &aw), *b = rand_typed(n, dt, 4.0f, &bw);
        sd_add_fwd(NULL, n, sum, aw, bw);
        sd_add_fwd_st(pools[1], n, dt, a, a, b);
        CHECK(same_as_narrowed(a, sum, n, dt));
        sd_convert_st(pools[1], n, SD_DT_F32, back, dt, a);
        void *again = alloc(n, dt);
        sd_convert_st(pools[0], n, dt, again, SD_DT_F32, back);
        CHECK(!memcmp(again, a, n * 2)); /* widening is exact, so narrowing it back is the identity */
        CHECK(same_as_narrowed(a, back, n, dt));
        free(aw);
        free(bw);
        free(sum);
        free(back);
        free(a);
        free(b);
        free(again);
    }
}

int main(void)
{
    pools[0] = NULL;
    pools[1] = sd_pool_create(3);
    if (!pools[1]) return 1;
    test_conversions();
    test_conv();
    test_group_norm();
    test_add_convert();
    sd_pool_destroy(pools[1]);
    return check_done("test_act16");
}
