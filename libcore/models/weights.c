/* Named parameter slots in one flat buffer, filled from safetensors. */
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
#include "strmap.h"

/* An empty set, no allocation yet. */
void sd_weights_init(sd_weights *w)
{
    memset(w, 0, sizeof(*w));
}

/* Release the slot table and the flat buffer. */
void sd_weights_free(sd_weights *w)
{
    free(w->slots);
    free(w->data);
    memset(w, 0, sizeof(*w));
}

/* Offsets are rounded up to 16 floats so every tensor starts on a cache
 * line (vector loads, and a device copy keeps the same offsets). */
static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Append one slot and reserve its floats at the end of the flat buffer. */
sd_status sd_weights_add(sd_weights *w, const char *name, const char *alt, int ndim, const int *shape, size_t *off,
                         sd_error *err)
{
    if (ndim < 1 || ndim > SD_WEIGHT_MAX_DIMS) return sd_err_set(err, SD_EINVAL, "weight %s: %d dims", name, ndim);
    if (strlen(name) >= SD_WEIGHT_NAME_MAX || (alt && strlen(alt) >= SD_WEIGHT_NAME_MAX))
        return sd_err_set(err, SD_EINVAL, "weight name too long: %s", name);
    if (w->nslots == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        sd_weight_slot *s = realloc(w->slots, cap * sizeof(*s));
        if (!s) return sd_err_set(err, SD_ENOMEM, "out of memory");
        w->slots = s;
        w->cap = cap;
    }
    sd_weight_slot *s = &w->slots[w->nslots++];
    memset(s, 0, sizeof(*s));
    strcpy(s->name, name);
    strcpy(s->alt, alt ? alt : "");
    s->ndim = ndim;
    s->n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0) return sd_err_set(err, SD_EINVAL, "weight %s: dimension %d is %d", name, i, shape[i]);
        s->shape[i] = shape[i];
        s->n *= (size_t)shape[i];
    }
    s->off = w->total;
    w->total += round16(s->n);
    if (off) *off = s->off;
    return SD_OK;
}

/* One zeroed, 64-byte aligned buffer for every slot. */
sd_status sd_weights_alloc(sd_weights *w, sd_error *err)
{
    size_t bytes = (w->total ? w->total : 16) * sizeof(float);
    free(w->data);
    w->data = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!w->data) return sd_err_set(err, SD_ENOMEM, "out of memory for %zu MB of weights", bytes >> 20);
    memset(w->data, 0, bytes);
    return SD_OK;
}

/* Bytes of the flat buffer. */
size_t sd_weights_bytes(const sd_weights *w)
{
    return w->total * sizeof(float);
}

/* Whether a file tensor's shape is the slot's shape, allowing the file to
 * carry extra trailing 1s (ldm stores attention projections as 1x1 convs). */
static int shape_fits(int ndim, const int *shape, const sd_st_tensor *t)
{
    if (t->ndim < ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != (uint64_t)shape[i]) return 0;
    for (int i = ndim; i < t->ndim; i++)
        if (t->shape[i] != 1) return 0;
    return 1;
}

/* "[a, b, c]" into buf, for error messages. */
static const char *shape_str(char *buf, size_t cap, int ndim, const uint64_t *s64, const int *s32)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%llu", i ? ", " : "",
                              s64 ? (unsigned long long)s64[i] : (unsigned long long)s32[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* A file tensor the slot can take: its shape (shape_fits) and a weight
 * dtype; the slot's element count in *n. */
static sd_status check_tensor(int ndim, const int *shape, const sd_st_tensor *t, const char *path, size_t *n,
                              sd_error *err)
{
    if (!shape_fits(ndim, shape, t)) {
        char a[96], b[96];
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s has shape %s, the model needs %s", path, t->name,
                          shape_str(a, sizeof a, t->ndim, t->shape, NULL), shape_str(b, sizeof b, ndim, NULL, shape));
    }
    if (t->dtype != SD_ST_F32 && t->dtype != SD_ST_F16 && t->dtype != SD_ST_BF16)
        return sd_err_set(err, SD_EUNSUPPORTED, "%s: tensor %s is %s; weights must be F32, F16 or BF16", path,
                          t->name, sd_st_dtype_name(t->dtype));
    *n = 1;
    for (int i = 0; i < ndim; i++) *n *= (size_t)shape[i];
    return SD_OK;
}

/* Convert a checked tensor's elements to fp32. */
sd_status sd_weights_copy_tensor(float *dst, int ndim, const int *shape, const sd_st_tensor *t, const char *path,
                                 sd_error *err)
{
    size_t n;
    sd_status rc = check_tensor(ndim, shape, t, path, &n, err);
    if (rc) return rc;
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case SD_ST_F32: memcpy(dst, p, n * 4); break;
    case SD_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = sd_f16_to_f32(h);
        }
        break;
    case SD_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = sd_bf16_to_f32(h);
        }
        break;
    default: break; /* refused by check_tensor */
    }
    return SD_OK;
}

