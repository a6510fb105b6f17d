/* The Stable Diffusion VAE encoder (diffusers AutoencoderKL.encode): images
 * in [-1, 1] to the posterior's mean and std, for SD 1.x/2.x and SDXL.
 *
 * Weights come from a diffusers folder (model/vae/ or a vae/ folder itself:
 * config.json + diffusion_pytorch_model.safetensors), a single-file
 * checkpoint (first_stage_model.* in the original ldm names, attention
 * projections stored as 1x1 convs), or a standalone VAE file (ldm or
 * diffusers names, no prefix). The config comes from config.json when there
 * is one, else it is inferred from weight shapes (see sd_vae_load). Only
 * the encoder and quant_conv are loaded; the decoder is ignored.
 *
 * Forward only: the VAE is frozen in SD training. Ops go through the
 * backend table (backend.h), so the same code runs on any backend. */
#ifndef SDTK_VAE_H
#define SDTK_VAE_H

#include <stddef.h>

#include "backend.h"
#include "err.h"
#include "weights.h"

enum { SD_VAE_MAX_BLOCKS = 6, SD_VAE_MAX_LAYERS = 4 };

typedef struct {
    int in_channels;     /* 3 */
    int latent_channels; /* 4 */
    int nblocks;         /* len(block_out_channels) */
    int block_out[SD_VAE_MAX_BLOCKS];
    int layers_per_block;
    int groups;         /* norm_num_groups */
    int use_quant_conv; /* 1 */
    int mid_attention;  /* mid_block_add_attention */
    float eps;          /* 1e-6 in every diffusers VAE norm */
    double scaling_factor, shift_factor;
    char scale_source[32]; /* where scaling_factor came from, for logs */
} sd_vae_config;

/* Where to read and what to assume; zero-initialised means "infer". */
typedef struct {
    const char *config_path; /* a diffusers config.json overriding inference */
    int groups;              /* >0: norm groups for files without a config (default 32) */
    double scaling_factor;   /* >0: overrides config and inference */
} sd_vae_opts;

typedef struct {
    size_t g, b; /* gamma, beta */
} sd_vae_norm;

typedef struct {
    size_t w, b;
    int cin, cout, k;
} sd_vae_conv;

typedef struct {
    sd_vae_norm n1, n2;
    sd_vae_conv c1, c2, sc;
    int cin, cout, has_sc;
} sd_vae_resnet;

typedef struct {
    sd_vae_norm n;
    size_t wq, bq, wk, bk, wv, bv, wo, bo;
    int c;
} sd_vae_attn;

typedef struct {
    sd_vae_config cfg;
    sd_weights w;
    sd_vae_conv conv_in, conv_out, quant;
    sd_vae_resnet res[SD_VAE_MAX_BLOCKS][SD_VAE_MAX_LAYERS];
    sd_vae_conv down[SD_VAE_MAX_BLOCKS];
    sd_vae_resnet mid[2];
    sd_vae_attn attn;
    sd_vae_norm norm_out;
    char layout[64]; /* "diffusers", "ldm single-file", ... for logs */
    int act_dtype;   /* activation storage: 0 or SD_DT_F32, SD_DT_F16, SD_DT_BF16 (sd_vae_set_activations) */
} sd_vae;

/* Store the encoder's activations as dtype (SD_DT_F32, the default;
 * SD_DT_F16 or SD_DT_BF16: fp32 arithmetic, each layer's output rounded
 * to 16 bits; half the activation buffers, so about half the workspace
 * for SD's VAEs, though a config whose last block is so wide that the
 * attention's fp32 copies do not fit in two idle buffers needs room for
 * them on top). Changes the workspace size; an encode on a backend
 * without the 16-bit ops (CUDA today) is refused. */
sd_status sd_vae_set_activations(sd_vae *v, int dtype, sd_error *err);

/* Build the layer table and the flat parameter buffer for cfg. */
sd_status sd_vae_build(sd_vae *v, const sd_vae_config *cfg, sd_error *err);
/* Load from a model folder, a vae/ folder or a .safetensors file. */
sd_status sd_vae_load(sd_vae *v, const char *path, const sd_vae_opts *opts, sd_error *err);
void sd_vae_free(sd_vae *v);

/* Latent size for an h x w image. */
void sd_vae_latent_size(const sd_vae_config *cfg, int h, int w, int *lh, int *lw);
/* n >= 1 images whose sides survive every stride-2 downsample (at least
 * 2^(nblocks-1) pixels: 8 for SD's VAE), as torch requires; SD_EINVAL
 * naming the size otherwise. */
sd_status sd_vae_check_input(const sd_vae *v, int n, int h, int w, sd_error *err);
/* SD_EUNSUPPORTED, naming the backend, when v stores its activations in
 * 16 bits and be lacks the 16-bit ops (every encode entry point checks). */
