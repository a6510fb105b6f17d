/* The optimizer side of a step: the gradient's norm, AdamW with the
 * clipping folded in (from fp32 gradients, or --grad-dtype bf16's widened
 * a tensor at a time), the EMA, and ZeRO-1's sharded update. */
#include "train.h"

#include <math.h>
#include <string.h>

#include "dist.h"
#include "train_int.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif
#ifdef SDTK_HAVE_NCCL
#include "nccl_sum.h"
#endif

/* Zero the gradients on the backend (--zero2: this rank's share). */
void sd_train_zero_grad(sd_trainer *tr)
{
    if (tr->gsh) tr->be->zero(tr->exec, tr->gsh, tr->z2own * sizeof(float));
    if (tr->g16) { /* --grad-dtype bf16: the buffer, and the micro-batches' keys start again */
        memset(tr->g16, 0, tr->unet.w.total * sizeof *tr->g16);
        tr->g16_micro = 0;
    }
    if (!tr->d_grad) return; /* --fused-backward keeps no gradient buffer */
    tr->be->zero(tr->exec, tr->d_grad, tr->unet.w.total * sizeof(float));
}

/* The stochastic-rounding key of the AdamW step that makes `step` (bf16
 * moments): from the seed and the step alone, so a resumed run rounds as
 * the uninterrupted one did. */
