/* What the step (train_step.c), the update (train_update.c), the
 * validation (train_val.c) and the loop (train_loop.c) all use, kept below
 * them so that none of those files calls back into another: the timestep
 * draw, the seed mixer, the stop request's acknowledgement, whether ZeRO
 * shards the optimizer, and what the UNet expects of a record (also the
 * memory plan's and the samples'), and the per-op gradient scratch. */
#include <stdint.h>
#include <stdlib.h>

#include "log.h"
#include "train_int.h"

/* A timestep in the run's range [t_min, t_max): the whole schedule by
 * default, where the draw is the one it always was. */
int sd_train_draw_timestep(const sd_train_opts *o, sd_rng *rng)
{
    return o->t_min + (int)sd_rng_below(rng, (uint64_t)(o->t_max - o->t_min));
}

/* splitmix64's finaliser: a well-mixed 64-bit hash of x. */
uint64_t sd_train_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The first stop request (SIGINT/SIGTERM) acknowledged as soon as the
 * loop sees it, since a handler may not log and the step in progress (with
 * a large --accum, many micro-batches) and the save still take a while.
 * Shown even with -q; rank 0 speaks for a world of ranks (its own request,
 * or another rank's once the step's reduction agreed on it). */
void sd_train_tell_stop(sd_trainer *tr)
{
    if (tr->stop_told || !((tr->stop_req && *tr->stop_req) || tr->stop_all)) return;
    tr->stop_told = 1;
    if (tr->rank == 0)
        sd_log(SD_LOG_WARN, "stopping after this step and saving a checkpoint; Ctrl-C again to quit at once "
               "(checkpoints already written stay)");
}

/* ZeRO-1 shards the moments; ZeRO-2 shards them the same way and the
 * gradients too. */
int sd_train_sharded(const sd_train_opts *o)
{
    return o->zero1 || o->zero2;
}

/* A device run decided from the options alone, before the backend is open
 * (the refusals and --zero2's host buffers need it that early). */
int sd_train_device_run(const sd_train_opts *o)
{
    return o->device >= 0 || o->nccl || (o->backend && o->backend->is_device);
}

/* What a record must give the UNet of config c (train_int.h). */
sd_load_opts sd_train_unet_load_opts(const sd_unet_config *c)
{
    sd_load_opts lo = {.channels = c->in_channels, .cross_dim = c->cross_dim,
                       .pooled = c->text_time ? c->add_in_dim - SD_UNET_TIME_IDS * c->add_time_dim : 0};
    return lo;
}

/* The per-op gradient scratch (tr->fgrad) of the fused backward, bf16
 * gradients and ZeRO-2, grown to at least need floats in the backend's
 * memory (contents not kept); 0 when out of memory. */
int sd_train_fgrad_reserve(sd_trainer *tr, size_t need)
{
    if (need <= tr->fgrad_cap) return 1;
    if (tr->be && tr->be->is_device) { /* no backend yet (bf16 gradients open before it): host memory */
        if (tr->fgrad) tr->be->release(tr->exec, tr->fgrad);
        tr->fgrad = tr->be->alloc(tr->exec, need * sizeof(float));
    } else {
        float *p = realloc(tr->fgrad, need * sizeof(float));
        if (!p) return 0;
        tr->fgrad = p;
    }
    tr->fgrad_cap = tr->fgrad ? need : 0;
    return tr->fgrad != NULL;
}
