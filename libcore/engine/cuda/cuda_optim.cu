/* The optimizer's kernels: the gradient's sum of squares (per-block
 * partials in double, added in block order by one thread: the same value
 * every run), the AdamW update and the EMA of the weights, with the scalar
 * formulas of ops_math.h that the CPU runs. */
#include "cuda_kernels.h"
#include "ops_math.h"

#define OPT_THREADS 256
#define SUMSQ_BLOCKS 1024

/* Blocks for a grid-stride loop over n items. */
static unsigned opt_blocks(size_t n)
{
    return sdk_grid_blocks(n, OPT_THREADS);
}

/* part[block] = sum of x[i]^2 over the block's grid-stride items, in
 * double, reduced in a fixed tree. */
static __global__ void sumsq_part_kernel(size_t n, const float *x, double *part)
{
    __shared__ double sh[OPT_THREADS];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = OPT_THREADS / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

/* *out = the partials added in block order (one thread). */
static __global__ void sumsq_total_kernel(int nb, const double *part, double *out)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double t = 0;
    for (int i = 0; i < nb; i++) t += part[i];
    *out = t;
}

extern "C" cudaError_t sdk_sum_squares(sd_cuda *c, size_t n, const float *x, double *host_out)
{
    *host_out = 0;
    if (!n) return cudaSuccess;
    double *part = (double *)sdc_alloc(c, (SUMSQ_BLOCKS + 1) * sizeof(double));
    if (!part) return cudaErrorMemoryAllocation;
    cudaStream_t s = sdc_stream(c);
    sumsq_part_kernel<<<SUMSQ_BLOCKS, OPT_THREADS, 0, s>>>(n, x, part);
    sumsq_total_kernel<<<1, 1, 0, s>>>(SUMSQ_BLOCKS, part, part + SUMSQ_BLOCKS);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(host_out, part + SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    sdc_release(c, part);
    return e;
}

/* One AdamW step per element. */
static __global__ void adamw_kernel(sd_adamw_args a, size_t n, float *p, float *m, float *v, const float *g)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        sdm_adamw(p + i, m + i, v + i, g[i] * a.gscale, a.decay, a.b1, a.b2, a.step_size, a.bc2_sqrt, a.eps);
}

extern "C" cudaError_t sdk_adamw(sd_cuda *c, const sd_adamw_args *a, size_t n, float *p, float *m, float *v,
                                 const float *g)
{
    if (!n) return cudaSuccess;
    adamw_kernel<<<opt_blocks(n), OPT_THREADS, 0, sdc_stream(c)>>>(*a, n, p, m, v, g);
    return cudaGetLastError();
}

/* One AdamW step per element with bf16 moments; the rounding bits of
 * element i come from its global index index0 + i, as on the CPU. */
static __global__ void adamw_bf16_kernel(sd_adamw_args a, size_t n, size_t index0, float *p, uint16_t *m,
                                         uint16_t *v, const float *g)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        sdm_adamw_bf16(p + i, m + i, v + i, g[i] * a.gscale, a.decay, a.b1, a.b2, a.step_size, a.bc2_sqrt, a.eps,
                       sdm_mix32(a.sr_key, index0 + i));
}

extern "C" cudaError_t sdk_adamw_bf16(sd_cuda *c, const sd_adamw_args *a, size_t n, size_t index0, float *p,
                                      uint16_t *m, uint16_t *v, const float *g)
{
    if (!n) return cudaSuccess;
    adamw_bf16_kernel<<<opt_blocks(n), OPT_THREADS, 0, sdc_stream(c)>>>(*a, n, index0, p, m, v, g);
    return cudaGetLastError();
}

/* ema pulled towards p by one_minus_decay. */
static __global__ void ema_kernel(size_t n, float *ema, const float *p, float w)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        ema[i] = sdm_ema(ema[i], p[i], w);
}

extern "C" cudaError_t sdk_ema(sd_cuda *c, size_t n, float *ema, const float *p, float one_minus_decay)
{
    if (!n) return cudaSuccess;
    ema_kernel<<<opt_blocks(n), OPT_THREADS, 0, sdc_stream(c)>>>(n, ema, p, one_minus_decay);
    return cudaGetLastError();
}
