/* The training step and loop. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "dtype.h"
#include "f16.h"
#include "log.h"
#include "progress.h"
#include "safetensors.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif
#ifdef SDTK_HAVE_NCCL
#include "nccl_sum.h"
#endif

/* diffusers train_text_to_image.py defaults. */
void sd_train_opts_default(sd_train_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->batch = 1;
    o->accum = 1;
    o->pred = SD_PRED_EPSILON;
    o->adam = (sd_adamw_opts){.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
    o->lr = (sd_lr_sched){.kind = SD_LR_CONSTANT, .base = 1e-4, .warmup = 500, .total = 0};
    o->max_grad_norm = 1.0;
    o->max_steps = 1000;
    o->save_dtype = SD_ST_F32;
    o->ema_every = 1;
    o->keep = 2;
    o->threads = 1;
    o->device = -1;
    o->moments = SD_DT_F32;
    o->t_min = 0;
    o->t_max = SD_DDPM_STEPS;
}

/* A timestep in the run's range [t_min, t_max): the whole schedule by
 * default, where the draw is the one it always was. */
static int draw_timestep(const sd_train_opts *o, sd_rng *rng)
{
    return o->t_min + (int)sd_rng_below(rng, (uint64_t)(o->t_max - o->t_min));
}

/* What the UNet expects of each record (data.h); training adds the
 * dropout and flip options, validation uses neither. */
static sd_load_opts load_opts(const sd_trainer *tr, int training)
{
    const sd_unet_config *c = &tr->unet.cfg;
    sd_load_opts lo = {.channels = c->in_channels, .cross_dim = c->cross_dim,
                       .pooled = c->text_time ? c->add_in_dim - SD_UNET_TIME_IDS * c->add_time_dim : 0,
                       .dropout = training ? tr->o.dropout : 0, .no_flip = training ? tr->o.no_flip : 1};
    return lo;
}

/* The model's parameters as diffusers counts them: the sum of its tensors'
 * sizes (the flat buffer pads each tensor to 16 floats). */
size_t sd_train_param_count(const sd_trainer *tr)
{
    size_t n = 0;
    for (size_t i = 0; i < tr->unet.w.nslots; i++) n += tr->unet.w.slots[i].n;
    return n;
}

/* The model: loaded, or built from a config and initialised. */
static sd_status open_model(sd_trainer *tr, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    if (o->unet) {
        sd_unet_opts uo = {.config_path = o->unet_config};
        return sd_unet_load(&tr->unet, o->unet, &uo, err);
    }
    if (!o->unet_config) return sd_err_set(err, SD_EINVAL, "no UNet: give a model path or a config.json");
    sd_unet_config c;
    sd_unet_config_default(&c);
    sd_status rc = sd_unet_config_read(o->unet_config, &c, err);
    if (!rc) rc = sd_unet_build(&tr->unet, &c, err);
    if (!rc) {
        sd_unet_init_random(&tr->unet, o->init_seed);
        snprintf(tr->unet.layout, sizeof tr->unet.layout, "new (seed %llu)", (unsigned long long)o->init_seed);
    }
    return rc;
}

/* The backend the UNet runs on: the CPU table on the pool (the weights and
 * gradients are the host buffers), or a CUDA context with device copies of
 * the weights and gradients. */
static sd_status open_backend(sd_trainer *tr, sd_error *err)
{
    tr->be = sd_backend_cpu();
    tr->exec = tr->pool;
    tr->d_w = tr->unet.w.data;
    tr->d_grad = tr->grad;
    tr->d_m = tr->m;
    tr->d_v = tr->v;
    tr->d_ema = tr->ema;
    if (tr->o.device < 0)
        return tr->o.nccl ? sd_err_set(err, SD_EINVAL, "NCCL sums GPU gradients: it needs --device cuda:K") : SD_OK;
#ifdef SDTK_HAVE_CUDA
    sd_cuda_opts co = {.allow_tf32 = tr->o.tf32, .mixed = tr->o.mixed, .attn_flash = tr->o.attn_flash,
                       .mem_limit = tr->o.gpu_mem_limit, .attn_block = tr->o.attn_block};
    sd_cuda *c = NULL;
    sd_status rc = sd_cuda_create(&c, tr->o.device, &co, err);
    if (rc) return rc;
    tr->cuda = c;
    tr->be = sd_backend_cuda();
    tr->exec = c;
    size_t n = tr->unet.w.total, bytes = n * sizeof(float), mbytes = n * tr->moment_size;
    void *got[5] = {0};
    size_t want[5] = {bytes, bytes, mbytes, mbytes, bytes}, total = 0;
    int nb = tr->ema && !tr->o.ema_host ? 5 : 4; /* --ema-on-cpu: the EMA stays in host memory */
    for (int i = 0; i < nb; i++) {
        total += want[i];
        got[i] = tr->be->alloc(c, want[i]);
        if (!got[i]) {
            for (int j = 0; j < i; j++) tr->be->release(c, got[j]);
            tr->d_w = tr->d_grad = tr->d_ema = NULL;
            tr->d_m = tr->d_v = NULL;
            for (int j = i + 1; j < nb; j++) total += want[j];
            return sd_err_set(err, SD_ENOMEM, "cuda:%d: no room for the weights, gradients and AdamW moments "
                              "(%.1f MiB)%s%s", tr->o.device, (double)total / (1 << 20),
                              nb == 5 ? "; --ema-on-cpu keeps the EMA in host memory" : "",
                              tr->moment_size == 4 ? "; --adam-moments bf16 halves the moments" : "");
        }
    }
    tr->d_w = got[0];
    tr->d_grad = got[1];
    tr->d_m = got[2];
    tr->d_v = got[3];
    tr->d_ema = got[4];
    tr->be->zero(c, tr->d_grad, bytes);
    tr->dev_stale = 1;
    rc = tr->be->sync(c, err);
    if (rc || !(tr->world > 1 || tr->o.nccl)) return rc;
#ifdef SDTK_HAVE_NCCL
    sd_nccl *nc = NULL;
    rc = sd_nccl_open(&nc, tr->rank, tr->world, err);
    if (rc) return rc;
    tr->nccl = nc;
    if (!tr->o.quiet && tr->rank == 0)
        sd_log(SD_LOG_INFO, "gradient sums over %s, %d rank%s", sd_nccl_version(nc), tr->world, tr->world == 1 ? "" : "s");
    return SD_OK;
#else
    if (tr->o.nccl) return sd_err_set(err, SD_EUNSUPPORTED, "--nccl: this build has no NCCL (the CUDA toolkit's libnccl)");
    return SD_OK; /* several GPU ranks sum through the host over MPI */
#endif
#else
    return sd_err_set(err, SD_EUNSUPPORTED,
                      "--device cuda:%d: this build has no CUDA backend (configure where nvcc and cuDNN are installed)",
                      tr->o.device);
#endif
}

/* Everything a run needs before its first step. */
sd_status sd_trainer_open(sd_trainer *tr, const sd_train_opts *o, sd_error *err)
{
    memset(tr, 0, sizeof(*tr));
    tr->o = *o;
    tr->saved_step = -1;
    if (o->batch < 1 || o->accum < 1 || o->max_steps < 0)
        return sd_err_set(err, SD_EINVAL, "batch and accumulation must be >= 1");
    if (o->t_min < 0 || o->t_max > SD_DDPM_STEPS || o->t_min >= o->t_max)
        return sd_err_set(err, SD_EINVAL, "timestep range [%d, %d): within [0, %d) and not empty", o->t_min, o->t_max,
                          SD_DDPM_STEPS);
    sd_status rc = open_model(tr, err);
    if (rc) return rc;
    size_t n = tr->unet.w.total;
    tr->rank = sd_dist_rank();
    tr->world = sd_dist_world();
    if (o->zero1 && o->device >= 0) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_EUNSUPPORTED, "--zero1 shards the CPU optimizer; GPU ranks keep whole moments");
    }
    if (o->zero_terminal_snr && o->snr_gamma > 0 && o->pred == SD_PRED_EPSILON) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_EINVAL, "zero terminal SNR with min-SNR weights and epsilon prediction: the "
                          "weights divide by the SNR, which is 0 at the last timestep (use v-prediction)");
    }
    if (o->moments != SD_DT_F32 && o->moments != SD_DT_BF16) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_EINVAL, "AdamW moments are stored as fp32 or bf16");
    }
    tr->moment_size = o->moments == SD_DT_BF16 ? 2 : 4;
    if (o->zero1) {
        size_t own = sd_dist_owned(n, tr->rank, tr->world);
        tr->m_sh = calloc(own ? own : 1, tr->moment_size);
        tr->v_sh = calloc(own ? own : 1, tr->moment_size);
        if (!tr->m_sh || !tr->v_sh) {
            sd_trainer_close(tr);
            return sd_err_set(err, SD_ENOMEM, "out of memory for the optimizer shard");
        }
    } else {
        tr->m = calloc(n, tr->moment_size);
        tr->v = calloc(n, tr->moment_size);
    }
    tr->grad = calloc(n, sizeof(float));
    if (o->ema_decay > 0) {
        tr->ema = malloc(n * sizeof(float));
        if (tr->ema) memcpy(tr->ema, tr->unet.w.data, n * sizeof(float));
    }
    if ((!o->zero1 && (!tr->m || !tr->v)) || !tr->grad || (o->ema_decay > 0 && !tr->ema)) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_ENOMEM, "out of memory for optimizer state (%zu MB)",
                          n * (2 * tr->moment_size + (o->ema_decay > 0 ? 8 : 4)) >> 20);
    }
    sd_ddpm_init(&tr->sched, 0.00085, 0.012);
    if (o->zero_terminal_snr) sd_ddpm_zero_terminal_snr(&tr->sched);
    sd_rng_seed(&tr->rng, o->seed);
    sd_tally_init(&tr->tally, 5);
    tr->pool = o->threads > 1 ? sd_pool_create(o->threads) : NULL;
    tr->loss_ema = NAN;
    if (o->nshards > 0) {
        rc = sd_data_open(&tr->data, o->shards, o->nshards, o->batch, o->seed, o->allow_mixed, err);
        if (!rc && !o->no_carry) {
            rc = sd_data_set_carry(&tr->data, err);
            if (rc) sd_data_close(&tr->data);
        }
        if (rc) {
            sd_trainer_close(tr);
            return rc;
        }
        tr->have_data = 1;
    }
    tr->val_loss = NAN;
    if (o->val_shard) {
        /* a fixed order, whatever the training seed */
        rc = sd_data_open(&tr->val, &o->val_shard, 1, o->batch, 0x76616c69646174ULL, o->allow_mixed, err);
        if (!rc && tr->have_data && !o->allow_mixed &&
            (strcmp(tr->val.model, tr->data.model) != 0 || strcmp(tr->val.text_encoder, tr->data.text_encoder) != 0)) {
            /* a held-out loss on other latents or other embeddings measures nothing about this training */
            rc = sd_err_set(err, SD_EFORMAT,
                            "--val %s: made with another VAE or text encoder setup than the training shards "
                            "(model_hash '%s', text_encoder '%s' vs '%s', '%s'); --allow-mixed takes it anyway",
                            o->val_shard, tr->val.model, tr->val.text_encoder, tr->data.model, tr->data.text_encoder);
            sd_data_close(&tr->val);
        }
        if (rc) {
            sd_trainer_close(tr);
            return rc;
        }
        tr->have_val = 1;
    }
    /* every shard against the UNet now, not after 1000 batches of skipped records */
    sd_load_opts lo = load_opts(tr, 0);
    if (tr->have_data) rc = sd_data_check_model(&tr->data, &lo, err);
    if (!rc && tr->have_val) rc = sd_data_check_model(&tr->val, &lo, err);
    if (rc) {
        sd_trainer_close(tr);
        return rc;
    }
    /* last: with several GPU ranks this joins the NCCL communicator, which
     * an error after it would have to destroy while the others wait in it */
    rc = open_backend(tr, err);
    if (rc) sd_trainer_close(tr);
    return rc;
}

