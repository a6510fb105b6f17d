/* torch's CPU generator (mt19937 as at::mt19937 runs it) and its normal
 * kernel for fp32 tensors (see torch_randn.h). The fp32 kernel's log, sin
 * and cos are the Cephes polynomials torch's AVX2 code evaluates, with
 * fmaf where its compiled code fuses a multiply into an add (found by
 * matching torch bit for bit, tests/test_torch_randn.c): fmaf is exact
 * everywhere, so the values do not depend on the CPU sdtk runs on. */
#include <math.h>
#include <string.h>

#include "torch_randn.h"

enum { MT_M = 397 };

/* mt19937's initialisation from a 32-bit seed; torch keeps the low 32
 * bits of its 64-bit seed. The first draw refills the state. */
void sd_torch_gen_seed(sd_torch_gen *g, uint64_t seed)
{
    g->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (uint32_t j = 1; j < SD_MT_N; j++)
        g->state[j] = 1812433253u * (g->state[j - 1] ^ (g->state[j - 1] >> 30)) + j;
    g->left = 1;
    g->next = 0;
    g->has_cached = 0;
    g->cached = 0;
}

/* The upper bit of u and the lower 31 of v, shifted, xor the matrix when
 * v is odd. */
static uint32_t twist(uint32_t u, uint32_t v)
{
    uint32_t mix = (u & 0x80000000u) | (v & 0x7fffffffu);
    return (mix >> 1) ^ (v & 1u ? 0x9908b0dfu : 0u);
}

/* Regenerate all 624 words. */
static void refill(sd_torch_gen *g)
{
    uint32_t *s = g->state;
    int k = 0;
    for (; k < SD_MT_N - MT_M; k++) s[k] = s[k + MT_M] ^ twist(s[k], s[k + 1]);
    for (; k < SD_MT_N - 1; k++) s[k] = s[k + MT_M - SD_MT_N] ^ twist(s[k], s[k + 1]);
    s[k] = s[k + MT_M - SD_MT_N] ^ twist(s[k], s[0]);
    g->left = SD_MT_N;
    g->next = 0;
}

