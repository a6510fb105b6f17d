/* ZeRO for the per-tensor optimizers (--optimizer adamw8bit, adafactor):
 * their state is laid out tensor by tensor, so the ranks share it by whole
 * tensors: rank r owns the run of tensors that starts in the r-th world-th
 * of the flat weights. Its state is that run's layout alone (a view of the
 * model's slots rebased to the run's start), so each state buffer of the
 * whole model is the ranks' buffers one after another. ZeRO-1 sums the
 * whole gradient as plain data parallelism does and steps the own run;
 * ZeRO-2 reduces each tensor's gradient to its owner only (train_zero2.c).
 * Then each run's weights go from its owner to everyone. On a device the
 * state is the run's alone too (optim_dev.c mirrors tr->opt, which is the
 * run's), stepped through the backend's adamw8/adafactor entries on device
 * pointers; GPU ranks broadcast the runs over NCCL. */
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif
#ifdef SDTK_HAVE_NCCL
#include "nccl_sum.h"
#endif
#include "train_int.h"

/* The float offset where tensor t starts (the buffer's end past the last). */
static size_t tensor_start(const sd_weights *w, size_t t)
{
    return t < w->nslots ? w->slots[t].off : w->total;
}

/* Rank r's first tensor: the first whose start is at or past r / world of
 * the flat buffer (slots are registered in offset order). */
static size_t first_tensor(const sd_weights *w, int r, int world)
{
    size_t at = (size_t)((unsigned long long)w->total * (unsigned long long)r / (unsigned long long)world);
    size_t lo = 0, hi = w->nslots;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->slots[mid].off < at) lo = mid + 1;
        else hi = mid;
    }
    return r == 0 ? 0 : lo;
}

/* Rank r's tensors [*t0, *t1) and their floats [*w0, *w1). */
void sd_train_tensor_run(const sd_weights *w, int r, int world, size_t *t0, size_t *t1, size_t *w0, size_t *w1)
{
    *t0 = first_tensor(w, r, world);
    *t1 = r + 1 >= world ? w->nslots : first_tensor(w, r + 1, world);
    *w0 = tensor_start(w, *t0);
    *w1 = tensor_start(w, *t1);
}

/* Tensors [t0, t1) of w as a model of their own: the slots copied with
 * offsets from the run's start (sub->data stays NULL; free sub->slots). */
sd_status sd_train_sub_weights(const sd_weights *w, size_t t0, size_t t1, sd_weights *sub, sd_error *err)
{
    memset(sub, 0, sizeof *sub);
    size_t base = tensor_start(w, t0);
    sub->nslots = sub->cap = t1 - t0;
    sub->total = tensor_start(w, t1) - base;
    sub->slots = malloc((t1 > t0 ? t1 - t0 : 1) * sizeof *sub->slots);
    if (!sub->slots) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t t = t0; t < t1; t++) {
        sub->slots[t - t0] = w->slots[t];
        sub->slots[t - t0].off -= base;
    }
    return SD_OK;
}

/* The state layout (no data) of rank r's run, or of tensors [0, t1) when
 * r < 0 (the counts before a run: where it starts in each buffer). */
static sd_status run_layout(const sd_train_opts *o, const sd_weights *w, int world, int r, size_t t1_prefix,
                            sd_opt_state *s, sd_error *err)
{
    size_t t0 = 0, t1 = t1_prefix, w0, w1;
    if (r >= 0) sd_train_tensor_run(w, r, world, &t0, &t1, &w0, &w1);
    sd_weights sub;
    sd_status rc = sd_train_sub_weights(w, t0, t1, &sub, err);
    if (rc) return rc;
    sd_opt_state_layout(s, o->optimizer, o->adafactor_beta1 >= 0, &sub);
    free(sub.slots);
    return SD_OK;
}

/* The bytes of rank's state under ZeRO (its run's layout); of the whole
 * model's with rank < 0. 0 when out of memory for the layout. */
size_t sd_train_tensor_state_bytes(const sd_train_opts *o, const sd_weights *w, int rank, int world)
{
    sd_opt_state s;
    sd_error e = {0};
    if (run_layout(o, w, world, rank, w->nslots, &s, &e)) return 0;
    size_t b = sd_opt_state_bytes(&s);
    sd_opt_state_free(&s);
    return b;
}

/* This rank's state: the layout of its own run, allocated. */
sd_status sd_train_tensor_state_open(sd_trainer *tr, sd_error *err)
{
    sd_weights sub;
    size_t t0, t1, w0, w1;
    sd_train_tensor_run(&tr->unet.w, tr->rank, tr->world, &t0, &t1, &w0, &w1);
    sd_status rc = sd_train_sub_weights(&tr->unet.w, t0, t1, &sub, err);
    if (rc) return rc;
    rc = sd_opt_state_init(&tr->opt, tr->o.optimizer, tr->o.adafactor_beta1 >= 0, &sub, err);
    free(sub.slots);
    return rc;
}

/* The floats of the gradient share rank keeps under --zero2: its run's
 * (AdamW: its segments, sd_dist_owned). */
size_t sd_train_zero2_own(const sd_train_opts *o, const sd_weights *w, int rank, int world)
{
    if (o->optimizer == SD_OPT_ADAMW) return sd_dist_owned(w->total, rank, world);
    size_t t0, t1, w0, w1;
    sd_train_tensor_run(w, rank, world, &t0, &t1, &w0, &w1);
    return w1 - w0;
}

