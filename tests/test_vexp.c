/* The softmax exponentials: the AVX2 path (vexp_avx2.c) gives exactly the
 * bits of the portable sd_vexpf (vexp.h) for every length's tail, a sweep
 * of arguments around the clamps, and the special values; sd_vexpf itself
 * stays within 2e-7 of exp in double where it is meant to be accurate. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "vexp.h"
#include "vexp_avx2.h"

/* Bits of a float, so NaN compares equal to itself. */
static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* n values from lo to hi, shifted by m through both paths: same bits. */
static int same_sweep(int n, float lo, float hi, float m)
{
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    if (!CHECK(a && b)) {
        free(a), free(b);
        return 0;
    }
    for (int i = 0; i < n; i++) a[i] = lo + (hi - lo) * (float)i / (float)(n > 1 ? n - 1 : 1);
    memcpy(b, a, (size_t)n * sizeof(float));
    sd_vexp_shift_avx2(n, a, m);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += bits(a[i]) != bits(sd_vexpf(b[i] - m));
    free(a), free(b);
    return bad == 0;
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
