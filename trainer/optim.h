/* The optimizer over the flat parameter buffer: AdamW with fp32 master
 * weights and moments exactly as torch.optim.AdamW applies it (decoupled
 * weight decay first, then the bias-corrected Adam step), torch's
 * clip_grad_norm_ over all parameters, and diffusers' learning-rate
 * schedules (get_scheduler: constant, constant_with_warmup, cosine,
 * linear). Element-wise work is split over the pool; the norm is summed in
 * fixed chunks, so every result is bit-identical for any thread count. */
#ifndef SDTK_TRAIN_OPTIM_H
#define SDTK_TRAIN_OPTIM_H

#include <stddef.h>

#include "ops_cpu.h"
#include "pool.h"

typedef struct {
    double beta1, beta2, eps, weight_decay;
} sd_adamw_opts;

/* One AdamW step number `step` (1-based, as torch counts) at rate lr over n
 * floats: p *= 1 - lr wd; m, v updated; p -= lr / (1 - b1^step) * m /
 * (sqrt(v) / sqrt(1 - b2^step) + eps). */
void sd_adamw_step(sd_pool *pool, const sd_adamw_opts *o, double lr, long step, float *p, float *m, float *v,
                   const float *g, size_t n);
/* The same step's constants for a backend's adamw op, with the gradient
 * scaled by gscale (the clipping factor) as it is read. */
sd_adamw_args sd_adamw_args_at(const sd_adamw_opts *o, double lr, long step, double gscale);
/* torch's clip_grad_norm_ factor: min(1, max_norm / (norm + 1e-6)); 1
 * without clipping (max_norm <= 0) or for a non-finite norm. */
double sd_clip_factor(double norm, double max_norm);

/* L2 norm of g (n floats); with max_norm > 0 scale g by min(1, max_norm /
 * (norm + 1e-6)) as torch's clip_grad_norm_ does. Returns the norm before
 * clipping (NaN/Inf when the gradient is not finite: then g is left as is). */
double sd_grad_clip(sd_pool *pool, float *g, size_t n, double max_norm);

/* diffusers' EMAModel decay for its n-th update (1-based): 0 for the first,
 * then min(max_decay, (1 + k) / (10 + k)) with k = n - 1. */
double sd_ema_decay(double max_decay, long n);
/* ema -= (1 - decay) * (ema - p) over n floats (EMAModel.step). */
void sd_ema_update(sd_pool *pool, float *ema, const float *p, size_t n, double decay);

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
