/* The micro-kernels of gemm_rows.c (internal to it and its tests): each
 * sets a 6 x 16 tile c[r][j] (row stride ldc) to its start value (init[j]
 * for every row, or when init is NULL c's own value) plus a[r][p] *
 * bp[p][j] over p = 0..kc-1, one fused multiply-add per p in order, so a
 * lane of the AVX2 kernel and the portable kernel round identically. a
 * holds the 6 row pointers (a repeated row stands in for a missing one),
 * bp one packed panel (kc rows of 16 floats, 32-byte aligned). */
#ifndef SDTK_GEMM_ROWS_KERN_H
#define SDTK_GEMM_ROWS_KERN_H

#include <stddef.h>
#include <stdint.h>

/* AVX2+FMA; call only when the CPU has both (gemm_rows_avx2.c). */
void sd_gemm_rows_kern_avx2(int kc, const float *const *a, const float *bp, const float *init, float *c,
                            size_t ldc);
/* Packs the first kc8 = kc rounded down to 8 steps of a full 16-column
 * panel (w: its first column's row at the block's first step) by 8 x 8
 * transposes; returns kc8 (the caller copies the rest). next: the next
 * panel's first row at the same step, next_rows of its rows to prefetch
 * (0 for none). AVX2 only. */
int sd_gemm_rows_pack_avx2(float *dst, const float *w, size_t ldw, int kc, const float *next, int next_rows);
/* dst[i] = the float of fp16 src[i], i < n, by F16C (AVX2 builds and CPUs). */
void sd_gemm_rows_widen_f16_avx2(float *dst, const uint16_t *src, int n);
/* dst[i] = the float of bf16 src[i], i < n (AVX2 builds and CPUs). */
void sd_gemm_rows_widen_bf16_avx2(float *dst, const uint16_t *src, int n);
/* AVX-512F: a 6 x 16 np tile (np = 2 or 3) over the np adjacent panels
 * from bp (kc * 16 floats apart), of which only the first `last` (1..16)
 * columns of the last panel are real: c and init are read and c written
 * there only (init: 16 (np - 1) + last start values). Call only when the
 * CPU has AVX-512F (gemm_rows_avx512.c). */
void sd_gemm_rows_kern_avx512(int np, int kc, const float *const *a, const float *bp, int last, const float *init,
                              float *c, size_t ldc);
/* Whether this build has the AVX-512 kernel at all (x86-64 GCC/Clang). */
int sd_gemm_rows_have_avx512(void);
/* Portable C with fmaf, any CPU (gemm_rows.c). */
void sd_gemm_rows_kern_c(int kc, const float *const *a, const float *bp, const float *init, float *c, size_t ldc);
/* Whether this build has the AVX2 kernel at all (x86 compilers only). */
int sd_gemm_rows_have_avx2(void);

#endif
