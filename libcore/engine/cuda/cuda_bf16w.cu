/* bf16 weights on the GPU (--weight-dtype bf16): widening for an op or an
 * update, and the update's store with stochastic rounding, with the
 * scalar functions of ops_math.h the CPU runs (sdm_bf16_widen,
 * sdm_bf16_sr, sdm_mix32: integer arithmetic, the same bits on both). */
#include "cuda_kernels.h"
#include "ops_math.h"

#define W16_THREADS 256

/* n bf16 values widened exactly. */
static __global__ void widen_kernel(size_t n, float *dst, const uint16_t *src)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = sdm_bf16_widen(src[i]);
}

extern "C" cudaError_t sdk_bf16_widen(sd_cuda *c, size_t n, float *dst, const uint16_t *src)
{
    if (!n) return cudaSuccess;
    widen_kernel<<<sdk_grid_blocks(n, W16_THREADS), W16_THREADS, 0, sdc_stream(c)>>>(n, dst, src);
    return cudaGetLastError();
}

/* n fp32 values stored as bf16, element i rounded with the bits of its
 * global index index0 + i. */
static __global__ void store_sr_kernel(size_t n, size_t index0, uint32_t key, uint16_t *dst, const float *src)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = sdm_bf16_sr(src[i], sdm_mix32(key, index0 + i));
}

extern "C" cudaError_t sdk_bf16_store_sr(sd_cuda *c, size_t n, size_t index0, uint32_t key, uint16_t *dst,
                                         const float *src)
{
    if (!n) return cudaSuccess;
    store_sr_kernel<<<sdk_grid_blocks(n, W16_THREADS), W16_THREADS, 0, sdc_stream(c)>>>(n, index0, key, dst, src);
    return cudaGetLastError();
}
