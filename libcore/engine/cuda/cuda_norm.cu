/* Group normalisation on the GPU, forward and backward; layer norm runs
 * through it as [m, c, 1] with one group, as on the CPU.
 *
 * A (image, group) unit holds m = c/groups * hw contiguous floats, up to
 * millions at 1024^2 with only n * 32 units, so one block per unit would
 * leave most of the GPU idle. Statistics are therefore computed in chunks:
 * one block per (unit, chunk) takes the chunk's mean and sum of squared
 * deviations (two passes over the chunk, like the CPU's two passes), the
 * chunks combine with Chan's parallel formula in double, and a grid-wide
 * kernel applies the normalisation. Backward reduces its two per-unit sums
 * the same way. Affine gradients: one block per channel, or for layer norm
 * (hw = 1 and one group) column sums over rows. Fixed launch shapes and
 * orders: the results do not vary from run to run. */
#include "cuda_kernels.h"

#define THREADS 256
#define CHUNK 8192
#define MAX_CHUNKS 1024

/* Sum over the block, returned to every thread. */
static __device__ float block_sum_all(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < THREADS / 32; i++) s += red[i];
    return s;
}

/* Chunk statistics: block (unit, chunk) writes count, mean and the sum of
 * squared deviations from that mean. */
static __global__ void gn_partial_kernel(size_t m, size_t chunk, int chunks, const float *x, float *part)
{
    __shared__ float red[THREADS / 32];
    size_t u = blockIdx.x, b0 = (size_t)blockIdx.y * chunk, b1 = b0 + chunk < m ? b0 + chunk : m;
    const float *xp = x + u * m;
    float s = 0.0f;
    for (size_t i = b0 + threadIdx.x; i < b1; i += THREADS) s += xp[i];
    float cnt = (float)(b1 > b0 ? b1 - b0 : 0);
    float mean = cnt > 0.0f ? block_sum_all(s, red) / cnt : 0.0f;
    float q = 0.0f;
    for (size_t i = b0 + threadIdx.x; i < b1; i += THREADS) q += (xp[i] - mean) * (xp[i] - mean);
    q = block_sum_all(q, red);
    if (threadIdx.x == 0) {
        float *o = part + (u * (size_t)chunks + blockIdx.y) * 3;
        o[0] = cnt;
        o[1] = mean;
        o[2] = q;
    }
}

/* Per unit, the chunks merged in order (Chan et al.) in double; rstd as
 * the CPU writes it, 1 / sqrt(var + eps). */
static __global__ void gn_combine_kernel(size_t units, int chunks, size_t m, float eps, const float *part,
                                         float *mean, float *rstd)
{
    size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= units) return;
    double n = 0.0, mu = 0.0, m2 = 0.0;
    for (int k = 0; k < chunks; k++) {
        const float *p = part + (u * (size_t)chunks + (size_t)k) * 3;
        double nb = p[0];
        if (nb == 0.0) continue;
        double d = (double)p[1] - mu, nt = n + nb;
        mu += d * nb / nt;
        m2 += (double)p[2] + d * d * n * nb / nt;
        n = nt;
    }
    mean[u] = (float)mu;
    rstd[u] = 1.0f / sqrtf((float)(m2 / (double)m) + eps);
}

/* y = (x - mean) * rstd * gamma + beta over every element. */
static __global__ void gn_apply_kernel(sd_gn_shape s, float *y, const float *x, const float *mean, const float *rstd,
                                       const float *gamma, const float *beta)
{
    size_t hw = (size_t)s.hw, c = (size_t)s.c, cg = c / (size_t)s.groups, total = (size_t)s.n * c * hw;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t ch = (e / hw) % c, u = (e / (hw * c)) * (size_t)s.groups + ch / cg;
        float g = gamma ? gamma[ch] : 1.0f, b = beta ? beta[ch] : 0.0f;
        y[e] = (x[e] - mean[u]) * rstd[u] * g + b;
    }
}

/* Chunks of a unit of m floats: about CHUNK floats each, at most MAX_CHUNKS. */
static int chunks_for(size_t m, size_t *chunk)
{
    size_t k = (m + CHUNK - 1) / CHUNK;
    if (k < 1) k = 1;
    if (k > MAX_CHUNKS) k = MAX_CHUNKS;
    *chunk = (m + k - 1) / k;
    return (int)k;
}

