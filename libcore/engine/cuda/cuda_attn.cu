/* Scalar dot-product attention on the GPU, flash style: scores live only
 * in 16 x 64 tiles in shared memory, never in global memory, so memory is
 * O(T * d) (the VAE's 16384-token attention at 1024^2 needs no 1 GB score
 * matrix). fp32 throughout. Correctness first: plain shared-memory tiles,
 * no tensor cores, no register blocking.
 *
 * Forward, one block per (16 query rows, batch * head): for each 64-key
 * tile, S = scale q k^T, an online softmax (running row max m and sum l,
 * the accumulator rescaled by exp(m_old - m_new)), O += P v; at the end
 * y = O / l and lse = m + log(l), the CPU's formulas.
 *
 * Backward recomputes P = exp(scale q k^T - lse) from the saved lse:
 * D_i = dy_i . y_i; dq (one block per 16 query rows, over key tiles) +=
 * dS k with dS = P (dy v^T - D) scale; dv (one block per 16 keys, over
 * query tiles) += P^T dy; dk (same) += dS^T q. Every gradient row has one
 * owning block: no atomics, results do not vary from run to run.
 *
 * Shared memory per block: the 16 x d accumulator, the 16 x 65 P tile and
 * 16 + 64 rows of a 32-wide d chunk: (16 d + 3696) floats, 47.5 KB at
 * d = 512 (the VAE); wider heads opt in to the device's larger limit. */
#include <math.h>

#include "cuda_kernels.h"

#define NT 256 /* threads per block: 16 rows x 16 lanes */
#define RT 16  /* rows of the accumulating side per block */
#define CT 64  /* columns (the other side) per tile */
#define DC 32  /* d chunk staged in shared memory */
#define PS (CT + 1)
#define SS (DC + 1)

/* Shared floats of one block for head dim d. */
static size_t smem_floats(int d)
{
    return (size_t)RT * (size_t)d + RT * PS + RT + RT * SS + CT * SS;
}

/* Stage columns [d0, d0 + DC) of rows [0, rows) of src (row stride d)
 * into tile (row stride SS); rows >= valid and columns >= d are zero. */
static __device__ void load_chunk(float *tile, int rows, const float *src, int valid, int d, int d0)
{
    for (int i = threadIdx.x; i < rows * DC; i += NT) {
        int r = i / DC, cc = i % DC;
        tile[r * SS + cc] = (r < valid && d0 + cc < d) ? src[(size_t)r * (size_t)d + (size_t)(d0 + cc)] : 0.0f;
    }
}

/* acc[j] = a_r . b_(c0 + 16 j) over all d for this thread's row r = t / 16
 * and columns c0 = t % 16 (+ 16 j); a has RT rows, b has CT rows. */
static __device__ void tile_dots(const float *a, int a_valid, const float *b, int b_valid, int d, float *sa,
                                 float *sb, float acc[4])
{
    int r = threadIdx.x >> 4, c0 = threadIdx.x & 15;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    for (int d0 = 0; d0 < d; d0 += DC) {
        load_chunk(sa, RT, a, a_valid, d, d0);
        load_chunk(sb, CT, b, b_valid, d, d0);
        __syncthreads();
        for (int k = 0; k < DC; k++) {
            float av = sa[r * SS + k];
            for (int j = 0; j < 4; j++) acc[j] += av * sb[(c0 + 16 * j) * SS + k];
        }
        __syncthreads();
    }
}

/* out[r, :] = out[r, :] * alpha[r] (when alpha) + sum_j P[r, j] b[j, :]
 * for the RT x d accumulator in shared memory; b has CT rows. */
