/* The UNet trainer: diffusers' train_text_to_image.py math on cached
 * latents. Per micro-batch: a batch of one bucket from the shards (data.h),
 * uniform integer timesteps, Gaussian noise (plus the optional noise
 * offset), x_t = sqrt(acp) x0 + sqrt(1 - acp) noise, the UNet's prediction,
 * MSE against the epsilon or v target (optionally min-SNR weighted), and
 * backward into the flat gradient buffer, divided by the accumulation count
 * as accelerate does. Per optimizer step: global-norm clipping, AdamW with
 * fp32 master weights at the scheduled rate, gradients zeroed.
 *
 * With ema_decay, an exponential moving average of the weights follows
 * every ema_every steps as diffusers' EMAModel computes it.
 *
 * Checkpoints (ckpt_save.c, ckpt_resume.c) hold the model as a diffusers
 * unet/ folder (and the EMA weights as unet_ema/) plus a
 * training-state file (moments, step, RNG state, data cursor), written to a
 * temporary directory that is renamed into place, so a killed run never
 * leaves a half checkpoint; a run resumed from one draws the same batches
 * and numbers and ends bit-identical to an uninterrupted run. */
#ifndef SDTK_TRAIN_H
#define SDTK_TRAIN_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "data.h"
#include "optim.h"
#include "rng.h"
#include "sched.h"
#include "tally.h"
#include "tb_events.h"
#include "unet.h"

typedef struct {
    /* model: a diffusers folder / unet folder / single file, or only a
     * config.json for a new model initialised from init_seed */
    const char *unet;
    const char *unet_config;
    uint64_t init_seed;
    /* data */
    const char *const *shards;
    int nshards;
    int allow_mixed;
    int batch, accum;
    int no_carry; /* 1: a bucket's last batch of an epoch may be short (else it takes the next epoch's first) */
    double dropout; /* conditioning dropout: empty-caption embedding */
    int no_flip;
    int masked_loss; /* weight the loss per latent pixel by each record's loss mask (ones without one) */
    /* math */
    sd_prediction pred;
    double snr_gamma;    /* > 0: min-SNR-gamma loss weights */
    double noise_offset; /* > 0: noise += offset * N(0, 1) per channel */
    int zero_terminal_snr; /* rescale the schedule to zero terminal SNR (sched.h) */
    double input_perturbation; /* > 0: x_t from noise + this * N(0, 1), the target from the noise alone */
    int t_min, t_max;      /* timesteps drawn uniformly from [t_min, t_max); 0 and SD_DDPM_STEPS by default */
    /* optimizer */
    sd_adamw_opts adam;
    sd_lr_sched lr;
    double max_grad_norm; /* <= 0: no clipping */
    double ema_decay;     /* > 0: keep an EMA of the weights (diffusers EMAModel, e.g. 0.9999) */
    long ema_every;       /* update the EMA every N optimizer steps (default 1) */
    int ema_host;         /* GPU runs: keep the EMA in host memory (the weights copied over per update) */
    long max_steps;
    uint64_t seed;
    /* checkpoints */
    const char *out_dir;
    long save_every;  /* 0: only at the end */
    int keep;         /* checkpoints kept (0: all) */
    int save_dtype;   /* SD_ST_F32 / F16 / BF16 for the exported unet/ */
    const char *metrics; /* JSONL metrics file, or NULL */
    int threads;
    int quiet;
    /* -1: the CPU; K >= 0: the UNet's forward and backward, clipping, AdamW
     * and the EMA on cuda:K (the host copies of weights and moments are
     * refreshed for checkpoints); tf32: allow TF32 tensor cores there;
     * mixed: SD_DT_BF16 for bf16 matrix products there (sd_cuda_opts) */
    int device;
    int tf32;
    int mixed;
    int attn_flash; /* GPU: attention on the flash kernel (no score blocks in memory; slower) */
    size_t gpu_mem_limit; /* GPU: most device bytes the run may hold (sd_cuda_opts.mem_limit); 0: no limit */
    size_t host_mem_limit; /* CPU: most bytes the memory plan may reach (0: what the host has available) */
    size_t attn_block;    /* GPU: floats in one block of attention scores (sd_cuda_opts.attn_block); 0: default */
    /* a backend table given by the caller instead of the CPU's or a CUDA
     * context (device is then ignored), with its exec; tests pass the CPU
     * table marked is_device, so every device path (state copies, uploads,
     * syncs) runs on the host with the CPU's arithmetic. NULL: none. */
    const sd_backend *backend;
    void *backend_exec;
    int checkpointing; /* gradient checkpointing: recompute resnets and transformer blocks in the backward */
    int nccl; /* GPU: sum gradients over NCCL even in a world of one (a check of the path) */
    int zero1; /* CPU ranks: shard the AdamW moments across ranks (ZeRO stage 1) */
    /* --zero2, CPU ranks: the gradients too (ZeRO stage 2: each tensor's
     * gradient reduce-scattered during the backward into its owners'
     * shares, no gradient buffer of the model; train_zero2.c); the moments
     * are sharded as with zero1, which it implies */
    int zero2;
    /* --fused-backward: each tensor updated as soon as the backward has its
     * gradient, in a scratch of the largest op's size (no gradient buffer of
     * the model; CPU, one process, no accumulation; clipping per tensor) */
    int fused_backward;
    int clip_per_tensor; /* --clip-per-tensor: --max-grad-norm per tensor (the fused path's clipping) */
    int moments; /* SD_DT_F32 (default) or SD_DT_BF16: how the AdamW moments are stored */
    int weight_dtype; /* SD_DT_F32 (default) or SD_DT_BF16: the trainable weights (train_w16.c; CPU, AdamW) */
    /* SD_DT_F32 (default) or SD_DT_BF16: the whole-model gradient buffer
     * (train_g16.c; CPU, one process, not with fused_backward) */
    int grad_dtype;
    sd_optimizer optimizer; /* AdamW (default), 8-bit AdamW or Adafactor (optim.h) */
    double adafactor_beta1; /* Adafactor's first moment's beta1; < 0: none (transformers' beta1=None) */
    /* validation: a shard of held-out records, its loss at the start, every
     * val_every steps (0: at checkpoints) and at the end */
    const char *val_shard;
    long val_every;
    const char *config_json; /* the effective options, written into every checkpoint, or NULL */
    const char *tensorboard; /* a directory for TensorBoard event files (rank 0), or NULL */
    int save_single; /* also unet.safetensors (and unet_ema.safetensors): one file, ldm names */
    /* also full.safetensors (and full_ema.safetensors): UNet, VAE and text
     * encoder(s) in one file with ldm/sgm names (full_ckpt.h), the VAE and
     * encoders from base_model, or from unet when base_model is NULL */
    int save_full;
    const char *base_model;
    /* samples (train_samples.c): the prompts of a JSONL file (sd-sample's
     * lines) rendered every sample_every steps (0: at checkpoints) and at
     * the end, conditioned by sample_model's text encoders (NULL:
     * base_model, else the unet folder; sample_tokenizer for a single
     * file) */
    const char *sample_prompts;
    long sample_every;
    const char *sample_model, *sample_tokenizer;
} sd_train_opts;

