/* Opening and closing a trainer: the default options, the model, the
 * optimizer state, the shards and the backend. */
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "dtype.h"
#include "full_ckpt.h"
#include "log.h"
#include "safetensors.h"
#include "train_int.h"
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
    o->weight_dtype = SD_DT_F32;
    o->grad_dtype = SD_DT_F32;
    o->optimizer = SD_OPT_ADAMW;
    o->adafactor_beta1 = -1;
    o->t_min = 0;
    o->t_max = SD_DDPM_STEPS;
}

/* What the UNet expects of each record (data.h); training adds the
 * dropout and flip options, validation uses neither. */
sd_load_opts sd_train_load_opts(const sd_trainer *tr, int training)
{
    sd_load_opts lo = sd_train_unet_load_opts(&tr->unet.cfg);
    lo.dropout = training ? tr->o.dropout : 0;
    lo.no_flip = training ? tr->o.no_flip : 1;
    lo.masked = training ? tr->o.masked_loss : 0;
    lo.variants = training;
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

/* Values in each AdamW moment this rank holds: all, or its ZeRO-1 share. */
static size_t moment_values(const sd_train_opts *o, size_t total, int rank, int world)
{
    return sd_train_sharded(o) ? sd_dist_owned(total, rank, world) : total;
}

/* Bytes of one AdamW moment value. */
static size_t moment_bytes(const sd_train_opts *o)
{
    return o->moments == SD_DT_BF16 ? 2 : 4;
}

/* AdamW's moments (this rank's segments under ZeRO-1), or the other
 * optimizer's state. */
size_t sd_train_optimizer_bytes(const sd_trainer *tr)
{
    if (tr->o.optimizer != SD_OPT_ADAMW)
        return sd_opt_state_bytes(&tr->opt);
    return 2 * moment_values(&tr->o, tr->unet.w.total, tr->rank, tr->world) * tr->moment_size;
}

/* What sd_trainer_open allocates for w's model under o, from the same
 * helpers it allocates with (train.h). */
sd_train_state_bytes sd_train_state_sizes(const sd_train_opts *o, const sd_weights *w, int rank, int world)
{
    sd_train_state_bytes b = {.weights = o->weight_dtype == SD_DT_BF16 ? w->total * sizeof(uint16_t)
                                                                      : sd_weights_bytes(w),
                              .gradients = o->fused_backward          ? 0
                                           : o->zero2                    ? sd_train_zero2_own(o, w, rank, world) * sizeof(float)
                                           : o->grad_dtype == SD_DT_BF16 ? w->total * sizeof(uint16_t)
                                                                         : w->total * sizeof(float)};
    if (o->optimizer == SD_OPT_ADAMW) {
        b.optimizer = 2 * moment_values(o, w->total, rank, world) * moment_bytes(o);
    } else if (sd_train_sharded(o)) { /* this rank's run of tensors */
        b.optimizer = sd_train_tensor_state_bytes(o, w, rank, world);
    } else {
        sd_opt_state s;
        sd_opt_state_layout(&s, o->optimizer, o->adafactor_beta1 >= 0, w);
        b.optimizer = sd_opt_state_bytes(&s);
        sd_opt_state_free(&s);
    }
    b.ema = o->ema_decay > 0 ? w->total * sizeof(float) : 0;
    return b;
}

/* The model: loaded, or built from a config and initialised; with
 * --weight-dtype bf16 straight into tr->w16 (each value rounded to the
 * nearest bf16 as it is read or drawn, unet.w.data left NULL), so no fp32
 * model exists at the start either (2 bytes a weight, not 6). */
static sd_status open_model(sd_trainer *tr, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    int bf16 = o->weight_dtype == SD_DT_BF16;
    if (o->unet) {
        sd_unet_opts uo = {.config_path = o->unet_config};
        return bf16 ? sd_unet_load_bf16(&tr->unet, o->unet, &uo, &tr->w16, err)
                    : sd_unet_load(&tr->unet, o->unet, &uo, err);
    }
    if (!o->unet_config) return sd_err_set(err, SD_EINVAL, "no UNet: give a model path or a config.json");
    sd_unet_config c;
    sd_unet_config_default(&c);
    sd_status rc = sd_unet_config_read(o->unet_config, &c, err);
    if (!rc) rc = bf16 ? sd_unet_build_names(&tr->unet, &c, err) : sd_unet_build(&tr->unet, &c, err);
    if (!rc && bf16 && !(tr->w16 = calloc(tr->unet.w.total ? tr->unet.w.total : 1, sizeof *tr->w16))) {
        rc = sd_err_set(err, SD_ENOMEM, "out of memory for the bf16 weights (%zu MB)",
                        tr->unet.w.total * sizeof *tr->w16 >> 20);
        sd_unet_free(&tr->unet);
    }
    if (!rc) {
        if (bf16) sd_unet_init_random_bf16(&tr->unet, o->init_seed, tr->w16);
        else sd_unet_init_random(&tr->unet, o->init_seed);
        snprintf(tr->unet.layout, sizeof tr->unet.layout, "new (seed %llu)", (unsigned long long)o->init_seed);
    }
    return rc;
}

/* --save-full: the base model (--base-model, else the --unet model) is
 * set, and its VAE and text encoder(s) loaded once and checked against the UNet, so that a missing or foreign part stops the
 * run before its first step, not at its first checkpoint. */
static sd_status check_full(sd_trainer *tr, sd_error *err)
{
    int defaulted = !tr->o.base_model;
    if (defaulted) tr->o.base_model = tr->o.unet; /* what ckpt_save.c reads */
    const char *base = tr->o.base_model;
    sd_status rc;
    if (!base)
        rc = sd_err_set(err, SD_EINVAL, "--save-full takes the VAE and text encoders from the model the UNet came "
                        "from: give it with --base-model PATH (a new model from --unet-config has none)");
    else {
        sd_full_parts parts;
        rc = sd_full_parts_load(&parts, base, &tr->unet.cfg, NULL, err);
        if (!rc && !tr->o.quiet && sd_dist_rank() == 0)
            sd_log(SD_LOG_INFO, "full checkpoints: %s, the VAE and text encoder%s from %s",
                   sd_full_family_name(parts.family), parts.nte > 1 ? "s" : "", base);
        if (!rc) sd_full_parts_free(&parts);
        else if (defaulted) { /* say where the parts were looked for, and how to name another model */
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            sd_err_set(err, rc, "--save-full: name the model the UNet came from with --base-model PATH; %s", why);
        }
    }
    if (rc) sd_unet_free(&tr->unet);
    return rc;
}

/* A device backend's copies of the run's state: weights (fp32 or bf16),
 * gradients (none with --fused-backward; --zero2: this rank's share of
 * them and the per-op scratch, sized by sd_train_zero2_open), AdamW's
 * moments (ZeRO: this rank's share; the other optimizers' state:
 * sd_opt_state_device), the EMA (--ema-on-cpu: in host memory), bf16
 * weights' update chunk; uploaded before the first step (dev_stale).
 * `where` names the device in messages. */
static sd_status device_state(sd_trainer *tr, const char *where, sd_error *err)
{
    void *c = tr->exec;
    size_t n = tr->unet.w.total, bytes = n * sizeof(float);
    size_t own = sd_train_sharded(&tr->o) ? sd_dist_owned(n, tr->rank, tr->world) : n, mbytes = own * tr->moment_size;
    size_t gbytes = tr->o.zero2 ? (tr->z2own ? tr->z2own : 1) * sizeof(float) : tr->o.fused_backward ? 0 : bytes;
    int adamw = tr->o.optimizer == SD_OPT_ADAMW;
    void *got[7] = {0};
    size_t want[7] = {tr->w16 ? n * sizeof(uint16_t) : bytes, gbytes, adamw ? (mbytes ? mbytes : 1) : 0,
                      adamw ? (mbytes ? mbytes : 1) : 0, tr->ema && !tr->o.ema_host ? bytes : 0,
                      tr->w16 ? sd_train_w16_chunk(&tr->o, &tr->unet.w) * sizeof(float) : 0,
                      tr->o.zero2 ? (tr->fgrad_cap ? tr->fgrad_cap : 1) * sizeof(float) : 0},
           total = 0;
    for (int i = 0; i < 7; i++) {
        total += want[i];
        got[i] = want[i] ? tr->be->alloc(c, want[i]) : NULL;
        if (want[i] && !got[i]) {
            for (int j = 0; j < i; j++)
                if (got[j]) tr->be->release(c, got[j]);
            tr->d_w = tr->d_grad = tr->d_ema = tr->d_upd = NULL;
            tr->d_m = tr->d_v = NULL;
            tr->d_w16 = NULL;
            for (int j = i + 1; j < 7; j++) total += want[j];
            return sd_err_set(err, SD_ENOMEM, "%s: no room for the weights, gradients and optimizer state "
                              "(%.1f MiB)%s%s", where, (double)total / (1 << 20),
                              want[4] ? "; --ema-on-cpu keeps the EMA in host memory" : "",
                              adamw && tr->moment_size == 4 ? "; --adam-moments bf16 halves the moments" : "");
        }
    }
    tr->d_w = tr->w16 ? NULL : got[0];
    tr->d_w16 = tr->w16 ? got[0] : NULL;
    tr->d_grad = tr->o.zero2 ? NULL : got[1];
    tr->gsh = tr->o.zero2 ? got[1] : NULL;
    tr->d_m = got[2];
    tr->d_v = got[3];
    tr->d_ema = got[4];
    tr->d_upd = got[5];
    tr->fgrad = got[6];
    if (got[1]) tr->be->zero(c, got[1], gbytes);
    sd_status rc = sd_opt_state_device(&tr->opt, tr->be, c, err);
    if (rc) return rc;
    tr->dev_stale = 1;
    return tr->be->sync(c, err);
}

/* The backend the UNet runs on: the CPU table on the pool (the weights and
 * gradients are the host buffers), a CUDA context with device copies of
 * the state, or the caller's table (o.backend: tests run the device paths
 * with the CPU table marked is_device). */
static sd_status open_backend(sd_trainer *tr, sd_error *err)
{
    tr->be = sd_backend_cpu();
    tr->exec = tr->pool;
    tr->d_w = tr->unet.w.data;
    tr->d_w16 = tr->w16;
    tr->d_upd = tr->upd;
    tr->d_grad = tr->grad;
    tr->d_m = tr->m;
    tr->d_v = tr->v;
    tr->d_ema = tr->ema;
    if (tr->o.backend) {
        tr->be = tr->o.backend;
        tr->exec = tr->o.backend_exec;
        return tr->be->is_device ? device_state(tr, tr->be->name, err) : SD_OK;
    }
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
    char where[32];
    snprintf(where, sizeof where, "cuda:%d", tr->o.device);
    rc = device_state(tr, where, err);
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
    if (sd_train_sharded(&tr->o))
        return sd_err_set(err, SD_EUNSUPPORTED, "--zero1/--zero2 on GPU ranks shard over NCCL, which this build lacks "
                          "(the CUDA toolkit's libnccl)");
    return SD_OK; /* several GPU ranks sum through the host over MPI */
#endif
#else
    return sd_err_set(err, SD_EUNSUPPORTED,
                      "--device cuda:%d: this build has no CUDA backend (configure where nvcc and cuDNN are installed)",
                      tr->o.device);
#endif
}

/* The state of --optimizer adamw8bit or adafactor instead of AdamW's
 * moments, with fp32 state of its own (--adam-moments is AdamW's); on a
 * GPU mirrored in device memory by open_backend; under ZeRO (CPU or GPU
 * ranks) this rank's run of whole tensors, so a device mirrors that run
 * alone. */
static sd_status open_other_optimizer(sd_trainer *tr, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    const char *name = sd_optimizer_name(o->optimizer), *why = NULL;
    if (o->moments != SD_DT_F32) why = "keeps its own state: --adam-moments bf16 is AdamW's";
    if (why) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_EUNSUPPORTED, "--optimizer %s %s", name, why);
    }
    /* ZeRO: this rank's run of whole tensors (train_zero_tensors.c) */
    sd_status rc = sd_train_sharded(o) ? sd_train_tensor_state_open(tr, err)
                                       : sd_opt_state_init(&tr->opt, o->optimizer, o->adafactor_beta1 >= 0,
                                                           &tr->unet.w, err);
    if (rc) sd_trainer_close(tr);
    return rc;
}

