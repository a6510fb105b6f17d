/* AdamW's per-step constants, the clipping factor, the EMA decay and the
 * learning-rate schedules; the element-wise work is the backend's
 * (sum_squares, adamw, ema: ops_optim.c on the CPU). */
#include "optim.h"

#include <math.h>
#include <string.h>


/* The per-step constants of AdamW: bias corrections in double, rounded
 * to fp32 as torch's single-tensor path does. */
sd_adamw_args sd_adamw_args_at(const sd_adamw_opts *o, double lr, long step, double gscale)
{
    double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    sd_adamw_args a = {.decay = (float)(1.0 - lr * o->weight_decay), .b1 = (float)o->beta1, .b2 = (float)o->beta2,
                       .step_size = (float)(lr / bc1), .bc2_sqrt = (float)sqrt(bc2), .eps = (float)o->eps,
                       .gscale = (float)gscale};
    return a;
}

/* torch's clip_grad_norm_ factor for a norm: max_norm / (norm + 1e-6)
 * when that is below 1, else 1 (and 1 for a non-finite norm). */
double sd_clip_factor(double norm, double max_norm)
{
    if (!(max_norm > 0) || !isfinite(norm)) return 1.0;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

/* EMAModel.get_decay without warmup, update_after_step 0, min_decay 0. */
double sd_ema_decay(double max_decay, long n)
{
    long k = n - 1;
    if (k <= 0) return 0.0;
    double d = (1.0 + (double)k) / (10.0 + (double)k);
    return d < max_decay ? d : max_decay;
}

/* diffusers' schedule lambdas times the base rate. */
double sd_lr_at(const sd_lr_sched *l, long s)
{
    double w = (double)l->warmup, t = (double)l->total, x = (double)s;
    if (l->kind != SD_LR_CONSTANT && s < l->warmup) return l->base * x / (w > 1 ? w : 1);
    switch (l->kind) {
    case SD_LR_CONSTANT:
    case SD_LR_CONSTANT_WARMUP: return l->base;
    case SD_LR_COSINE: {
        double prog = (x - w) / (t - w > 1 ? t - w : 1);
        double f = 0.5 * (1.0 + cos(3.14159265358979323846 * prog));
        return l->base * (f > 0 ? f : 0);
    }
    case SD_LR_LINEAR: {
        double f = (t - x) / (t - w > 1 ? t - w : 1);
        return l->base * (f > 0 ? f : 0);
    }
    }
    return l->base;
}

/* Schedule names as diffusers spells them. */
int sd_lr_kind_parse(const char *name, sd_lr_kind *out)
{
    static const char *names[] = {"constant", "constant_with_warmup", "cosine", "linear"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (sd_lr_kind)i;
            return 1;
        }
    return 0;
}
