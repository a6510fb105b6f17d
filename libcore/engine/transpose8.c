/* The 8 x 8 transpose of transpose8.h: eight row loads, three rounds of
 * shuffles (pairs of rows, pairs of pairs, 128-bit halves), eight stores.
 * Compiled for AVX2 by a target attribute, called only after a run-time
 * check. */
#include "transpose8.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* AVX2 on this CPU (the build always has the code on x86). */
int sd_transpose8_ok(void)
{
    return __builtin_cpu_supports("avx2");
}

/* See transpose8.h. */
__attribute__((target("avx2"))) void sd_transpose8_avx2(float *dst, size_t ldd, const float *src, size_t lds)
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds), r2 = _mm256_loadu_ps(src + 2 * lds);
    __m256 r3 = _mm256_loadu_ps(src + 3 * lds), r4 = _mm256_loadu_ps(src + 4 * lds);
    __m256 r5 = _mm256_loadu_ps(src + 5 * lds), r6 = _mm256_loadu_ps(src + 6 * lds);
    __m256 r7 = _mm256_loadu_ps(src + 7 * lds);
    __m256 u0 = _mm256_unpacklo_ps(r0, r1), u1 = _mm256_unpackhi_ps(r0, r1);
    __m256 u2 = _mm256_unpacklo_ps(r2, r3), u3 = _mm256_unpackhi_ps(r2, r3);
    __m256 u4 = _mm256_unpacklo_ps(r4, r5), u5 = _mm256_unpackhi_ps(r4, r5);
    __m256 u6 = _mm256_unpacklo_ps(r6, r7), u7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(u0, u2, 0x44), s1 = _mm256_shuffle_ps(u0, u2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(u1, u3, 0x44), s3 = _mm256_shuffle_ps(u1, u3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(u4, u6, 0x44), s5 = _mm256_shuffle_ps(u4, u6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(u5, u7, 0x44), s7 = _mm256_shuffle_ps(u5, u7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
}

#else

/* Not an x86 build: never usable. */
int sd_transpose8_ok(void)
{
    return 0;
}

/* Never called (sd_transpose8_ok is 0); the plain copy, to be safe. */
void sd_transpose8_avx2(float *dst, size_t ldd, const float *src, size_t lds)
{
    for (size_t r = 0; r < 8; r++)
        for (size_t c = 0; c < 8; c++) dst[c * ldd + r] = src[r * lds + c];
}

#endif
