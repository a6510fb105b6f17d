/* Adafactor on the GPU with the CPU reference's arithmetic
 * (libcore/engine/ops_adafactor.c), one tensor at a time. The second
 * moment's row and column means of g^2 + 1e-30 are summed in double by
 * one thread per row or column in the CPU's order (rows and columns are a
 * few thousand values: the same sums bit for bit), the row state's mean
 * per leading index likewise. The update's sum of squares for the RMS
 * clipping is the one reduction over a whole tensor: per-thread sums in
 * double over a fixed grid, a fixed tree per block, the blocks added in
 * order by one thread, which also computes the divisor (no round trip to
 * the host). It is the same value every run, but it may differ from the
 * CPU's sequential sum in its last bits, and the divisor (rounded to
 * fp32) with it in rare cases by one ulp. Element arithmetic uses
 * explicit round-to-nearest intrinsics (never a contracted multiply-add),
 * fmaf where the CPU calls fmaf. */
#include "cuda_kernels.h"

#define AF_THREADS 256
#define SS_BLOCKS 256

/* g times the clipping factor, squared, plus Adafactor's eps. */
static __device__ float sq_eps(float g, float gscale)
{
    float gi = __fmul_rn(g, gscale);
    return __fadd_rn(__fmul_rn(gi, gi), 1e-30f);
}

/* row[b, r] from the mean over the columns (one thread per row). */
static __global__ void rows_kernel(sd_adafactor_args a, size_t batch, size_t rows, size_t cols, float *row,
                                   const float *g)
{
    size_t br = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (br >= batch * rows) return;
    const float *gr = g + br * cols;
    double s = 0;
    for (size_t c = 0; c < cols; c++) s += (double)sq_eps(gr[c], a.gscale);
    row[br] = fmaf((float)(s / (double)cols), a.one_beta2t, __fmul_rn(row[br], a.beta2t));
}

/* col[b, c] from the mean over the rows (one thread per column, in row
 * order). */
static __global__ void cols_kernel(sd_adafactor_args a, size_t batch, size_t rows, size_t cols, float *col,
                                   const float *g)
{
    size_t bc = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (bc >= batch * cols) return;
    size_t b = bc / cols, c = bc % cols;
    const float *gb = g + b * rows * cols + c;
    double s = 0;
    for (size_t r = 0; r < rows; r++) s += (double)sq_eps(gb[r * cols], a.gscale);
    col[bc] = fmaf((float)(s / (double)rows), a.one_beta2t, __fmul_rn(col[bc], a.beta2t));
}

/* mean[b] = the mean of row[b, :] (one thread per leading index). */
static __global__ void row_mean_kernel(size_t batch, size_t rows, const float *row, float *mean)
{
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    double s = 0;
    for (size_t r = 0; r < rows; r++) s += row[b * rows + r];
    mean[b] = (float)(s / (double)rows);
}

/* The unfactored second moment (rank 1). */
static __global__ void v_kernel(sd_adafactor_args a, size_t n, float *v, const float *g)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        v[i] = fmaf(sq_eps(g[i], a.gscale), a.one_beta2t, __fmul_rn(v[i], a.beta2t));
}

/* The shape of one tensor's pass: rows and cols (1 and n unfactored). */
typedef struct {
    size_t rows, cols;
    const float *row, *col, *v, *mean;
} af_view;

/* Element i's preconditioned update u (ops_adafactor.c's pass):
 * rsqrt(row / mean) * rsqrt(col) * g factored, rsqrt(v) * g else. */
static __device__ float af_u(const af_view *w, float gscale, size_t i, float g)
{
    float gi = __fmul_rn(g, gscale);
    if (!w->row) return __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(w->v[i])), gi);
    size_t c = i % w->cols, br = i / w->cols, b = br / w->rows;
    float rf = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(w->row[br], w->mean[b])));
    return __fmul_rn(__fmul_rn(rf, __fdiv_rn(1.0f, __fsqrt_rn(w->col[b * w->cols + c]))), gi);
}

/* part[block] = the sum of u^2 over the block's grid-stride items, in
 * double, reduced in a fixed tree. */
