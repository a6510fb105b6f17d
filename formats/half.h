/* Array conversions between the float types caches are stored in (fp16,
 * bf16, fp32, fp64), rounding to nearest-even as numpy (float16) and torch
 * (bfloat16) do, so an fp16 import equals numpy's astype(float16). The
 * scalar conversions are libcore's (f16.h). */
#ifndef SDTK_HALF_H
#define SDTK_HALF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "f16.h"
#include "npy.h"

int sd_npy_is_float(sd_npy_dtype t);
sd_status sd_convert(sd_npy_dtype to, void *dst, sd_npy_dtype from, const void *src, size_t count, sd_error *err);

#endif
