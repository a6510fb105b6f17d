/* The softmax's passes 16 floats at a time with AVX-512F: the
 * exponentials as sd_vexpf computes them (the same operations in the same
 * order, no FMA, so the same bits as vexp.h and vexp_avx2.c), with the
 * row sum fused in, and the scores' scaling fused with the row maximum.
 * Sums and maxima keep the portable loops' 8 interleaved partials in the
 * same order, so the attention output does not depend on the CPU.
 * Compiled by target attributes; callers check sd_vexp_avx512_usable. */
#include "vexp_avx512.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "vexp.h"

/* Whether this CPU runs the AVX-512F passes. */
int sd_vexp_avx512_usable(void)
{
    return __builtin_cpu_supports("avx512f");
}

/* e^x for 16 lanes, step for step as sd_vexpf. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 vexp16(__m512 x)
{
    __m512 c = _mm512_max_ps(x, _mm512_set1_ps(-87.0f)); /* x > -87 ? x : -87 (NaN -> -87) */
    c = _mm512_min_ps(c, _mm512_set1_ps(88.0f));         /* c < 88 ? c : 88 */
    __m512 shift = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504f)), shift), shift);
    __m512 r = _mm512_sub_ps(c, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_add_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(2.12194440e-4f)));
    static const float coef[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    for (int i = 0; i < 7; i++) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(coef[i]));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(nan, y, x);
}

/* Lanes 8..15 as a ymm (by the AVX-512F 64-bit extract: no AVX-512DQ). */
__attribute__((target("avx512f"), always_inline)) static inline __m256 upper(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* Lanes [0, n) of a 16-float block, n < 16. */
static inline __mmask16 lanes(int n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* x[j] = e^(x[j] - m) for j < n; the tail through masked loads. */
__attribute__((target("avx512f"))) void sd_vexp_shift_avx512(int n, float *x, float m)
{
    __m512 mv = _mm512_set1_ps(m);
    int j = 0;
    for (; j + 32 <= n; j += 32) { /* two independent chains in flight */
        __m512 a = vexp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
        __m512 b = vexp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), mv));
        _mm512_storeu_ps(x + j, a);
        _mm512_storeu_ps(x + j + 16, b);
    }
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, vexp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv)));
    if (j < n) {
        __mmask16 k = lanes(n - j);
        _mm512_mask_storeu_ps(x + j, k, vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mv)));
    }
}

/* The 8 partials of the portable loop: a ymm whose lane l gains the
 * 8-float groups' lane l in order; the last partial group (under 8)
 * lane by lane after them, then the portable loop's final pairing. */
__attribute__((target("avx512f"))) float sd_vexp_shift_sum_avx512(int n, float *x, float m)
{
    __m512 mv = _mm512_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = vexp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
        _mm512_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
        acc = _mm256_add_ps(acc, upper(e));
    }
    if (j < n) {
        __mmask16 k = lanes(n - j);
        __m512 e = vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mv));
        _mm512_mask_storeu_ps(x + j, k, e);
        if (n - j >= 8) {
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
            j += 8;
        }
    }
    float s[8];
    _mm256_storeu_ps(s, acc);
    for (int l = 0; j + l < n; l++) s[l] += x[j + l];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* The same partial maxima as the portable row_max: max_ps(x, mx) is
 * x > mx ? x : mx lane by lane. */
__attribute__((target("avx512f"))) float sd_scale_max_avx512(int n, float *x, float scale, float m)
{
    __m512 sv = _mm512_set1_ps(scale);
    __m256 mx = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), sv);
        _mm512_storeu_ps(x + j, v);
        mx = _mm256_max_ps(_mm512_castps512_ps256(v), mx);
        mx = _mm256_max_ps(upper(v), mx);
    }
    if (j < n) {
        __mmask16 k = lanes(n - j);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), sv);
        _mm512_mask_storeu_ps(x + j, k, v);
        if (n - j >= 8) {
            mx = _mm256_max_ps(_mm512_castps512_ps256(v), mx);
            j += 8;
        }
    }
    float r[8];
    _mm256_storeu_ps(r, mx);
    for (; j < n; j++) r[0] = x[j] > r[0] ? x[j] : r[0];
    for (int l = 1; l < 8; l++) r[0] = r[l] > r[0] ? r[l] : r[0];
    return r[0];
}

#else

/* Not an x86-64 GCC-compatible build: never usable. */
int sd_vexp_avx512_usable(void)
{
    return 0;
}

/* Unreachable (sd_vexp_avx512_usable is 0); kept so callers link. */
void sd_vexp_shift_avx512(int n, float *x, float m)
{
    (void)n;
    (void)x;
    (void)m;
}

/* Unreachable; kept so callers link. */
float sd_vexp_shift_sum_avx512(int n, float *x, float m)
{
    (void)n;
    (void)x;
    return m;
}

/* Unreachable; kept so callers link. */
float sd_scale_max_avx512(int n, float *x, float scale, float m)
{
    (void)n;
    (void)x;
    (void)scale;
    return m;
}

#endif
