/* Loading the UNet from a model folder or a file (the layout detected from
 * its names, the config read or inferred) and saving it in either layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
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

/* Load weights and config from a folder or a file. */
sd_status sd_unet_load(sd_unet *u, const char *path, const sd_unet_opts *opts, sd_error *err)
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
    rc = config[0] ? sd_unet_config_read(config, &cfg, err)
                   : sd_unet_infer_config(&p, &cfg, opts->groups, err, weights);
    if (!rc) rc = sd_unet_build(u, &cfg, err);
    if (rc == SD_EINVAL && !config[0]) { /* what the weights cannot show (norm groups) was guessed: say so */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = sd_err_set(err, rc, "%s: %s (the config was inferred from the weights, which do not show "
                        "norm_num_groups; give the model's config.json: sd-train --unet-config)", weights, why);
    }
    if (!rc) {
        rc = sd_weights_load(&u->w, st, &p.lay, weights, err);
        if (!rc) rc = sd_weights_check_unused(&u->w, st, &p.lay, weights, "UNet", err);
        if (rc) sd_unet_free(u);
        else snprintf(u->layout, sizeof u->layout, "%s", desc);
    }
    sd_st_close(st);
    return rc;
}

/* ---- saving -------------------------------------------------------------- */

/* Write every slot of params under its name in the chosen layout and dtype,
 * each converted as it is written: saving costs no second copy of the
 * model (at SDXL size that copy was 5 to 10 GB). */
sd_status sd_unet_save(const sd_unet *u, const float *params, const char *path, sd_unet_names names,
                       const char *prefix, int st_dtype, sd_error *err)
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
        t[i].f32 = params + s->off;
    }
    if (!rc) {
        sd_st_meta meta[1] = {{"format", "pt"}};
        rc = sd_st_write(path, t, w->nslots, meta, 1, err);
    }
    free(t);
    free(namebuf);
    return rc;
}
