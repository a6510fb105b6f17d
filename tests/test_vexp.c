/* The softmax exponentials: the AVX2 and AVX-512 paths (vexp_avx2.c,
 * vexp_avx512.c) give exactly the bits of the portable sd_vexpf (vexp.h)
 * for every length's tail, a sweep of arguments around the clamps, and the
 * special values; the AVX-512 row sum and the scale-and-maximum pass give
 * the bits of the portable loops' 8 interleaved partials (ops_attn.c);
 * sd_vexpf itself stays within 2e-7 of exp in double where it is meant to
 * be accurate. A path the CPU lacks is skipped with a message. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vexp.h"
#include "vexp_avx2.h"
#include "vexp_avx512.h"

/* Bits of a float, so NaN compares equal to itself. */
static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* n values from lo to hi, shifted by m through the portable path and
 * the AVX2 (wide 0) or AVX-512 one (wide 1): same bits. */
static int same_sweep_on(int wide, int n, float lo, float hi, float m)
{
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    if (!CHECK(a && b)) {
        free(a), free(b);
        return 0;
    }
    for (int i = 0; i < n; i++) a[i] = lo + (hi - lo) * (float)i / (float)(n > 1 ? n - 1 : 1);
    memcpy(b, a, (size_t)n * sizeof(float));
    if (wide) sd_vexp_shift_avx512(n, a, m);
    else sd_vexp_shift_avx2(n, a, m);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += bits(a[i]) != bits(sd_vexpf(b[i] - m));
    free(a), free(b);
    return bad == 0;
}

/* The AVX2 path. */
static int same_sweep(int n, float lo, float hi, float m)
{
    return same_sweep_on(0, n, lo, hi, m);
}

/* The portable softmax sum of ops_attn.c: lane l of 8 gains x[l], x[l + 8],
 * ... in order, then the fixed pairing. */
static float sum8(int n, const float *x)
{
    float acc[8] = {0};
    for (int j = 0; j < n; j++) acc[j & 7] += x[j];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* The portable row maximum of ops_attn.c: 8 interleaved partials over the
 * full 8-groups, the tail into partial 0, then partials 1..7 into 0. */
static float max8(int n, const float *x, float m)
{
    float mx[8] = {m, m, m, m, m, m, m, m};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) mx[l] = x[j + l] > mx[l] ? x[j + l] : mx[l];
    for (; j < n; j++) mx[0] = x[j] > mx[0] ? x[j] : mx[0];
    for (int l = 1; l < 8; l++) mx[0] = mx[l] > mx[0] ? mx[l] : mx[0];
    return mx[0];
}

/* The AVX-512 exp-and-sum and scale-and-max passes against the portable
 * loops on n values of mixed magnitude (so the summation order shows in
 * the bits); the maximum also with a NaN and signed zeros in the row. */
static int same_row_passes(int n)
{
    float *x = malloc((size_t)n * sizeof(float) + 1), *y = malloc((size_t)n * sizeof(float) + 1);
    if (!CHECK(x && y)) {
        free(x), free(y);
        return 0;
    }
    unsigned s = (unsigned)n * 2654435761u + 1u;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 8388608.0f - 1.0f) * (i % 3 == 0 ? 9.0f : 1.0f);
    }
    int ok = 1;
    if (n > 32) { /* a NaN (never the maximum) where lane 0 of a ymm half meets it, signed zeros */
        float keep = x[24];
        x[24] = NAN, x[5] = -0.0f, x[6] = 0.0f;
        memcpy(y, x, (size_t)n * sizeof(float));
        float mw = sd_scale_max_avx512(n, x, 0.5f, -INFINITY);
        for (int i = 0; i < n; i++) y[i] *= 0.5f;
        ok &= bits(mw) == bits(max8(n, y, -INFINITY)) && !isnan(mw);
        x[24] = keep;
    }
    memcpy(y, x, (size_t)n * sizeof(float));
    float mw = sd_scale_max_avx512(n, x, 0.158113883f, -INFINITY);
    for (int i = 0; i < n; i++) y[i] *= 0.158113883f;
    float mp = max8(n, y, -INFINITY);
    ok &= bits(mw) == bits(mp) && memcmp(x, y, (size_t)n * sizeof(float)) == 0;
    float sw = sd_vexp_shift_sum_avx512(n, x, mp);
    for (int i = 0; i < n; i++) y[i] = sd_vexpf(y[i] - mp);
    ok &= bits(sw) == bits(sum8(n, y));
    for (int i = 0; i < n; i++) ok &= bits(x[i]) == bits(y[i]);
    free(x), free(y);
    if (!ok) fprintf(stderr, "  AVX-512 row passes differ at n = %d\n", n);
    return ok;
}

/* The AVX-512 passes where the CPU has them. */
static void check_avx512(void)
{
    if (!sd_vexp_avx512_usable()) {
        printf("SKIP: no AVX-512F on this CPU: the AVX-512 softmax passes are not checked here\n");
        return;
    }
    for (int n = 0; n <= 40; n++) CHECK(same_sweep_on(1, n, -3.0f, 1.0f, 0.25f));
    CHECK(same_sweep_on(1, 100003, -120.0f, 100.0f, 0.0f));
    CHECK(same_sweep_on(1, 4099, -1e-3f, 1e-3f, -0.5f));
    float sp[11] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -87.0f, 88.0f, -87.5f, 88.5f, 1e-30f, -FLT_MAX};
    float t[11];
    memcpy(t, sp, sizeof sp);
    sd_vexp_shift_avx512(11, t, 0.0f);
    for (int i = 0; i < 11; i++) CHECK(bits(t[i]) == bits(sd_vexpf(sp[i])));
    static const int lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 77, 512, 4099};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) CHECK(same_row_passes(lens[i]));
    printf("AVX-512 exponentials, row sums and row maxima checked bit for bit against the portable loops\n");
}

int main(void)
{
    /* accuracy of the portable polynomial on the softmax's range */
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = -80.0f + 88.0f * (float)i / 200000.0f;
        double e = fabs((double)sd_vexpf(x) - exp((double)x)) / exp((double)x);
        if (e > worst) worst = e;
    }
    printf("sd_vexpf on [-80, 8]: max relative error %.2e\n", worst);
    CHECK(worst < 2e-7);
    CHECK(isnan(sd_vexpf(NAN)) && sd_vexpf(-INFINITY) >= 0.0f && sd_vexpf(-INFINITY) < 1e-37f);
    check_avx512();
    if (!sd_vexp_avx2_usable()) {
        printf("no AVX2 on this CPU: only the portable path runs here\n");
        return check_done("test_vexp");
    }
    /* every tail length 0..17, a wide sweep through both clamps, one shift */
    for (int n = 0; n <= 17; n++) CHECK(same_sweep(n, -3.0f, 1.0f, 0.25f));
    CHECK(same_sweep(100003, -120.0f, 100.0f, 0.0f));
    CHECK(same_sweep(4099, -1e-3f, 1e-3f, -0.5f));
    float sp[11] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -87.0f, 88.0f, -87.5f, 88.5f, 1e-30f, -FLT_MAX};
    float t[11];
    memcpy(t, sp, sizeof sp);
    sd_vexp_shift_avx2(11, t, 0.0f);
    for (int i = 0; i < 11; i++)
        if (!CHECK(bits(t[i]) == bits(sd_vexpf(sp[i])))) fprintf(stderr, "special value %d: %g\n", i, (double)sp[i]);
    return check_done("test_vexp");
}
