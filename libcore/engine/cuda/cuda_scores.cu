/* The element-wise steps of attention through cuBLAS (cuda_attn_gemm.c):
 * the GEMMs leave a block of scaled scores S = scale q k^T in memory, G
 * heads x n query rows x tk keys, row-major with rows of tk; these kernels
 * turn it into probabilities (forward) or into probabilities and score
 * gradients (backward). One thread block per score row; reductions in a
 * fixed order per launch shape, so results do not vary from run to run.
 *
 * A row is query i of the block (global query q0 + i of a head whose lse
 * and D values start at lse + g * tq, drow + g * tq). Under the causal mask
 * keys after the query get probability 0, as in the CPU reference. */
#include <math.h>

#include "cuda_kernels.h"

#define ROW_THREADS 256

/* Max (is_max) or sum of v over the block, the same value in every
 * thread: warps reduce by shuffles, then every thread adds the warps'
 * partials in warp order; red is reusable when this returns. */
static __device__ float block_reduce(float v, float *red, int is_max)
{
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < ROW_THREADS / 32; w++) v = is_max ? fmaxf(v, red[w]) : v + red[w];
    __syncthreads();
    return v;
}

/* Keys a query row may see: all, or up to the query under the mask. */
static __device__ int row_keys(int tk, int causal, int qi)
{
    return causal ? min(tk, qi + 1) : tk;
}

/* Forward: S row -> exp(s - max) / sum (0 where masked); lse = max +
 * log(sum), the CPU's formula. */
static __global__ void softmax_rows_kernel(int n, int tk, int q0, int tq, int causal, float *s, float *lse)
{
    __shared__ float red[ROW_THREADS / 32];
    int row = blockIdx.x, g = row / n, i = row % n;
    float *r = s + (size_t)row * (size_t)tk;
    int kend = row_keys(tk, causal, q0 + i);
    float m = -INFINITY;
    for (int j = threadIdx.x; j < kend; j += ROW_THREADS) m = fmaxf(m, r[j]);
    m = block_reduce(m, red, 1);
    float l = 0.0f;
    for (int j = threadIdx.x; j < kend; j += ROW_THREADS) {
        float e = expf(r[j] - m);
        r[j] = e;
        l += e;
    }
    l = block_reduce(l, red, 0);
    for (int j = threadIdx.x; j < tk; j += ROW_THREADS) r[j] = j < kend ? r[j] / l : 0.0f;
    if (threadIdx.x == 0) lse[(size_t)g * (size_t)tq + (size_t)(q0 + i)] = m + logf(l);
}

/* Backward: P = exp(s - lse) (0 where masked) replaces S; with dp (the
 * block of dy v^T), dS = P (dp - D) scale replaces it, D = dy . y. */
static __global__ void dscores_kernel(int n, int tk, int q0, int tq, int causal, float scale, float *s, float *dp,
                                      const float *lse, const float *drow)
{
    int row = blockIdx.x, g = row / n, i = row % n;
    size_t at = (size_t)g * (size_t)tq + (size_t)(q0 + i), base = (size_t)row * (size_t)tk;
    float lr = lse[at], dr = drow ? drow[at] : 0.0f;
    int kend = row_keys(tk, causal, q0 + i);
    for (int j = threadIdx.x; j < tk; j += ROW_THREADS) {
        float p = j < kend ? expf(s[base + j] - lr) : 0.0f;
        s[base + j] = p;
        if (dp) dp[base + j] = p * (dp[base + j] - dr) * scale;
    }
}

extern "C" cudaError_t sdk_attn_softmax(sd_cuda *c, int rows, int n, int tk, int q0, int tq, int causal, float *s,
                                        float *lse)
{
    if (rows <= 0) return cudaSuccess;
    softmax_rows_kernel<<<(unsigned)rows, ROW_THREADS, 0, sdc_stream(c)>>>(n, tk, q0, tq, causal, s, lse);
    return cudaGetLastError();
}

extern "C" cudaError_t sdk_attn_dscores(sd_cuda *c, int rows, int n, int tk, int q0, int tq, int causal, float scale,
                                        float *s, float *dp, const float *lse, const float *drow)
{
    if (rows <= 0) return cudaSuccess;
    dscores_kernel<<<(unsigned)rows, ROW_THREADS, 0, sdc_stream(c)>>>(n, tk, q0, tq, causal, scale, s, dp, lse, drow);
    return cudaGetLastError();
}
