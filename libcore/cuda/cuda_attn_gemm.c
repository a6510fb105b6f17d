/* Attention through cuBLAS: the score matrix is formed in blocks of whole
 * heads (or of query rows when one head's scores exceed the block,
 * attn_blocks.h) by strided batched GEMMs, turned into probabilities by
 * one kernel (cuda_scores.cu), and multiplied back by GEMMs. The flash
 * kernel (cuda_attn.cu) needs no T x T memory but runs on plain fp32 FMA
 * at a tenth of what cuBLAS reaches; this path trades at most 256 MiB of
 * scratch for the forward (512 MiB for the backward) for that speed, and
 * for TF32 tensor cores when the context allows them. When the scratch
 * cannot be had the caller takes the flash kernel, for the rest of the
 * context's life (a warning says so once): a failed allocation empties the
 * allocator's cache, which should not happen at every attention call, and
 * one path for the whole run keeps its rounding the same from step to
 * step.
 *
 * Head-major layout as everywhere (q [bh, tq, d], k and v [bh, tk, d]).
 * In cuBLAS's column-major terms a row-major [r, c] array is its c x r
 * transpose, so for a block of n query rows (Qn, dYn):
 *   S^T (tk x n)  = scale K Qn^T       P = softmax rows of S
 *   Yn^T (d x n)  = V^T P^T
 *   dP^T (tk x n) = V dYn^T             dS = P (dP - D) scale
 *   dQn^T (d x n) += K^T dS^T
 *   dK^T (d x tk) += Qn^T dS            dV^T (d x tk) += dYn^T P
 * each batched over the block's heads. dK and dV add up over the query
 * blocks in a fixed order: results do not vary from run to run. */
#include "attn_blocks.h"
#include "cuda_int.h"
#include "log.h"

/* One strided batched GEMM (fp32 in and out, the context's compute type):
 * C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch. */
static int bgemm(sd_cuda *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const float *a, int lda, long long sa, const float *b, int ldb, long long sb, float beta, float *out,
                 int ldc, long long sc, int batch, const char *what)
{
    return sdc_blas_ok(c,
                       cublasGemmStridedBatchedEx(c->blas, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, sa, b,
                                                  CUDA_R_32F, ldb, sb, &beta, out, CUDA_R_32F, ldc, sc, batch,
                                                  sdc_blas_compute(c), CUBLAS_GEMM_DEFAULT),
                       what);
}

/* The block's scaled scores S = scale Qn K^T for heads [h0, h0 + g) and
 * query rows [q0, q0 + n): g x n rows of tk in sbuf. */
static int scores(sd_cuda *c, const sd_attn_shape *s, size_t h0, int g, int q0, int n, float *sbuf, const float *q,
                  const float *k)
{
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    return bgemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s->tk, n, s->d, s->scale, k + h0 * tk * d, s->d,
                 (long long)(tk * d), q + (h0 * tq + (size_t)q0) * d, s->d, (long long)(tq * d), 0.0f, sbuf, s->tk,
                 (long long)n * (long long)tk, g, "attention scores");
}

/* Records that the scratch could not be had (why) and says so once. */
static int no_blocks(sd_cuda *c, size_t bytes, cudaError_t why)
{
    c->attn_no_blocks = 1;
    sd_log(SD_LOG_WARN, "cuda:%d: attention: %zu MiB for its blocks of scores could not be allocated (%s); attention "
           "runs on the slower flash kernel from now on", c->device, bytes >> 20, cudaGetErrorString(why));
    return 0;
}

/* Forward through cuBLAS: 1 when queued, 0 when the score block could not
 * be allocated (nothing queued: the caller takes the flash kernel). */
int sdc_attn_gemm_fwd(sd_cuda *c, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                      const float *v)
{
    if (c->attn_no_blocks) return 0;
    sd_attn_blocks bl = sd_attn_blocking(s, c->opts.attn_block);
    size_t bytes = sd_attn_block_bytes(s, c->opts.attn_block);
    cudaError_t why;
    float *sbuf = sdc_try_alloc(c, bytes, &why);
    if (!sbuf) return no_blocks(c, bytes, why);
    size_t bh = (size_t)s->b * (size_t)s->heads, d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    for (size_t h0 = 0; h0 < bh && !c->failed; h0 += (size_t)bl.heads) {
        int g = (int)(bh - h0 < (size_t)bl.heads ? bh - h0 : (size_t)bl.heads);
        for (int q0 = 0; q0 < s->tq && !c->failed; q0 += bl.rows) {
            int n = s->tq - q0 < bl.rows ? s->tq - q0 : bl.rows;
            if (!scores(c, s, h0, g, q0, n, sbuf, q, k)) break;
            if (!sdc_cuda_ok(c, sdk_attn_softmax(c, g * n, n, s->tk, q0, s->tq, s->causal, sbuf, lse + h0 * tq),
                             "attention softmax"))
                break;
            bgemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s->d, n, s->tk, 1.0f, v + h0 * tk * d, s->d, (long long)(tk * d), sbuf,
                  s->tk, (long long)n * (long long)tk, 0.0f, y + (h0 * tq + (size_t)q0) * d, s->d, (long long)(tq * d),
                  g, "attention P v");
        }
    }
    sdc_release(c, sbuf);
    return 1;
}

