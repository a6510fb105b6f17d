/* --epochs as a count of steps. */
#include "train.h"

#include <math.h>

#include "log.h"

/* Steps for a count of batches, ceil(batches / per_step), held below
 * 10^18 so that no count of epochs, records and repeats overflows a long
 * (a run of that many steps never ends anyway). */
static long steps_for(double batches, double per_step)
{
    double q = ceil(batches / per_step);
    return q < 1e18 ? (long)q : (long)1e18;
}

/* --epochs as steps (train.h). A resume of the same epochs and world
 * keeps the checkpoint's plan, which a world change before it may have
 * moved, so every later resume ends where that one would; after a world
 * change the steps left come from the batches the cursor has not reached;
 * a new run (or a checkpoint from before plans were saved) counts from 0. */
void sd_train_set_epochs(sd_trainer *tr, long epochs)
{
    int world = tr->world > 0 ? tr->world : 1;
    double per = sd_data_epoch_batches(&tr->data), total = (double)epochs * per;
    double step_batches = (double)world * (double)tr->o.accum;
    long steps = steps_for(total, step_batches);
    tr->epochs = epochs;
    int same_world = tr->saved_world <= 0 || tr->saved_world == world;
    if (same_world && tr->saved_epochs == epochs && tr->saved_epochs_steps > 0) {
        steps = tr->saved_epochs_steps;
        sd_log(SD_LOG_INFO, "%ld epoch%s: the checkpoint's plan of %ld steps", epochs, epochs == 1 ? "" : "s", steps);
    } else if (same_world && tr->saved_epochs_steps > 0) { /* --epochs changed: count on from the cursor */
        double left = total - sd_data_batches_served(&tr->data, &tr->cur);
        steps = tr->step + (left > 0 ? steps_for(left, step_batches) : 0);
        sd_log(SD_LOG_INFO, "%ld epochs resumed at step %ld: %.6g batches left, the run ends at step %ld", epochs,
               tr->step, left > 0 ? left : 0.0, steps);
    } else if (!same_world) {
        double left = total - sd_data_batches_served(&tr->data, &tr->cur);
        long was = tr->saved_epochs == epochs && tr->saved_epochs_steps > 0
                       ? tr->saved_epochs_steps
                       : steps_for(total, (double)tr->saved_world * (double)tr->o.accum);
        long from_zero = steps;
        steps = tr->step + (left > 0 ? steps_for(left, step_batches) : 0);
        sd_lr_sched before = tr->o.lr, after = tr->o.lr;
        before.total = was;
        after.total = steps;
        if (tr->rank == 0)
            sd_log(SD_LOG_WARN, "--epochs %ld resumed at step %ld with %d rank(s) instead of %d: %.6g of %.6g batches "
                   "are left, %ld steps of %g, so the run ends at step %ld (not %ld, as if every step had %d "
                   "rank(s)), and the LR schedule spans %ld steps instead of %ld: at step %ld the learning rate goes "
                   "from %.6g to %.6g", epochs, tr->step, world, tr->saved_world, left > 0 ? left : 0.0, total,
                   steps - tr->step, step_batches, steps, from_zero, world, steps, was, tr->step,
                   sd_lr_at(&before, tr->step), sd_lr_at(&after, tr->step));
    } else {
        sd_log(SD_LOG_INFO, "%ld epoch%s of %.6g batches (%d rank%s, accumulation %d) = %ld steps", epochs,
               epochs == 1 ? "" : "s", per, world, world == 1 ? "" : "s", tr->o.accum, steps);
    }
    tr->o.max_steps = tr->o.lr.total = tr->epochs_steps = steps;
}
