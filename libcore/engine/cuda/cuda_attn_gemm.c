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
 * Mixed precision (opts.mixed): q, k, v and dy are rounded to 16 bits
 * once per call, and each block's probabilities (and score gradients) are
 * rounded into a 16-bit copy before the GEMMs that take them; the scores,
 * the softmax and every output stay fp32.
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

/* An operand of the GEMMs: fp32 data or its 16-bit copy, addressed by
 * element. */
typedef struct {
    const void *p;
    size_t es;
} opnd;

/* The address of element i. */
static const void *at(opnd o, size_t i)
{
    return (const char *)o.p + i * o.es;
}

/* One strided batched GEMM (inputs of the context's input type, fp32 out,
 * the context's compute type): C_i = alpha op(A_i) op(B_i) + beta C_i for
 * i < batch. */
static int bgemm(sd_cuda *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 const void *a, int lda, long long sa, const void *b, int ldb, long long sb, float beta, float *out,
                 int ldc, long long sc, int batch, const char *what)
{
    cudaDataType_t t = sdc_ab_type(c);
    return sdc_blas_ok(c,
                       cublasGemmStridedBatchedEx(c->blas, ta, tb, m, n, k, &alpha, a, t, lda, sa, b, t, ldb, sb,
                                                  &beta, out, CUDA_R_32F, ldc, sc, batch, sdc_blas_compute(c),
                                                  CUBLAS_GEMM_DEFAULT),
                       what);
}

/* The block's scaled scores S = scale Qn K^T for heads [h0, h0 + g) and
 * query rows [q0, q0 + n): g x n rows of tk in sbuf. */
static int scores(sd_cuda *c, const sd_attn_shape *s, size_t h0, int g, int q0, int n, float *sbuf, opnd q, opnd k)
{
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    return bgemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s->tk, n, s->d, s->scale, at(k, h0 * tk * d), s->d, (long long)(tk * d),
                 at(q, (h0 * tq + (size_t)q0) * d), s->d, (long long)(tq * d), 0.0f, sbuf, s->tk,
                 (long long)n * (long long)tk, g, "attention scores");
}

/* n floats of a block as a GEMM operand: themselves, or rounded into hbuf
 * (the block's 16-bit scratch) in mixed precision. NULL on failure. */
static const void *block_operand(sd_cuda *c, const float *x, size_t n, void *hbuf)
{
    if (!c->opts.mixed) return x;
    return sdc_cuda_ok(c, sdk_to_half(c, c->opts.mixed, n, hbuf, x), "attention block to 16 bits") ? hbuf : NULL;
}

/* The 16-bit copies (or fp32 views) of an attention's inputs; tmp[] the
 * scratch to release. 0 when out of memory (recorded). */
