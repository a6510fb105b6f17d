/* A model's parameters: named slots in one flat fp32 buffer (llm.c style),
 * each known by its diffusers name and its original (ldm / CompVis) name,
 * filled from safetensors files whatever their dtype (fp32, fp16, bf16).
 * Layers keep offsets, not pointers, so the flat buffer can be copied to a
 * device or reallocated without touching the model. */
#ifndef SDTK_WEIGHTS_H
#define SDTK_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "safetensors.h"

enum { SD_WEIGHT_NAME_MAX = 128, SD_WEIGHT_MAX_DIMS = 4 };

typedef struct {
    char name[SD_WEIGHT_NAME_MAX]; /* diffusers name */
    char alt[SD_WEIGHT_NAME_MAX];  /* original-layout name ("" if none) */
    int ndim;
    int shape[SD_WEIGHT_MAX_DIMS];
    size_t off, n; /* floats */
    int loaded;
} sd_weight_slot;

typedef struct {
    sd_weight_slot *slots;
    size_t nslots, cap;
    size_t total; /* floats */
    float *data;  /* 64-byte aligned, total floats, NULL until allocated */
} sd_weights;

void sd_weights_init(sd_weights *w);
void sd_weights_free(sd_weights *w);
/* Register a slot; returns its float offset through *off. */
sd_status sd_weights_add(sd_weights *w, const char *name, const char *alt, int ndim, const int *shape, size_t *off,
                         sd_error *err);
sd_status sd_weights_alloc(sd_weights *w, sd_error *err);
size_t sd_weights_bytes(const sd_weights *w);

/* Which names a file uses and the prefix in front of them. */
typedef struct {
    const char *prefix; /* e.g. "", "first_stage_model.", "vae." */
    int use_alt;        /* 1: original-layout names */
} sd_weight_layout;

/* Fill every slot from st under the given layout: shapes must match (a
 * trailing [.., 1, 1] is squeezed, for 1x1-conv attention weights), dtype
 * fp32/fp16/bf16 converted. Every slot must be found; the error names the
 * first missing or mismatched tensor and the file. */
sd_status sd_weights_load(sd_weights *w, const sd_safetensors *st, const sd_weight_layout *lay, const char *path,
                          sd_error *err);
/* The same into dst, w->total bf16 values laid out like w->data (padding
 * untouched), each value rounded to the nearest bf16 as it is converted
 * (the same bits as sd_weights_load then sd_f32_to_bf16): no fp32 copy of
 * the model. dst NULL: every slot's tensor checked (name, shape, dtype),
 * nothing copied (a model's layout for a memory plan). */
sd_status sd_weights_load_bf16(sd_weights *w, uint16_t *dst, const sd_safetensors *st, const sd_weight_layout *lay,
                               const char *path, sd_error *err);
/* Refuse (SD_EFORMAT, naming a few) tensors of st under lay->prefix that
 * no slot takes, for a model that owns everything under its prefix: a
 * config that does not match the weights would drop them silently.
 * `model` names it in the message ("UNet"). */
sd_status sd_weights_check_unused(const sd_weights *w, const sd_safetensors *st, const sd_weight_layout *lay,
                                  const char *path, const char *model, sd_error *err);
/* Copy one tensor into dst (n floats, shape checked as above). */
sd_status sd_weights_copy_tensor(float *dst, int ndim, const int *shape, const sd_st_tensor *t, const char *path,
                                 sd_error *err);
/* The same into n bf16 values, rounded to nearest even (dst NULL: check
 * only). */
sd_status sd_weights_copy_tensor_bf16(uint16_t *dst, int ndim, const int *shape, const sd_st_tensor *t,
                                      const char *path, sd_error *err);

#endif