/* The same into bf16 (weights.h): each value as the fp32 path reads it,
 * then rounded to nearest even; bf16 tensors are copied. */
sd_status sd_weights_copy_tensor_bf16(uint16_t *dst, int ndim, const int *shape, const sd_st_tensor *t,
                                      const char *path, sd_error *err)
{
    size_t n;
    sd_status rc = check_tensor(ndim, shape, t, path, &n, err);
    if (rc || !dst) return rc;
    const unsigned char *p = t->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        float f;
        switch (t->dtype) {
        case SD_ST_F32:
            memcpy(&f, p + 4 * i, 4);
            dst[i] = sd_f32_to_bf16(f);
            break;
        case SD_ST_F16:
            memcpy(&h, p + 2 * i, 2);
            dst[i] = sd_f32_to_bf16(sd_f16_to_f32(h));
            break;
        default: memcpy(dst + i, p + 2 * i, 2); break; /* BF16 */
        }
    }
    return SD_OK;
}

/* Look each slot up by prefix + (diffusers or original) name and copy it
 * into f32 or b16 (or only check it when both are NULL), a tensor at a
 * time, each tensor's file pages given back once read: the file is never
 * resident whole beside the copy. */
static sd_status load_slots(sd_weights *w, float *f32, uint16_t *b16, const sd_safetensors *st,
                            const sd_weight_layout *lay, const char *path, sd_error *err)
{
    char full[2 * SD_WEIGHT_NAME_MAX];
    for (size_t i = 0; i < w->nslots; i++) {
        sd_weight_slot *s = &w->slots[i];
        const char *nm = lay->use_alt && s->alt[0] ? s->alt : s->name;
        snprintf(full, sizeof full, "%s%s", lay->prefix, nm);
        const sd_st_tensor *t = sd_st_find(st, full);
        if (!t) return sd_err_set(err, SD_ENOTFOUND, "%s: no tensor %s (model needs it)", path, full);
        sd_status rc = f32 ? sd_weights_copy_tensor(f32 + s->off, s->ndim, s->shape, t, path, err)
                           : sd_weights_copy_tensor_bf16(b16 ? b16 + s->off : NULL, s->ndim, s->shape, t, path, err);
        if (rc) return rc;
        if (f32 || b16) sd_st_drop_pages(st, t);
        s->loaded = 1;
    }
    return SD_OK;
}

/* Every slot into the fp32 buffer w->data (weights.h). */
sd_status sd_weights_load(sd_weights *w, const sd_safetensors *st, const sd_weight_layout *lay, const char *path,
                          sd_error *err)
{
    if (!w->data) return sd_err_set(err, SD_EINVAL, "weights not allocated");
    return load_slots(w, w->data, NULL, st, lay, path, err);
}

/* Every slot into bf16 values laid out like w->data (weights.h). */
sd_status sd_weights_load_bf16(sd_weights *w, uint16_t *dst, const sd_safetensors *st, const sd_weight_layout *lay,
                               const char *path, sd_error *err)
{
    return load_slots(w, NULL, dst, st, lay, path, err);
}

/* Tensors of st under lay->prefix that no slot takes. A config that does
 * not match the weights (a transformer depth inferred too small) would
 * otherwise load and drop them without a word; SD_EFORMAT names how many
 * and the first few. Everything under the prefix must belong to the
 * model: call it only where that holds (the UNet's prefixes). */
sd_status sd_weights_check_unused(const sd_weights *w, const sd_safetensors *st, const sd_weight_layout *lay,
                                  const char *path, const char *model, sd_error *err)
{
    sd_strmap used;
    sd_strmap_init(&used);
    char full[2 * SD_WEIGHT_NAME_MAX];
    sd_status rc = SD_OK;
    for (size_t i = 0; i < w->nslots && !rc; i++) {
        const sd_weight_slot *s = &w->slots[i];
        int n = snprintf(full, sizeof full, "%s%s", lay->prefix, lay->use_alt && s->alt[0] ? s->alt : s->name);
        if (n > 0 && !sd_strmap_put(&used, full, (size_t)n)) rc = sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    size_t plen = strlen(lay->prefix), extra = 0;
    char names[3 * SD_WEIGHT_NAME_MAX + 16] = "";
    for (size_t i = 0; i < sd_st_count(st) && !rc; i++) {
        const char *nm = sd_st_tensor_at(st, i)->name;
        if (strncmp(nm, lay->prefix, plen) != 0 || sd_strmap_get(&used, nm, strlen(nm))) continue;
        if (extra++ < 3) {
            size_t k = strlen(names);
            snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", nm);
        }
    }
    if (!rc && extra)
        rc = sd_err_set(err, SD_EFORMAT, "%s: %zu tensor%s%s%s the %s does not use (%s%s): the config does not match "
                        "the weights",
                        path, extra, extra == 1 ? "" : "s", plen ? " under " : "", lay->prefix, model, names,
                        extra > 3 ? ", ..." : "");
    sd_strmap_free(&used);
    return rc;
}
