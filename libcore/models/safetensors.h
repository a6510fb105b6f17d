/* Reading and writing safetensors files (the weight format of diffusers and
 * of single-file checkpoints). Reading maps the file and validates the whole
 * header before anything is trusted: sizes, offsets, overlaps, dtypes.
 * sd_st_open of a sharded checkpoint's FILE.index.json opens every shard
 * it names (plain names in its folder) and shows their tensors as one
 * file's, after checking that the index and the shards agree. */
#ifndef SDTK_SAFETENSORS_H
#define SDTK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum { SD_ST_MAX_DIMS = 8, SD_ST_MAX_HEADER = 100 << 20 };

typedef enum {
    SD_ST_BOOL,
    SD_ST_U8,
    SD_ST_I8,
    SD_ST_I16,
    SD_ST_I32,
    SD_ST_I64,
    SD_ST_F16,
    SD_ST_BF16,
    SD_ST_F32,
    SD_ST_F64,
    SD_ST_F8_E4M3,
    SD_ST_F8_E5M2
} sd_st_dtype;

typedef struct {
    const char *name;
    sd_st_dtype dtype;
    int ndim;
    uint64_t shape[SD_ST_MAX_DIMS];
    uint64_t nbytes;
    const void *data; /* points into the mapping */
    /* writing only: when set, data is ignored and the tensor's values are
     * these floats, converted to dtype (F32, F16 or BF16) while they are
     * written, a small piece at a time: no copy of the tensor is made */
    const float *f32;
    /* writing only, when f32 is not set: the values as bf16 bits, widened
     * (exactly) and converted the same way, a small piece at a time */
    const uint16_t *bf16;
} sd_st_tensor;

typedef struct {
    const char *key, *value;
} sd_st_meta;

typedef struct sd_safetensors sd_safetensors;

sd_status sd_st_open(sd_safetensors **out, const char *path, sd_error *err);
sd_status sd_st_open_memory(sd_safetensors **out, const void *data, size_t len, const char *name, sd_error *err);
void sd_st_close(sd_safetensors *st);
size_t sd_st_count(const sd_safetensors *st);
const sd_st_tensor *sd_st_tensor_at(const sd_safetensors *st, size_t i);
const sd_st_tensor *sd_st_find(const sd_safetensors *st, const char *name);
/* Give back the resident pages of t's bytes in the file mapping after it
 * has been read (it can be read again); nothing for in-memory files. */
void sd_st_drop_pages(const sd_safetensors *st, const sd_st_tensor *t);
size_t sd_st_meta_count(const sd_safetensors *st);
const sd_st_meta *sd_st_meta_at(const sd_safetensors *st, size_t i);
const char *sd_st_dtype_name(sd_st_dtype d);
size_t sd_st_dtype_size(sd_st_dtype d);
/* Write the tensors (in order) and the metadata as one file, atomically
 * (temporary name, fsync, rename). */
sd_status sd_st_write(const char *path, const sd_st_tensor *t, size_t n, const sd_st_meta *meta, size_t nmeta,
                      sd_error *err);

#endif
