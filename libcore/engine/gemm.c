/* sd_sgemm over OpenBLAS's cblas_sgemm, forced to one thread per call. */
#include "gemm.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

/* OpenBLAS would otherwise start its own threads inside each call, which
 * oversubscribes sd_pool's workers and may split a reduction by thread
 * count. Set once, before the first call from any thread. */
static void blas_init(void)
{
    openblas_set_num_threads(1);
}

/* Row-major sgemm on the calling thread (see gemm.h). */
void sd_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
              float beta, float *c, int ldc)
{
    pthread_once(&blas_once, blas_init);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                lda, b, ldb, beta, c, ldc);
}

/* Per-worker blocks rounded up to whole cache lines so that no two workers
 * write one line. */
size_t sd_scratch_stride(size_t per_worker)
{
    return (per_worker + 15) & ~(size_t)15;
}

/* The size of the one allocation below, shared with the memory plan. */
size_t sd_scratch_bytes(int nworkers, size_t per_worker)
{
    size_t stride = sd_scratch_stride(per_worker), n = (size_t)(nworkers > 0 ? nworkers : 1);
    if (stride && n > (size_t)-1 / sizeof(float) / stride) return (size_t)-1;
    return n * (stride ? stride : 16) * sizeof(float);
}

/* One allocation for all workers' scratch (see gemm.h). */
float *sd_scratch_alloc(int nworkers, size_t per_worker)
{
    size_t bytes = sd_scratch_bytes(nworkers, per_worker);
    return bytes == (size_t)-1 ? NULL : aligned_alloc(64, bytes);
}
