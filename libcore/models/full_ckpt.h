/* A full single-file checkpoint, as A1111, Forge and ComfyUI load a model:
 * the UNet, the VAE and the text encoder(s) in one safetensors file under
 * the original names (ldm for SD 1.x/2.x, sgm for SDXL):
 *   model.diffusion_model.*                      the UNet (ldm names)
 *   first_stage_model.*                          the VAE (ldm names; the mid
 *                                                attention as 1x1 convs)
 *   cond_stage_model.transformer.text_model.*    SD 1.x: CLIP-L (transformers names)
 *   cond_stage_model.model.*                     SD 2.x: OpenCLIP-H (fused in_proj)
 *   conditioner.embedders.0.transformer.text_model.*, conditioner.embedders.1.model.*
 *                                                SDXL: CLIP-L, OpenCLIP-bigG
 * The UNet comes from the caller's buffer, the rest from a base model
 * (diffusers folder or single file) loaded by sdtk's own loaders; every
 * tensor is converted to the file's dtype as it is written. */
#ifndef SDTK_FULL_CKPT_H
#define SDTK_FULL_CKPT_H

#include "clip_text.h"
#include "err.h"
#include "unet.h"
#include "vae.h"
#include "vae_decode.h"

typedef enum { SD_FULL_SD1 = 1, SD_FULL_SD2 = 2, SD_FULL_SDXL = 3 } sd_full_family;

/* What a full file takes from the base model besides the UNet. */
typedef struct {
    sd_full_family family;
    sd_vae enc;
    sd_vae_decoder dec;
    sd_clip_text te[2];
    int nte;
} sd_full_parts;

/* Configs for a base whose parts cannot be inferred from their shapes (a
 * single file of a model with other norm groups or heads: tiny test
 * models); NULL members, or a NULL opts, infer as the loaders do. */
typedef struct {
    const char *vae_config;     /* a diffusers VAE config.json */
    const char *text_config[2]; /* each encoder's transformers config.json */
} sd_full_opts;

/* Load the VAE (encoder and decoder) and the text encoder(s) of the base
 * model (a diffusers folder or a single file) and check that they belong
 * to a UNet of config ucfg (text widths, pooled width, latent channels);
 * the family follows (SDXL: text_time; SD 2.x: an OpenCLIP/GELU encoder).
 * Errors name the base model and what is missing or does not fit. */
sd_status sd_full_parts_load(sd_full_parts *p, const char *base, const sd_unet_config *ucfg, const sd_full_opts *opts,
                             sd_error *err);
void sd_full_parts_free(sd_full_parts *p);
const char *sd_full_family_name(sd_full_family f);

/* Write path (atomically) with the UNet's params (u's layout) and the
 * parts, every tensor as st_dtype (SD_ST_F32, F16 or BF16); the UNet's
 * config goes into the metadata as sd_unet_save writes it. */
sd_status sd_full_ckpt_write(const char *path, const sd_unet *u, const float *params, const sd_full_parts *p,
                             int st_dtype, sd_error *err);

#endif
