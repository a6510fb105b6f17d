/* The trainer (trainer/): its math against diffusers' train_text_to_image.py
 * (tests/golden/unet/sd1/train.safetensors, made by
 * tests/golden/make_unet_golden.py train): 3 AdamW steps with epsilon
 * targets and global-norm clipping, and one v-prediction step with
 * min-SNR-gamma weights and two accumulated micro-batches, on the tiny SD1
 * UNet, from the same latents, text, noise and timesteps: losses within
 * 1e-5 and gradient norms within 1e-4 relative, the parameter change of
 * every tensor (its norm and its projection on a fixed vector) within 1e-3
 * relative. Then on a generated shard: exact resume (a run stopped at a
 * checkpoint and continued equals an uninterrupted one bit for bit:
 * weights, moments, RNG), 1 vs 2 threads bit-identical, corrupt and
 * unusable records skipped and counted, shards of another VAE refused,
 * a NaN loss stopping with a checkpoint of the last good state, the
 * learning-rate schedules, and an SDXL shard through the loader (hidden
 * states side by side, pooled embedding, size ids) into the tiny SDXL UNet.
 * --grad-dtype bf16: two micro-batches' bf16 gradients equal the fp32 run's
 * rounded as the hook rounds, and the update from them equals the fp32
 * run's update from the same (widened) gradient, every optimizer and
 * weight type. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "data_int.h"
#include "dist.h"
#include "f16.h"
#include "ops_math.h"
#include "safetensors.h"
#include "shard.h"
#include "train.h"
#include "train_int.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/unet"
#endif

/* Element i of a float64 golden tensor (its data may not be 8-aligned). */
static double getd(const sd_st_tensor *t, size_t i)
{
    double d;
    memcpy(&d, (const unsigned char *)t->data + 8 * i, 8);
    return d;
}

/* The projection vector of make_unet_golden.py, element i. */
static double rvec(size_t i)
{
    uint32_t u = (uint32_t)((uint64_t)i * 2654435761u + 12345u);
    return (double)u / 4294967296.0 - 0.5;
}

/* Options of the golden runs: the model (sd1, sdxl), torch's AdamW settings. */
static void golden_opts(sd_train_opts *o, const char *model)
{
    static char path[512];
    sd_train_opts_default(o);
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, model);
    o->unet = path;
    o->lr.base = 1e-3;
    o->adam.weight_decay = 1e-2;
    o->max_grad_norm = 0.05;
    o->ema_decay = 0.9999;
    o->quiet = 1;
}

/* Every parameter's change from before against the golden statistics;
 * returns the largest relative errors of norm and projection. */
static void check_change(const sd_trainer *tr, const float *now, const float *before, const sd_st_tensor *stats,
                         const char *names, double *en_max, double *ep_max)
{
    const sd_weights *w = &tr->unet.w;
    size_t np = (size_t)stats->shape[0], seen = 0;
    const char *p = names;
    *en_max = *ep_max = 0;
    for (size_t i = 0; i < np && p && *p; i++) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const sd_weight_slot *s = NULL;
        for (size_t k = 0; k < w->nslots && !s; k++)
            if (strlen(w->slots[k].name) == len && memcmp(w->slots[k].name, p, len) == 0) s = &w->slots[k];
        p = e ? e + 1 : p + len;
        if (!CHECK(s != NULL)) continue;
        seen++;
        double nn = 0, pp = 0, rr = 0;
        for (size_t j = 0; j < s->n; j++) {
            double d = (double)now[s->off + j] - (double)before[s->off + j];
            nn += d * d;
            pp += d * rvec(j);
            rr += rvec(j) * rvec(j);
        }
        double ref = getd(stats, 3 * i), en = fabs(sqrt(nn) - ref) / ref;
        double ep = fabs(pp - getd(stats, 3 * i + 1)) / (ref * sqrt(rr));
        if (!(en <= *en_max)) *en_max = en;
        if (!(ep <= *ep_max)) *ep_max = ep;
        if (!CHECK(en <= 1e-3 && ep <= 1e-3))
            fprintf(stderr, "%s: change norm %.6e want %.6e (rel %.2e), projection rel %.2e\n", s->name, sqrt(nn), ref,
                    en, ep);
    }
    CHECK(seen == np && seen == w->nslots);
}

/* dir/<model>/train.safetensors and its "names" metadata; NULL (a failed
 * check) when missing. */
static sd_safetensors *golden_file(const char *model, const char **names)
{
    char path[512];
    sd_error err = {0};
    sd_safetensors *g = NULL;
    snprintf(path, sizeof path, "%s/%s/train.safetensors", GOLDEN_DIR, model);
    if (!CHECK(sd_st_open(&g, path, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    *names = NULL;
    for (size_t i = 0; i < sd_st_meta_count(g); i++)
        if (strcmp(sd_st_meta_at(g, i)->key, "names") == 0) *names = sd_st_meta_at(g, i)->value;
    return g;
}

/* The golden file's 3 epsilon steps (noise<s>, t<s>) on tr: losses within
 * 1e-5 and gradient norms within 1e-4 of torch's; the worst of each out.
 * text and tids are the SDXL conditioning, NULL for SD. */
static void golden_eps_steps(sd_trainer *tr, const sd_safetensors *g, int tctx, const float *text, const float *tids,
                             double *worst_l, double *worst_g)
{
    sd_error err = {0};
    const sd_st_tensor *x0 = sd_st_find(g, "x0"), *ctx = sd_st_find(g, "ctx");
    const sd_st_tensor *el = sd_st_find(g, "eps_loss"), *eg = sd_st_find(g, "eps_gnorm");
    *worst_l = *worst_g = 0;
    if (!CHECK(x0 && ctx && el && eg)) return;
    for (int s = 0; s < 3; s++) {
        char nn[16], tn[16];
        snprintf(nn, sizeof nn, "noise%d", s);
        snprintf(tn, sizeof tn, "t%d", s);
        const sd_st_tensor *nz = sd_st_find(g, nn), *tt = sd_st_find(g, tn);
        if (!CHECK(nz && tt)) break;
        const float *tf = tt->data;
        int t[2] = {(int)tf[0], (int)tf[1]};
        double loss;
        CHECK(sd_train_micro(tr, 2, 16, 16, tctx, x0->data, ctx->data, text, tids, nz->data, t, 1.0, &loss, &err) ==
              SD_OK);
        double gn = sd_train_apply(tr);
        double dl = fabs(loss - getd(el, (size_t)s)) / getd(el, (size_t)s);
        double dg = fabs(gn - getd(eg, (size_t)s)) / getd(eg, (size_t)s);
        *worst_l = dl > *worst_l ? dl : *worst_l;
        *worst_g = dg > *worst_g ? dg : *worst_g;
        CHECK(dl <= 1e-5);
        CHECK(dg <= 1e-4);
    }
}

/* The golden training math: eps steps with clipping, then the v step with
 * min-SNR weights and accumulation. */
static void test_golden(void)
{
    sd_error err = {0};
    const char *names;
    sd_safetensors *g = golden_file("sd1", &names);
    if (!g) return;
    const sd_st_tensor *x0 = sd_st_find(g, "x0"), *es = sd_st_find(g, "eps_stats"), *vl = sd_st_find(g, "v_loss");
    const sd_st_tensor *vg = sd_st_find(g, "v_gnorm"), *vs = sd_st_find(g, "v_stats"), *ctx = sd_st_find(g, "ctx");
    if (!CHECK(names && x0 && ctx && es && vl && vg && vs)) {
        sd_st_close(g);
        return;
    }
    sd_train_opts o;
    golden_opts(&o, "sd1");
    sd_trainer tr;
    if (!CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        sd_st_close(g);
        return;
    }
    size_t np = tr.unet.w.total, per = 4 * 16 * 16;
    float *before = malloc(np * sizeof(float));
    memcpy(before, tr.unet.w.data, np * sizeof(float));
    double worst_l, worst_g;
    golden_eps_steps(&tr, g, 5, NULL, NULL, &worst_l, &worst_g);
    double en, ep;
    check_change(&tr, tr.unet.w.data, before, es, names, &en, &ep);
    double ef = 0;
    static const char *full[] = {"conv_in.weight", "conv_norm_out.bias"};
    for (int k = 0; k < 2; k++) {
        char fn[64];
        snprintf(fn, sizeof fn, "eps_delta.%s", full[k]);
        const sd_st_tensor *ft = sd_st_find(g, fn);
        const sd_weight_slot *s = NULL;
        for (size_t i = 0; i < tr.unet.w.nslots; i++)
            if (strcmp(tr.unet.w.slots[i].name, full[k]) == 0) s = &tr.unet.w.slots[i];
        if (!CHECK(ft && s && ft->nbytes == s->n * 4)) continue;
        const float *want = ft->data;
        double mx = 0, m = 0;
        for (size_t j = 0; j < s->n; j++) {
            double d = (double)tr.unet.w.data[s->off + j] - before[s->off + j];
            m = fabs(d - want[j]) > m ? fabs(d - want[j]) : m;
            mx = fabs(want[j]) > mx ? fabs(want[j]) : mx;
        }
        ef = m / mx > ef ? m / mx : ef;
        CHECK(m <= 1e-3 * mx);
    }
    printf("golden eps, 3 AdamW steps with clipping: loss %.2e grad norm %.2e change norm %.2e proj %.2e full %.2e\n",
           worst_l, worst_g, en, ep, ef);
    const sd_st_tensor *ems = sd_st_find(g, "ema_stats");
    if (CHECK(ems && tr.ema && tr.ema_updates == 3)) {
        check_change(&tr, tr.ema, before, ems, names, &en, &ep);
        printf("golden EMA (EMAModel, decay 0.9999) after them:  change norm %.2e proj %.2e\n", en, ep);
    }
    sd_trainer_close(&tr);
    o.ema_decay = 0;

    /* v-prediction, min-SNR-gamma 5, two micro-batches of one sample */
    o.pred = SD_PRED_V;
    o.snr_gamma = 5.0;
    o.accum = 2;
    if (!CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        free(before);
        sd_st_close(g);
        return;
    }
    const sd_st_tensor *nz = sd_st_find(g, "noise0"), *tt = sd_st_find(g, "t0");
    const float *tf = tt->data;
    double total = 0;
    for (int r = 0; r < 2; r++) {
        int t = (int)tf[r];
        double loss;
        CHECK(sd_train_micro(&tr, 1, 16, 16, 5, (const float *)x0->data + (size_t)r * per,
                             (const float *)ctx->data + (size_t)r * 5 * 8, NULL, NULL,
                             (const float *)nz->data + (size_t)r * per, &t, 0.5, &loss, &err) == SD_OK);
        total += loss / 2;
    }
    double gn = sd_train_apply(&tr);
    double dl = fabs(total - getd(vl, 0)) / getd(vl, 0), dg = fabs(gn - getd(vg, 0)) / getd(vg, 0);
    CHECK(dl <= 1e-5);
    CHECK(dg <= 1e-4);
    check_change(&tr, tr.unet.w.data, before, vs, names, &en, &ep);
    printf("golden v + min-SNR + accumulation, 1 step:     loss %.2e grad norm %.2e change norm %.2e proj %.2e\n", dl,
           dg, en, ep);
    sd_trainer_close(&tr);
    free(before);
    sd_st_close(g);
}

/* ---- a generated shard ---------------------------------------------------- */

/* Deterministic pseudo-random floats for test tensors. */
static float frand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Put one text record (HIDDEN [5, 8], fp16) under key. */
static int put_text(sd_shard *s, const uint8_t key[16], uint32_t seed, sd_error *err)
{
    uint16_t h[5 * 8];
    for (int i = 0; i < 40; i++) h[i] = sd_f32_to_f16(frand(&seed));
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_TEXT;
    r.ntensors = 1;
    r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN, 2, {5, 8, 0, 0}, 0, 0, h};
    sd_buf b;
    sd_buf_init(&b);
    int ok = sd_shard_rec_build(&r, &b, err) == SD_OK && sd_shard_put_text(s, key, b.data, b.len, err) == SD_OK;
    sd_buf_free(&b);
    return ok;
}

/* Put one text record (HIDDEN [5, 8], fp16) whose every value is v: a
 * caption variant the chi-square test can tell from the loaded batch. */
static int put_text_const(sd_shard *s, const uint8_t key[16], float v, sd_error *err)
{
    uint16_t h[5 * 8];
    for (int i = 0; i < 40; i++) h[i] = sd_f32_to_f16(v);
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_TEXT;
    r.ntensors = 1;
    r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN, 2, {5, 8, 0, 0}, 0, 0, h};
    sd_buf b;
    sd_buf_init(&b);
    int ok = sd_shard_rec_build(&r, &b, err) == SD_OK && sd_shard_put_text(s, key, b.data, b.len, err) == SD_OK;
    sd_buf_free(&b);
    return ok;
}

/* Kinds of broken records the loader must skip. */
enum { REC_OK, REC_NAN, REC_NO_TEXT };

/* Put latent record i: bucket bw x bh, mean+std or a sample, maybe flipped,
 * text key text (zeros: none). */
static int put_latent(sd_shard *s, int i, uint32_t bw, uint32_t bh, int meanstd, int flip, int kind,
                      const uint8_t text[16], sd_error *err)
{
    char name[32];
    snprintf(name, sizeof name, "img%03d", i);
    size_t n = 4 * (bh / 8) * (bw / 8);
    float *d = malloc(4 * n * sizeof(float));
    uint32_t seed = (uint32_t)i * 977u + 1u;
    for (size_t j = 0; j < 4 * n; j++) d[j] = j % (2 * n) >= n ? 0.05f + 0.1f * fabsf(frand(&seed)) : frand(&seed);
    if (kind == REC_NAN) /* in both variants: seen whichever one the flip draws */
        d[3] = d[(meanstd ? 2 * n : n) + 3] = NAN;
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_LATENT;
    r.flags = (uint16_t)((meanstd ? SD_REC_F_MEANSTD : 0) | (flip ? SD_REC_F_FLIPPED : 0));
    r.orig_w = 100 + (uint32_t)i;
    r.orig_h = 80;
    r.bucket_w = bw;
    r.bucket_h = bh;
    r.crop[0] = 2;
    r.crop[1] = 1;
    r.crop[2] = bw + 2;
    r.crop[3] = bh + 1;
    memcpy(r.text_ref, text, 16);
    r.name = name;
    r.name_len = strlen(name);
    int roles[4] = {meanstd ? SD_ROLE_MEAN : SD_ROLE_SAMPLE, meanstd ? SD_ROLE_STD : SD_ROLE_SAMPLE_FLIP,
                    SD_ROLE_MEAN_FLIP, SD_ROLE_STD_FLIP};
    int nt = (1 + meanstd) * (1 + flip);
    for (int k = 0; k < nt; k++)
        r.t[k] = (sd_shard_tensor){SD_DT_F32, (uint8_t)roles[k], 3, {4, bh / 8, bw / 8, 0}, 0, 0, d + (size_t)k * n};
    r.ntensors = nt;
    sd_buf b;
    sd_buf_init(&b);
    uint8_t key[16] = {0};
    memcpy(key, name, strlen(name));
    int ok = sd_shard_rec_build(&r, &b, err) == SD_OK && sd_shard_put(s, key, 16, b.data, b.len, err) == SD_OK;
    sd_buf_free(&b);
    free(d);
    return ok;
}

/* What the generated shard holds: everything, latents without any text
 * embedding (sd-latents without --text), or nothing at all (an sd-latents
 * --shard part that got no records: no meta either). */
enum { SHARD_FULL, SHARD_NO_TEXT, SHARD_EMPTY, SHARD_VARIANTS, SHARD_TOK150 };

/* A shard of 14 records in two buckets (64x64 and 64x32 pixels), mixed
 * mean+std / sample / flipped records, one with a NaN and one whose text
 * is missing, captions shared by pairs, the empty caption's embedding; or
 * one of the other kinds above. */
static int make_shard_of(const char *path, const char *scale, int kind_of_shard, sd_error *err)
{
    sd_shard *s = NULL;
    sd_shard_opts so = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, 1 << 20, 0};
    if (sd_shard_open(&s, path, &so, err)) return 0;
    if (kind_of_shard == SHARD_EMPTY) return sd_shard_close(s, err) == SD_OK;
    int text = kind_of_shard == SHARD_FULL || kind_of_shard == SHARD_VARIANTS || kind_of_shard == SHARD_TOK150;
    int ok = sd_shard_meta_set(s, SD_SHARD_META_SCALING, scale, err) == SD_OK &&
             sd_shard_meta_set(s, SD_SHARD_META_MODEL, "test-vae", err) == SD_OK &&
             /* the identity sd-latents --max-tokens 150 gives (the records keep their 5 rows) */
             (kind_of_shard != SHARD_TOK150 ||
              sd_shard_meta_set(s, SD_SHARD_META_TEXT_ENCODER, "test-encoder|tok150", err) == SD_OK) &&
             (!text || sd_shard_meta_set(s, "empty_text", "ee000000000000000000000000000000", err) == SD_OK);
    uint8_t empty[16] = {0xee};
    ok = ok && (!text || put_text(s, empty, 99, err));
    for (int i = 0; i < 14 && ok; i++) {
        uint8_t key[16] = {0};
        key[0] = (uint8_t)(1 + i / 2);
        ok = !text || put_text(s, key, (uint32_t)i / 2 + 5, err);
        int kind = i == 5 ? REC_NAN : i == 9 ? REC_NO_TEXT : REC_OK;
        if (kind == REC_NO_TEXT) key[1] = 0x55;
        if (!text) memset(key, 0, sizeof key);
        ok = ok && put_latent(s, i, 64, i % 3 ? 64 : 32, i % 4 != 0, i % 2, kind, key, err);
        if (kind_of_shard == SHARD_VARIANTS && kind != REC_NO_TEXT) { /* 2..5 caption variants, the first its caption */
            uint8_t refs[5 * 16], rk[16] = {0};
            int nv = 2 + i % 4;
            memcpy(refs, key, 16);
            for (int v = 1; v < nv && ok; v++) {
                memcpy(rk, key, 16);
                rk[2] = (uint8_t)v;
                memcpy(refs + 16 * v, rk, 16);
                ok = put_text(s, rk, (uint32_t)(i * 8 + v + 100), err);
            }
            char name[32];
            snprintf(name, sizeof name, "img%03d", i);
            uint8_t lk[16] = {0};
            memcpy(lk, name, strlen(name));
            ok = ok && sd_shard_put_variants(s, lk, 16, refs, (size_t)nv, err) == SD_OK;
        }
    }
    return sd_shard_close(s, err) == SD_OK && ok;
}