/* Blocks for a grid-stride loop over n elements. */
static unsigned blocks_for(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;
    if (b > 65536) b = 65536;
    return b ? (unsigned)b : 1u;
}

extern "C" cudaError_t sdk_group_norm_fwd(sd_cuda *c, const sd_gn_shape *s, float *y, float *mean, float *rstd,
                                          const float *x, const float *gamma, const float *beta)
{
    size_t units = (size_t)s->n * (size_t)s->groups, m = (size_t)(s->c / s->groups) * (size_t)s->hw, chunk;
    int chunks = chunks_for(m, &chunk);
    if (units > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    float *part = (float *)sdc_alloc(c, units * (size_t)chunks * 3 * sizeof(float));
    if (!part) return cudaErrorMemoryAllocation;
    cudaStream_t st = sdc_stream(c);
    gn_partial_kernel<<<dim3((unsigned)units, (unsigned)chunks), THREADS, 0, st>>>(m, chunk, chunks, x, part);
    gn_combine_kernel<<<(unsigned)((units + 127) / 128), 128, 0, st>>>(units, chunks, m, s->eps, part, mean, rstd);
    gn_apply_kernel<<<blocks_for(units * m), THREADS, 0, st>>>(*s, y, x, mean, rstd, gamma, beta);
    cudaError_t e = cudaGetLastError();
    sdc_release(c, part);
    return e;
}

/* Backward chunk sums per unit: sum of g = dy * gamma and of g * xhat. */
static __global__ void gn_bwd_partial_kernel(sd_gn_shape s, size_t chunk, int chunks, const float *dy, const float *x,
                                             const float *mean, const float *rstd, const float *gamma, float *part)
{
    __shared__ float red[THREADS / 32];
    size_t hw = (size_t)s.hw, cg = (size_t)(s.c / s.groups), m = cg * hw;
    size_t u = blockIdx.x, b0 = (size_t)blockIdx.y * chunk, b1 = b0 + chunk < m ? b0 + chunk : m;
    size_t c0 = (u % (size_t)s.groups) * cg;
    const float *xp = x + u * m, *gp = dy + u * m;
    float mu = mean[u], rs = rstd[u], sg = 0.0f, sgx = 0.0f;
    for (size_t i = b0 + threadIdx.x; i < b1; i += THREADS) {
        float g = gp[i] * (gamma ? gamma[c0 + i / hw] : 1.0f);
        sg += g;
        sgx += g * (xp[i] - mu) * rs;
    }
    sg = block_sum_all(sg, red);
    sgx = block_sum_all(sgx, red);
    if (threadIdx.x == 0) {
        float *o = part + (u * (size_t)chunks + blockIdx.y) * 2;
        o[0] = sg;
        o[1] = sgx;
    }
}

/* Per unit: the two sums over chunks, divided by m (the CPU's means). */
static __global__ void gn_bwd_combine_kernel(size_t units, int chunks, size_t m, const float *part, float *sums)
{
    size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= units) return;
    float a = 0.0f, b = 0.0f;
    for (int k = 0; k < chunks; k++) {
        a += part[(u * (size_t)chunks + (size_t)k) * 2];
        b += part[(u * (size_t)chunks + (size_t)k) * 2 + 1];
    }
    sums[u * 2] = a / (float)m;
    sums[u * 2 + 1] = b / (float)m;
}

/* dx += rstd * (dy * gamma - mean(g) - xhat * mean(g * xhat)). */
static __global__ void gn_bwd_dx_kernel(sd_gn_shape s, float *dx, const float *dy, const float *x, const float *mean,
                                        const float *rstd, const float *gamma, const float *sums)
{
    size_t hw = (size_t)s.hw, c = (size_t)s.c, cg = c / (size_t)s.groups, total = (size_t)s.n * c * hw;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t ch = (e / hw) % c, u = (e / (hw * c)) * (size_t)s.groups + ch / cg;
        float g = gamma ? gamma[ch] : 1.0f, rs = rstd[u], xhat = (x[e] - mean[u]) * rs;
        dx[e] += rs * (dy[e] * g - sums[u * 2] - xhat * sums[u * 2 + 1]);
    }
}

