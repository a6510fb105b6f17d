/* The full single-file checkpoint (full_ckpt.h): the base model's VAE and
 * text encoders loaded and checked against the UNet, then every tensor of
 * the three listed under its original name and written in one pass, each
 * converted to the file's dtype as it goes (sd_st_tensor.f32): the UNet is
 * never copied. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "full_ckpt.h"

/* The family's name, for logs and errors. */
const char *sd_full_family_name(sd_full_family f)
{
    return f == SD_FULL_SDXL ? "SDXL" : f == SD_FULL_SD2 ? "SD 2.x" : "SD 1.x";
}

/* Release what sd_full_parts_load loaded (also a half-loaded set). */
void sd_full_parts_free(sd_full_parts *p)
{
    sd_vae_free(&p->enc);
    sd_vae_decoder_free(&p->dec);
    for (int i = 0; i < p->nte; i++) sd_clip_text_free(&p->te[i]);
    memset(p, 0, sizeof *p);
}

/* The base's encoders against the UNet's conditioning: SDXL takes both
 * widths side by side plus the second one's pooled projection, the others
 * one encoder of the cross-attention width. */
static sd_status check_text(const sd_full_parts *p, const char *base, const sd_unet_config *c, sd_error *err)
{
    const sd_clip_text_config *a = &p->te[0].cfg;
    if (!c->text_time) {
        if (a->width == c->cross_dim) return SD_OK;
        return sd_err_set(err, SD_EFORMAT,
                          "%s: its text encoder gives %d-wide embeddings, the UNet takes %d: the base model is not "
                          "of the UNet's family (give the model the UNet was made from)",
                          base, a->width, c->cross_dim);
    }
    const sd_clip_text_config *b = &p->te[1].cfg;
    int pooled = c->add_in_dim - SD_UNET_TIME_IDS * c->add_time_dim;
    if (a->width + b->width != c->cross_dim || b->proj != pooled)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: its text encoders give %d + %d-wide embeddings and a %d-wide pooled one, the SDXL UNet "
                          "takes %d and %d: the base model is not of the UNet's family",
                          base, a->width, b->width, b->proj, c->cross_dim, pooled);
    return SD_OK;
}

/* Load the VAE halves and the encoders from base and check them. */
sd_status sd_full_parts_load(sd_full_parts *p, const char *base, const sd_unet_config *ucfg, const sd_full_opts *opts,
                             sd_error *err)
{
    sd_full_opts none = {0};
    if (!opts) opts = &none;
    memset(p, 0, sizeof *p);
    sd_error e = {0};
    sd_vae_opts vo = {.config_path = opts->vae_config};
    sd_status rc = sd_vae_load(&p->enc, base, &vo, &e);
    if (!rc) {
        rc = sd_vae_decoder_load(&p->dec, base, &vo, &e);
        if (rc) sd_vae_free(&p->enc);
    }
    if (rc) {
        memset(p, 0, sizeof *p);
        return sd_err_set(err, rc, "base model %s: no usable VAE: %s", base, e.msg);
    }
    int want = ucfg->text_time ? 2 : 1;
    for (int i = 0; i < want && !rc; i++) {
        sd_clip_text_opts o = {.which = i, .config_path = opts->text_config[i]};
        rc = sd_clip_text_load(&p->te[i], base, &o, &e);
        if (rc) rc = sd_err_set(err, rc, "base model %s: no usable %stext encoder%s: %s", base, i ? "second " : "",
                                ucfg->text_time ? " (the UNet is SDXL's, which takes two)" : "", e.msg);
        else p->nte = i + 1;
    }
    if (!rc && p->enc.cfg.latent_channels != ucfg->out_channels)
        rc = sd_err_set(err, SD_EFORMAT, "base model %s: its VAE has %d latent channels, the UNet predicts %d", base,
                        p->enc.cfg.latent_channels, ucfg->out_channels);
    if (!rc) rc = check_text(p, base, ucfg, err);
    if (rc) {
        sd_full_parts_free(p);
        return rc;
    }
    p->family = ucfg->text_time ? SD_FULL_SDXL
                : p->te[0].openclip || p->te[0].cfg.act == SD_CLIP_GELU ? SD_FULL_SD2
                                                                       : SD_FULL_SD1;
    return SD_OK;
}

/* The tensors being gathered: entries, their names, and the few buffers
 * made for the file (position ids, a transposed projection). */
typedef struct {
    sd_st_tensor *t;
    size_t n, cap;
    char *names; /* cap * NAME_CAP */
    void *own[8];
    int nown;
    int dtype;
} list;

