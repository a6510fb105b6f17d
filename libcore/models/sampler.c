/* The sampling loop of diffusers' SD pipelines and each scheduler's step,
 * element by element in fp32 in torch's order of operations:
 *   latents = noise * init_sigma
 *   for each timestep t: x = scale_model_input(latents), the model's
 *   conditional and unconditional predictions at (x, t), guidance
 *   u + cfg * (c - u), latents = step(prediction, t, latents). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

/* Scratch of one sampling run: n floats each. */
typedef struct {
    float *x, *cond, *uncond, *prev_x0, *noise;
} scratch;

/* The x0 an epsilon or v prediction e implies for sample x, in the
 * sigma form (Euler, Euler a): v as c_out / c_skip of sigma. */
static float x0_sigma(sd_prediction pred, float sigma, float x, float e)
{
    if (pred == SD_PRED_EPSILON) return x - sigma * e;
    float s2 = sigma * sigma + 1.0f;
    return e * (-sigma / sqrtf(s2)) + x / s2;
}

/* DDIMScheduler.step with eta 0 (set_alpha_to_one false: past the first
 * timestep the final alpha is alphas_cumprod[0]). */
static void step_ddim(const sd_sampler_plan *p, int k, size_t n, float *lat, const float *e)
{
    int t = (int)p->timesteps[k], prev = t - p->cfg.train_steps / p->steps;
    float at = p->alphas_cumprod[t], ap = prev >= 0 ? p->alphas_cumprod[prev] : p->alphas_cumprod[0];
    float bt = 1.0f - at, sa = sqrtf(at), sb = sqrtf(bt), sap = sqrtf(ap), dir = sqrtf(1.0f - ap - 0.0f);
    for (size_t i = 0; i < n; i++) {
        float x = lat[i], x0, eps;
        if (p->cfg.prediction == SD_PRED_EPSILON) {
            x0 = (x - sb * e[i]) / sa;
            eps = e[i];
        } else {
            x0 = sa * x - sb * e[i];
            eps = sa * e[i] + sb * x;
        }
        lat[i] = sap * x0 + dir * eps;
    }
}

/* EulerDiscreteScheduler.step without churn (sigma_hat = sigma). */
static void step_euler(const sd_sampler_plan *p, int k, size_t n, float *lat, const float *e)
{
    float sigma = p->sigmas[k], dt = p->sigmas[k + 1] - sigma;
    for (size_t i = 0; i < n; i++) {
        float x = lat[i], x0 = x0_sigma(p->cfg.prediction, sigma, x, e[i]);
        float d = (x - x0) / sigma;
        lat[i] = x + d * dt;
    }
}

/* EulerAncestralDiscreteScheduler.step: down to sigma_down, then noise
 * of sigma_up added (noise drawn even at the last step, where it is 0). */
static void step_euler_a(const sd_sampler_plan *p, int k, size_t n, float *lat, const float *e, const float *noise)
{
    float from = p->sigmas[k], to = p->sigmas[k + 1];
    float up = sqrtf(to * to * (from * from - to * to) / (from * from));
    float down = sqrtf(to * to - up * up), dt = down - from;
    for (size_t i = 0; i < n; i++) {
        float x = lat[i], x0 = x0_sigma(p->cfg.prediction, from, x, e[i]);
        float d = (x - x0) / from;
        float y = x + d * dt;
        lat[i] = y + noise[i] * up;
    }
}

/* alpha_t, sigma_t of a sigma (VP form) and its log-SNR lambda. */
static void vp(float sigma, float *alpha, float *sig, float *lambda)
{
    *alpha = 1.0f / sqrtf(sigma * sigma + 1.0f);
    *sig = sigma * *alpha;
    *lambda = logf(*alpha) - logf(*sig);
}

/* DPMSolverMultistepScheduler (dpmsolver++, midpoint, order 2,
 * lower_order_final): the model output converted to x0, then a
 * first-order update on the first and last step, second-order between. */
