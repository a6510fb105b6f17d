/* The CLIP text encoders against transformers (tests/golden/clip_text, made
 * by tests/golden/make_text_golden.py): tiny SD1, SD2 and SDXL (CLIP-L and
 * bigG) encoders, each from its diffusers folder and from its single-file
 * layout (transformers names, or OpenCLIP's fused in_proj and transposed
 * text_projection; fp32/fp16/bf16), hidden states and pooled output within
 * 1e-4; bit-identical for 1, 2 and 3 threads and for a sequence encoded
 * alone or inside a batch (also one of 19, several chunks, at any
 * position); the runner (parameters and buffers in the
 * backend's memory) bit-identical to sd_clip_text_encode on the CPU; clear
 * errors for missing files, wrong shapes, bad ids and bad options. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "clip_text.h"
#include "dtype.h"
#include "f16.h"
#include "safetensors.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/clip_text"
#endif

/* The golden ids and outputs of one config. */
typedef struct {
    sd_safetensors *st;
    const int32_t *ids;
    int n, t;
} golden;

/* Open <name>/expected.safetensors; 0 on failure (already reported). */
static int golden_open(golden *g, const char *name)
{
    char path[512];
    sd_error err = {0};
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", GOLDEN_DIR, name);
    if (!CHECK(sd_st_open(&g->st, path, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return 0;
    }
    const sd_st_tensor *ids = sd_st_find(g->st, "ids");
    if (!CHECK(ids && ids->dtype == SD_ST_I32 && ids->ndim == 2)) return 0;
    g->ids = ids->data;
    g->n = (int)ids->shape[0];
    g->t = (int)ids->shape[1];
    return 1;
}

/* Largest absolute difference over the first `rows` rows of the golden
 * tensor `name` (rows of n / shape[0] floats); -1 when it is missing or of
 * another size than want_n floats. */
static double max_err(const golden *g, const char *name, const float *a, size_t want_n, int rows)
{
    const sd_st_tensor *t = sd_st_find(g->st, name);
    if (!t || t->dtype != SD_ST_F32 || t->nbytes != want_n * sizeof(float)) return -1.0;
    const float *e = t->data;
    size_t n = want_n / (size_t)t->shape[0] * (size_t)rows;
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)e[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

/* Encode the golden ids (sequences [first, first + n)) on `threads`
 * threads; either output may be NULL. */
static int encode(const sd_clip_text *m, const golden *g, int first, int n, int threads, const sd_clip_text_out *o,
                  float *hidden, float *pooled)
{
    sd_error err = {0};
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    float *ws = malloc(sd_clip_text_workspace_floats(m, n, g->t) * sizeof(float));
    int ok = ws && sd_clip_text_encode(m, sd_backend_cpu(), pool, n, g->t, g->ids + (size_t)first * (size_t)g->t, o,
                                       hidden, pooled, ws, &err) == SD_OK;
    if (!ok) fprintf(stderr, "encode: %s\n", err.msg);
    free(ws);
    if (pool) sd_pool_destroy(pool);
    return ok;
}

/* What one load is checked against. */
typedef struct {
    const char *label, *path;
    sd_clip_text_opts opts;
    sd_clip_variant variant;
    int extra_skip;
    const char *want_hidden, *want_pooled;
    int pooled_rows;   /* rows of the pooled output to compare (the pooling rule may differ on the rest) */
    int want_skip;     /* the skip the preset must choose */
    int determinism;   /* also check threads and batch independence */
} load_case;

/* Thread counts and batch composition must not change a single bit; a run
 * without the pooled output stops early and gives the same hidden state. */
static void check_determinism(const sd_clip_text *m, const golden *g, const sd_clip_text_out *o, const float *hidden,
                              const float *pooled)
{
    size_t nh = (size_t)g->n * (size_t)g->t * (size_t)m->cfg.width, np = (size_t)g->n * (size_t)sd_clip_text_pooled_dim(m);
    float *h2 = calloc(nh, sizeof(float)), *p2 = calloc(np, sizeof(float));
    if (!CHECK(h2 && p2)) goto done;
    for (int t = 2; t <= 3; t++) {
        CHECK(encode(m, g, 0, g->n, t, o, h2, p2));
        CHECK(memcmp(h2, hidden, nh * sizeof(float)) == 0);
        CHECK(memcmp(p2, pooled, np * sizeof(float)) == 0);
    }
    size_t ph = nh / (size_t)g->n, pp = np / (size_t)g->n;
    for (int i = 0; i < g->n; i++) {
        CHECK(encode(m, g, i, 1, 2, o, h2, p2));
        CHECK(memcmp(h2, hidden + (size_t)i * ph, ph * sizeof(float)) == 0);
        CHECK(memcmp(p2, pooled + (size_t)i * pp, pp * sizeof(float)) == 0);
    }
    CHECK(encode(m, g, 0, g->n, 1, o, h2, NULL));
    CHECK(memcmp(h2, hidden, nh * sizeof(float)) == 0);
done:
    free(h2);
    free(p2);
}

/* Load one case, check config, outputs and (optionally) determinism. */
static void check_load(const golden *g, const load_case *c)
{
    sd_clip_text m;
    sd_error err = {0};
    if (!CHECK(sd_clip_text_load(&m, c->path, &c->opts, &err) == SD_OK)) {
        fprintf(stderr, "%s: %s\n", c->label, err.msg);
        return;
    }
    sd_clip_text_out o;
    if (!CHECK(sd_clip_text_preset(&m, c->variant, c->extra_skip, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s: %s\n", c->label, err.msg);
        sd_clip_text_free(&m);
        return;
    }
    CHECK(o.skip == c->want_skip);
    size_t nh = (size_t)g->n * (size_t)g->t * (size_t)m.cfg.width, np = (size_t)g->n * (size_t)sd_clip_text_pooled_dim(&m);
    float *hidden = calloc(nh, sizeof(float)), *pooled = calloc(np, sizeof(float));
    if (CHECK(hidden && pooled) && CHECK(encode(&m, g, 0, g->n, 1, &o, hidden, pooled))) {
        double eh = max_err(g, c->want_hidden, hidden, nh, g->n);
        double ep = c->want_pooled ? max_err(g, c->want_pooled, pooled, np, c->pooled_rows) : 0.0;
        printf("%-34s %-68s %2d layers skip %d%s  max err hidden %.2e pooled %.2e%s\n", c->label, m.layout,
               m.cfg.layers, o.skip, o.final_ln ? "+LN" : "   ", eh, ep,
               c->want_pooled && c->pooled_rows < g->n ? " (rows with one pooling rule)" : "");
        if (!CHECK(eh >= 0 && eh <= 1e-4)) fprintf(stderr, "  %s: hidden error %.3g\n", c->label, eh);
        if (!CHECK(ep >= 0 && ep <= 1e-4)) fprintf(stderr, "  %s: pooled error %.3g\n", c->label, ep);
        if (c->determinism) check_determinism(&m, g, &o, hidden, pooled);
    }
    free(hidden);
    free(pooled);
    sd_clip_text_free(&m);
}

/* SD 1.x: folder, the encoder folder itself, clip skip, single file
 * (fp16, config inferred or given). */
static void check_sd1(void)
{
    golden g;
    if (!golden_open(&g, "sd1")) return;
    char dir[512], enc[512], single[512], conf[512];
    snprintf(dir, sizeof dir, "%s/sd1", GOLDEN_DIR);
    snprintf(enc, sizeof enc, "%s/sd1/text_encoder", GOLDEN_DIR);
    snprintf(single, sizeof single, "%s/sd1/single.safetensors", GOLDEN_DIR);
    snprintf(conf, sizeof conf, "%s/sd1/text_encoder/config.json", GOLDEN_DIR);
    load_case cases[] = {
        {"sd1 diffusers folder", dir, {0}, SD_CLIP_SD1, 0, "hidden", "pooled", 3, 0, 1},
        {"sd1 text_encoder/ folder", enc, {0}, SD_CLIP_SD1, 0, "hidden", "pooled", 3, 0, 0},
        {"sd1 folder, clip skip 2", dir, {0}, SD_CLIP_SD1, 1, "hidden_skip1", "pooled", 3, 1, 0},
        {"sd1 single file (inferred)", single, {.heads = 2}, SD_CLIP_SD1, 0, "hidden", "pooled", 3, 0, 1},
        {"sd1 single file, clip skip 2", single, {.heads = 2}, SD_CLIP_SD1, 1, "hidden_skip1", NULL, 0, 1, 0},
        {"sd1 single file + config", single, {.config_path = conf}, SD_CLIP_SD1, 0, "hidden", "pooled", 3, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_load(&g, &cases[i]);
    /* the inferred config: quick_gelu for a transformers-layout width that is
     * not ViT-H's or bigG's, no projection, the legacy pooling rule */
    sd_clip_text m;
    sd_error err = {0};
    sd_clip_text_opts o = {.heads = 2};
    if (CHECK(sd_clip_text_load(&m, single, &o, &err) == SD_OK)) {
        CHECK(m.cfg.act == SD_CLIP_QUICK_GELU && m.cfg.proj == 0 && m.cfg.eos_id == SD_CLIP_LEGACY_EOS);
        CHECK(m.cfg.vocab == 500 && m.cfg.positions == 77 && m.cfg.layers == 3 && m.cfg.mlp == 64);
        CHECK(strcmp(m.cfg.source, "inferred") == 0 && !m.openclip);
        sd_clip_text_free(&m);
    }
    sd_st_close(g.st);
}

/* SD 2.x: the diffusers folder (fp16, last layer dropped) and the OpenCLIP
 * single file (bf16, 3 layers, penultimate), the same hidden state. */
static void check_sd2(void)
{
    golden g;
    if (!golden_open(&g, "sd2")) return;
    char dir[512], single[512];
    snprintf(dir, sizeof dir, "%s/sd2", GOLDEN_DIR);
    snprintf(single, sizeof single, "%s/sd2/single.safetensors", GOLDEN_DIR);
    load_case cases[] = {
        {"sd2 diffusers folder (fp16)", dir, {0}, SD_CLIP_SD2, 0, "hidden", "pooled_folder", 3, 0, 1},
        {"sd2 OpenCLIP single file (bf16)", single, {.heads = 3}, SD_CLIP_SD2, 0, "hidden", "pooled_single", 3, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_load(&g, &cases[i]);
    sd_clip_text m;
    sd_error err = {0};
    sd_clip_text_opts o = {.heads = 3};
    if (CHECK(sd_clip_text_load(&m, single, &o, &err) == SD_OK)) {
        CHECK(m.cfg.act == SD_CLIP_GELU && m.cfg.proj == 40 && m.openclip && m.cfg.layers == 3);
        sd_clip_text_free(&m);
    }
    sd_st_close(g.st);
}

/* SDXL: both encoders from the folder and from the single file. */
static void check_sdxl(void)
{
    golden g;
    if (!golden_open(&g, "sdxl")) return;
    char dir[512], single[512], conf[512];
    snprintf(dir, sizeof dir, "%s/sdxl", GOLDEN_DIR);
    snprintf(single, sizeof single, "%s/sdxl/single.safetensors", GOLDEN_DIR);
    snprintf(conf, sizeof conf, "%s/sdxl/text_encoder/config.json", GOLDEN_DIR);
    load_case cases[] = {
        {"sdxl CLIP-L diffusers folder", dir, {0}, SD_CLIP_SDXL_L, 0, "l_hidden", "l_pooled", 3, 1, 1},
        /* inferred: the legacy pooling rule, which differs from this
         * config's eos_token_id 497 on row 2 (ids above the end token) */
        {"sdxl CLIP-L single file (inferred)", single, {.heads = 2}, SD_CLIP_SDXL_L, 0, "l_hidden", "l_pooled", 2, 1,
         0},
        {"sdxl CLIP-L single file + config", single, {.config_path = conf}, SD_CLIP_SDXL_L, 0, "l_hidden", "l_pooled",
         3, 1, 0},
        {"sdxl bigG diffusers folder (fp16)", dir, {.which = 1}, SD_CLIP_SDXL_G, 0, "g_hidden", "g_pooled", 3, 1, 1},
        {"sdxl bigG OpenCLIP single file", single, {.which = 1, .heads = 4}, SD_CLIP_SDXL_G, 0, "g_hidden",
         "g_pooled", 3, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_load(&g, &cases[i]);
    /* with the inferred (legacy) rule row 2 really pools elsewhere */
    sd_clip_text m;
    sd_error err = {0};
    sd_clip_text_opts o = {.heads = 2};
    if (CHECK(sd_clip_text_load(&m, single, &o, &err) == SD_OK)) {
        size_t np = (size_t)g.n * (size_t)m.cfg.width;
        float *pooled = calloc(np, sizeof(float));
        if (CHECK(pooled) && CHECK(encode(&m, &g, 0, g.n, 1, NULL, NULL, pooled))) { /* pooled only: no out */
            const float *want = sd_st_find(g.st, "l_pooled")->data;
            size_t w = (size_t)m.cfg.width;
            CHECK(fabsf(pooled[2 * w] - want[2 * w]) > 1e-3f || fabsf(pooled[2 * w + 1] - want[2 * w + 1]) > 1e-3f);
        }
        free(pooled);
        sd_clip_text_free(&m);
    }
    sd_st_close(g.st);
}

/* The golden files and the model of the folder `name`, loaded with opts;
 * 0 (after reporting, with `what` naming the check) when either fails. */
static int open_both(const char *name, const sd_clip_text_opts *opts, const char *what, golden *g, sd_clip_text *m)
{
    if (!golden_open(g, name)) return 0;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", GOLDEN_DIR, name);
    sd_error err = {0};
    if (!CHECK(sd_clip_text_load(m, dir, opts, &err) == SD_OK)) {
        fprintf(stderr, "%s %s: %s\n", what, name, err.msg);
        sd_st_close(g->st);
        return 0;
    }
    return 1;
}

/* sd_clip_text_runner on the CPU table against sd_clip_text_encode for the
 * golden ids of one encoder: bit-identical hidden states and pooled
 * output, with the runner's buffers first sized for one sequence, grown
 * for all of them, then reused for one again; pooled-free and hidden-free
 * calls; bad sizes and ids refused before anything runs; free twice. */
static void check_runner(const char *name, sd_clip_text_opts opts, sd_clip_variant variant)
{
    int failed_before = check_failures;
    golden g;
    sd_clip_text m;
    sd_clip_text_out o;
    sd_error err = {0};
    if (!open_both(name, &opts, "runner", &g, &m)) return;
    size_t ph = (size_t)g.t * (size_t)m.cfg.width, pp = (size_t)sd_clip_text_pooled_dim(&m);
    size_t nh = (size_t)g.n * ph, np = (size_t)g.n * pp;
    float *href = calloc(nh, sizeof(float)), *pref = calloc(np, sizeof(float));
    float *h = calloc(nh, sizeof(float)), *p = calloc(np, sizeof(float));
    int32_t *bad = malloc((size_t)g.t * sizeof(int32_t));
    sd_pool *pool = sd_pool_create(2);
    sd_clip_text_runner r;
    if (!CHECK(href && pref && h && p && bad && pool) ||
        !CHECK(sd_clip_text_preset(&m, variant, 0, &o, &err) == SD_OK) ||
        !CHECK(encode(&m, &g, 0, g.n, 1, &o, href, pref)) ||
        !CHECK(sd_clip_text_runner_init(&r, &m, sd_backend_cpu(), pool, &err) == SD_OK))
        goto done;
    /* one sequence: buffers sized for n = 1 */
    CHECK(sd_clip_text_runner_encode(&r, &m, 1, g.t, g.ids, &o, h, p, &err) == SD_OK);
    CHECK(memcmp(h, href, ph * sizeof(float)) == 0);
    CHECK(memcmp(p, pref, pp * sizeof(float)) == 0);
    CHECK(r.hidden_cap == ph * sizeof(float) && r.pooled_cap == pp * sizeof(float));
    /* all of them: the buffers grow */
    memset(h, 0, nh * sizeof(float));
    memset(p, 0, np * sizeof(float));
    CHECK(sd_clip_text_runner_encode(&r, &m, g.n, g.t, g.ids, &o, h, p, &err) == SD_OK);
    CHECK(memcmp(h, href, nh * sizeof(float)) == 0);
    CHECK(memcmp(p, pref, np * sizeof(float)) == 0);
    CHECK(r.hidden_cap == nh * sizeof(float) && r.pooled_cap == np * sizeof(float));
    CHECK(r.ids_cap == (size_t)g.n * (size_t)g.t * sizeof(int32_t));
    /* the last one alone: the same buffers again */
    const float *hb = r.hidden, *pb = r.pooled, *wb = r.ws;
    const int32_t *last = g.ids + (size_t)(g.n - 1) * (size_t)g.t;
    CHECK(sd_clip_text_runner_encode(&r, &m, 1, g.t, last, &o, h, p, &err) == SD_OK);
    CHECK(memcmp(h, href + (size_t)(g.n - 1) * ph, ph * sizeof(float)) == 0);
    CHECK(memcmp(p, pref + (size_t)(g.n - 1) * pp, pp * sizeof(float)) == 0);
    CHECK(r.hidden == hb && r.pooled == pb && r.ws == wb && r.hidden_cap == nh * sizeof(float));
    /* hidden only, then pooled only */
    memset(h, 0, nh * sizeof(float));
    CHECK(sd_clip_text_runner_encode(&r, &m, g.n, g.t, g.ids, &o, h, NULL, &err) == SD_OK);
    CHECK(memcmp(h, href, nh * sizeof(float)) == 0);
    memset(p, 0, np * sizeof(float));
    CHECK(sd_clip_text_runner_encode(&r, &m, g.n, g.t, g.ids, NULL, NULL, p, &err) == SD_OK);
    CHECK(memcmp(p, pref, np * sizeof(float)) == 0);
    /* refused: no sequences, too many tokens, an id outside the vocabulary */
    CHECK(sd_clip_text_runner_encode(&r, &m, 0, g.t, g.ids, &o, h, p, &err) == SD_EINVAL);
    CHECK(sd_clip_text_runner_encode(&r, &m, 1, m.cfg.positions + 1, g.ids, &o, h, p, &err) == SD_EINVAL);
    memcpy(bad, g.ids, (size_t)g.t * sizeof(int32_t));
    bad[0] = m.cfg.vocab;
    CHECK(sd_clip_text_runner_encode(&r, &m, 1, g.t, bad, &o, h, p, &err) == SD_ERANGE);
    printf("%s encoder %d: runner on the CPU table vs sd_clip_text_encode, 1, %d, 1 sequences: %s\n", name,
           opts.which + 1, g.n, check_failures == failed_before ? "bit-identical" : "FAILED");
    sd_clip_text_runner_free(&r);
    CHECK(r.params == NULL && r.ws == NULL && r.ids_be == NULL && r.hidden == NULL && r.pooled == NULL);
    sd_clip_text_runner_free(&r); /* twice is harmless */
    CHECK(sd_clip_text_runner_encode(&r, &m, 1, g.t, g.ids, &o, h, p, &err) == SD_EINVAL); /* freed */
done:
    if (pool) sd_pool_destroy(pool);
    free(href);
    free(pref);
    free(h);
    free(p);
    free(bad);
    sd_clip_text_free(&m);
    sd_st_close(g.st);
}

/* A caption's embedding must not depend on its batch: 19 sequences made of
 * the golden ones in a mixed order (each at several positions, first and
 * last of a SD_CLIP_BATCH chunk included, the last chunk short) encoded in
 * one call on 1 and 2 threads, every hidden state and pooled row bitwise
 * equal to that sequence encoded alone. */
static void check_batch_positions(const char *name, sd_clip_text_opts opts, sd_clip_variant variant)
{
    enum { NB = 19 };
    golden g;
    sd_clip_text m;
    sd_clip_text_out o;
    sd_error err = {0};
    if (!open_both(name, &opts, "batch", &g, &m)) return;
    size_t ph = (size_t)g.t * (size_t)m.cfg.width, pp = (size_t)sd_clip_text_pooled_dim(&m);
    int32_t *ids = malloc((size_t)NB * (size_t)g.t * sizeof(int32_t));
    int src[NB];
    float *alone_h = calloc((size_t)g.n * ph, sizeof(float)), *alone_p = calloc((size_t)g.n * pp, sizeof(float));
    float *h = calloc((size_t)NB * ph, sizeof(float)), *p = calloc((size_t)NB * pp, sizeof(float));
    float *ws = malloc(sd_clip_text_workspace_floats(&m, NB, g.t) * sizeof(float));
    int same = 1;
    if (!CHECK(ids && alone_h && alone_p && h && p && ws) ||
        !CHECK(sd_clip_text_preset(&m, variant, 0, &o, &err) == SD_OK))
        goto done;
    for (int i = 0; i < g.n; i++)
        CHECK(encode(&m, &g, i, 1, 1, &o, alone_h + (size_t)i * ph, alone_p + (size_t)i * pp));
    for (int i = 0; i < NB; i++) {
        src[i] = (i * 7 + i / 4) % g.n;
        memcpy(ids + (size_t)i * (size_t)g.t, g.ids + (size_t)src[i] * (size_t)g.t, (size_t)g.t * sizeof(int32_t));
    }
    for (int threads = 1; threads <= 2; threads++) {
        sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
        memset(h, 0, (size_t)NB * ph * sizeof(float));
        memset(p, 0, (size_t)NB * pp * sizeof(float));
        CHECK(sd_clip_text_encode(&m, sd_backend_cpu(), pool, NB, g.t, ids, &o, h, p, ws, &err) == SD_OK);
        for (int i = 0; i < NB; i++) {
            same &= memcmp(h + (size_t)i * ph, alone_h + (size_t)src[i] * ph, ph * sizeof(float)) == 0;
            same &= memcmp(p + (size_t)i * pp, alone_p + (size_t)src[i] * pp, pp * sizeof(float)) == 0;
        }
        if (pool) sd_pool_destroy(pool);
    }
    CHECK(same);
    printf("%s encoder %d: %d sequences in one call (chunks of %d) vs each alone, 1 and 2 threads: %s\n", name,
           opts.which + 1, NB, SD_CLIP_BATCH, same ? "bit-identical" : "DIFFERENT");
done:
    free(ids);
    free(alone_h);
    free(alone_p);
    free(h);
    free(p);
    free(ws);
    sd_clip_text_free(&m);
    sd_st_close(g.st);
}

/* A config.json naming more layers than the file holds, in a temp file. */
static int write_config(char *path, size_t cap)
{
    snprintf(path, cap, "/tmp/sdtk_clip_cfgXXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return 0;
    const char *text = "{\"architectures\": [\"CLIPTextModel\"], \"hidden_size\": 32, \"intermediate_size\": 64, "
                       "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"vocab_size\": 500, "
                       "\"hidden_act\": \"quick_gelu\", \"eos_token_id\": 2}";
    int ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
    close(fd);
    return ok;
}

/* Load and encode failures: each must name the file or value and the reason. */
static void check_errors(void)
{
    sd_clip_text m;
    sd_error err = {0};
    char path[512], conf[512];
    CHECK(sd_clip_text_load(&m, "/nonexistent/te.safetensors", NULL, &err) != SD_OK);
    CHECK(strstr(err.msg, "/nonexistent/te.safetensors") != NULL);
    /* a folder without weights */
    CHECK(sd_clip_text_load(&m, GOLDEN_DIR, NULL, &err) == SD_ENOTFOUND);
    CHECK(strstr(err.msg, "text_encoder/model.safetensors") != NULL);
    /* a file with no text encoder in it */
    snprintf(path, sizeof path, "%s/sd1/expected.safetensors", GOLDEN_DIR);
    CHECK(sd_clip_text_load(&m, path, NULL, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "no CLIP text encoder") != NULL);
    /* SD1 has no second encoder; 2 is not an encoder index */
    snprintf(path, sizeof path, "%s/sd1/single.safetensors", GOLDEN_DIR);
    sd_clip_text_opts second = {.which = 1, .heads = 2};
    CHECK(sd_clip_text_load(&m, path, &second, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "no second text encoder") != NULL);
    second.which = 2;
    CHECK(sd_clip_text_load(&m, path, &second, &err) == SD_EINVAL);
    /* width 32 is no multiple of 64: the head count must be given */
    CHECK(sd_clip_text_load(&m, path, NULL, &err) == SD_EINVAL);
    CHECK(strstr(err.msg, "heads") != NULL);
    /* the wrong config for the weights: shapes do not match */
    snprintf(conf, sizeof conf, "%s/sdxl/text_encoder_2/config.json", GOLDEN_DIR);
    sd_clip_text_opts o = {.config_path = conf};
    CHECK(sd_clip_text_load(&m, path, &o, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "has shape") != NULL && strstr(err.msg, "single.safetensors") != NULL);
    /* a config with a layer the file lacks */
    char tmp[64];
    if (CHECK(write_config(tmp, sizeof tmp))) {
        o.config_path = tmp;
        CHECK(sd_clip_text_load(&m, path, &o, &err) == SD_ENOTFOUND);
        CHECK(strstr(err.msg, "encoder.layers.3.") != NULL);
        unlink(tmp);
    }
    /* a config file that is not there */
    o.config_path = "/nonexistent/config.json";
    CHECK(sd_clip_text_load(&m, path, &o, &err) != SD_OK);
    CHECK(strstr(err.msg, "/nonexistent/config.json") != NULL);

    /* encode: ids outside the vocabulary, too many tokens, bad skip */
    sd_clip_text_opts ok = {.heads = 2};
    if (!CHECK(sd_clip_text_load(&m, path, &ok, &err) == SD_OK)) return;
    float *ws = malloc(sd_clip_text_workspace_floats(&m, 1, 78) * sizeof(float));
    float *hidden = calloc((size_t)78 * (size_t)m.cfg.width, sizeof(float));
    int32_t ids[78] = {496, 5, 500, 497};
    sd_clip_text_out out = {.skip = 0, .final_ln = 1};
    if (CHECK(ws && hidden)) {
        CHECK(sd_clip_text_encode(&m, sd_backend_cpu(), NULL, 1, 4, ids, &out, hidden, NULL, ws, &err) == SD_ERANGE);
        CHECK(strstr(err.msg, "500") != NULL);
        ids[2] = 7;
        CHECK(sd_clip_text_encode(&m, sd_backend_cpu(), NULL, 1, 4, ids, &out, hidden, NULL, ws, &err) == SD_OK);
        CHECK(sd_clip_text_encode(&m, sd_backend_cpu(), NULL, 1, 78, ids, &out, hidden, NULL, ws, &err) == SD_EINVAL);
        out.skip = 4;
        CHECK(sd_clip_text_encode(&m, sd_backend_cpu(), NULL, 1, 4, ids, &out, hidden, NULL, ws, &err) == SD_EINVAL);
        out.skip = 3; /* the embeddings themselves */
        CHECK(sd_clip_text_encode(&m, sd_backend_cpu(), NULL, 1, 4, ids, &out, hidden, NULL, ws, &err) == SD_OK);
    }
    CHECK(sd_clip_text_preset(&m, SD_CLIP_SD1, 3, &out, &err) == SD_EINVAL);
    CHECK(sd_clip_text_preset(&m, SD_CLIP_SDXL_L, 2, &out, &err) == SD_EINVAL);
    CHECK(sd_clip_text_preset(&m, SD_CLIP_SDXL_L, 1, &out, &err) == SD_OK && out.skip == 2 && !out.final_ln);
    free(ws);
    free(hidden);
    sd_clip_text_free(&m);
}

/* Each layer matrix of m (fp32) multiplied by (1 + 2^-12), leaving values
 * no 16-bit type holds exactly, or rounded through dtype (round = 1). */
static void touch_matrices(sd_clip_text *m, int dtype, int round)
{
    for (int l = 0; l < m->cfg.layers; l++) {
        const sd_clip_layer *L = &m->layer[l];
        size_t off[4] = {L->wqkv, L->wo, L->w1, L->w2}, W = (size_t)m->cfg.width, F = (size_t)m->cfg.mlp;
        size_t n[4] = {3 * W * W, W * W, F * W, W * F};
        for (int k = 0; k < 4; k++)
            for (size_t i = 0; i < n[k]; i++) {
                float *v = m->w.data + off[k] + i;
                if (!round) *v *= 1.0f + 1.0f / 4096.0f;
                else *v = dtype == SD_DT_F16 ? sd_f16_to_f32(sd_f32_to_f16(*v)) : sd_bf16_to_f32(sd_f32_to_bf16(*v));
            }
    }
}

/* Layer matrices held in fp16 / bf16 (sd_clip_text_to_16bit): with the
 * golden weights (exact in both types) hidden states and pooled output
 * bit-identical to the fp32 model's and reported exact; with weights no
 * 16-bit type holds, reported inexact and bit-identical to an fp32 model
 * whose matrices were rounded the same way (the arithmetic is fp32 on
 * exactly the stored values), and close to the unrounded one. The matrices
 * in 2 bytes a value, the rest as fp32; the CPU runner gives the same bits;
 * a second conversion and fp32 are refused. */
static void check_16bit(const char *name, const char *file, sd_clip_text_opts opts, sd_clip_variant variant)
{
    golden g;
    sd_clip_text m32, m16;
    sd_clip_text_out o;
    sd_error err = {0};
    char dir[512]; /* the model folder, or a single file in it */
    snprintf(dir, sizeof dir, "%s/%s%s%s", GOLDEN_DIR, name, file ? "/" : "", file ? file : "");
    if (!golden_open(&g, name)) return;
    if (!CHECK(sd_clip_text_load(&m32, dir, &opts, &err) == SD_OK)) {
        fprintf(stderr, "16-bit %s: %s\n", dir, err.msg);
        sd_st_close(g.st);
        return;
    }
    size_t nh = (size_t)g.n * (size_t)g.t * (size_t)m32.cfg.width, np = (size_t)g.n * (size_t)sd_clip_text_pooled_dim(&m32);
    float *h32 = calloc(nh, sizeof(float)), *p32 = calloc(np, sizeof(float));
    float *h16 = calloc(nh, sizeof(float)), *p16 = calloc(np, sizeof(float));
    if (!CHECK(h32 && p32 && h16 && p16) || !CHECK(sd_clip_text_preset(&m32, variant, 0, &o, &err) == SD_OK)) goto done;
    size_t bytes32 = sd_weights_bytes(&m32.w);
    for (int touched = 0; touched <= 1; touched++) {
        for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++) {
            if (!CHECK(sd_clip_text_load(&m16, dir, &opts, &err) == SD_OK)) goto done;
            if (touched) touch_matrices(&m16, dt, 0);
            int exact = -1;
            CHECK(sd_clip_text_to_16bit(&m16, dt, &exact, &err) == SD_OK);
            CHECK(exact == !touched);
            size_t W = (size_t)m16.cfg.width, mats = (size_t)m16.cfg.layers * (4 * W * W + 2 * W * (size_t)m16.cfg.mlp);
            CHECK(m16.half_total == mats); /* the four matrices of every layer, 2 bytes each */
            CHECK(sd_weights_bytes(&m16.w) + mats * 4 <= bytes32 + 64 * m16.w.nslots); /* the rest kept as fp32 */
            CHECK(sd_clip_text_to_16bit(&m16, dt, &exact, &err) != SD_OK); /* already converted */
            /* the fp32 reference: the same weights, matrices rounded when touched */
            sd_clip_text_free(&m32);
            CHECK(sd_clip_text_load(&m32, dir, &opts, &err) == SD_OK);
            if (touched) {
                touch_matrices(&m32, dt, 0);
                touch_matrices(&m32, dt, 1);
            }
            CHECK(encode(&m32, &g, 0, g.n, 1, &o, h32, p32));
            CHECK(encode(&m16, &g, 0, g.n, 2, &o, h16, p16));
            int same = !memcmp(h16, h32, nh * sizeof(float)) && !memcmp(p16, p32, np * sizeof(float));
            CHECK(same);
            sd_clip_text_runner r;
            if (CHECK(sd_clip_text_runner_init(&r, &m16, sd_backend_cpu(), NULL, &err) == SD_OK)) {
                memset(h16, 0, nh * sizeof(float));
                CHECK(sd_clip_text_runner_encode(&r, &m16, g.n, g.t, g.ids, &o, h16, NULL, &err) == SD_OK);
                CHECK(!memcmp(h16, h32, nh * sizeof(float)));
                sd_clip_text_runner_free(&r);
            }
            double far = 0;
            if (touched) { /* against the unrounded fp32 model: close, not equal */
                sd_clip_text_free(&m32);
                CHECK(sd_clip_text_load(&m32, dir, &opts, &err) == SD_OK);
                touch_matrices(&m32, dt, 0);
                CHECK(encode(&m32, &g, 0, g.n, 1, &o, h32, NULL));
                for (size_t i = 0; i < nh; i++) far = fmax(far, fabs((double)h16[i] - (double)h32[i]));
                CHECK(far > 0 && far < 0.05);
            }
            printf("%s%s%s %s matrices (%s weights): %s, %zu + %zu bytes vs %zu, max |diff| to unrounded fp32 %.2e\n",
                   name, file ? "/" : "", file ? file : "", sd_dtype_name(dt), touched ? "touched" : "golden", same ? "bit-identical" : "DIFFERENT",
                   sd_weights_bytes(&m16.w), m16.half_total * 2, bytes32, far);
            sd_clip_text_free(&m16);
        }
    }
    CHECK(sd_clip_text_to_16bit(&m32, SD_DT_F32, &(int){0}, &err) != SD_OK);
done:
    sd_clip_text_free(&m32);
    sd_st_close(g.st);
    free(h32), free(p32), free(h16), free(p16);
}

/* sd_clip_kohya_join on chunks whose every value names its chunk, row and
 * column: the joined rows are the first chunk's BOS, rows 1..75 of each
 * chunk in order and the last chunk's row 76, as sd-scripts'
 * get_hidden_states slices them; the lengths for --max-tokens. */
static void check_kohya_join(void)
{
    enum { W = 3 };
    CHECK(sd_clip_kohya_rows(75) == 77 && sd_clip_kohya_rows(150) == 152 && sd_clip_kohya_rows(225) == 227);
    CHECK(sd_clip_kohya_rows(0) == 0 && sd_clip_kohya_rows(76) == 0 && sd_clip_kohya_rows(300) == 0);
    static float in[3 * 77 * W], out[227 * W];
    for (int c = 0; c < 3; c++)
        for (int r = 0; r < 77; r++)
            for (int x = 0; x < W; x++) in[(c * 77 + r) * W + x] = (float)(c * 10000 + r * 10 + x);
    for (size_t k = 1; k <= 3; k++) {
        size_t rows = 75 * k + 2;
        memset(out, 0xff, sizeof out);
        sd_clip_kohya_join(in, k, W, out);
        int ok = 1;
        for (size_t j = 0; j < rows; j++) {
            size_t c = j == 0 ? 0 : j == rows - 1 ? k - 1 : (j - 1) / 75;
            size_t r = j == 0 ? 0 : j == rows - 1 ? 76 : (j - 1) % 75 + 1;
            for (int x = 0; x < W; x++) ok &= out[j * W + x] == in[(c * 77 + r) * W + x];
        }
        uint32_t past = 0xffffffffu;
        if (rows < 227) memcpy(&past, out + rows * W, 4);
        CHECK(ok && past == 0xffffffffu); /* and nothing written past the rows */
    }
}

int main(void)
{
    check_kohya_join();
    check_sd1();
    check_sd2();
    check_sdxl();
    check_runner("sd1", (sd_clip_text_opts){0}, SD_CLIP_SD1);
    check_runner("sd2", (sd_clip_text_opts){0}, SD_CLIP_SD2);
    check_runner("sdxl", (sd_clip_text_opts){0}, SD_CLIP_SDXL_L);
    check_runner("sdxl", (sd_clip_text_opts){.which = 1}, SD_CLIP_SDXL_G);
    check_batch_positions("sd1", (sd_clip_text_opts){0}, SD_CLIP_SD1);
    check_batch_positions("sdxl", (sd_clip_text_opts){.which = 1}, SD_CLIP_SDXL_G);
    check_16bit("sd1", NULL, (sd_clip_text_opts){0}, SD_CLIP_SD1);
    check_16bit("sd2", NULL, (sd_clip_text_opts){0}, SD_CLIP_SD2);
    check_16bit("sd2", "single.safetensors", (sd_clip_text_opts){.heads = 3}, SD_CLIP_SD2); /* OpenCLIP, bf16 */
    check_16bit("sdxl", NULL, (sd_clip_text_opts){.which = 1}, SD_CLIP_SDXL_G);
    check_errors();
    return check_done("test_clip_text");
}