/* dgamma, dbeta for one channel per block, summed over images and pixels. */
static __global__ void gn_affine_kernel(sd_gn_shape s, float *dgamma, float *dbeta, const float *dy, const float *x,
                                        const float *mean, const float *rstd)
{
    __shared__ float red[THREADS / 32];
    size_t ch = blockIdx.x, hw = (size_t)s.hw, cg = (size_t)(s.c / s.groups);
    float sdg = 0.0f, sdb = 0.0f;
    for (int ni = 0; ni < s.n; ni++) {
        size_t u = (size_t)ni * (size_t)s.groups + ch / cg, base = ((size_t)ni * (size_t)s.c + ch) * hw;
        float mu = mean[u], rs = rstd[u];
        for (size_t i = threadIdx.x; i < hw; i += THREADS) {
            float g = dy[base + i];
            sdg += g * (x[base + i] - mu) * rs;
            sdb += g;
        }
    }
    sdg = block_sum_all(sdg, red);
    sdb = block_sum_all(sdb, red);
    if (threadIdx.x == 0) {
        if (dgamma) dgamma[ch] += sdg;
        if (dbeta) dbeta[ch] += sdb;
    }
}

/* Layer-norm affine gradients (hw = 1, one group, so mean and rstd are per
 * row): block (32 channels, 8 row lanes), each lane sums rows lane, lane +
 * 8, ...; the 8 partials in order. */
static __global__ void ln_affine_kernel(sd_gn_shape s, float *dgamma, float *dbeta, const float *dy, const float *x,
                                        const float *mean, const float *rstd)
{
    __shared__ float pg[8][33], pb[8][33];
    size_t c = (size_t)s.c, ch = (size_t)blockIdx.x * 32 + threadIdx.x;
    float sdg = 0.0f, sdb = 0.0f;
    if (ch < c) {
        for (size_t r = threadIdx.y; r < (size_t)s.n; r += 8) {
            float g = dy[r * c + ch];
            sdg += g * (x[r * c + ch] - mean[r]) * rstd[r];
            sdb += g;
        }
    }
    pg[threadIdx.y][threadIdx.x] = sdg;
    pb[threadIdx.y][threadIdx.x] = sdb;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        float tg = 0.0f, tb = 0.0f;
        for (int k = 0; k < 8; k++) {
            tg += pg[k][threadIdx.x];
            tb += pb[k][threadIdx.x];
        }
        if (dgamma) dgamma[ch] += tg;
        if (dbeta) dbeta[ch] += tb;
    }
}

extern "C" cudaError_t sdk_group_norm_bwd(sd_cuda *c, const sd_gn_shape *s, float *dx, float *dgamma, float *dbeta,
                                          const float *dy, const float *x, const float *mean, const float *rstd,
                                          const float *gamma)
{
    cudaStream_t st = sdc_stream(c);
    size_t units = (size_t)s->n * (size_t)s->groups, m = (size_t)(s->c / s->groups) * (size_t)s->hw;
    if (units > 0x7fffffffu || (size_t)s->c > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    if (dx) {
        size_t chunk;
        int chunks = chunks_for(m, &chunk);
        float *part = (float *)sdc_alloc(c, units * (size_t)chunks * 2 * sizeof(float));
        float *sums = part ? (float *)sdc_alloc(c, units * 2 * sizeof(float)) : NULL;
        if (!sums) {
            sdc_release(c, part);
            return cudaErrorMemoryAllocation;
        }
        gn_bwd_partial_kernel<<<dim3((unsigned)units, (unsigned)chunks), THREADS, 0, st>>>(*s, chunk, chunks, dy, x,
                                                                                           mean, rstd, gamma, part);
        gn_bwd_combine_kernel<<<(unsigned)((units + 127) / 128), 128, 0, st>>>(units, chunks, m, part, sums);
        gn_bwd_dx_kernel<<<blocks_for(units * m), THREADS, 0, st>>>(*s, dx, dy, x, mean, rstd, gamma, sums);
        cudaError_t e = cudaGetLastError();
        sdc_release(c, sums);
        sdc_release(c, part);
        if (e != cudaSuccess) return e;
    }
    if (dgamma || dbeta) {
        /* a group norm of 1x1 images with several groups keeps its
         * statistics per (image, group): the per-channel kernel */
        if (s->hw == 1 && s->groups == 1)
            ln_affine_kernel<<<(unsigned)(((size_t)s->c + 31) / 32), dim3(32, 8), 0, st>>>(*s, dgamma, dbeta, dy, x,
                                                                                          mean, rstd);
        else
            gn_affine_kernel<<<(unsigned)s->c, THREADS, 0, st>>>(*s, dgamma, dbeta, dy, x, mean, rstd);
        return cudaGetLastError();
    }
    return cudaSuccess;
}