/* The next tempered word. */
uint32_t sd_torch_gen_u32(sd_torch_gen *g)
{
    if (--g->left == 0) refill(g);
    uint32_t y = g->state[g->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* uniform_real_distribution<float>(0, 1): 24 bits of one draw. */
static float uniform_f(sd_torch_gen *g)
{
    return (float)(sd_torch_gen_u32(g) & 0xffffffu) * (1.0f / 16777216.0f);
}

/* uniform_real_distribution<double>(0, 1): 53 bits of two draws (the
 * first is the high word). */
static double uniform_d(sd_torch_gen *g)
{
    uint64_t hi = sd_torch_gen_u32(g), lo = sd_torch_gen_u32(g);
    uint64_t v = (hi << 32) | lo;
    return (double)(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/* A float's bits and back. */
static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The Cephes single-precision natural log as torch's AVX2 kernel computes
 * it (log256_ps, with the multiply-adds the compiler fuses): the mantissa
 * brought to [sqrt(1/2), sqrt(2)), a degree-9 polynomial in x - 1, the
 * exponent's log2 added in two parts. x > 0 here (1 - a uniform in [0, 1)). */
static float cephes_logf(float x)
{
    if (x < 1.17549435e-38f) x = 1.17549435e-38f;
    uint32_t b = bits_of(x);
    float e = (float)((int32_t)(b >> 23) - 0x7f) + 1.0f;
    x = float_of((b & ~0x7f800000u) | bits_of(0.5f));
    float tmp = x < 0.707106781186547524f ? x : 0.0f;
    e = e - (x < 0.707106781186547524f ? 1.0f : 0.0f);
    x = (x - 1.0f) + tmp;
    float z = x * x;
    static const float p[9] = {7.0376836292E-2f, -1.1514610310E-1f, 1.1676998740E-1f, -1.2420140846E-1f,
                               1.4249322787E-1f, -1.6668057665E-1f, 2.0000714765E-1f, -2.4999993993E-1f,
                               3.3333331174E-1f};
    float y = p[0];
    for (int i = 1; i < 9; i++) y = fmaf(y, x, p[i]);
    y = y * x;
    y = fmaf(y, z, e * -2.12194440e-4f);
    y = fmaf(-z, 0.5f, y);
    x = x + y;
    return fmaf(e, 0.693359375f, x);
}

/* The Cephes single-precision sine and cosine as torch's AVX2 kernel
 * computes them (sincos256_ps): reduction by pi/4 in three parts, the
 * octant choosing the polynomial and the signs. */
static void cephes_sincosf(float x, float *s, float *c)
{
    int sign_sin = x < 0 || (x == 0 && signbit(x));
    x = fabsf(x);
    int j = (int32_t)(x * 1.27323954473516f);
    j = (j + 1) & ~1;
    float y = (float)j;
    int swap_sin = (j & 4) != 0, poly_sin = (j & 2) != 0;
    int sign_cos = ((~(j - 2)) & 4) != 0;
    x = fmaf(y, -0.78515625f, x);
    x = fmaf(y, -2.4187564849853515625e-4f, x);
    x = fmaf(y, -3.77489497744594108e-8f, x);
    float z = x * x;
    float yc = fmaf(2.443315711809948E-005f, z, -1.388731625493765E-003f);
    yc = fmaf(yc, z, 4.166664568298827E-002f);
    yc = yc * z;
    yc = fmaf(yc, z, -(z * 0.5f));
    yc = yc + 1.0f;
    float ys = fmaf(-1.9515295891E-4f, z, 8.3321608736E-3f);
    ys = fmaf(ys, z, -1.6666654611E-1f);
    ys = ys * z;
    ys = fmaf(ys, x, x);
    float rs = poly_sin ? yc : ys, rc = poly_sin ? ys : yc;
    *s = (sign_sin ^ swap_sin) ? -rs : rs;
    *c = sign_cos ? -rc : rc;
}

/* Box-Muller on 16 uniforms in place as torch's fp32 kernel does on x86
 * (NormalFill16 with AVX2, which CPUs with AVX-512 run too): radii from
 * the first 8, angles 2pi (in fp32) times the last 8, cos into the first
 * half and sin into the second. */
static void fill16(float *d)
{
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    for (int j = 0; j < 8; j++) {
        float u1 = 1.0f - d[j], u2 = d[j + 8];
        float radius = sqrtf(-2.0f * cephes_logf(u1));
        float sn, cs;
        cephes_sincosf(two_pi * u2, &sn, &cs);
        d[j] = radius * cs;
        d[j + 8] = radius * sn;
    }
}

/* normal_distribution<double>(0, 1): Box-Muller with the sin value kept
 * for the next call. */
static double normal_d(sd_torch_gen *g)
{
    if (g->has_cached) {
        g->has_cached = 0;
        return g->cached;
    }
    double u1 = uniform_d(g), u2 = uniform_d(g);
    double r = sqrt(-2.0 * log1p(-u2)), theta = 2.0 * 3.14159265358979323846 * u1;
    g->cached = r * sin(theta);
    g->has_cached = 1;
    return r * cos(theta);
}

/* torch's normal kernel for a contiguous fp32 tensor of n values. */
void sd_torch_randn(sd_torch_gen *g, float *out, size_t n)
{
    if (n < 16) {
        for (size_t i = 0; i < n; i++) out[i] = (float)(normal_d(g) * 1.0 + 0.0);
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = uniform_f(g);
    for (size_t i = 0; i + 16 <= n; i += 16) fill16(out + i);
    if (n % 16) {
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = uniform_f(g);
        fill16(tail);
    }
}

/* The sampler's noise source from a torch generator. */
sd_status sd_torch_randn_noise(void *ctx, float *out, size_t n, sd_error *err)
{
    (void)err;
    sd_torch_randn(ctx, out, n);
    return SD_OK;
}
