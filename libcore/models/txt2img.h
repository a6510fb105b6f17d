/* Text to image, the one code path of sd-sample and of sd-train's samples:
 * prompt jobs from JSONL (sample_prompts.c), A1111's infotext
 * (sample_info.c), the model's text encoders, VAE decoder and (for
 * sd-sample) UNet on a backend, a job's conditioning (sample_model.c), and
 * one image sampled and decoded from that conditioning with any UNet
 * weights on the same backend (sample_denoise.c). */
#ifndef SDTK_TXT2IMG_H
#define SDTK_TXT2IMG_H

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

/* One image to make: a JSONL line, or sd-sample's command line prompt.
 * width or height 0: the model's default size (the UNet's sample_size
 * times the VAE's factor, as diffusers). */
typedef struct {
    char *prompt, *negative; /* owned */
    uint64_t seed;
    int steps;
    double cfg;
    sd_sampler_kind sampler;
    int width, height;
    long line; /* the prompts file's line (0: the command line) */
} sd_sample_job;

/* The largest seed a JSONL line or --seed may give (JSON numbers are exact
 * up to 2^53; A1111's seeds stay below 2^32). */
#define SD_SAMPLE_SEED_MAX 9007199254740991.0

/* The defaults of a field a line leaves out, as sd-sample's flags give
 * them: "", "", seed 0, 20 steps, CFG 7, DPM++ 2M, the model's size. */
void sd_sample_job_default(sd_sample_job *j);

/* ---- prompts (sample_prompts.c) ---------------------------------------- */

/* Counts of what was refused, by reason, for the summary. */
typedef struct {
    size_t bad_json, bad_field, bad_size, bad_sampler;
} sd_sample_skips;

/* Every line of path (blank lines ignored) as a job over the defaults; a
 * bad line is logged with its number and reason, counted in skips and left
 * out. Errors: the file cannot be read (SD_ENOTFOUND / SD_EIO), what names
 * the option that gave it ("--prompts"). */
sd_status sd_sample_read_prompts(const char *path, const char *what, const sd_sample_job *def, sd_sample_job **jobs,
                                 size_t *n, sd_sample_skips *skips, sd_error *err);
/* One JSONL line (text is modified in place) over def into *out; NULL on
 * success, else the reason (why holds the details, cap bytes). A key other
 * than the job's fields is refused ("unknown field"); a line without
 * "prompt" (and an empty default) succeeds with a note left in why. */
const char *sd_sample_parse_line(char *text, size_t len, const sd_sample_job *def, sd_sample_job *out, char *why,
                                 size_t cap);
/* Whether a size is usable: a multiple of 8 from 8 to 8192 (0: default). */
int sd_sample_size_ok(long v);
size_t sd_sample_skips_total(const sd_sample_skips *s);
void sd_sample_jobs_free(sd_sample_job *jobs, size_t n);

/* ---- infotext (sample_info.c) ------------------------------------------ */

/* A1111's infotext: "prompt\nNegative prompt: neg\nSteps: 20, Sampler: ...,
 * CFG scale: 7, Seed: 1, Size: 512x512, Model: NAME". */
void sd_sample_infotext(const sd_sample_job *j, int width, int height, const char *model_name, sd_buf *b);

/* ---- the model (sample_model.c) ----------------------------------------- */

/* Where the model comes from: a diffusers folder, or a single-file
 * checkpoint with tokenizers from a folder and what a file cannot say
 * (configs to use instead of inferring, the prediction type). */
typedef struct {
    const char *path, *tokenizer;
    const char *unet_config, *vae_config, *text_config[2];
    const char *prediction; /* "epsilon", "v_prediction" or NULL: the folder's scheduler, else epsilon */
    int max_tokens;         /* caption tokens: 75 (0 too), or 150 / 225 as sd-latents --max-tokens chunks them */
    int no_unet;            /* the caller brings its own UNet (sd-train): only text encoders and VAE decoder */
} sd_sample_source;

