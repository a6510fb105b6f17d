/* Resuming from a training checkpoint (ckpt_save.c writes them): the
 * newest whole one found, its options checked against the run's, and the
 * weights, moments, counters, data cursor and RNG state loaded. */
#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_int.h"
#include "dtype.h"
#include "log.h"
#include "safetensors.h"
#include "slurp.h"
#include "train.h"
#include "train_int.h"

/* A metadata value of the state file, NULL when absent. */
static const char *meta_of(const sd_safetensors *st, const char *key)
{
    for (size_t i = 0; i < sd_st_meta_count(st); i++)
        if (strcmp(sd_st_meta_at(st, i)->key, key) == 0) return sd_st_meta_at(st, i)->value;
    return NULL;
}

/* A flat fp32 tensor of n values in the state file, checked. */
static sd_status flat_of(const sd_safetensors *st, const char *name, size_t n, const char *path,
                         const sd_st_tensor **out, sd_error *err)
{
    const sd_st_tensor *t = sd_st_find(st, name);
    if (!t || t->dtype != SD_ST_F32 || t->ndim != 1 || t->shape[0] != n)
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s missing or not %zu fp32 values", path, name, n);
    *out = t;
    return SD_OK;
}

/* The state file's moments (fp32 or bf16, both of n values and the same
 * dtype), checked; *dt their SD_DT_ type. A run that stores the other
 * type is told that they are converted once. */
static sd_status moments_of(const sd_trainer *tr, const sd_safetensors *st, size_t n, const char *path,
                            const sd_st_tensor **m, const sd_st_tensor **v, int *dt, sd_error *err)
{
    *m = sd_st_find(st, "adam_m");
    *v = sd_st_find(st, "adam_v");
    for (int i = 0; i < 2; i++) {
        const sd_st_tensor *t = i ? *v : *m;
        if (!t || (t->dtype != SD_ST_F32 && t->dtype != SD_ST_BF16) || t->dtype != (*m)->dtype || t->ndim != 1 ||
            t->shape[0] != n)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor %s missing or not %zu fp32 or bf16 values (as adam_m)",
                              path, i ? "adam_v" : "adam_m", n);
    }
    *dt = (*m)->dtype == SD_ST_BF16 ? SD_DT_BF16 : SD_DT_F32;
    if (*dt != tr->o.moments && tr->rank == 0)
        sd_log(SD_LOG_WARN, "%s: the AdamW moments are %s there and %s in this run: %s once (not an exact "
               "continuation)", path, sd_dtype_name(*dt), sd_dtype_name(tr->o.moments),
               *dt == SD_DT_F32 ? "rounded to bf16" : "widened");
    return SD_OK;
}

/* A flat fp32 tensor of the state file into dst (n floats). */
static sd_status read_flat(const sd_safetensors *st, const char *name, float *dst, size_t n, const char *path,
                           sd_error *err)
{
    const sd_st_tensor *b = sd_st_find(st, name);
    if (b && b->dtype == SD_ST_BF16 && b->ndim == 1 && b->shape[0] == n) { /* a bf16-weight run's params */
        const unsigned char *d = b->data;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = ((uint32_t)d[2 * i] | (uint32_t)d[2 * i + 1] << 8) << 16;
            memcpy(dst + i, &u, 4);
        }
        return SD_OK;
    }
    const sd_st_tensor *t = NULL;
    sd_status rc = flat_of(st, name, n, path, &t, err);
    if (!rc) memcpy(dst, t->data, n * 4);
    return rc;
}

/* A bf16 run's own params (BF16, flat, n values) read straight into its
 * bf16 weights (exact); 0 when the state holds something else, which then
 * goes through an fp32 view (sd_train_w16_f32). */
