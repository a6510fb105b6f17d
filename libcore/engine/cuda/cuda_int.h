/* The CUDA context behind sd_cuda *, shared by the host C files of the
 * backend (context and allocator, cuDNN convolutions, cuBLAS linear, the
 * table). Not for model code. */
#ifndef SDTK_CUDA_INT_H
#define SDTK_CUDA_INT_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "cuda_kernels.h"
#include "sd_cuda.h"

/* One device allocation the caching allocator tracks. */
typedef struct {
    void *p;
    size_t size;
    int used;
} sdc_block;

typedef struct sdc_conv_plan sdc_conv_plan;

struct sd_cuda {
    int device;
    sd_cuda_opts opts;
    size_t smem_optin;
    cudaStream_t stream;
    cublasHandle_t blas;
    cudnnHandle_t dnn;
    sdc_block *blk;
    size_t nblk, capblk;
    size_t in_use, cached, peak;
    int failed; /* an op failed since the last sync: later ops are skipped */
    sd_error err;
    sdc_conv_plan **plans;
    size_t nplans, capplans;
    int attn_no_blocks; /* the blocks of scores once could not be allocated: the flash kernel from then on */
    sd_q8_tables *q8_tables; /* 8-bit AdamW's maps in device memory, uploaded on first use */
};

/* Record the first failure since the last sync; later ones are dropped
 * (they usually follow from the first). */
void sdc_fail(sd_cuda *c, sd_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* 1 when e is cudaSuccess, else records "what: reason" and returns 0. */
int sdc_cuda_ok(sd_cuda *c, cudaError_t e, const char *what);
int sdc_dnn_ok(sd_cuda *c, cudnnStatus_t e, const char *what);
int sdc_blas_ok(sd_cuda *c, cublasStatus_t e, const char *what);

/* The context's own resources, freed after the queued work (cuda_ctx.c;
 * sd_cuda_destroy in cuda_backend.c frees the conv plans first). */
void sdc_ctx_free(sd_cuda *c);

/* The table's memory entries (cuda_ctx.c). */
void *sdc_mem_alloc(void *exec, size_t bytes);
void sdc_mem_release(void *exec, void *p);
void sdc_mem_h2d(void *exec, void *dst, const void *src, size_t bytes);
void sdc_mem_d2h(void *exec, void *dst, const void *src, size_t bytes);
void sdc_mem_d2d(void *exec, void *dst, const void *src, size_t bytes);
void sdc_mem_zero(void *exec, void *p, size_t bytes);
sd_status sdc_sync(void *exec, sd_error *err);

/* cuDNN convolutions (cuda_conv.c); plans freed with the context. */
void sdc_conv2d_fwd(sd_cuda *c, const sd_conv2d_shape *s, float *y, const float *x, const float *w, const float *b);
void sdc_conv2d_bwd(sd_cuda *c, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                    const float *x, const float *w);
void sdc_conv_plans_free(sd_cuda *c);

/* What every matrix product of the backend takes (cuda_ctx.c): the
 * compute type of cuBLAS calls (fp32, TF32 tensor cores when allowed, fp32
 * accumulation of 16-bit inputs in mixed precision), the type of their
 * inputs (CUDA_R_32F, or the mixed type) and its size in bytes. */
cublasComputeType_t sdc_blas_compute(const sd_cuda *c);
cudaDataType_t sdc_ab_type(const sd_cuda *c);
size_t sdc_ab_size(const sd_cuda *c);
/* cuBLAS linear layers (cuda_linear.c), and an fp32 buffer as a matrix
 * product's input: x itself, or a 16-bit copy of its n floats in scratch
 * (*tmp set: the caller releases it; NULL when out of memory, recorded). */
const void *sdc_ab_operand(sd_cuda *c, const float *x, size_t n, void **tmp, const char *what);
void sdc_linear_fwd(sd_cuda *c, const sd_linear_shape *s, float *y, const float *x, const float *w, const float *b);
void sdc_linear_bwd(sd_cuda *c, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                    const float *x, const float *w);

/* Attention through cuBLAS with the score matrix in blocks
 * (cuda_attn_gemm.c): 1 when queued, 0 when its scratch could not be had
 * and nothing was queued (the caller takes the flash kernel). */
int sdc_attn_gemm_fwd(sd_cuda *c, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                      const float *v);
int sdc_attn_gemm_bwd(sd_cuda *c, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                      const float *q, const float *k, const float *v, const float *y, const float *lse);

#endif
