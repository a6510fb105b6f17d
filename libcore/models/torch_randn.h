/* torch.randn on the CPU with a seeded torch.Generator, so a seed gives
 * the initial latents (and Euler a's per-step noise, the same generator
 * continued) that diffusers and ComfyUI draw for it:
 *     g = torch.Generator().manual_seed(seed); torch.randn(shape, generator=g)
 * The generator is torch's mt19937 (seeded with the low 32 bits); fp32
 * uniforms take 24 bits of one draw. A request of 16 or more values fills
 * uniforms and turns each 16 into normals by Box-Muller in fp32 (the last
 * 16 redrawn when n is not a multiple of 16) with the Cephes log and
 * sin/cos of torch's AVX2 kernel, which x86 CPUs with AVX2 or AVX-512 run:
 * bit-identical to torch there; torch on other CPUs (ARM) uses libm and can
 * differ in the last bit. Fewer than 16 values go one at a time through
 * the double Box-Muller with its cached second value.
 */
#ifndef SDTK_TORCH_RANDN_H
#define SDTK_TORCH_RANDN_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum { SD_MT_N = 624 };

typedef struct {
    uint32_t state[SD_MT_N];
    int left, next;
    double cached; /* the double Box-Muller's second value */
    int has_cached;
} sd_torch_gen;

/* torch.Generator().manual_seed(seed). */
void sd_torch_gen_seed(sd_torch_gen *g, uint64_t seed);
/* One 32-bit draw of the engine. */
uint32_t sd_torch_gen_u32(sd_torch_gen *g);
/* torch.randn(n, generator=g, dtype=float32) into out (any shape of n
 * contiguous values), advancing g as torch does. */
void sd_torch_randn(sd_torch_gen *g, float *out, size_t n);
/* The sampler's noise callback (sampler.h sd_noise_fn): ctx is an
 * sd_torch_gen *. */
sd_status sd_torch_randn_noise(void *ctx, float *out, size_t n, sd_error *err);

#endif
