/* The training noise schedule: diffusers' DDPMScheduler with
 * beta_schedule "scaled_linear" (SD 1.x/2.x/SDXL: betas from 0.00085 to
 * 0.012 spaced linearly in sqrt, 1000 steps), add_noise and the epsilon
 * and v-prediction targets, computed in fp32 as diffusers does on fp32
 * latents; plus the per-sample SNR for min-SNR loss weighting. */
#ifndef SDTK_TRAIN_SCHED_H
#define SDTK_TRAIN_SCHED_H

#include <stddef.h>

#include "sampler.h" /* sd_prediction: the samplers' (sd-train's samples use both) */

enum { SD_DDPM_STEPS = 1000 };

/* diffusers' prediction_type for pred: "epsilon" or "v_prediction" (the
 * checkpoint's state and scheduler config, the option's value). */
const char *sd_prediction_name(sd_prediction pred);

typedef struct {
    float acp[SD_DDPM_STEPS]; /* alphas_cumprod */
} sd_ddpm;

/* alphas_cumprod for betas = linspace(sqrt(start), sqrt(end), 1000)^2,
 * computed in double and rounded once (diffusers' fp32 cumprod differs by
 * less than 1e-6 relative: 7e-7 at t = 999). */
void sd_ddpm_init(sd_ddpm *s, double beta_start, double beta_end);
/* diffusers' rescale_zero_terminal_snr (Lin et al. 2023, "Common Diffusion
 * Noise Schedules and Sample Steps are Flawed", algorithm 1) applied to
 * the schedule: sqrt(acp) shifted so its last value is 0 and scaled so its
 * first is unchanged. The last timestep is then pure noise (SNR 0), which
 * v-prediction models trained this way need (sd-train
 * --zero-terminal-snr). Computed in double from the fp32 schedule. */
void sd_ddpm_zero_terminal_snr(sd_ddpm *s);
/* x_t = sqrt(acp[t]) x0 + sqrt(1 - acp[t]) noise for n samples of per
 * floats each (diffusers add_noise). */
void sd_ddpm_add_noise(const sd_ddpm *s, int n, size_t per, const int *t, const float *x0, const float *noise,
                       float *xt);
/* The regression target: the noise (epsilon) or the velocity
 * sqrt(acp) noise - sqrt(1 - acp) x0 (diffusers get_velocity). */
void sd_ddpm_target(const sd_ddpm *s, sd_prediction pred, int n, size_t per, const int *t, const float *x0,
                    const float *noise, float *target);
/* Signal-to-noise ratio acp / (1 - acp) of timestep t. */
double sd_ddpm_snr(const sd_ddpm *s, int t);

#endif
