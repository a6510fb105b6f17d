/* Element-wise and layout kernels of the CUDA backend: activations (their
 * scalar formulas from ops_math.h, the same expressions the CPU ops run),
 * add/scale/mul, GEGLU, nearest upsample, channel concat, per-channel
 * broadcast add, timestep and token embeddings, transpose, and the
 * convolution/linear helpers (padding copy, unpadded gradient add, bias
 * rows, column sums). C-like CUDA: no classes, no templates.
 *
 * Every output element is written by exactly one thread, and the few
 * reductions run in a fixed order per launch configuration, so results do
 * not change from run to run. Token and position embedding gradients add
 * in the CPU's order and match it bit for bit. The timestep gradient adds
 * in the CPU's order too, but its terms come from CUDA's expf, sinf and
 * cosf, which differ from glibc's by an ulp or two (amplified by t up to
 * 999): on the H100 (run 14) 6.1e-5 from the CPU forward, 6.0e-5 in the
 * gradient (absolute). */
#include "cuda_kernels.h"
#include "ops_math.h"

#define THREADS 256
#define MAX_BLOCKS 65536

/* Blocks of `threads` for a grid-stride loop over n items: at least one,
 * at most MAX_BLOCKS (the loop covers the rest). */
extern "C" unsigned sdk_grid_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b > MAX_BLOCKS) b = MAX_BLOCKS;
    return b ? (unsigned)b : 1u;
}

/* Blocks of THREADS for n items. */
static unsigned blocks_for(size_t n)
{
    return sdk_grid_blocks(n, THREADS);
}

/* Index of the first item of this thread and the grid's stride. */
#define GRID_LOOP(i, n)                                                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* The activation of `kind` at x. */
static __device__ __forceinline__ float act_val(int kind, float x)
{
    switch (kind) {
    case SDK_SILU: return sdm_silu(x);
    case SDK_GELU: return sdm_gelu(x);
    case SDK_QUICK_GELU: return sdm_quick_gelu(x);
    default: return sdm_gauss_std(x);
    }
}

/* Its derivative at x. */
static __device__ __forceinline__ float act_grad(int kind, float x)
{
    switch (kind) {
    case SDK_SILU: return sdm_silu_grad(x);
    case SDK_GELU: return sdm_gelu_grad(x);
    case SDK_QUICK_GELU: return sdm_quick_gelu_grad(x);
    default: return sdm_gauss_std_grad(x);
    }
}

/* y = act(x); one kernel for all kinds (the switch is uniform). */
static __global__ void act_fwd_kernel(int kind, size_t n, float *y, const float *x)
{
    GRID_LOOP(i, n) y[i] = act_val(kind, x[i]);
}

/* dx += dy * act'(x). */
static __global__ void act_bwd_kernel(int kind, size_t n, float *dx, const float *dy, const float *x)
{
    GRID_LOOP(i, n) dx[i] += dy[i] * act_grad(kind, x[i]);
}

/* The launch status of the kernel just queued. */
static cudaError_t launched(void)
{
    return cudaGetLastError();
}

extern "C" cudaError_t sdk_act_fwd(sd_cuda *c, sdk_act kind, size_t n, float *y, const float *x)
{
    if (!n) return cudaSuccess;
    act_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>((int)kind, n, y, x);
    return launched();
}

extern "C" cudaError_t sdk_act_bwd(sd_cuda *c, sdk_act kind, size_t n, float *dx, const float *dy, const float *x)
{
    if (!n || !dx) return cudaSuccess;
    act_bwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>((int)kind, n, dx, dy, x);
    return launched();
}

/* y = a + b. */
static __global__ void add_fwd_kernel(size_t n, float *y, const float *a, const float *b)
{
    GRID_LOOP(i, n) y[i] = a[i] + b[i];
}

/* da += dy, db += dy (either may be NULL). */
static __global__ void add_bwd_kernel(size_t n, float *da, float *db, const float *dy)
{
    GRID_LOOP(i, n)
    {
        float g = dy[i];
        if (da) da[i] += g;
        if (db) db[i] += g;
    }
}

extern "C" cudaError_t sdk_add_fwd(sd_cuda *c, size_t n, float *y, const float *a, const float *b)
{
    if (!n) return cudaSuccess;
    add_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(n, y, a, b);
    return launched();
}

