/* Loading the UNet from a model folder or a file (the layout detected from
 * its names, the config read or inferred) and saving it in either layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
#include "log.h"
#include "model_dir.h"
#include "unet_load_int.h"

/* ---- loading ------------------------------------------------------------- */

/* The names one file uses: diffusers (no prefix or unet.) or ldm
 * (model.diffusion_model. or none). */
static int detect_layout(const sd_safetensors *st, sd_weight_layout *lay, char *desc, size_t cap)
{
    static const struct {
        const char *prefix, *probe;
        int alt;
    } kinds[] = {{"", "conv_in.weight", 0},
                 {"unet.", "unet.conv_in.weight", 0},
                 {"model.diffusion_model.", "model.diffusion_model.input_blocks.0.0.weight", 1},
                 {"", "input_blocks.0.0.weight", 1}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        if (!sd_st_find(st, kinds[i].probe)) continue;
        lay->prefix = kinds[i].prefix;
        lay->use_alt = kinds[i].alt;
        snprintf(desc, cap, "%s%s%s", kinds[i].alt ? "ldm" : "diffusers", *kinds[i].prefix ? " prefix " : "",
                 kinds[i].prefix);
        return 1;
    }
    return 0;
}

/* The safetensors metadata key under which sd_unet_save stores the config
 * (config.json's text), so that a single file alone is the whole model. */
static const char meta_config_key[] = "unet_config";

/* The config a file carries in its metadata into *cfg, *found = 1; *found
 * = 0 when it carries none; an error when it is there but unusable. */
static sd_status config_from_metadata(const sd_safetensors *st, const char *path, sd_unet_config *cfg, int *found,
                                      sd_error *err)
{
    *found = 0;
    for (size_t i = 0; i < sd_st_meta_count(st); i++) {
        const sd_st_meta *m = sd_st_meta_at(st, i);
        if (strcmp(m->key, meta_config_key) != 0) continue;
        char name[4200];
        snprintf(name, sizeof name, "%s: __metadata__ %s", path, meta_config_key);
        *found = 1;
        return sd_unet_config_parse(m->value, strlen(m->value), name, cfg, err);
    }
    return SD_OK;
}

/* Inferring from shapes guesses what the weights do not show: say so, with
 * the values guessed, since a model with other heads would load and train
 * as a different model without any error. */
static void warn_guessed(const char *path, const sd_unet_config *c, int groups_given)
{
    char heads[128] = "";
    size_t at = 0;
    for (int i = 0; i < c->nblocks && at < sizeof heads; i++)
        at += (size_t)snprintf(heads + at, sizeof heads - at, "%s%d", i ? ", " : "", c->heads[i]);
    sd_log(SD_LOG_WARN,
           "%s: no config.json and no %s in the file's metadata: the UNet config is inferred from the weights, "
           "which do not show attention_head_dim (guessed [%s]) or norm_num_groups (%s %d); if the model's "
           "differ it is another model: give its config.json (sd-train --unet-config)",
           path, meta_config_key, heads, groups_given ? "given" : "guessed", c->groups);
}

/* What a load fills: the fp32 buffer, bf16 values, or nothing. */
typedef enum { LOAD_F32, LOAD_BF16, LOAD_LAYOUT } load_kind;

static sd_status load_as(sd_unet *u, const char *path, const sd_unet_opts *opts, load_kind kind, uint16_t **w16,
                         sd_error *err);

/* Load weights and config from a folder or a file. */
sd_status sd_unet_load(sd_unet *u, const char *path, const sd_unet_opts *opts, sd_error *err)
{
    return load_as(u, path, opts, LOAD_F32, NULL, err);
}

/* The same into bf16, or the layout only (unet.h). */
sd_status sd_unet_load_bf16(sd_unet *u, const char *path, const sd_unet_opts *opts, uint16_t **w16, sd_error *err)
{
    if (w16) *w16 = NULL;
    return load_as(u, path, opts, w16 ? LOAD_BF16 : LOAD_LAYOUT, w16, err);
}

/* The config read or inferred, the slots built (with the fp32 buffer for
 * LOAD_F32 only) and the file's tensors loaded as kind says. */