static int read_w16_direct(sd_trainer *tr, const sd_safetensors *st, size_t n)
{
    const sd_st_tensor *b = sd_st_find(st, "params");
    if (!tr->w16 || !b || b->dtype != SD_ST_BF16 || b->ndim != 1 || b->shape[0] != n) return 0;
    const unsigned char *d = b->data;
    for (size_t i = 0; i < n; i++) tr->w16[i] = (uint16_t)(d[2 * i] | d[2 * i + 1] << 8);
    return 1;
}

/* Resolve dir (a checkpoint, or an output directory with latest) into out
 * (PATH_CAP bytes); name gets what latest holds, "" without one. */
static sd_status resolve(const char *dir, char *out, char name[128], sd_error *err)
{
    char p[PATH_CAP];
    sd_train_pjoin(p, dir, "latest");
    name[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f) {
        snprintf(out, PATH_CAP, "%s", dir);
        return SD_OK;
    }
    int ok = fgets(name, 128, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    if (!ok || sd_train_ckpt_step(name) < 0) return sd_err_set(err, SD_EFORMAT, "%s: not a checkpoint name", p);
    sd_train_pjoin(out, dir, name);
    struct stat sb;
    char old[PATH_CAP];
    if (stat(out, &sb) != 0 && (size_t)snprintf(old, sizeof old, "%s.old", out) < sizeof old && stat(old, &sb) == 0) {
        sd_log(SD_LOG_WARN, "%s is missing: taking %s, the same step's earlier save (a run was killed while "
               "replacing it)", out, old);
        memcpy(out, old, strlen(old) + 1);
    }
    return SD_OK;
}

/* Check one option the checkpoint was made with against this run's. */
static sd_status same(const sd_safetensors *st, const char *key, const char *want, const char *path, sd_error *err)
{
    const char *v = meta_of(st, key);
    if (!v || strcmp(v, want) != 0)
        return sd_err_set(err, SD_EINVAL, "%s: made with %s %s, this run has %s: resume with the same options", path,
                          key, v ? v : "(none)", want);
    return SD_OK;
}

/* The shard list of a run: names joined by ", ", cut with "..." where
 * they do not fit cap. */
static void join_names(char *buf, size_t cap, const char *const *v, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && at + 4 < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", v[i]);
        if (w < 0 || (size_t)w >= cap - at) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), 4, "...");
            return;
        }
        at += (size_t)w;
    }
}

/* Other training data than the checkpoint's: the shards it was made from
 * (its train_config.json's _shards) and this run's, since a fingerprint
 * alone tells a user nothing. */
static sd_status data_differs(const sd_trainer *tr, const char *ck, const char *p, sd_error *err)
{
    char cfg[PATH_CAP], was[600] = "(not recorded)", now[600];
    sd_train_pjoin(cfg, ck, "train_config.json");
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 12);
    sd_error e = {0};
    const sd_json *sh = sd_parse_json_file(cfg, &text, &a, &root, &e) == SD_OK ? sd_json_get(root, "_shards") : NULL;
    if (sh && sh->type == SD_JSON_ARRAY) {
        const char *names[64];
        size_t n = 0;
        for (const sd_json *v = sh->child; v && n < 64; v = v->next)
            if (v->type == SD_JSON_STRING) names[n++] = v->str;
        join_names(was, sizeof was, names, n);
    }
    join_names(now, sizeof now, tr->o.shards, (size_t)tr->o.nshards);
    sd_status rc = sd_err_set(err, SD_EINVAL, "%s: made from other training data (%s) than this run's (%s), or from "
                              "shards of these names holding other records: resume with the same shards in the same "
                              "order and repeats, or start a new run from its weights with --unet %s/unet",
                              p, was, now, ck);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* The newest checkpoint-N of out below step `below` that is whole (it
 * holds its state file), -1 when there is none. */
long sd_train_newest_checkpoint(const char *out, long below)
{
    DIR *d = opendir(out);
    if (!d) return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = sd_train_ckpt_step(e->d_name);
        if (s > best && s < below && sd_train_ckpt_whole(out, e->d_name)) best = s;
    }
    closedir(d);
    return best;
}

