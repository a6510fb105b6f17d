/* The training loop: steps, progress, metrics, TensorBoard, validation,
 * checkpoints, stop requests and non-finite losses. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "log.h"
#include "progress.h"
#include "train_int.h"

/* After a metrics line: a write that failed (disk full) is named once and
 * the file closed, so no torn line follows; training goes on, since the
 * checkpoints are what a run must not lose. */
static void metrics_done(sd_trainer *tr)
{
    if (fflush(tr->metrics) == 0 && !ferror(tr->metrics)) return;
    sd_log(SD_LOG_WARN, "%s: writing the metrics failed (%s): no more metrics lines in this run", tr->o.metrics,
           strerror(errno));
    fclose(tr->metrics);
    tr->metrics = NULL;
}

/* One TensorBoard scalar; a failed write (a full disk) is a warning and the
 * end of the events for this run, as with the metrics file: a run must not
 * lose its steps, or its last checkpoint, to a log. */
static void tb_put(sd_trainer *tr, const char *tag, double value)
{
    sd_error e = {0};
    if (!tr->tb.f || sd_tb_scalar(&tr->tb, tag, tr->step, value, &e) == SD_OK) return;
    sd_log(SD_LOG_WARN, "%s: no more TensorBoard events in this run", e.msg);
    sd_tb_close(&tr->tb);
}

/* Validate, log and write the metrics line. */
static sd_status validate_and_log(sd_trainer *tr, sd_error *err)
{
    double loss;
    long images;
    sd_status rc = sd_train_validate(tr, &loss, &images, err);
    if (rc) return rc;
    if (!tr->o.quiet && tr->rank == 0)
        sd_log(SD_LOG_INFO, "step %ld: validation loss %.6f over %ld images", tr->step, loss, images);
    if (tr->metrics) {
        fprintf(tr->metrics, "{\"step\": %ld, \"val_loss\": %.9g, \"val_images\": %ld}\n", tr->step, loss, images);
        metrics_done(tr);
    }
    tb_put(tr, "val/loss", loss);
    return SD_OK;
}

/* One metrics line: step, loss, smoothed loss, lr, gradient norm, images,
 * seconds. */
static void log_metrics(sd_trainer *tr, double loss, double gnorm, double lr, double secs)
{
    if (tr->metrics) {
        fprintf(tr->metrics,
                "{\"step\": %ld, \"loss\": %.9g, \"loss_smooth\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                "\"images\": %ld, \"seconds\": %.3f}\n",
                tr->step, loss, tr->loss_ema, lr, gnorm, tr->images, secs);
        metrics_done(tr);
    }
    const char *tags[] = {"train/loss", "train/loss_smooth", "train/lr", "train/grad_norm"};
    double v[] = {loss, tr->loss_ema, lr, gnorm};
    for (int i = 0; i < 4; i++) tb_put(tr, tags[i], v[i]);
}

