/* AVX-512 passes of the CPU softmax, bit-identical to the portable loops
 * of ops_attn.c and to sd_vexpf (vexp.h). */
#ifndef SDTK_VEXP_AVX512_H
#define SDTK_VEXP_AVX512_H

/* 1 when this CPU (and build) runs the functions below, else 0. */
int sd_vexp_avx512_usable(void);

/* x[j] = sd_vexpf(x[j] - m) for j < n, 16 lanes at a time. */
void sd_vexp_shift_avx512(int n, float *x, float m);

/* The same, returning the sum of the new x[j] as ops_attn.c's portable
 * loop takes it: 8 partial sums, sum l gaining x[l], x[l + 8], ... in
 * order, then ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)). */
float sd_vexp_shift_sum_avx512(int n, float *x, float m);

/* x[j] *= scale for j < n; returns the maximum of m and the new x[j] as
 * the portable loop takes it (8 interleaved partial maxima, `x > mx ? x :
 * mx`, so NaN never wins). */
float sd_scale_max_avx512(int n, float *x, float scale, float m);

#endif
