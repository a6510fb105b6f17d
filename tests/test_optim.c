/* AdamW with bf16 moments (sd_adamw_bf16_fwd, ops_math.h's sdm_bf16_sr):
 * stochastic rounding lands on one of the two neighbouring bf16 values and
 * is unbiased; NaN and infinities survive; one step matches the fp32 step
 * to a bf16 spacing; the moments track the fp32 ones over thousands of
 * steps where nearest rounding freezes the second moment; and the bits do
 * not depend on the thread count or on how the buffer is cut into slices
 * (ZeRO-1's segments), only on (key, global index); the per-element noise
 * that rounding leaves is bounded. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "f16.h"
#include "ops_cpu.h"
#include "ops_math.h"
#include "pool.h"

/* bf16 bits -> float, through the library's conversion. */
static float wide(uint16_t h) { return sd_bf16_to_f32(h); }

/* The two bf16 values around x (x itself twice when it is one). */
static void neighbours(float x, float *lo, float *hi)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t down = u & 0xffff0000u, up = down + ((u & 0xffffu) ? 0x10000u : 0);
    memcpy(lo, &down, 4);
    memcpy(hi, &up, 4);
}

/* Rounding x many times: every result a neighbour, the mean x. */
static void test_rounding(void)
{
    const float xs[] = {1.0f + 0.3f / 128, -3.7e-5f, 2.5e-30f, 1234.567f, -0.1f, 0.75f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        float x = xs[k], lo, hi;
        neighbours(x, &lo, &hi);
        double sum = 0;
        int bad = 0, ups = 0;
        const int n = 200000;
        for (int i = 0; i < n; i++) {
            float r = wide(sdm_bf16_sr(x, sdm_mix32(77u + (uint32_t)k, (uint64_t)i)));
            bad += r != lo && r != hi;
            ups += r == hi && hi != lo;
            sum += r;
        }
        CHECK(bad == 0);
        /* the mean within 5 standard errors of x: sd <= |hi - lo| / 2 */
        double se = fabs((double)hi - (double)lo) / 2 / sqrt((double)n);
        CHECK(fabs(sum / n - (double)x) <= 5 * se + 1e-12 * fabs(x));
        if (hi != lo) CHECK(ups > 0 && ups < n); /* both neighbours taken */
    }
    /* a bf16 value rounds to itself whatever the bits */
    for (uint32_t r = 0; r < 70000; r += 997) CHECK(sdm_bf16_sr(0.75f, r) == sd_f32_to_bf16(0.75f));
    /* NaN stays NaN (a payload only in the dropped bits too), infinities stay */
    uint32_t qnan_low = 0x7f800001u;
    float nan_low;
    memcpy(&nan_low, &qnan_low, 4);
    CHECK(isnan(wide(sdm_bf16_sr(nan_low, 0))) && isnan(wide(sdm_bf16_sr(NAN, 0xffff))));
    CHECK(wide(sdm_bf16_sr(INFINITY, 0xffff)) == INFINITY && wide(sdm_bf16_sr(-INFINITY, 0xffff)) == -INFINITY);
    /* the bits of the key and index matter: different keys, different streams */
    int same = 0;
    for (uint64_t i = 0; i < 1000; i++) same += sdm_mix32(1, i) == sdm_mix32(2, i);
    CHECK(same < 3);
}

/* Issue 28's measure for --weight-dtype bf16 (train_w16.c rounds each
 * updated weight with sdm_bf16_sr(x, sdm_mix32(key, index))): the mean of
 * 10^5 roundings of one value within 1% of its bf16 spacing, and the same
 * key giving the same bits (seeded; a resumed step rounds as the first
 * run did) while another key gives others. */
