/* The counts of skipped records summed over the ranks. */
#include "train.h"

#include <stdlib.h>

#include "dist.h"
#include "train_int.h"

/* A reason and its count as the ranks exchange them: text, since each
 * rank's reason strings live at its own addresses. */
enum { REASON_CAP = 120 };
typedef struct {
    uint64_t n;
    char reason[REASON_CAP];
} tally_wire;

/* A tally's summary over every rank: each rank's counts gathered by
 * reason and summed (in rank order), logged by rank 0; alone, this
 * rank's. Collective: every rank calls it at the same point. Nothing is
 * logged when no rank skipped a record. */
sd_status sd_train_log_tally_all(const sd_trainer *tr, const sd_tally *t, const char *what, sd_error *err)
{
    size_t world = tr->world > 1 ? (size_t)tr->world : 1, one = SD_TALLY_MAX * sizeof(tally_wire);
    if (world == 1) {
        if (t->total) sd_tally_log(t, what);
        return SD_OK;
    }
    tally_wire *all = calloc(world + 1, one); /* every rank's, then this rank's own to send */
    if (!all) return sd_err_set(err, SD_ENOMEM, "out of memory");
    tally_wire *mine = all + world * SD_TALLY_MAX;
    for (int i = 0; i < t->n && i < SD_TALLY_MAX; i++) {
        mine[i].n = t->e[i].n;
        snprintf(mine[i].reason, REASON_CAP, "%s", t->e[i].reason);
    }
    sd_status rc = sd_dist_allgather_bytes(mine, one, all, err);
    if (!rc && tr->rank == 0) {
        sd_tally sum; /* its reasons point into all, which outlives it */
        sd_tally_init(&sum, 0);
        for (size_t i = 0; i < world * SD_TALLY_MAX; i++)
            if (all[i].n) sd_tally_add(&sum, all[i].reason, all[i].n);
        if (sum.total) sd_tally_log(&sum, what);
    }
    free(all);
    return rc;
}