static __device__ void tile_accum(float *out, const float *P, const float *alpha, const float *b, int b_valid, int d,
                                  float *sb)
{
    int r = threadIdx.x >> 4, c = threadIdx.x & 15;
    for (int d0 = 0; d0 < d; d0 += DC) {
        load_chunk(sb, CT, b, b_valid, d, d0);
        __syncthreads();
        for (int h = 0; h < 2; h++) {
            int cc = c + 16 * h, col = d0 + cc;
            float s = 0.0f;
            for (int j = 0; j < CT; j++) s += P[r * PS + j] * sb[j * SS + cc];
            if (col < d) {
                float *o = &out[r * d + col];
                *o = (alpha ? *o * alpha[r] : *o) + s;
            }
        }
        __syncthreads();
    }
}

/* Max and sum over the 16 lanes of a row (lanes 0-15 or 16-31 of a warp). */
static __device__ float row_max(float v)
{
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ float row_sum(float v)
{
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Shared-memory layout of one block. */
typedef struct {
    float *acc, *P, *alpha, *sa, *sb;
} tiles;

static __device__ tiles carve(float *sm, int d)
{
    tiles t;
    t.acc = sm;
    t.P = t.acc + RT * d;
    t.alpha = t.P + RT * PS;
    t.sa = t.alpha + RT;
    t.sb = t.sa + RT * SS;
    return t;
}

/* Forward: block (query tile, batch * head). */
static __global__ void attn_fwd_kernel(sd_attn_shape s, float *y, float *lse, const float *q, const float *k,
                                       const float *v)
{
    extern __shared__ float sm[];
    int d = s.d;
    tiles t = carve(sm, d);
    size_t bh = blockIdx.y;
    int q0 = blockIdx.x * RT, qn = min(RT, s.tq - q0);
    int r = threadIdx.x >> 4, c0 = threadIdx.x & 15, qi = q0 + r;
    const float *qb = q + (bh * (size_t)s.tq + (size_t)q0) * (size_t)d;
    const float *kb = k + bh * (size_t)s.tk * (size_t)d, *vb = v + bh * (size_t)s.tk * (size_t)d;
    for (int i = threadIdx.x; i < RT * d; i += NT) t.acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int kend = s.causal ? min(s.tk, q0 + qn) : s.tk;
    for (int k0 = 0; k0 < kend; k0 += CT) {
        int kn = min(CT, s.tk - k0);
        float sc[4];
        tile_dots(qb, qn, kb + (size_t)k0 * (size_t)d, kn, d, t.sa, t.sb, sc);
        float tmax = -INFINITY;
        for (int j = 0; j < 4; j++) {
            int kj = k0 + c0 + 16 * j;
            int ok = kj < s.tk && !(s.causal && kj > qi);
            sc[j] = ok ? sc[j] * s.scale : -INFINITY;
            tmax = fmaxf(tmax, sc[j]);
        }
        float mnew = fmaxf(m, row_max(tmax));
        float a = mnew == -INFINITY ? 1.0f : expf(m - mnew), ps = 0.0f;
        for (int j = 0; j < 4; j++) {
            float p = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - mnew);
            t.P[r * PS + c0 + 16 * j] = p;
            ps += p;
        }
        l = l * a + row_sum(ps);
        m = mnew;
        if (c0 == 0) t.alpha[r] = a;
        __syncthreads();
        tile_accum(t.acc, t.P, t.alpha, vb + (size_t)k0 * (size_t)d, kn, d, t.sb);
    }
    __syncthreads();
    if (r < qn) {
        float *yr = y + (bh * (size_t)s.tq + (size_t)qi) * (size_t)d;
        for (int col = c0; col < d; col += 16) yr[col] = t.acc[r * d + col] / l;
        if (c0 == 0) lse[bh * (size_t)s.tq + (size_t)qi] = m + logf(l);
    }
}

/* D_i = dy_i . y_i, one warp per row. */
static __global__ void attn_drow_kernel(size_t rows, int d, const float *dy, const float *y, float *drow)
{
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float *a = dy + row * (size_t)d, *b = y + row * (size_t)d;
    float s = 0.0f;
    for (int i = lane; i < d; i += 32) s += a[i] * b[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) drow[row] = s;
}

/* dq: block (query tile, batch * head), over key tiles. */
static __global__ void attn_dq_kernel(sd_attn_shape s, float *dq, const float *dy, const float *q, const float *k,
                                      const float *v, const float *lse, const float *drow)
{
    extern __shared__ float sm[];
    int d = s.d;
    tiles t = carve(sm, d);
    size_t bh = blockIdx.y, row0 = bh * (size_t)s.tq;
    int q0 = blockIdx.x * RT, qn = min(RT, s.tq - q0);
    int r = threadIdx.x >> 4, c0 = threadIdx.x & 15, qi = q0 + r;
    const float *qb = q + (row0 + (size_t)q0) * (size_t)d, *dyb = dy + (row0 + (size_t)q0) * (size_t)d;
    const float *kb = k + bh * (size_t)s.tk * (size_t)d, *vb = v + bh * (size_t)s.tk * (size_t)d;
    float lr = r < qn ? lse[row0 + (size_t)qi] : 0.0f, dr = r < qn ? drow[row0 + (size_t)qi] : 0.0f;
    for (int i = threadIdx.x; i < RT * d; i += NT) t.acc[i] = 0.0f;
    int kend = s.causal ? min(s.tk, q0 + qn) : s.tk;
    for (int k0 = 0; k0 < kend; k0 += CT) {
        int kn = min(CT, s.tk - k0);
        float sc[4], dp[4];
        tile_dots(qb, qn, kb + (size_t)k0 * (size_t)d, kn, d, t.sa, t.sb, sc);
        tile_dots(dyb, qn, vb + (size_t)k0 * (size_t)d, kn, d, t.sa, t.sb, dp);
        for (int j = 0; j < 4; j++) {
            int kj = k0 + c0 + 16 * j;
            int ok = r < qn && kj < s.tk && !(s.causal && kj > qi);
            float p = ok ? expf(sc[j] * s.scale - lr) : 0.0f;
            t.P[r * PS + c0 + 16 * j] = p * (dp[j] - dr) * s.scale;
        }
        __syncthreads();
        tile_accum(t.acc, t.P, NULL, kb + (size_t)k0 * (size_t)d, kn, d, t.sb);
    }
    __syncthreads();
    if (r < qn) {
        float *o = dq + (row0 + (size_t)qi) * (size_t)d;
        for (int col = c0; col < d; col += 16) o[col] += t.acc[r * d + col];
    }
}

/* dk (want_dk) or dv: block (key tile of 16, batch * head), over query
 * tiles of 64; rows are keys, columns queries (the transposed problem). */
static __global__ void attn_dkv_kernel(sd_attn_shape s, int want_dk, float *out, const float *dy, const float *q,
                                       const float *k, const float *v, const float *lse, const float *drow)
{
    extern __shared__ float sm[];
    int d = s.d;
    tiles t = carve(sm, d);
    size_t bh = blockIdx.y, row0 = bh * (size_t)s.tq, key0 = bh * (size_t)s.tk;
    int k0 = blockIdx.x * RT, kn = min(RT, s.tk - k0);
    int r = threadIdx.x >> 4, c0 = threadIdx.x & 15, kj = k0 + r;
    const float *kb = k + (key0 + (size_t)k0) * (size_t)d, *vb = v + (key0 + (size_t)k0) * (size_t)d;
    const float *qb = q + row0 * (size_t)d, *dyb = dy + row0 * (size_t)d;
    for (int i = threadIdx.x; i < RT * d; i += NT) t.acc[i] = 0.0f;
    /* under the causal mask, queries before k0 see none of these keys */
    for (int q0 = s.causal ? k0 : 0; q0 < s.tq; q0 += CT) {
        int qn = min(CT, s.tq - q0);
        float sc[4], dp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile_dots(kb, kn, qb + (size_t)q0 * (size_t)d, qn, d, t.sa, t.sb, sc);
        if (want_dk) tile_dots(vb, kn, dyb + (size_t)q0 * (size_t)d, qn, d, t.sa, t.sb, dp);
        for (int j = 0; j < 4; j++) {
            int qi = q0 + c0 + 16 * j;
            int ok = r < kn && qi < s.tq && !(s.causal && kj > qi);
            float p = ok ? expf(sc[j] * s.scale - lse[row0 + (size_t)qi]) : 0.0f;
            t.P[r * PS + c0 + 16 * j] = want_dk ? (ok ? p * (dp[j] - drow[row0 + (size_t)qi]) * s.scale : 0.0f) : p;
        }
        __syncthreads();
        tile_accum(t.acc, t.P, NULL, (want_dk ? qb : dyb) + (size_t)q0 * (size_t)d, qn, d, t.sb);
    }
    __syncthreads();
    if (r < kn) {
        float *o = out + (key0 + (size_t)kj) * (size_t)d;
        for (int col = c0; col < d; col += 16) o[col] += t.acc[r * d + col];
    }
}

/* Grid and shared memory for rows of `rows` per head, checked against the
 * device; opts the kernel in to more than 48 KB when the head is wide. */
static cudaError_t prepare(sd_cuda *c, const void *kernel, const sd_attn_shape *s, int rows, dim3 *grid, size_t *smem)
{
    size_t bh = (size_t)s->b * (size_t)s->heads;
    *smem = smem_floats(s->d) * sizeof(float);
    if (bh > 65535 || rows <= 0) return cudaErrorInvalidConfiguration;
    if (*smem > sdc_smem_optin(c)) return cudaErrorInvalidConfiguration;
    *grid = dim3((unsigned)((rows + RT - 1) / RT), (unsigned)bh);
    if (*smem > 48 * 1024)
        return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem);
    return cudaSuccess;
}

