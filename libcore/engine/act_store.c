/* fp16 / bf16 activation storage: widening and narrowing runs of values
 * (act_store.h). fp16 goes through F16C 8 at a time where the CPU has it
 * (vcvtps2ph with round-to-nearest-even gives sd_f32_to_f16's bits for
 * every non-NaN value), bf16 through integer arithmetic the compiler
 * vectorises; the same bits either way. */
#include "act_store.h"

#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "f16.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* F16C, from the compiler runtime's CPU model (read, never cached here).
 * clang before 15 does not know the name; every x86 CPU with AVX2 has F16C
 * (Intel since Ivy Bridge, AMD since Piledriver), so AVX2 stands for it
 * there. */
int sd_cpu_has_f16c(void)
{
#if defined(__clang__) && __clang_major__ < 15
    return __builtin_cpu_supports("avx2");
#else
    return __builtin_cpu_supports("f16c");
#endif
}

/* fp16 -> float, 8 at a time (exact), the tail one by one. */
__attribute__((target("avx,f16c"))) static void widen_f16c(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = sd_f16_to_f32(src[i]);
}

/* float -> fp16, 8 at a time rounding to nearest even, the tail one by one. */
__attribute__((target("avx,f16c"))) static void narrow_f16c(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = sd_f32_to_f16(src[i]);
}
#else
/* Off x86 there is no F16C: the portable conversions are used. */
int sd_cpu_has_f16c(void)
{
    return 0;
}
#endif

/* bf16 -> float: the 16 bits become the top of the float. */
static void widen_bf16(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

/* float -> bf16, sd_f32_to_bf16's rule in a loop without branches. */
static void narrow_bf16(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, src + i, 4);
        uint32_t r = (x + 0x7fff + ((x >> 16) & 1)) >> 16, q = (x >> 16) | 0x40;
        dst[i] = (uint16_t)((x & 0x7fffffff) > 0x7f800000 ? q : r);
    }
}

/* Element off of a dt buffer. */
void *sd_act_at(void *p, size_t off, int dt)
{
    return (unsigned char *)p + off * sd_dtype_size(dt);
}

/* The same for a read-only buffer. */
const void *sd_act_at_c(const void *p, size_t off, int dt)
{
    return (const unsigned char *)p + off * sd_dtype_size(dt);
}

/* Widen n elements of src from offset off into dst. */
void sd_act_widen(float *dst, const void *src, size_t off, size_t n, int dt)
{
    const void *s = sd_act_at_c(src, off, dt);
    if (dt == SD_DT_F32) {
        memmove(dst, s, n * sizeof(float));
    } else if (dt == SD_DT_BF16) {
        widen_bf16(dst, s, n);
    } else {
#if defined(__x86_64__) || defined(__i386__)
        if (sd_cpu_has_f16c()) {
            widen_f16c(dst, s, n);
            return;
        }
#endif
        const uint16_t *h = s;
        for (size_t i = 0; i < n; i++) dst[i] = sd_f16_to_f32(h[i]);
    }
}

/* Narrow n floats into dst from offset off. */
void sd_act_narrow(void *dst, size_t off, const float *src, size_t n, int dt)
{
    void *d = sd_act_at(dst, off, dt);
    if (dt == SD_DT_F32) {
        memmove(d, src, n * sizeof(float));
    } else if (dt == SD_DT_BF16) {
        narrow_bf16(d, src, n);
    } else {
#if defined(__x86_64__) || defined(__i386__)
        if (sd_cpu_has_f16c()) {
            narrow_f16c(d, src, n);
            return;
        }
#endif
        uint16_t *h = d;
        for (size_t i = 0; i < n; i++) h[i] = sd_f32_to_f16(src[i]);
    }
}