/* The samples' prompts, conditioning and VAE decoder (train_samples.c). */
typedef struct sd_train_samples sd_train_samples;

typedef struct {
    sd_train_opts o;
    sd_unet unet;
    sd_ddpm sched;
    void *m, *v;         /* AdamW moments: unet.w.total values of moment_size bytes (fp32 or bf16) */
    size_t moment_size;  /* 4, or 2 with bf16 moments */
    float *grad;         /* unet.w.total floats */
    float *ema;          /* the EMA weights, or NULL */
    long ema_updates;
    long step;           /* optimizer steps done */
    long saved_step;     /* the step of the checkpoint last written or resumed from, -1 before one */
    long images;         /* samples trained on */
    sd_rng rng;
    sd_data data;
    int have_data;
    sd_data_cursor cur;
    sd_batch batch;
    sd_data val; /* the validation shard, when o.val_shard */
    int have_val;
    sd_batch vbatch;
    double val_loss; /* the last validation's, NaN before one */
    sd_tally tally;
    /* the planned graph and its buffers, kept while the shape repeats */
    sd_unet_graph g;
    int gn, gh, gw, gt;
    float *act, *dact;
    size_t act_cap, dact_cap;
    float *noise, *target, *dout;
    float *noise_in; /* --input-perturbation: the perturbed noise x_t is made from, or NULL */
    int *t;
    size_t io_cap;
    sd_pool *pool;
    /* the backend the UNet and the optimizer run on and its exec argument
     * (the pool on the CPU, a CUDA context on a GPU); d_* are the
     * backend's weights, moments, EMA, activations and gradients: the host
     * buffers themselves on the CPU, device buffers on a GPU, where the
     * host copies (unet.w.data, m, v, ema) are filled only when a
     * checkpoint needs them (host_stale) and uploaded after they were
     * loaded (dev_stale) */
    const sd_backend *be;
    void *exec;
    void *cuda;
    float *d_w, *d_ema, *d_act, *d_dact, *d_dout, *d_grad;
    void *d_m, *d_v;
    float *stage; /* GPU: host staging of the noisy latents, timesteps, output */
    int dev_stale, host_stale;
    void *nccl; /* sd_nccl *: GPU ranks' gradient sums (nccl_sum.h), or NULL */
    /* ZeRO-1: this rank's segments of the moments (dist.h's layout), packed;
     * m and v are then NULL except while a checkpoint is written or read */
    void *m_sh, *v_sh;
    /* --zero2: this rank's share of the step's gradient (z2own floats,
     * packed as m_sh), the tensors in the order the backward hands them
     * over (z2n offsets and lengths), the next one expected, whether the
     * step's passes now add (after its first), a failed reduce-scatter's
     * error; the per-op scratch is fgrad */
    float *gsh;
    size_t z2own, *z2off, *z2len, z2n, z2pos;
    int z2add;
    sd_error z2err;
    sd_opt_state *opt_save; /* ZeRO, rank 0, while a checkpoint is written: the whole model's state */
    sd_opt_state opt; /* --optimizer adamw8bit or adafactor: their per-tensor state (optim.h) */
    /* --weight-dtype bf16: the weights (unet.w.total bf16 values; unet.w.data
     * and d_w are then NULL except while a checkpoint is written or read),
     * the update's fp32 chunk and the UNet's per-op widening scratch */
    uint16_t *w16;
    float *upd, *wscr;
    /* the bf16 weights and the update's chunk on the backend: w16 and upd
     * themselves on the CPU, device buffers on a GPU (w16 is then the
     * host copy, refreshed as unet.w.data is for fp32; wscr is device
     * memory there) */
    uint16_t *d_w16;
    float *d_upd;
    void *desc; /* adamw8bit, adafactor: a group's tensor descriptors */
    size_t wscr_cap;
    /* --fused-backward: the per-op gradient scratch, which tensors this
     * step updated, the step's sum of squares and rate, and whether a
     * non-finite gradient stopped it with the model half-updated */
    float *fgrad;
    size_t fgrad_cap;
    unsigned char *fdone;
    double fused_ss, fused_lr;
    int fused_broken;
    /* --grad-dtype bf16: the gradients (unet.w.total bf16 values; grad and
     * d_grad are then NULL), added into by the backward through fgrad with
     * the rounding key of the current micro-batch, the step's micro-batches
     * so far */
    uint16_t *g16;
    uint32_t g16_key;
    long g16_micro;
    FILE *metrics;
    sd_tb tb; /* TensorBoard scalars and sample images, when o.tensorboard (rank 0) */
    sd_train_samples *samples; /* rank 0 with o.sample_prompts, from the run's start; else NULL */
    double loss_ema;
    /* data parallel (dist.h): this rank of world; each optimizer step
     * takes world * accum batches of the global order, this rank the ones
     * at positions rank, rank + world, ...; stop_req is this process's
     * stop flag and stop_all whether any rank raised its own (agreed in
     * the step's reduction, so every rank stops after the same step) */
    int rank, world;
    int saved_world; /* the world size of the checkpoint resumed from; 0 in a new run */
    /* --epochs as steps: this run's plan (0 without --epochs), and the
     * checkpoint's (its epochs and the steps it planned; 0 when it had none) */
    long epochs, epochs_steps, saved_epochs, saved_epochs_steps;
    volatile sig_atomic_t *stop_req;
    int stop_all;
    int stop_told;    /* the stop request was acknowledged in the log */
    int graph_logged; /* the first graph plan was logged (the later ones at debug level) */
} sd_trainer;