static void test_rounding_weights(void)
{
    const float xs[] = {0.0123f, -0.77f, 1.0f + 0.9f / 128, 3.1e-3f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        float x = xs[k], lo, hi;
        neighbours(x, &lo, &hi);
        double sum = 0;
        int same = 0, other = 0;
        const int n = 100000;
        for (int i = 0; i < n; i++) {
            uint16_t r = sdm_bf16_sr(x, sdm_mix32(0x5eed0000u + (uint32_t)k, (uint64_t)i));
            same += r == sdm_bf16_sr(x, sdm_mix32(0x5eed0000u + (uint32_t)k, (uint64_t)i));
            other += r != sdm_bf16_sr(x, sdm_mix32(0x0ddba11u + (uint32_t)k, (uint64_t)i));
            sum += wide(r);
        }
        double ulp = fabs((double)hi - (double)lo);
        CHECK(ulp > 0);
        CHECK(fabs(sum / n - (double)x) <= 0.01 * ulp);
        CHECK(same == n);
        CHECK(other > n / 10);
    }
}

/* Deterministic pseudo-random floats in [lo, hi). */
static void fill(float *x, size_t n, uint32_t seed, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)(sdm_mix32(seed, i) >> 8) / 16777216.0f;
}

static const sd_adamw_args args = {.decay = 0.9999f, .b1 = 0.9f, .b2 = 0.999f, .step_size = 1e-3f,
                                   .bc2_sqrt = 0.0447f, .eps = 1e-8f, .gscale = 0.7f, .sr_key = 12345u};

/* One step against the fp32 op from the same (bf16-exact) moments, and
 * the bits on 1 and 2 threads and in two slices. */
static void test_step(void)
{
    enum { N = 100003, CUT = 40000 };
    float *p32 = malloc(N * 4), *m32 = malloc(N * 4), *v32 = malloc(N * 4), *g = malloc(N * 4);
    float *p16[3];
    uint16_t *m16[3], *v16[3];
    for (int k = 0; k < 3; k++) {
        p16[k] = malloc(N * 4);
        m16[k] = malloc(N * 2);
        v16[k] = malloc(N * 2);
    }
    fill(p32, N, 1, -1, 1);
    fill(m32, N, 2, -0.1f, 0.1f);
    fill(v32, N, 3, 0, 0.01f);
    fill(g, N, 4, -1, 1);
    for (size_t i = 0; i < N; i++) {
        m32[i] = wide(sd_f32_to_bf16(m32[i]));
        v32[i] = wide(sd_f32_to_bf16(v32[i]));
        for (int k = 0; k < 3; k++) {
            p16[k][i] = p32[i];
            m16[k][i] = sd_f32_to_bf16(m32[i]);
            v16[k][i] = sd_f32_to_bf16(v32[i]);
        }
    }
    sd_adamw_fwd(NULL, &args, N, p32, m32, v32, g);
    sd_adamw_bf16_fwd(NULL, &args, N, 0, p16[0], m16[0], v16[0], g);
    sd_pool *pool = sd_pool_create(2);
    sd_adamw_bf16_fwd(pool, &args, N, 0, p16[1], m16[1], v16[1], g);
    sd_pool_destroy(pool);
    sd_adamw_bf16_fwd(NULL, &args, CUT, 0, p16[2], m16[2], v16[2], g);
    sd_adamw_bf16_fwd(NULL, &args, N - CUT, CUT, p16[2] + CUT, m16[2] + CUT, v16[2] + CUT, g + CUT);
    int p_same = 1, mv_close = 1;
    for (size_t i = 0; i < N; i++) {
        /* the weight update reads the fp32 moments before they are stored: exact */
        p_same &= p16[0][i] == p32[i];
        float mlo, mhi, vlo, vhi;
        neighbours(m32[i], &mlo, &mhi);
        neighbours(v32[i], &vlo, &vhi);
        float m = wide(m16[0][i]), v = wide(v16[0][i]);
        mv_close &= (m == mlo || m == mhi) && (v == vlo || v == vhi);
    }
    CHECK(p_same);
    CHECK(mv_close);
    for (int k = 1; k < 3; k++) {
        CHECK(memcmp(p16[0], p16[k], N * 4) == 0);
        CHECK(memcmp(m16[0], m16[k], N * 2) == 0);
        CHECK(memcmp(v16[0], v16[k], N * 2) == 0);
    }
    free(p32);
    free(m32);
    free(v32);
    free(g);
    for (int k = 0; k < 3; k++) {
        free(p16[k]);
        free(m16[k]);
        free(v16[k]);
    }
}