/* --weight-dtype: fp32 or bf16; bf16 in one process (the paths that widen
 * and round it, CPU or GPU), refused elsewhere with the reason. */
static sd_status check_weight_dtype(sd_trainer *tr, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    const char *why = NULL;
    if (o->weight_dtype == SD_DT_F32 || o->weight_dtype == 0) return SD_OK; /* 0: options not from the defaults */
    if (o->weight_dtype != SD_DT_BF16) why = "takes fp32 or bf16";
    else if (tr->world > 1 || sd_train_sharded(o))
        why = "bf16 runs in one process only so far (no ZeRO or MPI path for it)";
    if (!why) return SD_OK;
    sd_trainer_close(tr);
    return sd_err_set(err, SD_EUNSUPPORTED, "--weight-dtype %s", why);
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
    if (!rc && o->save_full) rc = check_full(tr, err);
    if (rc) {
        free(tr->w16); /* a bf16 model loaded before check_full refused */
        tr->w16 = NULL;
        return rc;
    }
    size_t n = tr->unet.w.total;
    tr->rank = sd_dist_rank();
    tr->world = sd_dist_world();
    if (o->zero_terminal_snr && o->snr_gamma > 0 && o->pred == SD_PRED_EPSILON) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_EINVAL, "zero terminal SNR with min-SNR weights and epsilon prediction: the "
                          "weights divide by the SNR, which is 0 at the last timestep (use v-prediction)");
    }
    if (o->moments != SD_DT_F32 && o->moments != SD_DT_BF16) {
        sd_trainer_close(tr);
        return sd_err_set(err, SD_EINVAL, "AdamW moments are stored as fp32 or bf16");
    }
    tr->moment_size = moment_bytes(o);
    rc = check_weight_dtype(tr, err);
    if (rc) return rc;
    if (o->optimizer != SD_OPT_ADAMW) {
        rc = open_other_optimizer(tr, err);
        if (rc) return rc;
    } else if (sd_train_sharded(o)) {
        size_t own = moment_values(o, n, tr->rank, tr->world);
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
    /* --fused-backward: no gradient buffer, a scratch per op (train_fused.c);
     * --zero2: this rank's share of it (train_zero2.c); --grad-dtype bf16:
     * a bf16 buffer and a scratch per op (train_g16.c) */
    int g16 = o->grad_dtype == SD_DT_BF16, no_grad = o->fused_backward || o->zero2 || g16;
    tr->grad = no_grad ? NULL : calloc(n, sizeof(float));
    if (no_grad) {
        rc = o->zero2 ? sd_train_zero2_open(tr, err) : g16 ? sd_train_g16_open(tr, err) : sd_train_fused_open(tr, err);
        if (rc) {
            sd_trainer_close(tr);
            return rc;
        }
    }
    if (o->weight_dtype == SD_DT_BF16) {
        rc = sd_train_w16_open(tr, err);
        if (rc) {
            sd_trainer_close(tr);
            return rc;
        }
    }
    if (o->ema_decay > 0) { /* from the weights as the run holds them */
        tr->ema = malloc(n * sizeof(float));
        if (tr->ema && tr->w16) sd_train_w16_widen(tr->ema, tr->w16, n);
        else if (tr->ema) memcpy(tr->ema, tr->unet.w.data, n * sizeof(float));
    }
    int adamw_whole = !sd_train_sharded(o) && o->optimizer == SD_OPT_ADAMW;
    /* the per-tensor updates of fp32 weights copy one tensor's descriptor */
    size_t desc = sd_train_w16_desc_bytes(o, &tr->unet.w);
    int per_tensor = o->fused_backward || o->clip_per_tensor || g16;
    if (!tr->desc && desc && per_tensor) tr->desc = malloc(desc);
    if ((adamw_whole && (!tr->m || !tr->v)) || (!tr->grad && !no_grad) ||
        (o->ema_decay > 0 && !tr->ema) || (desc && !tr->desc && per_tensor)) {
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
    sd_load_opts lo = sd_train_load_opts(tr, 0);
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
    sd_train_samples_close(tr); /* its buffers on the backend go before the backend */
#ifdef SDTK_HAVE_NCCL
    sd_nccl_close(tr->nccl);
#endif
    if (tr->be && tr->be->is_device) {
        /* --zero2's share and scratch are device buffers there too */
        void *dev[] = {tr->d_w,  tr->d_grad, tr->d_m, tr->d_v, tr->d_ema, tr->d_act, tr->d_dact,
                       tr->d_dout, tr->d_w16, tr->d_upd, tr->wscr, tr->fgrad, tr->gsh};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
            if (dev[i]) tr->be->release(tr->exec, dev[i]);
        tr->wscr = tr->fgrad = tr->gsh = NULL; /* device memory: not for free() below */
        sd_opt_state_release(&tr->opt, tr->be, tr->exec);
    }
#ifdef SDTK_HAVE_CUDA
    if (tr->cuda) sd_cuda_destroy(tr->cuda);
#endif
    free(tr->stage);
    free(tr->w16);
    free(tr->upd);
    free(tr->wscr);
    free(tr->desc);
    free(tr->fgrad);
    free(tr->g16);
    free(tr->fdone);
    free(tr->gsh);
    free(tr->z2off);
    free(tr->m_sh);
    free(tr->v_sh);
    sd_train_tensor_state_shard(tr);
    sd_opt_state_free(&tr->opt);
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