/* Why --fused-backward cannot run with these options (accum: --accum),
 * NULL when it can (train_fused.c). */
const char *sd_train_fused_refusal(const sd_train_opts *o, long accum);
/* Why o cannot run under --zero2 on world ranks, NULL when it can
 * (train_zero2.c). */
const char *sd_train_zero2_refusal(const sd_train_opts *o, int world);
/* Whether the AdamW moments are sharded over the ranks (--zero1 or --zero2). */
int sd_train_sharded(const sd_train_opts *o);
/* Whether o runs on a device: --device cuda:K, --nccl, or a caller's
 * backend table marked is_device (train_shared.c). */
int sd_train_device_run(const sd_train_opts *o);
/* Why --grad-dtype bf16 cannot run with these options (NULL when it can,
 * or when the gradients are fp32), the stochastic-rounding key of a step's
 * micro-batch, and the add of an op's fp32 tensor gradient g (n floats at
 * offset off) into the bf16 buffer: g16[off + i] = round(widen(g16[off +
 * i]) + g[i]) with the bits sdm_mix32(key, off + i) (train_g16.c). */
const char *sd_train_g16_refusal(const sd_train_opts *o);
uint32_t sd_train_g16_key(const sd_trainer *tr, long step, long micro);
void sd_train_g16_add(uint16_t *g16, sd_pool *pool, uint32_t key, size_t off, const float *g, size_t n);