/* The full generated shard. */
static int make_shard(const char *path, const char *scale, sd_error *err)
{
    return make_shard_of(path, scale, SHARD_FULL, err);
}

/* Options of the shard runs: everything that draws random numbers on. */
static void shard_opts(sd_train_opts *o, const char *const *shards, const char *out, long steps, int threads)
{
    static char path[512];
    sd_train_opts_default(o);
    snprintf(path, sizeof path, "%s/sd1", GOLDEN_DIR);
    o->unet = path;
    o->shards = shards;
    o->nshards = 1;
    o->batch = 2;
    o->accum = 2;
    o->dropout = 0.25;
    o->snr_gamma = 5;
    o->noise_offset = 0.05;
    o->pred = SD_PRED_V;
    o->lr = (sd_lr_sched){SD_LR_COSINE, 1e-3, 2, 6};
    o->max_steps = steps;
    o->out_dir = out;
    o->keep = 0;
    o->seed = 7;
    o->ema_decay = 0.999;
    o->ema_every = 2;
    o->save_dtype = SD_ST_BF16; /* the fp32 weights then come from the state file */
    o->threads = threads;
    o->quiet = 1;
}

/* Run a trainer to o->max_steps (optionally resuming from out first) and
 * keep its weights, moments and EMA weights; 0 on failure. */
