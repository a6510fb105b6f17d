/* sd-train: train the SD/SDXL UNet on latent shards. This file is the
 * command line only; the work is in trainer/. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dist.h"
#include "dtype.h"
#include "err.h"
#include "log.h"
#include "mem_plan.h"
#include "model_dir.h"
#include "pool.h"
#include "safetensors.h"
#include "train.h"

static volatile sig_atomic_t stop_flag;

/* SIGINT/SIGTERM: the first asks the loop to finish the step, save and
 * exit (the loop says so; a handler may not log); a second quits at once
 * with 128 + the signal (130 for Ctrl-C). That is safe mid-save: a
 * checkpoint is written into checkpoint-N.tmp and renamed into place,
 * latest rewritten (temp + rename) after it, so the last complete one
 * stays named. Under mpirun each rank quits on its own second signal, and
 * the launcher ends the others; only rank 0 writes checkpoints. */
static void on_signal(int sig)
{
    static const char again[] = "sd-train: interrupted again: quitting now (checkpoints already written stay)\n";
    if (stop_flag) {
        ssize_t w = write(STDERR_FILENO, again, sizeof again - 1);
        (void)w;
        _exit(128 + sig);
    }
    stop_flag = 1;
}

/* The model line: where the weights come from (after a resume, the
 * checkpoint, whatever --unet or --unet-config named) and the parameter
 * count as diffusers gives it. */
static void log_model(const sd_trainer *tr, int resumed)
{
    sd_log(SD_LOG_INFO, "UNet %s, %zu parameters; %zu records in %zu buckets",
           resumed ? "from the checkpoint" : tr->unet.layout, sd_train_param_count(tr), tr->data.nitems,
           tr->data.nbuckets);
    /* bf16 weights take 2 bytes each; a fused backward keeps one op's gradients, not the model's */
    double wbytes = (double)tr->unet.w.total * (tr->o.weight_dtype == SD_DT_BF16 ? 2 : 4);
    char grads[64];
    if (tr->o.fused_backward) snprintf(grads, sizeof grads, "one op's at a time (--fused-backward)");
    else if (tr->o.zero2)
        snprintf(grads, sizeof grads, "%.1f MiB (this rank's share, --zero2)", (double)tr->z2own * 4 / (1 << 20));
    else if (tr->g16) snprintf(grads, sizeof grads, "%.1f MiB (bf16)", (double)tr->unet.w.total * 2 / (1 << 20));
    else snprintf(grads, sizeof grads, "%.1f MiB", (double)tr->unet.w.total * 4 / (1 << 20));
    sd_log(SD_LOG_INFO, "memory: weights %.1f MiB (%s), gradients %s, optimizer state (%s) %.1f MiB%s",
           wbytes / (1 << 20), tr->o.weight_dtype == SD_DT_BF16 ? "bf16" : "fp32", grads,
           sd_optimizer_name(tr->o.optimizer), (double)sd_train_optimizer_bytes(tr) / (1 << 20),
           tr->ema ? "; EMA 4 bytes per weight" : "");
}

/* Whether out/latest exists (a run to resume). */
static int has_latest(const char *out)
{
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/latest", out);
    return stat(p, &sb) == 0;
}

/* An error on one rank of several: every rank stops (MPI_Abort), the
 * message names the rank. Alone, the usual exit code. */
static int fail_all(int code)
{
    if (sd_dist_world() > 1) {
        fprintf(stderr, "sd-train: rank %d of %d failed: stopping all ranks\n", sd_dist_rank(), sd_dist_world());
        fflush(stderr);
        sd_dist_abort(code);
    }
    sd_dist_finalize();
    return code;
}

/* --memory-plan: the plan on stdout (rank 0), nothing trained. */
static int print_plan(const sd_train_opts *o, const sd_host_mem *host)
{
    sd_mem_plan p;
    sd_error err = {0};
    sd_status st = sd_mem_plan_from_opts(o, host, &p, &err);
    if (st) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        /* an option the shards cannot take (--masked-loss without masks) is refused as the run refuses it */
        return fail_all(st == SD_EINVAL ? SD_EXIT_USAGE : SD_EXIT_FATAL);
    }
    if (sd_dist_rank() == 0) sd_mem_plan_json(&p, o, stdout);
    fflush(stdout);
    sd_dist_finalize();
    /* a script can test the exit code: 1 when the plan does not fit */
    return p.fits == 0 ? SD_EXIT_SKIPPED : SD_EXIT_OK;
}

/* Before the first step: a run whose plan does not fit stops now, with
 * the plan in the message, not with an out-of-memory kill an hour in. */
static sd_status check_plan(const sd_trainer *tr, const sd_host_mem *host, sd_error *err)
{
    sd_mem_plan p;
    sd_status rc = sd_mem_plan_trainer(tr, host, &p, err);
    if (rc || p.fits != 0) { /* fits, or nothing to hold it against */
        if (!rc)
            sd_log(SD_LOG_INFO, "memory plan: %.2f GiB at the largest bucket (%dx%d, batch %d) of %.2f GiB (%s)",
                   (double)p.total / (1 << 30), p.width, p.height, p.batch, (double)p.limit / (1 << 30), p.limit_from);
        return rc;
    }
    char *json = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&json, &len);
    if (f) {
        sd_mem_plan_json(&p, &tr->o, f);
        fclose(f);
    }
    if (json && len) json[len - 1] = 0; /* the newline */
    sd_log(SD_LOG_ERROR, "memory plan: %s", json ? json : "(no memory to print it)");
    free(json);
    return sd_err_set(err, SD_ENOMEM, "the memory plan above does not fit: %.2f GiB at the largest bucket (%dx%d, "
                      "batch %d) against %.2f GiB (%s); stopped before the first step. A smaller --batch with "
                      "--accum, --gradient-checkpointing, --weight-dtype bf16, --grad-dtype bf16, --optimizer adamw8bit or "
                      "adafactor "
                      "need less (sd-train --memory-plan shows what each takes)",
                      (double)p.total / (1 << 30), p.width, p.height, p.batch, (double)p.limit / (1 << 30),
                      p.limit_from);
}

/* The target the UNet learns: --prediction, or else what the model
 * folder's scheduler says (SD 2.x 768-v models are v-prediction, and
 * training them on the epsilon target fails silently), or else epsilon.
 * A --prediction that contradicts the scheduler is kept, with a warning.
 * NULL when fine; else the usage error, in buf when it needs one. */