static uint32_t sr_key(const sd_trainer *tr, long step)
{
    return (uint32_t)(sd_train_mix64(sd_train_mix64(tr->o.seed ^ 0x61646d2d62663136ULL) ^ (uint64_t)step) >> 32);
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

/* One tensor's update (slot t, gradient g of its floats, read times
 * gscale) at rate lr for step tr->step + 1: per element the arithmetic of
 * the whole-model update (AdamW is element-wise with keys by global index;
 * adamw8bit and adafactor go per tensor), so --fused-backward and
 * --clip-per-tensor end as the whole-buffer update does. On the trainer's
 * backend (g in its memory). */
void sd_train_update_tensor(sd_trainer *tr, size_t t, const float *g, double lr, double gscale)
{
    size_t lo = tr->unet.w.slots[t].off, n = tr->unet.w.slots[t].n;
    long step = tr->step + 1;
    if (tr->o.optimizer != SD_OPT_ADAMW && tr->w16) {
        sd_train_w16_other_group(tr, lr, gscale, t, t + 1, g);
    } else if (tr->o.optimizer != SD_OPT_ADAMW) {
        sd_opt_state_step_group(&tr->opt, tr->be, tr->exec, &tr->o.adam, tr->o.adafactor_beta1, lr, step, gscale, t,
                                t + 1, tr->desc, tr->d_w + lo, g);
    } else {
        sd_adamw_args a = sd_adamw_args_at(&tr->o.adam, lr, step, gscale);
        if (tr->w16) {
            a.sr_key = sr_key(tr, step);
            sd_train_w16_adamw_range(tr, &a, lo, n, g);
        } else {
            adamw_on(tr, tr->be, tr->exec, &a, lo, n, tr->d_w + lo, (char *)tr->d_m + lo * tr->moment_size,
                     (char *)tr->d_v + lo * tr->moment_size, g);
        }
    }
}

/* Slot t's bf16 gradient (--grad-dtype bf16) widened into the op scratch
 * (at least the largest tensor, sd_train_g16_scratch). */
static const float *g16_slot(sd_trainer *tr, size_t t)
{
    const sd_weight_slot *s = &tr->unet.w.slots[t];
    sd_train_w16_widen(tr->fgrad, tr->g16 + s->off, s->n);
    return tr->fgrad;
}

/* The global norm of the bf16 gradients: each tensor widened and its sum
 * of squares added in slot order (the padding between tensors is zero). */
static double g16_norm(sd_trainer *tr)
{
    double ss = 0;
    for (size_t t = 0; t < tr->unet.w.nslots; t++)
        ss += tr->be->sum_squares(tr->exec, tr->unet.w.slots[t].n, g16_slot(tr, t));
    return sqrt(ss);
}

/* The bf16 gradients' step at rate lr, clipped by gscale (or each tensor
 * for its own norm with --clip-per-tensor): tensor by tensor, widened and
 * updated (per element the whole-buffer update's arithmetic). */
static void g16_update(sd_trainer *tr, double lr, double gscale)
{
    int per = tr->o.clip_per_tensor && tr->o.max_grad_norm > 0;
    for (size_t t = 0; t < tr->unet.w.nslots; t++) {
        size_t n = tr->unet.w.slots[t].n;
        const float *g = g16_slot(tr, t);
        double f = per ? sd_clip_factor(sqrt(tr->be->sum_squares(tr->exec, n, g)), tr->o.max_grad_norm) : gscale;
        sd_train_update_tensor(tr, t, g, lr, f);
    }
}

/* The sum of squares of n values on the backend that holds them; a result
 * that is not finite is first checked against the device: a failed CUDA
 * context also answers NaN, and its own error is the one to report, not a
 * non-finite gradient or weight. */
static sd_status device_sum_squares(sd_trainer *tr, const float *x, double *ss, sd_error *err)
{
    sd_train_push_state(tr);
    *ss = tr->be->sum_squares(tr->exec, tr->unet.w.total, x);
    return isfinite(*ss) ? SD_OK : tr->be->sync(tr->exec, err);
}

/* The gradient's norm from the chunked sum of squares (apart from the step,
 * so a non-finite one can stop the run before it reaches the weights). */
sd_status sd_train_grad_norm_local(sd_trainer *tr, double *norm, sd_error *err)
{
    if (tr->g16) { /* --grad-dtype bf16: tensor by tensor, widened (the CPU alone) */
        *norm = g16_norm(tr);
        return SD_OK;
    }
    double ss;
    sd_status rc = device_sum_squares(tr, tr->d_grad, &ss, err);
    *norm = sqrt(ss);
    return rc;
}

/* AdamW (or --optimizer's other choice) at the scheduled rate with the
 * clipping factor for norm folded into its reading of the gradient (bit
 * for bit what clipping in place then stepping gives), then zero the
 * gradients, count the step, the EMA. */
void sd_train_apply_norm(sd_trainer *tr, double norm)
{
    size_t n = tr->unet.w.total;
    const sd_backend *be = tr->be;
    double lr = sd_lr_at(&tr->o.lr, tr->step), gscale = sd_clip_factor(norm, tr->o.max_grad_norm);
    if (tr->g16) { /* --grad-dtype bf16: each tensor widened, then updated */
        g16_update(tr, lr, gscale);
    } else if (tr->o.clip_per_tensor && tr->o.max_grad_norm > 0) {
        /* each tensor clipped for its own norm, updated by the fused path's arithmetic */
        for (size_t t = 0; t < tr->unet.w.nslots; t++) {
            const sd_weight_slot *s = &tr->unet.w.slots[t];
            const float *g = tr->d_grad + s->off;
            double ss = be->sum_squares(tr->exec, s->n, g);
            sd_train_update_tensor(tr, t, g, lr, sd_clip_factor(sqrt(ss), tr->o.max_grad_norm));
        }
    } else if (tr->o.optimizer != SD_OPT_ADAMW && tr->w16) {
        sd_train_w16_other(tr, lr, gscale);
    } else if (tr->o.optimizer != SD_OPT_ADAMW) {
        sd_opt_state_step(&tr->opt, be, tr->exec, &tr->o.adam, tr->o.adafactor_beta1, lr, tr->step + 1, gscale,
                          tr->d_w, tr->d_grad);
    } else if (tr->w16) { /* bf16 weights: widened, updated, rounded back by chunks */
        sd_adamw_args a = sd_adamw_args_at(&tr->o.adam, lr, tr->step + 1, gscale);
        a.sr_key = sr_key(tr, tr->step + 1);
        sd_train_w16_adamw(tr, &a);
    } else {
        sd_adamw_args a = sd_adamw_args_at(&tr->o.adam, lr, tr->step + 1, gscale);
        adamw_on(tr, be, tr->exec, &a, 0, n, tr->d_w, tr->d_m, tr->d_v, tr->d_grad);
    }
    sd_train_zero_grad(tr);
    sd_train_after_update(tr);
}

/* After the update of every tensor: the step counted, the EMA. */
void sd_train_after_update(sd_trainer *tr)
{
    size_t n = tr->unet.w.total;
    const sd_backend *be = tr->be;
    tr->step++;
    if (tr->ema && tr->step % (tr->o.ema_every > 0 ? tr->o.ema_every : 1) == 0) {
        tr->ema_updates++;
        float rate = (float)(1.0 - sd_ema_decay(tr->o.ema_decay, tr->ema_updates));
        if (tr->w16) {
            sd_train_w16_ema(tr, rate);
        } else if (tr->d_ema) {
            be->ema(tr->exec, n, tr->d_ema, tr->d_w, rate);
        } else { /* a GPU run with the EMA on the host: the weights come over first */
            be->d2h(tr->exec, tr->unet.w.data, tr->d_w, n * sizeof(float));
            sd_ema_fwd(tr->pool, n, tr->ema, tr->unet.w.data, rate);
        }
    }
    tr->host_stale = tr->be->is_device;
}

/* Whether every weight is finite (*finite): their sum of squares in double
 * is, exactly when they all are (no finite float's square overflows it). */
sd_status sd_train_weights_finite(sd_trainer *tr, int *finite, sd_error *err)
{
    if (tr->w16) {
        *finite = sd_train_w16_finite(tr);
        return *finite ? SD_OK : tr->be->sync(tr->exec, err); /* a failed device answers NaN too */
    }
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
    if (sd_train_grad_norm_local(tr, &norm, &e)) norm = NAN; /* a device failure: the next step reports it */
    sd_train_apply_norm(tr, norm);
    return norm;
}

/* The summed gradient of this rank's segment [lo, hi), which begins at
 * packed offset off of its share, on the backend: ZeRO-1's in the whole
 * buffer (where the reduce-scatter left it), ZeRO-2's in the share. */
static const float *own_grad(const sd_trainer *tr, size_t lo, size_t off)
{
    return tr->o.zero2 ? tr->gsh + off : tr->d_grad + lo;
}

/* ZeRO-1's and ZeRO-2's gradient norm, after the reduce-scatter left each
 * rank the summed gradient of its own segments: every rank's sum of
 * squares added in rank order. It is grouped by segment, so it may differ
 * from the whole-buffer chunks of sd_train_grad_norm_local in the last
 * bits; ZeRO-1 and ZeRO-2 group it alike. */
sd_status sd_train_grad_norm_zero1(sd_trainer *tr, double *norm, sd_error *err)
{
    size_t n = tr->unet.w.total, lo, hi, off = 0;
    double ss = 0;
    if (tr->o.optimizer != SD_OPT_ADAMW) /* --zero2 by whole tensors: the share is the own run */
        ss = tr->be->sum_squares(tr->exec, tr->z2own, tr->gsh);
    for (size_t b = 0; b < sd_dist_blocks(n) && tr->o.optimizer == SD_OPT_ADAMW; b++) {
        sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
        ss += tr->be->sum_squares(tr->exec, hi - lo, own_grad(tr, lo, off)); /* the CPU: sd_sum_squares */
        off += hi - lo;
    }
    sd_status rc = sd_dist_sum_f64(&ss, 1, err);
    *norm = sqrt(ss);
    if (!rc && !isfinite(ss) && tr->be->is_device) rc = tr->be->sync(tr->exec, err); /* a failed context answers NaN */
    return rc;
}

/* ZeRO-1's (and ZeRO-2's) optimizer step: AdamW on the own segments with
 * the packed moments (on the backend: host buffers on the CPU, device ones
 * on a GPU), then the updated weights all-gathered (over MPI, or NCCL on
 * GPU ranks), the step counted and the EMA. The same arithmetic per
 * element as sd_train_apply_norm. */
sd_status sd_train_apply_zero1(sd_trainer *tr, double norm, sd_error *err)
{
    size_t n = tr->unet.w.total, off = 0, lo, hi;
    double lr = sd_lr_at(&tr->o.lr, tr->step);
    sd_adamw_args a = sd_adamw_args_at(&tr->o.adam, lr, tr->step + 1, sd_clip_factor(norm, tr->o.max_grad_norm));
    char *m = tr->be->is_device ? tr->d_m : tr->m_sh, *v = tr->be->is_device ? tr->d_v : tr->v_sh;
    for (size_t b = 0; b < sd_dist_blocks(n); b++) {
        sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
        adamw_on(tr, tr->be, tr->exec, &a, lo, hi - lo, tr->d_w + lo, m + off * tr->moment_size,
                 v + off * tr->moment_size, own_grad(tr, lo, off));
        off += hi - lo;
    }
    sd_status rc = SD_OK;
#if defined(SDTK_HAVE_NCCL) && defined(SDTK_HAVE_CUDA)
    if (tr->nccl) rc = sd_nccl_allgather_f32(tr->nccl, tr->d_w, n, sd_cuda_stream(tr->cuda), err);
    else
#endif
        rc = sd_dist_allgather_f32(tr->d_w, n, err); /* a GPU world of one: nothing to gather */
    if (rc) return rc;
    sd_train_zero_grad(tr);
    sd_train_after_update(tr);
    return SD_OK;
}
