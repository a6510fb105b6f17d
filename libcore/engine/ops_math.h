/* Scalar formulas of the element-wise ops, written once for both backends:
 * the CPU ops (ops_elem.c, ops_act.c, ops_embed.c, ops_layout.c) and the
 * CUDA kernels (the .cu files of libcore/engine/cuda) include this header, so the
 * CPU tests (finite differences, torch golden values) check the very
 * expressions the GPU runs. Under nvcc each function is __host__
 * __device__; the CUDA math library's expf/erff/sinf/cosf differ from
 * glibc's by an ulp or two, so CPU and GPU agree to rounding, not bit for
 * bit.
 *
 * Plain C11 and C++ at once: no compound literals, no C-only keywords. */
#ifndef SDTK_OPS_MATH_H
#define SDTK_OPS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SDM_FN static __host__ __device__ __forceinline__
#else
#define SDM_FN static inline
#endif

#define SDM_INV_SQRT2 0.70710678118654752440f
#define SDM_INV_SQRT_2PI 0.39894228040143267794f
#define SDM_QUICK_GELU_K 1.702f
#define SDM_LOGVAR_MIN (-30.0f)
#define SDM_LOGVAR_MAX 20.0f

/* The logistic function, as every sigmoid-based op here writes it. */
SDM_FN float sdm_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* silu(x) = x * sigmoid(x), written as one division. */
SDM_FN float sdm_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* d silu / dx = s * (1 + x * (1 - s)) with s = sigmoid(x). */
SDM_FN float sdm_silu_grad(float x)
{
    float sg = sdm_sigmoid(x);
    return sg * (1.0f + x * (1.0f - sg));
}

/* Exact GELU: x * Phi(x), Phi the standard normal CDF written with erf. */
SDM_FN float sdm_gelu(float x)
{
    return 0.5f * x * (1.0f + erff(x * SDM_INV_SQRT2));
}

/* gelu'(x) = Phi(x) + x * phi(x), phi the standard normal density. */
SDM_FN float sdm_gelu_grad(float x)
{
    return 0.5f * (1.0f + erff(x * SDM_INV_SQRT2)) + x * SDM_INV_SQRT_2PI * expf(-0.5f * x * x);
}

/* CLIP's quick_gelu: x * sigmoid(1.702 x), written as one division. */
SDM_FN float sdm_quick_gelu(float x)
{
    return x / (1.0f + expf(-SDM_QUICK_GELU_K * x));
}

/* d/dx = s + k x s (1 - s) with s = sigmoid(k x), k = 1.702. */
SDM_FN float sdm_quick_gelu_grad(float x)
{
    float sg = 1.0f / (1.0f + expf(-SDM_QUICK_GELU_K * x));
    return sg + SDM_QUICK_GELU_K * x * sg * (1.0f - sg);
}

/* The VAE posterior's std from its logvar: exp(0.5 * clamp(x, -30, 20)),
 * as diffusers' DiagonalGaussianDistribution computes it. */
SDM_FN float sdm_gauss_std(float x)
{
    float c = x < SDM_LOGVAR_MIN ? SDM_LOGVAR_MIN : x > SDM_LOGVAR_MAX ? SDM_LOGVAR_MAX : x;
    return expf(0.5f * c);
}

/* d std / d logvar = 0.5 * std inside the clamp range (bounds included,
 * as torch's clamp backward), 0 outside. */
SDM_FN float sdm_gauss_std_grad(float x)
{
    if (x < SDM_LOGVAR_MIN || x > SDM_LOGVAR_MAX) return 0.0f;
    return 0.5f * expf(0.5f * x);
}

/* Timestep embedding frequency i: exp(-ln(max_period) * i / (dim / 2 -
 * freq_shift)), in diffusers' order of fp32 operations. */
SDM_FN float sdm_temb_freq(int dim, float freq_shift, float max_period, int i)
{
    float denom = (float)(dim / 2) - freq_shift;
    return expf(-logf(max_period) * (float)i / denom);
}

/* One element of torch's single-tensor AdamW in fp32: decoupled weight
 * decay (p *= 1 - lr wd), the moments, then p -= lr / bc1 * m / (sqrt(v) /
 * sqrt(bc2) + eps); g arrives already scaled by the clipping factor. */
SDM_FN void sdm_adamw(float *p, float *m, float *v, float g, float decay, float b1, float b2, float step_size,
                      float bc2_sqrt, float eps)
{
    float pp = *p * decay;
    float mm = *m + (g - *m) * (1.0f - b1);
    float vv = *v * b2 + (1.0f - b2) * g * g;
    float denom = sqrtf(vv) / bc2_sqrt + eps;
    *p = pp - step_size * (mm / denom);
    *m = mm;
    *v = vv;
}

/* 32 well-mixed bits for element `index` of a step keyed `key`: the
 * random source of stochastic rounding. A pure function of (key, index),
 * so an element rounds the same way on any thread count, rank count
 * (ZeRO-1 passes global indices) or backend. The index (its high half
 * folded in) times odd constants, xor the key, then a 32-bit integer
 * finaliser (xorshift-multiply, as in MurmurHash3's): 32-bit multiplies,
 * which vectorise where 64-bit ones do not. */
SDM_FN uint32_t sdm_mix32(uint32_t key, uint64_t index)
{
    uint32_t x = (uint32_t)index * 0x9e3779b9u ^ (uint32_t)(index >> 32) * 0x85ebca6bu ^ key;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* fp32 -> bf16 with stochastic rounding: r (16 random bits) added below
 * the kept bits, then truncation, so x rounds up with probability equal to
 * the fraction it lies past the lower bf16 value and the stored value is
 * x on average. (Nearest rounding would freeze AdamW's second moment: with
 * beta2 = 0.999 a step moves v by 0.1%, under half of bf16's 0.8% spacing.)
 * NaN stays NaN, infinities stay infinite; the largest finite values may
 * round up to infinity, as they may under nearest rounding. */
SDM_FN uint16_t sdm_bf16_sr(float x, uint32_t r)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

/* bf16 -> fp32, exact. */
SDM_FN float sdm_bf16_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* AdamW with the moments stored in bf16: widened exactly, updated in fp32
 * exactly as sdm_adamw (the weight update uses the fp32 moments), stored
 * back with stochastic rounding from 32 random bits (low half m, high half
 * v). */
SDM_FN void sdm_adamw_bf16(float *p, uint16_t *m, uint16_t *v, float g, float decay, float b1, float b2,
                           float step_size, float bc2_sqrt, float eps, uint32_t r)
{
    float mm = sdm_bf16_widen(*m), vv = sdm_bf16_widen(*v);
    sdm_adamw(p, &mm, &vv, g, decay, b1, b2, step_size, bc2_sqrt, eps);
    *m = sdm_bf16_sr(mm, r);
    *v = sdm_bf16_sr(vv, r >> 16);
}

/* diffusers' EMAModel step for one weight: ema -= (1 - decay) (ema - p). */
SDM_FN float sdm_ema(float ema, float p, float one_minus_decay)
{
    return ema - one_minus_decay * (ema - p);
}

#endif
