/* The AVX2+FMA micro-kernel of gemm_rows.c: a 6 x 16 tile of y in 12 ymm
 * accumulators; per k step two aligned loads of the packed panel, six
 * broadcasts of x and twelve vfmadd231ps, each lane one element's
 * sequential chain. Compiled for AVX2 by a target attribute, not by a
 * build flag, so the rest of the engine stays plain x86-64 code and the
 * kernel is only called after a run-time CPU check. */
#include "f16.h"
#include "gemm_rows_kern.h"
#include "transpose8.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* The build has the kernel (gemm_rows.c still checks the CPU). */
int sd_gemm_rows_have_avx2(void)
{
    return 1;
}

/* c[6][16] = (init, or c itself when init is NULL) + a[6][0..kc) .
 * bp[0..kc)[16], lane by lane in p order: the tile stays in registers for
 * the whole k block, so y is written once per block and read only from
 * the second block on. */
__attribute__((target("avx2,fma"))) void sd_gemm_rows_kern_avx2(int kc, const float *const *a, const float *bp,
                                                                 const float *init, float *c, size_t ldc)
{
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    float *c0 = c, *c1 = c + ldc, *c2 = c + 2 * ldc, *c3 = c + 3 * ldc, *c4 = c + 4 * ldc, *c5 = c + 5 * ldc;
    __m256 y00, y01, y10, y11, y20, y21, y30, y31, y40, y41, y50, y51;
    if (init) {
        y00 = y10 = y20 = y30 = y40 = y50 = _mm256_loadu_ps(init);
        y01 = y11 = y21 = y31 = y41 = y51 = _mm256_loadu_ps(init + 8);
    } else {
        y00 = _mm256_loadu_ps(c0);
        y01 = _mm256_loadu_ps(c0 + 8);
        y10 = _mm256_loadu_ps(c1);
        y11 = _mm256_loadu_ps(c1 + 8);
        y20 = _mm256_loadu_ps(c2);
        y21 = _mm256_loadu_ps(c2 + 8);
        y30 = _mm256_loadu_ps(c3);
        y31 = _mm256_loadu_ps(c3 + 8);
        y40 = _mm256_loadu_ps(c4);
        y41 = _mm256_loadu_ps(c4 + 8);
        y50 = _mm256_loadu_ps(c5);
        y51 = _mm256_loadu_ps(c5 + 8);
    }
    /* unrolled 4 times: the loop counter and branch otherwise cost ~20% (measured) */
#pragma GCC unroll 4
    for (int p = 0; p < kc; p++) {
        __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8), x;
        bp += 16;
        x = _mm256_broadcast_ss(a0 + p);
        y00 = _mm256_fmadd_ps(x, b0, y00);
        y01 = _mm256_fmadd_ps(x, b1, y01);
        x = _mm256_broadcast_ss(a1 + p);
        y10 = _mm256_fmadd_ps(x, b0, y10);
        y11 = _mm256_fmadd_ps(x, b1, y11);
        x = _mm256_broadcast_ss(a2 + p);
        y20 = _mm256_fmadd_ps(x, b0, y20);
        y21 = _mm256_fmadd_ps(x, b1, y21);
        x = _mm256_broadcast_ss(a3 + p);
        y30 = _mm256_fmadd_ps(x, b0, y30);
        y31 = _mm256_fmadd_ps(x, b1, y31);
        x = _mm256_broadcast_ss(a4 + p);
        y40 = _mm256_fmadd_ps(x, b0, y40);
        y41 = _mm256_fmadd_ps(x, b1, y41);
        x = _mm256_broadcast_ss(a5 + p);
        y50 = _mm256_fmadd_ps(x, b0, y50);
        y51 = _mm256_fmadd_ps(x, b1, y51);
    }
    _mm256_storeu_ps(c0, y00);
    _mm256_storeu_ps(c0 + 8, y01);
    _mm256_storeu_ps(c1, y10);
    _mm256_storeu_ps(c1 + 8, y11);
    _mm256_storeu_ps(c2, y20);
    _mm256_storeu_ps(c2 + 8, y21);
    _mm256_storeu_ps(c3, y30);
    _mm256_storeu_ps(c3 + 8, y31);
    _mm256_storeu_ps(c4, y40);
    _mm256_storeu_ps(c4 + 8, y41);
    _mm256_storeu_ps(c5, y50);
    _mm256_storeu_ps(c5 + 8, y51);
}

/* A full 16-column panel's steps in groups of 8 (see gemm_rows_kern.h):
 * two 8 x 8 transposes per group, one per half of the panel; meanwhile
 * the lines of the next panel's rows (next_rows of them at next) are asked
 * for, as 16 short row streams at once defeat the hardware prefetcher and
 * the pack then waits on DRAM. */
int sd_gemm_rows_pack_avx2(float *dst, const float *w, size_t ldw, int kc, const float *next, int next_rows)
{
    int kc8 = kc & ~7;
    for (int p = 0; p < kc8; p += 8) {
        if (p % 16 == 0)
            for (int j = 0; j < next_rows; j++) __builtin_prefetch(next + (size_t)j * ldw + (size_t)p);
        sd_transpose8_avx2(dst + (size_t)p * 16, 16, w + (size_t)p, ldw);
        sd_transpose8_avx2(dst + (size_t)p * 16 + 8, 16, w + 8 * ldw + (size_t)p, ldw);
    }
    return kc8;
}

/* fp16 to float, 8 at a time by vcvtph2ps (exact), the rest one by one. */
__attribute__((target("avx2,f16c"))) void sd_gemm_rows_widen_f16_avx2(float *dst, const uint16_t *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = sd_f16_to_f32(src[i]);
}

/* bf16 to float, 8 at a time: the 16 bits become the top half (exact). */
__attribute__((target("avx2"))) void sd_gemm_rows_widen_bf16_avx2(float *dst, const uint16_t *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; i++) dst[i] = sd_bf16_to_f32(src[i]);
}

#else

/* Not an x86 build: no AVX2 kernel. */
int sd_gemm_rows_have_avx2(void)
{
    return 0;
}

/* Never called (sd_gemm_rows_best_isa never chooses it); runs the
 * portable kernel so a wrong call still gives the right bits. */
void sd_gemm_rows_kern_avx2(int kc, const float *const *a, const float *bp, const float *init, float *c,
                            size_t ldc)
{
    sd_gemm_rows_kern_c(kc, a, bp, init, c, ldc);
}

/* Never called without AVX2; the scalar conversion, the same values. */
void sd_gemm_rows_widen_f16_avx2(float *dst, const uint16_t *src, int n)
{
    for (int i = 0; i < n; i++) dst[i] = sd_f16_to_f32(src[i]);
}

/* Never called without AVX2; the scalar conversion, the same values. */
void sd_gemm_rows_widen_bf16_avx2(float *dst, const uint16_t *src, int n)
{
    for (int i = 0; i < n; i++) dst[i] = sd_bf16_to_f32(src[i]);
}

/* Never called without AVX2; packs nothing, so the caller copies all. */
int sd_gemm_rows_pack_avx2(float *dst, const float *w, size_t ldw, int kc, const float *next, int next_rows)
{
    (void)next;
    (void)next_rows;
    (void)dst;
    (void)w;
    (void)ldw;
    (void)kc;
    return 0;
}

#endif
