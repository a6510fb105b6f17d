/* --zero2 (ZeRO stage 2): no gradient buffer of the model. The UNet's
 * fused backward (sd_unet_backward_fused) hands each tensor's gradient
 * over as soon as it is complete, and it is reduced at once into its
 * owners' share of the gradient: AdamW's segments (dist.h's layout, as
 * ZeRO-1's moments; sd_dist_reduce_scatter_range, rank order; over NCCL on
 * GPU ranks, in NCCL's order), or for 8-bit AdamW and Adafactor the run of
 * whole tensors the owner keeps (train_zero_tensors.c; sd_dist_reduce_to).
 * After the step's micro-batches the global norm comes from the shares,
 * each rank steps its own part and the weights are gathered. Every rank
 * takes part in the same reductions in the same order: a rank with fewer
 * batches in a round (skipped records, an uneven round) sends zeros in
 * the order sd_unet_fused_order gives. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "log.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif
#ifdef SDTK_HAVE_NCCL
#include "nccl_sum.h"
#endif
#include "train_int.h"

/* Why these options cannot run under --zero2 on a world of `world` ranks,
 * NULL when they can. */
const char *sd_train_zero2_refusal(const sd_train_opts *o, int world)
{
    if (world < 2)
        return "--zero2 shards the gradients over ranks: start it under mpirun -np N (N >= 2); one process keeps "
               "them whole (--fused-backward keeps none). A ZeRO-2 run's checkpoint resumes in one process: drop "
               "--zero2 (with --config FILE: --set zero2=false)";
    if (o->fused_backward)
        return "--zero2 reduce-scatters each tensor's gradient during the backward and updates after it: not with "
               "--fused-backward, which updates during it (one process only)";
    if (o->clip_per_tensor)
        return "--zero2 clips by the global norm from the ranks' shares; not with --clip-per-tensor";
    if (o->grad_dtype == SD_DT_BF16)
        return "--zero2 reduces each tensor's fp32 gradient into the owner's share: not with --grad-dtype bf16 "
               "(one process only)";
    if (o->weight_dtype == SD_DT_BF16)
        return "--weight-dtype bf16 runs in one process only so far (no ZeRO path widens the weights yet)";
    return NULL;
}

/* The order of the backward's tensors from a plan of one small latent
 * (the order follows the ops alone), the scratch for the largest op, and
 * this rank's zeroed share of the gradient (on a GPU those two are device
 * buffers, allocated with the others in train_open.c). */
sd_status sd_train_zero2_open(sd_trainer *tr, sd_error *err)
{
    const char *why = sd_train_zero2_refusal(&tr->o, tr->world);
    if (why) return sd_err_set(err, SD_EUNSUPPORTED, "%s", why);
    const sd_unet_config *c = &tr->unet.cfg;
    int side = 1 << (c->nblocks > 0 ? c->nblocks - 1 : 0);
    sd_unet_graph g = {0};
    sd_status rc = sd_unet_plan(&tr->unet, 1, side, side, 77, 0, &g, err);
    if (rc) return rc;
    size_t cap = 2 * (g.nops ? g.nops : 1), own = sd_train_zero2_own(&tr->o, &tr->unet.w, tr->rank, tr->world);
    tr->z2off = malloc(2 * cap * sizeof(size_t));
    tr->fgrad_cap = sd_unet_fused_scratch(&tr->unet, &g);
    tr->z2own = own;
    if (!sd_train_device_run(&tr->o)) {
        tr->fgrad = malloc((tr->fgrad_cap ? tr->fgrad_cap : 1) * sizeof(float));
        tr->gsh = calloc(own ? own : 1, sizeof(float));
    }
    if (tr->z2off) {
        tr->z2len = tr->z2off + cap;
        tr->z2n = sd_unet_fused_order(&tr->unet, &g, tr->z2off, tr->z2len);
    }
    sd_unet_graph_free(&g);
    if (!tr->z2off || (!sd_train_device_run(&tr->o) && (!tr->fgrad || !tr->gsh)))
        return sd_err_set(err, SD_ENOMEM, "out of memory for --zero2");
    return SD_OK;
}

/* src (the scratch) reduce-scattered into the owners' shares: over MPI in
 * host memory, or over NCCL on the GPU's stream, where an owner first adds
 * its share's earlier value into its own part of src to accumulate. */
