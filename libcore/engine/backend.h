/* The backend boundary: one table of entry points per device. Models call
 * ops and move memory only through a table, so the same model code runs on
 * the CPU (sd_backend_cpu) and on a GPU (sd_backend_cuda in
 * libcore/engine/cuda/sd_cuda.h) unchanged.
 *
 * exec: every entry takes the backend's execution context first, opaque to
 * the model. The CPU table's exec is the sd_pool * (NULL = one thread); the
 * CUDA table's is its sd_cuda * (device, stream, cuBLAS/cuDNN handles,
 * caching allocator). A caller holding an sd_pool * passes it as it is.
 *
 * Memory: every pointer an op receives lives in the backend's memory (host
 * memory for the CPU, device memory for CUDA: never dereference it on the
 * host when is_device is set). alloc/release hand out that memory (64-byte
 * aligned; NULL when it runs out), h2d/d2h/d2d copy bytes into, out of and
 * within it, zero clears bytes. On the CPU these are malloc and memcpy.
 *
 * Order and errors: a device backend queues ops and copies in call order
 * on one stream, so each sees the results of the ones before it. h2d
 * returns once src may be reused, d2h once dst holds the data. Ops return
 * nothing: a device failure (launch, cuDNN, cuBLAS, out of memory) is kept
 * in exec, the first one wins, and sync waits for the queued work and
 * returns it (then clears it). On the CPU everything is done on return and
 * sync returns SD_OK.
 *
 * Op signatures and conventions (backward adds into gradients, NULL skips
 * one) are those of ops_cpu.h, with void *exec in place of sd_pool *.
 * Optional entries (marked so below) may be NULL: the caller then takes
 * the general ops instead. */
#ifndef SDTK_BACKEND_H
#define SDTK_BACKEND_H

#include "ops_cpu.h"