/* The checkpoint's unet/config.json against the run's UNet: a resume
 * under another architecture with the same parameter count (other head
 * counts or norm groups) would load the weights into the wrong model
 * silently. The first field that differs is named. */
static sd_status same_unet(const sd_unet_config *run, const char *ck, sd_error *err)
{
    char p[PATH_CAP], field[96], here[32], there[32];
    sd_train_pjoin(p, ck, "unet/config.json");
    sd_unet_config c;
    sd_error e = {0};
    sd_unet_config_default(&c); /* what the file leaves out keeps diffusers' default, as for the run's */
    if (sd_unet_config_read(p, &c, &e)) return sd_err_set(err, SD_EFORMAT, "%s", e.msg);
    if (!sd_unet_config_diff(run, &c, field, sizeof field, here, there, sizeof here)) return SD_OK;
    return sd_err_set(err, SD_EINVAL, "%s: the checkpoint's UNet differs from this run's (%s: %s there, %s here): "
                      "resume with the model it was made with, or start a new run from its weights with --unet "
                      "%s/unet", p, field, there, here, ck);
}

/* The checkpoint's optimizer (states from before the option: AdamW)
 * against the run's: another one's state cannot continue this one, and
 * Adafactor with and without a first moment keep different state. */
static sd_status same_optimizer(const sd_trainer *tr, const sd_safetensors *st, const char *ck, const char *path,
                                sd_error *err)
{
    const char *was = meta_of(st, "optimizer"), *now = sd_optimizer_name(tr->o.optimizer);
    if (!was) was = "adamw";
    if (strcmp(was, now) != 0)
        return sd_err_set(err, SD_EINVAL, "%s: made with --optimizer %s, this run has --optimizer %s: resume with "
                          "--optimizer %s, or start a new run from its weights with --unet %s/unet", path, was, now,
                          was, ck);
    const char *b1 = meta_of(st, "adafactor_beta1");
    int had_m = b1 && strcmp(b1, "none") != 0, has_m = tr->o.adafactor_beta1 >= 0;
    char shown[32] = "not given"; /* the value as a person would type it, not all 17 digits */
    if (had_m) snprintf(shown, sizeof shown, "%g", strtod(b1, NULL));
    if (tr->o.optimizer == SD_OPT_ADAFACTOR && had_m != has_m)
        return sd_err_set(err, SD_EINVAL, "%s: made %s Adafactor's first moment (--adafactor-beta1 %s), this run %s "
                          "it: resume %s --adafactor-beta1", path, had_m ? "with" : "without", shown,
                          has_m ? "has" : "lacks", had_m ? "with" : "without");
    return SD_OK;
}

/* The state file's buffers of 8-bit AdamW or Adafactor (opt.NAME, each
 * of the dtype and size the whole model's layout gives) into the run's
 * state: whole, or under ZeRO this rank's run of tensors' part of each. */
static sd_status read_opt_state(sd_trainer *tr, const sd_safetensors *st, const char *path, sd_error *err)
{
    for (size_t i = 0; i < tr->opt.nbufs; i++) {
        sd_opt_buf *b = &tr->opt.bufs[i];
        size_t start = 0, whole = b->count, es = b->st_dtype == SD_ST_U8 ? 1 : 4;
        if (sd_train_sharded(&tr->o)) {
            sd_status rc = sd_train_tensor_state_at(tr, i, &start, &whole, err);
            if (rc) return rc;
        }
        if (!whole) continue;
        char name[64];
        snprintf(name, sizeof name, "opt.%s", b->name);
        const sd_st_tensor *t = sd_st_find(st, name);
        if (!t || (int)t->dtype != b->st_dtype || t->ndim != 1 || t->shape[0] != whole)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor %s missing or not %zu %s values", path, name, whole,
                              b->st_dtype == SD_ST_U8 ? "uint8" : "fp32");
        if (b->count) memcpy(b->data, (const char *)t->data + start * es, b->count * es);
    }
    return SD_OK;
}

