/* fp16 and bf16 <-> fp32 scalar conversions, rounding to nearest-even as
 * numpy (float16) and torch (bfloat16) do. In libcore because weights
 * (safetensors) and caches (shards, .npy) both need them. */
#include "f16.h"

#include <math.h>
#include <string.h>

/* Bits of a float, without aliasing trouble. */
static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A float from its bits. */
static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> IEEE half, round to nearest even, overflow to inf, NaN kept
 * quiet with its sign: the same bits numpy's astype(float16) gives. */
uint16_t sd_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) /* inf or NaN */
        return man ? (uint16_t)(sign | 0x7e00 | (man >> 13)) : (uint16_t)(sign | 0x7c00);
    int e = (int)exp - 127 + 15;
    if (e >= 31) return sign | 0x7c00;
    if (e <= 0) { /* subnormal half or zero */
        if (e < -10) return sign;
        man |= 0x800000;
        int shift = 14 - e; /* 14..24 */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into the exponent, up to inf: right */
    return (uint16_t)(sign | h);
}

/* IEEE half -> float32 (exact). */
float sd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000 | man << 13);
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return bits_f32(sign | (exp + 112) << 23 | man << 13);
}

/* float32 -> bfloat16, round to nearest even, NaN kept quiet (as torch). */
uint16_t sd_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* bfloat16 -> float32 (exact). */
float sd_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}