extern "C" cudaError_t sdk_add_bwd(sd_cuda *c, size_t n, float *da, float *db, const float *dy)
{
    if (!n || (!da && !db)) return cudaSuccess;
    add_bwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(n, da, db, dy);
    return launched();
}

/* y = alpha x. */
static __global__ void scale_fwd_kernel(size_t n, float *y, const float *x, float alpha)
{
    GRID_LOOP(i, n) y[i] = alpha * x[i];
}

/* dx += alpha dy. */
static __global__ void scale_bwd_kernel(size_t n, float *dx, const float *dy, float alpha)
{
    GRID_LOOP(i, n) dx[i] += alpha * dy[i];
}

extern "C" cudaError_t sdk_scale_fwd(sd_cuda *c, size_t n, float *y, const float *x, float alpha)
{
    if (!n) return cudaSuccess;
    scale_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(n, y, x, alpha);
    return launched();
}

extern "C" cudaError_t sdk_scale_bwd(sd_cuda *c, size_t n, float *dx, const float *dy, float alpha)
{
    if (!n || !dx) return cudaSuccess;
    scale_bwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(n, dx, dy, alpha);
    return launched();
}

/* y = a b. */
static __global__ void mul_fwd_kernel(size_t n, float *y, const float *a, const float *b)
{
    GRID_LOOP(i, n) y[i] = a[i] * b[i];
}

/* da += dy b, db += dy a. */
static __global__ void mul_bwd_kernel(size_t n, float *da, float *db, const float *dy, const float *a, const float *b)
{
    GRID_LOOP(i, n)
    {
        if (da) da[i] += dy[i] * b[i];
        if (db) db[i] += dy[i] * a[i];
    }
}

extern "C" cudaError_t sdk_mul_fwd(sd_cuda *c, size_t n, float *y, const float *a, const float *b)
{
    if (!n) return cudaSuccess;
    mul_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(n, y, a, b);
    return launched();
}

extern "C" cudaError_t sdk_mul_bwd(sd_cuda *c, size_t n, float *da, float *db, const float *dy, const float *a,
                                   const float *b)
{
    if (!n || (!da && !db)) return cudaSuccess;
    mul_bwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(n, da, db, dy, a, b);
    return launched();
}

/* GEGLU: output (r, j) = x[r, j] * gelu(x[r, n + j]). */
static __global__ void geglu_fwd_kernel(size_t m, size_t n, float *y, const float *x)
{
    GRID_LOOP(i, m * n)
    {
        size_t r = i / n, j = i % n;
        const float *xr = x + r * 2 * n;
        y[i] = xr[j] * sdm_gelu(xr[n + j]);
    }
}

/* GEGLU backward: each (r, j) owns its two gradient elements. */
static __global__ void geglu_bwd_kernel(size_t m, size_t n, float *dx, const float *dy, const float *x)
{
    GRID_LOOP(i, m * n)
    {
        size_t r = i / n, j = i % n;
        const float *xr = x + r * 2 * n;
        float *dr = dx + r * 2 * n, g = dy[i];
        dr[j] += g * sdm_gelu(xr[n + j]);
        dr[n + j] += g * xr[j] * sdm_gelu_grad(xr[n + j]);
    }
}

extern "C" cudaError_t sdk_geglu_fwd(sd_cuda *c, size_t m, size_t n, float *y, const float *x)
{
    if (!m || !n) return cudaSuccess;
    geglu_fwd_kernel<<<blocks_for(m * n), THREADS, 0, sdc_stream(c)>>>(m, n, y, x);
    return launched();
}

extern "C" cudaError_t sdk_geglu_bwd(sd_cuda *c, size_t m, size_t n, float *dx, const float *dy, const float *x)
{
    if (!m || !n || !dx) return cudaSuccess;
    geglu_bwd_kernel<<<blocks_for(m * n), THREADS, 0, sdc_stream(c)>>>(m, n, dx, dy, x);
    return launched();
}