/* Defaults as diffusers' train_text_to_image.py: lr 1e-4 constant, AdamW
 * betas (0.9, 0.999), eps 1e-8, weight decay 1e-2, clipping at 1.0,
 * epsilon prediction, batch 1, no accumulation. */
void sd_train_opts_default(sd_train_opts *o);

/* The bytes of optimizer state this process holds between steps: AdamW's
 * two moments (this rank's share under ZeRO-1), or 8-bit AdamW's or
 * Adafactor's state. */
size_t sd_train_optimizer_bytes(const sd_trainer *tr);

/* The bytes sd_trainer_open allocates for a model of weights w under o on
 * this rank: the weights, their gradients, the optimizer state (AdamW's
 * moments, their ZeRO-1 share, or the other optimizer's layout) and the
 * EMA; from the same arithmetic the allocations take (the memory plan). */
typedef struct {
    size_t weights, gradients, optimizer, ema;
} sd_train_state_bytes;
sd_train_state_bytes sd_train_state_sizes(const sd_train_opts *o, const sd_weights *w, int rank, int world);

/* Load or create the model, allocate optimizer state, open the shards
 * (when o->nshards > 0; each checked against the UNet: latent channels,
 * text embedding widths, a text embedding at all) and start the pool. */
sd_status sd_trainer_open(sd_trainer *tr, const sd_train_opts *o, sd_error *err);
void sd_trainer_close(sd_trainer *tr);
/* The model's parameter count as diffusers gives it: the sum of its tensors'
 * sizes (unet.w.total also counts the padding between them). */
size_t sd_train_param_count(const sd_trainer *tr);

/* One micro-batch with given inputs: x0 [n, c, h, w] (scaled latents), ctx
 * [n, tctx, cross], text/tids (SDXL, else NULL), noise like x0 and integer
 * timesteps t [n]. Adds the gradient of loss * grad_scale into tr->grad;
 * *loss gets the (weighted) MSE. */
sd_status sd_train_micro(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                         const float *text, const float *tids, const float *noise, const int *t, double grad_scale,
                         double *loss, sd_error *err);
/* sd_train_micro with a loss mask [n, h, w] at the latent size: each
 * squared error times its pixel's weight before the mean, as sd-scripts'
 * apply_masked_loss (--masked-loss). */
sd_status sd_train_micro_masked(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                                const float *text, const float *tids, const float *noise, const int *t,
                                const float *mask, double grad_scale, double *loss, sd_error *err);
/* The gradients so far into tr->grad (a GPU run keeps them on the
 * device). */
sd_status sd_train_grad_to_host(sd_trainer *tr, sd_error *err);
/* The weights, moments and EMA into the host buffers (a GPU run keeps
 * them on the device; checkpoints call this). */
sd_status sd_train_sync_host(sd_trainer *tr, sd_error *err);
/* Clip, AdamW at the scheduled rate, zero the gradients, count the step,
 * on the trainer's backend. Returns the gradient norm before clipping (NaN
 * after a device failure, which the next step reports). */
double sd_train_apply(sd_trainer *tr);
/* With --fused-backward (sd_train_micro then only sets the output's
 * gradient): the backward of that micro-batch with each tensor updated as
 * its gradient is complete, then the step counted and the EMA; returns
 * the norm of the per-tensor sums (NaN when a gradient was not finite). */