enum { NAME_CAP = 2 * SD_WEIGHT_NAME_MAX + 64 };

/* A new entry named prefix+name with the given shape, or NULL when full
 * (the caller sized the list). */
static sd_st_tensor *put(list *L, const char *prefix, const char *name, int ndim, const uint64_t *shape)
{
    if (L->n == L->cap) return NULL;
    char *nm = L->names + L->n * NAME_CAP;
    snprintf(nm, NAME_CAP, "%s%s", prefix, name);
    sd_st_tensor *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->dtype = (sd_st_dtype)L->dtype;
    t->ndim = ndim;
    uint64_t count = 1;
    for (int k = 0; k < ndim; k++) {
        t->shape[k] = shape[k];
        count *= shape[k];
    }
    t->nbytes = count * sd_st_dtype_size(t->dtype);
    return t;
}

/* floats at f as prefix+name with the given shape. */
static int put_f32(list *L, const char *prefix, const char *name, int ndim, const uint64_t *shape, const float *f)
{
    sd_st_tensor *t = put(L, prefix, name, ndim, shape);
    if (t) t->f32 = f;
    return t != NULL;
}

/* A weight slot under its original name (alt, or name where it has none):
 * ldm keeps the VAE's attention matrices as 1x1 convs, so conv4d adds
 * [.., 1, 1] to every two-dimensional slot. */
static int put_slot(list *L, const char *prefix, const sd_weight_slot *s, const float *params, int conv4d)
{
    uint64_t shape[SD_ST_MAX_DIMS];
    int nd = s->ndim;
    for (int k = 0; k < nd; k++) shape[k] = (uint64_t)s->shape[k];
    if (conv4d && nd == 2) {
        shape[2] = shape[3] = 1;
        nd = 4;
    }
    return put_f32(L, prefix, s->alt[0] ? s->alt : s->name, nd, shape, params + s->off);
}

/* Hold a buffer made for the file until it is written. */
static void *own(list *L, size_t bytes)
{
    if (L->nown == (int)(sizeof L->own / sizeof *L->own)) return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p) L->own[L->nown++] = p;
    return p;
}

/* The original checkpoints' int64 position_ids [1, positions] (0, 1, ...)
 * of a CLIP-L encoder: A1111 and ComfyUI take files with it, diffusers
 * ignores it. */
static int put_position_ids(list *L, const char *prefix, int positions)
{
    int64_t *ids = own(L, (size_t)positions * sizeof *ids);
    if (!ids) return 0;
    for (int i = 0; i < positions; i++) ids[i] = i;
    uint64_t shape[2] = {1, (uint64_t)positions};
    sd_st_tensor *t = put(L, prefix, "embeddings.position_ids", 2, shape);
    if (!t) return 0;
    t->dtype = SD_ST_I64;
    t->nbytes = (uint64_t)positions * 8;
    t->data = ids;
    return 1;
}

/* One encoder in transformers' names under prefix (SD 1.x's and SDXL's
 * CLIP-L): q, k and v as separate projections (the thirds of the fused
 * slot, rows q then k then v), text_projection.weight (if any) beside
 * text_model. under outer. */
static int put_clip_hf(list *L, const sd_clip_text *m, const char *outer)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%stext_model.", outer);
    const float *P = m->w.data;
    for (size_t i = 0; i < m->w.nslots; i++) {
        const sd_weight_slot *s = &m->w.slots[i];
        const char *q = strstr(s->name, ".qkv_proj.");
        if (strcmp(s->name, "text_projection.weight") == 0) {
            uint64_t shape[2] = {(uint64_t)s->shape[0], (uint64_t)s->shape[1]};
            if (!put_f32(L, outer, s->name, 2, shape, P + s->off)) return 0;
        } else if (q) {
            static const char *const part[3] = {"q_proj", "k_proj", "v_proj"};
            int rows = s->shape[0] / 3, cols = s->ndim == 2 ? s->shape[1] : 1;
            for (int k = 0; k < 3; k++) {
                char nm[NAME_CAP];
                snprintf(nm, sizeof nm, "%.*s.%s.%s", (int)(q - s->name), s->name, part[k], q + 10);
                uint64_t shape[2] = {(uint64_t)rows, (uint64_t)cols};
                if (!put_f32(L, prefix, nm, s->ndim, shape, P + s->off + (size_t)k * (size_t)rows * (size_t)cols))
                    return 0;
            }
        } else if (!put_f32(L, prefix, s->name, s->ndim,
                            (uint64_t[]){(uint64_t)s->shape[0], s->ndim == 2 ? (uint64_t)s->shape[1] : 0}, P + s->off)) {
            return 0;
        }
    }
    return put_position_ids(L, prefix, m->cfg.positions);
}