static const char *pick_prediction(const char *given, const char *unet, sd_prediction *out, char *buf, size_t cap)
{
    char found[64], from[600];
    sd_error err = {0};
    if (unet && sd_model_prediction(unet, found, sizeof found, from, sizeof from, &err)) {
        snprintf(buf, cap, "%.690s", err.msg); /* buf holds 700 */
        return buf;
    }
    if (!unet) found[0] = 0;
    const char *name = given ? given : found[0] ? found : "epsilon";
    if (strcmp(name, "epsilon") == 0) *out = SD_PRED_EPSILON;
    else if (strcmp(name, "v_prediction") == 0 || strcmp(name, "v") == 0) *out = SD_PRED_V;
    else if (given) return "--prediction: epsilon or v_prediction";
    else {
        snprintf(buf, cap, "%s: prediction_type '%s' is not one sd-train trains (epsilon or v_prediction); give --prediction",
                 from, found);
        return buf;
    }
    if (given && found[0] && strcmp(found, sd_prediction_name(*out)) != 0)
        sd_log(SD_LOG_WARN, "--prediction %s, but %s says %s", given, from, found);
    else if (!given && found[0])
        sd_log(SD_LOG_INFO, "prediction %s (from %s)", found, from);
    return NULL;
}

/* Before the run's first collective: a rank whose options were refused
 * (or that printed --help) would leave the others waiting in it for the
 * whole hung-peer timeout. Every rank passes here exactly once, going on
 * (code < 0) or not, and learns whether all go on. Returns -1 to go on,
 * else the exit code: this rank's own, or 2 where another rank stopped. */
static int agree_to_start(int code)
{
    if (sd_dist_world() <= 1) return code;
    int all = 1;
    sd_error e = {0};
    if (sd_dist_all_ok(code < 0, &all, &e)) {
        fprintf(stderr, "sd-train: %s\n", e.msg);
        return SD_EXIT_FATAL;
    }
    if (code < 0 && !all) {
        fprintf(stderr, "sd-train: rank %d of %d: another rank's options were refused (its message says why): "
                "stopping\n", sd_dist_rank(), sd_dist_world());
        return SD_EXIT_USAGE;
    }
    return code;
}

/* The sample options: a readable prompts file and a model to condition
 * them (the --unet folder must then hold a text encoder); NULL when fine,
 * else the usage error (in buf). Options that need --sample-prompts are
 * warned about without it. */
static const char *check_samples(const sd_train_opts *o, char *buf, size_t cap)
{
    if (o->sample_every < 0) return "--sample-every must not be negative";
    if (!o->sample_prompts) {
        if (o->sample_every || o->sample_model || o->sample_tokenizer)
            sd_log(SD_LOG_WARN, "--sample-every, --sample-model and --sample-tokenizer do nothing without "
                   "--sample-prompts");
        return NULL;
    }
    if (access(o->sample_prompts, R_OK) != 0) {
        snprintf(buf, cap, "--sample-prompts %s: %s", o->sample_prompts, strerror(errno));
        return buf;
    }
    char te[4200];
    snprintf(te, sizeof te, "%s/text_encoder", o->unet ? o->unet : "");
    const char *model = o->sample_model ? o->sample_model : o->base_model;
    if (!model && !(o->unet && sd_is_dir(te)))
        return "--sample-prompts needs a model with a text encoder and a VAE to make the images: --sample-model PATH "
               "(the --unet folder holds no text_encoder/)";
    if (model && access(model, F_OK) != 0) {
        snprintf(buf, cap, "%s %s: %s", o->sample_model ? "--sample-model" : "--base-model", model, strerror(errno));
        return buf;
    }
    if (model && !sd_is_dir(model) && !o->sample_tokenizer) {
        snprintf(buf, cap, "%s %s: a single-file checkpoint needs --sample-tokenizer DIR (a folder holding "
                 "tokenizer/) to condition the samples", o->sample_model ? "--sample-model" : "--base-model", model);
        return buf;
    }
    return NULL;
}

/* This process's rank among those on its machine, from the launcher's
 * environment (Open MPI, SLURM, MPICH), so that "--device cuda" under
 * mpirun or srun gives each process its own GPU; 0 when launched alone. */
