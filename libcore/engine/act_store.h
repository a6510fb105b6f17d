/* Activations stored in 16 bits (fp16 or bf16) and computed in fp32: the
 * conversions every 16-bit-storage op uses at its loads and stores. A
 * buffer of dtype dt is addressed by element offsets; SD_DT_F32 is a plain
 * float array, so the same call serves every storage type. */
#ifndef SDTK_ACT_STORE_H
#define SDTK_ACT_STORE_H

#include <stddef.h>

/* 1 when the CPU converts fp16 in hardware (F16C), from the compiler
 * runtime's CPU model (AVX2 standing for it under clang < 15). */
int sd_cpu_has_f16c(void);

/* dst[0..n) = the floats of src's elements [off, off + n) (exact). */
void sd_act_widen(float *dst, const void *src, size_t off, size_t n, int dt);

/* src's n floats into dst's elements [off, off + n), rounded to nearest
 * even as sd_f32_to_f16 / sd_f32_to_bf16 round. */
void sd_act_narrow(void *dst, size_t off, const float *src, size_t n, int dt);

/* The address of element off of a dt buffer. */
void *sd_act_at(void *p, size_t off, int dt);
const void *sd_act_at_c(const void *p, size_t off, int dt);

#endif
