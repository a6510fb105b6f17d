/* One pass of the UNet on a micro-batch: the graph and its buffers, the
 * inputs noised and put on the backend, the loss and the backward pass. */
#include "train.h"

#include <stdlib.h>

#include "dist.h"
#include "log.h"
#include "train_int.h"

/* Say how much memory the planned graph takes, so users see what
 * --gradient-checkpointing saves: the first plan at info level, the
 * replans of every bucket change at debug level (-v), so that they do not
 * bury the progress lines. */
static void log_graph(sd_trainer *tr, int n, int h, int w)
{
    double mib = sizeof(float) / 1048576.0;
    sd_log_level lv = tr->graph_logged ? SD_LOG_DEBUG : SD_LOG_INFO;
    tr->graph_logged = 1;
    if (tr->o.checkpointing)
        sd_log(lv, "UNet graph, %d x %dx%d latents: activations %.1f MiB (checkpointed: %.1f MiB of them "
               "shared by the recomputed blocks), their gradients %.1f MiB", n, h, w, (double)tr->g.nact * mib,
               (double)tr->g.nrecompute * mib, (double)tr->g.ndact * mib);
    else
        sd_log(lv, "UNet graph, %d x %dx%d latents: activations %.1f MiB, their gradients %.1f MiB", n, h, w,
               (double)tr->g.nact * mib, (double)tr->g.ndact * mib);
}

/* The host bytes of the per-pass buffers sd_train_prepare allocates for io
 * latent values: noise, target, dout (also the backend's on the CPU), the
 * timesteps and, with --input-perturbation, noise_in; on a GPU also the
 * staging of x_t, timesteps and output. The memory plan counts these. */
size_t sd_train_io_host_bytes(const sd_train_opts *o, size_t io, int cuda)
{
    size_t floats = 3 * io + (o->input_perturbation > 0 ? io : 0) + (cuda ? 3 * io : 0);
    return floats * sizeof(float) + io * sizeof(int);
}