/* The rank whose run holds float offset off. */
int sd_train_tensor_owner(const sd_weights *w, size_t off, int world)
{
    for (int r = world - 1; r > 0; r--) {
        size_t t0, t1, w0, w1;
        sd_train_tensor_run(w, r, world, &t0, &t1, &w0, &w1);
        if (off >= w0) return r;
    }
    return 0;
}

/* Run r's weights (w0, n floats) from its owner r to every rank: over
 * NCCL on GPU ranks, else over MPI in host memory (CPU ranks; a device
 * world of one has nothing to send). */
static sd_status bcast_run(sd_trainer *tr, size_t w0, size_t n, int r, sd_error *err)
{
#if defined(SDTK_HAVE_NCCL) && defined(SDTK_HAVE_CUDA)
    if (tr->nccl) return sd_nccl_bcast_f32(tr->nccl, tr->d_w + w0, n, r, sd_cuda_stream(tr->cuda), err);
#endif
    return sd_dist_bcast_f32(tr->d_w + w0, n, r, err);
}

/* The update of the own run with the summed gradient of its floats (g:
 * ZeRO-1's whole buffer at the run's start, ZeRO-2's share; device
 * pointers on a device, as the state's views are), then every run's
 * weights from its owner; the gradient zeroed, the step counted. */
sd_status sd_train_tensor_apply(sd_trainer *tr, double norm, const float *g, sd_error *err)
{
    size_t t0, t1, w0, w1;
    sd_train_tensor_run(&tr->unet.w, tr->rank, tr->world, &t0, &t1, &w0, &w1);
    double lr = sd_lr_at(&tr->o.lr, tr->step), gscale = sd_clip_factor(norm, tr->o.max_grad_norm);
    sd_opt_state_step(&tr->opt, tr->be, tr->exec, &tr->o.adam, tr->o.adafactor_beta1, lr, tr->step + 1, gscale,
                      tr->d_w + w0, g);
    for (int r = 0; r < tr->world; r++) {
        sd_train_tensor_run(&tr->unet.w, r, tr->world, &t0, &t1, &w0, &w1);
        sd_status rc = bcast_run(tr, w0, w1 - w0, r, err);
        if (rc) return rc;
    }
    sd_train_zero_grad(tr);
    sd_train_after_update(tr);
    return SD_OK;
}

/* For a checkpoint: rank 0 gathers every rank's buffers into the whole
 * model's state (tr->opt_save, which the state file is written from);
 * the others send theirs. */
sd_status sd_train_tensor_state_full(sd_trainer *tr, sd_error *err)
{
    if (!sd_train_sharded(&tr->o) || tr->o.optimizer == SD_OPT_ADAMW) return SD_OK;
    size_t *counts = calloc((size_t)tr->world * SD_OPT_MAX_BUFS, sizeof(size_t));
    sd_status rc = counts ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory");
    for (int r = 0; r < tr->world && !rc; r++) { /* every rank's buffer sizes, as its layout gives them */
        sd_opt_state s;
        rc = run_layout(&tr->o, &tr->unet.w, tr->world, r, 0, &s, err);
        for (size_t i = 0; !rc && i < s.nbufs; i++)
            counts[i * (size_t)tr->world + (size_t)r] = s.bufs[i].count * (s.bufs[i].st_dtype == SD_ST_U8 ? 1 : 4);
        if (!rc) sd_opt_state_free(&s);
    }
    int ok = 1, all = 1;
    if (!rc && tr->rank == 0) {
        tr->opt_save = calloc(1, sizeof *tr->opt_save);
        ok = tr->opt_save && !sd_opt_state_init(tr->opt_save, tr->o.optimizer, tr->o.adafactor_beta1 >= 0,
                                                &tr->unet.w, err);
    }
    if (!rc) rc = sd_dist_all_ok(ok, &all, err); /* every rank learns it, none waits in the gather */
    if (!rc && !all) rc = sd_err_set(err, SD_ENOMEM, "rank 0 is out of memory for the whole optimizer state");
    for (size_t i = 0; !rc && i < tr->opt.nbufs; i++)
        rc = sd_dist_gather_ranks(tr->rank == 0 ? tr->opt_save->bufs[i].data : NULL, tr->opt.bufs[i].data,
                                  counts + i * (size_t)tr->world, err);
    free(counts);
    return rc;
}

/* The whole state dropped again after the checkpoint. */
void sd_train_tensor_state_shard(sd_trainer *tr)
{
    if (!tr->opt_save) return;
    sd_opt_state_free(tr->opt_save);
    free(tr->opt_save);
    tr->opt_save = NULL;
}

/* Where the own run starts in state buffer i of the whole model, and the
 * whole model's count of it (a resume copies the run's part of each). */
sd_status sd_train_tensor_state_at(const sd_trainer *tr, size_t i, size_t *start, size_t *whole, sd_error *err)
{
    size_t t0, t1, w0, w1;
    sd_train_tensor_run(&tr->unet.w, tr->rank, tr->world, &t0, &t1, &w0, &w1);
    sd_opt_state before, all;
    sd_status rc = run_layout(&tr->o, &tr->unet.w, tr->world, -1, t0, &before, err);
    if (rc) return rc;
    rc = run_layout(&tr->o, &tr->unet.w, tr->world, -1, tr->unet.w.nslots, &all, err);
    if (!rc) {
        *start = i < before.nbufs ? before.bufs[i].count : 0;
        *whole = i < all.nbufs ? all.bufs[i].count : 0;
        sd_opt_state_free(&all);
    }
    sd_opt_state_free(&before);
    return rc;
}