static int train(const sd_train_opts *o, int resume, float **w, float **m, float **v, float **e, size_t *n,
                 sd_tally *tally)
{
    sd_trainer tr;
    sd_error err = {0};
    if (!CHECK(sd_trainer_open(&tr, o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return 0;
    }
    int ok = 1;
    if (resume) ok = CHECK(sd_train_resume(&tr, o->out_dir, &err) == SD_OK);
    if (ok) ok = CHECK(sd_train_run(&tr, NULL, &err) == SD_OK);
    if (!ok) fprintf(stderr, "%s\n", err.msg);
    CHECK(tr.step == o->max_steps);
    *n = tr.unet.w.total;
    *w = malloc(*n * sizeof(float));
    *m = malloc(*n * sizeof(float));
    *v = malloc(*n * sizeof(float));
    memcpy(*w, tr.unet.w.data, *n * sizeof(float));
    sd_train_moments_convert(*m, SD_DT_F32, tr.m, o->moments, *n); /* bf16 moments widened exactly */
    sd_train_moments_convert(*v, SD_DT_F32, tr.v, o->moments, *n);
    if (e) {
        *e = malloc(*n * sizeof(float));
        CHECK(tr.ema != NULL && tr.ema_updates == o->max_steps / 2);
        if (tr.ema) memcpy(*e, tr.ema, *n * sizeof(float));
    }
    if (tally) *tally = tr.tally;
    sd_trainer_close(&tr);
    return ok;
}

/* A metadata value of a state file (malloc'ed), NULL when it cannot be read. */
static char *state_meta(const char *path, const char *key)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    char *v = NULL;
    if (sd_st_open(&st, path, &err) != SD_OK) return NULL;
    for (size_t i = 0; i < sd_st_meta_count(st); i++)
        if (strcmp(sd_st_meta_at(st, i)->key, key) == 0) v = strdup(sd_st_meta_at(st, i)->value);
    sd_st_close(st);
    return v;
}

/* rm -r of the test directories (our own files only). */
static void rmtree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Whether out/checkpoint-<step> was written and its state says that step. */
static int saved_step_is(const char *out, long step)
{
    char p[800], want[32];
    snprintf(p, sizeof p, "%s/checkpoint-%ld/state.safetensors", out, step);
    snprintf(want, sizeof want, "%ld", step);
    char *got = state_meta(p, "step");
    int ok = got && strcmp(got, want) == 0;
    free(got);
    return ok;
}

/* A trainer into out resumed from checkpoint-6 of the run in from, set
 * to go on to step 8 (the stop tests); 0 when it cannot open. */
static int open_at_step6(sd_trainer *tr, sd_train_opts *o, const char *const *shards, const char *out,
                         const char *from)
{
    sd_error err = {0};
    shard_opts(o, shards, out, 6, 1);
    o->max_steps = 3;
    if (!CHECK(sd_trainer_open(tr, o, &err) == SD_OK)) return 0;
    CHECK(sd_train_resume(tr, from, &err) == SD_OK && tr->step == 6);
    tr->o.max_steps = 8;
    return 1;
}

/* Exact resume, thread determinism, skipped records, refused shards, NaN. */
/* Batches with carry (sd_data_set_carry) on the generated shard, batch 4:
 * every batch full where the bucket has 4 or more records; over epochs
 * 0..E-1 a bucket of n records hands out ceil(E n / 4) x 4 records, each
 * record E or E + 1 times (the stream of shuffles, cut in 4s); an epoch
 * planned again after a later one (a resume) gives the same batches; and
 * without carry every epoch holds every record exactly once. Every
 * cursor's count of batches served (what --epochs resumed with another
 * world size counts from) is the number of batches handed out. */
/* --allow-mixed: each shard's latents are multiplied by its own
 * scaling_factor, not the first shard's. Record img000 (a sample, no noise
 * drawn) from both shards of one batch: their latents differ by exactly the
 * ratio of the factors. */
static void check_mixed_scaling(const char *first, const char *second)
{
    const char *two[2] = {first, second};
    sd_data d;
    sd_error err = {0};
    if (!CHECK(sd_data_open(&d, two, 2, 2, 7, 1, &err) == SD_OK)) return;
    size_t at[2] = {SIZE_MAX, SIZE_MAX};
    for (size_t i = 0; i < d.nitems; i++)
        if (d.items[i].klen == 16 && !memcmp(d.keys + d.items[i].koff, "img000", 7)) at[d.items[i].shard] = i;
    uint32_t bucket = 0;
    for (size_t b = 0; b < d.nbuckets; b++)
        if (at[0] >= d.buckets[b].first && at[0] < d.buckets[b].first + d.buckets[b].n) bucket = (uint32_t)b;
    if (CHECK(at[0] != SIZE_MAX && at[1] != SIZE_MAX)) {
        d.perm[0] = (uint32_t)at[0];
        d.perm[1] = (uint32_t)at[1];
        sd_data_batch db = {bucket, 0, 2};
        sd_load_opts lo = {.channels = 4, .cross_dim = 8, .no_flip = 1};
        sd_rng rng;
        sd_rng_seed(&rng, 3);
        sd_batch bt = {0};
        sd_tally tally;
        sd_tally_init(&tally, 4);
        if (CHECK(sd_data_load(&d, &db, &lo, &rng, &bt, &tally, &err) == SD_OK) && CHECK(bt.n == 2)) {
            size_t per = (size_t)bt.c * (size_t)bt.h * (size_t)bt.w, bad = 0;
            for (size_t j = 0; j < per; j++)
                bad += fabs(bt.x0[per + j] * (double)(float)0.18215 - bt.x0[j] * (double)(float)0.13025) >
                       1e-6 * fabs(bt.x0[j]) + 1e-9;
            if (!CHECK(bad == 0)) fprintf(stderr, "  %zu of %zu latents not scaled by their own shard's factor\n", bad, per);
        }
        sd_batch_free(&bt);
    }
    sd_data_close(&d);
}

static void check_carry(const char *shard)
{
    const char *shards[1] = {shard};
    sd_error err = {0};
    sd_data d;
    for (int carry = 0; carry < 2; carry++) {
        if (!CHECK(sd_data_open(&d, shards, 1, 4, 11, 0, &err) == SD_OK)) return;
        if (carry && !CHECK(sd_data_set_carry(&d, &err) == SD_OK)) {
            sd_data_close(&d);
            return;
        }
        enum { E = 5 };
        unsigned count[64] = {0}, taken[8] = {0};
        sd_data_cursor cur = {0, 0};
        sd_data_batch db, first[64];
        uint32_t rec1[256];
        size_t nfirst = 0, nrec1 = 0, nbat = 0;
        while (cur.epoch < E && CHECK(d.nitems <= 64 && d.nbuckets <= 8)) {
            long e = cur.epoch;
            if (!CHECK(sd_data_next(&d, &cur, &db, &err) == SD_OK)) break;
            if (cur.epoch != e && cur.epoch >= E) break; /* rolled into epoch E */
            size_t n = d.buckets[db.bucket].n;
            CHECK(db.n == (n < 4 || !carry ? db.n : 4) && db.n >= 1 && db.n <= 4);
            for (size_t i = 0; i < db.n; i++) count[d.perm[db.start + i]]++;
            taken[db.bucket] += (unsigned)db.n;
            nbat++;
            CHECK(sd_data_batches_served(&d, &cur) == (double)nbat);
            if (cur.epoch == 1 && nfirst < 64) { /* the batch handed out is of the cursor's epoch */
                first[nfirst++] = db;
                for (size_t i = 0; i < db.n && nrec1 < 256; i++) rec1[nrec1++] = d.perm[db.start + i];
            }
        }
        /* --epochs counts batches per epoch: within one batch per bucket of what E epochs hand out */
        CHECK(fabs(sd_data_epoch_batches(&d) * E - (double)nbat) < (double)d.nbuckets);
        for (size_t b = 0; b < d.nbuckets; b++) {
            size_t n = d.buckets[b].n, want = carry && n > 4 ? (E * n + 3) / 4 * 4 : E * n;
            CHECK(taken[b] == want);
            for (size_t i = d.buckets[b].first; i < d.buckets[b].first + n; i++)
                CHECK(count[i] == E || (carry && n > 4 && count[i] == E + 1));
        }
        /* epoch 1 again, after epoch E: the same batches and records */
        sd_data_cursor again = {1, 0};
        size_t r = 0;
        for (size_t k = 0; k < nfirst && CHECK(sd_data_next(&d, &again, &db, &err) == SD_OK); k++) {
            CHECK(db.bucket == first[k].bucket && db.n == first[k].n);
            for (size_t i = 0; i < db.n && r < nrec1; i++) CHECK(d.perm[db.start + i] == rec1[r++]);
        }
        CHECK(nfirst > 0 && r == nrec1);
        sd_data_close(&d);
    }
    /* batch 16, larger than every bucket: each bucket is one short batch an
     * epoch, with or without carry, and --epochs must count it so */
    for (int carry = 0; carry < 2; carry++) {
        if (!CHECK(sd_data_open(&d, shards, 1, 16, 11, 0, &err) == SD_OK)) return;
        if (!carry || CHECK(sd_data_set_carry(&d, &err) == SD_OK)) {
            sd_data_cursor cur = {0, 0};
            sd_data_batch db;
            size_t nb = 0;
            while (cur.epoch < 3 && CHECK(sd_data_next(&d, &cur, &db, &err) == SD_OK))
                if (cur.epoch < 3) CHECK(sd_data_batches_served(&d, &cur) == (double)++nb); /* of the cursor's epoch */
            CHECK(d.nbuckets >= 2 && nb == 3 * d.nbuckets);
            CHECK(sd_data_epoch_batches(&d) == (double)d.nbuckets);
        }
        sd_data_close(&d);
    }
}

static void test_shard_runs(void)
{
    char dir[] = "/tmp/sdtk_train_XXXXXX", shard[600], other[600], a[600], b[600], c[600];
    sd_error err = {0};
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    snprintf(shard, sizeof shard, "%s/cache.shard", dir);
    snprintf(other, sizeof other, "%s/other.shard", dir);
    snprintf(a, sizeof a, "%s/runA", dir);
    snprintf(b, sizeof b, "%s/runB", dir);
    snprintf(c, sizeof c, "%s/runC", dir);
    if (!CHECK(make_shard(shard, "0.18215", &err) && make_shard(other, "0.13025", &err))) {
        fprintf(stderr, "%s\n", err.msg);
        rmtree(dir);
        return;
    }
    const char *shards[2] = {shard, other};
    sd_data d;
    if (CHECK(sd_data_open(&d, shards, 1, 2, 7, 0, &err) == SD_OK)) {
        CHECK(d.nitems == 14 && d.nbuckets == 2 && fabs(d.scaling - 0.18215) < 1e-12 && d.has_empty);
        sd_data_close(&d);
    }
    check_carry(shard);
    /* a shard of another VAE is refused, unless asked for */
    CHECK(sd_data_open(&d, shards, 2, 2, 7, 0, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "another VAE") != NULL);
    if (CHECK(sd_data_open(&d, shards, 2, 2, 7, 1, &err) == SD_OK)) {
        CHECK(d.nitems == 28);
        sd_data_close(&d);
    }
    check_mixed_scaling(shard, other);
    /* so is one of the same VAE whose text embeddings came from another text encoder setup */
    char third[640];
    snprintf(third, sizeof third, "%s/third.shard", dir);
    sd_shard *ts = NULL;
    sd_shard_opts tso = {0, 0, 0};
    if (CHECK(make_shard(third, "0.18215", &err)) && CHECK(sd_shard_open(&ts, third, &tso, &err) == SD_OK)) {
        CHECK(sd_shard_meta_set(ts, "text_encoder", "sd1:other-skip", &err) == SD_OK);
        CHECK(sd_shard_close(ts, &err) == SD_OK);
        const char *two[2] = {shard, third};
        CHECK(sd_data_open(&d, two, 2, 2, 7, 0, &err) == SD_EFORMAT);
        CHECK(strstr(err.msg, "another text encoder") != NULL);
        if (CHECK(sd_data_open(&d, two, 2, 2, 7, 1, &err) == SD_OK)) sd_data_close(&d);
        /* as a --val shard too: its loss would measure other embeddings */
        sd_train_opts vo;
        sd_trainer vt;
        shard_opts(&vo, shards, a, 1, 1);
        vo.val_shard = third;
        CHECK(sd_trainer_open(&vt, &vo, &err) == SD_EFORMAT && strstr(err.msg, "--val") != NULL);
        vo.allow_mixed = 1;
        if (CHECK(sd_trainer_open(&vt, &vo, &err) == SD_OK)) sd_trainer_close(&vt);
        /* an empty_text naming an embedding the shard lacks (an older sd-pack's merge) is not
         * taken for dropout: the next shard's is, or none */
        if (CHECK(sd_shard_open(&ts, third, &tso, &err) == SD_OK)) {
            CHECK(sd_shard_meta_set(ts, "text_encoder", "", &err) == SD_OK);
            CHECK(sd_shard_meta_set(ts, "empty_text", "dd000000000000000000000000000000", &err) == SD_OK);
            CHECK(sd_shard_close(ts, &err) == SD_OK);
        }
        const char *lacking_first[2] = {third, shard};
        if (CHECK(sd_data_open(&d, lacking_first, 2, 2, 7, 0, &err) == SD_OK)) {
            CHECK(d.has_empty && d.empty_shard == 1 && d.empty_text[0] == 0xee);
            sd_data_close(&d);
        }
        if (CHECK(sd_data_open(&d, lacking_first, 1, 2, 7, 0, &err) == SD_OK)) {
            CHECK(!d.has_empty);
            sd_data_close(&d);
        }
    }

    sd_train_opts o;
    float *wa, *ma, *va, *ea, *wb, *mb, *vb, *eb;
    size_t n;
    sd_tally ta;
    shard_opts(&o, shards, a, 6, 1);
    int ok = train(&o, 0, &wa, &ma, &va, &ea, &n, &ta);
    /* the NaN record and the one without text were skipped, each time seen */
    CHECK(sd_tally_count(&ta, "latent has non-finite values") >= 1);
    CHECK(sd_tally_count(&ta, "text embedding missing") >= 1);
    CHECK(ta.total == sd_tally_count(&ta, "latent has non-finite values") + sd_tally_count(&ta, "text embedding missing"));
    /* stopped after 3 steps (a kill after its checkpoint loses nothing
     * more), then resumed to 6 */
    shard_opts(&o, shards, b, 3, 1);
    float *w3, *m3, *v3, *e3;
    size_t n3;
    ok = ok && train(&o, 0, &w3, &m3, &v3, &e3, &n3, NULL);
    if (ok) {
        free(w3);
        free(m3);
        free(v3);
        free(e3);
    }
    shard_opts(&o, shards, b, 6, 1);
    ok = ok && train(&o, 1, &wb, &mb, &vb, &eb, &n, NULL);
    if (CHECK(ok)) {
        CHECK(memcmp(wa, wb, n * sizeof(float)) == 0);
        CHECK(memcmp(ma, mb, n * sizeof(float)) == 0);
        CHECK(memcmp(va, vb, n * sizeof(float)) == 0);
        CHECK(memcmp(ea, eb, n * sizeof(float)) == 0);
        int diff = 0;
        for (size_t i = 0; i < n; i++) diff += wa[i] != wa[i];
        CHECK(diff == 0); /* no NaN crept in */
        free(wb);
        free(mb);
        free(vb);
        free(eb);
    }
    /* the checkpoint's unet/ and unet_ema/ load as diffusers UNets: the
     * weights and the EMA weights rounded to bf16 (--save-dtype) */
    char ck[700];
    sd_unet u;
    for (int k = 0; k < 2 && ok; k++) {
        snprintf(ck, sizeof ck, "%s/checkpoint-6/%s", b, k ? "unet_ema" : "unet");
        if (CHECK(sd_unet_load(&u, ck, NULL, &err) == SD_OK)) {
            int same = u.w.total == n;
            const float *want = k ? ea : wa;
            for (size_t i = 0; i < n && same; i++) same = u.w.data[i] == sd_bf16_to_f32(sd_f32_to_bf16(want[i]));
            CHECK(same);
            sd_unet_free(&u);
        }
    }
    /* 2 threads: the same bits */
    shard_opts(&o, shards, c, 6, 2);
    if (train(&o, 0, &wb, &mb, &vb, &eb, &n, NULL)) {
        CHECK(memcmp(wa, wb, n * sizeof(float)) == 0);
        CHECK(memcmp(va, vb, n * sizeof(float)) == 0);
        CHECK(memcmp(ea, eb, n * sizeof(float)) == 0);
        free(wb);
        free(mb);
        free(vb);
        free(eb);
    }
    if (ok) {
        free(wa);
        free(ma);
        free(va);
        free(ea);
    }

    /* a NaN loss stops the run with a checkpoint of the state before it:
     * into a new directory, the step, image count, data cursor and RNG of
     * runA's checkpoint-6, which the run resumed from. The NaN comes from
     * the noise (a noise offset no option allows), the weights being sound */
    sd_trainer tr;
    char nan_dir[700];
    snprintf(nan_dir, sizeof nan_dir, "%s/runNaN", dir);
    if (open_at_step6(&tr, &o, shards, nan_dir, a)) {
        tr.o.noise_offset = INFINITY;
        CHECK(sd_train_run(&tr, NULL, &err) == SD_ERANGE);
        CHECK(strstr(err.msg, "non-finite loss at step 7") != NULL);
        CHECK(tr.step == 6);
        sd_trainer_close(&tr);
        char p[800], q[800];
        snprintf(p, sizeof p, "%s/checkpoint-6/state.safetensors", nan_dir);
        snprintf(q, sizeof q, "%s/checkpoint-6/state.safetensors", a);
        static const char *const keys[] = {"step", "images", "epoch", "batch", "rng", "loss_smooth"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            char *got = state_meta(p, keys[k]), *want = state_meta(q, keys[k]);
            if (!CHECK(got && want && strcmp(got, want) == 0))
                fprintf(stderr, "NaN stop: %s is %s, the state before it has %s\n", keys[k], got ? got : "(none)",
                        want ? want : "(none)");
            free(got);
            free(want);
        }
    }
    /* weights that are already NaN (an earlier step with --lr far too large)
     * stop it too, but are not saved: a resume would only fail again */
    snprintf(nan_dir, sizeof nan_dir, "%s/runNaNw", dir);
    if (open_at_step6(&tr, &o, shards, nan_dir, a)) {
        for (size_t i = 0; i < tr.unet.w.nslots; i++)
            if (strcmp(tr.unet.w.slots[i].name, "conv_out.bias") == 0) tr.unet.w.data[tr.unet.w.slots[i].off] = NAN;
        CHECK(sd_train_run(&tr, NULL, &err) == SD_ERANGE);
        CHECK(strstr(err.msg, "non-finite loss at step 7 after non-finite weights") != NULL);
        sd_trainer_close(&tr);
        char p[800];
        snprintf(p, sizeof p, "%s/checkpoint-6", nan_dir);
        CHECK(access(p, F_OK) != 0);
        snprintf(p, sizeof p, "%s/latest", nan_dir);
        CHECK(access(p, F_OK) != 0);
    }
    /* a gradient that is not finite while the loss is (an overflow in the
     * backward pass) stops the run the same way, before it reaches the
     * weights: one element of the gradient starts at +inf */
    snprintf(nan_dir, sizeof nan_dir, "%s/runInf", dir);
    if (open_at_step6(&tr, &o, shards, nan_dir, a)) {
        size_t nw = tr.unet.w.total;
        float *w0 = malloc(nw * sizeof(float));
        if (CHECK(w0 != NULL)) {
            memcpy(w0, tr.unet.w.data, nw * sizeof(float));
            tr.grad[nw / 2] = INFINITY;
            CHECK(sd_train_run(&tr, NULL, &err) == SD_ERANGE);
            CHECK(strstr(err.msg, "non-finite gradient at step 7") != NULL);
            CHECK(tr.step == 6);
            CHECK(memcmp(w0, tr.unet.w.data, nw * sizeof(float)) == 0);
            free(w0);
        }
        sd_trainer_close(&tr);
        CHECK(saved_step_is(nan_dir, 6));
    }
    /* a TensorBoard event file that cannot be written (a full disk: here
     * /dev/full) is a warning, not the end of the run and its checkpoint */
    char tb_dir[800];
    snprintf(nan_dir, sizeof nan_dir, "%s/runFullTb", dir);
    snprintf(tb_dir, sizeof tb_dir, "%s/tb", nan_dir);
    shard_opts(&o, shards, nan_dir, 2, 1);
    o.tensorboard = tb_dir;
    if (CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        tr.tb.f = fopen("/dev/full", "wb");
        snprintf(tr.tb.path, sizeof tr.tb.path, "/dev/full");
        if (CHECK(tr.tb.f != NULL)) {
            CHECK(sd_train_run(&tr, NULL, &err) == SD_OK);
            CHECK(tr.step == 2 && tr.tb.f == NULL);
        }
        sd_trainer_close(&tr);
        CHECK(saved_step_is(nan_dir, 2));
    }
    rmtree(dir);
}

/* sqrt(sum (a - b)^2 / sum b^2): how far a is from b, normwise. */
static double normwise(const float *a, const float *b, size_t n)
{
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r2 += (double)b[i] * b[i];
    }
    return r2 > 0 ? sqrt(d2 / r2) : INFINITY;
}