/* A checkpoint of the other --weight-dtype is taken, with a warning: fp32
 * weights are rounded once to the nearest bf16, bf16 weights widen
 * exactly; either way not the uninterrupted run (states from before the
 * option held fp32 weights). */
static void weight_dtype_note(const sd_trainer *tr, const sd_safetensors *st, const char *path)
{
    const char *was = meta_of(st, "weight_dtype"), *now = tr->w16 ? "bf16" : "fp32";
    if (!was) was = "fp32";
    if (strcmp(was, now) == 0 || tr->rank != 0) return;
    sd_log(SD_LOG_WARN, "%s: the weights are %s there and %s in this run (--weight-dtype): %s once (not an exact "
           "continuation)", path, was, now, tr->w16 ? "rounded to the nearest bf16" : "widened exactly");
}

/* Load weights, moments, counters, cursor and RNG state. */
static sd_status resume_from(sd_trainer *tr, const char *ck, sd_error *err)
{
    char p[PATH_CAP], w[64];
    sd_train_pjoin(p, ck, "state.safetensors");
    sd_safetensors *st = NULL;
    sd_status rc = sd_st_open(&st, p, err);
    if (rc) return rc;
    size_t n = tr->unet.w.total;
    const char *fmt = meta_of(st, "format");
    if (!fmt || strcmp(fmt, "sdtk-train-state 1") != 0)
        rc = sd_err_set(err, SD_EFORMAT, "%s: not an sdtk training state", p);
    snprintf(w, sizeof w, "%zu", n);
    if (!rc) rc = same(st, "param_floats", w, p, err);
    if (!rc) rc = same_unet(&tr->unet.cfg, ck, err);
    snprintf(w, sizeof w, "%" PRIu64, tr->o.seed);
    if (!rc) rc = same(st, "seed", w, p, err);
    snprintf(w, sizeof w, "%d", tr->o.batch);
    if (!rc) rc = same(st, "batch_size", w, p, err);
    snprintf(w, sizeof w, "%d", tr->o.accum);
    if (!rc) rc = same(st, "accumulation", w, p, err);
    if (!rc) {
        /* the global batch is world x batch x accumulation: another world
         * size keeps the model, moments and cursor but changes the batch */
        const char *ws = meta_of(st, "world_size");
        int was = ws ? atoi(ws) : 1, now = tr->world > 0 ? tr->world : 1;
        tr->saved_world = was > 0 ? was : 1;
        const char *ep = meta_of(st, "epochs"), *es = meta_of(st, "epochs_steps");
        tr->saved_epochs = ep ? atol(ep) : 0;
        tr->saved_epochs_steps = es ? atol(es) : 0;
        if (was != now && tr->rank == 0)
            sd_log(SD_LOG_WARN,
                   "%s: made with %d rank(s), this run has %d: the global batch changes from %d to %d samples per "
                   "step and the batches continue from the saved cursor in another grouping (not an exact "
                   "continuation)",
                   p, was, now, was * tr->o.batch * tr->o.accum, now * tr->o.batch * tr->o.accum);
    }
    if (!rc) rc = same(st, "prediction", sd_prediction_name(tr->o.pred), p, err);
    if (!rc) { /* the schedule: states from before the option have the plain one */
        const char *was = meta_of(st, "zero_terminal_snr");
        if ((was && strcmp(was, "1") == 0) != (tr->o.zero_terminal_snr != 0))
            rc = sd_err_set(err, SD_EINVAL, "%s: made %s --zero-terminal-snr, this run %s it: resume with the same "
                            "noise schedule", p, was && strcmp(was, "1") == 0 ? "with" : "without",
                            tr->o.zero_terminal_snr ? "has" : "lacks");
    }
    if (!rc) { /* how epochs are cut decides the data order; states from before full batches cut short ones */
        const char *was = meta_of(st, "batches"), *now = tr->o.no_carry ? "short" : "full";
        if (strcmp(was ? was : "short", now) != 0)
            rc = sd_err_set(err, SD_EINVAL, "%s: made with %s last batches per bucket, this run has %s: resume %s",
                            p, was ? was : "short", now, tr->o.no_carry ? "without --no-carry" : "with --no-carry");
    }
    snprintf(w, sizeof w, "%016" PRIx64, tr->have_data ? tr->data.fingerprint : 0);
    if (!rc && (!meta_of(st, "data_fingerprint") || strcmp(meta_of(st, "data_fingerprint"), w) != 0))
        rc = data_differs(tr, ck, p, err);
    if (!rc) rc = same_optimizer(tr, st, ck, p, err);
    if (!rc) weight_dtype_note(tr, st, p);
    const sd_st_tensor *tm = NULL, *tv = NULL;
    int mdt = SD_DT_F32;
    if (!rc && tr->o.optimizer != SD_OPT_ADAMW) rc = read_opt_state(tr, st, p, err);
    else if (!rc) rc = moments_of(tr, st, n, p, &tm, &tv, &mdt, err);
    if (rc || tr->o.optimizer != SD_OPT_ADAMW) {
        /* nothing more of AdamW's */
    } else if (sd_train_sharded(&tr->o)) { /* each rank takes its segments from the mapped file: no whole copy */
        sd_train_moments_from(tr, tm->data, tv->data, mdt);
    } else {
        sd_train_moments_convert(tr->m, tr->o.moments, tm->data, mdt, n);
        sd_train_moments_convert(tr->v, tr->o.moments, tv->data, mdt, n);
    }
    /* bf16 weights: their own params straight in, anything else read as fp32
     * into the (zero) gradient buffer, or a temporary one with
     * --fused-backward, and rounded in at the end */
    int direct = !rc && read_w16_direct(tr, st, n);
    if (!rc && !direct) rc = sd_train_w16_f32(tr, err);
    if (rc || direct) {
        /* the weights are in, or an error */
    } else if (sd_st_find(st, "params")) {
        rc = read_flat(st, "params", tr->unet.w.data, n, p, err);
    } else if (!rc) {
        /* fp32 unet/ holds the master weights exactly */
        char wp[PATH_CAP];
        sd_train_pjoin(wp, ck, "unet/diffusion_pytorch_model.safetensors");
        sd_safetensors *ws = NULL;
        rc = sd_st_open(&ws, wp, err);
        sd_weight_layout lay = {"", 0};
        if (!rc) rc = sd_weights_load(&tr->unet.w, ws, &lay, wp, err);
        if (ws) sd_st_close(ws);
    }
    if (!rc && !tr->ema) {
        const char *eu = meta_of(st, "ema_updates");
        if (eu && strtol(eu, NULL, 10) >= 0)
            rc = sd_err_set(err, SD_EINVAL, "%s: the checkpoint keeps an EMA of the weights: resume with --ema-decay "
                            "(or start a new run from its unet/ without one)", p);
    }
    if (!rc && tr->ema) {
        const char *eu = meta_of(st, "ema_updates");
        long upd = eu ? strtol(eu, NULL, 10) : -1;
        if (upd < 0) rc = sd_err_set(err, SD_EINVAL, "%s: the checkpoint has no EMA weights (trained without EMA)", p);
        else if (sd_st_find(st, "ema")) rc = read_flat(st, "ema", tr->ema, n, p, err);
        else {
            char wp[PATH_CAP];
            sd_train_pjoin(wp, ck, "unet_ema/diffusion_pytorch_model.safetensors");
            sd_safetensors *ws = NULL;
            rc = sd_st_open(&ws, wp, err);
            sd_weight_layout lay = {"", 0};
            float *model = tr->unet.w.data;
            tr->unet.w.data = tr->ema; /* load the EMA file into the EMA buffer */
            if (!rc) rc = sd_weights_load(&tr->unet.w, ws, &lay, wp, err);
            tr->unet.w.data = model;
            if (ws) sd_st_close(ws);
        }
        tr->ema_updates = upd;
    }
    if (!rc) {
        const char *rs = meta_of(st, "rng");
        int ok = rs && strlen(rs) == 64;
        for (int i = 0; i < 4 && ok; i++) {
            char word[17];
            memcpy(word, rs + 16 * i, 16);
            word[16] = 0;
            char *end;
            tr->rng.s[i] = strtoull(word, &end, 16);
            ok = !*end;
        }
        const char *s = meta_of(st, "step"), *im = meta_of(st, "images"), *ep = meta_of(st, "epoch");
        const char *bt = meta_of(st, "batch"), *ls = meta_of(st, "loss_smooth");
        if (!ok || !s || !im || !ep || !bt) rc = sd_err_set(err, SD_EFORMAT, "%s: incomplete metadata", p);
        else {
            tr->step = strtol(s, NULL, 10);
            tr->images = strtol(im, NULL, 10);
            tr->cur.epoch = strtol(ep, NULL, 10);
            tr->cur.batch = (size_t)strtoull(bt, NULL, 10);
            tr->loss_ema = ls ? strtod(ls, NULL) : NAN;
        }
    }
    sd_train_w16_f32_done(tr, rc == SD_OK); /* bf16 weights: what was read, rounded in */
    if (tr->grad) memset(tr->grad, 0, n * sizeof(float));
    tr->dev_stale = tr->be->is_device; /* a GPU run uploads the loaded state before its next step */
    tr->host_stale = 0;
    sd_st_close(st);
    if (rc) return rc;
    if (!tr->o.quiet) sd_log(SD_LOG_INFO, "resumed from %s at step %ld", ck, tr->step);
    if (tr->rank == 0) {
        sd_train_pjoin(p, ck, "train_config.json");
        sd_train_resume_diff(p, tr->o.config_json);
    }
    if (tr->o.out_dir) { /* the step is on disk where this run saves: no need to write it again */
        char mine[PATH_CAP], a[PATH_CAP], b[PATH_CAP];
        snprintf(w, sizeof w, "checkpoint-%ld", tr->step);
        sd_train_pjoin(mine, tr->o.out_dir, w);
        if (realpath(mine, a) && realpath(ck, b) && strcmp(a, b) == 0) tr->saved_step = tr->step;
    }
    return SD_OK;
}

