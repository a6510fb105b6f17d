/* The samplers' math against diffusers (tests/golden/sampler, made by
 * tests/golden/make_sampler_golden.py): for SD 1.5 (epsilon), SD 2.1
 * (v-prediction) and SDXL scheduler configs, DDIM, Euler, Euler a, DPM++ 2M
 * and DPM++ 2M Karras at 10 and 25 steps with CFG 7 on an analytic model:
 * the timesteps equal, the sigmas within fp32 rounding, the final latents
 * within 1e-4 max abs. Euler a's per-step noise comes from the golden file.
 * Then names, bad plans, guidance off, progress, and a model going
 * non-finite mid-sampling. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "safetensors.h"
#include "sampler.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/sampler"
#endif

/* The golden script's model: uncond 0.60 x + 0.10 t / 1000, cond
 * 0.65 x + 0.05 t / 1000 (fp32 tensor times a scalar, plus a scalar). */
typedef struct {
    size_t n;
    int calls, nan_at; /* nan_at > 0: the cond prediction is NaN from that call on */
    int saw_uncond;
} toy;

/* The model callback: both predictions of the scaled input at t. */
static sd_status toy_model(void *ctx, const float *x, double t, float *cond, float *uncond, sd_error *err)
{
    toy *m = ctx;
    (void)err;
    m->calls++;
    float bu = (float)(0.10 * t / 1000), bc = (float)(0.05 * t / 1000);
    for (size_t i = 0; i < m->n; i++) {
        cond[i] = 0.65f * x[i] + bc;
        if (uncond) uncond[i] = 0.60f * x[i] + bu;
    }
    if (uncond) m->saw_uncond = 1;
    if (m->nan_at > 0 && m->calls >= m->nan_at) cond[0] = NAN;
    return SD_OK;
}

/* Noise replayed from the golden step_noise, one step's worth per call. */
typedef struct {
    const float *data;
    size_t used, total;
} replay;

/* The noise callback: the next n golden values. */
static sd_status replay_noise(void *ctx, float *out, size_t n, sd_error *err)
{
    replay *r = ctx;
    if (r->used + n > r->total) return sd_err_set(err, SD_ERANGE, "golden step noise ran out");
    memcpy(out, r->data + r->used, n * sizeof(float));
    r->used += n;
    return SD_OK;
}

/* The progress callback: counts steps reported in order. */
static void count_step(void *ctx, int step, int steps)
{
    int *c = ctx;
    if (step == *c && steps > 0) (*c)++;
}

/* One golden case: family, sampler and step count. */
static void check_case(const sd_safetensors *st, const char *family, sd_sampler_kind kind, int steps)
{
    char name[128];
    snprintf(name, sizeof name, "%s_%s_%d", family, sd_sampler_name(kind), steps);
    char key[160];
    snprintf(key, sizeof key, "%s.latents", name);
    const sd_st_tensor *want = sd_st_find(st, key);
    snprintf(key, sizeof key, "%s.timesteps", name);
    const sd_st_tensor *wts = sd_st_find(st, key);
    snprintf(key, sizeof key, "%s.sigmas", name);
    const sd_st_tensor *wsig = sd_st_find(st, key);
    const sd_st_tensor *noise = sd_st_find(st, "noise"), *step_noise = sd_st_find(st, "step_noise");
    if (!CHECK(want && wts && noise && step_noise && (kind == SD_SAMPLER_DDIM || wsig))) {
        fprintf(stderr, "golden case %s missing\n", name);
        return;
    }
    sd_sched_config cfg;
    sd_sched_defaults(&cfg, kind, strcmp(family, "sdxl") == 0,
                      strcmp(family, "sd21") == 0 ? SD_PRED_V : SD_PRED_EPSILON);
    sd_sampler_plan p;
    sd_error err = {0};
    if (!CHECK(sd_sampler_plan_make(&p, &cfg, kind, steps, &err) == SD_OK)) return;
    const double *ts = wts->data;
    int ts_ok = (int)wts->shape[0] == steps;
    for (int k = 0; k < steps && ts_ok; k++) ts_ok = ts[k] == p.timesteps[k];
    if (!CHECK(ts_ok)) fprintf(stderr, "%s: timesteps differ (first %g vs %g)\n", name, p.timesteps[0], ts[0]);
    double sig_err = 0;
    if (wsig) {
        const float *ws = wsig->data;
        for (int k = 0; k <= steps; k++) {
            double d = fabs((double)p.sigmas[k] - ws[k]) / (fabs(ws[k]) + 1e-30);
            if (!(d <= sig_err)) sig_err = d;
        }
        CHECK(sig_err <= 1e-6);
    }
    size_t n = noise->nbytes / 4;
    float *lat = malloc(n * sizeof(float));
    toy m = {.n = n};
    replay r = {.data = step_noise->data, .total = step_noise->nbytes / 4};
    int progressed = 0;
    sd_sampler_model sm = {.model = toy_model, .model_ctx = &m, .noise = replay_noise, .noise_ctx = &r,
                           .progress = count_step, .progress_ctx = &progressed, .cfg = 7.0};
    if (CHECK(lat)) {
        memcpy(lat, noise->data, n * sizeof(float));
        if (CHECK(sd_sample(&p, &sm, n, lat, &err) == SD_OK)) {
            const float *w = want->data;
            double e = 0;
            for (size_t i = 0; i < n; i++) {
                double d = fabs((double)lat[i] - w[i]);
                if (!(d <= e)) e = d;
            }
            printf("%-26s max err %.2e  sigma rel err %.1e\n", name, e, sig_err);
            CHECK(e <= 1e-4);
            CHECK(progressed == steps && m.calls == steps && m.saw_uncond);
        } else {
            fprintf(stderr, "%s: %s\n", name, err.msg);
        }
    }
    free(lat);
    sd_sampler_plan_free(&p);
}

