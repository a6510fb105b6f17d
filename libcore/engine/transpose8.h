/* An 8 x 8 block transpose in AVX2 registers (transpose8.c), shared by the
 * transpose op (ops_layout.c) and gemm_rows' weight packing. A copy: the
 * caller's scalar loops give the same result where AVX2 is missing. */
#ifndef SDTK_TRANSPOSE8_H
#define SDTK_TRANSPOSE8_H

#include <stddef.h>

/* Whether this build and this CPU run sd_transpose8_avx2 (the compiler
 * runtime's CPU model, cheap to ask once per op). */
int sd_transpose8_ok(void);

/* dst[c * ldd + r] = src[r * lds + c] for r, c < 8. Only when
 * sd_transpose8_ok(). */
void sd_transpose8_avx2(float *dst, size_t ldd, const float *src, size_t lds);

#endif
