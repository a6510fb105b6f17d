/* The loss on the validation shard. */
#include "train.h"

#include "dist.h"
#include "train_int.h"

/* Every validation batch in order; this rank takes those at positions
 * rank, rank + world, ...; losses and image counts summed over ranks. */
sd_status sd_train_validate(sd_trainer *tr, double *loss, long *images, sd_error *err)
{
    const sd_unet_config *c = &tr->unet.cfg;
    sd_load_opts lo = sd_train_load_opts(tr, 0);
    /* each record's draws (latent sample, timestep, noise) from its own stream: the loss of given
     * weights is the same at any batch size or world size */
    static const uint64_t load_base = 0x76616c2d6c6f6164ULL, draw_base = 0x76616c2d64726177ULL;
    lo.record_seed = load_base;
    int pooled = lo.pooled;
    int world = tr->world > 0 ? tr->world : 1;
    double red[2] = {0, 0};
    sd_tally vt;
    sd_tally_init(&vt, 5);
    sd_data_cursor cur = {0, 0};
    sd_status rc = SD_OK;
    sd_rng rng; /* its own stream: the training's state (saved in checkpoints) stays untouched */
    if (!tr->have_val) return sd_err_set(err, SD_EINVAL, "no validation shard");
    for (size_t k = 0; !rc; k++) {
        sd_data_batch db;
        rc = sd_data_next(&tr->val, &cur, &db, err);
        if (rc || cur.epoch != 0) break; /* past the last batch: sd_data_next rolled into epoch 1 */
        if ((int)(k % (size_t)world) != tr->rank) continue;
        sd_train_tell_stop(tr);
        rc = sd_data_load(&tr->val, &db, &lo, &rng, &tr->vbatch, &vt, err);
        sd_batch *b = &tr->vbatch;
        if (rc || b->n == 0) continue;
        rc = sd_train_prepare(tr, b->n, b->h, b->w, b->tctx, err);
        if (rc) break;
        size_t per = (size_t)b->c * (size_t)b->h * (size_t)b->w;
        for (int i = 0; i < b->n; i++) {
            sd_rng_seed(&rng, sd_data_record_seed(draw_base, b->item[i]));
            tr->t[i] = sd_train_draw_timestep(&tr->o, &rng);
            sd_rng_normal(&rng, tr->noise + (size_t)i * per, per);
        }
        double l;
        rc = sd_train_eval(tr, b->n, b->h, b->w, b->tctx, b->x0, b->ctx, pooled ? b->text : NULL,
                           c->text_time ? b->tids : NULL, tr->noise, tr->t, &l, err);
        red[0] += l * b->n;
        red[1] += b->n;
    }
    if (!rc && world > 1) rc = sd_dist_sum_f64(red, 2, err);
    if (!rc) rc = sd_train_log_tally_all(tr, &vt, "validation records", err);
    else if (vt.total) sd_tally_log(&vt, "validation records");
    if (rc) return rc;
    if (red[1] == 0) return sd_err_set(err, SD_EFORMAT, "the validation shard has no usable record");
    *loss = red[0] / red[1];
    *images = (long)red[1];
    tr->val_loss = *loss;
    return SD_OK;
}
