/* --fused-backward: each parameter tensor's optimizer update applied as
 * soon as the UNet's backward has its gradient (sd_unet_backward_fused),
 * the gradient held only in a scratch of the largest op's size, so no
 * gradient buffer of the whole model exists. Clipping is per tensor (as
 * kohya's fused path), accumulation is refused (the update needs the
 * whole step's gradient at once), one process only (CPU or GPU: the
 * scratch and every update go through the backend table). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "train_int.h"

/* Why these options cannot run fused, NULL when they can. */
const char *sd_train_fused_refusal(const sd_train_opts *o, long accum)
{
    if (accum > 1)
        return "--fused-backward updates each tensor during the backward: --accum > 1 would need the whole "
               "gradient kept between micro-batches (use --accum 1 and a larger --batch, or --grad-dtype bf16 "
               "without --fused-backward: a bf16 gradient buffer, half the fp32 one)";
    if (o->zero1 || o->zero2 || sd_dist_world() > 1)
        return "--fused-backward runs in one process only (not under mpirun or with --zero1/--zero2: the gradient must "
               "be summed over the ranks before any update)";
    if (o->nccl) return "--fused-backward does not sum gradients over NCCL (not with --nccl)";
    return NULL;
}

/* The descriptors and per-tensor flags of a fused run (the scratch
 * follows the plan, sd_train_fused_pass). */
sd_status sd_train_fused_open(sd_trainer *tr, sd_error *err)
{
    const char *why = sd_train_fused_refusal(&tr->o, tr->o.accum);
    if (why) return sd_err_set(err, SD_EUNSUPPORTED, "%s", why);
    tr->fdone = calloc(tr->unet.w.nslots ? tr->unet.w.nslots : 1, 1);
    if (!tr->fdone) return sd_err_set(err, SD_ENOMEM, "out of memory for --fused-backward");
    return SD_OK;
}

/* The slot whose tensor starts at float offset off (slots are registered
 * in offset order). */
static size_t slot_at(const sd_weights *w, size_t off)
{
    size_t lo = 0, hi = w->nslots;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->slots[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* One tensor's gradient is complete: its norm checked (a non-finite one
 * stops the pass), clipped on its own and the tensor updated. */
static int tensor_done(void *ctx, size_t off, const float *g, size_t n)
{
    sd_trainer *tr = ctx;
    size_t t = slot_at(&tr->unet.w, off);
    if (t >= tr->unet.w.nslots || tr->unet.w.slots[t].off != off || tr->unet.w.slots[t].n != n || tr->fdone[t])
        return 1; /* not a tensor of the model, or reached twice: sd_unet_params_shared refused that */
    double ss = tr->be->sum_squares(tr->exec, n, g);
    if (!isfinite(ss)) return 1;
    tr->fused_ss += ss;
    sd_train_update_tensor(tr, t, g, tr->fused_lr, sd_clip_factor(sqrt(ss), tr->o.max_grad_norm));
    tr->fdone[t] = 1;
    return 0;
}

/* The backward of the pass sd_train_pass just ran forward (its output
 * gradient in place) with the updates fused in, the step's single
 * micro-batch; the scratch grown to the plan's largest op. A stop marks
 * the step broken. */
void sd_train_fused_pass(sd_trainer *tr)
{
    sd_unet_wts w = sd_train_wts(tr);
    size_t need = sd_unet_fused_scratch(&tr->unet, &tr->g);
    if (!sd_train_fgrad_reserve(tr, need)) { /* reported as a broken step: nothing was updated yet */
        tr->fused_broken = 2;
        return;
    }
    memset(tr->fdone, 0, tr->unet.w.nslots ? tr->unet.w.nslots : 1);
    tr->fused_ss = 0;
    tr->fused_lr = sd_lr_at(&tr->o.lr, tr->step);
    sd_unet_fuse f = {tr->fgrad, tensor_done, tr};
    if (sd_unet_backward_fused(&tr->unet, &tr->g, tr->be, tr->exec, &w, tr->d_act, tr->d_dact, tr->d_dout, NULL, &f))
        tr->fused_broken = 1;
}

/* The step's end (train_int.h): tensors no op reached (their gradient is
 * zero, as in the whole-buffer update) stepped too, the norm, the count
 * and the EMA. */
void sd_train_fused_finish(sd_trainer *tr, double *gnorm)
{
    if (tr->fused_broken) {
        *gnorm = NAN;
        return;
    }
    for (size_t t = 0; t < tr->unet.w.nslots; t++) {
        if (tr->fdone[t]) continue;
        size_t n = tr->unet.w.slots[t].n;
        float *z = n <= tr->fgrad_cap ? tr->fgrad : tr->be->alloc(tr->exec, n * sizeof(float));
        if (!z) {
            tr->fused_broken = 1;
            *gnorm = NAN;
            return;
        }
        tr->be->zero(tr->exec, z, n * sizeof(float));
        sd_train_update_tensor(tr, t, z, tr->fused_lr, 1.0);
        if (z != tr->fgrad) tr->be->release(tr->exec, z);
    }
    *gnorm = sqrt(tr->fused_ss);
    sd_train_after_update(tr);
}

/* See train.h: the fused backward of the micro-batch just run and its
 * updates, then the step's end (what sd_train_step does with
 * --fused-backward, for callers that feed their own micro-batches). */
double sd_train_apply_fused(sd_trainer *tr)
{
    double gnorm;
    tr->fused_broken = 0;
    sd_train_fused_pass(tr);
    sd_train_fused_finish(tr, &gnorm);
    return gnorm;
}
