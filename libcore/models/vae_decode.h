/* The Stable Diffusion VAE decoder (diffusers AutoencoderKL.decode, as the
 * SD / SDXL pipelines call it): sampled latents to images in [-1, 1], for
 * SD 1.x/2.x and SDXL.
 *
 * The latents are the sampler's (scaled): the decoder divides them by the
 * config's scaling_factor first, as the pipelines do, then runs
 * post_quant_conv, conv_in, the mid block (resnet, attention, resnet), the
 * up blocks (layers_per_block + 1 resnets each, nearest 2x upsample + conv
 * on all but the last), norm_out + SiLU and conv_out.
 *
 * Weights come from the same files the encoder reads (vae.h: diffusers
 * folders, single-file checkpoints in the ldm names, standalone VAE
 * files); config.json or, without one, shapes of the decoder's tensors.
 * Ops go through the backend table, so the CPU and CUDA run the same code. */
#ifndef SDTK_VAE_DECODE_H
#define SDTK_VAE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "err.h"
#include "vae.h"
#include "weights.h"

typedef struct {
    sd_vae_config cfg;
    sd_weights w;
    sd_vae_conv post_quant, conv_in, conv_out;
    sd_vae_resnet mid[2];
    sd_vae_attn attn;
    /* up block i runs at level nblocks-1-i (block_out[nblocks-1-i] wide) */
    sd_vae_resnet res[SD_VAE_MAX_BLOCKS][SD_VAE_MAX_LAYERS + 1];
    sd_vae_conv up[SD_VAE_MAX_BLOCKS];
    sd_vae_norm norm_out;
    char layout[64]; /* "diffusers", "ldm prefix first_stage_model.", ... for logs */
} sd_vae_decoder;

/* Build the layer table and the flat parameter buffer for cfg. */
sd_status sd_vae_decoder_build(sd_vae_decoder *d, const sd_vae_config *cfg, sd_error *err);
/* Load from a model folder, a vae/ folder or a .safetensors file. */
sd_status sd_vae_decoder_load(sd_vae_decoder *d, const char *path, const sd_vae_opts *opts, sd_error *err);
/* Its config and layer table only (w.total counts the parameters; none
 * read or allocated): what a memory plan needs. sd_vae_decoder_free. */
sd_status sd_vae_decoder_layout(sd_vae_decoder *d, const char *path, const sd_vae_opts *opts, sd_error *err);
void sd_vae_decoder_free(sd_vae_decoder *d);

/* Image size for lh x lw latents: each side times 2^(nblocks-1). */
void sd_vae_decoded_size(const sd_vae_config *cfg, int lh, int lw, int *h, int *w);
/* n >= 1 latents of at least 1 x 1 whose image fits in an int; SD_EINVAL
 * naming the size otherwise. */
sd_status sd_vae_decode_check_input(const sd_vae_decoder *d, int n, int lh, int lw, sd_error *err);
/* Floats of scratch memory a decode of lh x lw latents needs (images go
 * one at a time: the same for any n). */
size_t sd_vae_decode_workspace_floats(const sd_vae_decoder *d, int lh, int lw);
/* z [n, latent, lh, lw] (scaled, as sampled) -> images [n, out, h, w] in
 * about [-1, 1] (not clamped), on any backend: exec is its context, params
 * a copy of d->w.data in its memory, z, img and ws
 * (sd_vae_decode_workspace_floats) too. Ends with the backend's sync. */
sd_status sd_vae_decode_on(const sd_vae_decoder *d, const sd_backend *be, void *exec, const float *params, int n,
                           int lh, int lw, const float *z, float *img, float *ws, sd_error *err);
/* The host-memory case: parameters from the decoder's own buffer. */
sd_status sd_vae_decode(const sd_vae_decoder *d, const sd_backend *be, sd_pool *pool, int n, int lh, int lw,
                        const float *z, float *img, float *ws, sd_error *err);

/* Images [n, 3, h, w] in [-1, 1] to 8-bit interleaved RGB [n, h, w, 3] as
 * diffusers' image processor does: (x / 2 + 0.5) clamped to [0, 1], times
 * 255, rounded half to even (numpy's round). NaN becomes 0. */
void sd_vae_image_to_rgb8(int n, int h, int w, const float *img, uint8_t *rgb);

/* The decoder on any backend from host buffers (vae_decode_runner.c): the
 * parameters copied into the backend's memory once by init (a host
 * backend uses the decoder's own), the workspace and latent and image
 * buffers kept and grown on demand; decode copies z in and the images
 * out. Results on the CPU equal sd_vae_decode's bit for bit. */
typedef struct {
    const sd_backend *be;
    void *exec;
    float *params, *ws, *z, *img; /* the backend's memory */
    size_t ws_cap, z_cap, img_cap; /* bytes */
    int params_borrowed;
} sd_vae_decode_runner;

sd_status sd_vae_decode_runner_init(sd_vae_decode_runner *r, const sd_vae_decoder *d, const sd_backend *be,
                                    void *exec, sd_error *err);
sd_status sd_vae_decode_runner_decode(sd_vae_decode_runner *r, const sd_vae_decoder *d, int n, int lh, int lw,
                                      const float *z, float *img, sd_error *err);
void sd_vae_decode_runner_free(sd_vae_decode_runner *r);

#endif
