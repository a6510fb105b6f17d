/* The AVX-512 micro-kernels of gemm_rows.c: a 6 x 32 (or 6 x 48) tile of
 * y over two (three) adjacent 16-column packed panels (the same panels the
 * AVX2 kernel reads), in 12 (18) zmm accumulators, the last panel's
 * columns masked where n ends inside it; per k step one load from each
 * panel, six broadcasts of x and 12 (18) vfmadd231ps, each lane one element's
 * sequential chain, so every element gets the bits of the AVX2 and
 * portable kernels. Twice the AVX2 kernel's work per instruction on CPUs
 * with two 512-bit FMA units. Compiled by a target attribute, not a build
 * flag, and called only after a run-time CPU check. */
#include "gemm_rows_kern.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The build has the kernel (gemm_rows.c still checks the CPU). */
int sd_gemm_rows_have_avx512(void)
{
    return 1;
}

/* c[6][16 np] = (init, or c itself when init is NULL) + a[6][0..kc) .
 * bp[q][0..kc)[16] for the np panels q, lane by lane in p order; the tile
 * stays in registers for the whole k block. Only the first `last` columns
 * of the last panel are real: the rest are neither read from c or init
 * nor written (masked), and their lanes never mix with the real ones.
 * np is a constant at each call and every small loop is unrolled, so the
 * arrays become registers. */
__attribute__((target("avx512f"), always_inline)) static inline void tile(int np, int kc, const float *const *a,
                                                                            const float *const *bp, int last,
                                                                            const float *init, float *c, size_t ldc)
{
    __mmask16 km[3];
#pragma GCC unroll 3
    for (int q = 0; q < np; q++) km[q] = q == np - 1 ? (__mmask16)((1u << last) - 1u) : (__mmask16)0xffff;
    __m512 y[6][3];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
#pragma GCC unroll 3
        for (int q = 0; q < np; q++)
            y[r][q] = _mm512_maskz_loadu_ps(km[q], (init ? init : c + (size_t)r * ldc) + 16 * q);
#pragma GCC unroll 4
    for (int p = 0; p < kc; p++) {
        __m512 b[3];
#pragma GCC unroll 3
        for (int q = 0; q < np; q++) b[q] = _mm512_loadu_ps(bp[q] + (size_t)p * 16);
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            __m512 x = _mm512_set1_ps(a[r][p]);
#pragma GCC unroll 3
            for (int q = 0; q < np; q++) y[r][q] = _mm512_fmadd_ps(x, b[q], y[r][q]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++)
#pragma GCC unroll 3
        for (int q = 0; q < np; q++) _mm512_mask_storeu_ps(c + (size_t)r * ldc + 16 * q, km[q], y[r][q]);
}

/* The 6 x 32 and 6 x 48 tiles (np 2 or 3; see gemm_rows_kern.h). */
__attribute__((target("avx512f"))) void sd_gemm_rows_kern_avx512(int np, int kc, const float *const *a,
                                                                  const float *bp, int last, const float *init,
                                                                  float *c, size_t ldc)
{
    const float *panels[3] = {bp, bp + (size_t)kc * 16, bp + (size_t)kc * 32};
    if (np == 3) tile(3, kc, a, panels, last, init, c, ldc);
    else tile(2, kc, a, panels, last, init, c, ldc);
}

#else

/* Not an x86-64 GCC-compatible build: no AVX-512 kernel. */
int sd_gemm_rows_have_avx512(void)
{
    return 0;
}

/* Never called (sd_gemm_rows_best_isa never chooses it). */
void sd_gemm_rows_kern_avx512(int np, int kc, const float *const *a, const float *bp, int last, const float *init,
                              float *c, size_t ldc)
{
    (void)np;
    (void)kc;
    (void)a;
    (void)bp;
    (void)last;
    (void)init;
    (void)c;
    (void)ldc;
}

#endif