/* Free everything. */
void sd_trainer_close(sd_trainer *tr)
{
#ifdef SDTK_HAVE_NCCL
    sd_nccl_close(tr->nccl);
#endif
    if (tr->cuda) {
        void *dev[] = {tr->d_w, tr->d_grad, tr->d_m, tr->d_v, tr->d_ema, tr->d_act, tr->d_dact, tr->d_dout};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i]) tr->be->release(tr->exec, dev[i]);
#ifdef SDTK_HAVE_CUDA
        sd_cuda_destroy(tr->cuda);
#endif
    }
    free(tr->stage);
    free(tr->m_sh);
    free(tr->v_sh);
    sd_unet_free(&tr->unet);
    free(tr->m);
    free(tr->v);
    free(tr->grad);
    free(tr->ema);
    if (tr->have_data) sd_data_close(&tr->data);
    if (tr->have_val) sd_data_close(&tr->val);
    sd_batch_free(&tr->vbatch);
    sd_batch_free(&tr->batch);
    sd_unet_graph_free(&tr->g);
    free(tr->act);
    free(tr->dact);
    free(tr->noise);
    free(tr->noise_in);
    free(tr->target);
    free(tr->dout);
    free(tr->t);
    if (tr->pool) sd_pool_destroy(tr->pool);
    if (tr->metrics) fclose(tr->metrics);
    sd_tb_close(&tr->tb);
    memset(tr, 0, sizeof(*tr));
}

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

