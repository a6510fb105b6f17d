/* The samplers' schedules as diffusers builds them: the scaled_linear
 * alphas_cumprod, each scheduler's timestep spacing, the sigmas it
 * interpolates or (Karras) spaces, and the initial noise's scale. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

static const char *const names[] = {"ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras"};

/* The name a sampler is known by in prompts files and logs. */
const char *sd_sampler_name(sd_sampler_kind kind)
{
    return (unsigned)kind < sizeof names / sizeof *names ? names[kind] : "?";
}

/* A sampler's name to its kind; an unknown name lists the choices. */
sd_status sd_sampler_parse(const char *name, sd_sampler_kind *kind, sd_error *err)
{
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *kind = (sd_sampler_kind)i;
            return SD_OK;
        }
    return sd_err_set(err, SD_EINVAL, "unknown sampler '%s' (ddim, euler, euler_a, dpmpp_2m, dpmpp_2m_karras)",
                      name ? name : "");
}

/* See sampler.h: what from_config gives each scheduler from the family's
 * scheduler_config.json. */
void sd_sched_defaults(sd_sched_config *c, sd_sampler_kind kind, int sdxl, sd_prediction pred)
{
    memset(c, 0, sizeof *c);
    c->train_steps = 1000;
    c->beta_start = 0.00085;
    c->beta_end = 0.012;
    c->steps_offset = 1;
    c->prediction = pred;
    c->spacing = sdxl || kind == SD_SAMPLER_DDIM ? SD_SPACING_LEADING : SD_SPACING_LINSPACE;
}

/* torch.cumprod(1 - linspace(sqrt(b0), sqrt(b1), N) ** 2) in fp32: the
 * betas rounded to fp32, the product accumulated in double as torch's CPU
 * kernel does, each entry rounded to fp32. */
static void alphas_cumprod(const sd_sched_config *c, float *ac)
{
    int n = c->train_steps;
    double s0 = sqrt(c->beta_start), s1 = sqrt(c->beta_end), acc = 1.0;
    for (int i = 0; i < n; i++) {
        float r = (float)(n > 1 ? s0 + (s1 - s0) * i / (n - 1) : s0);
        float alpha = 1.0f - r * r;
        acc *= (double)alpha;
        ac[i] = (float)acc;
    }
}

/* numpy's linspace(0, stop, num)[i]: i * (stop / (num - 1)), the last
 * exactly stop. */
static double np_linspace(double stop, int num, int i)
{
    if (num < 2) return 0.0;
    if (i == num - 1) return stop;
    return i * (stop / (num - 1));
}

/* The spaced timesteps, highest first, as DDIM / Euler / Euler a space
 * `steps` of them (Euler's stay fractional under linspace, DDIM rounds
 * them half to even as numpy does). */
static void spaced(const sd_sched_config *c, int steps, int integral, double *ts)
{
    int n = c->train_steps;
    for (int k = 0; k < steps; k++) {
        int i = steps - 1 - k; /* ascending index, reversed */
        double t;
        switch (c->spacing) {
        case SD_SPACING_LINSPACE:
            t = np_linspace(n - 1, steps, i);
            t = integral ? rint(t) : (double)(float)t;
            break;
        case SD_SPACING_TRAILING:
            t = rint(n - k * ((double)n / steps)) - 1;
            break;
        default: /* leading */
            t = (double)i * (n / steps) + c->steps_offset;
            break;
        }
        ts[k] = t;
    }
}

/* DPMSolverMultistep's spacing: steps + 1 points, the last (lowest) one
 * dropped. */
static void spaced_dpm(const sd_sched_config *c, int steps, double *ts)
{
    int n = c->train_steps;
    for (int k = 0; k < steps; k++) {
        int i = steps - k; /* ascending index among steps + 1, reversed, the last dropped */
        double t;
        switch (c->spacing) {
        case SD_SPACING_LINSPACE:
            t = rint(np_linspace(n - 1, steps + 1, i));
            break;
        case SD_SPACING_TRAILING:
            t = rint(n - k * ((double)n / steps)) - 1;
            break;
        default:
            t = (double)i * (n / (steps + 1)) + c->steps_offset;
            break;
        }
        ts[k] = t;
    }
}

/* np.interp(t, arange(n), sigmas): exact at whole timesteps. */
static double interp(const float *s, int n, double t)
{
    if (t <= 0) return s[0];
    if (t >= n - 1) return s[n - 1];
    int j = (int)t;
    if ((double)j == t) return s[j];
    double slope = (double)s[j + 1] - (double)s[j]; /* over a step of 1 */
    return slope * (t - j) + (double)s[j];
}

/* diffusers' _sigma_to_t: the fractional timestep whose log sigma is
 * log(sigma), interpolated between neighbouring table entries. */
