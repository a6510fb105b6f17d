/* Mixed precision's conversions: fp32 activations and weights rounded to
 * bf16 or fp16 (round to nearest even) before a matrix product takes them,
 * and 16-bit results widened back to fp32, set or added; the transposing
 * pair also moves convolutions' NCHW tensors to and from the NHWC layout
 * cuDNN's 16-bit tensor-core kernels run in. The products themselves
 * (cuBLAS, cuDNN) accumulate in fp32; everything else in the backend stays
 * fp32, so these kernels are all the 16-bit code there is. kind is
 * SD_DT_BF16 or SD_DT_F16 (dtype.h). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_kernels.h"
#include "dtype.h"

#define THREADS 256
#define TILE 32

/* x rounded to 16 bits of kind, stored at y[i]. */
static __device__ __forceinline__ void put_half(int kind, void *y, size_t i, float x)
{
    if (kind == SD_DT_BF16)
        ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(x);
    else
        ((__half *)y)[i] = __float2half_rn(x);
}

/* x[i] of kind, widened. */
static __device__ __forceinline__ float get_half(int kind, const void *x, size_t i)
{
    return kind == SD_DT_BF16 ? __bfloat162float(((const __nv_bfloat16 *)x)[i]) : __half2float(((const __half *)x)[i]);
}

/* y = x rounded to bf16 (kind SD_DT_BF16) or fp16, n items. */
static __global__ void to_half_kernel(int kind, size_t n, void *y, const float *x)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        put_half(kind, y, i, x[i]);
    }
}

extern "C" cudaError_t sdk_to_half(sd_cuda *c, int kind, size_t n, void *y, const float *x)
{
    if (!n) return cudaSuccess;
    to_half_kernel<<<sdk_grid_blocks(n, THREADS), THREADS, 0, sdc_stream(c)>>>(kind, n, y, x);
    return cudaGetLastError();
}

/* Batched transpose with a change of type, through a padded 32x32 shared
 * tile (both global sides coalesced): image blockIdx.z of x [rows, cols]
 * to y [cols, rows]. to_half: x fp32, y 16-bit; else x 16-bit, y fp32 set
 * or (accumulate) added. Block (32, 8); blockIdx.x runs over the tiles,
 * row tiles outer, so neither side is bounded by the grid's y and z
 * limits. */
static __global__ void transpose_half_kernel(int kind, int to_half, int rows, int cols, int col_tiles, void *y,
                                             const void *x, int accumulate)
{
    __shared__ float tile[TILE][TILE + 1];
    size_t img = blockIdx.z, plane = (size_t)rows * (size_t)cols;
    int r0 = (int)(blockIdx.x / (unsigned)col_tiles) * TILE, c0 = (int)(blockIdx.x % (unsigned)col_tiles) * TILE;
    for (int j = threadIdx.y; j < TILE; j += 8) {
        int r = r0 + j, col = c0 + threadIdx.x;
        if (r < rows && col < cols) {
            size_t i = img * plane + (size_t)r * (size_t)cols + (size_t)col;
            tile[j][threadIdx.x] = to_half ? ((const float *)x)[i] : get_half(kind, x, i);
        }
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += 8) {
        int col = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && col < cols) {
            size_t o = img * plane + (size_t)col * (size_t)rows + (size_t)r;
            float v = tile[threadIdx.x][j];
            if (to_half)
                put_half(kind, y, o, v);
            else
                ((float *)y)[o] = accumulate ? ((float *)y)[o] + v : v;
        }
    }
}

/* The launch of transpose_half_kernel for n images of rows x cols. */
static cudaError_t transpose_half(sd_cuda *c, int kind, int to_half, int n, int rows, int cols, void *y,
                                  const void *x, int accumulate)
{
    if (n <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
    size_t rt = ((size_t)rows + TILE - 1) / TILE, ct = ((size_t)cols + TILE - 1) / TILE;
    if (n > 65535 || rt * ct > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)(rt * ct), 1, (unsigned)n), block(TILE, 8);
    transpose_half_kernel<<<grid, block, 0, sdc_stream(c)>>>(kind, to_half, rows, cols, (int)ct, y, x, accumulate);
    return cudaGetLastError();
}

extern "C" cudaError_t sdk_to_half_t(sd_cuda *c, int kind, int n, int rows, int cols, void *y, const float *x)
{
    return transpose_half(c, kind, 1, n, rows, cols, y, x, 0);
}

extern "C" cudaError_t sdk_from_half_t(sd_cuda *c, int kind, int n, int rows, int cols, float *y, const void *x,
                                       int accumulate)
{
    return transpose_half(c, kind, 0, n, rows, cols, y, x, accumulate);
}