static __global__ void ss_part_kernel(af_view w, float gscale, size_t n, const float *g, double *part)
{
    __shared__ double sh[AF_THREADS];
    double s = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double u = af_u(&w, gscale, i, g[i]);
        s = __dadd_rn(s, __dmul_rn(u, u)); /* the CPU's separate product and sum */
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = AF_THREADS / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

/* *d = max(1, rms(u) / clip_threshold) from the partials added in block
 * order (one thread). */
static __global__ void divisor_kernel(int nb, const double *part, size_t n, double clip, float *d)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double t = 0;
    for (int i = 0; i < nb; i++) t += part[i];
    double div = sqrt(t) / sqrt((double)n) / clip;
    *d = (float)(div > 1.0 ? div : 1.0);
}

/* The update applied: u / d * lr, through the first moment when there is
 * one, out of the weight after its decay. */
static __global__ void apply_kernel(sd_adafactor_args a, af_view w, size_t n, const float *d, float *m, float *p,
                                    const float *g)
{
    float dd = *d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float u = __fmul_rn(__fdiv_rn(af_u(&w, a.gscale, i, g[i]), dd), a.lr);
        if (m) {
            m[i] = fmaf(u, a.one_beta1, __fmul_rn(m[i], a.beta1));
            u = m[i];
        }
        float x = p[i];
        if (a.decay_on) x = fmaf(x, a.neg_wd_lr, x);
        p[i] = __fsub_rn(x, u);
    }
}

/* Blocks of AF_THREADS for one thread per item. */
static unsigned one_per(size_t n)
{
    size_t b = (n + AF_THREADS - 1) / AF_THREADS;
    return b ? (unsigned)b : 1u;
}

/* One tensor's step on the queue: the second moment, the RMS, the update.
 * scratch holds SS_BLOCKS + 1 doubles, then the row means. */
static cudaError_t af_tensor(cudaStream_t s, const sd_adafactor_args *a, const sd_adafactor_tensor *x, float *p,
                             const float *g, double *scratch)
{
    af_view w = {1, x->n, x->row, x->col, x->v, NULL};
    float *d = (float *)(scratch + SS_BLOCKS);
    if (x->row) {
        w.cols = (size_t)x->shape[x->ndim - 1];
        w.rows = (size_t)x->shape[x->ndim - 2];
        size_t batch = x->n / (w.rows * w.cols);
        float *mean = (float *)(scratch + SS_BLOCKS + 1);
        w.mean = mean;
        rows_kernel<<<one_per(batch * w.rows), AF_THREADS, 0, s>>>(*a, batch, w.rows, w.cols, x->row, g);
        cols_kernel<<<one_per(batch * w.cols), AF_THREADS, 0, s>>>(*a, batch, w.rows, w.cols, x->col, g);
        row_mean_kernel<<<one_per(batch), AF_THREADS, 0, s>>>(batch, w.rows, x->row, mean);
    } else {
        v_kernel<<<sdk_grid_blocks(x->n, AF_THREADS), AF_THREADS, 0, s>>>(*a, x->n, x->v, g);
    }
    ss_part_kernel<<<SS_BLOCKS, AF_THREADS, 0, s>>>(w, a->gscale, x->n, g, scratch);
    divisor_kernel<<<1, 1, 0, s>>>(SS_BLOCKS, scratch, x->n, a->clip_threshold, d);
    apply_kernel<<<sdk_grid_blocks(x->n, AF_THREADS), AF_THREADS, 0, s>>>(*a, w, x->n, d, x->m, p, g);
    return cudaGetLastError();
}

extern "C" cudaError_t sdk_adafactor(sd_cuda *c, const sd_adafactor_args *a, size_t nt, const sd_adafactor_tensor *ts,
                                     float *p, const float *g)
{
    size_t most = 0; /* the largest leading count of a factored tensor: its row means */
    for (size_t k = 0; k < nt; k++)
        if (ts[k].row) {
            size_t b = ts[k].n / ((size_t)ts[k].shape[ts[k].ndim - 1] * (size_t)ts[k].shape[ts[k].ndim - 2]);
            most = b > most ? b : most;
        }
    double *scratch = (double *)sdc_alloc(c, (SS_BLOCKS + 1) * sizeof(double) + most * sizeof(float) + 16);
    if (!scratch) return cudaErrorMemoryAllocation;
    cudaError_t e = cudaSuccess;
    for (size_t k = 0; k < nt && e == cudaSuccess; k++)
        if (ts[k].n) e = af_tensor(sdc_stream(c), a, &ts[k], p + ts[k].off, g + ts[k].off, scratch);
    sdc_release(c, scratch);
    return e;
}
