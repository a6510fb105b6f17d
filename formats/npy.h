/* The NumPy .npy array format (v1.0, 2.0 and 3.0 headers): a strict parser
 * for untrusted files (kohya caches, fuzzed) and a writer whose output
 * np.load reads. Only C-order, little-endian, plain numeric dtypes. */
#ifndef SDTK_NPY_H
#define SDTK_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "err.h"

enum { SD_NPY_MAXDIM = 8 };

/* Element types. SD_NPY_BF16 has no numpy descr: the parser never returns it
 * and the writer refuses it (callers widen bf16 to float32 first, as kohya
 * does); it exists for the shard store's tensors. */
typedef enum {
    SD_NPY_F16,
    SD_NPY_BF16,
    SD_NPY_F32,
    SD_NPY_F64,
    SD_NPY_I8,
    SD_NPY_U8,
    SD_NPY_I32,
    SD_NPY_I64,
    SD_NPY_BOOL,
    SD_NPY_DT_COUNT
} sd_npy_dtype;

typedef struct {
    sd_npy_dtype dtype;
    int ndim;
    uint64_t shape[SD_NPY_MAXDIM];
    uint64_t count;     /* elements (product of shape; 1 for a scalar) */
    uint64_t nbytes;    /* count * element size */
    size_t data_offset; /* bytes of magic + header before the data */
    int version;        /* major version of the header */
} sd_npy_info;

size_t sd_npy_dtype_size(sd_npy_dtype t);
const char *sd_npy_dtype_name(sd_npy_dtype t);
int sd_npy_dtype_parse(const char *name, sd_npy_dtype *out);
sd_status sd_npy_parse_header(const void *data, size_t len, sd_npy_info *info, sd_error *err);
sd_status sd_npy_parse(const void *data, size_t len, sd_npy_info *info, const void **payload, sd_error *err);
sd_status sd_npy_write(sd_buf *out, sd_npy_dtype t, int ndim, const uint64_t *shape, const void *data, sd_error *err);

#endif