extern "C" cudaError_t sdk_attn_fwd(sd_cuda *c, const sd_attn_shape *s, float *y, float *lse, const float *q,
                                    const float *k, const float *v)
{
    dim3 grid;
    size_t smem;
    cudaError_t e = prepare(c, (const void *)attn_fwd_kernel, s, s->tq, &grid, &smem);
    if (e != cudaSuccess) return e;
    attn_fwd_kernel<<<grid, NT, smem, sdc_stream(c)>>>(*s, y, lse, q, k, v);
    return cudaGetLastError();
}

extern "C" cudaError_t sdk_attn_drow(sd_cuda *c, size_t rows, int d, const float *dy, const float *y, float *drow)
{
    attn_drow_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, sdc_stream(c)>>>(rows, d, dy, y, drow);
    return cudaGetLastError();
}

extern "C" cudaError_t sdk_attn_bwd(sd_cuda *c, const sd_attn_shape *s, float *dq, float *dk, float *dv,
                                    const float *dy, const float *q, const float *k, const float *v, const float *y,
                                    const float *lse)
{
    if (!dq && !dk && !dv) return cudaSuccess;
    size_t rows = (size_t)s->b * (size_t)s->heads * (size_t)s->tq;
    float *drow = (float *)sdc_alloc(c, rows * sizeof(float));
    if (!drow) return cudaErrorMemoryAllocation;
    cudaStream_t st = sdc_stream(c);
    cudaError_t e = sdk_attn_drow(c, rows, s->d, dy, y, drow);
    dim3 grid;
    size_t smem;
    if (e == cudaSuccess && dq) {
        e = prepare(c, (const void *)attn_dq_kernel, s, s->tq, &grid, &smem);
        if (e == cudaSuccess) {
            attn_dq_kernel<<<grid, NT, smem, st>>>(*s, dq, dy, q, k, v, lse, drow);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess && (dk || dv)) e = prepare(c, (const void *)attn_dkv_kernel, s, s->tk, &grid, &smem);
    if (e == cudaSuccess && dv) {
        attn_dkv_kernel<<<grid, NT, smem, st>>>(*s, 0, dv, dy, q, k, v, lse, drow);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess && dk) {
        attn_dkv_kernel<<<grid, NT, smem, st>>>(*s, 1, dk, dy, q, k, v, lse, drow);
        e = cudaGetLastError();
    }
    sdc_release(c, drow);
    return e;
}
