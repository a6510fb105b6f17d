/* The backend boundary: one table of op entry points per device. The CPU
 * table points at ops_cpu.h; a CUDA table (issue 7) fills the same slots
 * with device pointers for the float arguments. Models call ops through a
 * table only, so they run on any backend unchanged. Signatures and
 * conventions (backward adds into gradients, NULL skips one) are those of
 * ops_cpu.h. The exec argument is the CPU thread pool today; a device
 * backend will need its own context (stream, handles) in that slot. */
#ifndef SDTK_BACKEND_H
#define SDTK_BACKEND_H

#include "ops_cpu.h"

typedef struct {
    const char *name;
    void (*conv2d_fwd)(sd_pool *, const sd_conv2d_shape *, float *, const float *, const float *, const float *);
    void (*conv2d_bwd)(sd_pool *, const sd_conv2d_shape *, float *, float *, float *, const float *, const float *,
                       const float *);
    void (*group_norm_fwd)(sd_pool *, const sd_gn_shape *, float *, float *, float *, const float *, const float *,
                           const float *);
    void (*group_norm_bwd)(sd_pool *, const sd_gn_shape *, float *, float *, float *, const float *, const float *,
                           const float *, const float *, const float *);
    void (*linear_fwd)(sd_pool *, const sd_linear_shape *, float *, const float *, const float *, const float *);
    void (*linear_bwd)(sd_pool *, const sd_linear_shape *, float *, float *, float *, const float *, const float *,
                       const float *);
    void (*silu_fwd)(sd_pool *, size_t, float *, const float *);
    void (*silu_bwd)(sd_pool *, size_t, float *, const float *, const float *);
    void (*add_fwd)(sd_pool *, size_t, float *, const float *, const float *);
    void (*add_bwd)(sd_pool *, size_t, float *, float *, const float *);
    void (*upsample2x_fwd)(sd_pool *, int, int, int, float *, const float *);
    void (*upsample2x_bwd)(sd_pool *, int, int, int, float *, const float *);
    void (*attn_fwd)(sd_pool *, const sd_attn_shape *, float *, float *, const float *, const float *,
                     const float *);
    void (*attn_bwd)(sd_pool *, const sd_attn_shape *, float *, float *, float *, const float *, const float *,
                     const float *, const float *, const float *, const float *);
    void (*layer_norm_fwd)(sd_pool *, const sd_ln_shape *, float *, float *, float *, const float *, const float *,
                           const float *);
    void (*layer_norm_bwd)(sd_pool *, const sd_ln_shape *, float *, float *, float *, const float *, const float *,
                           const float *, const float *, const float *);
    void (*gelu_fwd)(sd_pool *, size_t, float *, const float *);
    void (*gelu_bwd)(sd_pool *, size_t, float *, const float *, const float *);
    void (*quick_gelu_fwd)(sd_pool *, size_t, float *, const float *);
    void (*quick_gelu_bwd)(sd_pool *, size_t, float *, const float *, const float *);
    void (*geglu_fwd)(sd_pool *, size_t, size_t, float *, const float *);
    void (*geglu_bwd)(sd_pool *, size_t, size_t, float *, const float *, const float *);
    void (*scale_fwd)(sd_pool *, size_t, float *, const float *, float);
    void (*scale_bwd)(sd_pool *, size_t, float *, const float *, float);
    void (*mul_fwd)(sd_pool *, size_t, float *, const float *, const float *);
    void (*mul_bwd)(sd_pool *, size_t, float *, float *, const float *, const float *, const float *);
    void (*concat_fwd)(sd_pool *, const sd_concat_shape *, float *, const float *, const float *);
    void (*concat_bwd)(sd_pool *, const sd_concat_shape *, float *, float *, const float *);
    void (*add_bcast_channel_fwd)(sd_pool *, int, int, int, float *, const float *, const float *);
    void (*add_bcast_channel_bwd)(sd_pool *, int, int, int, float *, float *, const float *);
    void (*timestep_emb_fwd)(sd_pool *, const sd_temb_shape *, float *, const float *);
    void (*timestep_emb_bwd)(sd_pool *, const sd_temb_shape *, float *, const float *, const float *);
    void (*embedding_fwd)(sd_pool *, const sd_embedding_shape *, float *, const int32_t *, const float *,
                          const float *);
    void (*embedding_bwd)(sd_pool *, const sd_embedding_shape *, float *, float *, const float *, const int32_t *);
} sd_backend;

const sd_backend *sd_backend_cpu(void);

#endif