typedef struct {
    const char *name;
    int is_device; /* pointers are device memory, not host-readable */
    void *(*alloc)(void *, size_t bytes);
    void (*release)(void *, void *p);
    void (*h2d)(void *, void *dst, const void *src, size_t bytes);
    void (*d2h)(void *, void *dst, const void *src, size_t bytes);
    void (*d2d)(void *, void *dst, const void *src, size_t bytes);
    void (*zero)(void *, void *p, size_t bytes);
    sd_status (*sync)(void *, sd_error *err);
    void (*conv2d_fwd)(void *, const sd_conv2d_shape *, float *, const float *, const float *, const float *);
    void (*conv2d_bwd)(void *, const sd_conv2d_shape *, float *, float *, float *, const float *, const float *,
                       const float *);
    void (*group_norm_fwd)(void *, const sd_gn_shape *, float *, float *, float *, const float *, const float *,
                           const float *);
    void (*group_norm_bwd)(void *, const sd_gn_shape *, float *, float *, float *, const float *, const float *,
                           const float *, const float *, const float *);
    void (*linear_fwd)(void *, const sd_linear_shape *, float *, const float *, const float *, const float *);
    void (*linear_bwd)(void *, const sd_linear_shape *, float *, float *, float *, const float *, const float *,
                       const float *);
    /* optional: linear + activation in one pass (sd_linear_act_fwd); CPU only */
    void (*linear_act_fwd)(void *, const sd_linear_shape *, sd_act, int, float *, const float *, const void *,
                           const float *);
    void (*silu_fwd)(void *, size_t, float *, const float *);
    void (*silu_bwd)(void *, size_t, float *, const float *, const float *);
    void (*add_fwd)(void *, size_t, float *, const float *, const float *);
    void (*add_bwd)(void *, size_t, float *, float *, const float *);
    void (*upsample2x_fwd)(void *, int, int, int, float *, const float *);
    void (*upsample2x_bwd)(void *, int, int, int, float *, const float *);
    void (*attn_fwd)(void *, const sd_attn_shape *, float *, float *, const float *, const float *, const float *);
    /* optional: 16-bit activation storage (ops_store.c; x and y dtypes of
     * dtype.h, fp32 weights and arithmetic); CPU only */
    void (*conv2d_fwd_st)(void *, const sd_conv2d_shape *, int, void *, int, const void *, const float *,
                          const float *);
    void (*group_norm_fwd_st)(void *, const sd_gn_shape *, int, int, void *, float *, float *, int, const void *,
                              const float *, const float *);
    void (*add_fwd_st)(void *, size_t, int, void *, const void *, const void *);
    void (*convert_st)(void *, size_t, int, void *, int, const void *);
    void (*attn_bwd)(void *, const sd_attn_shape *, float *, float *, float *, const float *, const float *,
                     const float *, const float *, const float *, const float *);
    /* optional: attention on token-major rows (sd_attn_rows_fwd); CPU only */
    void (*attn_rows_fwd)(void *, const sd_attn_shape *, int, float *, float *, const float *, const float *,
                          const float *);
    void (*layer_norm_fwd)(void *, const sd_ln_shape *, float *, float *, float *, const float *, const float *,
                           const float *);
    void (*layer_norm_bwd)(void *, const sd_ln_shape *, float *, float *, float *, const float *, const float *,
                           const float *, const float *, const float *);
    void (*gelu_fwd)(void *, size_t, float *, const float *);
    void (*gelu_bwd)(void *, size_t, float *, const float *, const float *);
    void (*quick_gelu_fwd)(void *, size_t, float *, const float *);
    void (*quick_gelu_bwd)(void *, size_t, float *, const float *, const float *);
    void (*geglu_fwd)(void *, size_t, size_t, float *, const float *);
    void (*geglu_bwd)(void *, size_t, size_t, float *, const float *, const float *);
    void (*scale_fwd)(void *, size_t, float *, const float *, float);
    void (*scale_bwd)(void *, size_t, float *, const float *, float);
    void (*mul_fwd)(void *, size_t, float *, const float *, const float *);
    void (*mul_bwd)(void *, size_t, float *, float *, const float *, const float *, const float *);
    void (*concat_fwd)(void *, const sd_concat_shape *, float *, const float *, const float *);
    void (*concat_bwd)(void *, const sd_concat_shape *, float *, float *, const float *);
    void (*add_bcast_channel_fwd)(void *, int, int, int, float *, const float *, const float *);
    void (*add_bcast_channel_bwd)(void *, int, int, int, float *, float *, const float *);
    void (*timestep_emb_fwd)(void *, const sd_temb_shape *, float *, const float *);
    void (*timestep_emb_bwd)(void *, const sd_temb_shape *, float *, const float *, const float *);
    void (*transpose_fwd)(void *, int, int, int, float *, const float *);
    void (*transpose_bwd)(void *, int, int, int, float *, const float *);
    void (*gauss_std_fwd)(void *, size_t, float *, const float *);
    void (*gauss_std_bwd)(void *, size_t, float *, const float *, const float *);
    void (*embedding_fwd)(void *, const sd_embedding_shape *, float *, const int32_t *, const float *, const float *);
    void (*embedding_bwd)(void *, const sd_embedding_shape *, float *, float *, const float *, const int32_t *);
    /* optimizer: sum_squares waits for the queued work and returns the sum
     * (NaN after a device failure, which sync then reports) */
    double (*sum_squares)(void *, size_t, const float *);
    void (*adamw)(void *, const sd_adamw_args *, size_t, float *, float *, float *, const float *);
    /* AdamW with bf16 moments (sd_adamw_bf16_fwd: n, index0, p, m, v, g) */
    void (*adamw_bf16)(void *, const sd_adamw_args *, size_t, size_t, float *, uint16_t *, uint16_t *,
                       const float *);
    void (*ema)(void *, size_t, float *, const float *, float);
    /* 8-bit AdamW (sd_adamw8_fwd) and Adafactor (sd_adafactor_fwd), one
     * step over ntensors tensors: the descriptor array ts and the tables
     * are host memory (a device backend uploads the tables on first use
     * and keeps them: they are bitsandbytes' fixed maps), the pointers in
     * the descriptors and p, g are the backend's memory */
    void (*adamw8)(void *, const sd_adamw8_args *, const sd_q8_tables *, size_t, const sd_q8_tensor *, float *,
                   const float *);
    void (*adafactor)(void *, const sd_adafactor_args *, size_t, const sd_adafactor_tensor *, float *, const float *);
    /* bf16 weights: n values widened exactly (sd_bf16_widen_fwd), and n
     * fp32 values stored as bf16 with stochastic rounding keyed by (key,
     * index0 + i) (sd_bf16_store_sr_fwd) */
    void (*bf16_widen)(void *, size_t, float *, const uint16_t *);
    void (*bf16_store_sr)(void *, size_t, size_t, uint32_t, uint16_t *, const float *);
} sd_backend;

const sd_backend *sd_backend_cpu(void);

/* Buffers a model runner keeps in a backend's memory (vae_runner.c,
 * clip_text_runner.c): *p holds at least `bytes` afterwards (contents not
 * kept; *cap its size in bytes). Out of memory is SD_ENOMEM naming who and
 * what, with a device backend's own reason. */
sd_status sd_backend_grow(const sd_backend *be, void *exec, void **p, size_t *cap, size_t bytes, const char *who,
                          const char *what, sd_error *err);
/* A model's host parameters (floats of them) where the backend reads them:
 * on a host backend the buffer itself (*borrowed = 1: no second copy of
 * the weights), else a device copy (*borrowed = 0; the caller releases it). */
sd_status sd_backend_params_in(const sd_backend *be, void *exec, const float *host, size_t floats, float **out,
                               int *borrowed, const char *who, sd_error *err);
/* Releases *p when set and clears it, so a second release is harmless. */
void sd_backend_drop(const sd_backend *be, void *exec, void **p);

#endif