/* Plan the graph for a new input shape and size the buffers. */
static sd_status prepare(sd_trainer *tr, int n, int h, int w, int tctx, sd_error *err)
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
        if (tr->cuda) {
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
                              tr->cuda ? "GPU" : "host", mb, n, h, w,
                              tr->o.checkpointing ? "" : "--gradient-checkpointing, ");
        }
    }
    size_t io = (size_t)n * (size_t)tr->unet.cfg.in_channels * (size_t)h * (size_t)w;
    if (io > tr->io_cap) {
        free(tr->noise);
        free(tr->noise_in);
        free(tr->target);
        free(tr->dout);
        free(tr->t);
        free(tr->stage);
        if (tr->cuda && tr->d_dout) tr->be->release(tr->exec, tr->d_dout);
        tr->noise = malloc(io * sizeof(float));
        tr->noise_in = tr->o.input_perturbation > 0 ? malloc(io * sizeof(float)) : NULL;
        tr->target = malloc(io * sizeof(float));
        tr->dout = malloc(io * sizeof(float));
        tr->t = malloc(io * sizeof(int)); /* io >= n */
        tr->stage = tr->cuda ? malloc((3 * io) * sizeof(float)) : NULL; /* x_t, timesteps, output */
        tr->d_dout = tr->cuda ? tr->be->alloc(tr->exec, io * sizeof(float)) : tr->dout;
        tr->io_cap = tr->noise && tr->target && tr->dout && tr->t && tr->d_dout && (tr->stage || !tr->cuda) &&
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
static void put(sd_trainer *tr, float *dst, const float *src, size_t floats)
{
    put_bytes(tr, dst, src, floats * sizeof(float));
}

/* The host's weights, moments and EMA onto the device when they changed
 * there (a new run, a resume); nothing on the CPU. */
static void push_state(sd_trainer *tr)
{
    if (!tr->dev_stale) return;
    size_t n = tr->unet.w.total;
    put(tr, tr->d_w, tr->unet.w.data, n);
    put_bytes(tr, tr->d_m, tr->m, n * tr->moment_size);
    put_bytes(tr, tr->d_v, tr->v, n * tr->moment_size);
    if (tr->ema && tr->d_ema) put(tr, tr->d_ema, tr->ema, n);
    tr->dev_stale = 0;
}

/* The device's weights, moments and EMA into the host buffers. */
sd_status sd_train_sync_host(sd_trainer *tr, sd_error *err)
{
    if (!tr->cuda || !tr->host_stale) return SD_OK;
    size_t bytes = tr->unet.w.total * sizeof(float);
    tr->be->d2h(tr->exec, tr->unet.w.data, tr->d_w, bytes);
    tr->be->d2h(tr->exec, tr->m, tr->d_m, tr->unet.w.total * tr->moment_size);
    tr->be->d2h(tr->exec, tr->v, tr->d_v, tr->unet.w.total * tr->moment_size);
    if (tr->ema && tr->d_ema) tr->be->d2h(tr->exec, tr->ema, tr->d_ema, bytes);
    sd_status rc = tr->be->sync(tr->exec, err);
    if (!rc) tr->host_stale = 0;
    return rc;
}

/* Noise the latents (with noise_in when given, diffusers'
 * input_perturbation; else with noise), predict, compare with the target
 * (made from noise), backpropagate. */
static sd_status pass(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                      const float *text, const float *tids, const float *noise, const float *noise_in, const int *t,
                      double grad_scale, int backward, double *loss, sd_error *err)
{
    const sd_unet_config *c = &tr->unet.cfg;
    if (c->in_channels != c->out_channels)
        return sd_err_set(err, SD_EUNSUPPORTED, "training needs in_channels == out_channels");
    for (int b = 0; b < n; b++)
        if (t[b] < 0 || t[b] >= SD_DDPM_STEPS) return sd_err_set(err, SD_EINVAL, "timestep %d out of range", t[b]);
    sd_status rc = prepare(tr, n, h, w, tctx, err);
    if (rc) return rc;
    const sd_unet_graph *g = &tr->g;
    size_t per = (size_t)c->in_channels * (size_t)h * (size_t)w, tot = (size_t)n * per;
    float *act = tr->d_act;
    push_state(tr);
    /* the inputs are written in place on the CPU, staged on a GPU */
    float *xt = tr->cuda ? tr->stage : act + g->x, *tt = tr->cuda ? tr->stage + tot : act + g->t;
    sd_ddpm_add_noise(&tr->sched, n, per, t, x0, noise_in ? noise_in : noise, xt);
    for (int b = 0; b < n; b++) tt[b] = (float)t[b];
    put(tr, act + g->x, xt, tot);
    put(tr, act + g->t, tt, (size_t)n);
    put(tr, act + g->ctx, ctx, (size_t)n * (size_t)tctx * (size_t)c->cross_dim);
    if (c->text_time) {
        put(tr, act + g->text, text, (size_t)n * (size_t)(c->add_in_dim - SD_UNET_TIME_IDS * c->add_time_dim));
        put(tr, act + g->tids, tids, (size_t)n * SD_UNET_TIME_IDS);
    }
    sd_unet_forward(&tr->unet, g, tr->be, tr->exec, tr->d_w, act);
    sd_ddpm_target(&tr->sched, tr->o.pred, n, per, t, x0, noise, tr->target);
    const float *out = act + g->out;
    if (tr->cuda) {
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
        double s = 0;
        for (size_t i = b * per; i < (b + 1) * per; i++) {
            double d = (double)out[i] - (double)tr->target[i];
            s += d * d;
            tr->dout[i] = (float)(grad_scale * wgt * 2.0 * d / (double)tot);
        }
        total += wgt * s;
    }
    *loss = total / (double)tot;
    if (!backward) return SD_OK;
    put(tr, tr->d_dout, tr->dout, tot);
    sd_unet_backward(&tr->unet, g, tr->be, tr->exec, tr->d_w, act, tr->d_dact, tr->d_dout, tr->d_grad);
    return tr->cuda ? tr->be->sync(tr->exec, err) : SD_OK;
}

/* One training micro-batch: forward, loss, backward into the gradient. */
sd_status sd_train_micro(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                         const float *text, const float *tids, const float *noise, const int *t, double grad_scale,
                         double *loss, sd_error *err)
{
    return pass(tr, n, h, w, tctx, x0, ctx, text, tids, noise, NULL, t, grad_scale, 1, loss, err);
}

/* The loss alone (validation): the gradient is not touched. */
sd_status sd_train_eval(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                        const float *text, const float *tids, const float *noise, const int *t, double *loss,
                        sd_error *err)
{
    return pass(tr, n, h, w, tctx, x0, ctx, text, tids, noise, NULL, t, 1.0, 0, loss, err);
}

/* A GPU run's gradient into the host buffer (for the reduction, clipping
 * and AdamW); nothing on the CPU. */
sd_status sd_train_grad_to_host(sd_trainer *tr, sd_error *err)
{
    if (!tr->cuda) return SD_OK;
    tr->be->d2h(tr->exec, tr->grad, tr->d_grad, tr->unet.w.total * sizeof(float));
    return tr->be->sync(tr->exec, err);
}

/* Zero the gradients on the backend. */
static void zero_grad(sd_trainer *tr)
{
    tr->be->zero(tr->exec, tr->d_grad, tr->unet.w.total * sizeof(float));
}

/* The first stop request (SIGINT/SIGTERM) acknowledged as soon as the
 * loop sees it, since a handler may not log and the step in progress (with
 * a large --accum, many micro-batches) and the save still take a while.
 * Shown even with -q; rank 0 speaks for a world of ranks (its own request,
 * or another rank's once the step's reduction agreed on it). */
static void tell_stop(sd_trainer *tr)
{
    if (tr->stop_told || !((tr->stop_req && *tr->stop_req) || tr->stop_all)) return;
    tr->stop_told = 1;
    if (tr->rank == 0)
        sd_log(SD_LOG_WARN, "stopping after this step and saving a checkpoint; Ctrl-C again to quit at once "
               "(checkpoints already written stay)");
}

/* splitmix64's finaliser: a well-mixed 64-bit hash of x. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The stochastic-rounding key of the AdamW step that makes `step` (bf16
 * moments): from the seed and the step alone, so a resumed run rounds as
 * the uninterrupted one did. */
static uint32_t sr_key(const sd_trainer *tr, long step)
{
    return (uint32_t)(mix64(mix64(tr->o.seed ^ 0x61646d2d62663136ULL) ^ (uint64_t)step) >> 32);
}

/* AdamW on n elements starting at global index lo, with the moments of
 * those elements at m and v in this run's storage. */
static void adamw_on(sd_trainer *tr, const sd_backend *be, void *exec, sd_adamw_args *a, size_t lo, size_t n,
                     float *p, void *m, void *v, const float *g)
{
    if (tr->moment_size == 2) {
        a->sr_key = sr_key(tr, tr->step + 1);
        be->adamw_bf16(exec, a, n, lo, p, m, v, g);
    } else {
        be->adamw(exec, a, n, p, m, v, g);
    }
}

/* The sum of squares of n values on the backend that holds them; a result
 * that is not finite is first checked against the device: a failed CUDA
 * context also answers NaN, and its own error is the one to report, not a
 * non-finite gradient or weight. */
static sd_status device_sum_squares(sd_trainer *tr, const float *x, double *ss, sd_error *err)
{
    push_state(tr);
    *ss = tr->be->sum_squares(tr->exec, tr->unet.w.total, x);
    return isfinite(*ss) ? SD_OK : tr->be->sync(tr->exec, err);
}

/* The gradient's norm from the chunked sum of squares (apart from the step,
 * so a non-finite one can stop the run before it reaches the weights). */
static sd_status grad_norm_local(sd_trainer *tr, double *norm, sd_error *err)
{
    double ss;
    sd_status rc = device_sum_squares(tr, tr->d_grad, &ss, err);
    *norm = sqrt(ss);
    return rc;
}

/* AdamW at the scheduled rate with the clipping factor for norm folded into
 * its reading of the gradient (bit for bit what clipping in place then
 * stepping gives), then zero the gradients, count the step, the EMA. */
static void apply_norm(sd_trainer *tr, double norm)
{
    size_t n = tr->unet.w.total;
    const sd_backend *be = tr->be;
    double lr = sd_lr_at(&tr->o.lr, tr->step);
    sd_adamw_args a = sd_adamw_args_at(&tr->o.adam, lr, tr->step + 1, sd_clip_factor(norm, tr->o.max_grad_norm));
    adamw_on(tr, be, tr->exec, &a, 0, n, tr->d_w, tr->d_m, tr->d_v, tr->d_grad);
    zero_grad(tr);
    tr->step++;
    if (tr->ema && tr->step % (tr->o.ema_every > 0 ? tr->o.ema_every : 1) == 0) {
        tr->ema_updates++;
        float rate = (float)(1.0 - sd_ema_decay(tr->o.ema_decay, tr->ema_updates));
        if (tr->d_ema) {
            be->ema(tr->exec, n, tr->d_ema, tr->d_w, rate);
        } else { /* a GPU run with the EMA on the host: the weights come over first */
            be->d2h(tr->exec, tr->unet.w.data, tr->d_w, n * sizeof(float));
            sd_ema_fwd(tr->pool, n, tr->ema, tr->unet.w.data, rate);
        }
    }
    tr->host_stale = tr->cuda != NULL;
}

/* Whether every weight is finite (*finite): their sum of squares in double
 * is, exactly when they all are (no finite float's square overflows it). */
static sd_status weights_finite(sd_trainer *tr, int *finite, sd_error *err)
{
    double ss;
    sd_status rc = device_sum_squares(tr, tr->d_w, &ss, err);
    *finite = isfinite(ss);
    return rc;
}

/* The norm, then the step with it (tests and the self-test call this
 * after sd_train_micro). */
double sd_train_apply(sd_trainer *tr)
{
    double norm;
    sd_error e = {0};
    if (grad_norm_local(tr, &norm, &e)) norm = NAN; /* a device failure: the next step reports it */
    apply_norm(tr, norm);
    return norm;
}

/* Every rank's segments into whole m and v on rank 0, which writes the
 * checkpoint; the other ranks only send (their memory stays n + 2n/ranks). */
sd_status sd_train_moments_full(sd_trainer *tr, sd_error *err)
{
    if (!tr->o.zero1) return SD_OK;
    size_t n = tr->unet.w.total;
    int ok = 1, all = 1;
    if (tr->rank == 0) {
        if (!tr->m) tr->m = malloc(n * tr->moment_size);
        if (!tr->v) tr->v = malloc(n * tr->moment_size);
        ok = tr->m && tr->v;
    }
    sd_status rc = sd_dist_all_ok(ok, &all, err); /* every rank learns it, none waits in the gather */
    if (rc) return rc;
    if (!all) return sd_err_set(err, SD_ENOMEM, "rank 0 is out of memory for the whole AdamW moments");
    rc = sd_dist_gather(tr->m, tr->m_sh, n, tr->moment_size, err);
    return rc ? rc : sd_dist_gather(tr->v, tr->v_sh, n, tr->moment_size, err);
}

/* n moment values of dtype src_dt (SD_DT_F32 or SD_DT_BF16) into dst in
 * dst_dt: copied when the two agree, else widened exactly or rounded to
 * nearest (a run resumed with the other --adam-moments). */
void sd_train_moments_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n)
{
    const char *s = src; /* a mapped state file's tensors need not be aligned */
    char *d = dst;
    if (dst_dt == src_dt) {
        memcpy(dst, src, n * sd_dtype_size(dst_dt));
    } else if (dst_dt == SD_DT_BF16) {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, s + 4 * i, 4);
            uint16_t h = sd_f32_to_bf16(f);
            memcpy(d + 2 * i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            float f = sd_bf16_to_f32(h);
            memcpy(d + 4 * i, &f, 4);
        }
    }
}

