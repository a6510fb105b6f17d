/* The UNet against diffusers (tests/golden/unet, made by
 * tests/golden/make_unet_golden.py): SD1-, SD2- and SDXL-shaped tiny
 * UNet2DConditionModels loaded from their diffusers folders (fp16) and
 * single-file ldm checkpoints (bf16; the same weights), forward output
 * within 1e-4 (absolute; outputs are O(1)), MSE loss within 1e-5 relative,
 * and the loss gradient of every parameter: per tensor, its L2 norm within
 * 1e-4 relative, its dot product with a fixed pseudo-random vector within
 * 1e-4 of |g| |r|, and the full tensors stored within 1e-4 of their largest
 * magnitude. 1 and 2 threads give bit-identical outputs and gradients.
 * Also: config inference from ldm names, transformer depths inferred per
 * block with the mid block counted on its own (the SDXL refiner's case),
 * tensors under the UNet's prefix that the config leaves unused refused,
 * config and weight save/load round trips, seeded random init, and load
 * errors. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "check.h"
#include "f16.h"
#include "safetensors.h"
#include "slurp.h"
#include "unet.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/unet"
#endif

/* The golden inputs and expected values of one config. */
typedef struct {
    sd_safetensors *st;
    const sd_st_tensor *x, *t, *ctx, *text, *tids, *target, *out, *loss, *stats;
    const char *names; /* grad_names metadata, one per line */
    int n, c, h, w, tctx;
} golden;

/* A tensor of the golden file, NULL with a failed check when absent. */
static const sd_st_tensor *need(const golden *g, const char *name)
{
    const sd_st_tensor *t = sd_st_find(g->st, name);
    if (!CHECK(t != NULL)) fprintf(stderr, "golden tensor %s missing\n", name);
    return t;
}

/* Open <name>/expected.safetensors; 0 on failure (already reported). */
static int golden_open(golden *g, const char *name)
{
    char path[512];
    sd_error err = {0};
    memset(g, 0, sizeof(*g));
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", GOLDEN_DIR, name);
    if (!CHECK(sd_st_open(&g->st, path, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return 0;
    }
    g->x = need(g, "x");
    g->t = need(g, "t");
    g->ctx = need(g, "ctx");
    g->target = need(g, "target");
    g->out = need(g, "out");
    g->loss = need(g, "loss");
    g->stats = need(g, "grad_stats");
    g->text = sd_st_find(g->st, "text");
    g->tids = sd_st_find(g->st, "tids");
    for (size_t i = 0; i < sd_st_meta_count(g->st); i++)
        if (strcmp(sd_st_meta_at(g->st, i)->key, "grad_names") == 0) g->names = sd_st_meta_at(g->st, i)->value;
    if (!CHECK(g->x && g->t && g->ctx && g->target && g->out && g->loss && g->stats && g->names)) return 0;
    g->n = (int)g->x->shape[0];
    g->c = (int)g->x->shape[1];
    g->h = (int)g->x->shape[2];
    g->w = (int)g->x->shape[3];
    g->tctx = (int)g->ctx->shape[1];
    return 1;
}

/* One forward + backward: the output, the loss and the parameter gradients. */
typedef struct {
    float *out, *grad;
    double loss;
    size_t nout;
    size_t nact, nsegs; /* the plan's activation floats and checkpointed segments */
} result;

/* Run the golden inputs through u on `threads` threads, gradient
 * checkpointing on or off: forward, MSE loss against the target, backward
 * of the loss into r->grad; with w16, on those bf16 weights (sd_unet_wts:
 * each op's widened into a scratch of exactly sd_unet_graph_wscratch
 * floats, so ASan sees any op that reads past it) instead of u->w.data. */
static int run_wts(const sd_unet *u, const golden *g, int threads, int checkpoint, const uint16_t *w16, result *r)
{
    sd_error err = {0};
    sd_unet_graph gr;
    memset(r, 0, sizeof(*r));
    if (!CHECK(sd_unet_plan(u, g->n, g->h, g->w, g->tctx, checkpoint, &gr, &err) == SD_OK)) {
        fprintf(stderr, "plan: %s\n", err.msg);
        return 0;
    }
    r->nact = gr.nact;
    r->nsegs = gr.nsegs;
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    float *act = calloc(gr.nact, sizeof(float)), *dact = malloc(gr.ndact * sizeof(float));
    r->nout = g->out->nbytes / 4;
    r->out = malloc(r->nout * sizeof(float));
    r->grad = calloc(u->w.total, sizeof(float));
    float *dout = malloc(r->nout * sizeof(float));
    int ok = CHECK(act && dact && r->out && r->grad && dout);
    if (ok) {
        memcpy(act + gr.x, g->x->data, g->x->nbytes);
        memcpy(act + gr.t, g->t->data, g->t->nbytes);
        memcpy(act + gr.ctx, g->ctx->data, g->ctx->nbytes);
        if (u->cfg.text_time) {
            ok = CHECK(g->text && g->tids);
            if (ok) {
                memcpy(act + gr.text, g->text->data, g->text->nbytes);
                memcpy(act + gr.tids, g->tids->data, g->tids->nbytes);
            }
        }
    }
    float *scratch = w16 ? malloc(sd_unet_graph_wscratch(&gr) * sizeof(float)) : NULL;
    if (w16) ok = ok && CHECK(scratch);
    sd_unet_wts wts = {u->w.data, w16, scratch};
    if (ok) {
        const sd_backend *be = sd_backend_cpu();
        sd_unet_forward_wts(&gr, be, pool, &wts, act);
        memcpy(r->out, act + gr.out, r->nout * sizeof(float));
        const float *tg = g->target->data;
        double sum = 0;
        for (size_t i = 0; i < r->nout; i++) {
            double d = (double)r->out[i] - (double)tg[i];
            sum += d * d;
            dout[i] = (float)(2.0 * d / (double)r->nout);
        }
        r->loss = sum / (double)r->nout;
        if (w16) sd_unet_backward_wts(u, &gr, be, pool, &wts, act, dact, dout, r->grad);
        else sd_unet_backward(u, &gr, be, pool, u->w.data, act, dact, dout, r->grad);
    }
    free(scratch);
    free(act);
    free(dact);
    free(dout);
    if (pool) sd_pool_destroy(pool);
    sd_unet_graph_free(&gr);
    return ok;
}

/* Release a result. */
static void result_free(result *r)
{
    free(r->out);
    free(r->grad);
}

/* run_wts on u's fp32 weights. */
static int run(const sd_unet *u, const golden *g, int threads, int checkpoint, result *r)
{
    return run_wts(u, g, threads, checkpoint, NULL, r);
}

/* --weight-dtype bf16's reading of the weights: u's weights cut to bf16
 * values, then the run on the bf16 bits (widened one op at a time, with
 * and without checkpointing) gives the bits of the fp32 run on those
 * values: the same output, the same fp32 gradients. */
static void check_bf16_weights(sd_unet *u, const golden *g)
{
    size_t n = u->w.total;
    uint16_t *w16 = malloc(n * sizeof(uint16_t));
    if (!CHECK(w16)) return;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, u->w.data + i, 4);
        w16[i] = (uint16_t)(b >> 16);
        b &= 0xffff0000u;
        memcpy(u->w.data + i, &b, 4);
    }
    result ref, plain, ck;
    if (run(u, g, 2, 1, &ref) && run_wts(u, g, 2, 0, w16, &plain) && run_wts(u, g, 1, 1, w16, &ck)) {
        CHECK(memcmp(plain.out, ref.out, ref.nout * sizeof(float)) == 0);
        CHECK(memcmp(plain.grad, ref.grad, n * sizeof(float)) == 0);
        CHECK(memcmp(ck.out, ref.out, ref.nout * sizeof(float)) == 0);
        CHECK(memcmp(ck.grad, ref.grad, n * sizeof(float)) == 0);
        double nz = 0;
        for (size_t i = 0; i < n; i++) nz += ref.grad[i] != 0;
        CHECK(nz > 0.5 * (double)n); /* a real backward, not two empty ones */
    }
    result_free(&ref);
    result_free(&plain);
    result_free(&ck);
    free(w16);
}


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

