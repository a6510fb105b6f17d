/* One optimizer step from the shards: the ranks' batches, their random
 * draws, the gradient sums and the update. */
#include "train.h"

#include <math.h>

#include "dist.h"
#include "train_int.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif
#ifdef SDTK_HAVE_NCCL
#include "nccl_sum.h"
#endif

/* The stream of one batch: seeded by (seed, epoch, batch in the epoch), so
 * a batch draws the same flips, dropout, latent noise, timesteps and noise
 * whichever rank computes it and however the global batch is split. */
static void seed_batch(sd_trainer *tr, const sd_data_cursor *served)
{
    uint64_t k = sd_train_mix64(tr->o.seed ^ 0x7364746b2d747261ULL);
    k = sd_train_mix64(k ^ (uint64_t)served->epoch);
    sd_rng_seed(&tr->rng, sd_train_mix64(k ^ ((uint64_t)served->batch - 1)));
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
    sd_load_opts lo = sd_train_load_opts(tr, 1);
    int pooled = lo.pooled;
    int world = tr->world > 0 ? tr->world : 1, rank = tr->rank;
    int slots = world * tr->o.accum, need = slots, empty_rounds = 0;
    double sum = 0, images = 0, stop = 0;
    tr->fused_broken = 0;
    tr->z2add = 0; /* --zero2: the step's first pass stores into the shares */
    if (!tr->have_data) return sd_err_set(err, SD_EINVAL, "no training data");
    /* a step whose loss is not finite is undone: the cursor, RNG and
     * count go back, so a checkpoint then holds the state before it */
    sd_data_cursor cur0 = tr->cur;
    sd_rng rng0 = tr->rng;
    long images0 = tr->images;
    while (need > 0) {
        double red[4] = {0, 0, 0, tr->stop_req && *tr->stop_req ? 1.0 : 0.0}; /* usable, loss, images, stop */
        int passes = 0; /* --zero2: this rank's backward passes in the round */
        for (int slot = 0; slot < need; slot++) {
            sd_data_batch db;
            sd_train_tell_stop(tr);
            sd_status rc = sd_data_next(&tr->data, &tr->cur, &db, err);
            if (rc) return rc;
            if (slot % world != rank) continue;
            seed_batch(tr, &tr->cur);
            rc = sd_data_load(&tr->data, &db, &lo, &tr->rng, &tr->batch, &tr->tally, err);
            if (rc) return rc;
            sd_batch *b = &tr->batch;
            if (b->n == 0) continue;
            rc = sd_train_prepare(tr, b->n, b->h, b->w, b->tctx, err);
            if (rc) return rc;
            size_t per = (size_t)b->c * (size_t)b->h * (size_t)b->w;
            for (int i = 0; i < b->n; i++) tr->t[i] = sd_train_draw_timestep(&tr->o, &tr->rng);
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
            rc = sd_train_pass(tr, b->n, b->h, b->w, b->tctx, b->x0, b->ctx, pooled ? b->text : NULL,
                      c->text_time ? b->tids : NULL, tr->noise, tr->o.input_perturbation > 0 ? tr->noise_in : NULL,
                      tr->t, lo.masked ? b->mask : NULL, 1.0 / slots, 1, &l, err);
            if (rc) return rc;
            /* --fused-backward: the backward with each tensor's update, never after a non-finite loss;
             * --zero2: the backward with each tensor reduce-scattered (zeros after a non-finite loss) */
            if (tr->o.fused_backward && isfinite(l)) sd_train_fused_pass(tr);
            if (tr->o.zero2) {
                rc = sd_train_zero2_pass(tr, !isfinite(l), err);
                if (rc) return rc;
                passes++;
            }
            red[0] += 1;
            red[1] += l;
            red[2] += b->n;
        }
        if (tr->o.zero2) { /* the ranks with fewer passes send zeros as often */
            sd_status rc = sd_train_zero2_round(tr, need, passes, err);
            if (rc) return rc;
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
    if (tr->nccl && !tr->o.zero2) {
#if defined(SDTK_HAVE_NCCL) && defined(SDTK_HAVE_CUDA)
        /* on the GPU, queued behind the backward pass; ZeRO-1 with AdamW: each owner's segments only
         * (the per-tensor optimizers step whole tensors from the whole sum, as on CPU ranks) */
        void *s = sd_cuda_stream(tr->cuda);
        int segments = tr->o.zero1 && tr->o.optimizer == SD_OPT_ADAMW;
        sd_status rc = segments ? sd_nccl_reduce_scatter_f32(tr->nccl, tr->d_grad, tr->unet.w.total, s, err)
                                : sd_nccl_sum_f32(tr->nccl, tr->d_grad, tr->unet.w.total, s, err);
        if (rc) return rc;
#endif
    } else if (tr->o.zero2) {
        /* reduce-scattered tensor by tensor during the backward (train_zero2.c) */
    } else if (tr->o.zero1 && tr->o.optimizer == SD_OPT_ADAMW) {
        /* each rank gets the sum of its own segments only (per-tensor optimizers: the whole sum, below) */
        sd_status rc = sd_dist_reduce_scatter_f32(tr->grad, tr->unet.w.total, err);
        if (rc) return rc;
    } else if (world > 1) {
        /* MPI sums host memory: a GPU's gradient goes through the host */
        sd_status rc = sd_train_grad_to_host(tr, err);
        if (!rc) rc = sd_dist_sum_f32(tr->grad, tr->unet.w.total, err);
        if (rc) return rc;
        sd_train_put(tr, tr->d_grad, tr->grad, tr->unet.w.total);
    }
    if (world > 1) tr->stop_all = stop > 0;
    tr->images += (long)images;
    *loss = sum / slots;
    if (tr->o.fused_backward) { /* the tensors were updated during the backward */
        if (isfinite(*loss)) sd_train_fused_finish(tr, gnorm);
        else *gnorm = NAN;
        if (!isfinite(*loss) || tr->fused_broken) {
            tr->cur = cur0;
            tr->rng = rng0;
            tr->images = images0;
        }
        if (tr->fused_broken == 2) /* the scratch did not grow: nothing was updated, not a non-finite value */
            return sd_err_set(err, SD_ENOMEM, "--fused-backward: out of memory for the per-op gradient scratch at "
                              "step %ld (nothing was updated)", tr->step + 1);
        return SD_OK;
    }
    if (sd_train_sharded(&tr->o) && (tr->o.optimizer == SD_OPT_ADAMW || tr->o.zero2)) {
        sd_status rc = sd_train_grad_norm_zero1(tr, gnorm, err);
        if (rc) return rc;
    } else {
        sd_status rc = sd_train_grad_norm_local(tr, gnorm, err);
        if (rc) return rc;
    }
    if (!isfinite(*loss) || !isfinite(*gnorm)) {
        /* the last good state stays: drop this step's gradient, take back its data */
        sd_train_zero_grad(tr);
        tr->cur = cur0;
        tr->rng = rng0;
        tr->images = images0;
        return SD_OK;
    }
    if (sd_train_sharded(&tr->o) && tr->o.optimizer != SD_OPT_ADAMW) { /* whole tensors per rank */
        size_t t0, t1, w0, w1;
        sd_train_tensor_run(&tr->unet.w, tr->rank, tr->world, &t0, &t1, &w0, &w1);
        return sd_train_tensor_apply(tr, *gnorm, tr->o.zero2 ? tr->gsh : tr->d_grad + w0, err);
    }
    if (sd_train_sharded(&tr->o)) return sd_train_apply_zero1(tr, *gnorm, err);
    sd_train_apply_norm(tr, *gnorm);
    return SD_OK;
}