/* One encoder in OpenCLIP's names under prefix (SD 2.x's H, SDXL's bigG):
 * the fused in_proj as the model keeps it; text_projection stored
 * [width, proj] (x @ P), the transpose of transformers' weight. */
static int put_clip_openclip(list *L, const sd_clip_text *m, const char *prefix)
{
    const float *P = m->w.data;
    for (size_t i = 0; i < m->w.nslots; i++) {
        const sd_weight_slot *s = &m->w.slots[i];
        if (strcmp(s->name, "text_projection.weight") != 0) {
            if (!put_slot(L, prefix, s, P, 0)) return 0;
            continue;
        }
        size_t rows = (size_t)s->shape[0], cols = (size_t)s->shape[1]; /* [proj, width] */
        float *t = own(L, rows * cols * sizeof *t);
        if (!t) return 0;
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++) t[c * rows + r] = P[s->off + r * cols + c];
        uint64_t shape[2] = {cols, rows};
        if (!put_f32(L, prefix, "text_projection", 2, shape, t)) return 0;
    }
    return 1;
}

/* Every tensor of the file in order: UNet, VAE (encoder with quant_conv,
 * decoder with post_quant_conv), text encoder(s). */
static int gather(list *L, const sd_unet *u, const float *params, const sd_full_parts *p)
{
    for (size_t i = 0; i < u->w.nslots; i++)
        if (!put_slot(L, "model.diffusion_model.", &u->w.slots[i], params, 0)) return 0;
    for (size_t i = 0; i < p->enc.w.nslots; i++)
        if (!put_slot(L, "first_stage_model.", &p->enc.w.slots[i], p->enc.w.data, 1)) return 0;
    for (size_t i = 0; i < p->dec.w.nslots; i++)
        if (!put_slot(L, "first_stage_model.", &p->dec.w.slots[i], p->dec.w.data, 1)) return 0;
    switch (p->family) {
    case SD_FULL_SD1: return put_clip_hf(L, &p->te[0], "cond_stage_model.transformer.");
    case SD_FULL_SD2: return put_clip_openclip(L, &p->te[0], "cond_stage_model.model.");
    case SD_FULL_SDXL:
        return put_clip_hf(L, &p->te[0], "conditioner.embedders.0.transformer.") &&
               put_clip_openclip(L, &p->te[1], "conditioner.embedders.1.model.");
    }
    return 0;
}

/* Gather the names and write the file; the UNet's config goes into the
 * metadata under the key sd_unet_load reads (unet_config). */
sd_status sd_full_ckpt_write(const char *path, const sd_unet *u, const float *params, const sd_full_parts *p,
                             int st_dtype, sd_error *err)
{
    if (st_dtype != SD_ST_F32 && st_dtype != SD_ST_F16 && st_dtype != SD_ST_BF16)
        return sd_err_set(err, SD_EINVAL, "full checkpoint: dtype must be F32, F16 or BF16");
    if (!p->nte || (p->family == SD_FULL_SDXL && p->nte < 2))
        return sd_err_set(err, SD_EINVAL, "full checkpoint: the base model's parts are not loaded");
    list L = {.dtype = st_dtype};
    /* a fused q|k|v slot becomes three tensors; one position_ids per encoder */
    L.cap = u->w.nslots + p->enc.w.nslots + p->dec.w.nslots + 8;
    for (int i = 0; i < p->nte; i++) L.cap += 3 * p->te[i].w.nslots;
    L.t = calloc(L.cap, sizeof *L.t);
    L.names = malloc(L.cap * NAME_CAP);
    sd_buf conf;
    sd_buf_init(&conf);
    sd_unet_config_json(&u->cfg, &conf);
    sd_status rc = SD_OK;
    if (!L.t || !L.names || conf.oom || !gather(&L, u, params, p))
        rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory listing the checkpoint's tensors", path);
    if (!rc) {
        sd_st_meta meta[3] = {{"format", "pt"}, {"unet_config", sd_buf_cstr(&conf)},
                              {"sdtk_family", sd_full_family_name(p->family)}};
        rc = sd_st_write(path, L.t, L.n, meta, 3, err);
    }
    sd_buf_free(&conf);
    for (int i = 0; i < L.nown; i++) free(L.own[i]);
    free(L.t);
    free(L.names);
    return rc;
}
