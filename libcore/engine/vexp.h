/* e^x in plain float arithmetic, no libm call, so loops over it vectorise
 * (build the caller with -O3 -fno-trapping-math). CPU-only: the CUDA
 * kernels keep expf. */
#ifndef SDTK_VEXP_H
#define SDTK_VEXP_H

#include <stdint.h>
#include <string.h>

/* x = n ln2 + r (n = round(x / ln2) by the 1.5 * 2^23 shift, ln2 split in
 * an exact head 355/512 and a tail so r is exact to ~1 ulp), e^r by its
 * Taylor polynomial to r^7 (|r| <= ln2 / 2: truncation < 6e-9), 2^n built
 * in the exponent field. x is clamped to [-87, 88] first so 2^n is a
 * normal float (below -87 the result is 1.6e-38 instead of smaller);
 * relative error about 1e-7; NaN stays NaN. */
static inline float sd_vexpf(float x)
{
    float c = x > -87.0f ? x : -87.0f;
    c = c < 88.0f ? c : 88.0f;
    float n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x == x ? p * two_n : x;
}

#endif
