/* fp16 / bf16 <-> fp32 scalar conversions (round to nearest-even). */
#ifndef SDTK_F16_H
#define SDTK_F16_H

#include <stdint.h>

uint16_t sd_f32_to_f16(float f);
float sd_f16_to_f32(uint16_t h);
uint16_t sd_f32_to_bf16(float f);
float sd_bf16_to_f32(uint16_t h);

#endif
