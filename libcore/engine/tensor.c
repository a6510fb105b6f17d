/* Tensor shape helpers and the flat-buffer bump allocator. */
#include "tensor.h"

#include <stdint.h>

/* Tensors inside a flat buffer start on 64-byte boundaries (16 floats) so
 * SIMD loads and per-thread slices do not straddle cache lines. */
enum { SD_FLAT_ALIGN = 16 };

/* Number of elements; the product of the shape (1 for ndim 0). */
size_t sd_tensor_numel(const sd_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* Describe existing fp32 memory as a tensor, validating the shape so ops
 * never see negative or zero dims. */
sd_status sd_tensor_init(sd_tensor *t, float *data, int ndim, const int *shape, sd_error *err)
{
    if (ndim < 0 || ndim > SD_TENSOR_MAX_DIMS)
        return sd_err_set(err, SD_EINVAL, "tensor: %d dims (at most %d)", ndim, SD_TENSOR_MAX_DIMS);
    t->dtype = SD_DT_F32;
    t->ndim = ndim;
    for (int i = 0; i < SD_TENSOR_MAX_DIMS; i++) t->shape[i] = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) return sd_err_set(err, SD_EINVAL, "tensor: dim %d is %d", i, shape[i]);
        t->shape[i] = shape[i];
    }
    t->data = data;
    return SD_OK;
}

/* Same rank and dims; element-wise ops require it. */
int sd_tensor_same_shape(const sd_tensor *a, const sd_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* Start handing out tensors from base[0..cap). */
void sd_flat_init(sd_flat *f, float *base, size_t cap)
{
    f->base = base;
    f->cap = cap;
    f->used = 0;
}

/* Floats a tensor of this shape takes in a flat buffer, alignment included,
 * so a model can size its buffers in a planning pass before allocating. */
size_t sd_flat_size(int ndim, const int *shape)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)(shape[i] > 0 ? shape[i] : 0);
    return (n + SD_FLAT_ALIGN - 1) / SD_FLAT_ALIGN * SD_FLAT_ALIGN;
}

/* Carve the next tensor out of the flat buffer; SD_ENOMEM when it does not
 * fit (the planning pass was wrong), never a partial tensor. With a NULL
 * base only the size is counted, which is the planning pass. */
sd_status sd_flat_take(sd_flat *f, sd_tensor *t, int ndim, const int *shape, sd_error *err)
{
    sd_status st = sd_tensor_init(t, NULL, ndim, shape, err);
    if (st != SD_OK) return st;
    size_t need = sd_flat_size(ndim, shape);
    if (f->base && need > f->cap - f->used)
        return sd_err_set(err, SD_ENOMEM, "flat buffer: need %zu floats, %zu left", need, f->cap - f->used);
    t->data = f->base ? f->base + f->used : NULL;
    f->used += need;
    return SD_OK;
}