/* Nearest 2x upsample: output (p, oy, ox) reads input (p, oy/2, ox/2). */
static __global__ void up_fwd_kernel(size_t planes, int h, int w, float *y, const float *x)
{
    size_t ow = 2 * (size_t)w, ohw = 4 * (size_t)h * (size_t)w;
    GRID_LOOP(i, planes * ohw)
    {
        size_t p = i / ohw, rem = i % ohw, oy = rem / ow, ox = rem % ow;
        y[i] = x[p * (size_t)h * (size_t)w + (oy / 2) * (size_t)w + ox / 2];
    }
}

/* Backward: each input pixel sums its 2x2 block in the CPU's order. */
static __global__ void up_bwd_kernel(size_t planes, int h, int w, float *dx, const float *dy)
{
    size_t hw = (size_t)h * (size_t)w, ow = 2 * (size_t)w;
    GRID_LOOP(i, planes * hw)
    {
        size_t p = i / hw, rem = i % hw, iy = rem / (size_t)w, ix = rem % (size_t)w;
        const float *d0 = dy + p * 4 * hw + 2 * iy * ow, *d1 = d0 + ow;
        dx[i] += (d0[2 * ix] + d0[2 * ix + 1]) + (d1[2 * ix] + d1[2 * ix + 1]);
    }
}

extern "C" cudaError_t sdk_upsample2x_fwd(sd_cuda *c, int planes, int h, int w, float *y, const float *x)
{
    size_t n = (size_t)planes * 4 * (size_t)h * (size_t)w;
    if (!n) return cudaSuccess;
    up_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>((size_t)planes, h, w, y, x);
    return launched();
}

extern "C" cudaError_t sdk_upsample2x_bwd(sd_cuda *c, int planes, int h, int w, float *dx, const float *dy)
{
    size_t n = (size_t)planes * (size_t)h * (size_t)w;
    if (!n || !dx) return cudaSuccess;
    up_bwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>((size_t)planes, h, w, dx, dy);
    return launched();
}

/* Channel concat: output element (img, ch, i) from a or b. */
static __global__ void concat_fwd_kernel(sd_concat_shape s, float *y, const float *a, const float *b)
{
    size_t hw = (size_t)s.hw, ct = (size_t)s.c1 + (size_t)s.c2;
    GRID_LOOP(e, (size_t)s.n * ct * hw)
    {
        size_t u = e / hw, i = e % hw, img = u / ct, ch = u % ct;
        y[e] = ch < (size_t)s.c1 ? a[(img * (size_t)s.c1 + ch) * hw + i]
                                 : b[(img * (size_t)s.c2 + ch - (size_t)s.c1) * hw + i];
    }
}

/* Concat backward: dy element e goes to the one input element it came from. */
static __global__ void concat_bwd_kernel(sd_concat_shape s, float *da, float *db, const float *dy)
{
    size_t hw = (size_t)s.hw, ct = (size_t)s.c1 + (size_t)s.c2;
    GRID_LOOP(e, (size_t)s.n * ct * hw)
    {
        size_t u = e / hw, i = e % hw, img = u / ct, ch = u % ct;
        if (ch < (size_t)s.c1) {
            if (da) da[(img * (size_t)s.c1 + ch) * hw + i] += dy[e];
        } else if (db) {
            db[(img * (size_t)s.c2 + ch - (size_t)s.c1) * hw + i] += dy[e];
        }
    }
}

extern "C" cudaError_t sdk_concat_fwd(sd_cuda *c, const sd_concat_shape *s, float *y, const float *a, const float *b)
{
    size_t n = (size_t)s->n * ((size_t)s->c1 + (size_t)s->c2) * (size_t)s->hw;
    if (!n) return cudaSuccess;
    concat_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(*s, y, a, b);
    return launched();
}

extern "C" cudaError_t sdk_concat_bwd(sd_cuda *c, const sd_concat_shape *s, float *da, float *db, const float *dy)
{
    size_t n = (size_t)s->n * ((size_t)s->c1 + (size_t)s->c2) * (size_t)s->hw;
    if (!n || (!da && !db)) return cudaSuccess;
    concat_bwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(*s, da, db, dy);
    return launched();
}

/* Sum of v over the block (THREADS threads), valid in thread 0. */
static __device__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    if (threadIdx.x == 0)
        for (int i = 0; i < THREADS / 32; i++) s += red[i];
    __syncthreads();
    return s;
}

