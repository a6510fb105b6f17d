/* --grad-dtype bf16: the whole-model gradient buffer held as bf16 (tr->g16,
 * 2 bytes a parameter). The backward runs with the fused hook
 * (sd_unet_backward_fused): each op's parameter gradients complete in an
 * fp32 scratch of the largest op's size and are added into g16, widened,
 * summed in fp32 and stored back with stochastic rounding keyed by (seed,
 * step, micro-batch) on a stream of their own, so accumulation over
 * micro-batches stays unbiased and a resumed run rounds as the
 * uninterrupted one did. The update (train_update.c) widens one tensor at
 * a time into the same scratch. */
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "ops_math.h"
#include "train_int.h"

/* Why --grad-dtype bf16 cannot run with these options, NULL when it can. */
const char *sd_train_g16_refusal(const sd_train_opts *o)
{
    if (o->grad_dtype != SD_DT_BF16) return NULL;
    if (o->fused_backward)
        return "--grad-dtype bf16 with --fused-backward means nothing: the fused backward keeps no gradient buffer "
               "(give one of them)";
    if (o->device >= 0 || (o->backend && o->backend->is_device))
        return "--grad-dtype bf16 runs on the CPU only so far (not with --device cuda)";
    if (o->zero1 || o->zero2 || o->nccl || sd_dist_world() > 1)
        return "--grad-dtype bf16 runs in one process only (not under mpirun, --zero1, --zero2 or --nccl: the sum over the "
               "ranks would need the gradient in fp32)";
    return NULL;
}

/* The floats of the fp32 scratch for plan g: an op's gradients while the
 * backward adds them in, one tensor's while the update widens it (so at
 * least the largest tensor, which no op may reach). */
size_t sd_train_g16_scratch(const sd_unet *u, const sd_unet_graph *g)
{
    size_t most = g ? sd_unet_fused_scratch(u, g) : 0;
    for (size_t i = 0; i < u->w.nslots; i++)
        if (u->w.slots[i].n > most) most = u->w.slots[i].n;
    return most ? most : 1;
}

/* The bf16 buffer (zero) and the scratch for the largest tensor; the
 * plan's larger op scratch comes with the first pass. */
sd_status sd_train_g16_open(sd_trainer *tr, sd_error *err)
{
    const char *why = sd_train_g16_refusal(&tr->o);
    if (why) return sd_err_set(err, SD_EUNSUPPORTED, "%s", why);
    size_t n = tr->unet.w.total ? tr->unet.w.total : 1;
    tr->g16 = calloc(n, sizeof *tr->g16);
    if (!tr->g16 || !sd_train_fgrad_reserve(tr, sd_train_g16_scratch(&tr->unet, NULL)))
        return sd_err_set(err, SD_ENOMEM, "out of memory for the bf16 gradient buffer (%zu MiB)",
                          n * sizeof *tr->g16 >> 20);
    return SD_OK;
}

/* The rounding key of micro-batch `micro` (0, 1, ...) of the step that
 * makes `step`: from the seed, the step and the micro-batch alone (another
 * stream than the weights' and the moments'). */
uint32_t sd_train_g16_key(const sd_trainer *tr, long step, long micro)
{
    uint64_t k = sd_train_mix64(tr->o.seed ^ 0x677261642d626631ULL);
    k = sd_train_mix64(k ^ (uint64_t)step);
    return (uint32_t)(sd_train_mix64(k ^ (uint64_t)micro) >> 32);
}

/* One tensor's add: g16[off + i] = round(widen(g16[off + i]) + g[i]). */
typedef struct {
    uint16_t *dst;
    const float *g;
    size_t off;
    uint32_t key;
} g16_add_job;

/* Elements [b, e) of a g16_add_job, each rounded with the bits of its
 * global index (the same on any thread count). */
static void add_range(void *ctx, int worker, size_t b, size_t e)
{
    const g16_add_job *j = ctx;
    (void)worker;
    for (size_t i = b; i < e; i++)
        j->dst[i] = sdm_bf16_sr(sdm_bf16_widen(j->dst[i]) + j->g[i], sdm_mix32(j->key, j->off + i));
}

/* n fp32 gradients g of the tensor at float offset off added into the
 * bf16 buffer with key (a NaN or infinity stays one: the step's norm
 * then drops the step). */
void sd_train_g16_add(uint16_t *g16, sd_pool *pool, uint32_t key, size_t off, const float *g, size_t n)
{
    g16_add_job j = {g16 + off, g, off, key};
    sd_pool_for(pool, n, add_range, &j);
}

/* The fused hook: an op's tensor gradient complete in the scratch, added
 * into g16 with the micro-batch's key. */
static int tensor_done(void *ctx, size_t off, const float *g, size_t n)
{
    sd_trainer *tr = ctx;
    if (off + n > tr->unet.w.total) return 1; /* not a tensor of the model */
    sd_train_g16_add(tr->g16, tr->pool, tr->g16_key, off, g, n);
    return 0;
}

/* The backward of the pass sd_train_pass ran forward (the output's
 * gradient in place) with the parameter gradients added into g16; the
 * micro-batch counted. */
sd_status sd_train_g16_backward(sd_trainer *tr, sd_error *err)
{
    size_t need = sd_train_g16_scratch(&tr->unet, &tr->g);
    if (!sd_train_fgrad_reserve(tr, need))
        return sd_err_set(err, SD_ENOMEM, "out of memory for the bf16 gradients' op scratch (%zu MiB)",
                          need * sizeof(float) >> 20);
    sd_unet_wts w = sd_train_wts(tr);
    tr->g16_key = sd_train_g16_key(tr, tr->step + 1, tr->g16_micro++);
    sd_unet_fuse f = {tr->fgrad, tensor_done, tr};
    if (sd_unet_backward_fused(&tr->unet, &tr->g, tr->be, tr->exec, &w, tr->d_act, tr->d_dact, tr->d_dout, NULL, &f))
        return sd_err_set(err, SD_EINVAL, "bf16 gradients: the backward handed over a range outside the model");
    return SD_OK;
}
