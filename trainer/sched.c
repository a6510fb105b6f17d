/* DDPM scaled_linear schedule, noising and targets. */
#include "sched.h"

#include <math.h>

/* One spelling of the two names for the state, the config and messages. */
const char *sd_prediction_name(sd_prediction pred)
{
    return pred == SD_PRED_V ? "v_prediction" : "epsilon";
}

/* Cumulative product of 1 - beta over the sqrt-linear betas. */
void sd_ddpm_init(sd_ddpm *s, double beta_start, double beta_end)
{
    double a = sqrt(beta_start), b = sqrt(beta_end), prod = 1.0;
    for (int i = 0; i < SD_DDPM_STEPS; i++) {
        double r = a + (b - a) * (double)i / (double)(SD_DDPM_STEPS - 1);
        prod *= 1.0 - r * r;
        s->acp[i] = (float)prod;
    }
}

/* Shift and scale sqrt(acp) as diffusers' rescale_zero_terminal_snr does
 * to the betas; the betas it returns multiply back to these acp. */
void sd_ddpm_zero_terminal_snr(sd_ddpm *s)
{
    double a0 = sqrt((double)s->acp[0]), aT = sqrt((double)s->acp[SD_DDPM_STEPS - 1]);
    for (int i = 0; i < SD_DDPM_STEPS; i++) {
        double r = (sqrt((double)s->acp[i]) - aT) * (a0 / (a0 - aT));
        s->acp[i] = (float)(r * r);
    }
    s->acp[SD_DDPM_STEPS - 1] = 0.0f; /* exactly, as diffusers' schedule ends */
}

/* fp32 noising, one sample's scale pair at a time. */
void sd_ddpm_add_noise(const sd_ddpm *s, int n, size_t per, const int *t, const float *x0, const float *noise,
                       float *xt)
{
    for (int b = 0; b < n; b++) {
        float sa = sqrtf(s->acp[t[b]]), sb = sqrtf(1.0f - s->acp[t[b]]);
        size_t o = (size_t)b * per;
        for (size_t i = 0; i < per; i++) {
            float u = sa * x0[o + i], v = sb * noise[o + i];
            xt[o + i] = u + v;
        }
    }
}

/* epsilon: a copy of the noise; v: the velocity. */
void sd_ddpm_target(const sd_ddpm *s, sd_prediction pred, int n, size_t per, const int *t, const float *x0,
                    const float *noise, float *target)
{
    for (int b = 0; b < n; b++) {
        float sa = sqrtf(s->acp[t[b]]), sb = sqrtf(1.0f - s->acp[t[b]]);
        size_t o = (size_t)b * per;
        for (size_t i = 0; i < per; i++) {
            if (pred == SD_PRED_EPSILON) {
                target[o + i] = noise[o + i];
            } else {
                float u = sa * noise[o + i], v = sb * x0[o + i];
                target[o + i] = u - v;
            }
        }
    }
}

/* SNR as diffusers' compute_snr: alpha^2 / sigma^2. */
double sd_ddpm_snr(const sd_ddpm *s, int t)
{
    double a = s->acp[t];
    return a / (1.0 - a);
}
