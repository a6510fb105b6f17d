/* The exporters' record walk (see pack_walk.c). */
#ifndef SDTK_PACK_WALK_H
#define SDTK_PACK_WALK_H

#include "buf.h"
#include "half.h"
#include "pack.h"

typedef struct {
    const char *name; /* NUL-terminated, checked safe as a relative path */
    sd_shard_rec rec;
    sd_shard_rec text; /* valid when has_text */
    int has_text;
} pack_item;

typedef sd_status (*pack_walk_fn)(void *ctx, const pack_item *it, sd_error *err);

int pack_name_safe(const char *name, size_t n);
sd_status pack_walk(const char *path, sd_tally *tally, sd_progress *prog, pack_walk_fn fn, void *ctx, sd_error *err);
sd_status pack_tensor_f32(const sd_shard_tensor *t, sd_buf *b, sd_error *err);

#endif