/* The slot of a diffusers parameter name, NULL when the model lacks it. */
static const sd_weight_slot *slot(const sd_unet *u, const char *name)
{
    for (size_t i = 0; i < u->w.nslots; i++)
        if (strcmp(u->w.slots[i].name, name) == 0) return &u->w.slots[i];
    return NULL;
}

/* Every parameter gradient against the golden statistics; returns the
 * largest relative errors through *enorm and *eproj. */
static void check_grads(const sd_unet *u, const golden *g, const float *grad, double *enorm, double *eproj,
                        double *efull)
{
    size_t np = (size_t)g->stats->shape[0], seen = 0;
    *enorm = *eproj = *efull = 0;
    const char *p = g->names;
    for (size_t i = 0; i < np && p && *p; i++) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        p = e ? e + 1 : p + len;
        const sd_weight_slot *s = slot(u, name);
        if (!CHECK(s != NULL)) {
            fprintf(stderr, "model has no parameter %s\n", name);
            continue;
        }
        seen++;
        const float *gr = grad + s->off;
        double nn = 0, pp = 0, rr = 0;
        for (size_t j = 0; j < s->n; j++) {
            nn += (double)gr[j] * gr[j];
            pp += (double)gr[j] * rvec(j);
            rr += rvec(j) * rvec(j);
        }
        double ref = getd(g->stats, 3 * i), en = fabs(sqrt(nn) - ref) / (ref > 0 ? ref : 1);
        double ep = fabs(pp - getd(g->stats, 3 * i + 1)) / ((ref > 0 ? ref : 1) * sqrt(rr));
        if (!(en <= *enorm)) *enorm = en;
        if (!(ep <= *eproj)) *eproj = ep;
        if (!CHECK(en <= 1e-4 && ep <= 1e-4))
            fprintf(stderr, "%s: gradient norm %.6e want %.6e (rel %.2e), projection rel %.2e\n", name, sqrt(nn), ref,
                    en, ep);
        char full[300];
        snprintf(full, sizeof full, "grad.%s", name);
        const sd_st_tensor *ft = sd_st_find(g->st, full);
        if (ft && CHECK(ft->nbytes == s->n * 4)) {
            const float *want = ft->data;
            double m = 0, mx = 0;
            for (size_t j = 0; j < s->n; j++) {
                double d = fabs((double)gr[j] - want[j]);
                if (!(d <= m)) m = d;
                if (fabs(want[j]) > mx) mx = fabs(want[j]);
            }
            double ef = m / (mx > 0 ? mx : 1);
            if (!(ef <= *efull)) *efull = ef;
            if (!CHECK(ef <= 1e-4)) fprintf(stderr, "%s: full gradient max error %.2e of %.2e\n", name, m, mx);
        }
    }
    CHECK(seen == np && seen == u->w.nslots);
}