/* Plan the graph for a new input shape and size the buffers. */
sd_status sd_train_prepare(sd_trainer *tr, int n, int h, int w, int tctx, sd_error *err)
{
    if (tr->g.ops && tr->gn == n && tr->gh == h && tr->gw == w && tr->gt == tctx) return SD_OK;
    sd_unet_graph_free(&tr->g);
    sd_status rc = sd_unet_plan(&tr->unet, n, h, w, tctx, tr->o.checkpointing, &tr->g, err);
    if (rc) return rc;
    if (!tr->o.quiet && tr->rank == 0) log_graph(tr, n, h, w);
    tr->gn = n;
    tr->gh = h;
    tr->gw = w;
    tr->gt = tctx;
    if (tr->g.nact > tr->act_cap || tr->g.ndact > tr->dact_cap) {
        tr->act_cap = tr->g.nact > tr->act_cap ? tr->g.nact : tr->act_cap;
        tr->dact_cap = tr->g.ndact > tr->dact_cap ? tr->g.ndact : tr->dact_cap;
        if (tr->be->is_device) {
            if (tr->d_act) tr->be->release(tr->exec, tr->d_act);
            if (tr->d_dact) tr->be->release(tr->exec, tr->d_dact);
            tr->d_act = tr->be->alloc(tr->exec, tr->act_cap * sizeof(float));
            tr->d_dact = tr->be->alloc(tr->exec, tr->dact_cap * sizeof(float));
            if (tr->d_act) tr->be->zero(tr->exec, tr->d_act, tr->act_cap * sizeof(float));
        } else {
            free(tr->act);
            free(tr->dact);
            tr->act = calloc(tr->act_cap, sizeof(float));
            tr->dact = malloc(tr->dact_cap * sizeof(float));
            tr->d_act = tr->act;
            tr->d_dact = tr->dact;
        }
        if (!tr->d_act || !tr->d_dact) {
            size_t mb = (tr->act_cap + tr->dact_cap) * sizeof(float) >> 20;
            tr->act_cap = tr->dact_cap = 0;
            return sd_err_set(err, SD_ENOMEM, "out of %s memory for UNet activations (%zu MiB at batch %d, %dx%d "
                              "latents); %sa smaller --batch with --accum, or smaller buckets need less",
                              tr->be->is_device ? "GPU" : "host", mb, n, h, w,
                              tr->o.checkpointing ? "" : "--gradient-checkpointing, ");
        }
    }
    size_t ws = tr->w16 ? sd_unet_graph_wscratch(&tr->g) : 0;
    if (ws > tr->wscr_cap) { /* bf16 weights: the largest op's weight and bias widened, on the backend */
        if (tr->be->is_device && tr->wscr) tr->be->release(tr->exec, tr->wscr);
        else free(tr->wscr);
        tr->wscr = tr->be->is_device ? tr->be->alloc(tr->exec, ws * sizeof(float)) : malloc(ws * sizeof(float));
        tr->wscr_cap = tr->wscr ? ws : 0;
        if (!tr->wscr) return sd_err_set(err, SD_ENOMEM, "out of memory for the bf16 weights' scratch");
    }
    size_t io = (size_t)n * (size_t)tr->unet.cfg.in_channels * (size_t)h * (size_t)w;
    if (io > tr->io_cap) {
        free(tr->noise);
        free(tr->noise_in);
        free(tr->target);
        free(tr->dout);
        free(tr->t);
        free(tr->stage);
        if (tr->be->is_device && tr->d_dout) tr->be->release(tr->exec, tr->d_dout);
        tr->noise = malloc(io * sizeof(float));
        tr->noise_in = tr->o.input_perturbation > 0 ? malloc(io * sizeof(float)) : NULL;
        tr->target = malloc(io * sizeof(float));
        tr->dout = malloc(io * sizeof(float));
        tr->t = malloc(io * sizeof(int)); /* io >= n */
        tr->stage = tr->be->is_device ? malloc((3 * io) * sizeof(float)) : NULL; /* x_t, timesteps, output */
        tr->d_dout = tr->be->is_device ? tr->be->alloc(tr->exec, io * sizeof(float)) : tr->dout;
        tr->io_cap = tr->noise && tr->target && tr->dout && tr->t && tr->d_dout && (tr->stage || !tr->be->is_device) &&
                             (tr->noise_in || !(tr->o.input_perturbation > 0))
                         ? io
                         : 0;
        if (!tr->io_cap) return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    return SD_OK;
}

/* Host bytes into the backend's buffer; nothing when they are the same
 * buffer (the CPU). */
static void put_bytes(sd_trainer *tr, void *dst, const void *src, size_t bytes)
{
    if (dst != src) tr->be->h2d(tr->exec, dst, src, bytes);
}

/* The same for floats. */
void sd_train_put(sd_trainer *tr, float *dst, const float *src, size_t floats)
{
    put_bytes(tr, dst, src, floats * sizeof(float));
}

/* The moments as the host holds them between steps: whole, or ZeRO's
 * packed share (m_sh, v_sh; own values), as the device holds them too. */
static void host_moments(sd_trainer *tr, void **m, void **v, size_t *values)
{
    int sh = sd_train_sharded(&tr->o);
    *m = sh ? tr->m_sh : tr->m;
    *v = sh ? tr->v_sh : tr->v;
    *values = sh ? sd_dist_owned(tr->unet.w.total, tr->rank, tr->world) : tr->unet.w.total;
}

/* The host's weights (fp32 or bf16), moments (whole or ZeRO's share) or
 * other optimizer state and EMA onto the device when they changed there
 * (a new run, a resume); nothing on the CPU. */
void sd_train_push_state(sd_trainer *tr)
{
    if (!tr->dev_stale) return;
    size_t n = tr->unet.w.total, mn;
    void *m, *v;
    host_moments(tr, &m, &v, &mn);
    if (tr->w16) put_bytes(tr, tr->d_w16, tr->w16, n * sizeof(uint16_t));
    else sd_train_put(tr, tr->d_w, tr->unet.w.data, n);
    if (tr->d_m) {
        put_bytes(tr, tr->d_m, m, mn * tr->moment_size);
        put_bytes(tr, tr->d_v, v, mn * tr->moment_size);
    }
    sd_opt_state_push(&tr->opt, tr->be, tr->exec);
    if (tr->ema && tr->d_ema) sd_train_put(tr, tr->d_ema, tr->ema, n);
    tr->dev_stale = 0;
}

/* The device's weights, moments or other optimizer state and EMA into the
 * host buffers. */
sd_status sd_train_sync_host(sd_trainer *tr, sd_error *err)
{
    if (!tr->be->is_device || !tr->host_stale) return SD_OK;
    size_t bytes = tr->unet.w.total * sizeof(float), mn;
    void *m, *v;
    host_moments(tr, &m, &v, &mn);
    if (tr->w16) tr->be->d2h(tr->exec, tr->w16, tr->d_w16, tr->unet.w.total * sizeof(uint16_t));
    else tr->be->d2h(tr->exec, tr->unet.w.data, tr->d_w, bytes);
    if (tr->d_m) {
        tr->be->d2h(tr->exec, m, tr->d_m, mn * tr->moment_size);
        tr->be->d2h(tr->exec, v, tr->d_v, mn * tr->moment_size);
    }
    sd_opt_state_pull(&tr->opt, tr->be, tr->exec);
    if (tr->ema && tr->d_ema) tr->be->d2h(tr->exec, tr->ema, tr->d_ema, bytes);
    sd_status rc = tr->be->sync(tr->exec, err);
    if (!rc) tr->host_stale = 0;
    return rc;
}

/* Noise the latents (with noise_in when given, diffusers'
 * input_perturbation; else with noise), predict, compare with the target
 * (made from noise), backpropagate. */
sd_status sd_train_pass(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                      const float *text, const float *tids, const float *noise, const float *noise_in, const int *t,
                      const float *mask, double grad_scale, int backward, double *loss, sd_error *err)
{
    const sd_unet_config *c = &tr->unet.cfg;
    if (c->in_channels != c->out_channels)
        return sd_err_set(err, SD_EUNSUPPORTED, "training needs in_channels == out_channels");
    for (int b = 0; b < n; b++)
        if (t[b] < 0 || t[b] >= SD_DDPM_STEPS) return sd_err_set(err, SD_EINVAL, "timestep %d out of range", t[b]);
    sd_status rc = sd_train_prepare(tr, n, h, w, tctx, err);
    if (rc) return rc;
    const sd_unet_graph *g = &tr->g;
    size_t per = (size_t)c->in_channels * (size_t)h * (size_t)w, tot = (size_t)n * per;
    float *act = tr->d_act;
    sd_train_push_state(tr);
    /* the inputs are written in place on the CPU, staged on a GPU */
    float *xt = tr->be->is_device ? tr->stage : act + g->x, *tt = tr->be->is_device ? tr->stage + tot : act + g->t;
    sd_ddpm_add_noise(&tr->sched, n, per, t, x0, noise_in ? noise_in : noise, xt);
    for (int b = 0; b < n; b++) tt[b] = (float)t[b];
    sd_train_put(tr, act + g->x, xt, tot);
    sd_train_put(tr, act + g->t, tt, (size_t)n);
    sd_train_put(tr, act + g->ctx, ctx, (size_t)n * (size_t)tctx * (size_t)c->cross_dim);
    if (c->text_time) {
        sd_train_put(tr, act + g->text, text, (size_t)n * (size_t)(c->add_in_dim - SD_UNET_TIME_IDS * c->add_time_dim));
        sd_train_put(tr, act + g->tids, tids, (size_t)n * SD_UNET_TIME_IDS);
    }
    sd_unet_wts wts = sd_train_wts(tr);
    sd_unet_forward_wts(g, tr->be, tr->exec, &wts, act);
    sd_ddpm_target(&tr->sched, tr->o.pred, n, per, t, x0, noise, tr->target);
    const float *out = act + g->out;
    if (tr->be->is_device) {
        float *host = tr->stage + 2 * tot;
        tr->be->d2h(tr->exec, host, out, tot * sizeof(float));
        rc = tr->be->sync(tr->exec, err);
        if (rc) return rc;
        out = host;
    }
    double total = 0;
    for (int b = 0; b < n; b++) {
        /* min-SNR-gamma (diffusers): min(snr, gamma) / snr (epsilon) or
         * / (snr + 1) (v-prediction), on each sample's mean */
        double wgt = 1.0;
        if (tr->o.snr_gamma > 0 && backward) { /* validation: plain MSE, comparable across settings */
            double snr = sd_ddpm_snr(&tr->sched, t[b]), mn = snr < tr->o.snr_gamma ? snr : tr->o.snr_gamma;
            wgt = mn / (tr->o.pred == SD_PRED_V ? snr + 1.0 : snr);
        }
        /* sd-scripts' apply_masked_loss: the squared error times the
         * latent pixel's mask value, every channel alike */
        double s = 0;
        size_t hw = (size_t)h * (size_t)w;
        for (size_t i = b * per; i < (b + 1) * per; i++) {
            double d = (double)out[i] - (double)tr->target[i];
            double m = mask ? (double)mask[(size_t)b * hw + (i - b * per) % hw] : 1.0;
            s += m * d * d;
            tr->dout[i] = (float)(grad_scale * wgt * 2.0 * m * d / (double)tot);
        }
        total += wgt * s;
    }
    *loss = total / (double)tot;
    if (!backward) return SD_OK;
    sd_train_put(tr, tr->d_dout, tr->dout, tot);
    if (tr->o.fused_backward || tr->o.zero2) return SD_OK; /* the step runs the backward (train_fused.c, train_zero2.c) */
    if (tr->g16) return sd_train_g16_backward(tr, err); /* --grad-dtype bf16: added in op by op */
    sd_unet_backward_wts(&tr->unet, g, tr->be, tr->exec, &wts, act, tr->d_dact, tr->d_dout, tr->d_grad);
    return tr->be->is_device ? tr->be->sync(tr->exec, err) : SD_OK;
}

/* One training micro-batch: forward, loss, backward into the gradient. */
sd_status sd_train_micro(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                         const float *text, const float *tids, const float *noise, const int *t, double grad_scale,
                         double *loss, sd_error *err)
{
    return sd_train_pass(tr, n, h, w, tctx, x0, ctx, text, tids, noise, NULL, t, NULL, grad_scale, 1, loss, err);
}

/* The same with a loss mask (train.h). */
sd_status sd_train_micro_masked(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                                const float *text, const float *tids, const float *noise, const int *t,
                                const float *mask, double grad_scale, double *loss, sd_error *err)
{
    return sd_train_pass(tr, n, h, w, tctx, x0, ctx, text, tids, noise, NULL, t, mask, grad_scale, 1, loss, err);
}

/* The loss alone (validation): the gradient is not touched. */
sd_status sd_train_eval(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                        const float *text, const float *tids, const float *noise, const int *t, double *loss,
                        sd_error *err)
{
    return sd_train_pass(tr, n, h, w, tctx, x0, ctx, text, tids, noise, NULL, t, NULL, 1.0, 0, loss, err);
}

/* A GPU run's gradient into the host buffer (for the reduction, clipping
 * and AdamW); nothing on the CPU. */
sd_status sd_train_grad_to_host(sd_trainer *tr, sd_error *err)
{
    if (!tr->be->is_device) return SD_OK;
    tr->be->d2h(tr->exec, tr->grad, tr->d_grad, tr->unet.w.total * sizeof(float));
    return tr->be->sync(tr->exec, err);
}