/* y[u, i] = x[u, i] + b[u] for every plane u. */
static __global__ void bcast_fwd_kernel(size_t planes, size_t hw, float *y, const float *x, const float *b)
{
    GRID_LOOP(e, planes * hw) y[e] = x[e] + b[e / hw];
}

/* One block per plane: dx += dy over the plane, db[u] += its sum. */
static __global__ void bcast_bwd_kernel(size_t hw, float *dx, float *db, const float *dy)
{
    __shared__ float red[THREADS / 32];
    size_t u = blockIdx.x;
    const float *g = dy + u * hw;
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < hw; i += THREADS) {
        s += g[i];
        if (dx) dx[u * hw + i] += g[i];
    }
    if (!db) return;
    s = block_sum(s, red);
    if (threadIdx.x == 0) db[u] += s;
}

extern "C" cudaError_t sdk_add_bcast_fwd(sd_cuda *c, int n, int ch, int hw, float *y, const float *x, const float *b)
{
    size_t planes = (size_t)n * (size_t)ch, cnt = planes * (size_t)hw;
    if (!cnt) return cudaSuccess;
    bcast_fwd_kernel<<<blocks_for(cnt), THREADS, 0, sdc_stream(c)>>>(planes, (size_t)hw, y, x, b);
    return launched();
}

