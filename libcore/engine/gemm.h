/* The engine's one door to BLAS: single-threaded row-major sgemm (OpenBLAS
 * underneath) and per-worker scratch. Ops parallelise themselves over
 * output tiles with sd_pool and call sd_sgemm on fixed tile shapes, so a
 * result never depends on the thread count (OpenBLAS's own threads stay
 * off: a split of the reduction would change the rounding). */
#ifndef SDTK_GEMM_H
#define SDTK_GEMM_H

#include <stddef.h>

/* C[m, n] = alpha * op(A) op(B) + beta * C, all row-major; op(A) is
 * [m, k] (A stored [k, m] when ta), op(B) is [k, n] (B stored [n, k]
 * when tb). beta 0 ignores C's old contents. Runs on the calling thread. */
void sd_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
              float beta, float *c, int ldc);

/* nworkers blocks of per_worker floats, each 64-byte aligned, so worker w
 * uses sd_scratch + w * sd_scratch_stride(per_worker). NULL on failure
 * (callers fall back to their reference loops). free() it. */
float *sd_scratch_alloc(int nworkers, size_t per_worker);
size_t sd_scratch_stride(size_t per_worker);
/* The bytes sd_scratch_alloc(nworkers, per_worker) allocates (SIZE_MAX
 * when they overflow): the memory plan counts op scratch with it. */
size_t sd_scratch_bytes(int nworkers, size_t per_worker);

#endif
