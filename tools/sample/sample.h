/* sd-sample's engine: prompts from JSONL (sample_prompts.c), the model
 * (sample_model.c), one image's sampling (sample_denoise.c), PNG files
 * with A1111's `parameters` text and the contact sheet (sample_png.c), and
 * the run over every prompt (sample_run.c). */
#ifndef SDTK_SAMPLE_H
#define SDTK_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "buf.h"
#include "clip_text.h"
#include "clip_tok.h"
#include "err.h"
#include "sampler.h"
#include "unet.h"
#include "vae_decode.h"

/* One image to make: a JSONL line, or the command line's prompt. width or
 * height 0: the model's default size (the UNet's sample_size times the
 * VAE's factor, as diffusers). */
typedef struct {
    char *prompt, *negative; /* owned */
    uint64_t seed;
    int steps;
    double cfg;
    sd_sampler_kind sampler;
    int width, height;
    long line; /* the prompts file's line (0: the command line) */
} sample_job;

/* The largest seed a JSONL line or --seed may give (JSON numbers are exact
 * up to 2^53; A1111's seeds stay below 2^32). */
#define SAMPLE_SEED_MAX 9007199254740991.0

/* Where the model comes from: a diffusers folder, or a single-file
 * checkpoint with tokenizers from a folder and what a file cannot say
 * (configs to use instead of inferring, the prediction type). */
typedef struct {
    const char *path, *tokenizer;
    const char *unet_config, *vae_config, *text_config[2];
    const char *prediction; /* "epsilon", "v_prediction" or NULL: the folder's scheduler, else epsilon */
} sample_source;

typedef struct {
    sample_source src;
    const char *prompts, *output, *device;
    int cuda_device; /* -1: the CPU */
    int threads, strict, quiet, contact;
    sample_job defaults; /* the flags' values; prompt/negative not owned here */
} sample_opts;

/* The whole run; returns the tool's exit code (0 ok, 1 images failed or
 * lines skipped with --strict, 3 fatal). */
int sample_run(const sample_opts *o);

/* ---- prompts (sample_prompts.c) ---------------------------------------- */

/* Counts of what was refused, by reason, for the summary. */
typedef struct {
    size_t bad_json, bad_field, bad_size, bad_sampler;
} sample_skips;

/* Every line of path (blank lines ignored) as a job over the defaults; a
 * bad line is logged with its number and reason, counted in skips and left
 * out. Errors: the file cannot be read (SD_ENOTFOUND / SD_EIO). */
sd_status sample_read_prompts(const char *path, const sample_job *def, sample_job **jobs, size_t *n,
                              sample_skips *skips, sd_error *err);
/* One JSONL line (text is modified in place) over def into *out; NULL on
 * success, else the reason (why holds the details, cap bytes). */
const char *sample_parse_line(char *text, size_t len, const sample_job *def, sample_job *out, char *why,
                              size_t cap);
/* Whether a size is usable: a multiple of 8 from 8 to 8192 (0: default). */
int sample_size_ok(long v);
void sample_jobs_free(sample_job *jobs, size_t n);

/* ---- PNG (sample_png.c) ------------------------------------------------ */

/* A1111's infotext: "prompt\nNegative prompt: neg\nSteps: 20, Sampler: ...,
 * CFG scale: 7, Seed: 1, Size: 512x512, Model: NAME". */
void sample_infotext(const sample_job *j, int width, int height, const char *model_name, sd_buf *b);
/* 8-bit RGB [h, w, 3] as a PNG in out, with a text chunk key = text
 * (tEXt when text is Latin-1, else iTXt, as PIL writes A1111's). */
sd_status sample_png_encode(const uint8_t *rgb, int w, int h, const char *key, const char *text, sd_buf *out,
                            sd_error *err);
/* n images (rgb[i] of w[i] x h[i]; NULL for a failed one: grey) in a grid
 * of ceil(sqrt(n)) columns, each cell the largest size, into *sheet (RGB,
 * *sw x *sh, malloc'ed). */
sd_status sample_contact_sheet(int n, uint8_t *const *rgb, const int *w, const int *h, uint8_t **sheet, int *sw,
                               int *sh, sd_error *err);

/* ---- the model (sample_model.c) ----------------------------------------- */

typedef struct {
    int n_enc; /* 1, or 2 for SDXL */
    sd_clip_text enc[2];
    int enc_loaded[2];
    sd_clip_tok *tok[2];
    sd_clip_text_out out[2];
    sd_clip_text_runner run[2];
    sd_clip_work *work;
    sd_clip_ids ids;
    sd_unet unet;
    int unet_loaded;
    sd_vae_decoder vae;
    int vae_loaded;
    sd_vae_decode_runner vrun;
    int sdxl;
    sd_prediction pred;
    int tctx, cross, pooled_dim; /* tokens, context width, SDXL's pooled width */
    char name[128];              /* the model's name for the infotext */
    /* the UNet on the backend */
    const sd_backend *be;
    void *exec;
    float *params;     /* the backend's copy of the UNet weights (the CPU: u.w.data) */
    float *act;        /* the backend's activation buffer */
    size_t act_cap;    /* floats */
    sd_unet_graph g;
    int gn, gh, gw;    /* the planned shape */
    float *stage;      /* host staging of the inputs / output */
    size_t stage_cap;  /* floats */
} sample_model;

/* Load the text encoder(s) and tokenizer(s), UNet, VAE decoder and
 * prediction type of src, and put them on be. */
sd_status sample_model_open(sample_model *m, const sample_source *src, const sd_backend *be, void *exec,
                            sd_error *err);
void sample_model_close(sample_model *m);
/* The default size: the UNet's sample_size times the VAE's factor. */
void sample_model_default_size(const sample_model *m, int *w, int *h);
/* The text conditioning of one prompt: ctx [tctx, cross] and, for SDXL,
 * pooled [pooled_dim]. */
sd_status sample_model_text(sample_model *m, const char *prompt, float *ctx, float *pooled, sd_error *err);

/* ---- one image (sample_denoise.c) --------------------------------------- */

typedef void (*sample_step_fn)(void *ctx, int step, int steps);

/* Sample job j at w x h and decode it to rgb [h, w, 3]; errors name the
 * step (a non-finite latent) or the part that failed. */
sd_status sample_generate(sample_model *m, const sample_job *j, int w, int h, sample_step_fn progress, void *pctx,
                          uint8_t *rgb, sd_error *err);

#endif