/* This rank's segments of whole moments (a state file's, of dtype src_dt)
 * into the packed shards. */
void sd_train_moments_from(sd_trainer *tr, const void *m, const void *v, int src_dt)
{
    size_t n = tr->unet.w.total, off = 0, lo, hi, ms = tr->moment_size, ss = sd_dtype_size(src_dt);
    for (size_t b = 0; b < sd_dist_blocks(n); b++) {
        sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
        sd_train_moments_convert((char *)tr->m_sh + off * ms, tr->o.moments, (const char *)m + lo * ss, src_dt,
                                 hi - lo);
        sd_train_moments_convert((char *)tr->v_sh + off * ms, tr->o.moments, (const char *)v + lo * ss, src_dt,
                                 hi - lo);
        off += hi - lo;
    }
}

/* The whole moments dropped again after a checkpoint (the shards hold
 * the state). */
void sd_train_moments_shard(sd_trainer *tr)
{
    if (!tr->o.zero1) return;
    free(tr->m);
    free(tr->v);
    tr->m = tr->v = NULL;
}

/* ZeRO-1's gradient norm, after the reduce-scatter left each rank the
 * summed gradient of its own segments: every rank's sum of squares added
 * in rank order. It is grouped by segment, so it may differ from the
 * whole-buffer chunks of grad_norm_local in the last bits. */