/* Backward through cuBLAS (adds into dq, dk, dv; NULL skips one): 1 when
 * queued, 0 when its scratch could not be allocated (nothing queued). */
int sdc_attn_gemm_bwd(sd_cuda *c, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                      const float *q, const float *k, const float *v, const float *y, const float *lse)
{
    if (!dq && !dk && !dv) return 1;
    if (c->attn_no_blocks) return 0;
    size_t bh = (size_t)s->b * (size_t)s->heads, d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    int need_ds = dq || dk;
    sd_attn_blocks bl = sd_attn_blocking(s, c->opts.attn_block);
    size_t bytes = sd_attn_block_bytes(s, c->opts.attn_block);
    cudaError_t why = cudaSuccess;
    float *sbuf = sdc_try_alloc(c, bytes, &why);
    float *dp = sbuf && need_ds ? sdc_try_alloc(c, bytes, &why) : NULL;
    float *drow = dp ? sdc_try_alloc(c, bh * tq * sizeof(float), &why) : NULL; /* D: only for dS */
    if (!sbuf || (need_ds && (!dp || !drow))) {
        sdc_release(c, drow);
        sdc_release(c, dp);
        sdc_release(c, sbuf);
        return no_blocks(c, need_ds ? 2 * bytes : bytes, why);
    }
    if (need_ds) sdc_cuda_ok(c, sdk_attn_drow(c, bh * tq, s->d, dy, y, drow), "attention backward D");
    for (size_t h0 = 0; h0 < bh && !c->failed; h0 += (size_t)bl.heads) {
        int g = (int)(bh - h0 < (size_t)bl.heads ? bh - h0 : (size_t)bl.heads);
        for (int q0 = 0; q0 < s->tq && !c->failed; q0 += bl.rows) {
            int n = s->tq - q0 < bl.rows ? s->tq - q0 : bl.rows;
            const float *qn = q + (h0 * tq + (size_t)q0) * d, *dyn = dy + (h0 * tq + (size_t)q0) * d;
            long long blk = (long long)n * (long long)tk; /* one head's part of the block */
            if (!scores(c, s, h0, g, q0, n, sbuf, q, k)) break;
            if (need_ds && !bgemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s->tk, n, s->d, 1.0f, v + h0 * tk * d, s->d,
                                  (long long)(tk * d), dyn, s->d, (long long)(tq * d), 0.0f, dp, s->tk, blk, g,
                                  "attention dy v^T"))
                break;
            if (!sdc_cuda_ok(c,
                             sdk_attn_dscores(c, g * n, n, s->tk, q0, s->tq, s->causal, s->scale, sbuf, dp,
                                              lse + h0 * tq, need_ds ? drow + h0 * tq : NULL),
                             "attention score gradients"))
                break;
            if (dq)
                bgemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s->d, n, s->tk, 1.0f, k + h0 * tk * d, s->d, (long long)(tk * d), dp,
                      s->tk, blk, 1.0f, dq + (h0 * tq + (size_t)q0) * d, s->d, (long long)(tq * d), g, "attention dq");
            if (dk)
                bgemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s->d, s->tk, n, 1.0f, qn, s->d, (long long)(tq * d), dp, s->tk, blk,
                      1.0f, dk + h0 * tk * d, s->d, (long long)(tk * d), g, "attention dk");
            if (dv)
                bgemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s->d, s->tk, n, 1.0f, dyn, s->d, (long long)(tq * d), sbuf, s->tk,
                      blk, 1.0f, dv + h0 * tk * d, s->d, (long long)(tk * d), g, "attention dv");
        }
    }
    sdc_release(c, drow);
    sdc_release(c, dp);
    sdc_release(c, sbuf);
    return 1;
}
