/* The samplers' math as diffusers computes it for the SD / SDXL pipelines:
 * DDIMScheduler (eta 0), EulerDiscreteScheduler,
 * EulerAncestralDiscreteScheduler and DPMSolverMultistepScheduler (DPM++
 * 2M, with or without Karras sigmas), for epsilon and v-prediction models,
 * with classifier-free guidance, on the scaled_linear beta schedule every
 * SD model uses.
 *
 * The model is a callback (x, t) -> prediction, so the math is tested
 * without a UNet (tests/test_sampler.c against
 * tests/golden/make_sampler_golden.py). Host memory, fp32 latents as the
 * pipelines keep them; the schedule is computed as torch does (fp32 betas,
 * cumulative product accumulated in double, fp32 sigmas). */
#ifndef SDTK_SAMPLER_H
#define SDTK_SAMPLER_H

#include <stddef.h>

#include "err.h"

typedef enum {
    SD_SAMPLER_DDIM,
    SD_SAMPLER_EULER,
    SD_SAMPLER_EULER_A,
    SD_SAMPLER_DPMPP_2M,
    SD_SAMPLER_DPMPP_2M_KARRAS,
} sd_sampler_kind;

typedef enum {
    SD_SPACING_LEADING,  /* (0..steps-1) * (train // steps) + steps_offset */
    SD_SPACING_LINSPACE, /* evenly from 0 to train - 1 */
    SD_SPACING_TRAILING, /* from train down by train / steps, minus 1 */
} sd_spacing;

typedef enum { SD_PRED_EPSILON, SD_PRED_V } sd_prediction;

/* A scheduler's config (the scheduler_config.json keys that matter). */
typedef struct {
    int train_steps;              /* num_train_timesteps: 1000 */
    double beta_start, beta_end;  /* scaled_linear: 0.00085, 0.012 */
    sd_spacing spacing;           /* timestep_spacing */
    int steps_offset;             /* 1 in every SD model's file */
    sd_prediction prediction;     /* prediction_type */
} sd_sched_config;

/* "ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras" -> kind;
 * SD_EINVAL naming the name and the choices otherwise. */
sd_status sd_sampler_parse(const char *name, sd_sampler_kind *kind, sd_error *err);
const char *sd_sampler_name(sd_sampler_kind kind);

/* The config diffusers gives `kind` when a pipeline swaps it in with
 * from_config(the model's scheduler_config.json): SD 1.x / 2.x files
 * (sdxl 0) have no timestep_spacing, so each scheduler's default holds
 * (DDIM "leading", Euler, Euler a and DPM++ "linspace"); SDXL's file says
 * "leading" for all. steps_offset 1, scaled_linear 0.00085..0.012. */
void sd_sched_defaults(sd_sched_config *c, sd_sampler_kind kind, int sdxl, sd_prediction pred);

/* A sampling plan: the timesteps the model is given and the sigmas (or
 * alphas_cumprod for DDIM) each step uses. */
typedef struct {
    sd_sampler_kind kind;
    sd_sched_config cfg;
    int steps;
    double *timesteps;     /* [steps] what the model is given */
    float *sigmas;         /* [steps + 1] Euler / DPM; NULL for DDIM */
    float *alphas_cumprod; /* [train_steps] */
    float init_sigma;      /* the initial noise's scale (init_noise_sigma) */
} sd_sampler_plan;

/* SD_EINVAL for steps outside 1..train_steps or a bad config. */
sd_status sd_sampler_plan_make(sd_sampler_plan *p, const sd_sched_config *cfg, sd_sampler_kind kind, int steps,
                               sd_error *err);
void sd_sampler_plan_free(sd_sampler_plan *p);

/* The model: the predictions (epsilon or v) for the scaled input x[n] at
 * timestep t, conditional into cond and, when uncond is not NULL
 * (guidance on), unconditional into uncond. */
typedef sd_status (*sd_denoise_fn)(void *ctx, const float *x, double t, float *cond, float *uncond, sd_error *err);
/* Standard normal noise: n values into out (Euler a's per-step noise). */
typedef sd_status (*sd_noise_fn)(void *ctx, float *out, size_t n, sd_error *err);
/* After each step (0-based) of `steps`, for progress reports. */
typedef void (*sd_step_fn)(void *ctx, int step, int steps);

typedef struct {
    sd_denoise_fn model;
    void *model_ctx;
    sd_noise_fn noise; /* Euler a only */
    void *noise_ctx;
    sd_step_fn progress; /* optional */
    void *progress_ctx;
    double cfg; /* guidance scale; <= 1: the conditional prediction alone, as diffusers */
} sd_sampler_model;

/* latents[n]: the initial unit noise in, the final latents out (multiplied
 * by init_sigma first, as the pipelines do). Errors: the model's or the
 * noise's, SD_ENOMEM, SD_ERANGE naming the step when a latent becomes
 * non-finite (the latents are then those of the step before). */
sd_status sd_sample(const sd_sampler_plan *p, const sd_sampler_model *m, size_t n, float *latents, sd_error *err);

#endif