extern "C" cudaError_t sdk_add_bcast_bwd(sd_cuda *c, int n, int ch, int hw, float *dx, float *db, const float *dy)
{
    size_t planes = (size_t)n * (size_t)ch;
    if (!planes || !hw || (!dx && !db)) return cudaSuccess;
    if (planes > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    bcast_bwd_kernel<<<(unsigned)planes, THREADS, 0, sdc_stream(c)>>>((size_t)hw, dx, db, dy);
    return launched();
}

/* Timestep embedding: item (r, i) writes column i of both halves. */
static __global__ void temb_fwd_kernel(sd_temb_shape s, float *y, const float *t)
{
    int half = s.dim / 2;
    GRID_LOOP(e, (size_t)s.n * (size_t)half)
    {
        size_t r = e / (size_t)half;
        int i = (int)(e % (size_t)half);
        float *yr = y + r * (size_t)s.dim;
        float arg = s.scale * (t[r] * sdm_temb_freq(s.dim, s.freq_shift, s.max_period, i));
        yr[s.flip_sin_to_cos ? half + i : i] = sinf(arg);
        yr[s.flip_sin_to_cos ? i : half + i] = cosf(arg);
        if (i == 0 && (s.dim & 1)) yr[s.dim - 1] = 0.0f;
    }
}

/* Timestep gradient: one thread per row, summed in the CPU's order (from
 * CUDA's sinf/cosf/expf: not the CPU's bits). */
static __global__ void temb_bwd_kernel(sd_temb_shape s, float *dt, const float *dy, const float *t)
{
    int half = s.dim / 2;
    GRID_LOOP(r, (size_t)s.n)
    {
        const float *gr = dy + r * (size_t)s.dim;
        const float *gsin = s.flip_sin_to_cos ? gr + half : gr, *gcos = s.flip_sin_to_cos ? gr : gr + half;
        float acc = 0.0f;
        for (int i = 0; i < half; i++) {
            float f = sdm_temb_freq(s.dim, s.freq_shift, s.max_period, i), arg = s.scale * (t[r] * f);
            acc += s.scale * f * (gsin[i] * cosf(arg) - gcos[i] * sinf(arg));
        }
        dt[r] += acc;
    }
}

extern "C" cudaError_t sdk_temb_fwd(sd_cuda *c, const sd_temb_shape *s, float *y, const float *t)
{
    size_t n = (size_t)s->n * (size_t)(s->dim / 2);
    if (!n) return cudaSuccess;
    temb_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(*s, y, t);
    return launched();
}

extern "C" cudaError_t sdk_temb_bwd(sd_cuda *c, const sd_temb_shape *s, float *dt, const float *dy, const float *t)
{
    if (!dt || s->n <= 0) return cudaSuccess;
    temb_bwd_kernel<<<blocks_for((size_t)s->n), THREADS, 0, sdc_stream(c)>>>(*s, dt, dy, t);
    return launched();
}

/* Token + position embedding: output (r, i) = tok[ids[r], i] + pos[r % t, i]. */
static __global__ void emb_fwd_kernel(sd_embedding_shape s, float *y, const int32_t *ids, const float *tok,
                                      const float *pos)
{
    size_t dim = (size_t)s.dim, t = (size_t)s.t;
    GRID_LOOP(e, (size_t)s.n * t * dim)
    {
        size_t r = e / dim, i = e % dim;
        float v = tok[(size_t)ids[r] * dim + i];
        y[e] = pos ? v + pos[(r % t) * dim + i] : v;
    }
}

/* Token-table gradient without atomics: thread (column i, vocabulary
 * slice v) walks every token in order and adds the ones whose id is in
 * its slice, so each row sums in sequence order, as on the CPU. */
static __global__ void emb_dtok_kernel(sd_embedding_shape s, int slices, float *dtok, const float *dy,
                                       const int32_t *ids)
{
    size_t dim = (size_t)s.dim, ntok = (size_t)s.n * (size_t)s.t;
    size_t per = ((size_t)s.vocab + (size_t)slices - 1) / (size_t)slices;
    GRID_LOOP(e, dim * (size_t)slices)
    {
        size_t i = e % dim, v0 = (e / dim) * per, v1 = v0 + per;
        for (size_t r = 0; r < ntok; r++) {
            size_t id = (size_t)ids[r];
            if (id >= v0 && id < v1) dtok[id * dim + i] += dy[r * dim + i];
        }
    }
}

/* Position-table gradient: (p, i) sums the batch in order. */
static __global__ void emb_dpos_kernel(sd_embedding_shape s, float *dpos, const float *dy)
{
    size_t dim = (size_t)s.dim, t = (size_t)s.t;
    GRID_LOOP(e, t * dim)
    {
        size_t p = e / dim, i = e % dim;
        float acc = dpos[e];
        for (size_t b = 0; b < (size_t)s.n; b++) acc += dy[(b * t + p) * dim + i];
        dpos[e] = acc;
    }
}

extern "C" cudaError_t sdk_embedding_fwd(sd_cuda *c, const sd_embedding_shape *s, float *y, const int32_t *ids,
                                         const float *tok, const float *pos)
{
    size_t n = (size_t)s->n * (size_t)s->t * (size_t)s->dim;
    if (!n) return cudaSuccess;
    emb_fwd_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(*s, y, ids, tok, s->npos > 0 ? pos : NULL);
    return launched();
}

extern "C" cudaError_t sdk_embedding_bwd(sd_cuda *c, const sd_embedding_shape *s, float *dtok, float *dpos,
                                         const float *dy, const int32_t *ids)
{
    if (dtok) {
        int slices = s->vocab < 64 ? s->vocab : 64;
        emb_dtok_kernel<<<blocks_for((size_t)s->dim * (size_t)slices), THREADS, 0, sdc_stream(c)>>>(*s, slices, dtok,
                                                                                                     dy, ids);
        cudaError_t e = launched();
        if (e != cudaSuccess) return e;
    }
    if (dpos && s->npos > 0) {
        emb_dpos_kernel<<<blocks_for((size_t)s->t * (size_t)s->dim), THREADS, 0, sdc_stream(c)>>>(*s, dpos, dy);
        return launched();
    }
    return cudaSuccess;
}

#define TILE 32

/* Batched transpose through a padded 32x32 shared tile (both global
 * sides coalesced); block (32, 8), grid (col tiles, row tiles, n). */
static __global__ void transpose_kernel(int rows, int cols, float *y, const float *x, int accumulate)
{
    __shared__ float tile[TILE][TILE + 1];
    size_t img = blockIdx.z, plane = (size_t)rows * (size_t)cols;
    const float *xb = x + img * plane;
    float *yb = y + img * plane;
    int c0 = blockIdx.x * TILE, r0 = blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += 8) {
        int r = r0 + j, col = c0 + threadIdx.x;
        if (r < rows && col < cols) tile[j][threadIdx.x] = xb[(size_t)r * (size_t)cols + (size_t)col];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += 8) {
        int col = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && col < cols) {
            float *o = &yb[(size_t)col * (size_t)rows + (size_t)r];
            *o = accumulate ? *o + tile[threadIdx.x][j] : tile[threadIdx.x][j];
        }
    }
}