static double sigma_to_t(double sigma, const float *log_sigmas, int n)
{
    double ls = log(sigma > 1e-10 ? sigma : 1e-10);
    int low = 0;
    for (int i = 0; i < n; i++)
        if (ls - (double)log_sigmas[i] >= 0) low = i;
    if (low > n - 2) low = n - 2;
    double lo = log_sigmas[low], hi = log_sigmas[low + 1];
    double w = (lo - ls) / (lo - hi);
    w = w < 0 ? 0 : w > 1 ? 1 : w;
    return (1 - w) * low + w * (low + 1);
}

/* DPM++ with Karras sigmas: rho-7 spacing between the table's smallest
 * and largest sigma, each mapped back to a whole timestep. */
static void karras(const float *sig, int n, int steps, double *ts, float *out)
{
    float *logs = malloc((size_t)n * sizeof(float));
    double smin = sig[0], smax = sig[n - 1], rho = 7.0;
    double lo = pow(smin, 1 / rho), hi = pow(smax, 1 / rho);
    for (int i = 0; i < n && logs; i++) logs[i] = (float)log((double)sig[i]);
    for (int k = 0; k < steps; k++) {
        double ramp = np_linspace(1.0, steps, k);
        double s = pow(hi + ramp * (lo - hi), rho);
        out[k] = (float)s;
        ts[k] = logs ? rint(sigma_to_t(s, logs, n)) : 0;
    }
    free(logs);
}

/* See sampler.h. */
sd_status sd_sampler_plan_make(sd_sampler_plan *p, const sd_sched_config *cfg, sd_sampler_kind kind, int steps,
                               sd_error *err)
{
    memset(p, 0, sizeof *p);
    int n = cfg->train_steps;
    if (n < 2 || n > 100000 || !(cfg->beta_start > 0) || !(cfg->beta_end > cfg->beta_start) || cfg->beta_end >= 1)
        return sd_err_set(err, SD_EINVAL, "sampler: bad schedule (%d training steps, betas %g..%g)", n,
                          cfg->beta_start, cfg->beta_end);
    if ((unsigned)kind > SD_SAMPLER_DPMPP_2M_KARRAS) return sd_err_set(err, SD_EINVAL, "sampler: unknown kind");
    if (steps < 1 || steps > n)
        return sd_err_set(err, SD_EINVAL, "sampler: %d steps (1..%d)", steps, n);
    p->kind = kind;
    p->cfg = *cfg;
    p->steps = steps;
    p->timesteps = malloc((size_t)steps * sizeof(double));
    p->alphas_cumprod = malloc((size_t)n * sizeof(float));
    float *table = malloc((size_t)n * sizeof(float));
    if (kind != SD_SAMPLER_DDIM) p->sigmas = malloc((size_t)(steps + 1) * sizeof(float));
    if (!p->timesteps || !p->alphas_cumprod || !table || (kind != SD_SAMPLER_DDIM && !p->sigmas)) {
        free(table);
        sd_sampler_plan_free(p);
        return sd_err_set(err, SD_ENOMEM, "sampler: out of memory for a %d-step plan", steps);
    }
    alphas_cumprod(cfg, p->alphas_cumprod);
    for (int i = 0; i < n; i++) {
        float a = p->alphas_cumprod[i];
        table[i] = sqrtf((1.0f - a) / a);
    }
    p->init_sigma = 1.0f;
    if (kind == SD_SAMPLER_DDIM) {
        spaced(cfg, steps, 1, p->timesteps);
    } else if (kind == SD_SAMPLER_DPMPP_2M_KARRAS) {
        karras(table, n, steps, p->timesteps, p->sigmas);
    } else {
        if (kind == SD_SAMPLER_DPMPP_2M) spaced_dpm(cfg, steps, p->timesteps);
        else spaced(cfg, steps, 0, p->timesteps);
        for (int k = 0; k < steps; k++) p->sigmas[k] = (float)interp(table, n, p->timesteps[k]);
    }
    if (p->sigmas) p->sigmas[steps] = 0.0f;
    if (kind == SD_SAMPLER_EULER || kind == SD_SAMPLER_EULER_A) {
        float m = 0.0f;
        for (int k = 0; k <= steps; k++) m = p->sigmas[k] > m ? p->sigmas[k] : m;
        p->init_sigma = cfg->spacing == SD_SPACING_LEADING ? sqrtf(m * m + 1.0f) : m;
    }
    free(table);
    return SD_OK;
}

/* Release the plan's arrays. */
void sd_sampler_plan_free(sd_sampler_plan *p)
{
    free(p->timesteps);
    free(p->sigmas);
    free(p->alphas_cumprod);
    p->timesteps = NULL;
    p->sigmas = NULL;
    p->alphas_cumprod = NULL;
}
