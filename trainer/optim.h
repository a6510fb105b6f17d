/* The optimizer over the flat parameter buffer: AdamW with fp32 master
 * weights and moments exactly as torch.optim.AdamW applies it (decoupled
 * weight decay first, then the bias-corrected Adam step), torch's
 * clip_grad_norm_ over all parameters, and diffusers' learning-rate
 * schedules (get_scheduler: constant, constant_with_warmup, cosine,
 * linear). The constants live here; the element-wise work is the backend
 * table's sum_squares / adamw / ema (ops_optim.c on the CPU: fixed chunks,
 * bit-identical for any thread count). */
#ifndef SDTK_TRAIN_OPTIM_H
#define SDTK_TRAIN_OPTIM_H

#include <stddef.h>

#include "ops_cpu.h"

typedef struct {
    double beta1, beta2, eps, weight_decay;
} sd_adamw_opts;

/* The constants of AdamW step number `step` (1-based, as torch counts) at
 * rate lr for a backend's adamw op: p *= 1 - lr wd; m, v updated; p -= lr
 * / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps), the gradient
 * scaled by gscale (the clipping factor) as it is read. */
sd_adamw_args sd_adamw_args_at(const sd_adamw_opts *o, double lr, long step, double gscale);
/* torch's clip_grad_norm_ factor: min(1, max_norm / (norm + 1e-6)); 1
 * without clipping (max_norm <= 0) or for a non-finite norm. */
double sd_clip_factor(double norm, double max_norm);

/* diffusers' EMAModel decay for its n-th update (1-based): 0 for the first,
 * then min(max_decay, (1 + k) / (10 + k)) with k = n - 1. */
double sd_ema_decay(double max_decay, long n);

typedef enum { SD_LR_CONSTANT = 0, SD_LR_CONSTANT_WARMUP, SD_LR_COSINE, SD_LR_LINEAR } sd_lr_kind;

typedef struct {
    sd_lr_kind kind;
    double base;
    long warmup, total; /* optimizer steps */
} sd_lr_sched;

/* The rate of optimizer step s (0-based: diffusers' LambdaLR at
 * last_epoch s, so warmup starts at 0). */
double sd_lr_at(const sd_lr_sched *l, long s);
/* Parse "constant", "constant_with_warmup", "cosine", "linear". */
int sd_lr_kind_parse(const char *name, sd_lr_kind *out);

#endif
