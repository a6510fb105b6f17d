/* Conversions between the float types caches are stored in (fp16, bf16,
 * fp32, fp64), rounding to nearest-even as numpy (float16) and torch
 * (bfloat16) do, so an fp16 import equals numpy's astype(float16). */
#ifndef SDTK_HALF_H
#define SDTK_HALF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "npy.h"

uint16_t sd_f32_to_f16(float f);
float sd_f16_to_f32(uint16_t h);
uint16_t sd_f32_to_bf16(float f);
float sd_bf16_to_f32(uint16_t h);
int sd_npy_is_float(sd_npy_dtype t);
sd_status sd_convert(sd_npy_dtype to, void *dst, sd_npy_dtype from, const void *src, size_t count, sd_error *err);

#endif