/* Names, bad plans, guidance off, a model going non-finite. */
static void check_errors(void)
{
    sd_sampler_kind k;
    sd_error err = {0};
    CHECK(sd_sampler_parse("dpmpp_2m_karras", &k, &err) == SD_OK && k == SD_SAMPLER_DPMPP_2M_KARRAS);
    CHECK(sd_sampler_parse("heun", &k, &err) == SD_EINVAL && strstr(err.msg, "'heun'") && strstr(err.msg, "euler_a"));
    sd_sched_config cfg;
    sd_sched_defaults(&cfg, SD_SAMPLER_EULER, 0, SD_PRED_EPSILON);
    CHECK(cfg.spacing == SD_SPACING_LINSPACE && cfg.steps_offset == 1);
    sd_sched_defaults(&cfg, SD_SAMPLER_DDIM, 0, SD_PRED_EPSILON);
    CHECK(cfg.spacing == SD_SPACING_LEADING);
    sd_sched_defaults(&cfg, SD_SAMPLER_DPMPP_2M, 1, SD_PRED_EPSILON);
    CHECK(cfg.spacing == SD_SPACING_LEADING);
    sd_sampler_plan p;
    CHECK(sd_sampler_plan_make(&p, &cfg, SD_SAMPLER_DPMPP_2M, 0, &err) == SD_EINVAL && strstr(err.msg, "0 steps"));
    CHECK(sd_sampler_plan_make(&p, &cfg, SD_SAMPLER_DPMPP_2M, 1001, &err) == SD_EINVAL);
    sd_sched_config bad = cfg;
    bad.beta_end = 0;
    CHECK(sd_sampler_plan_make(&p, &bad, SD_SAMPLER_EULER, 10, &err) == SD_EINVAL);

    /* a model that goes NaN at its 4th call: named at step 4, latents kept */
    float lat[16];
    for (int i = 0; i < 16; i++) lat[i] = (float)(i - 8) / 8;
    toy m = {.n = 16, .nan_at = 4};
    sd_sampler_model sm = {.model = toy_model, .model_ctx = &m, .cfg = 1.0};
    if (CHECK(sd_sampler_plan_make(&p, &cfg, SD_SAMPLER_DPMPP_2M, 10, &err) == SD_OK)) {
        CHECK(sd_sample(&p, &sm, 16, lat, &err) == SD_ERANGE);
        CHECK(strstr(err.msg, "step 4 of 10") != NULL);
        int finite = 1;
        for (int i = 0; i < 16; i++) finite &= isfinite(lat[i]) != 0;
        CHECK(finite && !m.saw_uncond); /* cfg 1: no unconditional pass */
        sd_sampler_plan_free(&p);
    }
    /* euler_a without a noise source */
    if (CHECK(sd_sampler_plan_make(&p, &cfg, SD_SAMPLER_EULER_A, 3, &err) == SD_OK)) {
        m.nan_at = 0;
        CHECK(sd_sample(&p, &sm, 16, lat, &err) == SD_EINVAL && strstr(err.msg, "noise"));
        sd_sampler_plan_free(&p);
    }
}

int main(void)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    if (CHECK(sd_st_open(&st, GOLDEN_DIR "/expected.safetensors", &err) == SD_OK)) {
        static const char *families[] = {"sd15", "sd21", "sdxl"};
        for (int f = 0; f < 3; f++)
            for (int k = SD_SAMPLER_DDIM; k <= SD_SAMPLER_DPMPP_2M_KARRAS; k++) {
                check_case(st, families[f], (sd_sampler_kind)k, 10);
                check_case(st, families[f], (sd_sampler_kind)k, 25);
            }
        sd_st_close(st);
    } else {
        fprintf(stderr, "%s\n", err.msg);
    }
    check_errors();
    return check_done("test_sampler");
}