static sd_status grad_norm_zero1(sd_trainer *tr, double *norm, sd_error *err)
{
    size_t n = tr->unet.w.total, lo, hi;
    double ss = 0;
    for (size_t b = 0; b < sd_dist_blocks(n); b++) {
        sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
        ss += sd_sum_squares(tr->pool, hi - lo, tr->grad + lo);
    }
    sd_status rc = sd_dist_sum_f64(&ss, 1, err);
    *norm = sqrt(ss);
    return rc;
}

/* ZeRO-1's optimizer step: AdamW on the own segments with the packed
 * moments, then the updated weights all-gathered. The same arithmetic per
 * element as apply_norm. */
static sd_status apply_zero1(sd_trainer *tr, double norm, sd_error *err)
{
    size_t n = tr->unet.w.total, off = 0, lo, hi;
    double lr = sd_lr_at(&tr->o.lr, tr->step);
    sd_adamw_args a = sd_adamw_args_at(&tr->o.adam, lr, tr->step + 1, sd_clip_factor(norm, tr->o.max_grad_norm));
    for (size_t b = 0; b < sd_dist_blocks(n); b++) {
        sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
        adamw_on(tr, sd_backend_cpu(), tr->pool, &a, lo, hi - lo, tr->unet.w.data + lo,
                 (char *)tr->m_sh + off * tr->moment_size, (char *)tr->v_sh + off * tr->moment_size, tr->grad + lo);
        off += hi - lo;
    }
    sd_status rc = sd_dist_allgather_f32(tr->unet.w.data, n, err);
    if (rc) return rc;
    zero_grad(tr);
    tr->step++;
    if (tr->ema && tr->step % (tr->o.ema_every > 0 ? tr->o.ema_every : 1) == 0) {
        tr->ema_updates++;
        sd_ema_fwd(tr->pool, n, tr->ema, tr->unet.w.data, (float)(1.0 - sd_ema_decay(tr->o.ema_decay, tr->ema_updates)));
    }
    return SD_OK;
}

/* The stream of one batch: seeded by (seed, epoch, batch in the epoch), so
 * a batch draws the same flips, dropout, latent noise, timesteps and noise
 * whichever rank computes it and however the global batch is split. */
static void seed_batch(sd_trainer *tr, const sd_data_cursor *served)
{
    uint64_t k = mix64(tr->o.seed ^ 0x7364746b2d747261ULL);
    k = mix64(k ^ (uint64_t)served->epoch);
    sd_rng_seed(&tr->rng, mix64(k ^ ((uint64_t)served->batch - 1)));
}

/* The first world * accum usable batches of the global order from the
 * cursor, as one process with accumulation world * accum would take them.
 * In rounds: the next `need` batches, this rank computing those at
 * positions rank, rank + world, ... (batches of one bucket cost the same,
 * so the shares balance), each gradient scaled by 1 / (world * accum);
 * batches whose records were all skipped give nothing, and the ranks agree
 * on how many were usable (with the losses, image counts and stop
 * requests, summed in rank order) and take as many more in the next round.
 * Then the gradients are summed over the ranks and every rank applies the
 * same update to the same weights. */
sd_status sd_train_step(sd_trainer *tr, double *loss, double *gnorm, sd_error *err)
{
    const sd_unet_config *c = &tr->unet.cfg;
    sd_load_opts lo = load_opts(tr, 1);
    int pooled = lo.pooled;
    int world = tr->world > 0 ? tr->world : 1, rank = tr->rank;
    int slots = world * tr->o.accum, need = slots, empty_rounds = 0;
    double sum = 0, images = 0, stop = 0;
    if (!tr->have_data) return sd_err_set(err, SD_EINVAL, "no training data");
    /* a step whose loss is not finite is undone: the cursor, RNG and
     * count go back, so a checkpoint then holds the state before it */
    sd_data_cursor cur0 = tr->cur;
    sd_rng rng0 = tr->rng;
    long images0 = tr->images;
    while (need > 0) {
        double red[4] = {0, 0, 0, tr->stop_req && *tr->stop_req ? 1.0 : 0.0}; /* usable, loss, images, stop */
        for (int slot = 0; slot < need; slot++) {
            sd_data_batch db;
            tell_stop(tr);
            sd_status rc = sd_data_next(&tr->data, &tr->cur, &db, err);
            if (rc) return rc;
            if (slot % world != rank) continue;
            seed_batch(tr, &tr->cur);
            rc = sd_data_load(&tr->data, &db, &lo, &tr->rng, &tr->batch, &tr->tally, err);
            if (rc) return rc;
            sd_batch *b = &tr->batch;
            if (b->n == 0) continue;
            rc = prepare(tr, b->n, b->h, b->w, b->tctx, err);
            if (rc) return rc;
            size_t per = (size_t)b->c * (size_t)b->h * (size_t)b->w;
            for (int i = 0; i < b->n; i++) tr->t[i] = draw_timestep(&tr->o, &tr->rng);
            sd_rng_normal(&tr->rng, tr->noise, (size_t)b->n * per);
            if (tr->o.noise_offset > 0) {
                /* diffusers: noise += offset * randn(n, c, 1, 1) */
                float off[64];
                for (int i = 0; i < b->n; i++) {
                    sd_rng_normal(&tr->rng, off, (size_t)b->c);
                    for (int ch = 0; ch < b->c && ch < 64; ch++)
                        for (size_t k = 0; k < (size_t)b->h * (size_t)b->w; k++)
                            tr->noise[(size_t)i * per + (size_t)ch * (size_t)b->h * (size_t)b->w + k] +=
                                (float)tr->o.noise_offset * off[ch];
                }
            }
            if (tr->o.input_perturbation > 0) { /* diffusers: new_noise = noise + p * randn_like(noise) */
                size_t all = (size_t)b->n * per;
                sd_rng_normal(&tr->rng, tr->noise_in, all);
                for (size_t k = 0; k < all; k++)
                    tr->noise_in[k] = tr->noise[k] + (float)tr->o.input_perturbation * tr->noise_in[k];
            }
            double l;
            rc = pass(tr, b->n, b->h, b->w, b->tctx, b->x0, b->ctx, pooled ? b->text : NULL,
                      c->text_time ? b->tids : NULL, tr->noise, tr->o.input_perturbation > 0 ? tr->noise_in : NULL,
                      tr->t, 1.0 / slots, 1, &l, err);
            if (rc) return rc;
            red[0] += 1;
            red[1] += l;
            red[2] += b->n;
        }
        if (world > 1) {
            sd_status rc = sd_dist_sum_f64(red, 4, err);
            if (rc) return rc;
        }
        need -= (int)red[0];
        sum += red[1];
        images += red[2];
        stop += red[3];
        if (red[0] > 0) empty_rounds = 0;
        else if (++empty_rounds > 1000)
            return sd_err_set(err, SD_EFORMAT, "1000 batches in a row without a usable record: every record drawn was "
                              "skipped (the counts by reason are above)");
    }
    if (tr->nccl) {
#if defined(SDTK_HAVE_NCCL) && defined(SDTK_HAVE_CUDA)
        /* on the GPU, queued behind the backward pass */
        sd_status rc = sd_nccl_sum_f32(tr->nccl, tr->d_grad, tr->unet.w.total, sd_cuda_stream(tr->cuda), err);
        if (rc) return rc;
#endif
    } else if (tr->o.zero1) {
        /* each rank gets the sum of its own segments only */
        sd_status rc = sd_dist_reduce_scatter_f32(tr->grad, tr->unet.w.total, err);
        if (rc) return rc;
    } else if (world > 1) {
        /* MPI sums host memory: a GPU's gradient goes through the host */
        sd_status rc = sd_train_grad_to_host(tr, err);
        if (!rc) rc = sd_dist_sum_f32(tr->grad, tr->unet.w.total, err);
        if (rc) return rc;
        put(tr, tr->d_grad, tr->grad, tr->unet.w.total);
    }
    if (world > 1) tr->stop_all = stop > 0;
    tr->images += (long)images;
    *loss = sum / slots;
    if (tr->o.zero1) {
        sd_status rc = grad_norm_zero1(tr, gnorm, err);
        if (rc) return rc;
    } else {
        sd_status rc = grad_norm_local(tr, gnorm, err);
        if (rc) return rc;
    }
    if (!isfinite(*loss) || !isfinite(*gnorm)) {
        /* the last good state stays: drop this step's gradient, take back its data */
        zero_grad(tr);
        tr->cur = cur0;
        tr->rng = rng0;
        tr->images = images0;
        return SD_OK;
    }
    if (tr->o.zero1) return apply_zero1(tr, *gnorm, err);
    apply_norm(tr, *gnorm);
    return SD_OK;
}