sd_status sd_vae_check_backend(const sd_vae *v, const sd_backend *be, sd_error *err);
/* Floats of scratch memory sd_vae_encode needs for n images of h x w (it
 * runs them one at a time: the same for any n). */
size_t sd_vae_workspace_floats(const sd_vae *v, int n, int h, int w);
/* Floats of scratch memory sd_vae_encode_batch_on needs for n images. */
size_t sd_vae_batch_workspace_floats(const sd_vae *v, int n, int h, int w);
/* x [n, 3, h, w] in [-1, 1] -> mean, std [n, latent, lh, lw] (the
 * unscaled posterior; multiply by scaling_factor when sampling). ws holds
 * sd_vae_workspace_floats floats. */
sd_status sd_vae_encode(const sd_vae *v, const sd_backend *be, sd_pool *pool, int n, int h, int w, const float *x,
                        float *mean, float *std, float *ws, sd_error *err);
/* The same on any backend: exec is the backend's context and params, x,
 * mean, std and ws live in its memory (params: a copy of v->w.data,
 * v->w.total floats). Returns the backend's sync status. */
sd_status sd_vae_encode_on(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n, int h,
                           int w, const float *x, float *mean, float *std, float *ws, sd_error *err);
/* All n images in one pass (a GPU's way: one image does not fill it); ws
 * holds sd_vae_batch_workspace_floats(v, n, h, w) floats. Latents may
 * differ in the last bits from sd_vae_encode_on's. */
sd_status sd_vae_encode_batch_on(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n,
                                 int h, int w, const float *x, float *mean, float *std, float *ws, sd_error *err);

/* sd_vae_encode_on (per_image) or sd_vae_encode_batch_on without the
 * final sync: the ops are queued and the call returns; on a device they
 * run while the caller works, and the next be->sync reports a failure. */
void sd_vae_encode_queue(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n, int h, int w,
                         int per_image, const float *x, float *mean, float *std, float *ws);

/* The encoder on any backend from host buffers (vae_runner.c): parameters
 * copied into the backend's memory once by init; encode copies x [n, 3, h,
 * w] in, runs sd_vae_encode_on on buffers the runner keeps (grown on
 * demand) and copies mean and std out. Switching a tool from the CPU to a
 * GPU is replacing sd_vae_encode by sd_vae_runner_encode. On the CPU images
 * go one at a time (sd_vae_encode_on: bit-identical to sd_vae_encode, and
 * an image's latents never depend on its batch); on a device (whole_batch,
 * set by init from be->is_device) a batch goes in one pass
 * (sd_vae_encode_batch_on: on an H100 batch 8 ran 1.2x faster per image
 * than batch 1 with TF32, bench/RESULTS.md), or one at a time when its scratch
 * does not fit in the device's memory. encode = submit + collect: submit
 * copies the batch in and queues its encode (x may be reused on return),
 * collect waits for it and copies the moments out, so a caller can
 * prepare the next batch while a device encodes this one. */
typedef struct {
    const sd_backend *be;
    void *exec;
    int whole_batch; /* 1: sd_vae_encode_batch_on (init: 1 on a device) */
    float *params, *ws, *x, *mean, *std; /* the backend's memory */
    size_t ws_cap, x_cap, mean_cap, std_cap; /* bytes */
    int params_borrowed; /* a host backend: params is the model's own buffer, not a copy */
    size_t pending; /* floats of mean (and of std) a submitted batch has not collected yet; 0: none */
} sd_vae_runner;

sd_status sd_vae_runner_init(sd_vae_runner *r, const sd_vae *v, const sd_backend *be, void *exec, sd_error *err);
sd_status sd_vae_runner_encode(sd_vae_runner *r, const sd_vae *v, int n, int h, int w, const float *x, float *mean,
                               float *std, sd_error *err);
sd_status sd_vae_runner_submit(sd_vae_runner *r, const sd_vae *v, int n, int h, int w, const float *x, sd_error *err);
sd_status sd_vae_runner_collect(sd_vae_runner *r, float *mean, float *std, sd_error *err);
/* Bytes of workspace one h x w image needs: the least any batch of that
 * size needs (one image at a time), so a caller can tell whether a size
 * fits before it decodes an image of it. */
size_t sd_vae_runner_image_workspace(const sd_vae *v, int h, int w);
/* The workspace grown to one h x w image's (sd_vae_runner_image_workspace)
 * now, before any image of that size is decoded; SD_ENOMEM naming the size
 * when it cannot be had. Any submitted batch must have been collected. */
sd_status sd_vae_runner_reserve(sd_vae_runner *r, const sd_vae *v, int h, int w, sd_error *err);
/* After a batch ran out of device memory in one pass: one image at a time
 * from now on, the batch workspace released; 0 when already so. */
int sd_vae_runner_one_at_a_time(sd_vae_runner *r);
void sd_vae_runner_free(sd_vae_runner *r);

#endif
