/* Linear layers on cuBLAS (cublasGemmEx, fp32 out, fp32 accumulation;
 * inputs fp32, TF32 tensor cores only when the context allows them, or
 * bf16/fp16 copies in mixed precision).
 *
 * cuBLAS is column-major: a row-major [r, c] array is the column-major
 * [c, r] matrix, its transpose. With y = x w^T (x [m, k], w [n, k],
 * y [m, n] row-major), the column-major views give
 *   y^T (n x m) = w (n x k, the transpose of w's k x n view) . x^T (k x m)
 *   dx^T (k x m) += w^T (k x n) . dy^T (n x m)
 *   dw^T (k x n) += x^T (k x m) . dy (m x n, the transpose of dy's view)
 * and db [n] += column sums of dy (a kernel). */
#include "cuda_int.h"
#include "dtype.h"

/* x itself in fp32, else rounded into a scratch copy the caller releases. */
const void *sdc_ab_operand(sd_cuda *c, const float *x, size_t n, void **tmp, const char *what)
{
    *tmp = NULL;
    if (!c->opts.mixed) return x;
    void *h = sdc_alloc(c, n * 2);
    if (!h) return NULL;
    if (!sdc_cuda_ok(c, sdk_to_half(c, c->opts.mixed, n, h, x), what)) {
        sdc_release(c, h);
        return NULL;
    }
    return *tmp = h;
}

/* C (col-major m x n, ldc, fp32) = op(A) op(B) + beta C, A and B of the
 * context's input type. */
static int gemm(sd_cuda *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *a, int lda,
                const void *b, int ldb, float beta, float *out, int ldc, const char *what)
{
    const float one = 1.0f;
    cudaDataType_t t = sdc_ab_type(c);
    return sdc_blas_ok(c,
                       cublasGemmEx(c->blas, ta, tb, m, n, k, &one, a, t, lda, b, t, ldb, &beta, out, CUDA_R_32F, ldc,
                                    sdc_blas_compute(c), CUBLAS_GEMM_DEFAULT),
                       what);
}

/* y [m, n] = x w^T + b: rows set to b first, then the GEMM adds. */
void sdc_linear_fwd(sd_cuda *c, const sd_linear_shape *s, float *y, const float *x, const float *w, const float *b)
{
    if (b && !sdc_cuda_ok(c, sdk_bias_rows(c, (size_t)s->m, (size_t)s->n, y, b), "linear bias")) return;
    void *tw = NULL, *tx = NULL;
    const void *wa = sdc_ab_operand(c, w, (size_t)s->n * (size_t)s->k, &tw, "linear weight");
    const void *xa = wa ? sdc_ab_operand(c, x, (size_t)s->m * (size_t)s->k, &tx, "linear input") : NULL;
    if (xa) gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s->n, s->m, s->k, wa, s->k, xa, s->k, b ? 1.0f : 0.0f, y, s->n,
                 "linear forward");
    sdc_release(c, tx);
    sdc_release(c, tw);
}

/* dx += dy w, dw += dy^T x, db += column sums of dy (each when not NULL). */
void sdc_linear_bwd(sd_cuda *c, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                    const float *x, const float *w)
{
    if (db) sdc_cuda_ok(c, sdk_col_sum_add(c, (size_t)s->m, (size_t)s->n, db, dy), "linear db");
    if (!dx && !dw) return;
    void *tdy = NULL, *tw = NULL, *tx = NULL;
    const void *dya = sdc_ab_operand(c, dy, (size_t)s->m * (size_t)s->n, &tdy, "linear output gradient");
    if (dya && dx) {
        const void *wa = sdc_ab_operand(c, w, (size_t)s->n * (size_t)s->k, &tw, "linear weight");
        if (wa) gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s->k, s->m, s->n, wa, s->k, dya, s->n, 1.0f, dx, s->k, "linear dx");
    }
    if (dya && dw) {
        const void *xa = sdc_ab_operand(c, x, (size_t)s->m * (size_t)s->k, &tx, "linear input");
        if (xa) gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s->k, s->n, s->m, xa, s->k, dya, s->n, 1.0f, dw, s->k, "linear dw");
    }
    sdc_release(c, tx);
    sdc_release(c, tw);
    sdc_release(c, tdy);
}