/* A reason and its count as the ranks exchange them: text, since each
 * rank's reason strings live at its own addresses. */
enum { REASON_CAP = 120 };
typedef struct {
    uint64_t n;
    char reason[REASON_CAP];
} tally_wire;

/* A tally's summary over every rank: each rank's counts gathered by
 * reason and summed (in rank order), logged by rank 0; alone, this
 * rank's. Collective: every rank calls it at the same point. Nothing is
 * logged when no rank skipped a record. */
static sd_status log_tally_all(const sd_trainer *tr, const sd_tally *t, const char *what, sd_error *err)
{
    size_t world = tr->world > 1 ? (size_t)tr->world : 1, one = SD_TALLY_MAX * sizeof(tally_wire);
    if (world == 1) {
        if (t->total) sd_tally_log(t, what);
        return SD_OK;
    }
    tally_wire *all = calloc(world + 1, one); /* every rank's, then this rank's own to send */
    if (!all) return sd_err_set(err, SD_ENOMEM, "out of memory");
    tally_wire *mine = all + world * SD_TALLY_MAX;
    for (int i = 0; i < t->n && i < SD_TALLY_MAX; i++) {
        mine[i].n = t->e[i].n;
        snprintf(mine[i].reason, REASON_CAP, "%s", t->e[i].reason);
    }
    sd_status rc = sd_dist_allgather_bytes(mine, one, all, err);
    if (!rc && tr->rank == 0) {
        sd_tally sum; /* its reasons point into all, which outlives it */
        sd_tally_init(&sum, 0);
        for (size_t i = 0; i < world * SD_TALLY_MAX; i++)
            if (all[i].n) sd_tally_add(&sum, all[i].reason, all[i].n);
        if (sum.total) sd_tally_log(&sum, what);
    }
    free(all);
    return rc;
}

/* Every validation batch in order; this rank takes those at positions
 * rank, rank + world, ...; losses and image counts summed over ranks. */
sd_status sd_train_validate(sd_trainer *tr, double *loss, long *images, sd_error *err)
{
    const sd_unet_config *c = &tr->unet.cfg;
    sd_load_opts lo = load_opts(tr, 0);
    int pooled = lo.pooled;
    int world = tr->world > 0 ? tr->world : 1;
    double red[2] = {0, 0};
    sd_tally vt;
    sd_tally_init(&vt, 5);
    sd_data_cursor cur = {0, 0};
    sd_status rc = SD_OK;
    sd_rng rng; /* its own stream: the training's state (saved in checkpoints) stays untouched */
    if (!tr->have_val) return sd_err_set(err, SD_EINVAL, "no validation shard");
    for (size_t k = 0; !rc; k++) {
        sd_data_batch db;
        rc = sd_data_next(&tr->val, &cur, &db, err);
        if (rc || cur.epoch != 0) break; /* past the last batch: sd_data_next rolled into epoch 1 */
        if ((int)(k % (size_t)world) != tr->rank) continue;
        tell_stop(tr);
        sd_rng_seed(&rng, mix64(0x76616c2d6c6f7373ULL ^ (uint64_t)k));
        rc = sd_data_load(&tr->val, &db, &lo, &rng, &tr->vbatch, &vt, err);
        sd_batch *b = &tr->vbatch;
        if (rc || b->n == 0) continue;
        rc = prepare(tr, b->n, b->h, b->w, b->tctx, err);
        if (rc) break;
        size_t per = (size_t)b->c * (size_t)b->h * (size_t)b->w;
        for (int i = 0; i < b->n; i++) tr->t[i] = draw_timestep(&tr->o, &rng);
        sd_rng_normal(&rng, tr->noise, (size_t)b->n * per);
        double l;
        rc = sd_train_eval(tr, b->n, b->h, b->w, b->tctx, b->x0, b->ctx, pooled ? b->text : NULL,
                           c->text_time ? b->tids : NULL, tr->noise, tr->t, &l, err);
        red[0] += l * b->n;
        red[1] += b->n;
    }
    if (!rc && world > 1) rc = sd_dist_sum_f64(red, 2, err);
    if (!rc) rc = log_tally_all(tr, &vt, "validation records", err);
    else if (vt.total) sd_tally_log(&vt, "validation records");
    if (rc) return rc;
    if (red[1] == 0) return sd_err_set(err, SD_EFORMAT, "the validation shard has no usable record");
    *loss = red[0] / red[1];
    *images = (long)red[1];
    tr->val_loss = *loss;
    return SD_OK;
}

/* Steps for a count of batches, ceil(batches / per_step), held below
 * 10^18 so that no count of epochs, records and repeats overflows a long
 * (a run of that many steps never ends anyway). */
static long steps_for(double batches, double per_step)
{
    double q = ceil(batches / per_step);
    return q < 1e18 ? (long)q : (long)1e18;
}

/* --epochs as steps (train.h). A resume of the same epochs and world
 * keeps the checkpoint's plan, which a world change before it may have
 * moved, so every later resume ends where that one would; after a world
 * change the steps left come from the batches the cursor has not reached;
 * a new run (or a checkpoint from before plans were saved) counts from 0. */
