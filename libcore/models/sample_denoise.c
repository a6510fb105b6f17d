/* One image (sd-sample's and sd-train's samples): the prompt and negative
 * prompt encoded, the initial latents from torch's CPU generator for the
 * seed, the sampler driving the UNet (both halves of classifier-free
 * guidance in one batch of two), the VAE decoder, 8-bit RGB. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "progress.h"
#include "txt2img.h"
#include "torch_randn.h"

/* What the sampler's model callback needs. */
typedef struct {
    sd_sample_model *m;
    const sd_unet *unet;
    const float *params; /* its weights on m's backend */
    int n;               /* 2 with guidance (unconditional first, as diffusers), else 1 */
    size_t per;          /* floats of one latent */
    const float *ctx;    /* [n, tctx, cross] */
    const float *pooled; /* [n, pooled_dim] (SDXL) */
    float tids[2 * SD_UNET_TIME_IDS];
    sd_sample_step_fn progress;
    void *pctx;
    int calls;                         /* UNet calls so far */
    double unet_s, unet_min, unet_max; /* their seconds: sum, fastest, slowest */
} denoise_ctx;

/* Plan the UNet for n latents of lh x lw and size the buffers (kept while
 * the shape stays the same). */
static sd_status prepare(sd_sample_model *m, const sd_unet *unet, int n, int lh, int lw, sd_error *err)
{
    if (m->g.ops && m->gn == n && m->gh == lh && m->gw == lw) return SD_OK;
    sd_unet_graph_free(&m->g);
    m->gn = 0;
    /* checkpointed: a block's intermediates share one region (no backward here), the
     * activation buffer a fraction of the full plan's; the forward computes the same */
    sd_status st = sd_unet_plan(unet, n, lh, lw, m->tctx, 1, &m->g, err);
    if (st) return st;
    sd_log(SD_LOG_DEBUG, "UNet graph, %d x %dx%d latents: activations %.1f MiB", n, lh, lw,
           (double)m->g.nact * sizeof(float) / 1048576.0);
    if (m->g.nact > m->act_cap) {
        if (m->be->is_device) {
            if (m->act) m->be->release(m->exec, m->act);
            m->act = m->be->alloc(m->exec, m->g.nact * sizeof(float));
        } else {
            free(m->act);
            m->act = calloc(m->g.nact, sizeof(float));
        }
        m->act_cap = m->act ? m->g.nact : 0;
        if (!m->act)
            return sd_err_set(err, SD_ENOMEM, "out of %s memory for the UNet's activations (%zu MiB at %dx%d latents)",
                              m->be->is_device ? "device" : "host", m->g.nact * sizeof(float) >> 20, lh, lw);
    }
    size_t io = (size_t)n * (size_t)unet->cfg.out_channels * (size_t)lh * (size_t)lw;
    if (io > m->stage_cap) {
        free(m->stage);
        m->stage = malloc(io * sizeof(float));
        m->stage_cap = m->stage ? io : 0;
        if (!m->stage) return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    m->gn = n;
    m->gh = lh;
    m->gw = lw;
    return SD_OK;
}

/* Host floats into the activation buffer at offset off. */
static void put(sd_sample_model *m, size_t off, const float *src, size_t n)
{
    m->be->h2d(m->exec, m->act + off, src, n * sizeof(float));
}

/* The sampler's model: x into every batch slot, the timestep, the text
 * inputs, one forward, the predictions out. */
static sd_status denoise(void *vc, const float *x, double t, float *cond, float *uncond, sd_error *err)
{
    denoise_ctx *c = vc;
    sd_sample_model *m = c->m;
    const sd_unet_graph *g = &m->g;
    double t0 = sd_now();
    float tt[2] = {(float)t, (float)t};
    for (int b = 0; b < c->n; b++) put(m, g->x + (size_t)b * c->per, x, c->per);
    put(m, g->t, tt, (size_t)c->n);
    put(m, g->ctx, c->ctx, (size_t)c->n * (size_t)m->tctx * (size_t)m->cross);
    if (c->unet->cfg.text_time) {
        put(m, g->text, c->pooled, (size_t)c->n * (size_t)m->pooled_dim);
        put(m, g->tids, c->tids, (size_t)c->n * SD_UNET_TIME_IDS);
    }
    sd_unet_forward(c->unet, g, m->be, m->exec, c->params, m->act);
    m->be->d2h(m->exec, m->stage, m->act + g->out, (size_t)c->n * c->per * sizeof(float));
    sd_status st = m->be->sync(m->exec, err);
    if (st) return st;
    double dt = sd_now() - t0;
    c->unet_s += dt;
    c->unet_min = c->calls && c->unet_min < dt ? c->unet_min : dt;
    c->unet_max = c->unet_max > dt ? c->unet_max : dt;
    c->calls++;
    if (c->n == 2) {
        memcpy(uncond, m->stage, c->per * sizeof(float));
        memcpy(cond, m->stage + c->per, c->per * sizeof(float));
    } else {
        memcpy(cond, m->stage, c->per * sizeof(float));
    }
    return SD_OK;
}

/* The sampler's step callback, passed on. */
static void on_step(void *vc, int step, int steps)
{
    denoise_ctx *c = vc;
    if (c->progress) c->progress(c->pctx, step, steps);
}

/* The conditioning of both prompts (see txt2img.h): [uncond, cond] with
 * guidance, else [cond]. SDXL with no negative prompt gets zeros for it, as
 * diffusers' SDXL pipelines do (force_zeros_for_empty_prompt). */
sd_status sd_sample_cond_make(sd_sample_model *m, const sd_sample_job *j, sd_sample_cond *c, sd_error *err)
{
    int n = j->cfg > 1 ? 2 : 1;
    size_t cn = (size_t)m->tctx * (size_t)m->cross, pn = (size_t)m->pooled_dim;
    memset(c, 0, sizeof *c);
    c->n = n;
    c->ctx = calloc((size_t)n * cn, sizeof(float));
    c->pooled = calloc((size_t)n * pn + 1, sizeof(float));
    if (!c->ctx || !c->pooled) {
        sd_sample_cond_free(c);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    if (!m->n_enc) return sd_err_set(err, SD_EINVAL, "the text encoders are gone (sd_sample_model_drop_text)");
    float *cc = c->ctx + (size_t)(n - 1) * cn, *pc = m->sdxl ? c->pooled + (size_t)(n - 1) * pn : NULL;
    sd_status st = sd_sample_model_text(m, j->prompt, cc, pc, err);
    if (!st && n == 2 && !(m->sdxl && !j->negative[0])) /* SDXL's empty negative: the zeros of calloc */
        st = sd_sample_model_text(m, j->negative, c->ctx, m->sdxl ? c->pooled : NULL, err);
    if (st) sd_sample_cond_free(c);
    return st;
}

/* Free a conditioning; safe twice. */
void sd_sample_cond_free(sd_sample_cond *c)
{
    free(c->ctx);
    free(c->pooled);
    c->ctx = c->pooled = NULL;
}

/* Where one image's time went (-v; the text encoding is the caller's): the
 * UNet calls (each one batch of c->n latents), the sampler's own arithmetic
 * between them, the decoder. bench/bench_sample.sh reads this line. */
static void log_times(const denoise_ctx *c, double sampling, double decode)
{
    sd_log(SD_LOG_DEBUG,
           "times: UNet %d calls of batch %d %.3f s (%.3f s each, fastest %.3f, slowest %.3f), sampler %.3f s, "
           "decode %.3f s",
           c->calls, c->n, c->unet_s, c->calls ? c->unet_s / c->calls : 0.0, c->unet_min, c->unet_max,
           sampling - c->unet_s, decode);
}

/* One image (see txt2img.h). */
sd_status sd_sample_generate(sd_sample_model *m, const sd_unet *unet, const float *params, const sd_sample_job *j,
                             const sd_sample_cond *cond, int w, int h, sd_sample_step_fn progress, void *pctx,
                             uint8_t *rgb, sd_error *err)
{
    int f = 1 << (m->vae.cfg.nblocks - 1), u = 1 << (unet->cfg.nblocks - 1);
    if (w % (f * u) || h % (f * u))
        return sd_err_set(err, SD_EINVAL, "%dx%d: this model needs sizes that are multiples of %d", w, h, f * u);
    if (cond->n != (j->cfg > 1 ? 2 : 1))
        return sd_err_set(err, SD_EINVAL, "the conditioning holds %d prompt(s), CFG %g needs %d", cond->n, j->cfg,
                          j->cfg > 1 ? 2 : 1);
    int lh = h / f, lw = w / f, n = cond->n;
    sd_status st = prepare(m, unet, n, lh, lw, err);
    if (st) return st;
    if (!m->vrun.be) st = sd_vae_decode_runner_init(&m->vrun, &m->vae, m->be, m->exec, err);
    if (st) return st;
    denoise_ctx c = {.m = m, .unet = unet, .params = params, .n = n,
                     .per = (size_t)unet->cfg.in_channels * (size_t)lh * (size_t)lw, .progress = progress,
                     .pctx = pctx, .ctx = cond->ctx, .pooled = cond->pooled};
    for (int b = 0; b < n; b++) {
        float *t = c.tids + b * SD_UNET_TIME_IDS; /* original size, crop top-left, target size */
        t[0] = (float)h, t[1] = (float)w, t[2] = 0, t[3] = 0, t[4] = (float)h, t[5] = (float)w;
    }
    float *lat = malloc(c.per * sizeof(float));
    float *img = malloc((size_t)3 * (size_t)w * (size_t)h * sizeof(float));
    sd_sampler_plan plan = {0};
    sd_sched_config sc;
    sd_sched_defaults(&sc, j->sampler, m->sdxl, m->pred);
    if (!lat || !img) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    double t0 = sd_now();
    if (!st) st = sd_sampler_plan_make(&plan, &sc, j->sampler, j->steps, err);
    if (!st) {
        sd_torch_gen gen;
        sd_torch_gen_seed(&gen, j->seed);
        sd_torch_randn(&gen, lat, c.per); /* [1, 4, h/8, w/8]; sd_sample scales it by init_noise_sigma */
        sd_sampler_model sm = {.model = denoise, .model_ctx = &c, .noise = sd_torch_randn_noise, .noise_ctx = &gen,
                               .progress = on_step, .progress_ctx = &c, .cfg = j->cfg};
        st = sd_sample(&plan, &sm, c.per, lat, err);
    }
    double t1 = sd_now();
    if (!st) st = sd_vae_decode_runner_decode(&m->vrun, &m->vae, 1, lh, lw, lat, img, err);
    if (!st) sd_vae_image_to_rgb8(1, h, w, img, rgb);
    if (!st) log_times(&c, t1 - t0, sd_now() - t1);
    sd_sampler_plan_free(&plan);
    free(lat);
    free(img);
    return st;
}