/* Thousands of steps with a steady gradient: v climbs towards g^2 by
 * 0.1% of the gap a step. With stochastic rounding the bf16 moments stay
 * within a percent of the fp32 ones on average; with nearest rounding
 * (computed here for contrast) v stops once a step moves it by less than
 * half a bf16 spacing, far below. */
static void test_tracking(void)
{
    enum { N = 4096, STEPS = 3000 };
    float *p32 = calloc(N, 4), *m32 = calloc(N, 4), *v32 = calloc(N, 4), *g = malloc(N * 4);
    float *p16 = calloc(N, 4), *pn = calloc(N, 4);
    uint16_t *m16 = calloc(N, 2), *v16 = calloc(N, 2), *mn = calloc(N, 2), *vn = calloc(N, 2);
    fill(g, N, 9, 0.5e-3f, 1.5e-3f);
    sd_adamw_args a = args;
    a.gscale = 1.0f;
    a.decay = 1.0f;
    for (int s = 1; s <= STEPS; s++) {
        a.sr_key = (uint32_t)s * 2654435761u;
        sd_adamw_fwd(NULL, &a, N, p32, m32, v32, g);
        sd_adamw_bf16_fwd(NULL, &a, N, 0, p16, m16, v16, g);
        for (size_t i = 0; i < N; i++) { /* nearest rounding: the same step, stored with RNE */
            float mm = wide(mn[i]), vv = wide(vn[i]);
            sdm_adamw(pn + i, &mm, &vv, g[i], a.decay, a.b1, a.b2, a.step_size, a.bc2_sqrt, a.eps);
            mn[i] = sd_f32_to_bf16(mm);
            vn[i] = sd_f32_to_bf16(vv);
        }
    }
    double v_sr = 0, v_rne = 0, v_ref = 0, m_sr = 0, m_ref = 0, v_dev = 0, m_dev = 0;
    for (size_t i = 0; i < N; i++) {
        v_ref += v32[i];
        v_sr += wide(v16[i]);
        v_rne += wide(vn[i]);
        m_ref += m32[i];
        m_sr += wide(m16[i]);
        v_dev += pow(wide(v16[i]) / v32[i] - 1, 2);
        m_dev += pow(wide(m16[i]) / m32[i] - 1, 2);
    }
    double rel_sr = fabs(v_sr / v_ref - 1), rel_rne = fabs(v_rne / v_ref - 1);
    /* each element: the rounding noise a store adds decays with beta, so it
     * adds up over about 1 / (1 - beta^2) steps: for v (beta2 0.999) a few
     * percent, for m (beta1 0.9) a fraction of one */
    v_dev = sqrt(v_dev / N);
    m_dev = sqrt(m_dev / N);
    printf("after %d steps, bf16 moments vs fp32: mean v: stochastic rounding %+.3f%%, nearest %+.3f%%; mean m "
           "%+.3f%%; per element (rms of the relative difference) v %.2f%%, m %.2f%%\n",
           STEPS, 100 * (v_sr / v_ref - 1), 100 * (v_rne / v_ref - 1), 100 * (m_sr / m_ref - 1), 100 * v_dev,
           100 * m_dev);
    CHECK(rel_sr < 0.01);
    CHECK(fabs(m_sr / m_ref - 1) < 0.01);
    CHECK(v_dev < 0.1 && m_dev < 0.01);
    CHECK(rel_rne > 0.1); /* the failure stochastic rounding is there to avoid */
    free(p32);
    free(m32);
    free(v32);
    free(g);
    free(p16);
    free(pn);
    free(m16);
    free(v16);
    free(mn);
    free(vn);
}

/* The ops' loops (vectorised, AVX2 where the CPU has it, split over a
 * pool) against the scalar formulas one element at a time: the same bits,
 * for AdamW with fp32 and with bf16 moments and for the EMA. */
