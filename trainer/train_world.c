/* The ranks' check that they all start from the same state. */
#include "train.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "train_int.h"

/* One value all ranks must share when a run starts, and what makes it
 * differ. */
typedef struct {
    const char *what, *cause;
    int hex;
    uint64_t v;
} world_field;

enum { WORLD_FIELDS = 15 };

/* This rank's state as the ranks compare it: what the step, the data
 * order and every collective of the run depend on. */
static void world_state(const sd_trainer *tr, world_field f[WORLD_FIELDS])
{
    const char *ck = "every rank must resume the same checkpoint: -o (or --resume) on a filesystem all of them see";
    const char *sh = "every rank must open the same shards in the same order";
    const char *op = "every rank must run with the same options";
    world_field v[WORLD_FIELDS] = {
        {"step", ck, 0, (uint64_t)tr->step},
        {"data cursor epoch", ck, 0, (uint64_t)tr->cur.epoch},
        {"data cursor batch", ck, 0, (uint64_t)tr->cur.batch},
        {"checkpoint step on disk", ck, 0, (uint64_t)tr->saved_step},
        {"EMA updates", ck, 0, (uint64_t)tr->ema_updates},
        {"data fingerprint", sh, 1, tr->have_data ? tr->data.fingerprint : 0},
        {"record count", sh, 0, tr->have_data ? (uint64_t)tr->data.nitems : 0},
        {"validation fingerprint", sh, 1, tr->have_val ? tr->val.fingerprint : 0},
        {"parameter count", "every rank must load the same model", 0, (uint64_t)tr->unet.w.total},
        {"seed", op, 0, tr->o.seed},
        {"steps to train", op, 0, (uint64_t)tr->o.max_steps},
        {"batch size", op, 0, (uint64_t)tr->o.batch},
        {"accumulation", op, 0, (uint64_t)tr->o.accum},
        {"ZeRO-1", op, 0, (uint64_t)tr->o.zero1},
        {"ZeRO-2", op, 0, (uint64_t)tr->o.zero2},
    };
    memcpy(f, v, sizeof v);
}

/* A value for the message: signed decimal, or 16 hex digits. */
static void field_text(const world_field *f, uint64_t v, char *out, size_t cap)
{
    if (f->hex) snprintf(out, cap, "%016llx", (unsigned long long)v);
    else snprintf(out, cap, "%lld", (long long)v);
}

/* Several ranks: all-gather every rank's state and compare it with rank
 * 0's, so that a rank that resumed another checkpoint (or none), sees
 * other shards or runs other options stops the run at once, naming itself,
 * instead of training on a mixed state or waiting in mismatched
 * collectives. Every rank reaches the same verdict. */
sd_status sd_train_check_world(const sd_trainer *tr, sd_error *err)
{
    if (tr->world <= 1) return SD_OK;
    world_field f[WORLD_FIELDS];
    uint64_t mine[WORLD_FIELDS];
    world_state(tr, f);
    for (int i = 0; i < WORLD_FIELDS; i++) mine[i] = f[i].v;
    uint64_t *all = malloc((size_t)tr->world * sizeof mine);
    if (!all) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status rc = sd_dist_allgather_bytes(mine, sizeof mine, all, err);
    for (int r = 1; r < tr->world && !rc; r++)
        for (int i = 0; i < WORLD_FIELDS && !rc; i++) {
            uint64_t theirs = all[(size_t)r * WORLD_FIELDS + (size_t)i];
            if (theirs == all[i]) continue;
            char a[24], b[24];
            field_text(&f[i], theirs, a, sizeof a);
            field_text(&f[i], all[i], b, sizeof b);
            rc = sd_err_set(err, SD_EINVAL, "rank %d of %d does not start from rank 0's state: its %s is %s, rank 0's "
                            "%s (%s)", r, tr->world, f[i].what, a, b, f[i].cause);
        }
    free(all);
    return rc;
}