/* Resume the checkpoint ck into a trainer of moments dtype dt and check
 * its moments against the state file's, converted (widened exactly, or
 * rounded to nearest). */
static void check_switch(const char *shard, const char *ck, int dt)
{
    const char *shards[1] = {shard};
    sd_train_opts o;
    sd_trainer tr;
    sd_error err = {0};
    shard_opts(&o, shards, NULL, 6, 1);
    o.moments = dt;
    char p[700];
    snprintf(p, sizeof p, "%s/state.safetensors", ck);
    sd_safetensors *st = NULL;
    if (!CHECK(sd_st_open(&st, p, &err) == SD_OK)) return;
    if (CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        if (CHECK(sd_train_resume(&tr, ck, &err) == SD_OK)) {
            const sd_st_tensor *t = sd_st_find(st, "adam_v");
            size_t n = tr.unet.w.total;
            int same = t && t->shape[0] == n && (t->dtype == SD_ST_BF16) != (dt == SD_DT_BF16);
            for (size_t i = 0; i < n && same; i++) {
                float f;
                uint16_t h;
                if (dt == SD_DT_BF16) { /* fp32 in the file: rounded to nearest */
                    memcpy(&f, (const char *)t->data + 4 * i, 4);
                    memcpy(&h, (const char *)tr.v + 2 * i, 2);
                    same = h == sd_f32_to_bf16(f);
                } else {
                    memcpy(&h, (const char *)t->data + 2 * i, 2);
                    memcpy(&f, (const char *)tr.v + 4 * i, 4);
                    same = f == sd_bf16_to_f32(h);
                }
            }
            CHECK(same);
        }
        sd_trainer_close(&tr);
    }
    sd_st_close(st);
}

/* --adam-moments bf16 on the generated shard: a run stopped at a
 * checkpoint and resumed equals an uninterrupted one bit for bit, and 2
 * threads give the same bits; the state file holds bf16 moments (half the
 * bytes); the moments and weight changes stay within a few bf16 spacings,
 * normwise, of an fp32-moment run's; a checkpoint resumes under the other
 * setting, converted. */
static void test_moments_bf16(void)
{
    char dir[] = "/tmp/sdtk_train_XXXXXX", shard[600], a[600], b[600], c[600], d[600], ck[700];
    sd_error err = {0};
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    snprintf(shard, sizeof shard, "%s/cache.shard", dir);
    snprintf(a, sizeof a, "%s/runA", dir);
    snprintf(b, sizeof b, "%s/runB", dir);
    snprintf(c, sizeof c, "%s/runC", dir);
    snprintf(d, sizeof d, "%s/runD", dir);
    if (!CHECK(make_shard(shard, "0.18215", &err))) {
        fprintf(stderr, "%s\n", err.msg);
        rmtree(dir);
        return;
    }
    const char *shards[1] = {shard};
    sd_train_opts o;
    float *w[4] = {0}, *m[4] = {0}, *v[4] = {0}, *e[4] = {0};
    size_t n = 0, n2 = 0;
    int ok = 1;
    /* A: 6 steps; B: 3 steps, then resumed to 6; C: 2 threads; D: fp32 moments */
    const char *outs[4] = {a, b, c, d};
    for (int k = 0; k < 4 && ok; k++) {
        if (k == 1) {
            float *w3 = NULL, *m3 = NULL, *v3 = NULL, *e3 = NULL;
            shard_opts(&o, shards, b, 3, 1);
            o.moments = SD_DT_BF16;
            ok = CHECK(train(&o, 0, &w3, &m3, &v3, &e3, &n2, NULL));
            free(w3);
            free(m3);
            free(v3);
            free(e3);
            if (!ok) break;
        }
        shard_opts(&o, shards, outs[k], 6, k == 2 ? 2 : 1);
        o.moments = k == 3 ? SD_DT_F32 : SD_DT_BF16;
        ok = CHECK(train(&o, k == 1, &w[k], &m[k], &v[k], &e[k], &n, NULL));
    }
    if (ok) {
        for (int k = 1; k < 3; k++) {
            CHECK(memcmp(w[0], w[k], n * sizeof(float)) == 0);
            CHECK(memcmp(m[0], m[k], n * sizeof(float)) == 0);
            CHECK(memcmp(v[0], v[k], n * sizeof(float)) == 0);
            CHECK(memcmp(e[0], e[k], n * sizeof(float)) == 0);
        }
        /* against fp32 moments: close, and not the same (bf16 did happen) */
        sd_trainer tr;
        shard_opts(&o, shards, NULL, 6, 1);
        if (CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
            float *dw16 = malloc(n * sizeof(float)), *dw32 = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) {
                dw16[i] = w[0][i] - tr.unet.w.data[i];
                dw32[i] = w[3][i] - tr.unet.w.data[i];
            }
            double rm = normwise(m[0], m[3], n), rv = normwise(v[0], v[3], n), rw = normwise(dw16, dw32, n);
            printf("6 steps, bf16 vs fp32 AdamW moments: normwise difference m %.2e, v %.2e, weight change %.2e\n",
                   rm, rv, rw);
            CHECK(rm > 0 && rm < 0.05 && rv > 0 && rv < 0.05 && rw < 0.05);
            free(dw16);
            free(dw32);
            sd_trainer_close(&tr);
        }
        /* the state file: bf16 moments, 2 bytes each */
        snprintf(ck, sizeof ck, "%s/checkpoint-6/state.safetensors", a);
        sd_safetensors *st = NULL;
        if (CHECK(sd_st_open(&st, ck, &err) == SD_OK)) {
            const sd_st_tensor *tm = sd_st_find(st, "adam_m"), *tv = sd_st_find(st, "adam_v");
            CHECK(tm && tv && tm->dtype == SD_ST_BF16 && tv->dtype == SD_ST_BF16 && tm->nbytes == 2 * n);
            sd_st_close(st);
        }
        /* switching on resume: bf16 checkpoint into fp32 moments, and back */
        snprintf(ck, sizeof ck, "%s/checkpoint-3", b);
        check_switch(shard, ck, SD_DT_F32);
        snprintf(ck, sizeof ck, "%s/checkpoint-6", d);
        check_switch(shard, ck, SD_DT_BF16);
    }
    for (int k = 0; k < 4; k++) {
        free(w[k]);
        free(m[k]);
        free(v[k]);
        free(e[k]);
    }
    rmtree(dir);
}