extern "C" cudaError_t sdk_transpose(sd_cuda *c, int n, int rows, int cols, float *y, const float *x, int accumulate)
{
    if (n <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
    if (n > 65535 || (rows + TILE - 1) / TILE > 65535) return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)((cols + TILE - 1) / TILE), (unsigned)((rows + TILE - 1) / TILE), (unsigned)n);
    transpose_kernel<<<grid, dim3(TILE, 8), 0, sdc_stream(c)>>>(rows, cols, y, x, accumulate);
    return launched();
}

/* Zero-padded copy: padded element (p, i, j) reads (p, i - pt, j - pl). */
static __global__ void pad_kernel(size_t planes, int h, int w, int pt, int pl, int hp, int wp, float *xp,
                                  const float *x)
{
    size_t php = (size_t)hp * (size_t)wp;
    GRID_LOOP(e, planes * php)
    {
        size_t p = e / php, rem = e % php;
        int i = (int)(rem / (size_t)wp) - pt, j = (int)(rem % (size_t)wp) - pl;
        xp[e] = (i >= 0 && i < h && j >= 0 && j < w) ? x[p * (size_t)h * (size_t)w + (size_t)i * (size_t)w + j] : 0.0f;
    }
}

/* dx (p, i, j) += padded gradient (p, i + pt, j + pl). */
static __global__ void crop_add_kernel(size_t planes, int h, int w, int pt, int pl, int hp, int wp, float *dx,
                                       const float *dxp)
{
    size_t hw = (size_t)h * (size_t)w;
    GRID_LOOP(e, planes * hw)
    {
        size_t p = e / hw, rem = e % hw, i = rem / (size_t)w, j = rem % (size_t)w;
        dx[e] += dxp[p * (size_t)hp * (size_t)wp + (i + (size_t)pt) * (size_t)wp + j + (size_t)pl];
    }
}

extern "C" cudaError_t sdk_pad(sd_cuda *c, size_t planes, int h, int w, int pt, int pb, int pl, int pr, float *xp,
                               const float *x)
{
    int hp = h + pt + pb, wp = w + pl + pr;
    size_t n = planes * (size_t)hp * (size_t)wp;
    if (!n) return cudaSuccess;
    pad_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(planes, h, w, pt, pl, hp, wp, xp, x);
    return launched();
}

extern "C" cudaError_t sdk_crop_add(sd_cuda *c, size_t planes, int h, int w, int pt, int pb, int pl, int pr,
                                    float *dx, const float *dxp)
{
    size_t n = planes * (size_t)h * (size_t)w;
    if (!n) return cudaSuccess;
    crop_add_kernel<<<blocks_for(n), THREADS, 0, sdc_stream(c)>>>(planes, h, w, pt, pl, h + pt + pb, w + pl + pr, dx,
                                                                  dxp);
    return launched();
}

/* y [m, n] rows = b. */
static __global__ void bias_rows_kernel(size_t m, size_t n, float *y, const float *b)
{
    GRID_LOOP(e, m * n) y[e] = b[e % n];
}

/* out[j] += sum over rows of x[:, j]: block (32 columns, 8 row lanes),
 * each lane sums rows lane, lane + 8, ..., then the 8 partials in order. */
static __global__ void col_sum_kernel(size_t m, size_t n, float *out, const float *x)
{
    __shared__ float part[8][33];
    size_t j = (size_t)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (j < n)
        for (size_t r = threadIdx.y; r < m; r += 8) s += x[r * n + j];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += part[k][threadIdx.x];
        out[j] += t;
    }
}

extern "C" cudaError_t sdk_bias_rows(sd_cuda *c, size_t m, size_t n, float *y, const float *b)
{
    if (!m || !n) return cudaSuccess;
    bias_rows_kernel<<<blocks_for(m * n), THREADS, 0, sdc_stream(c)>>>(m, n, y, b);
    return launched();
}

extern "C" cudaError_t sdk_col_sum_add(sd_cuda *c, size_t m, size_t n, float *out, const float *x)
{
    if (!m || !n) return cudaSuccess;
    size_t blocks = (n + 31) / 32;
    if (blocks > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    col_sum_kernel<<<(unsigned)blocks, dim3(32, 8), 0, sdc_stream(c)>>>(m, n, out, x);
    return launched();
}
