/* Linear layers on cuBLAS (cublasGemmEx, fp32 in and out, fp32 compute;
 * TF32 tensor cores only when the context allows them).
 *
 * cuBLAS is column-major: a row-major [r, c] array is the column-major
 * [c, r] matrix, its transpose. With y = x w^T (x [m, k], w [n, k],
 * y [m, n] row-major), the column-major views give
 *   y^T (n x m) = w (n x k, the transpose of w's k x n view) . x^T (k x m)
 *   dx^T (k x m) += w^T (k x n) . dy^T (n x m)
 *   dw^T (k x n) += x^T (k x m) . dy (m x n, the transpose of dy's view)
 * and db [n] += column sums of dy (a kernel). */
#include "cuda_int.h"

/* fp32 compute, or TF32 tensor cores when allowed. */
cublasComputeType_t sdc_blas_compute(const sd_cuda *c)
{
    return c->opts.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* C (col-major m x n, ldc) = alpha op(A) op(B) + beta C, all fp32. */
static int gemm(sd_cuda *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float *a, int lda,
                const float *b, int ldb, float beta, float *out, int ldc, const char *what)
{
    const float one = 1.0f;
    return sdc_blas_ok(c,
                       cublasGemmEx(c->blas, ta, tb, m, n, k, &one, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &beta, out,
                                    CUDA_R_32F, ldc, sdc_blas_compute(c), CUBLAS_GEMM_DEFAULT),
                       what);
}

/* y [m, n] = x w^T + b: rows set to b first, then the GEMM adds. */
void sdc_linear_fwd(sd_cuda *c, const sd_linear_shape *s, float *y, const float *x, const float *w, const float *b)
{
    if (b && !sdc_cuda_ok(c, sdk_bias_rows(c, (size_t)s->m, (size_t)s->n, y, b), "linear bias")) return;
    gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s->n, s->m, s->k, w, s->k, x, s->k, b ? 1.0f : 0.0f, y, s->n, "linear forward");
}

/* dx += dy w, dw += dy^T x, db += column sums of dy (each when not NULL). */
void sdc_linear_bwd(sd_cuda *c, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                    const float *x, const float *w)
{
    if (dx) gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s->k, s->m, s->n, w, s->k, dy, s->n, 1.0f, dx, s->k, "linear dx");
    if (dw) gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s->k, s->n, s->m, x, s->k, dy, s->n, 1.0f, dw, s->k, "linear dw");
    if (db) sdc_cuda_ok(c, sdk_col_sum_add(c, (size_t)s->m, (size_t)s->n, db, dy), "linear db");
}