/* An SDXL-style shard record by record through the loader: both hidden
 * states side by side in ctx (first encoder first), the pooled embedding,
 * the size ids (original h, w; crop top, left; target h, w), the latent
 * times the scaling factor; then two training steps of the tiny SDXL UNet
 * on it. */
static void test_sdxl_data(void)
{
    char dir[] = "/tmp/sdtk_trainxl_XXXXXX", shard[600], out[600];
    sd_error err = {0};
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    snprintf(shard, sizeof shard, "%s/xl.shard", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    sd_shard *s = NULL;
    sd_shard_opts so = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, 1 << 20, 0};
    float h1[6 * 6], h2[6 * 10], pooled[8], lat[4 * 8 * 8], lat_flip[4 * 8 * 8];
    for (int i = 0; i < 36; i++) h1[i] = (float)i;
    for (int i = 0; i < 60; i++) h2[i] = 100.0f + (float)i;
    for (int i = 0; i < 8; i++) pooled[i] = -(float)i;
    for (int i = 0; i < 256; i++) lat[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 256; i++) lat_flip[i] = 5.0f;
    uint8_t tkey[16] = {7};
    int ok = CHECK(sd_shard_open(&s, shard, &so, &err) == SD_OK);
    ok = ok && CHECK(sd_shard_meta_set(s, SD_SHARD_META_SCALING, "0.13025", &err) == SD_OK);
    sd_buf b;
    sd_buf_init(&b);
    if (ok) {
        sd_shard_rec r;
        memset(&r, 0, sizeof r);
        r.kind = SD_REC_TEXT;
        r.ntensors = 3;
        r.t[0] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_HIDDEN1, 2, {6, 6, 0, 0}, 0, 0, h1};
        r.t[1] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_HIDDEN2, 2, {6, 10, 0, 0}, 0, 0, h2};
        r.t[2] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_POOLED, 1, {8, 0, 0, 0}, 0, 0, pooled};
        ok = CHECK(sd_shard_rec_build(&r, &b, &err) == SD_OK && sd_shard_put_text(s, tkey, b.data, b.len, &err) == SD_OK);
        for (int i = 0; i < 3 && ok; i++) {
            char name[16];
            snprintf(name, sizeof name, "xl%d", i);
            memset(&r, 0, sizeof r);
            r.kind = SD_REC_LATENT;
            r.orig_w = 1216;
            r.orig_h = 832 + (uint32_t)i;
            r.bucket_w = r.bucket_h = 64;
            r.crop[0] = 24;
            r.crop[1] = 10;
            r.crop[2] = 88;
            r.crop[3] = 74;
            memcpy(r.text_ref, tkey, 16);
            r.name = name;
            r.name_len = strlen(name);
            r.ntensors = 1;
            r.t[0] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_SAMPLE, 3, {4, 8, 8, 0}, 0, 0, lat};
            if (i == 2) { /* kohya's crop_ltrb kept as given (flag 4), with a flipped variant */
                r.flags = SD_REC_F_FLIPPED | SD_REC_F_CROP_FLOAT;
                r.crop[0] = 2;
                r.crop[1] = 0;
                r.crop[2] = 61;
                r.crop[3] = 64;
                r.ntensors = 2;
                r.t[1] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_SAMPLE_FLIP, 3, {4, 8, 8, 0}, 0, 0, lat_flip};
            }
            uint8_t key[16] = {0};
            memcpy(key, name, strlen(name));
            ok = CHECK(sd_shard_rec_build(&r, &b, &err) == SD_OK && sd_shard_put(s, key, 16, b.data, b.len, &err) == SD_OK);
        }
    }
    sd_buf_free(&b);
    if (s) CHECK(sd_shard_close(s, &err) == SD_OK);
    const char *shards[1] = {shard};
    sd_data d;
    if (ok && CHECK(sd_data_open(&d, shards, 1, 3, 1, 0, &err) == SD_OK)) {
        sd_data_cursor cur = {0, 0};
        sd_data_batch db;
        sd_batch bt;
        memset(&bt, 0, sizeof bt);
        sd_tally tally;
        sd_tally_init(&tally, 5);
        sd_rng rng;
        sd_rng_seed(&rng, 1);
        sd_load_opts lo = {.channels = 4, .cross_dim = 16, .pooled = 8};
        if (CHECK(sd_data_next(&d, &cur, &db, &err) == SD_OK) &&
            CHECK(sd_data_load(&d, &db, &lo, &rng, &bt, &tally, &err) == SD_OK) && CHECK(bt.n == 3 && bt.tctx == 6)) {
            int good = 1;
            for (int k = 0; k < 3; k++)
                for (int t = 0; t < 6; t++)
                    for (int c = 0; c < 16; c++) {
                        float want = c < 6 ? h1[t * 6 + c] : h2[t * 10 + c - 6];
                        good &= bt.ctx[((size_t)k * 6 + (size_t)t) * 16 + (size_t)c] == want;
                    }
            CHECK(good);
            CHECK(bt.text[8 + 3] == -3.0f && bt.x0[5] == lat[5] * 0.13025f);
            for (int k = 0; k < 3; k++) { /* the plain records, wherever the shuffle put them */
                float *tid = bt.tids + 6 * k;
                if (tid[0] != 834)
                    CHECK(tid[1] == 1216 && (tid[0] == 832 || tid[0] == 833) && tid[2] == 10 && tid[3] == 24 &&
                          tid[4] == 64 && tid[5] == 64);
            }
        }
        /* the flag-4 record: crop left 2 as it is, 64 - 61 = 3 when flipped (sd-scripts' target_w -
         * right); over several draws both are seen */
        int seen[2] = {0, 0};
        for (int draw = 0; draw < 40; draw++) {
            if (!CHECK(sd_data_load(&d, &db, &lo, &rng, &bt, &tally, &err) == SD_OK)) break;
            for (int k = 0; k < bt.n; k++) {
                float *tid = bt.tids + 6 * k;
                if (tid[0] != 834) continue;
                int flipped = bt.x0[(size_t)k * 256] == 5.0f * 0.13025f;
                seen[flipped] = 1;
                CHECK(tid[3] == (flipped ? 3.0f : 2.0f) && tid[2] == 0);
            }
        }
        CHECK(seen[0] && seen[1]);
        /* the start-up check against the UNet: the shard fits the tiny SDXL UNet; another pooled width,
         * another summed hidden width, a single-encoder UNet or other latent channels are refused with
         * the shard and both numbers named */
        CHECK(sd_data_check_model(&d, &lo, &err) == SD_OK);
        struct {
            sd_load_opts lo;
            const char *says;
        } bad[] = {{{.channels = 4, .cross_dim = 16, .pooled = 9}, "pooled width 8, the UNet's text_time projection takes 9"},
                   {{.channels = 4, .cross_dim = 15, .pooled = 8},
                    "width 16 (both encoders summed), the UNet's cross_attention_dim 15"},
                   {{.channels = 4, .cross_dim = 16}, "SDXL's two encoders' hidden states; the UNet takes one"},
                   {{.channels = 16, .cross_dim = 16, .pooled = 8}, "latent channels 4, the UNet's in_channels 16"}};
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            err.msg[0] = 0;
            CHECK(sd_data_check_model(&d, &bad[k].lo, &err) == SD_EFORMAT);
            if (!CHECK(strstr(err.msg, bad[k].says) != NULL && strstr(err.msg, shard) != NULL))
                fprintf(stderr, "got: %s\n", err.msg);
        }
        /* the loader's own check of each record names what it compares with */
        sd_tally mis;
        sd_tally_init(&mis, 0);
        if (CHECK(sd_data_load(&d, &db, &bad[3].lo, &rng, &bt, &mis, &err) == SD_OK))
            CHECK(bt.n == 0 && sd_tally_count(&mis, "latent channels differ from the UNet's in_channels") == 3);
        sd_batch_free(&bt);
        sd_data_close(&d);
    }
    /* two steps of the tiny SDXL UNet on it, checkpointed and loadable */
    static char unet[512];
    snprintf(unet, sizeof unet, "%s/sdxl", GOLDEN_DIR);
    sd_train_opts o;
    sd_train_opts_default(&o);
    o.unet = unet;
    o.shards = shards;
    o.nshards = 1;
    o.batch = 2;
    o.max_steps = 2;
    o.out_dir = out;
    o.quiet = 1;
    sd_trainer tr;
    if (ok && CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        CHECK(sd_train_run(&tr, NULL, &err) == SD_OK);
        /* 3 records, batch 2: the second batch takes the first record of the next epoch's shuffle */
        CHECK(tr.step == 2 && tr.images == 4 && tr.tally.total == 0);
        sd_trainer_close(&tr);
    }
    rmtree(dir);
}

/* diffusers' schedule values at a few steps. */
static void test_lr(void)
{
    sd_lr_sched l = {SD_LR_CONSTANT_WARMUP, 1.0, 4, 10};
    CHECK(sd_lr_at(&l, 0) == 0.0 && sd_lr_at(&l, 2) == 0.5 && sd_lr_at(&l, 4) == 1.0 && sd_lr_at(&l, 9) == 1.0);
    l.kind = SD_LR_COSINE;
    CHECK(fabs(sd_lr_at(&l, 7) - 0.5) < 1e-12 && fabs(sd_lr_at(&l, 10)) < 1e-12);
    l.kind = SD_LR_LINEAR;
    CHECK(fabs(sd_lr_at(&l, 7) - 0.5) < 1e-12 && sd_lr_at(&l, 10) == 0.0);
    l.kind = SD_LR_CONSTANT;
    CHECK(sd_lr_at(&l, 0) == 1.0);
    sd_lr_kind k;
    CHECK(sd_lr_kind_parse("cosine", &k) && k == SD_LR_COSINE && !sd_lr_kind_parse("step", &k));
    /* alphas_cumprod as diffusers' fp32 schedule has them (to 1e-6) */
    sd_ddpm s;
    sd_ddpm_init(&s, 0.00085, 0.012);
    CHECK(fabs(s.acp[0] / 0.9991499781608582 - 1) < 1e-6 && fabs(s.acp[999] / 0.00466009508818388 - 1) < 1e-6);
    /* zero terminal SNR: diffusers 0.35.2's fp32 values, DDPMScheduler(beta_start=0.00085,
     * beta_end=0.012, beta_schedule="scaled_linear", rescale_betas_zero_snr=True).alphas_cumprod */
    sd_ddpm_zero_terminal_snr(&s);
    const int at[6] = {0, 1, 250, 500, 750, 998};
    const double want[6] = {0.9991499781608582, 0.9982334971427917, 0.6524567604064941, 0.2410186380147934,
                            0.03279908001422882, 1.9679633567193378e-07};
    for (int i = 0; i < 6; i++) {
        double tol = at[i] == 998 ? 1e-4 : 2e-6; /* t = 998 (2.9e-5 off): fp32 cancellation in diffusers' shift */
        CHECK(fabs(s.acp[at[i]] / want[i] - 1) < tol);
    }
    CHECK(s.acp[999] == 0.0f && sd_ddpm_snr(&s, 999) == 0.0);
    int mono = 1;
    for (int i = 1; i < SD_DDPM_STEPS; i++) mono &= s.acp[i] < s.acp[i - 1];
    CHECK(mono);
    /* the v target at the last timestep is -x0, the noisy input the noise itself */
    float x0 = 0.7f, noise = -1.3f, xt, v;
    int t = 999;
    sd_ddpm_add_noise(&s, 1, 1, &t, &x0, &noise, &xt);
    sd_ddpm_target(&s, SD_PRED_V, 1, 1, &t, &x0, &noise, &v);
    CHECK(xt == noise && v == -x0);
}

