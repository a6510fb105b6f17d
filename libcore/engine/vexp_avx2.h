/* AVX2 exponentials for the CPU softmax, bit-identical to sd_vexpf. */
#ifndef SDTK_VEXP_AVX2_H
#define SDTK_VEXP_AVX2_H

/* 1 when this CPU (and build) runs sd_vexp_shift_avx2, else 0. */
int sd_vexp_avx2_usable(void);

/* x[j] = sd_vexpf(x[j] - m) for j < n, 8 lanes at a time. */
void sd_vexp_shift_avx2(int n, float *x, float m);

#endif