static sd_status reduce(sd_trainer *tr, float *src, size_t off, size_t len, sd_error *err)
{
    size_t n = tr->unet.w.total;
#if defined(SDTK_HAVE_NCCL) && defined(SDTK_HAVE_CUDA)
    if (tr->nccl && tr->o.optimizer != SD_OPT_ADAMW) { /* whole tensors: to the owner of its run */
        size_t t0, t1, w0, w1;
        int owner = sd_train_tensor_owner(&tr->unet.w, off, tr->world);
        sd_train_tensor_run(&tr->unet.w, tr->rank, tr->world, &t0, &t1, &w0, &w1);
        float *dst = owner == tr->rank ? tr->gsh + (off - w0) : NULL;
        if (dst && tr->z2add) tr->be->add_fwd(tr->exec, len, src, src, dst);
        return sd_nccl_reduce_to(tr->nccl, src, len, owner, dst, sd_cuda_stream(tr->cuda), err);
    }
    if (tr->nccl) {
        for (size_t b = off / SD_DIST_BLOCK; tr->z2add && b * SD_DIST_BLOCK < off + len; b++) {
            size_t lo, hi;
            sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
            size_t s = lo > off ? lo : off, e = hi < off + len ? hi : off + len;
            if (e > s)
                tr->be->add_fwd(tr->exec, e - s, src + (s - off), src + (s - off),
                                tr->gsh + sd_dist_packed_index(n, s, tr->rank, tr->world));
        }
        return sd_nccl_reduce_range(tr->nccl, src, off, len, n, tr->gsh, sd_cuda_stream(tr->cuda), err);
    }
#endif
    if (tr->o.optimizer != SD_OPT_ADAMW) { /* whole tensors: the owner of its run gets the sum */
        size_t t0, t1, w0, w1;
        int owner = sd_train_tensor_owner(&tr->unet.w, off, tr->world);
        sd_train_tensor_run(&tr->unet.w, tr->rank, tr->world, &t0, &t1, &w0, &w1);
        return sd_dist_reduce_to(src, len, owner, owner == tr->rank ? tr->gsh + (off - w0) : NULL, tr->z2add, err);
    }
    return sd_dist_reduce_scatter_range(src, off, len, n, tr->gsh, tr->z2add, err);
}

/* One tensor's gradient of this rank's micro-batch is complete: into its
 * owners' shares, after checking it is the tensor the order expects (a
 * rank out of step would pair other tensors' values). */
static int tensor_done(void *ctx, size_t off, const float *g, size_t n)
{
    sd_trainer *tr = ctx;
    if (tr->z2pos >= tr->z2n || tr->z2off[tr->z2pos] != off || tr->z2len[tr->z2pos] != n) {
        sd_err_set(&tr->z2err, SD_EINVAL,
                   "--zero2: the backward handed over the tensor at offset %zu (%zu floats) where its plan has %s "
                   "(tensor %zu of %zu): the ranks' reduce-scatters would not pair",
                   off, n, tr->z2pos < tr->z2n ? "another" : "none", tr->z2pos, tr->z2n);
        return 1;
    }
    tr->z2pos++;
    float *src = tr->fgrad + (g - tr->fgrad); /* g lies in the scratch, which is ours to reuse */
    return reduce(tr, src, off, n, &tr->z2err) ? 1 : 0;
}

/* This rank's part of one pass of the step: the backward of the
 * micro-batch sd_train_pass just ran forward, each tensor reduce-scattered
 * as it completes; or, idle (no usable batch, or a non-finite loss: the
 * step is dropped anyway), zeros for every tensor in the same order. The
 * step's first pass stores into the shares, later ones add (accumulation). */
sd_status sd_train_zero2_pass(sd_trainer *tr, int idle, sd_error *err)
{
    sd_status rc = SD_OK;
    tr->z2pos = 0;
    if (idle) {
        sd_log(SD_LOG_DEBUG, "--zero2: rank %d has no batch for this pass of step %ld: zeros to the reduce-scatters",
               tr->rank, tr->step + 1);
        for (size_t k = 0; k < tr->z2n && !rc; k++) { /* zeroed each time: NCCL's owner adds into it */
            tr->be->zero(tr->exec, tr->fgrad, tr->z2len[k] * sizeof(float));
            rc = reduce(tr, tr->fgrad, tr->z2off[k], tr->z2len[k], err);
        }
        tr->z2add = 1;
        return rc;
    }
    size_t need = sd_unet_fused_scratch(&tr->unet, &tr->g);
    if (need > tr->fgrad_cap) { /* the ops are the same at any size: a plan of other ops */
        return sd_err_set(err, SD_EINVAL, "--zero2: this batch's graph needs %zu floats of scratch, its plan %zu",
                          need, tr->fgrad_cap);
    }
    sd_unet_wts w = sd_train_wts(tr);
    sd_unet_fuse f = {tr->fgrad, tensor_done, tr};
    memset(&tr->z2err, 0, sizeof tr->z2err);
    if (sd_unet_backward_fused(&tr->unet, &tr->g, tr->be, tr->exec, &w, tr->d_act, tr->d_dact, tr->d_dout, NULL,
                               &f)) {
        *err = tr->z2err;
        return err->code ? err->code : SD_EIO;
    }
    if (tr->z2pos != tr->z2n)
        return sd_err_set(err, SD_EINVAL, "--zero2: the backward handed over %zu tensors, its plan %zu", tr->z2pos,
                          tr->z2n);
    tr->z2add = 1;
    return SD_OK;
}

/* The end of a round: as many idle passes as this rank is short of the
 * round's largest share, ceil(need / world) (rank 0's), so every rank ran
 * the same reduce-scatters. */
sd_status sd_train_zero2_round(sd_trainer *tr, int need, int passes, sd_error *err)
{
    int due = (need + tr->world - 1) / tr->world;
    for (; passes < due; passes++) {
        sd_status rc = sd_train_zero2_pass(tr, 1, err);
        if (rc) return rc;
    }
    return SD_OK;
}