static sd_status load_as(sd_unet *u, const char *path, const sd_unet_opts *opts, load_kind kind, uint16_t **w16,
                         sd_error *err)
{
    char weights[4096], config[4096];
    sd_unet_opts none = {0};
    if (!opts) opts = &none;
    static const char *const files[] = {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"};
    sd_status rc = sd_model_files(path, "unet", files, 2, opts->config_path, weights, config, sizeof weights, err);
    if (rc) return rc;

    sd_safetensors *st = NULL;
    rc = sd_st_open(&st, weights, err);
    if (rc) return rc;
    sd_unet_probe p = {.st = st};
    char desc[64];
    sd_unet_config cfg;
    sd_unet_config_default(&cfg);
    if (!detect_layout(st, &p.lay, desc, sizeof desc)) {
        sd_st_close(st);
        return sd_err_set(err, SD_EFORMAT,
                          "%s: no UNet in it (looked for conv_in.weight, unet.conv_in.weight and "
                          "[model.diffusion_model.]input_blocks.0.0.weight)",
                          weights);
    }
    /* config.json (given, or the folder's), else the file's own, else inferred */
    int inferred = 0, own = 0;
    if (config[0]) rc = sd_unet_config_read(config, &cfg, err);
    else rc = config_from_metadata(st, weights, &cfg, &own, err);
    if (!rc && !config[0] && !own) {
        inferred = 1;
        rc = sd_unet_infer_config(&p, &cfg, opts->groups, err, weights);
        if (!rc) warn_guessed(weights, &cfg, opts->groups > 0);
    }
    if (!rc) rc = kind == LOAD_F32 ? sd_unet_build(u, &cfg, err) : sd_unet_build_names(u, &cfg, err);
    if (rc == SD_EINVAL && inferred) { /* what the weights cannot show (norm groups) was guessed: say so */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = sd_err_set(err, rc, "%s: %s (the config was inferred from the weights, which do not show "
                        "norm_num_groups; give the model's config.json: sd-train --unet-config)", weights, why);
    }
    if (!rc) {
        uint16_t *b16 = NULL;
        if (kind == LOAD_BF16 && !(b16 = calloc(u->w.total ? u->w.total : 1, sizeof *b16)))
            rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory for %zu MB of bf16 weights", weights,
                            u->w.total * sizeof *b16 >> 20);
        if (!rc) rc = kind == LOAD_F32 ? sd_weights_load(&u->w, st, &p.lay, weights, err)
                                       : sd_weights_load_bf16(&u->w, b16, st, &p.lay, weights, err);
        if (!rc) rc = sd_weights_check_unused(&u->w, st, &p.lay, weights, "UNet", err);
        if (rc) {
            free(b16);
            sd_unet_free(u);
        } else {
            snprintf(u->layout, sizeof u->layout, "%s", desc);
            if (w16) *w16 = b16;
        }
    }
    sd_st_close(st);
    return rc;
}

/* ---- saving -------------------------------------------------------------- */

/* Write every slot of params under its name in the chosen layout and dtype,
 * each converted as it is written: saving costs no second copy of the
 * model (at SDXL size that copy was 5 to 10 GB). */
static sd_status save_from(const sd_unet *u, const float *params, const uint16_t *p16, const char *path,
                           sd_unet_names names, const char *prefix, int st_dtype, sd_error *err);

/* Write fp32 parameters (unet.h). */
sd_status sd_unet_save(const sd_unet *u, const float *params, const char *path, sd_unet_names names,
                       const char *prefix, int st_dtype, sd_error *err)
{
    return save_from(u, params, NULL, path, names, prefix, st_dtype, err);
}

/* Write bf16 parameters (unet.h). */
sd_status sd_unet_save_bf16(const sd_unet *u, const uint16_t *params, const char *path, sd_unet_names names,
                            const char *prefix, int st_dtype, sd_error *err)
{
    return save_from(u, NULL, params, path, names, prefix, st_dtype, err);
}

/* Each slot a tensor pointing into params (fp32) or p16 (bf16), which the
 * writer converts a piece at a time. */
static sd_status save_from(const sd_unet *u, const float *params, const uint16_t *p16, const char *path,
                           sd_unet_names names, const char *prefix, int st_dtype, sd_error *err)
{
    const sd_weights *w = &u->w;
    size_t es = st_dtype == SD_ST_F32 ? 4 : 2;
    if (st_dtype != SD_ST_F32 && st_dtype != SD_ST_F16 && st_dtype != SD_ST_BF16)
        return sd_err_set(err, SD_EINVAL, "UNet save: dtype must be F32, F16 or BF16");
    sd_st_tensor *t = calloc(w->nslots ? w->nslots : 1, sizeof(*t));
    char *namebuf = malloc((w->nslots ? w->nslots : 1) * 2 * SD_WEIGHT_NAME_MAX);
    sd_status rc = SD_OK;
    if (!t || !namebuf) rc = sd_err_set(err, SD_ENOMEM, "out of memory saving the UNet");
    for (size_t i = 0; i < w->nslots && !rc; i++) {
        const sd_weight_slot *s = &w->slots[i];
        char *nm = namebuf + i * 2 * SD_WEIGHT_NAME_MAX;
        snprintf(nm, 2 * SD_WEIGHT_NAME_MAX, "%s%s", prefix ? prefix : "",
                 names == SD_UNET_NAMES_LDM && s->alt[0] ? s->alt : s->name);
        t[i].name = nm;
        t[i].dtype = (sd_st_dtype)st_dtype;
        t[i].ndim = s->ndim;
        for (int k = 0; k < s->ndim; k++) t[i].shape[k] = (uint64_t)s->shape[k];
        t[i].nbytes = s->n * es;
        if (params) t[i].f32 = params + s->off;
        else t[i].bf16 = p16 + s->off;
    }
    sd_buf conf;
    sd_buf_init(&conf);
    sd_unet_config_json(&u->cfg, &conf);
    if (!rc && conf.oom) rc = sd_err_set(err, SD_ENOMEM, "out of memory saving the UNet");
    if (!rc) { /* the config too: a single file then loads as the model it is */
        sd_st_meta meta[2] = {{"format", "pt"}, {meta_config_key, sd_buf_cstr(&conf)}};
        rc = sd_st_write(path, t, w->nslots, meta, 2, err);
    }
    sd_buf_free(&conf);
    free(t);
    free(namebuf);
    return rc;
}
