/* The AVX-512 micro-kernel of gemm_rows.c: a 6 x 32 tile of y over two
 * adjacent 16-column packed panels (the same panels the AVX2 kernel
 * reads), in 12 zmm accumulators; per k step one load from each panel,
 * six broadcasts of x and twelve vfmadd231ps, each lane one element's
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

/* c[6][32] = (init[0..32), or c itself when init is NULL) + a[6][0..kc) .
 * [bp0 | bp1][0..kc)[16], lane by lane in p order; the tile stays in
 * registers for the whole k block. */
__attribute__((target("avx512f"))) void sd_gemm_rows_kern_avx512(int kc, const float *const *a, const float *bp0,
                                                                  const float *bp1, const float *init, float *c,
                                                                  size_t ldc)
{
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    float *c0 = c, *c1 = c + ldc, *c2 = c + 2 * ldc, *c3 = c + 3 * ldc, *c4 = c + 4 * ldc, *c5 = c + 5 * ldc;
    __m512 y00, y01, y10, y11, y20, y21, y30, y31, y40, y41, y50, y51;
    if (init) {
        y00 = y10 = y20 = y30 = y40 = y50 = _mm512_loadu_ps(init);
        y01 = y11 = y21 = y31 = y41 = y51 = _mm512_loadu_ps(init + 16);
    } else {
        y00 = _mm512_loadu_ps(c0);
        y01 = _mm512_loadu_ps(c0 + 16);
        y10 = _mm512_loadu_ps(c1);
        y11 = _mm512_loadu_ps(c1 + 16);
        y20 = _mm512_loadu_ps(c2);
        y21 = _mm512_loadu_ps(c2 + 16);
        y30 = _mm512_loadu_ps(c3);
        y31 = _mm512_loadu_ps(c3 + 16);
        y40 = _mm512_loadu_ps(c4);
        y41 = _mm512_loadu_ps(c4 + 16);
        y50 = _mm512_loadu_ps(c5);
        y51 = _mm512_loadu_ps(c5 + 16);
    }
#pragma GCC unroll 4
    for (int p = 0; p < kc; p++) {
        __m512 b0 = _mm512_loadu_ps(bp0 + (size_t)p * 16), b1 = _mm512_loadu_ps(bp1 + (size_t)p * 16), x;
        x = _mm512_set1_ps(a0[p]);
        y00 = _mm512_fmadd_ps(x, b0, y00);
        y01 = _mm512_fmadd_ps(x, b1, y01);
        x = _mm512_set1_ps(a1[p]);
        y10 = _mm512_fmadd_ps(x, b0, y10);
        y11 = _mm512_fmadd_ps(x, b1, y11);
        x = _mm512_set1_ps(a2[p]);
        y20 = _mm512_fmadd_ps(x, b0, y20);
        y21 = _mm512_fmadd_ps(x, b1, y21);
        x = _mm512_set1_ps(a3[p]);
        y30 = _mm512_fmadd_ps(x, b0, y30);
        y31 = _mm512_fmadd_ps(x, b1, y31);
        x = _mm512_set1_ps(a4[p]);
        y40 = _mm512_fmadd_ps(x, b0, y40);
        y41 = _mm512_fmadd_ps(x, b1, y41);
        x = _mm512_set1_ps(a5[p]);
        y50 = _mm512_fmadd_ps(x, b0, y50);
        y51 = _mm512_fmadd_ps(x, b1, y51);
    }
    _mm512_storeu_ps(c0, y00);
    _mm512_storeu_ps(c0 + 16, y01);
    _mm512_storeu_ps(c1, y10);
    _mm512_storeu_ps(c1 + 16, y11);
    _mm512_storeu_ps(c2, y20);
    _mm512_storeu_ps(c2 + 16, y21);
    _mm512_storeu_ps(c3, y30);
    _mm512_storeu_ps(c3 + 16, y31);
    _mm512_storeu_ps(c4, y40);
    _mm512_storeu_ps(c4 + 16, y41);
    _mm512_storeu_ps(c5, y50);
    _mm512_storeu_ps(c5 + 16, y51);
}

#else

/* Not an x86-64 GCC-compatible build: no AVX-512 kernel. */
int sd_gemm_rows_have_avx512(void)
{
    return 0;
}

/* Never called (sd_gemm_rows_best_isa never chooses it); two portable
 * 6 x 16 tiles, so a wrong call still gives the right bits. */
void sd_gemm_rows_kern_avx512(int kc, const float *const *a, const float *bp0, const float *bp1, const float *init,
                              float *c, size_t ldc)
{
    sd_gemm_rows_kern_c(kc, a, bp0, init, c, ldc);
    sd_gemm_rows_kern_c(kc, a, bp1, init ? init + 16 : NULL, c + 16, ldc);
}

#endif