static void step_dpm(const sd_sampler_plan *p, int k, size_t n, float *lat, const float *e, float *prev_x0)
{
    float as, ss, ls, at, st, lt;
    vp(p->sigmas[k], &as, &ss, &ls);
    vp(p->sigmas[k + 1], &at, &st, &lt);
    float h = lt - ls, em = expf(-h) - 1.0f, ratio = st / ss, c0 = at * em;
    int second = k > 0 && k < p->steps - 1;
    float r0 = 0, c1 = 0;
    if (second) {
        float a1, s1, l1;
        vp(p->sigmas[k - 1], &a1, &s1, &l1);
        r0 = (ls - l1) / h;
        c1 = 0.5f * c0;
    }
    for (size_t i = 0; i < n; i++) {
        float x = lat[i];
        float x0 = p->cfg.prediction == SD_PRED_EPSILON ? (x - ss * e[i]) / as : as * x - ss * e[i];
        if (p->sigmas[k + 1] == 0.0f) {
            lat[i] = x0; /* sigma 0: lambda infinite, the update is x0 itself */
        } else if (second) {
            float d1 = (1.0f / r0) * (x0 - prev_x0[i]);
            lat[i] = ratio * x - c0 * x0 - c1 * d1;
        } else {
            lat[i] = ratio * x - c0 * x0;
        }
        prev_x0[i] = x0;
    }
}

/* The model's input for step k: Euler's scale_model_input divides by
 * sqrt(sigma^2 + 1); DDIM and DPM take the latents as they are. */
static void model_input(const sd_sampler_plan *p, int k, size_t n, const float *lat, float *x)
{
    if (p->kind != SD_SAMPLER_EULER && p->kind != SD_SAMPLER_EULER_A) {
        memcpy(x, lat, n * sizeof(float));
        return;
    }
    float sigma = p->sigmas[k], s = sqrtf(sigma * sigma + 1.0f);
    for (size_t i = 0; i < n; i++) x[i] = lat[i] / s;
}

/* The first non-finite latent's index, or n. */
static size_t first_nonfinite(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return i;
    return n;
}

/* One step: the model, guidance, the scheduler's update into lat. */
static sd_status one_step(const sd_sampler_plan *p, const sd_sampler_model *m, int k, size_t n, float *lat,
                          scratch *s, sd_error *err)
{
    int guide = m->cfg > 1.0;
    model_input(p, k, n, lat, s->x);
    sd_status st = m->model(m->model_ctx, s->x, p->timesteps[k], s->cond, guide ? s->uncond : NULL, err);
    if (st) return st;
    float *e = s->cond;
    if (guide) {
        float g = (float)m->cfg;
        for (size_t i = 0; i < n; i++) e[i] = s->uncond[i] + g * (s->cond[i] - s->uncond[i]);
    }
    switch (p->kind) {
    case SD_SAMPLER_DDIM: step_ddim(p, k, n, lat, e); break;
    case SD_SAMPLER_EULER: step_euler(p, k, n, lat, e); break;
    case SD_SAMPLER_EULER_A:
        if (!m->noise) return sd_err_set(err, SD_EINVAL, "sampler euler_a: no noise source");
        st = m->noise(m->noise_ctx, s->noise, n, err);
        if (st) return st;
        step_euler_a(p, k, n, lat, e, s->noise);
        break;
    default: step_dpm(p, k, n, lat, e, s->prev_x0); break;
    }
    return SD_OK;
}

/* See sampler.h. The latents are checked after every step, so a model
 * that goes non-finite is named at the step where it did. */
sd_status sd_sample(const sd_sampler_plan *p, const sd_sampler_model *m, size_t n, float *latents, sd_error *err)
{
    if (!m->model || n == 0) return sd_err_set(err, SD_EINVAL, "sampler: no model or no latents");
    float *block = malloc(6 * n * sizeof(float));
    if (!block) return sd_err_set(err, SD_ENOMEM, "sampler: out of memory for %zu latents", n);
    scratch s = {block, block + n, block + 2 * n, block + 3 * n, block + 4 * n};
    float *keep = block + 5 * n; /* the latents before the step, restored when it goes non-finite */
    for (size_t i = 0; i < n; i++) latents[i] = latents[i] * p->init_sigma;
    sd_status st = SD_OK;
    for (int k = 0; k < p->steps && !st; k++) {
        memcpy(keep, latents, n * sizeof(float));
        st = one_step(p, m, k, n, latents, &s, err);
        size_t bad = st ? n : first_nonfinite(latents, n);
        if (!st && bad < n) {
            st = sd_err_set(err, SD_ERANGE, "sampler %s: latent %zu became %g at step %d of %d (timestep %g)",
                            sd_sampler_name(p->kind), bad, (double)latents[bad], k + 1, p->steps, p->timesteps[k]);
            memcpy(latents, keep, n * sizeof(float));
        }
        if (!st && m->progress) m->progress(m->progress_ctx, k, p->steps);
    }
    free(block);
    return st;
}