/* Largest absolute difference from a golden fp32 tensor. */
static double max_err(const float *a, const sd_st_tensor *b)
{
    const float *e = b->data;
    double m = 0;
    for (size_t i = 0; i < b->nbytes / 4; i++) {
        double d = fabs((double)a[i] - (double)e[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Load path with opts and check output, loss and gradients; with
 * determinism also 2 threads against 1, bit for bit. */
static void check_model(const char *label, const char *path, const sd_unet_opts *opts, const golden *g,
                        int determinism)
{
    sd_unet u;
    sd_error err = {0};
    if (!CHECK(sd_unet_load(&u, path, opts, &err) == SD_OK)) {
        fprintf(stderr, "%s: %s\n", label, err.msg);
        return;
    }
    result r;
    if (run(&u, g, 1, 0, &r)) {
        double eo = max_err(r.out, g->out), want = getd(g->loss, 0);
        double el = fabs(r.loss - want) / want, en, ep, ef;
        check_grads(&u, g, r.grad, &en, &ep, &ef);
        printf("%-26s %-32s out %.2e loss %.2e grad norm %.2e proj %.2e full %.2e\n", label, u.layout, eo, el, en,
               ep, ef);
        CHECK(eo <= 1e-4);
        CHECK(el <= 1e-5);
        if (determinism) {
            result r2;
            if (run(&u, g, 2, 0, &r2)) {
                CHECK(memcmp(r2.out, r.out, r.nout * sizeof(float)) == 0);
                CHECK(memcmp(r2.grad, r.grad, u.w.total * sizeof(float)) == 0);
            }
            result_free(&r2);
            /* gradient checkpointing: every resnet and transformer block a
             * segment, a smaller activation buffer, the same bits */
            result r3;
            if (run(&u, g, 2, 1, &r3)) {
                size_t blocks = 0;
                for (int i = 0; i < u.cfg.nblocks; i++) {
                    blocks += (size_t)u.cfg.layers[i] * (1 + (u.cfg.down_attn[i] ? (size_t)u.cfg.depth[i] : 0));
                    blocks += (size_t)(u.cfg.layers[u.cfg.nblocks - 1 - i] + 1) *
                              (1 + (u.cfg.up_attn[i] ? (size_t)u.cfg.depth_up[i] : 0));
                }
                if (u.cfg.mid_attn) blocks += 2 + (size_t)u.cfg.depth[u.cfg.nblocks - 1];
                printf("%-26s checkpointed: %zu segments, activations %zu -> %zu floats\n", label, r3.nsegs, r.nact,
                       r3.nact);
                CHECK(r3.nsegs == blocks);
                CHECK(r3.nact < r.nact * 3 / 4);
                CHECK(memcmp(r3.out, r.out, r.nout * sizeof(float)) == 0);
                CHECK(memcmp(r3.grad, r.grad, u.w.total * sizeof(float)) == 0);
            }
            result_free(&r3);
            check_bf16_weights(&u, g); /* last: it cuts the weights to bf16 */
        }
    }
    result_free(&r);
    sd_unet_free(&u);
}

/* The structure inferred from an ldm single file without config.json
 * matches the real config except the attention heads (not in the
 * weights: SD1's 8, or 64-wide heads with linear projections). */
static void check_inferred(const char *name, int groups)
{
    char path[512], conf[512];
    sd_error err = {0};
    sd_unet_config want;
    sd_unet_config_default(&want);
    snprintf(conf, sizeof conf, "%s/%s/unet/config.json", GOLDEN_DIR, name);
    if (!CHECK(sd_unet_config_read(conf, &want, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/%s/single.safetensors", GOLDEN_DIR, name);
    sd_unet_opts o = {.groups = groups};
    sd_unet u;
    if (!CHECK(sd_unet_load(&u, path, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s inferred: %s\n", name, err.msg);
        return;
    }
    sd_unet_config got = u.cfg;
    CHECK(got.nblocks == want.nblocks && got.in_channels == want.in_channels &&
          got.out_channels == want.out_channels && got.mid_attn == want.mid_attn &&
          got.cross_dim == want.cross_dim && got.linear_proj == want.linear_proj &&
          got.text_time == want.text_time && got.add_in_dim == want.add_in_dim);
    for (int i = 0; i < want.nblocks; i++)
        CHECK(got.block_out[i] == want.block_out[i] && got.layers[i] == want.layers[i] &&
              got.down_attn[i] == want.down_attn[i] && got.up_attn[i] == want.up_attn[i] &&
              got.depth[i] == want.depth[i] && got.depth_up[i] == want.depth_up[i]);
    CHECK(strstr(u.layout, "ldm") != NULL);
    sd_unet_free(&u);
}

/* The diffusers file `single` in dir split into two shards and an index
 * as save_pretrained writes them above its size limit (the single file
 * removed); 0 when that worked. */
static int shard_in_two(const char *dir, const char *single)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    if (sd_st_open(&st, single, &err)) return -1;
    size_t n = sd_st_count(st), half = n / 2;
    sd_st_tensor *t = malloc(n * sizeof *t);
    sd_buf idx;
    sd_buf_init(&idx);
    sd_buf_puts(&idx, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    char p1[600], p2[600], ip[600];
    snprintf(p1, sizeof p1, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", dir);
    snprintf(ip, sizeof ip, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    int rc = t ? 0 : -1;
    for (size_t i = 0; i < n && !rc; i++) {
        t[i] = *sd_st_tensor_at(st, i);
        sd_buf_printf(&idx, "%s\"%s\": \"diffusion_pytorch_model-0000%d-of-00002.safetensors\"", i ? ", " : "", t[i].name,
                      i < half ? 1 : 2);
    }
    sd_buf_puts(&idx, "}}");
    if (!rc && (sd_st_write(p1, t, half, NULL, 0, &err) || sd_st_write(p2, t + half, n - half, NULL, 0, &err))) rc = -1;
    FILE *f = rc ? NULL : fopen(ip, "w");
    if (!f || fwrite(idx.data, 1, idx.len, f) != idx.len) rc = -1;
    if (f) fclose(f);
    sd_buf_free(&idx);
    free(t);
    sd_st_close(st);
    if (!rc) unlink(single);
    return rc;
}

/* config.json written and read back is the same config; weights saved in
 * both layouts load back bit-identical, also as a sharded diffusers
 * checkpoint (index + two shards). */
static void check_roundtrip(const char *name)
{
    char path[512], dir[] = "/tmp/sdtk_unet_XXXXXX", f[600];
    sd_error err = {0};
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, name);
    sd_unet u, v;
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    if (!CHECK(sd_unet_load(&u, path, NULL, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    snprintf(f, sizeof f, "%s/config.json", dir);
    CHECK(sd_unet_config_write(&u.cfg, f, &err) == SD_OK);
    sd_unet_config c;
    sd_unet_config_default(&c);
    CHECK(sd_unet_config_read(f, &c, &err) == SD_OK);
    CHECK(memcmp(&c, &u.cfg, sizeof c) == 0);
    snprintf(f, sizeof f, "%s/diffusion_pytorch_model.safetensors", dir);
    CHECK(sd_unet_save(&u, u.w.data, f, SD_UNET_NAMES_DIFFUSERS, "", SD_ST_F32, &err) == SD_OK);
    if (CHECK(sd_unet_load(&v, dir, NULL, &err) == SD_OK)) {
        CHECK(v.w.total == u.w.total && memcmp(v.w.data, u.w.data, u.w.total * sizeof(float)) == 0);
        CHECK(strcmp(v.layout, "diffusers") == 0);
        sd_unet_free(&v);
    }
    if (CHECK(shard_in_two(dir, f) == 0)) {
        if (CHECK(sd_unet_load(&v, dir, NULL, &err) == SD_OK)) {
            CHECK(v.w.total == u.w.total && memcmp(v.w.data, u.w.data, u.w.total * sizeof(float)) == 0);
            sd_unet_free(&v);
        } else {
            fprintf(stderr, "%s\n", err.msg);
        }
        char g[700];
        const char *parts[] = {"diffusion_pytorch_model-00001-of-00002.safetensors",
                               "diffusion_pytorch_model-00002-of-00002.safetensors",
                               "diffusion_pytorch_model.safetensors.index.json"};
        for (int i = 0; i < 3; i++) {
            snprintf(g, sizeof g, "%s/%s", dir, parts[i]);
            unlink(g);
        }
    }
    unlink(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(f, sizeof f, "%s/single.safetensors", dir);
    /* the golden weights are exact in bf16, so a bf16 file holds them all */
    CHECK(sd_unet_save(&u, u.w.data, f, SD_UNET_NAMES_LDM, "model.diffusion_model.", SD_ST_BF16, &err) == SD_OK);
    sd_unet_opts o = {.config_path = path};
    if (CHECK(sd_unet_load(&v, f, &o, &err) == SD_OK)) {
        CHECK(v.w.total == u.w.total && memcmp(v.w.data, u.w.data, u.w.total * sizeof(float)) == 0);
        CHECK(strstr(v.layout, "model.diffusion_model.") != NULL);
        sd_unet_free(&v);
    }
    /* the file alone: its metadata holds the config, heads and norm groups
     * included, which inference from the shapes would guess */
    if (CHECK(sd_unet_load(&v, f, NULL, &err) == SD_OK)) {
        CHECK(memcmp(&v.cfg, &u.cfg, sizeof v.cfg) == 0);
        CHECK(v.w.total == u.w.total && memcmp(v.w.data, u.w.data, u.w.total * sizeof(float)) == 0);
        sd_unet_free(&v);
    } else {
        fprintf(stderr, "%s single file alone: %s\n", name, err.msg);
    }
    unlink(f);
    unlink(path);
    rmdir(dir);
    sd_unet_free(&u);
}

/* Random init: reproducible per seed, norms 1/0, weights within torch's
 * +-1/sqrt(fan_in) bound and not all equal. */
static void check_init(void)
{
    sd_unet_config c;
    sd_error err = {0};
    sd_unet_config_default(&c);
    char conf[512];
    snprintf(conf, sizeof conf, "%s/sd1/unet/config.json", GOLDEN_DIR);
    if (!CHECK(sd_unet_config_read(conf, &c, &err) == SD_OK)) return;
    sd_unet a, b;
    if (!CHECK(sd_unet_build(&a, &c, &err) == SD_OK && sd_unet_build(&b, &c, &err) == SD_OK)) return;
    sd_unet_init_random(&a, 42);
    sd_unet_init_random(&b, 42);
    CHECK(memcmp(a.w.data, b.w.data, a.w.total * sizeof(float)) == 0);
    sd_unet_init_random(&b, 43);
    CHECK(memcmp(a.w.data, b.w.data, a.w.total * sizeof(float)) != 0);
    const sd_weight_slot *g = slot(&a, "conv_norm_out.weight"), *z = slot(&a, "conv_norm_out.bias");
    const sd_weight_slot *w = slot(&a, "conv_in.weight");
    if (CHECK(g && z && w)) {
        CHECK(a.w.data[g->off] == 1.0f && a.w.data[z->off] == 0.0f);
        float bound = 1.0f / sqrtf(4.0f * 9.0f), lo = 0, hi = 0;
        for (size_t i = 0; i < w->n; i++) {
            float v = a.w.data[w->off + i];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        CHECK(lo >= -bound && hi <= bound && hi - lo > bound);
    }
    sd_unet_free(&a);
    sd_unet_free(&b);
}

/* u's fp32 weights rounded to the nearest bf16 (today's load or init,
 * then sd_train_w16_narrow's rounding), for comparing with the paths that
 * go straight into bf16; NULL when out of memory. */
static uint16_t *rounded(const sd_unet *u)
{
    uint16_t *r = malloc(u->w.total * sizeof *r);
    for (size_t i = 0; r && i < u->w.total; i++) r[i] = sd_f32_to_bf16(u->w.data[i]);
    return r;
}

/* --weight-dtype bf16 starts without an fp32 model (issue 28): random init
 * straight into bf16 gives the bytes of init-then-round (same seed, padding
 * zero); loading fp32, fp16 and bf16 files straight into bf16 gives the
 * bytes of load-then-round with no fp32 buffer (w.data NULL) and the same
 * config; the layout-only load allocates no weights and checks the tensors
 * as a load does (SDXL's config on SD1's weights refused). */
static void check_bf16_start(void)
{
    sd_unet_config c;
    sd_error err = {0};
    sd_unet_config_default(&c);
    char conf[512], dir[] = "/tmp/sdtk_bf16_XXXXXX", f[600];
    snprintf(conf, sizeof conf, "%s/sd1/unet/config.json", GOLDEN_DIR);
    if (!CHECK(sd_unet_config_read(conf, &c, &err) == SD_OK) || !CHECK(mkdtemp(dir) != NULL)) return;
    sd_unet a, b, v;
    if (!CHECK(sd_unet_build(&a, &c, &err) == SD_OK)) return;
    if (!CHECK(sd_unet_build_names(&b, &c, &err) == SD_OK)) {
        sd_unet_free(&a);
        return;
    }
    sd_unet_init_random(&a, 42);
    uint16_t *want = rounded(&a), *got = calloc(b.w.total, sizeof *got);
    if (CHECK(want && got && b.w.data == NULL && b.w.total == a.w.total)) {
        sd_unet_init_random_bf16(&b, 42, got);
        CHECK(memcmp(got, want, a.w.total * sizeof *got) == 0);
        size_t same = 0; /* another seed: other weights (norms aside) */
        sd_unet_init_random_bf16(&b, 43, got);
        for (size_t i = 0; i < a.w.total; i++) same += got[i] == want[i];
        CHECK(same < a.w.total / 2);
    }
    free(got);
    static const int dts[3] = {SD_ST_F32, SD_ST_F16, SD_ST_BF16};
    for (int k = 0; k < 3; k++) {
        snprintf(f, sizeof f, "%s/unet%d.safetensors", dir, k);
        if (!CHECK(sd_unet_save(&a, a.w.data, f, SD_UNET_NAMES_DIFFUSERS, "", dts[k], &err) == SD_OK)) continue;
        uint16_t *exp = NULL, *w16 = NULL;
        if (CHECK(sd_unet_load(&v, f, NULL, &err) == SD_OK)) { /* the fp32 path, then rounded */
            exp = rounded(&v);
            sd_unet_free(&v);
        }
        if (CHECK(exp && sd_unet_load_bf16(&v, f, NULL, &w16, &err) == SD_OK)) {
            CHECK(v.w.data == NULL && w16 != NULL && v.w.total == a.w.total);
            CHECK(memcmp(&v.cfg, &a.cfg, sizeof v.cfg) == 0);
            CHECK(w16 && memcmp(w16, exp, a.w.total * sizeof *w16) == 0);
            if (k == 0) CHECK(w16 && memcmp(w16, want, a.w.total * sizeof *w16) == 0);
            sd_unet_free(&v);
        } else {
            fprintf(stderr, "  bf16 load of %s: %s\n", f, err.msg);
        }
        free(w16);
        free(exp);
        if (CHECK(sd_unet_load_bf16(&v, f, NULL, NULL, &err) == SD_OK)) { /* the layout only */
            CHECK(v.w.data == NULL && v.w.total == a.w.total && v.w.nslots == a.w.nslots);
            sd_unet_free(&v);
        }
    }
    /* SDXL's config on SD1's weights: refused by both, nothing left allocated */
    char xl[512];
    snprintf(xl, sizeof xl, "%s/sdxl/unet/config.json", GOLDEN_DIR);
    sd_unet_opts o = {.config_path = xl};
    uint16_t *w16 = (uint16_t *)&o;
    snprintf(f, sizeof f, "%s/unet0.safetensors", dir);
    sd_status rc = sd_unet_load_bf16(&v, f, &o, &w16, &err);
    CHECK((rc == SD_EFORMAT || rc == SD_ENOTFOUND) && w16 == NULL && strstr(err.msg, "unet0.safetensors") != NULL);
    rc = sd_unet_load_bf16(&v, f, &o, NULL, &err);
    CHECK(rc == SD_EFORMAT || rc == SD_ENOTFOUND);
    for (int k = 0; k < 3; k++) {
        snprintf(f, sizeof f, "%s/unet%d.safetensors", dir, k);
        unlink(f);
    }
    rmdir(dir);
    free(want);
    sd_unet_free(&a);
    sd_unet_free(&b);
}

/* Load failures name the file and the reason. */
static void check_errors(void)
{
    sd_unet u;
    sd_error err = {0};
    char path[512], conf[512];
    CHECK(sd_unet_load(&u, "/nonexistent/unet.safetensors", NULL, &err) != SD_OK);
    CHECK(strstr(err.msg, "/nonexistent/unet.safetensors") != NULL);
    CHECK(sd_unet_load(&u, GOLDEN_DIR, NULL, &err) == SD_ENOTFOUND);
    snprintf(path, sizeof path, "%s/sd1/expected.safetensors", GOLDEN_DIR);
    CHECK(sd_unet_load(&u, path, NULL, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "no UNet") != NULL);
    /* SDXL's config on SD1's weights: a tensor is missing or misshapen */
    snprintf(path, sizeof path, "%s/sd1/single.safetensors", GOLDEN_DIR);
    snprintf(conf, sizeof conf, "%s/sdxl/unet/config.json", GOLDEN_DIR);
    sd_unet_opts o = {.config_path = conf};
    sd_status rc = sd_unet_load(&u, path, &o, &err);
    CHECK(rc == SD_EFORMAT || rc == SD_ENOTFOUND);
    CHECK(strstr(err.msg, "single.safetensors") != NULL);
    /* the default 32 norm groups cannot split 8 channels */
    CHECK(sd_unet_load(&u, path, NULL, &err) == SD_EINVAL);
    CHECK(strstr(err.msg, "norm groups") != NULL);
    /* a plan for latents the up path cannot restore */
    snprintf(path, sizeof path, "%s/sd1", GOLDEN_DIR);
    if (CHECK(sd_unet_load(&u, path, NULL, &err) == SD_OK)) {
        sd_unet_graph g;
        CHECK(sd_unet_plan(&u, 1, 18, 16, 4, 0, &g, &err) == SD_EINVAL);
        CHECK(strstr(err.msg, "multiples of 4") != NULL);
        sd_unet_free(&u);
    }
}

/* src's tensors minus those whose names start with one of drop[0..ndrop),
 * plus `add` (NULL: none), written to dst; 0 when that worked. */
static int rewrite(const char *src, const char *dst, const char *const *drop, int ndrop, const sd_st_tensor *add)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    if (sd_st_open(&st, src, &err)) return -1;
    size_t n = 0;
    sd_st_tensor *t = malloc((sd_st_count(st) + 1) * sizeof *t);
    for (size_t i = 0; t && i < sd_st_count(st); i++) {
        const sd_st_tensor *x = sd_st_tensor_at(st, i);
        int keep = 1;
        for (int k = 0; k < ndrop; k++) keep &= strncmp(x->name, drop[k], strlen(drop[k])) != 0;
        if (keep) t[n++] = *x;
    }
    if (t && add) t[n++] = *add;
    int rc = t && sd_st_write(dst, t, n, NULL, 0, &err) == SD_OK ? 0 : -1;
    free(t);
    sd_st_close(st);
    return rc;
}

/* Load path without a config (4 norm groups, as the sd1 golden) and
 * check it is refused with status want and `says` in the message. */
static void refused(const char *path, const sd_unet_opts *opts, sd_status want, const char *says)
{
    sd_unet v;
    sd_error err = {0};
    sd_unet_opts o = {.groups = 4};
    sd_status rc = sd_unet_load(&v, path, opts ? opts : &o, &err);
    if (rc == SD_OK) sd_unet_free(&v);
    if (!CHECK(rc == want && strstr(err.msg, says) != NULL))
        fprintf(stderr, "  %s: status %d, '%s' lacks '%s'\n", path, (int)rc, err.msg, says);
}

/* Transformer depths inferred from the weights, as the SDXL refiner
 * needs them: the sd1 golden's layout (the last block without attention)
 * with depths 1, 2 and a mid block of 3, saved in both layouts, loads
 * back whole and bit-identical (the mid depth used to come from the last
 * block's attention, absent: 1, and the other two mid transformer
 * blocks were left in the file unread). A block whose attentions differ
 * in depth, a depth its mirrored up block does not share, and tensors
 * under the UNet's prefix that the config does not use are refused. */
static void check_depths(void)
{
    char conf[512], dir[] = "/tmp/sdtk_depth_XXXXXX", dif[600], ldm[600], cut[600], cj[600];
    sd_error err = {0};
    sd_unet_config c;
    sd_unet_config_default(&c);
    snprintf(conf, sizeof conf, "%s/sd1/unet/config.json", GOLDEN_DIR);
    if (!CHECK(sd_unet_config_read(conf, &c, &err) == SD_OK) || !CHECK(mkdtemp(dir) != NULL)) return;
    for (int i = 0; i < 3; i++) c.depth[i] = c.depth_up[2 - i] = i + 1;
    sd_unet u, v;
    if (!CHECK(sd_unet_build(&u, &c, &err) == SD_OK)) return;
    sd_unet_init_random(&u, 5);
    snprintf(dif, sizeof dif, "%s/dif.safetensors", dir);
    snprintf(ldm, sizeof ldm, "%s/ldm.safetensors", dir);
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    CHECK(sd_unet_save(&u, u.w.data, dif, SD_UNET_NAMES_DIFFUSERS, "", SD_ST_F32, &err) == SD_OK);
    CHECK(sd_unet_save(&u, u.w.data, ldm, SD_UNET_NAMES_LDM, "model.diffusion_model.", SD_ST_F32, &err) == SD_OK);
    const char *files[2] = {dif, ldm};
    sd_unet_opts o = {.groups = 4};
    for (int f = 0; f < 2; f++) {
        if (!CHECK(sd_unet_load(&v, files[f], &o, &err) == SD_OK)) {
            fprintf(stderr, "  %s: %s\n", files[f], err.msg);
            continue;
        }
        CHECK(v.mid_att.depth == 3);
        for (int i = 0; i < 3; i++)
            CHECK(v.cfg.depth[i] == c.depth[i] && v.cfg.down_attn[i] == c.down_attn[i] &&
                  v.cfg.up_attn[i] == c.up_attn[i] && v.cfg.depth_up[i] == c.depth_up[i]);
        CHECK(v.w.total == u.w.total && memcmp(v.w.data, u.w.data, u.w.total * sizeof(float)) == 0);
        sd_unet_free(&v);
    }
    /* its config with every depth 1: the deeper blocks' tensors are named */
    sd_unet_config one = c;
    for (int i = 0; i < 3; i++) one.depth[i] = one.depth_up[i] = 1;
    CHECK(sd_unet_config_write(&one, cj, &err) == SD_OK);
    sd_unet_opts oc = {.config_path = cj};
    refused(dif, &oc, SD_EFORMAT, "tensors the UNet does not use (down_blocks.1.attentions.0.transformer_blocks.1.");
    refused(ldm, &oc, SD_EFORMAT, "under model.diffusion_model. the UNet does not use (model.diffusion_model.");
    /* a stray tensor under the prefix is refused, one outside it is not */
    float z[1] = {0};
    sd_st_tensor stray = {"model.diffusion_model.stray", SD_ST_F32, 1, {1}, 4, z, NULL, NULL};
    if (CHECK(rewrite(ldm, cut, NULL, 0, &stray) == 0)) refused(cut, NULL, SD_EFORMAT, "1 tensor under");
    stray.name = "first_stage_model.stray";
    if (CHECK(rewrite(ldm, cut, NULL, 0, &stray) == 0) && CHECK(sd_unet_load(&v, cut, &o, &err) == SD_OK))
        sd_unet_free(&v);
    /* attentions of one block with different depths, either way round */
    const char *a1[] = {"down_blocks.1.attentions.1.transformer_blocks.1."};
    if (CHECK(rewrite(dif, cut, a1, 1, NULL) == 0))
        refused(cut, NULL, SD_EUNSUPPORTED, "down block 1: attention 1 has 1 transformer blocks, attention 0 has 2");
    const char *a0[] = {"model.diffusion_model.input_blocks.4.1.transformer_blocks.1."}; /* down block 1, attention 0 */
    snprintf(cut, sizeof cut, "%s/cut_ldm.safetensors", dir);
    if (CHECK(rewrite(ldm, cut, a0, 1, NULL) == 0))
        refused(cut, NULL, SD_EUNSUPPORTED, "down block 1: attention 1 has 2 transformer blocks, attention 0 has 1");
    unlink(cut);
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    /* up block 1 one transformer block shallower than down block 1 */
    const char *up[] = {"up_blocks.1.attentions.0.transformer_blocks.1.", "up_blocks.1.attentions.1.transformer_blocks.1.",
                        "up_blocks.1.attentions.2.transformer_blocks.1."};
    if (CHECK(rewrite(dif, cut, up, 3, NULL) == 0))
        refused(cut, NULL, SD_EUNSUPPORTED, "down block 1 has 2 transformer blocks per attention, up block 1 has 1");
    unlink(cut);
    unlink(cj);
    unlink(dif);
    unlink(ldm);
    rmdir(dir);
    sd_unet_free(&u);
}

/* Both layouts of one golden config. */
static void check_config(const char *name, int single)
{
    golden g;
    char path[512], conf[512], label[64];
    if (!golden_open(&g, name)) return;
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, name);
    snprintf(label, sizeof label, "%s diffusers folder", name);
    check_model(label, path, NULL, &g, 1);
    if (single) {
        snprintf(path, sizeof path, "%s/%s/single.safetensors", GOLDEN_DIR, name);
        snprintf(conf, sizeof conf, "%s/%s/unet/config.json", GOLDEN_DIR, name);
        sd_unet_opts o = {.config_path = conf};
        snprintf(label, sizeof label, "%s single file", name);
        check_model(label, path, &o, &g, 0);
    }
    sd_st_close(g.st);
}

/* test_unet --list-slots CONFIG prints every parameter slot of that
 * config (diffusers name, ldm name, shape) without allocating it, for
 * tests/golden/check_unet_names.py; with no arguments the tests run. */
static int list_slots(const char *conf)
{
    sd_unet_config c;
    sd_error err = {0};
    sd_unet u;
    sd_unet_config_default(&c);
    if (sd_unet_config_read(conf, &c, &err) || sd_unet_build_names(&u, &c, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < u.w.nslots; i++) {
        const sd_weight_slot *s = &u.w.slots[i];
        printf("%s %s", s->name, s->alt);
        for (int k = 0; k < s->ndim; k++) printf(" %d", s->shape[k]);
        printf("\n");
    }
    sd_unet_free(&u);
    return 0;
}

/* Every golden config, then the load/save/init/error checks. */
/* sd_unet_config_diff: agreement (sample_size aside), the first differing
 * field named with both values, per-block fields with their block. */
static void check_config_diff(void)
{
    sd_unet_config a, b;
    char field[96], va[32], vb[32];
    sd_unet_config_default(&a);
    b = a;
    b.sample_size = a.sample_size + 32;
    CHECK(sd_unet_config_diff(&a, &b, field, sizeof field, va, vb, sizeof va) == 0);
    b.groups = 16;
    CHECK(sd_unet_config_diff(&a, &b, field, sizeof field, va, vb, sizeof va) == 1 &&
          strcmp(field, "norm_num_groups") == 0 && strcmp(va, "32") == 0 && strcmp(vb, "16") == 0);
    b = a;
    b.heads[2] = 5;
    CHECK(sd_unet_config_diff(&a, &b, field, sizeof field, va, vb, sizeof va) == 1 &&
          strcmp(field, "attention_head_dim of block 2") == 0 && strcmp(vb, "5") == 0);
    b = a;
    b.eps = 1e-6f;
    CHECK(sd_unet_config_diff(&a, &b, field, sizeof field, va, vb, sizeof va) == 1 && strcmp(field, "norm_eps") == 0 &&
          strcmp(va, "1e-05") == 0 && strcmp(vb, "1e-06") == 0);
}

/* config.json as sdtk writes it is what diffusers' save_config writes for
 * the same config, byte for byte (tests/golden/unet/configs, made by
 * make_unet_config_golden.py): every key, _diffusers_version included,
 * sorted and indented, floats as Python prints them (1e-06, 0.0). */
static void check_config_text(const char *name)
{
    char path[512];
    sd_error err = {0};
    sd_unet_config c;
    sd_unet_config_default(&c);
    snprintf(path, sizeof path, "%s/configs/%s.json", GOLDEN_DIR, name);
    sd_buf want, got;
    sd_buf_init(&want);
    sd_buf_init(&got);
    if (CHECK(sd_read_file(path, &want, &err) == SD_OK) && CHECK(sd_unet_config_read(path, &c, &err) == SD_OK)) {
        sd_unet_config_json(&c, &got);
        if (!CHECK(got.len == want.len && memcmp(got.data, want.data, got.len) == 0))
            fprintf(stderr, "%s: sdtk writes\n%.*s\n", name, (int)got.len, got.data);
        /* and the text reads back as the same config */
        sd_unet_config d;
        sd_unet_config_default(&d);
        CHECK(sd_unet_config_parse(got.data, got.len, name, &d, &err) == SD_OK && memcmp(&c, &d, sizeof c) == 0);
    } else {
        fprintf(stderr, "%s\n", err.msg);
    }
    sd_buf_free(&want);
    sd_buf_free(&got);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--list-slots") == 0) return list_slots(argv[2]);
    check_config("sd1", 1);
    check_config("sd2", 0);
    check_config("sdxl", 1);
    check_inferred("sd1", 4);
    check_roundtrip("sd1");
    check_roundtrip("sdxl");
    check_init();
    check_bf16_start();
    check_depths();
    check_errors();
    check_config_diff();
    check_config_text("sd15");
    check_config_text("sdxl");
    check_config_text("tiny");
    return check_done("test_unet");
}