double sd_train_apply_fused(sd_trainer *tr);
/* One optimizer step from the shards: world * accum batches of the global
 * order, this rank's share of them computed here (the random draws of each
 * batch come from a stream seeded by the seed and the batch's place in its
 * epoch, so they do not depend on which rank computes it), the gradients
 * and losses summed over the ranks. *loss is the mean over all batches,
 * *gnorm the gradient's norm before clipping; where either is not finite
 * the step is not applied and its gradient, data and draws are taken back. */
sd_status sd_train_step(sd_trainer *tr, double *loss, double *gnorm, sd_error *err);
/* The loss alone for given inputs (validation): the gradient is not
 * touched; plain MSE (no min-SNR weights), so runs with different
 * weighting compare. */
sd_status sd_train_eval(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                        const float *text, const float *tids, const float *noise, const int *t, double *loss,
                        sd_error *err);
/* The mean loss over every record of the validation shard, with latent
 * noise, timesteps and noise drawn from a stream fixed by the record's
 * batch (not by the training seed), no flips and no dropout: the same
 * model gives the same value in any run. Ranks split the batches. */
sd_status sd_train_validate(sd_trainer *tr, double *loss, long *images, sd_error *err);
/* --epochs N: max_steps and the LR schedule's total become the steps of N
 * passes over the shards at world x accum batches a step. After a resume
 * (call it after sd_train_resume) of a checkpoint made with another world
 * size, the steps left are the batches the saved cursor has not reached,
 * counted from the saved step, and a warning names the schedule's old and
 * new totals. */
void sd_train_set_epochs(sd_trainer *tr, long epochs);
/* Run until max_steps or *stop, checkpointing every save_every steps, at
 * the end, on *stop, and (the state before the bad step) on a NaN loss.
 * Several ranks first check that they all start from the same state (step,
 * data cursor, shards, model, options that shape the collectives): an
 * error names the first rank that differs from rank 0 and how. */
sd_status sd_train_run(sd_trainer *tr, volatile sig_atomic_t *stop, sd_error *err);

/* ZeRO-1 around checkpoints: every rank's shard gathered into whole m and
 * v on rank 0 (collective; the others only send), and those freed again;
 * both do nothing without zero1. A resume fills the shards straight from
 * the state file's whole moments (sd_train_moments_from). */
sd_status sd_train_moments_full(sd_trainer *tr, sd_error *err);
void sd_train_moments_shard(sd_trainer *tr);
void sd_train_moments_from(sd_trainer *tr, const void *m, const void *v, int src_dt);
/* n moment values of dtype src_dt into dst of dtype dst_dt (SD_DT_F32 or
 * SD_DT_BF16): copied, widened exactly, or rounded to nearest. */
void sd_train_moments_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n);

/* Checkpoints (ckpt_save.c, ckpt_resume.c): out_dir/checkpoint-<step>/
 * with unet/ and state.safetensors, and out_dir/latest naming the newest. */
sd_status sd_train_save(sd_trainer *tr, sd_error *err);
/* Continue from a checkpoint directory, or from out_dir/latest when dir is
 * an output directory. The model and data options must be the ones the
 * checkpoint was made with (the state records them). */
sd_status sd_train_resume(sd_trainer *tr, const char *dir, sd_error *err);
/* The JSONL metrics file (metrics_file.c), opened for appending; the lines
 * after step keep_through (a resumed run's checkpoint step; -1 for a new
 * run: all) are first moved to PATH.superseded, so each step is in the
 * file once, from the run that wrote it last. */
sd_status sd_metrics_open(const char *path, long keep_through, FILE **out, sd_error *err);
/* Before any training: -o is created and a file can be written in it, so
 * an unusable output is found now, not at the first save. */
sd_status sd_train_check_output(const char *out, sd_error *err);
/* The run's hold on -o against a second trainer writing there: it lasts
 * while *fd is open (sd-train closes it when the run ends; the kernel
 * drops it however the process ends). */
sd_status sd_train_lock_output(const char *out, int *fd, sd_error *err);
/* The step of out's newest whole checkpoint-N below step `below`
 * (LONG_MAX: any), -1 when there is none. */
long sd_train_newest_checkpoint(const char *out, long below);
/* Warn about the options a resumed run changes (resume_diff.c): those of
 * the checkpoint's train_config.json that differ in run_config_json. */
void sd_train_resume_diff(const char *ckpt_config_path, const char *run_config_json);

#endif