typedef struct {
    int n_enc; /* 1, or 2 for SDXL; 0 once the text side is dropped */
    sd_clip_text enc[2];
    int enc_loaded[2];
    sd_clip_tok *tok[2];
    sd_clip_text_out out[2];
    sd_clip_text_runner run[2];
    sd_clip_work *work;
    sd_clip_ids ids;
    sd_unet unet; /* sd-sample's; sd-train passes its own to sd_sample_generate */
    int unet_loaded;
    sd_vae_decoder vae;
    int vae_loaded;
    sd_vae_decode_runner vrun;
    int sdxl;
    sd_prediction pred;
    int tctx, cross, pooled_dim; /* rows of the context (77, 152, 227), its width, SDXL's pooled width */
    int max_tokens;              /* 75, 150 or 225 (sd_sample_source's) */
    char name[128];              /* the model's name for the infotext */
    /* the backend and the UNet workspace there */
    const sd_backend *be;
    void *exec;
    float *params;     /* the backend's copy of m->unet's weights (the CPU: unet.w.data) */
    float *act;        /* the backend's activation buffer */
    size_t act_cap;    /* floats */
    sd_unet_graph g;
    int gn, gh, gw;    /* the planned shape */
    float *stage;      /* host staging of the inputs / output */
    size_t stage_cap;  /* floats */
} sd_sample_model;

/* Load the text encoder(s) and tokenizer(s), UNet (unless src->no_unet),
 * VAE decoder and prediction type of src, and put them on be. */
sd_status sd_sample_model_open(sd_sample_model *m, const sd_sample_source *src, const sd_backend *be, void *exec,
                               sd_error *err);
void sd_sample_model_close(sd_sample_model *m);
/* Whether unet takes what the text side and the VAE give (context width,
 * SDXL's pooled width and time ids, latent channels); the error names
 * path and both numbers. */
sd_status sd_sample_model_fits(const sd_sample_model *m, const sd_unet *unet, const char *path, sd_error *err);
/* The text encoders and tokenizers freed (sd-train, once every prompt's
 * conditioning is made); the VAE decoder stays. */
void sd_sample_model_drop_text(sd_sample_model *m);
/* The UNet's activation buffer and staging freed (they come back on the
 * next image): sd-train between its sample steps. */
void sd_sample_model_release_work(sd_sample_model *m);
/* The default size: unet's sample_size times the VAE's factor. */
void sd_sample_model_default_size(const sd_sample_model *m, const sd_unet *unet, int *w, int *h);
/* The text conditioning of one prompt: ctx [tctx, cross] and, for SDXL,
 * pooled [pooled_dim]. Over 75 tokens (max_tokens 150, 225) the ids are cut
 * into 77-long chunks, each encoded alone, and the hidden states joined as
 * sd-latents caches them (sd_clip_kohya_chunks / sd_clip_kohya_join, after
 * sd-scripts); SDXL's pooled output is the first chunk's. */
sd_status sd_sample_model_text(sd_sample_model *m, const char *prompt, float *ctx, float *pooled, sd_error *err);

/* ---- one image (sample_denoise.c) --------------------------------------- */

/* A job's conditioning: n 2 with guidance (cfg > 1; the negative prompt
 * first, as diffusers), else 1; ctx [n, tctx, cross], pooled
 * [n, pooled_dim] (SDXL). */
typedef struct {
    int n;
    float *ctx, *pooled;
} sd_sample_cond;

/* Both prompts of j encoded (SDXL with no negative prompt gets zeros for
 * it, as diffusers' SDXL pipelines do). */
sd_status sd_sample_cond_make(sd_sample_model *m, const sd_sample_job *j, sd_sample_cond *c, sd_error *err);
void sd_sample_cond_free(sd_sample_cond *c);

typedef void (*sd_sample_step_fn)(void *ctx, int step, int steps);

/* Sample job j from its conditioning c at w x h with unet, whose weights
 * params lie on m's backend (sd-sample: m->unet and m->params; sd-train:
 * its training or EMA weights; the workspace is planned for one UNet
 * config), and decode it to rgb [h, w, 3]; the initial noise comes from
 * torch's CPU generator seeded with j->seed, nothing else random is used.
 * Errors name the step (a non-finite latent) or the part that failed. */
sd_status sd_sample_generate(sd_sample_model *m, const sd_unet *unet, const float *params, const sd_sample_job *j,
                             const sd_sample_cond *c, int w, int h, sd_sample_step_fn progress, void *pctx,
                             uint8_t *rgb, sd_error *err);

#endif