void sd_train_set_epochs(sd_trainer *tr, long epochs)
{
    int world = tr->world > 0 ? tr->world : 1;
    double per = sd_data_epoch_batches(&tr->data), total = (double)epochs * per;
    double step_batches = (double)world * (double)tr->o.accum;
    long steps = steps_for(total, step_batches);
    tr->epochs = epochs;
    int same_world = tr->saved_world <= 0 || tr->saved_world == world;
    if (same_world && tr->saved_epochs == epochs && tr->saved_epochs_steps > 0) {
        steps = tr->saved_epochs_steps;
        sd_log(SD_LOG_INFO, "%ld epoch%s: the checkpoint's plan of %ld steps", epochs, epochs == 1 ? "" : "s", steps);
    } else if (same_world && tr->saved_epochs_steps > 0) { /* --epochs changed: count on from the cursor */
        double left = total - sd_data_batches_served(&tr->data, &tr->cur);
        steps = tr->step + (left > 0 ? steps_for(left, step_batches) : 0);
        sd_log(SD_LOG_INFO, "%ld epochs resumed at step %ld: %.6g batches left, the run ends at step %ld", epochs,
               tr->step, left > 0 ? left : 0.0, steps);
    } else if (!same_world) {
        double left = total - sd_data_batches_served(&tr->data, &tr->cur);
        long was = tr->saved_epochs == epochs && tr->saved_epochs_steps > 0
                       ? tr->saved_epochs_steps
                       : steps_for(total, (double)tr->saved_world * (double)tr->o.accum);
        long from_zero = steps;
        steps = tr->step + (left > 0 ? steps_for(left, step_batches) : 0);
        sd_lr_sched before = tr->o.lr, after = tr->o.lr;
        before.total = was;
        after.total = steps;
        if (tr->rank == 0)
            sd_log(SD_LOG_WARN, "--epochs %ld resumed at step %ld with %d rank(s) instead of %d: %.6g of %.6g batches "
                   "are left, %ld steps of %g, so the run ends at step %ld (not %ld, as if every step had %d "
                   "rank(s)), and the LR schedule spans %ld steps instead of %ld: at step %ld the learning rate goes "
                   "from %.6g to %.6g", epochs, tr->step, world, tr->saved_world, left > 0 ? left : 0.0, total,
                   steps - tr->step, step_batches, steps, from_zero, world, steps, was, tr->step,
                   sd_lr_at(&before, tr->step), sd_lr_at(&after, tr->step));
    } else {
        sd_log(SD_LOG_INFO, "%ld epoch%s of %.6g batches (%d rank%s, accumulation %d) = %ld steps", epochs,
               epochs == 1 ? "" : "s", per, world, world == 1 ? "" : "s", tr->o.accum, steps);
    }
    tr->o.max_steps = tr->o.lr.total = tr->epochs_steps = steps;
}

/* After a metrics line: a write that failed (disk full) is named once and
 * the file closed, so no torn line follows; training goes on, since the
 * checkpoints are what a run must not lose. */
static void metrics_done(sd_trainer *tr)
{
    if (fflush(tr->metrics) == 0 && !ferror(tr->metrics)) return;
    sd_log(SD_LOG_WARN, "%s: writing the metrics failed (%s): no more metrics lines in this run", tr->o.metrics,
           strerror(errno));
    fclose(tr->metrics);
    tr->metrics = NULL;
}

/* One TensorBoard scalar; a failed write (a full disk) is a warning and the
 * end of the events for this run, as with the metrics file: a run must not
 * lose its steps, or its last checkpoint, to a log. */
static void tb_put(sd_trainer *tr, const char *tag, double value)
{
    sd_error e = {0};
    if (!tr->tb.f || sd_tb_scalar(&tr->tb, tag, tr->step, value, &e) == SD_OK) return;
    sd_log(SD_LOG_WARN, "%s: no more TensorBoard events in this run", e.msg);
    sd_tb_close(&tr->tb);
}

/* Validate, log and write the metrics line. */
static sd_status validate_and_log(sd_trainer *tr, sd_error *err)
{
    double loss;
    long images;
    sd_status rc = sd_train_validate(tr, &loss, &images, err);
    if (rc) return rc;
    if (!tr->o.quiet && tr->rank == 0)
        sd_log(SD_LOG_INFO, "step %ld: validation loss %.6f over %ld images", tr->step, loss, images);
    if (tr->metrics) {
        fprintf(tr->metrics, "{\"step\": %ld, \"val_loss\": %.9g, \"val_images\": %ld}\n", tr->step, loss, images);
        metrics_done(tr);
    }
    tb_put(tr, "val/loss", loss);
    return SD_OK;
}

/* One value all ranks must share when a run starts, and what makes it
 * differ. */
typedef struct {
    const char *what, *cause;
    int hex;
    uint64_t v;
} world_field;

enum { WORLD_FIELDS = 14 };

/* This rank's state as the ranks compare it: what the step, the data
 * order and every collective of the run depend on. */
static void world_state(const sd_trainer *tr, world_field f[WORLD_FIELDS])
{
    const char *ck = "every rank must resume the same checkpoint: -o (or --resume) on a filesystem all of them see";
    const char *sh = "every rank must open the same shards in the same order";
    const char *op = "every rank must run with the same options";
    world_field v[WORLD_FIELDS] = {
        {"step", ck, 0, (uint64_t)tr->step},
        {"data cursor epoch", ck, 0, (uint64_t)tr->cur.epoch},
        {"data cursor batch", ck, 0, (uint64_t)tr->cur.batch},
        {"checkpoint step on disk", ck, 0, (uint64_t)tr->saved_step},
        {"EMA updates", ck, 0, (uint64_t)tr->ema_updates},
        {"data fingerprint", sh, 1, tr->have_data ? tr->data.fingerprint : 0},
        {"record count", sh, 0, tr->have_data ? (uint64_t)tr->data.nitems : 0},
        {"validation fingerprint", sh, 1, tr->have_val ? tr->val.fingerprint : 0},
        {"parameter count", "every rank must load the same model", 0, (uint64_t)tr->unet.w.total},
        {"seed", op, 0, tr->o.seed},
        {"steps to train", op, 0, (uint64_t)tr->o.max_steps},
        {"batch size", op, 0, (uint64_t)tr->o.batch},
        {"accumulation", op, 0, (uint64_t)tr->o.accum},
        {"ZeRO-1", op, 0, (uint64_t)tr->o.zero1},
    };
    memcpy(f, v, sizeof v);
}

/* A value for the message: signed decimal, or 16 hex digits. */
static void field_text(const world_field *f, uint64_t v, char *out, size_t cap)
{
    if (f->hex) snprintf(out, cap, "%016llx", (unsigned long long)v);
    else snprintf(out, cap, "%lld", (long long)v);
}

/* Several ranks: all-gather every rank's state and compare it with rank
 * 0's, so that a rank that resumed another checkpoint (or none), sees
 * other shards or runs other options stops the run at once, naming itself,
 * instead of training on a mixed state or waiting in mismatched
 * collectives. Every rank reaches the same verdict. */
