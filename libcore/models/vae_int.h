/* What the VAE's encoder and decoder files share, not for callers: the
 * layers (vae_layers.c) and opening a weights file with its config
 * (vae_load.c). */
#ifndef SDTK_VAE_INT_H
#define SDTK_VAE_INT_H

#include <stddef.h>

#include "safetensors.h"
#include "vae.h"

/* What every layer needs: the backend, its exec context, weights, batch
 * and scratch (all in the backend's memory). */
typedef struct {
    const sd_backend *be;
    void *pool;     /* the backend's exec: an sd_pool * on the CPU */
    const float *p; /* flat parameters */
    const sd_vae_config *cfg;
    int n;
    float *mean, *rstd; /* group-norm stats [n * groups] */
} sd_vae_fwd;

/* y = silu(group_norm(x)), y may be x. */
void sd_vae_norm_silu(const sd_vae_fwd *f, const sd_vae_norm *nm, int c, int hw, float *y, const float *x);
/* y = conv(x) with torch's symmetric "same" padding (k / 2 per side). */
void sd_vae_conv_fwd(const sd_vae_fwd *f, const sd_vae_conv *cv, int h, int w, float *y, const float *x);
/* ResnetBlock2D: *a replaced by shortcut(a) + the block's output; b and c
 * scratch of the same size. */
void sd_vae_resnet_fwd(const sd_vae_fwd *f, const sd_vae_resnet *r, int h, int w, float *a, float *b, float *c);
/* The mid block's attention with its residual, a += attn(norm(a)). */
void sd_vae_attn_fwd(const sd_vae_fwd *f, const sd_vae_attn *at, int hw, float *a, float *b, float *c, float *q,
                     float *k, float *v, float *lse);

/* A VAE's weights file opened for one part ("encoder" or "decoder"): its
 * name prefix and layout, and the config from config.json, else inferred
 * from that part's shapes, with opts applied. */
typedef struct {
    sd_safetensors *st;
    sd_weight_layout lay;
    char weights[4096];
    char desc[64]; /* "diffusers", "ldm prefix first_stage_model.", ... */
    sd_vae_config cfg;
} sd_vae_source;

sd_status sd_vae_source_open(sd_vae_source *s, const char *path, const sd_vae_opts *opts, const char *part,
                             sd_error *err);
void sd_vae_source_close(sd_vae_source *s);
/* Point the part's mid-block attention slots of w at the names diffusers
 * used before 0.14 where the file has those (diffusers layout only). */
void sd_vae_use_deprecated_attn_names(sd_weights *w, const sd_vae_source *s, const char *part);
/* Registering parameters in a weights table under both names. */
typedef struct {
    sd_weights *w;
    sd_error *err;
} sd_vae_reg;

/* A conv's weight [cout, cin, k, k] and bias, diffusers name d, ldm l. */
sd_status sd_vae_add_conv(sd_vae_reg *r, sd_vae_conv *cv, const char *d, const char *l, int cin, int cout, int k);
/* A group norm's gamma and beta. */
sd_status sd_vae_add_norm(sd_vae_reg *r, sd_vae_norm *n, const char *d, const char *l, int c);
/* ResnetBlock2D, with its 1x1 shortcut when cin != cout. */
sd_status sd_vae_add_resnet(sd_vae_reg *r, sd_vae_resnet *rs, const char *d, const char *l, int cin, int cout);
/* The mid block's attention (c channels, one head). */
sd_status sd_vae_add_attn(sd_vae_reg *r, sd_vae_attn *at, const char *d, const char *l, int c);
/* A config the forward passes can run (sizes within the tables). */
sd_status sd_vae_check_config(const sd_vae_config *c, sd_error *err);

#endif