/* resume_from the checkpoint dir's latest names (or dir itself), and
 * where that cannot be read (missing, cut short, garbage in latest), the
 * way on: the newest whole checkpoint before it, or --fresh. Option
 * mismatches (SD_EINVAL) say their own remedy; rank 0 speaks for all. */
sd_status sd_train_resume(sd_trainer *tr, const char *dir, sd_error *err)
{
    char ck[PATH_CAP], name[128], lp[PATH_CAP];
    if (strlen(dir) > PATH_CAP - 128) return sd_err_set(err, SD_EINVAL, "checkpoint path too long: %s", dir);
    sd_status rc = resolve(dir, ck, name, err);
    if (!rc) {
        rc = resume_from(tr, ck, err);
        sd_train_w16_f32_done(tr, 0); /* where resume_from returned early */
    }
    if (!rc || rc == SD_EINVAL || !name[0] || tr->rank != 0) return rc;
    sd_train_pjoin(lp, dir, "latest");
    long step = sd_train_ckpt_step(name), older = sd_train_newest_checkpoint(dir, step >= 0 ? step : LONG_MAX);
    if (older >= 0)
        sd_log(SD_LOG_ERROR, "%s names %s, which cannot be read; %s/checkpoint-%ld is the newest whole checkpoint "
               "before it: --resume %s/checkpoint-%ld continues from there, --fresh starts over", lp, name, dir, older,
               dir, older);
    else
        sd_log(SD_LOG_ERROR, "%s names %s, which cannot be read, and no whole checkpoint before it is there: --fresh "
               "starts over", lp, name);
    return rc;
}