static void test_vector_loops(void)
{
    enum { N = 30011 };
    float *p = malloc(N * 4), *m = malloc(N * 4), *v = malloc(N * 4), *g = malloc(N * 4), *e = malloc(N * 4);
    float *p1 = malloc(N * 4), *m1 = malloc(N * 4), *v1 = malloc(N * 4), *e1 = malloc(N * 4);
    uint16_t *mh = malloc(N * 2), *vh = malloc(N * 2), *mh1 = malloc(N * 2), *vh1 = malloc(N * 2);
    fill(p, N, 11, -1, 1);
    fill(m, N, 12, -0.1f, 0.1f);
    fill(v, N, 13, 0, 0.01f);
    fill(g, N, 14, -1, 1);
    fill(e, N, 15, -1, 1);
    v[5] = 0; /* sqrt(0): eps alone */
    g[6] = NAN; /* a NaN gradient spreads the same way */
    for (size_t i = 0; i < N; i++) {
        mh[i] = mh1[i] = sd_f32_to_bf16(m[i]);
        vh[i] = vh1[i] = sd_f32_to_bf16(v[i]);
    }
    memcpy(p1, p, N * 4);
    memcpy(m1, m, N * 4);
    memcpy(v1, v, N * 4);
    memcpy(e1, e, N * 4);
    sd_pool *pool = sd_pool_create(2);
    /* the gradient norm's sum over 3 chunks of 65536 and a short one: the
     * same on 1, 2 and 3 threads, close to an exact sum */
    {
        size_t ns = 3 * 65536 + 5;
        float *x = malloc(ns * sizeof(float));
        fill(x, ns, 16, -1, 1);
        long double ref = 0;
        for (size_t i = 0; i < ns; i++) ref += (long double)x[i] * x[i];
        sd_pool *p3 = sd_pool_create(3);
        double s1 = sd_sum_squares(NULL, ns, x), s2 = sd_sum_squares(pool, ns, x), s3 = sd_sum_squares(p3, ns, x);
        CHECK(s1 == s2 && s1 == s3 && fabsl((long double)s1 - ref) <= 1e-13L * ref);
        x[ns - 1] = 1e3f; /* the short last chunk counts */
        CHECK(sd_sum_squares(pool, ns, x) > s1 + 9.9e5);
        sd_pool_destroy(p3);
        free(x);
    }
    sd_adamw_fwd(pool, &args, N, p, m, v, g);
    sd_ema_fwd(pool, N, e, p, 0.01f);
    for (size_t i = 0; i < N; i++) {
        sdm_adamw(p1 + i, m1 + i, v1 + i, g[i] * args.gscale, args.decay, args.b1, args.b2, args.step_size,
                  args.bc2_sqrt, args.eps);
        e1[i] = sdm_ema(e1[i], p1[i], 0.01f);
    }
    CHECK(memcmp(p, p1, N * 4) == 0 && memcmp(m, m1, N * 4) == 0 && memcmp(v, v1, N * 4) == 0);
    CHECK(memcmp(e, e1, N * 4) == 0);
    memcpy(p, p1, N * 4);
    sd_adamw_bf16_fwd(pool, &args, N, 3, p, mh, vh, g);
    for (size_t i = 0; i < N; i++)
        sdm_adamw_bf16(p1 + i, mh1 + i, vh1 + i, g[i] * args.gscale, args.decay, args.b1, args.b2, args.step_size,
                       args.bc2_sqrt, args.eps, sdm_mix32(args.sr_key, 3 + i));
    CHECK(memcmp(p, p1, N * 4) == 0 && memcmp(mh, mh1, N * 2) == 0 && memcmp(vh, vh1, N * 2) == 0);
    sd_pool_destroy(pool);
    float *all[] = {p, m, v, g, e, p1, m1, v1, e1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(mh);
    free(vh);
    free(mh1);
    free(vh1);
}

int main(void)
{
    test_vector_loops();
    test_rounding();
    test_rounding_weights();
    test_step();
    test_tracking();
    return check_done("test_optim");
}