static int operands(sd_cuda *c, const float *const *x, const size_t *n, opnd *o, void **tmp, int count)
{
    int ok = 1;
    for (int i = 0; i < count; i++) {
        tmp[i] = NULL;
        o[i] = (opnd){NULL, sdc_ab_size(c)};
        if (ok && x[i]) {
            o[i].p = sdc_ab_operand(c, x[i], n[i], &tmp[i], "attention input");
            ok = o[i].p != NULL;
        }
    }
    return ok;
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
    cudaError_t why = cudaSuccess;
    float *sbuf = sdc_try_alloc(c, bytes, &why);
    void *hbuf = sbuf && c->opts.mixed ? sdc_try_alloc(c, bytes / 2, &why) : NULL;
    if (!sbuf || (c->opts.mixed && !hbuf)) {
        sdc_release(c, sbuf);
        return no_blocks(c, c->opts.mixed ? bytes + bytes / 2 : bytes, why);
    }
    size_t bh = (size_t)s->b * (size_t)s->heads, d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    const float *in[3] = {q, k, v};
    size_t n_in[3] = {bh * tq * d, bh * tk * d, bh * tk * d};
    opnd o[3];
    void *tmp[3];
    if (operands(c, in, n_in, o, tmp, 3)) {
        for (size_t h0 = 0; h0 < bh && !c->failed; h0 += (size_t)bl.heads) {
            int g = (int)(bh - h0 < (size_t)bl.heads ? bh - h0 : (size_t)bl.heads);
            for (int q0 = 0; q0 < s->tq && !c->failed; q0 += bl.rows) {
                int n = s->tq - q0 < bl.rows ? s->tq - q0 : bl.rows;
                long long blk = (long long)n * (long long)tk;
                if (!scores(c, s, h0, g, q0, n, sbuf, o[0], o[1])) break;
                if (!sdc_cuda_ok(c, sdk_attn_softmax(c, g * n, n, s->tk, q0, s->tq, s->causal, sbuf, lse + h0 * tq),
                                 "attention softmax"))
                    break;
                const void *pa = block_operand(c, sbuf, (size_t)g * (size_t)blk, hbuf);
                if (!pa) break;
                bgemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s->d, n, s->tk, 1.0f, at(o[2], h0 * tk * d), s->d,
                      (long long)(tk * d), pa, s->tk, blk, 0.0f, y + (h0 * tq + (size_t)q0) * d, s->d,
                      (long long)(tq * d), g, "attention P v");
            }
        }
    }
    for (int i = 0; i < 3; i++) sdc_release(c, tmp[i]);
    sdc_release(c, hbuf);
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
    void *hbuf = sbuf && c->opts.mixed ? sdc_try_alloc(c, bytes / 2, &why) : NULL;
    if (!sbuf || (need_ds && (!dp || !drow)) || (c->opts.mixed && !hbuf)) {
        sdc_release(c, hbuf);
        sdc_release(c, drow);
        sdc_release(c, dp);
        sdc_release(c, sbuf);
        return no_blocks(c, (need_ds ? 2 * bytes : bytes) + (c->opts.mixed ? bytes / 2 : 0), why);
    }
    if (need_ds) sdc_cuda_ok(c, sdk_attn_drow(c, bh * tq, s->d, dy, y, drow), "attention backward D");
    const float *in[4] = {q, k, need_ds ? v : NULL, dy};
    size_t n_in[4] = {bh * tq * d, bh * tk * d, bh * tk * d, bh * tq * d};
    opnd o[4];
    void *tmp[4];
    if (operands(c, in, n_in, o, tmp, 4)) {
        opnd qo = o[0], ko = o[1], vo = o[2], dyo = o[3];
        for (size_t h0 = 0; h0 < bh && !c->failed; h0 += (size_t)bl.heads) {
            int g = (int)(bh - h0 < (size_t)bl.heads ? bh - h0 : (size_t)bl.heads);
            for (int q0 = 0; q0 < s->tq && !c->failed; q0 += bl.rows) {
                int n = s->tq - q0 < bl.rows ? s->tq - q0 : bl.rows;
                size_t qrow = (h0 * tq + (size_t)q0) * d;
                long long blk = (long long)n * (long long)tk; /* one head's part of the block */
                size_t all = (size_t)g * (size_t)blk;
                if (!scores(c, s, h0, g, q0, n, sbuf, qo, ko)) break;
                if (need_ds && !bgemm(c, CUBLAS_OP_T, CUBLAS_OP_N, s->tk, n, s->d, 1.0f, at(vo, h0 * tk * d), s->d,
                                      (long long)(tk * d), at(dyo, qrow), s->d, (long long)(tq * d), 0.0f, dp, s->tk,
                                      blk, g, "attention dy v^T"))
                    break;
                if (!sdc_cuda_ok(c,
                                 sdk_attn_dscores(c, g * n, n, s->tk, q0, s->tq, s->causal, s->scale, sbuf, dp,
                                                  lse + h0 * tq, need_ds ? drow + h0 * tq : NULL),
                                 "attention score gradients"))
                    break;
                const void *dsa = need_ds ? block_operand(c, dp, all, hbuf) : NULL;
                if (need_ds && !dsa) break;
                if (dq)
                    bgemm(c, CUBLAS_OP_N, CUBLAS_OP_N, s->d, n, s->tk, 1.0f, at(ko, h0 * tk * d), s->d,
                          (long long)(tk * d), dsa, s->tk, blk, 1.0f, dq + qrow, s->d, (long long)(tq * d), g,
                          "attention dq");
                if (dk)
                    bgemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s->d, s->tk, n, 1.0f, at(qo, qrow), s->d, (long long)(tq * d),
                          dsa, s->tk, blk, 1.0f, dk + h0 * tk * d, s->d, (long long)(tk * d), g, "attention dk");
                if (!dv) continue;
                const void *pa = block_operand(c, sbuf, all, hbuf); /* after dq and dk: hbuf is reused */
                if (!pa) break;
                bgemm(c, CUBLAS_OP_N, CUBLAS_OP_T, s->d, s->tk, n, 1.0f, at(dyo, qrow), s->d, (long long)(tq * d), pa,
                      s->tk, blk, 1.0f, dv + h0 * tk * d, s->d, (long long)(tk * d), g, "attention dv");
            }
        }
    }
    for (int i = 0; i < 4; i++) sdc_release(c, tmp[i]);
    sdc_release(c, hbuf);
    sdc_release(c, drow);
    sdc_release(c, dp);
    sdc_release(c, sbuf);
    return 1;
}