/* One micro-batch at the zero-SNR timestep (--zero-terminal-snr with
 * v-prediction and min-SNR 5): its weight min(0, 5) / (0 + 1) is 0, so a
 * batch of t = 999 alone gives loss 0 and an all-zero gradient (no NaN
 * from the SNR of 0), a batch with t = 500 beside it a finite loss and
 * gradient, and validation's plain MSE at t = 999 a finite loss. */
static void test_zero_snr_step(void)
{
    sd_train_opts o;
    golden_opts(&o, "sd1");
    o.zero_terminal_snr = 1;
    o.pred = SD_PRED_V;
    o.snr_gamma = 5;
    sd_trainer tr;
    sd_error err = {0};
    if (!CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    enum { H = 8, W = 8, T = 5 };
    size_t per = (size_t)tr.unet.cfg.in_channels * H * W, nctx = (size_t)T * (size_t)tr.unet.cfg.cross_dim;
    float *x0 = malloc(2 * per * sizeof(float)), *noise = malloc(2 * per * sizeof(float));
    float *ctx = malloc(2 * nctx * sizeof(float));
    uint32_t seed = 99;
    for (size_t i = 0; i < 2 * per; i++) {
        x0[i] = frand(&seed);
        noise[i] = frand(&seed);
    }
    for (size_t i = 0; i < 2 * nctx; i++) ctx[i] = frand(&seed);
    size_t n = tr.unet.w.total;
    double loss = -1;
    int t1[1] = {999}, t2[2] = {999, 500};
    CHECK(sd_train_micro(&tr, 1, H, W, T, x0, ctx, NULL, NULL, noise, t1, 1.0, &loss, &err) == SD_OK);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= tr.grad[i] == 0.0f;
    CHECK(loss == 0.0 && zero);
    CHECK(sd_train_micro(&tr, 2, H, W, T, x0, ctx, NULL, NULL, noise, t2, 1.0, &loss, &err) == SD_OK);
    int finite = 1, nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(tr.grad[i]);
        nonzero += tr.grad[i] != 0.0f;
    }
    CHECK(isfinite(loss) && loss > 0 && finite && nonzero > 0);
    CHECK(sd_train_eval(&tr, 1, H, W, T, x0, ctx, NULL, NULL, noise, t1, &loss, &err) == SD_OK && isfinite(loss) &&
          loss > 0);
    free(x0);
    free(noise);
    free(ctx);
    sd_trainer_close(&tr);
}

/* test_train --make-shard PATH (or --make-shard-without-text PATH, or
 * --make-empty-shard PATH) writes the generated shard for
 * tests/e2e_train.py; with no arguments the tests run. */
/* The SDXL-shaped model's 3 clipped AdamW steps (make_unet_golden.py
 * train_sdxl): text_time conditioning from the pooled embedding and the
 * six time ids, losses, gradient norms and every parameter's change. */
static void test_golden_sdxl(void)
{
    sd_error err = {0};
    const char *names;
    sd_safetensors *g = golden_file("sdxl", &names);
    if (!g) return;
    const sd_st_tensor *ctx = sd_st_find(g, "ctx"), *text = sd_st_find(g, "text"), *tids = sd_st_find(g, "tids");
    const sd_st_tensor *es = sd_st_find(g, "eps_stats");
    sd_train_opts o;
    golden_opts(&o, "sdxl");
    o.ema_decay = 0;
    sd_trainer tr;
    if (!CHECK(names && ctx && text && tids && es) || !CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        sd_st_close(g);
        return;
    }
    size_t np = tr.unet.w.total;
    float *before = malloc(np * sizeof(float));
    if (!CHECK(before != NULL)) {
        sd_trainer_close(&tr);
        sd_st_close(g);
        return;
    }
    memcpy(before, tr.unet.w.data, np * sizeof(float));
    double worst_l, worst_g;
    golden_eps_steps(&tr, g, (int)ctx->shape[1], text->data, tids->data, &worst_l, &worst_g);
    double en, ep;
    check_change(&tr, tr.unet.w.data, before, es, names, &en, &ep);
    printf("golden SDXL eps, 3 AdamW steps with clipping: loss %.2e grad norm %.2e change norm %.2e proj %.2e\n",
           worst_l, worst_g, en, ep);
    free(before);
    sd_trainer_close(&tr);
    sd_st_close(g);
}

/* --masked-loss against sd-scripts (tests/golden/make_mask_golden.py): the
 * alpha masks of the image's size reduced to the latent size as torch's
 * area interpolation (and mirrored for a flipped sample), then the masked
 * loss and every parameter's gradient on the tiny sd1 UNet within 1e-4
 * relative of torch's float64 ones. */
static void test_golden_masked(void)
{
    sd_error err = {0};
    sd_safetensors *g = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/sd1/masked.safetensors", GOLDEN_DIR);
    if (!CHECK(sd_st_open(&g, path, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    const char *names = NULL;
    for (size_t i = 0; i < sd_st_meta_count(g); i++)
        if (strcmp(sd_st_meta_at(g, i)->key, "names") == 0) names = sd_st_meta_at(g, i)->value;
    const sd_st_tensor *x0 = sd_st_find(g, "x0"), *ctx = sd_st_find(g, "ctx"), *nz = sd_st_find(g, "noise");
    const sd_st_tensor *tt = sd_st_find(g, "t"), *am = sd_st_find(g, "alpha_masks"), *ml = sd_st_find(g, "mask_latent");
    const sd_st_tensor *gl = sd_st_find(g, "loss"), *gs = sd_st_find(g, "grad_stats");
    if (!CHECK(names && x0 && ctx && nz && tt && am && ml && gl && gs)) {
        sd_st_close(g);
        return;
    }
    /* the reduction, from records holding the 128x128 alpha masks */
    float mask[2 * 16 * 16], flipped[16 * 16];
    static const uint16_t lat[4 * 16 * 16];
    double worst = 0;
    for (int b = 0; b < 2; b++) {
        sd_shard_rec r;
        memset(&r, 0, sizeof r);
        r.kind = SD_REC_LATENT;
        r.flags = SD_REC_F_MASK;
        r.bucket_w = r.bucket_h = 128;
        r.ntensors = 2;
        r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_SAMPLE, 3, {4, 16, 16, 0}, 0, 0, lat};
        r.t[1] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_MASK, 2, {128, 128, 0, 0}, 0, 0,
                                   (const float *)am->data + (size_t)b * 128 * 128};
        char note[NOTE_CAP];
        CHECK(sd_data_mask_load(&r, 0, 16, 16, mask + b * 256, note) == NULL);
        CHECK(sd_data_mask_load(&r, 1, 16, 16, flipped, note) == NULL);
        const float *want = (const float *)ml->data + b * 256;
        for (int i = 0; i < 256; i++) {
            double d = fabs((double)mask[b * 256 + i] - want[i]);
            worst = d > worst ? d : worst;
            CHECK(flipped[i] == mask[b * 256 + (i / 16) * 16 + 15 - i % 16]);
        }
    }
    if (!CHECK(worst <= 1e-6)) fprintf(stderr, "mask reduction off by %.3g\n", worst);
    sd_train_opts o;
    golden_opts(&o, "sd1");
    sd_trainer tr;
    if (!CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        sd_st_close(g);
        return;
    }
    const float *tf = tt->data;
    int t[2] = {(int)tf[0], (int)tf[1]};
    double loss;
    CHECK(sd_train_micro_masked(&tr, 2, 16, 16, 5, x0->data, ctx->data, NULL, NULL, nz->data, t, mask, 1.0, &loss,
                                &err) == SD_OK);
    double dl = fabs(loss - getd(gl, 0)) / getd(gl, 0), en, ep;
    float *zero = calloc(tr.unet.w.total, sizeof(float));
    check_change(&tr, tr.grad, zero, gs, names, &en, &ep);
    if (!CHECK(dl <= 1e-4 && en <= 1e-4 && ep <= 1e-4))
        fprintf(stderr, "masked loss %.8f want %.8f (rel %.2e), gradients worst norm %.2e projection %.2e\n", loss,
                getd(gl, 0), dl, en, ep);
    printf("golden masked loss (sd-scripts apply_masked_loss): mask %.2e, loss %.2e, gradients norm %.2e proj %.2e\n",
           worst, dl, en, ep);
    free(zero);
    sd_trainer_close(&tr);
    sd_st_close(g);
}

/* Chi-square critical values at p = 0.001 for 1..7 degrees of freedom. */
static const double chi2_crit[8] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

/* Per epoch, which variant each record of the variants shard below was
 * loaded with (read back from the constant its embedding holds), for E
 * epochs at batch size `batch`; variant -1 where the record was not seen. */
static int draw_epochs(const char *path, int batch, int variants, int E, int nrec, int *got, sd_error *err)
{
    const char *shards[1] = {path};
    sd_data d;
    if (sd_data_open(&d, shards, 1, batch, 7, 0, err)) return 0;
    sd_load_opts lo = {.channels = 4, .cross_dim = 8, .variants = variants, .no_flip = 1};
    sd_batch b;
    memset(&b, 0, sizeof b);
    sd_rng rng;
    sd_rng_seed(&rng, 1);
    sd_tally t;
    sd_tally_init(&t, 0);
    for (int i = 0; i < E * nrec; i++) got[i] = -1;
    sd_data_cursor cur = {0, 0};
    int ok = 1;
    for (;;) {
        sd_data_batch db;
        ok = sd_data_next(&d, &cur, &db, err) == SD_OK; /* the batch of the cursor's epoch after the call */
        long e = cur.epoch;
        if (!ok || e >= E) break;
        ok = sd_data_load(&d, &db, &lo, &rng, &b, &t, err) == SD_OK;
        for (int k = 0; ok && k < b.n; k++) {
            const sd_data_item *it = &d.items[b.item[k]];
            int rec = atoi((const char *)d.keys + it->koff + 3); /* "recNN" */
            got[e * nrec + rec] = (int)lroundf(b.ctx[(size_t)k * (size_t)b.tctx * 8]) - 1;
        }
    }
    sd_batch_free(&b);
    sd_data_close(&d);
    return ok && t.total == 0;
}

/* sd-train's caption variants: each record trains on one of its K
 * variants per epoch, drawn uniformly (a chi-square test per record over
 * 400 epochs and over all records together), the same draw whatever the
 * batch size (a function of seed, epoch and record, not of call order),
 * and its caption alone without variants (validation). */
static void test_variant_draws(void)
{
    char path[] = "/tmp/sdtk-variants-XXXXXX";
    int fd = mkstemp(path);
    if (!CHECK(fd >= 0)) return;
    close(fd);
    enum { NREC = 6, E = 400 };
    sd_error err = {0};
    sd_shard *s = NULL;
    sd_shard_opts so = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, 1 << 20, 0};
    unlink(path);
    int ok = CHECK(sd_shard_open(&s, path, &so, &err) == SD_OK) &&
             CHECK(sd_shard_meta_set(s, SD_SHARD_META_SCALING, "1", &err) == SD_OK);
    int kv[NREC];
    for (int r = 0; r < NREC && ok; r++) {
        kv[r] = r < 5 ? 2 + r : 8; /* 2..6 and 8 variants */
        uint8_t refs[8 * 16], tk[16] = {0};
        tk[0] = 0xa0;
        tk[1] = (uint8_t)r;
        for (int v = 0; v < kv[r] && ok; v++) {
            tk[2] = (uint8_t)v;
            memcpy(refs + 16 * v, tk, 16);
            ok = CHECK(put_text_const(s, tk, (float)(v + 1), &err));
        }
        char name[16];
        snprintf(name, sizeof name, "rec%02d", r);
        uint8_t key[16] = {0};
        memcpy(key, name, strlen(name));
        sd_shard_rec rec;
        memset(&rec, 0, sizeof rec);
        float lat[4 * 8 * 8] = {0};
        rec.kind = SD_REC_LATENT;
        rec.bucket_w = rec.bucket_h = 64;
        rec.orig_w = rec.orig_h = 64;
        rec.crop[2] = rec.crop[3] = 64;
        memcpy(rec.text_ref, refs, 16);
        rec.name = name;
        rec.name_len = strlen(name);
        rec.ntensors = 1;
        rec.t[0] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_SAMPLE, 3, {4, 8, 8, 0}, 0, 0, lat};
        sd_buf b;
        sd_buf_init(&b);
        ok = CHECK(sd_shard_rec_build(&rec, &b, &err) == SD_OK && sd_shard_put(s, key, 16, b.data, b.len, &err) == SD_OK &&
                   sd_shard_put_variants(s, key, 16, refs, (size_t)kv[r], &err) == SD_OK);
        sd_buf_free(&b);
    }
    ok = CHECK(sd_shard_close(s, &err) == SD_OK) && ok;
    static int got[E * NREC], got3[E * NREC], none[E * NREC];
    ok = ok && CHECK(draw_epochs(path, 4, 1, E, NREC, got, &err)) && CHECK(draw_epochs(path, 3, 1, E, NREC, got3, &err)) &&
         CHECK(draw_epochs(path, 4, 0, E, NREC, none, &err));
    if (!ok) fprintf(stderr, "test_variant_draws: %s\n", err.msg);
    double total = 0;
    int dof = 0;
    for (int r = 0; ok && r < NREC; r++) {
        int count[8] = {0};
        for (int e = 0; e < E; e++) {
            int v = got[e * NREC + r];
            if (!CHECK(v >= 0 && v < kv[r])) break;
            count[v]++;
            CHECK(got3[e * NREC + r] == v); /* batch 3 or 4: the same draw */
            CHECK(none[e * NREC + r] == 0); /* no drawing: the record's caption */
        }
        double want = (double)E / kv[r], chi = 0;
        for (int v = 0; v < kv[r]; v++) chi += (count[v] - want) * (count[v] - want) / want;
        if (!CHECK(chi < chi2_crit[kv[r] - 1]))
            fprintf(stderr, "record %d: chi-square %.2f over %d variants (critical %.2f)\n", r, chi, kv[r],
                    chi2_crit[kv[r] - 1]);
        total += chi;
        dof += kv[r] - 1;
    }
    /* all records together: chi-square with dof degrees of freedom, its
     * p = 0.001 bound by the Wilson-Hilferty normal approximation (z = 3.09) */
    double k = dof, bound = k * pow(1 - 2 / (9 * k) + 3.09 * sqrt(2 / (9 * k)), 3);
    if (!CHECK(!ok || total < bound)) fprintf(stderr, "all records: chi-square %.2f, %d dof (bound %.2f)\n", total, dof, bound);
    sd_shard_remove_files(path);
}

