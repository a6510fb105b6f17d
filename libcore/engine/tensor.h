/* Tensors of the compute engine: a dtype, up to 4 dims and a data pointer
 * into a caller-owned flat allocation (llm.c style: one flat buffer for all
 * parameters, one for activations, one for gradients, so checkpoints,
 * all-reduce and optimizer steps are flat loops). Always contiguous,
 * row-major: NCHW for images, [N, T, C] for sequences, [B, H, T, D] for
 * attention heads. */
#ifndef SDTK_TENSOR_H
#define SDTK_TENSOR_H

#include <stddef.h>

#include "dtype.h"
#include "err.h"

enum { SD_TENSOR_MAX_DIMS = 4 };

typedef struct {
    sd_dtype dtype; /* SD_DT_F32; the VAE forward's buffers may be F16/BF16 (act_store.h, ops_cpu.h *_st) */
    int ndim;
    int shape[SD_TENSOR_MAX_DIMS];
    float *data; /* not owned */
} sd_tensor;

/* Bump allocator over one flat float buffer the caller owns. */
typedef struct {
    float *base;
    size_t cap;  /* floats */
    size_t used; /* floats */
} sd_flat;

size_t sd_tensor_numel(const sd_tensor *t);
sd_status sd_tensor_init(sd_tensor *t, float *data, int ndim, const int *shape, sd_error *err);
int sd_tensor_same_shape(const sd_tensor *a, const sd_tensor *b);
void sd_flat_init(sd_flat *f, float *base, size_t cap);
size_t sd_flat_size(int ndim, const int *shape);
sd_status sd_flat_take(sd_flat *f, sd_tensor *t, int ndim, const int *shape, sd_error *err);

#endif
