/* The softmax's exponentials 8 floats at a time with AVX2: the same
 * operations in the same order as sd_vexpf (vexp.h), so the same bits, on
 * CPUs that have AVX2 (callers check sd_vexp_avx2_usable first). The
 * portable loop only vectorises 4 wide (SSE2 is all an
 * x86-64 build may assume), and the attention forward spends half its time
 * there at the UNet's 40-wide heads. No FMA: a fused multiply-add rounds
 * once where sd_vexpf rounds twice. */
#include "vexp_avx2.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

/* Whether this CPU runs sd_vexp_shift_avx2. */
int sd_vexp_avx2_usable(void)
{
    return __builtin_cpu_supports("avx2");
}

/* e^x for 8 lanes, step for step as sd_vexpf. */
__attribute__((target("avx2"), always_inline)) static inline __m256 vexp8(__m256 x)
{
    __m256 c = _mm256_max_ps(x, _mm256_set1_ps(-87.0f)); /* x > -87 ? x : -87 (NaN -> -87) */
    c = _mm256_min_ps(c, _mm256_set1_ps(88.0f));         /* c < 88 ? c : 88 */
    __m256 shift = _mm256_set1_ps(12582912.0f);
    __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504f)), shift), shift);
    __m256 r = _mm256_sub_ps(c, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
    r = _mm256_add_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
    static const float coef[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    for (int i = 0; i < 7; i++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(coef[i]));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(y, x, nan);
}

/* x[j] = e^(x[j] - m) for j < n. */
__attribute__((target("avx2"))) void sd_vexp_shift_avx2(int n, float *x, float m)
{
    __m256 mv = _mm256_set1_ps(m);
    int j = 0;
    for (; j + 16 <= n; j += 16) { /* two independent chains in flight */
        __m256 a = vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
        __m256 b = vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), mv));
        _mm256_storeu_ps(x + j, a);
        _mm256_storeu_ps(x + j + 8, b);
    }
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    if (j < n) { /* the last 1..7 through a padded lane buffer */
        float t[8] = {0};
        memcpy(t, x + j, (size_t)(n - j) * sizeof(float));
        _mm256_storeu_ps(t, vexp8(_mm256_sub_ps(_mm256_loadu_ps(t), mv)));
        memcpy(x + j, t, (size_t)(n - j) * sizeof(float));
    }
}

#else

/* Not an x86-64 GCC-compatible build: never usable. */
int sd_vexp_avx2_usable(void)
{
    return 0;
}

/* Unreachable (sd_vexp_avx2_usable is 0); kept so callers link. */
void sd_vexp_shift_avx2(int n, float *x, float m)
{
    (void)n;
    (void)x;
    (void)m;
}

#endif
