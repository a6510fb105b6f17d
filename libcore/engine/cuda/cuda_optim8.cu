/* 8-bit AdamW on the GPU with the CPU reference's arithmetic
 * (libcore/engine/ops_optim8.c): one thread block per quantization block
 * of 256 values, one thread per value. Each thread dequantizes its m and v,
 * updates them and its weight (weight decay before the update, as the CPU
 * path), the block's new absmax of m and v is reduced in shared memory
 * (max is exact, so any order gives the same value), and each value is
 * quantized again through the same 65536-entry nearest-code table the CPU
 * uses. Every multiply and add is an explicit round-to-nearest intrinsic
 * (__fmul_rn, __fadd_rn: never contracted into a multiply-add), fmaf
 * where the CPU calls fmaf, and IEEE division and square root (nvcc's
 * defaults), so codes, absmax and weights are the CPU's bits. Tensors
 * below SD_Q8_MIN_SIZE values take the fp32 32-bit path. */
#include "cuda_kernels.h"

#define Q8_THREADS SD_Q8_BLOCK
#define SMALL_THREADS 256

/* The table index of a value already divided by its block's absmax
 * (ops_optim8.c's q8_code). */
static __device__ uint8_t q8_code(const uint8_t *lut, float x)
{
    x = x < -1.0f ? -1.0f : x > 1.0f ? 1.0f : x;
    float t = __fmul_rn(__fadd_rn(x, 1.0f), 0.5f);
    t = __fmul_rn(t, (float)(SD_Q8_LUT - 1));
    return lut[(uint16_t)__fadd_rn(t, 0.5f)];
}

/* The largest of the block's values in sh (NaN counted as 0, as the CPU's
 * running maximum skips it), reduced in a fixed tree; every thread gets
 * it. */
static __device__ float block_absmax(float *sh, float a)
{
    sh[threadIdx.x] = a > 0.0f ? a : 0.0f;
    __syncthreads();
    for (int k = Q8_THREADS / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k && sh[threadIdx.x + k] > sh[threadIdx.x]) sh[threadIdx.x] = sh[threadIdx.x + k];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

/* One quantization block of one tensor per thread block: dequantize,
 * update, new absmax, quantize (ops_optim8.c's adamw8_tensor). */
static __global__ void adamw8_kernel(sd_adamw8_args a, const sd_q8_tables *t, size_t n, float *p, uint8_t *qm,
                                     uint8_t *qv, float *am, float *av, const float *g)
{
    __shared__ float sh[Q8_THREADS];
    size_t b = blockIdx.x, i = b * Q8_THREADS + threadIdx.x;
    int in = i < n;
    float m = 0.0f, v = 0.0f;
    if (in) {
        float gi = __fmul_rn(g[i], a.gscale);
        float mi = __fmul_rn(t->code_m[qm[i]], am[b]), vi = __fmul_rn(t->code_v[qv[i]], av[b]);
        m = fmaf(gi, a.one_b1, __fmul_rn(mi, a.b1));
        v = __fadd_rn(__fmul_rn(vi, a.b2), __fmul_rn(__fmul_rn(a.one_b2, gi), gi));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2), a.eps);
        float w = p[i];
        if (a.decay_on) w = __fmul_rn(w, a.decay);
        p[i] = __fadd_rn(w, __fdiv_rn(__fmul_rn(a.neg_lr_c1, m), denom));
    }
    /* every thread has read am[b] and av[b] before the first barrier */
    float amax_m = block_absmax(sh, fabsf(m)), amax_v = block_absmax(sh, fabsf(v));
    if (in) {
        qm[i] = amax_m == 0.0f ? 0 : q8_code(t->lut_m, __fmul_rn(m, __fdiv_rn(1.0f, amax_m)));
        qv[i] = amax_v == 0.0f ? 0 : q8_code(t->lut_v, __fmul_rn(v, __fdiv_rn(1.0f, amax_v)));
    }
    if (threadIdx.x == 0) {
        am[b] = amax_m;
        av[b] = amax_v;
    }
}

/* One small tensor's fp32 moments: bitsandbytes' 32-bit Adam
 * (ops_optim8.c's adamw32_tensor). */
static __global__ void adamw32_kernel(sd_adamw8_args a, size_t n, float *p, float *m, float *v, const float *g)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(g[i], a.gscale);
        float mi = fmaf(gi, a.one_b1, __fmul_rn(m[i], a.b1));
        float vi = __fadd_rn(__fmul_rn(v[i], a.b2), __fmul_rn(__fmul_rn(a.one_b2, gi), gi));
        float u = __fdiv_rn(mi, __fadd_rn(__fsqrt_rn(vi), a.eps_c2));
        float w = p[i];
        if (a.decay_on) w = __fmul_rn(w, a.decay);
        p[i] = fmaf(u, a.step_size, w);
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" cudaError_t sdk_adamw8(sd_cuda *c, const sd_adamw8_args *a, const sd_q8_tables *dev_tables, size_t nt,
                                  const sd_q8_tensor *ts, float *p, const float *g)
{
    cudaStream_t s = sdc_stream(c);
    for (size_t k = 0; k < nt; k++) {
        const sd_q8_tensor *x = &ts[k];
        if (!x->n) continue;
        if (x->qm) {
            size_t blocks = (x->n + SD_Q8_BLOCK - 1) / SD_Q8_BLOCK;
            if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
            adamw8_kernel<<<(unsigned)blocks, Q8_THREADS, 0, s>>>(*a, dev_tables, x->n, p + x->off, x->qm, x->qv,
                                                                   x->am, x->av, g + x->off);
        } else {
            adamw32_kernel<<<sdk_grid_blocks(x->n, SMALL_THREADS), SMALL_THREADS, 0, s>>>(*a, x->n, p + x->off,
                                                                                           x->m32, x->v32, g + x->off);
        }
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