/* A /proc/self/status field in KiB (VmRSS, VmHWM); -1 when absent. */
static long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    size_t k = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0 && line[k] == ':') {
            kib = strtol(line + k + 1, NULL, 10);
            break;
        }
    if (f) fclose(f);
    return kib;
}

/* --weight-dtype bf16 starts in bf16 (issue 28): opening a trainer on a
 * new 47M-parameter UNet with bf16 weights leaves no fp32 buffer
 * (unet.w.data NULL) and its resident set grows by the bf16 weights
 * (2 bytes a parameter; ASan's shadow adds an eighth), under the 4 bytes
 * a parameter an fp32 model alone takes: init-then-round held 6. The peak
 * is the kernel's VmHWM, reset just before the open (clear_refs 5); the
 * optimizer state and gradient buffer are allocated zeroed and untouched. */
static void test_bf16_start_memory(void)
{
    char dir[] = "/tmp/sdtk_w16_XXXXXX", cfg[600];
    sd_error err = {0};
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *f = fopen(cfg, "w");
    if (!CHECK(f != NULL)) return;
    fputs("{\"block_out_channels\": [32, 64, 512], \"layers_per_block\": 2, \"cross_attention_dim\": 8,"
          " \"attention_head_dim\": 2, \"norm_num_groups\": 4,"
          " \"down_block_types\": [\"CrossAttnDownBlock2D\", \"CrossAttnDownBlock2D\", \"DownBlock2D\"],"
          " \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\", \"CrossAttnUpBlock2D\"]}\n", f);
    fclose(f);
    sd_train_opts o;
    sd_train_opts_default(&o);
    o.unet_config = cfg;
    o.weight_dtype = SD_DT_BF16;
    FILE *cr = fopen("/proc/self/clear_refs", "w");
    int reset = cr && fputs("5", cr) >= 0;
    if (cr) reset &= fclose(cr) == 0;
    long rss0 = status_kib("VmRSS");
    sd_trainer tr;
    if (CHECK(sd_trainer_open(&tr, &o, &err) == SD_OK)) {
        long hwm = status_kib("VmHWM");
        size_t n = tr.unet.w.total;
        CHECK(tr.w16 != NULL && tr.unet.w.data == NULL && n > 40000000);
        double grew = (double)(hwm - rss0) * 1024.0 / (double)n;
        printf("bf16 start: %zu weights, resident set grew by %.2f bytes a weight at its peak\n", n, grew);
        if (CHECK(reset && rss0 > 0 && hwm > 0)) CHECK(grew >= 1.5 && grew < 4.0);
        sd_trainer_close(&tr);
    } else {
        fprintf(stderr, "bf16 start: %s\n", err.msg);
    }
    rmtree(dir);
}

/* One micro-batch of the golden file's noise<s>, t<s> at half weight. */
static int golden_micro(sd_trainer *tr, const sd_safetensors *g, int s)
{
    sd_error err = {0};
    char nn[16], tn[16];
    snprintf(nn, sizeof nn, "noise%d", s);
    snprintf(tn, sizeof tn, "t%d", s);
    const sd_st_tensor *x0 = sd_st_find(g, "x0"), *ctx = sd_st_find(g, "ctx"), *nz = sd_st_find(g, nn),
                       *tt = sd_st_find(g, tn);
    if (!CHECK(x0 && ctx && nz && tt)) return -1;
    const float *tf = tt->data;
    int t[2] = {(int)tf[0], (int)tf[1]};
    double loss;
    sd_status rc = sd_train_micro(tr, 2, 16, 16, 5, x0->data, ctx->data, NULL, NULL, nz->data, t, 0.5, &loss, &err);
    if (rc) fprintf(stderr, "grad16 micro: %s\n", err.msg);
    return CHECK(rc == SD_OK && isfinite(loss)) ? 0 : -1;
}

/* Elements of the bf16 gradient that differ from want, the reference. */
static size_t g16_differ(const sd_trainer *tr, const uint16_t *want)
{
    size_t bad = 0;
    for (size_t i = 0; i < tr->unet.w.total; i++) bad += tr->g16[i] != want[i];
    return bad;
}

/* --grad-dtype bf16 against fp32 gradients on the tiny SD1 UNet (the
 * golden inputs, two micro-batches, clipping at 0.05 so the global norm
 * matters): after each micro-batch the bf16 buffer is the fp32 gradients
 * added and rounded as sd_train_g16_add says (first one rounding, then
 * widen + add + round, keyed by step and micro-batch); the norm of the
 * bf16 values within 1e-12 of the fp32 buffer's norm of the same values;
 * the update from them (per tensor, widened) byte-identical to the fp32
 * run's whole-buffer update from that gradient, for AdamW, AdamW8bit and
 * Adafactor on fp32 and bf16 weights, and with --clip-per-tensor. */