static sd_status check_world(const sd_trainer *tr, sd_error *err)
{
    if (tr->world <= 1) return SD_OK;
    world_field f[WORLD_FIELDS];
    uint64_t mine[WORLD_FIELDS];
    world_state(tr, f);
    for (int i = 0; i < WORLD_FIELDS; i++) mine[i] = f[i].v;
    uint64_t *all = malloc((size_t)tr->world * sizeof mine);
    if (!all) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status rc = sd_dist_allgather_bytes(mine, sizeof mine, all, err);
    for (int r = 1; r < tr->world && !rc; r++)
        for (int i = 0; i < WORLD_FIELDS && !rc; i++) {
            uint64_t theirs = all[(size_t)r * WORLD_FIELDS + (size_t)i];
            if (theirs == all[i]) continue;
            char a[24], b[24];
            field_text(&f[i], theirs, a, sizeof a);
            field_text(&f[i], all[i], b, sizeof b);
            rc = sd_err_set(err, SD_EINVAL, "rank %d of %d does not start from rank 0's state: its %s is %s, rank 0's "
                            "%s (%s)", r, tr->world, f[i].what, a, b, f[i].cause);
        }
    free(all);
    return rc;
}

/* One metrics line: step, loss, smoothed loss, lr, gradient norm, images,
 * seconds. */
static void log_metrics(sd_trainer *tr, double loss, double gnorm, double lr, double secs)
{
    if (tr->metrics) {
        fprintf(tr->metrics,
                "{\"step\": %ld, \"loss\": %.9g, \"loss_smooth\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                "\"images\": %ld, \"seconds\": %.3f}\n",
                tr->step, loss, tr->loss_ema, lr, gnorm, tr->images, secs);
        metrics_done(tr);
    }
    const char *tags[] = {"train/loss", "train/loss_smooth", "train/lr", "train/grad_norm"};
    double v[] = {loss, tr->loss_ema, lr, gnorm};
    for (int i = 0; i < 4; i++) tb_put(tr, tags[i], v[i]);
}

/* The loop: steps, progress, metrics, checkpoints, stop and NaN handling. */
sd_status sd_train_run(sd_trainer *tr, volatile sig_atomic_t *stop, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    sd_status crc = check_world(tr, err);
    if (crc) return crc;
    if (o->metrics && !tr->metrics && tr->rank == 0) {
        sd_status mrc = sd_metrics_open(o->metrics, tr->step, &tr->metrics, err);
        if (mrc) return mrc;
    }
    if (o->tensorboard && !tr->tb.f && tr->rank == 0) {
        /* a new run's baseline validation is at step 0, a resumed run logs from step + 1 */
        sd_status trc = sd_tb_open(&tr->tb, o->tensorboard, tr->step == 0 ? 0 : tr->step + 1, err);
        if (trc) return trc;
    }
    double t0 = sd_now(), last = t0;
    long step0 = tr->step, img0 = tr->images;
    sd_status rc = SD_OK;
    tr->stop_req = stop;
    tr->stop_all = 0;
    tr->stop_told = 0;
    long val_step = -1; /* the step of the last validation */
    if (tr->have_val && tr->step == 0) { /* the baseline of a new run */
        rc = validate_and_log(tr, err);
        if (rc) return rc;
        val_step = 0;
    }
    /* several ranks stop together, after the step in which one asked */
    while (tr->step < o->max_steps && !(tr->world > 1 ? tr->stop_all : stop && *stop)) {
        double lr = sd_lr_at(&o->lr, tr->step), loss, gnorm;
        rc = sd_train_step(tr, &loss, &gnorm, err);
        if (rc) break;
        if (!isfinite(loss) || !isfinite(gnorm)) {
            const char *what = isfinite(loss) ? "gradient" : "loss";
            int finite = 0;
            rc = weights_finite(tr, &finite, err);
            if (rc) return rc;
            if (!finite) { /* an earlier step broke them (--lr far too large): saved, they resume broken */
                sd_log(SD_LOG_ERROR, "%s %g at step %ld, and the weights themselves are not finite: stopping without "
                       "saving them (the checkpoints already in %s stay as they are)", what,
                       isfinite(loss) ? gnorm : loss, tr->step + 1, tr->o.out_dir);
                return sd_err_set(err, SD_ERANGE, "non-finite %s at step %ld after non-finite weights", what,
                                  tr->step + 1);
            }
            if (isfinite(loss))
                sd_log(SD_LOG_ERROR, "the gradient norm is %g at step %ld (the loss, %g, is finite): stopping; the "
                       "checkpoint holds the state before it", gnorm, tr->step + 1, loss);
            else
                sd_log(SD_LOG_ERROR, "loss is %g at step %ld: stopping; the checkpoint holds the state before it", loss,
                       tr->step + 1);
            if (tr->saved_step != tr->step) rc = sd_train_save(tr, err);
            if (!rc)
                rc = sd_err_set(err, SD_ERANGE, "non-finite %s at step %ld", isfinite(loss) ? "gradient" : "loss",
                                tr->step + 1);
            return rc;
        }
        tr->loss_ema = isnan(tr->loss_ema) ? loss : 0.98 * tr->loss_ema + 0.02 * loss;
        double now = sd_now();
        log_metrics(tr, loss, gnorm, lr, now - t0);
        if (!o->quiet && (now - last >= 2.0 || tr->step == o->max_steps)) {
            double el = now - t0, its = (double)(tr->step - step0) / (el > 0 ? el : 1);
            double eta = its > 0 ? (double)(o->max_steps - tr->step) / its : 0;
            fprintf(stderr, "step %ld/%ld  loss %.5f (smooth %.5f)  lr %.3g  %.2f it/s  %.2f img/s  eta %.0fs\n",
                    tr->step, o->max_steps, loss, tr->loss_ema, lr, its, (double)(tr->images - img0) / (el > 0 ? el : 1),
                    eta);
            last = now;
        }
        int saving = o->save_every > 0 && tr->step % o->save_every == 0 && tr->step < o->max_steps;
        if (tr->have_val && (o->val_every > 0 ? tr->step % o->val_every == 0 : saving)) {
            rc = validate_and_log(tr, err);
            if (rc) break;
            val_step = tr->step;
        }
        if (saving) {
            rc = sd_train_save(tr, err);
            if (rc) break;
        }
    }
    tell_stop(tr); /* a request that came after the last micro-batch */
    if (!rc && tr->have_val && val_step != tr->step) rc = validate_and_log(tr, err);
    if (!rc && tr->saved_step != tr->step) rc = sd_train_save(tr, err); /* not again after a stop on a save step */
    else if (!rc && !o->quiet) sd_log(SD_LOG_INFO, "checkpoint-%ld already holds step %ld", tr->step, tr->step);
    /* a bad record is met again each epoch: the counts are of draws */
    const char *what = "records skipped, counted each time drawn";
    if (!rc) rc = log_tally_all(tr, &tr->tally, what, err);
    else if (tr->tally.total) sd_tally_log(&tr->tally, what); /* the ranks may be apart now: this rank's */
    return rc;
}