/* The loop: steps, progress, metrics, checkpoints, stop and NaN handling. */
sd_status sd_train_run(sd_trainer *tr, volatile sig_atomic_t *stop, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    sd_status crc = sd_train_check_world(tr, err);
    if (crc) return crc;
    if (o->metrics && !tr->metrics && tr->rank == 0) {
        /* a resumed run keeps the lines through its checkpoint's step, a new one none */
        sd_status mrc = sd_metrics_open(o->metrics, tr->saved_step >= 0 ? tr->step : -1, &tr->metrics, err);
        if (mrc) return mrc;
    }
    if (o->tensorboard && !tr->tb.f && tr->rank == 0) {
        /* a new run's baseline validation is at step 0, a resumed run logs from step + 1 */
        sd_status trc = sd_tb_open(&tr->tb, o->tensorboard, tr->step == 0 ? 0 : tr->step + 1, err);
        if (trc) return trc;
    }
    if (o->sample_prompts && !tr->samples) {
        sd_status src = sd_train_samples_open(tr, err); /* rank 0; an unusable model only warns */
        if (src) return src;
    }
    double t0 = sd_now(), last = t0;
    long step0 = tr->step, img0 = tr->images;
    sd_status rc = SD_OK;
    tr->stop_req = stop;
    tr->stop_all = 0;
    tr->stop_told = 0;
    long val_step = -1; /* the step of the last validation */
    /* this -o's own checkpoint of the step resumed: the run that saved it validated and logged that
     * step already (a finished run started again, a stop before the first step), so no second time */
    int logged = tr->saved_step == tr->step;
    if (tr->have_val && tr->step == 0 && !logged) { /* the baseline of a new run */
        rc = validate_and_log(tr, err);
        if (rc) return rc;
        val_step = 0;
    }
    /* several ranks stop together, after the step in which one asked */
    while (tr->step < o->max_steps && !(tr->world > 1 ? tr->stop_all : stop && *stop)) {
        double lr = sd_lr_at(&o->lr, tr->step), loss, gnorm;
        rc = sd_train_step(tr, &loss, &gnorm, err);
        if (rc) break;
        if (!isfinite(loss) || !isfinite(gnorm)) {
            const char *what = isfinite(loss) ? "gradient" : "loss";
            int finite = 0;
            rc = sd_train_weights_finite(tr, &finite, err);
            if (rc) return rc;
            if (!finite) { /* an earlier step broke them (--lr far too large): saved, they resume broken */
                sd_log(SD_LOG_ERROR, "%s %g at step %ld, and the weights themselves are not finite: stopping without "
                       "saving them (the checkpoints already in %s stay as they are)", what,
                       isfinite(loss) ? gnorm : loss, tr->step + 1, tr->o.out_dir);
                return sd_err_set(err, SD_ERANGE, "non-finite %s at step %ld after non-finite weights", what,
                                  tr->step + 1);
            }
            if (tr->fused_broken) { /* --fused-backward: tensors before it were updated already */
                sd_log(SD_LOG_ERROR, "a parameter gradient is not finite at step %ld (loss %g) with "
                       "--fused-backward: the tensors reached before it are updated already, so this state is not "
                       "saved; the checkpoints already in %s stay as they are", tr->step + 1, loss, tr->o.out_dir);
                return sd_err_set(err, SD_ERANGE, "non-finite gradient at step %ld (not saved: half-updated)",
                                  tr->step + 1);
            }
            if (isfinite(loss))
                sd_log(SD_LOG_ERROR, "the gradient norm is %g at step %ld (the loss, %g, is finite): stopping; the "
                       "checkpoint holds the state before it", gnorm, tr->step + 1, loss);
            else
                sd_log(SD_LOG_ERROR, "loss is %g at step %ld: stopping; the checkpoint holds the state before it", loss,
                       tr->step + 1);
            if (tr->saved_step != tr->step) rc = sd_train_save(tr, err);
            if (!rc)
                rc = sd_err_set(err, SD_ERANGE, "non-finite %s at step %ld", isfinite(loss) ? "gradient" : "loss",
                                tr->step + 1);
            return rc;
        }
        tr->loss_ema = isnan(tr->loss_ema) ? loss : 0.98 * tr->loss_ema + 0.02 * loss;
        double now = sd_now();
        log_metrics(tr, loss, gnorm, lr, now - t0);
        if (!o->quiet && (now - last >= 2.0 || tr->step == o->max_steps)) {
            double el = now - t0, its = (double)(tr->step - step0) / (el > 0 ? el : 1);
            double eta = its > 0 ? (double)(o->max_steps - tr->step) / its : 0;
            fprintf(stderr, "step %ld/%ld  loss %.5f (smooth %.5f)  lr %.3g  %.2f it/s  %.2f img/s  eta %.0fs\n",
                    tr->step, o->max_steps, loss, tr->loss_ema, lr, its, (double)(tr->images - img0) / (el > 0 ? el : 1),
                    eta);
            last = now;
        }
        int saving = o->save_every > 0 && tr->step % o->save_every == 0 && tr->step < o->max_steps;
        if (tr->have_val && (o->val_every > 0 ? tr->step % o->val_every == 0 : saving)) {
            rc = validate_and_log(tr, err);
            if (rc) break;
            val_step = tr->step;
        }
        if (saving) {
            rc = sd_train_save(tr, err);
            if (rc) break;
        }
        /* after the save, so a checkpoint step's images go into its checkpoint */
        if ((o->sample_every > 0 ? tr->step % o->sample_every == 0 && tr->step < o->max_steps : saving) &&
            !(tr->world > 1 ? tr->stop_all : stop && *stop))
            sd_train_samples_render(tr, 0);
    }
    sd_train_tell_stop(tr); /* a request that came after the last micro-batch */
    if (!rc && tr->have_val && val_step != tr->step && !(tr->step == step0 && logged))
        rc = validate_and_log(tr, err);
    if (!rc && tr->saved_step != tr->step) rc = sd_train_save(tr, err); /* not again after a stop on a save step */
    else if (!rc && !o->quiet && tr->step == step0) /* nothing to do: say why, --steps is a total */
        sd_log(SD_LOG_INFO, "checkpoint-%ld already holds step %ld: --steps %ld is the step to train to, not a "
               "count of more steps; give a larger --steps to go on", tr->step, tr->step, o->max_steps);
    else if (!rc && !o->quiet) sd_log(SD_LOG_INFO, "checkpoint-%ld already holds step %ld", tr->step, tr->step);
    /* the end's samples, not after a stop request (a scheduler's grace time is short); a run that took no
     * step renders only what its predecessor's kill left missing */
    if (!rc && !(tr->world > 1 ? tr->stop_all : stop && *stop))
        sd_train_samples_render(tr, tr->step == step0 && logged);
    sd_train_samples_summary(tr);
    /* a bad record is met again each epoch: the counts are of draws */
    const char *what = "records skipped, counted each time drawn";
    if (!rc) rc = sd_train_log_tally_all(tr, &tr->tally, what, err);
    else if (tr->tally.total) sd_tally_log(&tr->tally, what); /* the ranks may be apart now: this rank's */
    return rc;
}