static void test_grad16(void)
{
    const char *names;
    sd_safetensors *g = golden_file("sd1", &names);
    if (!g) return;
    const struct {
        sd_optimizer opt;
        int wdt, per_tensor;
    } cases[] = {{SD_OPT_ADAMW, SD_DT_F32, 0},     {SD_OPT_ADAMW, SD_DT_BF16, 0},     {SD_OPT_ADAMW8BIT, SD_DT_F32, 0},
                 {SD_OPT_ADAMW8BIT, SD_DT_BF16, 0}, {SD_OPT_ADAFACTOR, SD_DT_F32, 0}, {SD_OPT_ADAFACTOR, SD_DT_BF16, 0},
                 {SD_OPT_ADAMW, SD_DT_F32, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sd_train_opts o;
        golden_opts(&o, "sd1");
        o.optimizer = cases[c].opt;
        o.weight_dtype = cases[c].wdt;
        o.clip_per_tensor = cases[c].per_tensor;
        o.seed = 11;
        sd_trainer a, b;
        sd_error err = {0};
        if (!CHECK(sd_trainer_open(&a, &o, &err) == SD_OK)) {
            fprintf(stderr, "grad16 fp32: %s\n", err.msg);
            continue;
        }
        o.grad_dtype = SD_DT_BF16;
        if (!CHECK(sd_trainer_open(&b, &o, &err) == SD_OK)) {
            fprintf(stderr, "grad16 bf16: %s\n", err.msg);
            sd_trainer_close(&a);
            continue;
        }
        size_t n = a.unet.w.total;
        CHECK(b.g16 != NULL && b.grad == NULL && a.g16 == NULL);
        uint16_t *want = calloc(n, sizeof *want);
        float *g1 = malloc(n * sizeof *g1);
        int ok = want && g1;
        for (int s = 0; ok && s < 2; s++) {
            /* the fp32 run's gradient of this micro-batch alone, then the reference add */
            memset(a.grad, 0, n * sizeof(float));
            ok = golden_micro(&a, g, s) == 0 && golden_micro(&b, g, s) == 0;
            memcpy(g1, a.grad, n * sizeof(float));
            uint32_t key = sd_train_g16_key(&b, 1, s);
            for (size_t i = 0; ok && i < n; i++) want[i] = sdm_bf16_sr(sdm_bf16_widen(want[i]) + g1[i], sdm_mix32(key, i));
            size_t bad = ok ? g16_differ(&b, want) : n;
            if (!CHECK(bad == 0)) fprintf(stderr, "grad16 case %zu micro %d: %zu of %zu values differ\n", c, s, bad, n);
        }
        /* the keys differ by micro-batch and by step */
        CHECK(sd_train_g16_key(&b, 1, 0) != sd_train_g16_key(&b, 1, 1));
        CHECK(sd_train_g16_key(&b, 1, 0) != sd_train_g16_key(&b, 2, 0));
        if (ok) {
            for (size_t i = 0; i < n; i++) a.grad[i] = sdm_bf16_widen(b.g16[i]);
            double na, nb;
            CHECK(sd_train_grad_norm_local(&a, &na, &err) == SD_OK && sd_train_grad_norm_local(&b, &nb, &err) == SD_OK);
            CHECK(fabs(na - nb) <= 1e-12 * na && na > 0.05); /* clipped */
            sd_train_apply_norm(&a, nb);
            sd_train_apply_norm(&b, nb);
            if (cases[c].wdt == SD_DT_BF16) CHECK(memcmp(a.w16, b.w16, n * sizeof *a.w16) == 0);
            else CHECK(memcmp(a.unet.w.data, b.unet.w.data, n * sizeof(float)) == 0);
            CHECK(memcmp(a.ema, b.ema, n * sizeof(float)) == 0);
            /* the buffer is zero for the next step, whose first micro-batch keys again from 0 */
            memset(want, 0, n * sizeof *want);
            CHECK(g16_differ(&b, want) == 0 && b.g16_micro == 0 && b.step == 1);
        }
        free(want);
        free(g1);
        sd_trainer_close(&a);
        sd_trainer_close(&b);
    }
    sd_st_close(g);
}

/* The trainer's state on the host after a run (weights as the run keeps
 * them, AdamW moments or the other optimizer's buffers, EMA), as bytes. */
static unsigned char *state_bytes(sd_trainer *tr, size_t *len)
{
    size_t n = tr->unet.w.total, wb = tr->w16 ? 2 : 4, mb = tr->m ? 2 * n * tr->moment_size : 0, ob = 0;
    for (size_t i = 0; i < tr->opt.nbufs; i++)
        ob += tr->opt.bufs[i].count * (tr->opt.bufs[i].st_dtype == SD_ST_U8 ? 1 : 4);
    *len = n * wb + mb + ob + (tr->ema ? n * 4 : 0);
    unsigned char *b = malloc(*len ? *len : 1), *at = b;
    if (!b) return NULL;
    memcpy(at, tr->w16 ? (const void *)tr->w16 : (const void *)tr->unet.w.data, n * wb);
    at += n * wb;
    if (mb) {
        memcpy(at, tr->m, mb / 2);
        memcpy(at + mb / 2, tr->v, mb / 2);
        at += mb;
    }
    for (size_t i = 0; i < tr->opt.nbufs; i++) {
        size_t k = tr->opt.bufs[i].count * (tr->opt.bufs[i].st_dtype == SD_ST_U8 ? 1 : 4);
        memcpy(at, tr->opt.bufs[i].data, k);
        at += k;
    }
    if (tr->ema) memcpy(at, tr->ema, n * 4);
    return b;
}

/* Run o to its last step (resuming from the checkpoint `from` when not
 * NULL), the state synced to the host and copied out; NULL on failure. */
static unsigned char *run_state(const sd_train_opts *o, const char *from, size_t *len)
{
    sd_trainer tr;
    sd_error err = {0};
    if (!CHECK(sd_trainer_open(&tr, o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    int ok = !from || CHECK(sd_train_resume(&tr, from, &err) == SD_OK);
    if (ok) ok = CHECK(sd_train_run(&tr, NULL, &err) == SD_OK);
    if (ok) ok = CHECK(sd_train_sync_host(&tr, &err) == SD_OK);
    if (!ok) fprintf(stderr, "%s\n", err.msg);
    unsigned char *b = ok && CHECK(tr.step == o->max_steps) ? state_bytes(&tr, len) : NULL;
    sd_trainer_close(&tr);
    return b;
}

/* The device paths of the trainer on the host: the CPU table marked
 * is_device (o.backend) makes the trainer keep device copies of its state,
 * upload, sync, widen bf16 weights, mirror the other optimizers' state and
 * run the fused scratch through the table, exactly as on a GPU, with the
 * CPU's arithmetic. For AdamW, AdamW with bf16 moments on bf16 weights,
 * 8-bit AdamW, Adafactor with a first moment, fused Adafactor and 8-bit
 * AdamW on bf16 weights, and 8-bit AdamW and Adafactor under --zero1 in a
 * world of one (each with an EMA): 4 steps checkpointed at step 2, and a
 * resume from that checkpoint, end byte-identical to the plain CPU run
 * (two ranks: zero_device_mpi). (A missing upload, sync or mirror would show here before
 * any GPU ran.) */
static void test_device_paths_on_host(void)
{
    char dir[] = "/tmp/sdtk_traindev_XXXXXX", shard[600], out[600];
    sd_error err = {0};
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    snprintf(shard, sizeof shard, "%s/cache.shard", dir);
    if (!CHECK(make_shard(shard, "0.18215", &err))) {
        fprintf(stderr, "%s\n", err.msg);
        rmtree(dir);
        return;
    }
    sd_backend fake = *sd_backend_cpu();
    fake.is_device = 1;
    fake.name = "cpu (as a device)";
    const char *shards[1] = {shard};
    struct {
        const char *what;
        sd_optimizer opt;
        int w16, m16, fused, zero1;
        double beta1;
        int ema_host; /* the EMA in host memory (--ema-on-cpu): bf16 weights widen and copy each chunk over */
    } cfg[] = {{"adamw, bf16 weights, ema on the host", SD_OPT_ADAMW, 1, 0, 0, 0, -1, 1},
               {"adafactor, bf16 weights, fused, ema on the host", SD_OPT_ADAFACTOR, 1, 0, 1, 0, -1, 1},
               {"adamw", SD_OPT_ADAMW, 0, 0, 0, 0, -1, 0},
               {"adamw, bf16 moments and weights", SD_OPT_ADAMW, 1, 1, 0, 0, -1, 0},
               {"adamw, bf16 weights", SD_OPT_ADAMW, 1, 0, 0, 0, -1, 0},
               {"adamw8bit", SD_OPT_ADAMW8BIT, 0, 0, 0, 0, -1, 0},
               {"adafactor, beta1", SD_OPT_ADAFACTOR, 0, 0, 0, 0, 0.9, 0},
               {"adafactor, bf16 weights, fused", SD_OPT_ADAFACTOR, 1, 0, 1, 0, -1, 0},
               {"adamw8bit, bf16 weights, fused", SD_OPT_ADAMW8BIT, 1, 0, 1, 0, -1, 0},
               /* ZeRO-1 in a world of one: the device mirrors the rank's run of tensors */
               {"adamw8bit, zero1", SD_OPT_ADAMW8BIT, 0, 0, 0, 1, -1, 0},
               {"adafactor, beta1, zero1", SD_OPT_ADAFACTOR, 0, 0, 0, 1, 0.9, 0}};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        unsigned char *st[3] = {NULL, NULL, NULL};
        size_t len[3] = {0, 0, 0};
        for (int k = 0; k < 3; k++) { /* the CPU, the host as a device, and that resumed at step 2 */
            sd_train_opts o;
            snprintf(out, sizeof out, "%s/run%zu-%d", dir, i, k < 2 ? k : 1);
            shard_opts(&o, shards, out, 4, 1);
            o.accum = 1;
            o.save_every = 2;
            o.optimizer = cfg[i].opt;
            o.adafactor_beta1 = cfg[i].beta1;
            o.weight_dtype = cfg[i].w16 ? SD_DT_BF16 : SD_DT_F32;
            o.moments = cfg[i].m16 ? SD_DT_BF16 : SD_DT_F32;
            o.fused_backward = cfg[i].fused;
            o.zero1 = cfg[i].zero1;
            o.ema_host = cfg[i].ema_host;
            if (k) {
                o.backend = &fake;
                o.backend_exec = NULL;
            }
            char ck[700];
            snprintf(ck, sizeof ck, "%s/checkpoint-2", out); /* the device run's, written through its sync */
            st[k] = run_state(&o, k == 2 ? ck : NULL, &len[k]);
        }
        int same = st[0] && st[1] && st[2] && len[0] == len[1] && len[0] == len[2] &&
                   memcmp(st[0], st[1], len[0]) == 0 && memcmp(st[0], st[2], len[0]) == 0;
        if (!CHECK(same)) fprintf(stderr, "device paths on the host: %s: not the CPU's state\n", cfg[i].what);
        for (int k = 0; k < 3; k++) free(st[k]);
    }
    /* --zero2 needs ranks to shard over: in a world of one the library
     * refuses it for these optimizers on a device as on the CPU (the
     * device's ZeRO-2 path runs under mpirun only) */
    for (int i = 0; i < 2; i++) {
        sd_optimizer opts[2] = {SD_OPT_ADAMW8BIT, SD_OPT_ADAFACTOR};
        sd_train_opts o;
        snprintf(out, sizeof out, "%s/zero2-world1", dir);
        shard_opts(&o, shards, out, 4, 1);
        o.optimizer = opts[i];
        o.zero2 = 1;
        o.backend = &fake;
        o.backend_exec = NULL;
        sd_trainer tr;
        sd_error e = {0};
        sd_status rc = sd_trainer_open(&tr, &o, &e);
        if (!rc) sd_trainer_close(&tr);
        if (!CHECK(rc == SD_EUNSUPPORTED && strstr(e.msg, "mpirun -np N")))
            fprintf(stderr, "zero2 with %s on a device in a world of one: %d, %s\n", sd_optimizer_name(opts[i]), rc,
                    e.msg);
    }
    rmtree(dir);
}

/* 8-bit AdamW and Adafactor under --zero1 and --zero2 on "device" ranks:
 * run by e2e_train_mpi under mpirun -np 2 (test_train --zero-device-mpi
 * DIR SHARD, DIR shared by the ranks), so each rank's run of tensors
 * starts past offset 0 on one of them and the device mirrors only it.
 * Per rank, its weights and its part of the state after 4 steps
 * (checkpointed at 2) on the CPU table marked is_device, and resumed from
 * that checkpoint, are byte-identical to the plain CPU ranks' run. */
static int zero_device_mpi(int argc, char **argv)
{
    sd_error err = {0};
    if (sd_dist_init(&argc, &argv, &err)) {
        fprintf(stderr, "test_train --zero-device-mpi: %s\n", err.msg);
        return 1;
    }
    const char *dir = argv[2], *shards[1] = {argv[3]};
    sd_backend fake = *sd_backend_cpu();
    fake.is_device = 1;
    fake.name = "cpu (as a device)";
    sd_optimizer opts[2] = {SD_OPT_ADAMW8BIT, SD_OPT_ADAFACTOR};
    for (int z = 1; z <= 2; z++) {
        for (int i = 0; i < 2; i++) {
            unsigned char *st[3] = {NULL, NULL, NULL};
            size_t len[3] = {0, 0, 0};
            for (int k = 0; k < 3; k++) { /* CPU ranks, "device" ranks, those resumed at step 2 */
                sd_train_opts o;
                char out[600], ck[700];
                snprintf(out, sizeof out, "%s/zero%d-%s-%d", dir, z, sd_optimizer_name(opts[i]), k < 2 ? k : 1);
                shard_opts(&o, shards, out, 4, 1);
                o.accum = 1;
                o.save_every = 2;
                o.optimizer = opts[i];
                o.adafactor_beta1 = opts[i] == SD_OPT_ADAFACTOR ? 0.9 : -1;
                o.zero1 = z == 1;
                o.zero2 = z == 2;
                if (k) {
                    o.backend = &fake;
                    o.backend_exec = NULL;
                }
                snprintf(ck, sizeof ck, "%s/checkpoint-2", out);
                st[k] = run_state(&o, k == 2 ? ck : NULL, &len[k]);
            }
            int same = st[0] && st[1] && st[2] && len[0] == len[1] && len[0] == len[2] &&
                       memcmp(st[0], st[1], len[0]) == 0 && memcmp(st[0], st[2], len[0]) == 0;
            if (!CHECK(same))
                fprintf(stderr, "rank %d: --zero%d with %s on a device: not the CPU ranks' state\n", sd_dist_rank(),
                        z, sd_optimizer_name(opts[i]));
            for (int k = 0; k < 3; k++) free(st[k]);
        }
    }
    int rc = check_done("test_train --zero-device-mpi");
    sd_dist_finalize();
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--zero-device-mpi") == 0) return zero_device_mpi(argc, argv);
    const char *kinds[] = {"--make-shard", "--make-shard-without-text", "--make-empty-shard",
                           "--make-shard-with-variants", "--make-shard-tok150"};
    for (int k = 0; k < 5; k++) {
        if (argc != 3 || strcmp(argv[1], kinds[k]) != 0) continue;
        sd_error err = {0};
        if (make_shard_of(argv[2], "0.18215", k, &err)) return 0;
        fprintf(stderr, "%s: %s\n", argv[2], err.msg);
        return 1;
    }
    test_bf16_start_memory(); /* first: nothing else resident yet */
    test_variant_draws();
    test_lr();
    test_sdxl_data();
    test_golden();
    test_golden_sdxl();
    test_golden_masked();
    test_grad16();
    test_shard_runs();
    test_moments_bf16();
    test_zero_snr_step();
    test_device_paths_on_host();
    return check_done("test_train");
}