static int local_rank(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/* Options to sd_train_opts, join the MPI world when launched by mpirun or
 * srun, open, resume when -o has a checkpoint, run. */
int main(int argc, char **argv)
{
    sd_error derr = {0};
    if (sd_dist_init(&argc, &argv, &derr)) {
        fprintf(stderr, "sd-train: %s\n", derr.msg);
        return SD_EXIT_FATAL;
    }
    sd_train_opts o;
    sd_train_opts_default(&o);
    const char *pred = NULL, *sched = "constant", *dtype = "fp32", *resume = NULL, *device = "cpu";
    const char *mixed = "no", *moments = "fp32", *optimizer = "adamw", *wdtype = "fp32",
               *gdtype = "fp32";
    const char *config_file = NULL; /* read by sd_cli_expand; listed for --help */
    sd_strlist sets = {0};
    long batch = 1, accum = 1, steps = 1000, warmup = 0, save_every = 0, keep = 2, threads = 0, seed = 0,
         init_seed = 0, epochs = 0, t_min = 0, t_max = SD_DDPM_STEPS;
    double lr = 1e-4, gpu_mem_gib = 0, host_mem_gib = 0;
    int quiet = 0, verbose = 0, fresh = 0, memory_plan = 0;
    sd_host_mem host; /* before anything of the model's size: the process's own footprint */
    sd_host_mem_read(&host);
    const sd_opt opts[] = {
        {"config", 0, SD_OPT_STR, &config_file, "FILE",
         "options from a JSON file: long names as keys, or grouped (\"optimizer\": {\"lr\": 1e-5}); the command "
         "line overrides it; every checkpoint has the effective one as train_config.json, which --config reads back"},
        {"set", 0, SD_OPT_LIST, &sets, "KEY=VALUE", "override one option last, dotted keys allowed (optimizer.lr=1e-5)"},
        {"unet", 0, SD_OPT_STR, &o.unet, "PATH", "the UNet to train: a diffusers model or unet/ folder, or a .safetensors file"},
        {"unet-config", 0, SD_OPT_STR, &o.unet_config, "FILE",
         "a diffusers UNet config.json: for a single file without one (in its metadata, as --save-single writes), "
         "or alone to train a new model from scratch"},
        {"init-seed", 0, SD_OPT_INT, &init_seed, "N", "seed of a new model's random weights (default 0)"},
        {"output", 'o', SD_OPT_STR, &o.out_dir, "DIR", "checkpoints go to DIR/checkpoint-STEP, DIR/latest names the newest"},
        {"resume", 0, SD_OPT_STR, &resume, "DIR",
         "continue from a checkpoint (or DIR/latest); by default a run continues from -o DIR/latest when present"},
        {"fresh", 0, SD_OPT_FLAG, &fresh, NULL, "start over even when -o DIR has a checkpoint"},
        {"batch", 'b', SD_OPT_INT, &batch, "N", "samples per micro-batch, all of one bucket (default 1)"},
        {"accum", 0, SD_OPT_INT, &accum, "N", "micro-batches per optimizer step (default 1)"},
        {"steps", 0, SD_OPT_INT, &steps, "N", "optimizer steps to train to (default 1000)"},
        {"epochs", 0, SD_OPT_INT, &epochs, "N",
         "train N passes over the shards instead: the steps become N x (each bucket's records / batch, rounded up "
         "per bucket with --no-carry) / (ranks x accumulation), rounded up; overrides --steps, and the LR "
         "schedule spans them"},
        {"lr", 0, SD_OPT_DOUBLE, &lr, "X", "learning rate (default 1e-4)"},
        {"lr-schedule", 0, SD_OPT_STR, &sched, "NAME", "constant (default), constant_with_warmup, cosine or linear"},
        {"warmup", 0, SD_OPT_INT, &warmup, "N", "warmup steps of the schedule (default 0)"},
        {"optimizer", 0, SD_OPT_STR, &optimizer, "NAME",
         "adamw (default: torch's AdamW), adamw8bit (bitsandbytes' AdamW8bit: both moments 8-bit in blocks of 256, "
         "about 2 bytes per weight instead of 8; tensors under 4096 values keep fp32 moments) or adafactor "
         "(transformers' Adafactor with relative_step, scale_parameter and warmup_init off at --lr: a factored "
         "second moment for matrices and conv kernels, no first moment unless --adafactor-beta1); --beta1, --beta2 "
         "and --adam-eps are AdamW's and AdamW8bit's, --weight-decay every optimizer's; CPU or --device cuda (the CUDA "
         "kernels have not run on a GPU yet: sd-selftest --device cuda:0 checks them); under --zero1/--zero2 on CPU "
         "or GPU ranks, shared by whole tensors. Example: "
         "--optimizer adafactor --weight-dtype bf16 --device cuda:0"},
        {"adafactor-beta1", 0, SD_OPT_DOUBLE, &o.adafactor_beta1, "X",
         "--optimizer adafactor: keep a first moment with this beta1 (default none, as transformers)"},
        {"beta1", 0, SD_OPT_DOUBLE, &o.adam.beta1, "X", "AdamW beta1 (default 0.9)"},
        {"beta2", 0, SD_OPT_DOUBLE, &o.adam.beta2, "X", "AdamW beta2 (default 0.999)"},
        {"adam-eps", 0, SD_OPT_DOUBLE, &o.adam.eps, "X", "AdamW epsilon (default 1e-8)"},
        {"weight-decay", 0, SD_OPT_DOUBLE, &o.adam.weight_decay, "X", "weight decay of every --optimizer (default 1e-2, as diffusers' train_text_to_image.py; transformers' Adafactor defaults to 0: give --weight-decay 0 to match it)"},
        {"adam-moments", 0, SD_OPT_STR, &moments, "T",
         "store the AdamW moments as fp32 (default) or bf16: 4 bytes less per weight (3.4 GB for SD 1.5, 10.3 GB "
         "for SDXL, on the GPU with --device cuda); updated in fp32, stored with stochastic rounding"},
        {"weight-dtype", 0, SD_OPT_STR, &wdtype, "T",
         "hold the trainable weights as fp32 (default) or bf16: 2 bytes less per weight, no fp32 copy (the model "
         "is loaded or initialised straight into bf16, each value rounded to nearest; each op widens its own "
         "weights just before it runs); the update is computed in fp32 and stored with stochastic "
         "rounding from a seeded stream (exact resume); every --optimizer. bf16: one process (CPU or --device "
         "cuda) so far; the EMA stays fp32. Example: --weight-dtype bf16 --optimizer "
         "adamw8bit"},
        {"grad-dtype", 0, SD_OPT_STR, &gdtype, "T",
         "hold the whole-model gradient buffer as fp32 (default) or bf16: 2 bytes less per parameter (SDXL: 4.78 "
         "GiB less). Each op's parameter gradients are computed in an fp32 scratch of the largest op's size and "
         "added into the bf16 buffer with stochastic rounding keyed by seed, step and micro-batch (unbiased over "
         "--accum, exact resume); the update widens one tensor at a time. Any --optimizer and --weight-dtype, "
         "--accum, global or per-tensor clipping. CPU, one process; not with --fused-backward (which keeps no "
         "buffer). Example: sd-train --unet-config SDXL.json --weight-dtype bf16 --grad-dtype bf16 --optimizer "
         "adamw8bit --gradient-checkpointing --accum 4 -o out shard"},
        {"max-grad-norm", 0, SD_OPT_DOUBLE, &o.max_grad_norm, "X", "clip the global gradient norm (default 1; 0: off)"},
        {"ema-decay", 0, SD_OPT_DOUBLE, &o.ema_decay, "X",
         "keep an EMA of the weights (diffusers EMAModel; 0.9999 is usual; default off), saved as unet_ema/"},
        {"ema-every", 0, SD_OPT_INT, &o.ema_every, "N", "update the EMA every N steps (default 1)"},
        {"ema-on-cpu", 0, SD_OPT_FLAG, &o.ema_host, NULL,
         "with --device cuda: keep the EMA in host memory, saving a copy of the weights on the GPU; each update "
         "copies the weights over (use --ema-every to do that less often)"},
        {"prediction", 0, SD_OPT_STR, &pred, "T",
         "epsilon or v_prediction (default: the model folder's scheduler/scheduler_config.json, else epsilon)"},
        {"snr-gamma", 0, SD_OPT_DOUBLE, &o.snr_gamma, "X", "min-SNR-gamma loss weighting (5 is usual; default off)"},
        {"noise-offset", 0, SD_OPT_DOUBLE, &o.noise_offset, "X", "noise offset (default 0)"},
        {"input-perturbation", 0, SD_OPT_DOUBLE, &o.input_perturbation, "X",
         "diffusers' input perturbation: the noisy latents are made from noise + X * N(0, 1), the target from the "
         "noise alone (0.1 is usual; default off; training only, not validation)"},
        {"min-timestep", 0, SD_OPT_INT, &t_min, "N",
         "draw training and validation timesteps from [N, --max-timestep) only (default 0), as kohya's option"},
        {"max-timestep", 0, SD_OPT_INT, &t_max, "N", "the end of that range, exclusive (default 1000)"},
        {"zero-terminal-snr", 0, SD_OPT_FLAG, &o.zero_terminal_snr, NULL,
         "rescale the noise schedule to zero terminal SNR (diffusers' rescale_betas_zero_snr): the last timestep is "
         "pure noise; for v-prediction models trained that way (with epsilon prediction a warning, with --snr-gamma "
         "refused)"},
        {"dropout", 0, SD_OPT_DOUBLE, &o.dropout, "P",
         "probability of training on the shard's empty-caption embedding (default 0). A record with caption "
         "variants (sd-meta --caption-variants) trains on one of them per epoch, drawn uniformly from the seed, the "
         "epoch and the record (resume keeps the draws); validation uses its caption"},
        {"no-flip", 0, SD_OPT_FLAG, &o.no_flip, NULL, "never use the cached flipped latents"},
        {"masked-loss", 0, SD_OPT_FLAG, &o.masked_loss, NULL,
         "weight each latent pixel's squared error by the record's loss mask (sd-latents --masks, or an imported "
         "kohya alpha_mask), reduced to the latent size as sd-scripts' --masked_loss does (the mean of each 8x8 "
         "block) and mirrored for a flipped sample; a record without a mask weighs 1 everywhere (the plain loss: "
         "warned at the start with their count); shards where no record has a mask are refused (exit 2). "
         "Validation stays plain MSE"},
        {"no-carry", 0, SD_OPT_FLAG, &o.no_carry, NULL,
         "let a bucket's last batch of an epoch run short (by default it is filled with the first records of the "
         "bucket's next-epoch shuffle, so every batch is full, except in a bucket with fewer records than "
         "--batch, which gives one short batch an epoch)"},
        {"allow-mixed", 0, SD_OPT_FLAG, &o.allow_mixed, NULL, "train on shards made with different VAEs or text encoder setups (dropout then uses the empty caption of the first shard that names one and holds it); shards of two caption lengths (sd-latents --max-tokens) stay refused"},
        {"seed", 0, SD_OPT_INT, &seed, "N", "seed of data order, timesteps and noise (default 0)"},
        {"save-every", 0, SD_OPT_INT, &save_every, "N", "checkpoint every N steps (default: at the end only)"},
        {"keep", 0, SD_OPT_INT, &keep, "N", "checkpoints kept (default 2; 0 keeps all), with their samples; the "
         "--sample-every folders (DIR/samples/step-N) before the oldest checkpoint kept go too"},
        {"save-dtype", 0, SD_OPT_STR, &dtype, "T", "unet/ weights as fp32 (default), fp16 or bf16"},
        {"save-single", 0, SD_OPT_FLAG, &o.save_single, NULL,
         "also write each checkpoint's UNet (and EMA UNet) as one safetensors file with the original "
         "model.diffusion_model.* names, as UIs load a UNet alone, and its config.json in the file's metadata"},
        {"save-full", 0, SD_OPT_FLAG, &o.save_full, NULL,
         "also write each checkpoint as full.safetensors (and full_ema.safetensors with an EMA): the UNet, the VAE "
         "and the text encoder(s) in one file with the original names (ldm for SD 1.x/2.x, sgm for SDXL) and "
         "--save-dtype, as A1111, Forge and ComfyUI load a model; the VAE and text encoders come from --base-model"},
        {"base-model", 0, SD_OPT_STR, &o.base_model, "PATH",
         "the model --save-full takes the VAE and text encoder(s) from: a diffusers folder or a single-file "
         "checkpoint (default: the --unet model)"},
        {"metrics", 0, SD_OPT_STR, &o.metrics, "FILE", "append one JSON line per step (a resume first moves later steps' lines to FILE.superseded)"},
        {"tensorboard", 0, SD_OPT_STR, &o.tensorboard, "DIR",
         "write TensorBoard event files there (loss, smoothed loss, lr, gradient norm, validation loss): "
         "tensorboard --logdir DIR"},
        {"sample-prompts", 0, SD_OPT_STR, &o.sample_prompts, "FILE.jsonl",
         "render these prompts while training: sd-sample's JSONL lines (prompt, negative, seed, steps, cfg, sampler, "
         "width, height; defaults \"\", \"\", 0, 20, 7, dpmpp_2m, the model's size), each with its line's fixed seed, so "
         "the images of two steps compare; at each checkpoint (or every --sample-every steps) and at the end, not "
         "after a stop request; with the EMA weights too when --ema-decay is given. Into checkpoint-N/samples/NNNNN.png "
         "(and samples-ema/) at a checkpoint step, else DIR/samples/step-N/ (and DIR/samples-ema/step-N/), NNNNN the "
         "line's 0-based number, with A1111's parameters text; and as TensorBoard images with --tensorboard. The "
         "prompts are encoded at the shards' caption length (sd-latents --max-tokens 75/150/225, chunked as it "
         "chunks captions). When --keep removes a checkpoint, the DIR/samples/step-N folders before the oldest checkpoint kept go with it. A bad "
         "line or a failed image is a warning and counted; training goes on, the same as without samples"},
        {"sample-every", 0, SD_OPT_INT, &o.sample_every, "N", "render the samples every N steps (default: at each checkpoint)"},
        {"sample-model", 0, SD_OPT_STR, &o.sample_model, "PATH",
         "the model whose text encoder(s) condition the prompts (once, at the start; then freed) and whose VAE "
         "decoder makes the images (kept): a diffusers folder, or a single file with --sample-tokenizer, as "
         "sd-sample's --model (default: --base-model when given, else the --unet folder)"},
        {"sample-tokenizer", 0, SD_OPT_STR, &o.sample_tokenizer, "DIR",
         "a folder holding tokenizer/ (SDXL: and tokenizer_2/) for a single-file --sample-model (or --base-model)"},
        {"threads", 'j', SD_OPT_INT, &threads, "N", "CPU threads (default: all CPUs)"},
        {"device", 0, SD_OPT_STR, &device, "DEV",
         "cpu (default) or cuda:K: the UNet, clipping, AdamW and the EMA on GPU K (weights and moments come back "
         "to the host only for checkpoints); plain cuda under mpirun/srun takes the GPU of the process's local rank"},
        {"tf32", 0, SD_OPT_FLAG, &o.tf32, NULL, "allow TF32 tensor cores on the GPU (faster, ~1e-3 relative error)"},
        {"mixed-precision", 0, SD_OPT_STR, &mixed, "T",
         "no (default) or bf16: on the GPU every convolution, linear layer and attention product takes bf16 "
         "copies of its inputs (tensor cores, fp32 accumulation, as torch.autocast); weights, optimizer state "
         "(unless --adam-moments bf16), activations and gradients are stored in fp32 (convolutions' outputs and gradients come out of cuDNN in "
         "16 bits and are widened). fp16 is refused: it needs loss scaling, which sd-train does not do"},
        {"gpu-memory-limit", 0, SD_OPT_DOUBLE, &gpu_mem_gib, "GIB",
         "GPU: hold at most this much device memory in sdtk's allocator (weights, optimizer, activations, "
         "scratch; the CUDA libraries' own few hundred MiB come on top), as on a smaller card: to see whether a "
         "run fits one, or to share a GPU (default: what the device has)"},
        {"memory-plan", 0, SD_OPT_FLAG, &memory_plan, NULL,
         "print the memory plan as one JSON object on stdout and exit without training: bytes of weights, "
         "gradients, optimizer, ema, activations (the largest bucket of the shards at --batch, with or without "
         "--gradient-checkpointing), workspace (op scratch; cuDNN's cap on a GPU), process (CPU: the process "
         "itself), samples (with --sample-prompts: the VAE decoder, the conditioning and a sample step's buffers "
         "at the largest line's size, on top of the training's) and total, the bucket, and fits (true/false; null with no limit to hold it against) against "
         "--gpu-memory-limit, the device, --host-memory-limit or the host's available memory; from the "
         "allocator's own arithmetic. Exit 1 when it does not fit. --unet-config "
         "alone allocates no weights (no -o needed). A run that would not fit stops before its first step with "
         "this plan in the message"},
        {"host-memory-limit", 0, SD_OPT_DOUBLE, &host_mem_gib, "GIB",
         "CPU: the memory plan must fit in this many GiB (default: what the host has available plus the "
         "process); a run whose plan does not stops before its first step"},
        {"attn-flash", 0, SD_OPT_FLAG, &o.attn_flash, NULL,
         "GPU: attention on the flash kernel, which keeps no scores in memory, instead of cuBLAS with blocks of "
         "scores (up to 512 MiB of scratch; taken anyway when that memory cannot be had); slower"},
        {"gradient-checkpointing", 0, SD_OPT_FLAG, &o.checkpointing, NULL,
         "keep only each resnet's and transformer block's output and recompute the rest in the backward: far "
         "less activation memory for about one more forward pass per step; the same gradients bit for bit"},
        {"val", 0, SD_OPT_STR, &o.val_shard, "SHARD",
         "a shard of held-out records (e.g. one part of sd-pack split): its loss, with noise and timesteps fixed per "
         "record whatever the seed, at the start, every --val-every steps and at the end (log and metrics "
         "val_loss)"},
        {"val-every", 0, SD_OPT_INT, &o.val_every, "N", "validate every N steps (default: at each checkpoint)"},
        {"fused-backward", 0, SD_OPT_FLAG, &o.fused_backward, NULL,
         "apply each tensor's optimizer update as soon as the backward has its gradient, in a scratch of the "
         "largest op's size: no gradient buffer of the whole model (SDXL: 9.56 GiB less). --max-grad-norm then "
         "clips each tensor on its own (as kohya's fused path does; the same as --clip-per-tensor). One process "
         "(CPU or --device cuda), --accum 1 only. A non-finite loss stops before any update (the checkpoint holds the state "
         "before it); a non-finite gradient stops the run without saving (part of the model is updated). "
         "Example: sd-train --unet-config SDXL.json --weight-dtype bf16 --optimizer adafactor --fused-backward "
         "--gradient-checkpointing -o out shard"},
        {"clip-per-tensor", 0, SD_OPT_FLAG, &o.clip_per_tensor, NULL,
         "apply --max-grad-norm to each parameter tensor's own norm instead of the global norm (what "
         "--fused-backward does; the same final weights with or without it)"},
        {"zero1", 0, SD_OPT_FLAG, &o.zero1, NULL,
         "under mpirun: each rank keeps only its share of the AdamW moments (ZeRO stage 1: gradients "
         "reduce-scattered, AdamW on the own share, weights all-gathered), cutting their memory by the number of "
         "ranks; checkpoints still hold the whole state. adamw8bit and adafactor are shared by whole tensors "
         "(on a GPU each rank's device holds its tensors' state only). "
         "CPU ranks over MPI, GPU ranks (--device cuda) over NCCL (not yet run on a GPU)"},
        {"zero2", 0, SD_OPT_FLAG, &o.zero2, NULL,
         "under mpirun: --zero1 and the gradients sharded too (ZeRO stage 2): each tensor's gradient is "
         "reduce-scattered as soon as the backward has it, so a rank holds only its share of the gradients and "
         "AdamW moments and no gradient buffer of the model; --accum works, clipping is by the global norm, "
         "checkpoints hold the whole state (resumable by any world size, with or without it). fp32 weights; "
         "AdamW, adamw8bit or adafactor (the last two shared by whole tensors); CPU ranks over MPI (the same "
         "weights as --zero1), GPU ranks over NCCL (not yet run on a GPU). "
         "Example: mpirun -np 2 sd-train --zero2 --unet sd15/ -o run/ --batch 2 cache.shard"},
        {"nccl", 0, SD_OPT_FLAG, &o.nccl, NULL,
         "sum gradients over NCCL even with one process (a check of the path; several GPU ranks use NCCL whenever "
         "the build has it)"},
        {"quiet", 'q', SD_OPT_FLAG, &quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &verbose, NULL, "debug messages"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-train", "[OPTIONS] (--unet PATH | --unet-config FILE) -o DIR SHARD...",
                  "Train a Stable Diffusion UNet on latent shards (sd-latents): batches of one bucket at a time, "
                  "latents drawn from the cached mean and std, DDPM noise at uniform timesteps, MSE on the epsilon "
                  "or v target, AdamW with fp32 master weights, gradient accumulation and clipping, as diffusers' "
                  "train_text_to_image.py does. Checkpoints are diffusers unet/ folders plus the training state; a "
                  "killed run resumes exactly where its last checkpoint was. SHARD@N trains each of SHARD's records "
                  "N times an epoch (1..10000; kohya's N_name folder repeats, e.g. subject@10 reg@1).",
                  opts,
                  "Examples:\n"
                  "  sd-train --unet sd15/ -o run/ --batch 4 --lr 1e-5 --save-every 500 cache-*.shard\n"
                  "  sd-train --unet-config tiny/config.json -o run/ --steps 300 cache.shard   # from scratch\n"
                  "  sd-train --unet sd15/ -o run/ --save-full --save-dtype fp16 cache.shard   # + one file for A1111\n"
                  "  sd-train --unet sd15/ -o run/ --epochs 10 subject.shard@10 reg.shard   # kohya-style repeats\n"
                  "  sd-train --unet sd15/ -o run/ --masked-loss masked.shard   # sd-latents --masks, or kohya alpha_mask\n"
                  "  sd-train --config run/checkpoint-500/train_config.json --set optimizer.lr=5e-6 cache-*.shard\n"
                  "  sd-train --unet sd15/ -o run/ --save-every 500 --ema-decay 0.9999 --sample-prompts prompts.jsonl "
                  "--tensorboard tb/ cache.shard   # run/checkpoint-500/samples/00000.png ...\n"
                  "  prompts.jsonl:  {\"prompt\": \"a photo of sks dog\", \"negative\": \"blurry\", \"seed\": 1, "
                  "\"steps\": 20, \"cfg\": 7, \"sampler\": \"euler_a\", \"width\": 512, \"height\": 512}\n"
                  "  mpirun -np 8 sd-train --device cuda --unet sd15/ -o run/ --batch 4 cache-*.shard   # 8 GPUs\n"
                  "  sd-train --unet-config sdxl-unet.json --memory-plan --gradient-checkpointing "
                  "--optimizer adafactor cache.shard   # bytes it needs, no weights allocated\n"
                  "  sd-train --memory-plan --device cuda:0 --gpu-memory-limit 24 --unet sd15/ --batch 8 cache.shard   "
                  "# fits a 24 GB card?\n",
        "0 ok (also when SIGINT/SIGTERM stopped the run after saving), 1 --memory-plan: the plan does not fit, "
        "2 usage error, 3 fatal error (a non-finite loss included; also a run whose memory plan does not fit, "
        "stopped before its first step)."};
    sd_strlist pos = {0};
    sd_cli_args args;
    int rc = sd_cli_expand(&cli, argc, argv, &args);
    if (rc >= 0) {
        rc = agree_to_start(rc);
        sd_dist_finalize();
        return rc;
    }
    rc = sd_cli_parse(&cli, args.argc, args.argv, &pos);
    if (rc >= 0) {
        sd_cli_args_free(&args);
        sd_strlist_free(&pos);
        rc = agree_to_start(rc);
        sd_dist_finalize();
        return rc;
    }
    /* rank 0 logs; the others only warn, their rank in the prefix */
    int rank = sd_dist_rank(), world = sd_dist_world();
    char who[48];
    snprintf(who, sizeof who, rank ? "sd-train[rank %d]" : "sd-train", rank);
    if (rank) quiet = 1;
    sd_log_setup(who, quiet ? SD_LOG_WARN : verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    const char *bad = NULL;
    char bad_buf[700];
    if (pos.n < 1) bad = "no shards to train on";
    else if (!o.out_dir && !memory_plan) bad = "no output directory (-o DIR)";
    else if (!o.unet && !o.unet_config) bad = "no model (--unet PATH or --unet-config FILE)";
    else if (batch < 1 || batch > 4096 || accum < 1 || accum > 4096) bad = "--batch and --accum: 1..4096";
    else if (steps < 0 || warmup < 0 || save_every < 0 || keep < 0 || seed < 0 || init_seed < 0 || threads < 0 ||
             epochs < 0)
        bad = "counts and seeds must not be negative";
    else if (threads > 1024) bad = "--threads: 0..1024";
    else if (epochs > 1000000000) bad = "--epochs: at most 1000000000";
    else if (!(lr >= 0 && isfinite(lr)) || !(o.dropout >= 0 && o.dropout <= 1) ||
             !(o.snr_gamma >= 0 && isfinite(o.snr_gamma)) || !(o.noise_offset >= 0 && isfinite(o.noise_offset)) ||
             !(o.input_perturbation >= 0 && isfinite(o.input_perturbation)))
        bad = "--lr, --snr-gamma, --noise-offset, --input-perturbation must be finite and >= 0 and --dropout in [0, 1]";
    else if (!(o.ema_decay >= 0 && o.ema_decay < 1) || o.ema_every < 1) bad = "--ema-decay in [0, 1), --ema-every >= 1";
    else if (!(o.adam.beta1 >= 0 && o.adam.beta1 < 1) || !(o.adam.beta2 >= 0 && o.adam.beta2 < 1))
        bad = "--beta1 and --beta2 in [0, 1)"; /* beta 1 divides by zero in the bias correction */
    else if (!(o.adam.eps >= 0 && isfinite(o.adam.eps)) ||
             !(o.adam.weight_decay >= 0 && isfinite(o.adam.weight_decay)) ||
             !(o.max_grad_norm >= 0 && isfinite(o.max_grad_norm)))
        bad = "--adam-eps, --weight-decay and --max-grad-norm must be finite and >= 0";
    else bad = pick_prediction(pred, o.unet, &o.pred, bad_buf, sizeof bad_buf);
    if (!bad && o.save_full && !o.unet && !o.base_model)
        bad = "--save-full with a new model (--unet-config) needs --base-model PATH for the VAE and text encoders";
    if (!bad && o.base_model && !o.save_full) bad = "--base-model is what --save-full reads: give --save-full too";
    if (!bad && sd_cli_parse_device(device, &o.device)) bad = "--device: cpu, cuda or cuda:K";
    if (!bad && strcmp(device, "cuda") == 0) o.device = local_rank();
    if (!bad && o.nccl && o.device < 0) bad = "--nccl sums GPU gradients: it needs --device cuda or cuda:K";
    if (!bad && sd_cli_parse_mixed(mixed, &o.mixed)) bad = "--mixed-precision: no or bf16";
    if (!bad && o.mixed == SD_DT_F16)
        bad = "--mixed-precision fp16: fp16 gradients need loss scaling, which sd-train does not do; use bf16";
    if (!bad && o.mixed && o.device < 0) bad = "--mixed-precision is a GPU mode (the CPU computes in fp32)";
    if (!bad && sd_cli_gib_bytes(gpu_mem_gib, &o.gpu_mem_limit)) bad = "--gpu-memory-limit: GiB, 0 or more";
    if (!bad && o.gpu_mem_limit && o.device < 0) bad = "--gpu-memory-limit needs --device cuda or cuda:K";
    if (!bad && sd_cli_gib_bytes(host_mem_gib, &o.host_mem_limit)) bad = "--host-memory-limit: GiB, 0 or more";
    if (!bad && o.host_mem_limit && o.device >= 0)
        bad = "--host-memory-limit is the CPU's; a GPU run takes --gpu-memory-limit";
    if (!bad && o.val_every < 0) bad = "--val-every must not be negative";
    if (!bad) bad = check_samples(&o, bad_buf, sizeof bad_buf);
    if (!bad && fresh && resume) bad = "--fresh starts over and --resume continues: give one of them";
    if (!bad && !sd_lr_kind_parse(sched, &o.lr.kind))
        bad = "--lr-schedule: constant, constant_with_warmup, cosine or linear";
    if (!bad && (t_min < 0 || t_max > SD_DDPM_STEPS || t_min >= t_max))
        bad = "--min-timestep and --max-timestep: 0 <= min < max <= 1000";
    if (!bad && o.zero_terminal_snr && o.snr_gamma > 0 && o.pred == SD_PRED_EPSILON)
        bad = "--zero-terminal-snr with --snr-gamma needs --prediction v_prediction (the SNR is 0 at the last timestep)";
    if (!bad && strcmp(moments, "fp32") == 0) o.moments = SD_DT_F32;
    else if (!bad && strcmp(moments, "bf16") == 0) o.moments = SD_DT_BF16;
    else if (!bad) bad = "--adam-moments: fp32 or bf16";
    if (!bad && strcmp(wdtype, "fp32") == 0) o.weight_dtype = SD_DT_F32;
    else if (!bad && strcmp(wdtype, "bf16") == 0) o.weight_dtype = SD_DT_BF16;
    else if (!bad) bad = "--weight-dtype: fp32 or bf16";
    if (!bad && !sd_optimizer_parse(optimizer, &o.optimizer)) bad = "--optimizer: adamw, adamw8bit or adafactor";
    if (!bad && o.weight_dtype == SD_DT_BF16 && (o.zero1 || world > 1))
        bad = "--weight-dtype bf16 runs in one process only so far (no MPI or --zero1 path widens the weights yet)";
    if (!bad && o.adafactor_beta1 >= 0 && o.optimizer != SD_OPT_ADAFACTOR)
        bad = "--adafactor-beta1 is Adafactor's (--optimizer adafactor)";
    if (!bad && !(o.adafactor_beta1 < 1 && isfinite(o.adafactor_beta1)))
        bad = "--adafactor-beta1 in [0, 1)";
    if (!bad && o.optimizer != SD_OPT_ADAMW && o.moments != SD_DT_F32)
        bad = "--adam-moments bf16 is AdamW's: --optimizer adamw8bit and adafactor keep their own state";
    if (!bad && strcmp(gdtype, "fp32") == 0) o.grad_dtype = SD_DT_F32;
    else if (!bad && strcmp(gdtype, "bf16") == 0) o.grad_dtype = SD_DT_BF16;
    else if (!bad) bad = "--grad-dtype: fp32 or bf16";
    if (!bad) bad = sd_train_g16_refusal(&o);
    if (!bad && o.zero2) bad = sd_train_zero2_refusal(&o, world);
    if (!bad && o.fused_backward) bad = sd_train_fused_refusal(&o, accum);
    if (!bad && o.clip_per_tensor && o.zero1) bad = "--clip-per-tensor does not run with --zero1 so far";
    if (!bad && strcmp(dtype, "fp32") == 0) o.save_dtype = SD_ST_F32;
    else if (!bad && strcmp(dtype, "fp16") == 0) o.save_dtype = SD_ST_F16;
    else if (!bad && strcmp(dtype, "bf16") == 0) o.save_dtype = SD_ST_BF16;
    else if (!bad) bad = "--save-dtype: fp32, fp16 or bf16";
    if (bad && rank == 0) sd_cli_usage_error(&cli, "%s", bad); /* the same on every rank: said once */
    rc = agree_to_start(bad ? SD_EXIT_USAGE : -1);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        sd_cli_args_free(&args);
        sd_strlist_free(&sets);
        sd_dist_finalize();
        return rc;
    }
    /* accepted, but they would change nothing: say so rather than ignore them silently */
    if (warmup > 0 && o.lr.kind == SD_LR_CONSTANT)
        sd_log(SD_LOG_WARN, "--warmup %ld with the constant schedule does nothing; constant_with_warmup warms up", warmup);
    if (o.val_every > 0 && !o.val_shard) sd_log(SD_LOG_WARN, "--val-every without --val: there is nothing to validate");
    if (o.zero1 && world < 2)
        sd_log(SD_LOG_WARN, "--zero1 in one process shards nothing: the optimizer state stays whole (it shards under "
                            "mpirun -np N)");
    if (o.ema_every != 1 && o.ema_decay == 0) sd_log(SD_LOG_WARN, "--ema-every without --ema-decay: there is no EMA");
    if (o.ema_host && (o.device < 0 || o.ema_decay == 0))
        sd_log(SD_LOG_WARN, "--ema-on-cpu does nothing %s", o.ema_decay == 0 ? "without --ema-decay: there is no EMA"
                                                            : "on the CPU, where the EMA is in host memory anyway");
    if (o.zero_terminal_snr && o.pred == SD_PRED_EPSILON)
        sd_log(SD_LOG_WARN, "--zero-terminal-snr with epsilon prediction: at the last timestep the input is the noise "
               "itself; the schedule was made for v-prediction (--prediction v_prediction)");
    o.t_min = (int)t_min;
    o.t_max = (int)t_max;
    o.shards = pos.v;
    o.nshards = pos.n;
    o.batch = (int)batch;
    o.accum = (int)accum;
    o.max_steps = steps;
    o.lr.base = lr;
    o.lr.warmup = warmup;
    o.lr.total = steps;
    o.save_every = save_every;
    o.keep = (int)keep;
    o.seed = (uint64_t)seed;
    o.init_seed = (uint64_t)init_seed;
    o.threads = threads > 0 ? (int)threads : sd_default_threads();
    o.quiet = quiet;
    if (memory_plan) {
        sd_strlist_free(&sets);
        sd_cli_args_free(&args);
        rc = print_plan(&o, &host);
        sd_strlist_free(&pos);
        return rc;
    }
    /* the effective configuration, saved with every checkpoint */
    sd_buf cfg;
    sd_buf_init(&cfg);
    static const char *const run_control[] = {"resume", "fresh", NULL}; /* never replayed from the file */
    sd_cli_values_json(&cli, run_control, &cfg);
    if (cfg.len) cfg.len--; /* reopen the object for the shards */
    sd_buf_puts(&cfg, ", \"_shards\": [");
    for (int i = 0; i < pos.n; i++) {
        if (i) sd_buf_puts(&cfg, ", ");
        sd_buf_json_cstr(&cfg, pos.v[i]);
    }
    sd_buf_puts(&cfg, "]}\n");
    o.config_json = cfg.oom ? NULL : sd_buf_cstr(&cfg);

    sd_trainer tr;
    sd_error err = {0};
    char resume_buf[4200];
    /* an unusable -o is found now, not at the first save (rank 0 writes);
     * one made by the probe goes again if the shards or UNet are refused */
    struct stat out_sb;
    int out_made = rank == 0 && stat(o.out_dir, &out_sb) != 0, out_fd = -1;
    sd_status st = rank == 0 ? sd_train_check_output(o.out_dir, &err) : SD_OK;
    if (!st && rank == 0) st = sd_train_lock_output(o.out_dir, &out_fd, &err);
    if (!st && !resume && !fresh && !has_latest(o.out_dir)) {
        /* checkpoints without latest: a kill before the first latest was
         * written, or latest removed; starting over would replace them
         * (every rank decides, as each reads latest below) */
        long newest = sd_train_newest_checkpoint(o.out_dir, LONG_MAX);
        if (newest >= 0) {
            snprintf(resume_buf, sizeof resume_buf, "%s/checkpoint-%ld", o.out_dir, newest);
            resume = resume_buf;
            if (rank == 0)
                sd_log(SD_LOG_WARN, "%s has checkpoint-%ld but no 'latest' file: resuming from it, the newest whole "
                   "checkpoint there (--fresh starts a new run instead)", o.out_dir, newest);
        }
    }
    if (!st) st = sd_trainer_open(&tr, &o, &err);
    int code = SD_EXIT_FATAL;
    /* what the shards hold (variants, masks); --masked-loss without any mask is a usage error */
    if (!st && tr.have_data && sd_data_facts_report(&tr.data, o.shards, o.masked_loss, rank == 0, &err)) {
        sd_trainer_close(&tr);
        st = SD_EINVAL;
        code = SD_EXIT_USAGE;
    }
    if (st) {
        if (out_made) rmdir(o.out_dir); /* empty unless the probe failed there */
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        sd_strlist_free(&pos);
        sd_buf_free(&cfg);
        sd_cli_args_free(&args);
        sd_strlist_free(&sets);
        return fail_all(code);
    }
    if (!resume && !fresh && has_latest(o.out_dir)) resume = o.out_dir;
    if (resume) st = sd_train_resume(&tr, resume, &err);
    /* the shards are open and the cursor resumed: epochs turn into steps */
    if (!st && epochs > 0) sd_train_set_epochs(&tr, epochs);
    if (!st) {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        log_model(&tr, resume != NULL);
        st = check_plan(&tr, &host, &err);
    }
    if (!st) {
        if (world > 1)
            sd_log(SD_LOG_INFO, "%s: global batch %d x %d ranks x %d accumulation = %d samples per step",
                   sd_dist_transport(), o.batch, world, o.accum, o.batch * world * o.accum);
        st = sd_train_run(&tr, &stop_flag, &err);
    }
    if (!st && world > 1 && rank == 0)
        sd_log(SD_LOG_INFO, "gradient sum over %d ranks: %.3f s on rank 0 in this run (waiting for the others included)",
               world, sd_dist_sum_seconds());
    if (st) sd_log(SD_LOG_ERROR, "%s", err.msg);
    else if (stop_flag) sd_log(SD_LOG_INFO, "stopped at step %ld (checkpoint saved)", tr.step);
    /* several ranks: abort before closing, whose ncclCommDestroy could wait
     * for peers that never take part (fail_all does not return there) */
    if (st && world > 1) return fail_all(SD_EXIT_FATAL);
    sd_trainer_close(&tr);
    if (out_fd >= 0) close(out_fd); /* the hold on -o ends with the run */
    if (st && out_made) rmdir(o.out_dir); /* a bad --resume, --metrics...: a new -o goes if nothing is in it */
    sd_strlist_free(&pos);
    sd_buf_free(&cfg);
    sd_cli_args_free(&args);
    sd_strlist_free(&sets);
    if (st) return fail_all(SD_EXIT_FATAL);
    sd_dist_finalize();
    return SD_EXIT_OK;
}
