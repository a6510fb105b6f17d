/* The VAE encoder against diffusers (tests/golden/vae, made by
 * tests/golden/make_vae_golden.py): an SD-shaped and an SDXL-shaped tiny
 * AutoencoderKL, each loaded from its diffusers folder (fp32) and from its
 * single-file ldm checkpoint (fp16 / bf16, config inferred from shapes),
 * mean and std within 1e-4; results bit-identical for 1, 2 and 3 threads
 * and for an image encoded alone or inside a batch; a vae/ folder saved
 * before diffusers 0.14 (old attention names) gives the same moments;
 * clear errors for missing files, wrong shapes and files without a VAE. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dtype.h"
#include "model_dir.h"
#include "safetensors.h"
#include "vae.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/vae"
#endif

/* The golden input and moments of one config. */
typedef struct {
    sd_safetensors *st;
    const sd_st_tensor *x, *mean, *std;
    int n, h, w, lc, lh, lw;
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
    g->x = sd_st_find(g->st, "x");
    g->mean = sd_st_find(g->st, "mean");
    g->std = sd_st_find(g->st, "std");
    if (!CHECK(g->x && g->mean && g->std && g->x->ndim == 4 && g->mean->ndim == 4)) return 0;
    g->n = (int)g->x->shape[0];
    g->h = (int)g->x->shape[2];
    g->w = (int)g->x->shape[3];
    g->lc = (int)g->mean->shape[1];
    g->lh = (int)g->mean->shape[2];
    g->lw = (int)g->mean->shape[3];
    return 1;
}

/* Largest absolute difference between a and the golden fp32 tensor b. */
static double max_err(const float *a, const sd_st_tensor *b)
{
    const float *e = b->data;
    size_t n = b->nbytes / 4;
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)e[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

/* Encode the golden input with v on `threads` threads into mean/std. */
static int encode(const sd_vae *v, const golden *g, int threads, float *mean, float *std)
{
    sd_error err = {0};
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    float *ws = malloc(sd_vae_workspace_floats(v, g->n, g->h, g->w) * sizeof(float));
    int ok = ws && sd_vae_encode(v, sd_backend_cpu(), pool, g->n, g->h, g->w, g->x->data, mean, std, ws, &err) == SD_OK;
    if (!ok) fprintf(stderr, "encode: %s\n", err.msg);
    free(ws);
    if (pool) sd_pool_destroy(pool);
    return ok;
}

/* Load `path` with opts, check the config and the moments against golden. */
static void check_model(const char *label, const char *path, const sd_vae_opts *opts, const golden *g,
                        double want_scale, int determinism)
{
    sd_vae v;
    sd_error err = {0};
    if (!CHECK(sd_vae_load(&v, path, opts, &err) == SD_OK)) {
        fprintf(stderr, "%s: %s\n", label, err.msg);
        return;
    }
    int lh, lw;
    sd_vae_latent_size(&v.cfg, g->h, g->w, &lh, &lw);
    CHECK(lh == g->lh && lw == g->lw && v.cfg.latent_channels == g->lc);
    CHECK(fabs(v.cfg.scaling_factor - want_scale) < 1e-12);
    size_t nl = (size_t)g->n * (size_t)g->lc * (size_t)g->lh * (size_t)g->lw;
    float *mean = calloc(nl, sizeof(float)), *std = calloc(nl, sizeof(float));
    if (CHECK(mean && std) && CHECK(encode(&v, g, 1, mean, std))) {
        double em = max_err(mean, g->mean), es = max_err(std, g->std);
        printf("%-28s layout %-28s scale %.5f (%s)  max err mean %.2e std %.2e\n", label, v.layout,
               v.cfg.scaling_factor, v.cfg.scale_source, em, es);
        CHECK(em <= 1e-4);
        CHECK(es <= 1e-4);
        if (determinism) {
            float *m2 = calloc(nl, sizeof(float)), *s2 = calloc(nl, sizeof(float));
            for (int t = 2; t <= 3 && m2 && s2; t++) {
                CHECK(encode(&v, g, t, m2, s2));
                CHECK(memcmp(m2, mean, nl * sizeof(float)) == 0);
                CHECK(memcmp(s2, std, nl * sizeof(float)) == 0);
            }
            /* each image alone gives the bytes it gave inside the batch:
             * sd-latents relies on it (resumed and split runs batch
             * differently) */
            golden one = *g;
            one.n = 1;
            size_t per = nl / (size_t)g->n, px = (size_t)3 * (size_t)g->h * (size_t)g->w;
            for (int i = 0; i < g->n && m2 && s2; i++) {
                sd_st_tensor xi = *g->x;
                xi.data = (const float *)g->x->data + (size_t)i * px;
                one.x = &xi;
                CHECK(encode(&v, &one, 2, m2, s2));
                CHECK(memcmp(m2, mean + (size_t)i * per, per * sizeof(float)) == 0);
                CHECK(memcmp(s2, std + (size_t)i * per, per * sizeof(float)) == 0);
            }
            free(m2);
            free(s2);
        }
    }
    free(mean);
    free(std);
    sd_vae_free(&v);
}

/* Both layouts of one golden config. */
static void check_config(const char *name, int groups, double scale)
{
    golden g;
    char path[512], label[64];
    if (!golden_open(&g, name)) return;
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, name);
    snprintf(label, sizeof label, "%s diffusers folder", name);
    check_model(label, path, NULL, &g, scale, 1);
    snprintf(path, sizeof path, "%s/%s/vae", GOLDEN_DIR, name);
    snprintf(label, sizeof label, "%s vae/ folder", name);
    check_model(label, path, NULL, &g, scale, 0);
    /* single file: config inferred from shapes; norm groups are not in the
     * weights, so they are given as a user would with --vae-groups */
    sd_vae_opts o = {.groups = groups};
    snprintf(path, sizeof path, "%s/%s/single.safetensors", GOLDEN_DIR, name);
    snprintf(label, sizeof label, "%s single file (inferred)", name);
    check_model(label, path, &o, &g, scale, 0);
    /* single file with the folder's config.json */
    char conf[512];
    snprintf(conf, sizeof conf, "%s/%s/vae/config.json", GOLDEN_DIR, name);
    sd_vae_opts oc = {.config_path = conf};
    snprintf(label, sizeof label, "%s single file + config", name);
    check_model(label, path, &oc, &g, scale, 0);
    sd_st_close(g.st);
}

/* 16-bit activations (sd_vae_set_activations): the golden moments within
 * the rounding such storage costs (relative to the largest golden value:
 * 5e-2 for bf16, 8e-3 for fp16), yet not fp32's bits (the path ran);
 * 1 and 3 threads and each image alone give the same bits; less
 * workspace at 512x512; a backend without the 16-bit ops is refused. */
static void check_act16(const char *name)
{
    golden g;
    char path[512];
    if (!golden_open(&g, name)) return;
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, name);
    sd_vae v;
    sd_error err = {0};
    if (!CHECK(sd_vae_load(&v, path, NULL, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        sd_st_close(g.st);
        return;
    }
    size_t nl = (size_t)g.n * (size_t)g.lc * (size_t)g.lh * (size_t)g.lw, per = nl / (size_t)g.n;
    float *m32 = calloc(nl, 4), *s32 = calloc(nl, 4), *mean = calloc(nl, 4), *std = calloc(nl, 4);
    float *m2 = calloc(nl, 4), *s2 = calloc(nl, 4);
    double scale_m = 0, scale_s = 0;
    for (size_t i = 0; i < nl; i++) {
        scale_m = fmax(scale_m, fabs(((const float *)g.mean->data)[i]));
        scale_s = fmax(scale_s, fabs(((const float *)g.std->data)[i]));
    }
    size_t ws32 = sd_vae_workspace_floats(&v, 1, 512, 512);
    if (CHECK(m32 && s32 && mean && std && m2 && s2) && CHECK(encode(&v, &g, 1, m32, s32))) {
        const int dts[2] = {SD_DT_BF16, SD_DT_F16};
        const double tol[2] = {5e-2, 8e-3};
        for (int d = 0; d < 2; d++) {
            CHECK(sd_vae_set_activations(&v, dts[d], &err) == SD_OK);
            if (!CHECK(encode(&v, &g, 1, mean, std))) continue;
            double em = max_err(mean, g.mean) / scale_m, es = max_err(std, g.std) / scale_s;
            size_t ws16 = sd_vae_workspace_floats(&v, 1, 512, 512);
            printf("%-6s %s activations: max err / max |golden| mean %.2e std %.2e; workspace at 512x512 %.1f "
                   "MiB (fp32 %.1f MiB)\n", name, sd_dtype_name(dts[d]), em, es, ws16 * 4.0 / 1048576,
                   ws32 * 4.0 / 1048576);
            CHECK(em <= tol[d] && es <= tol[d]);
            CHECK(memcmp(mean, m32, nl * 4) != 0);
            CHECK(ws16 < ws32 * 6 / 10);
            CHECK(encode(&v, &g, 3, m2, s2));
            CHECK(!memcmp(m2, mean, nl * 4) && !memcmp(s2, std, nl * 4));
            golden one = g;
            one.n = 1;
            size_t px = (size_t)3 * (size_t)g.h * (size_t)g.w;
            for (int i = 0; i < g.n; i++) {
                sd_st_tensor xi = *g.x;
                xi.data = (const float *)g.x->data + (size_t)i * px;
                one.x = &xi;
                CHECK(encode(&v, &one, 2, m2, s2));
                CHECK(!memcmp(m2, mean + (size_t)i * per, per * 4) && !memcmp(s2, std + (size_t)i * per, per * 4));
            }
        }
        /* a backend without the 16-bit ops (as CUDA today) is refused, naming it */
        sd_backend nohalf = *sd_backend_cpu();
        nohalf.conv2d_fwd_st = NULL;
        float *ws = malloc(sd_vae_workspace_floats(&v, g.n, g.h, g.w) * sizeof(float));
        sd_status st = ws ? sd_vae_encode_on(&v, &nohalf, NULL, v.w.data, g.n, g.h, g.w, g.x->data, mean, std, ws,
                                             &err)
                          : SD_ENOMEM;
        CHECK(st == SD_EUNSUPPORTED && strstr(err.msg, "fp16 activations") && strstr(err.msg, "cpu"));
        free(ws);
        /* and through the runner, sd-latents' way in (it used to call a NULL op) */
        sd_vae_runner run;
        err.msg[0] = 0;
        st = sd_vae_runner_init(&run, &v, &nohalf, NULL, &err);
        if (CHECK(st == SD_OK)) {
            st = sd_vae_runner_encode(&run, &v, g.n, g.h, g.w, g.x->data, mean, std, &err);
            CHECK(st == SD_EUNSUPPORTED && strstr(err.msg, "fp16 activations"));
            sd_vae_runner_free(&run);
        }
        CHECK(sd_vae_set_activations(&v, 7, &err) == SD_EINVAL);
    }
    free(m32);
    free(s32);
    free(mean);
    free(std);
    free(m2);
    free(s2);
    sd_vae_free(&v);
    sd_st_close(g.st);
}

/* 16-bit activations on configs the golden ones do not cover, with random
 * weights: no mid-block attention, no quant_conv, both on and off, a last
 * block wide enough that the attention's fp32 copies get their own room,
 * odd sizes, and n = 2 in one pass (sd_vae_encode_batch_on, whose workspace
 * is the batch's): the moments stay within bf16's rounding of fp32's, and
 * (under the sanitizers) every buffer the forward carves fits. */
static void check_act16_shapes(void)
{
    uint32_t seed = 12345;
    for (int cfgi = 0; cfgi < 5; cfgi++) {
        sd_vae_config c = {.in_channels = 3, .latent_channels = 4, .nblocks = 3, .block_out = {32, 64, 64},
                           .layers_per_block = 1, .groups = 8, .use_quant_conv = cfgi & 1,
                           .mid_attention = (cfgi >> 1) & 1, .eps = 1e-6f, .scaling_factor = 0.18215};
        if (cfgi == 4) { /* a wide last block: the attention's fp32 copies no longer fit in b and c */
            c.block_out[0] = 8;
            c.block_out[2] = 256;
            c.mid_attention = 1;
        }
        sd_vae v;
        sd_error err = {0};
        if (!CHECK(sd_vae_build(&v, &c, &err) == SD_OK)) continue;
        for (size_t i = 0; i < v.w.total; i++) {
            seed = seed * 1664525u + 1013904223u;
            v.w.data[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.25f;
        }
        const int n = 2, h = 37, w = 29;
        int lh, lw;
        sd_vae_latent_size(&c, h, w, &lh, &lw);
        size_t px = (size_t)3 * h * w, nl = (size_t)n * 4 * lh * lw;
        float *x = malloc(px * n * 4), *m32 = calloc(nl, 4), *s32 = calloc(nl, 4), *m16 = calloc(nl, 4),
              *s16 = calloc(nl, 4);
        for (size_t i = 0; x && i < px * n; i++) {
            seed = seed * 1664525u + 1013904223u;
            x[i] = (float)(seed >> 8) / 8388608.0f - 1.0f;
        }
        for (int d = 0; d < 2 && x && m32 && s32 && m16 && s16; d++) {
            CHECK(sd_vae_set_activations(&v, d ? SD_DT_BF16 : SD_DT_F32, &err) == SD_OK);
            float *ws = malloc(sd_vae_batch_workspace_floats(&v, n, h, w) * sizeof(float));
            sd_status st = ws ? sd_vae_encode_batch_on(&v, sd_backend_cpu(), NULL, v.w.data, n, h, w, x, d ? m16 : m32,
                                                       d ? s16 : s32, ws, &err)
                              : SD_ENOMEM;
            if (!CHECK(st == SD_OK)) fprintf(stderr, "config %d: %s\n", cfgi, err.msg);
            free(ws);
        }
        double scale = 0, worst = 0;
        for (size_t i = 0; i < nl; i++) scale = fmax(scale, fabs(m32[i]));
        for (size_t i = 0; i < nl; i++) worst = fmax(worst, fabs(m32[i] - m16[i]));
        printf("random config quant_conv %d attention %d, 2 x %dx%d in one pass: bf16 vs fp32 mean max diff %.2e of %.2e\n",
               c.use_quant_conv, c.mid_attention, w, h, worst, scale);
        CHECK(scale > 0 && worst <= 5e-2 * scale && worst > 0);
        free(x);
        free(m32);
        free(s32);
        free(m16);
        free(s16);
        sd_vae_free(&v);
    }
}

/* The "sdxl" vae/ folder as diffusers saved it before 0.14 (the hub's
 * SD 1.x / 2.x VAEs): mid-block attention named query, key, value and
 * proj_attn. The same weights, so the same moments as "sdxl". */
static void check_old_names(void)
{
    golden g;
    char path[512];
    if (!golden_open(&g, "sdxl")) return;
    snprintf(path, sizeof path, "%s/old_names/vae", GOLDEN_DIR);
    check_model("sdxl pre-0.14 names", path, NULL, &g, 0.13025, 0);
    sd_st_close(g.st);
}

/* Load failures: each must name the file and the reason. */
static void check_errors(void)
{
    sd_vae v;
    sd_error err = {0};
    char path[512];
    CHECK(sd_vae_load(&v, "/nonexistent/vae.safetensors", NULL, &err) != SD_OK);
    CHECK(strstr(err.msg, "/nonexistent/vae.safetensors") != NULL);
    /* a folder without weights */
    CHECK(sd_vae_load(&v, GOLDEN_DIR, NULL, &err) == SD_ENOTFOUND);
    /* a file with no VAE encoder in it */
    snprintf(path, sizeof path, "%s/sd/expected.safetensors", GOLDEN_DIR);
    CHECK(sd_vae_load(&v, path, NULL, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "no VAE encoder") != NULL);
    /* the wrong config for the weights: shapes do not match */
    char conf[512];
    snprintf(conf, sizeof conf, "%s/sdxl/vae/config.json", GOLDEN_DIR);
    snprintf(path, sizeof path, "%s/sd/single.safetensors", GOLDEN_DIR);
    sd_vae_opts o = {.config_path = conf};
    CHECK(sd_vae_load(&v, path, &o, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "has shape") != NULL && strstr(err.msg, "single.safetensors") != NULL);
    /* inferred config with the default 32 groups cannot fit 8 channels */
    CHECK(sd_vae_load(&v, path, NULL, &err) == SD_EINVAL);
    CHECK(strstr(err.msg, "norm groups") != NULL);
}

/* The smallest inputs: diffusers' AutoencoderKL with the golden sd config
 * (4 blocks) encodes a 9-wide image of height 8..19 and raises for 1..7,
 * where C's truncating division in the downsample size gave a 1-pixel
 * latent instead of an error. */
static void check_small_inputs(void)
{
    sd_vae v;
    sd_error err = {0};
    char path[512];
    snprintf(path, sizeof path, "%s/sd", GOLDEN_DIR);
    if (!CHECK(sd_vae_load(&v, path, NULL, &err) == SD_OK)) return;
    for (int h = 1; h < 20; h++) {
        int ok = sd_vae_check_input(&v, 1, h, 9, &err) == SD_OK;
        if (!CHECK(ok == (h >= 8))) fprintf(stderr, "  height %d: %s\n", h, ok ? "accepted" : err.msg);
        CHECK((sd_vae_check_input(&v, 1, 9, h, &err) == SD_OK) == (h >= 8));
    }
    CHECK(sd_vae_check_input(&v, 0, 8, 8, &err) == SD_EINVAL);
    /* the encode itself refuses, naming the size */
    float x[3 * 7 * 9] = {0}, out[64], ws[4096];
    CHECK(sd_vae_encode(&v, sd_backend_cpu(), NULL, 1, 7, 9, x, out, out, ws, &err) == SD_EINVAL);
    CHECK(strstr(err.msg, "1x7x9") != NULL);
    sd_vae_free(&v);
}

/* A config.json written to a fresh file under /tmp and read back. */
typedef struct {
    char path[64];
    sd_buf text;
    sd_arena a;
    sd_json *root;
} config_doc;

/* Write text to a fresh file and read it with sd_model_config_read; the
 * file and buffers stay until config_doc_free (also after a failure). */
static sd_status config_doc_read(config_doc *d, const char *text, const char *class_name, sd_error *err)
{
    sd_buf_init(&d->text);
    sd_arena_init(&d->a, 1 << 12);
    d->root = NULL;
    snprintf(d->path, sizeof d->path, "/tmp/sdtk-test-config-XXXXXX");
    int fd = mkstemp(d->path);
    size_t n = strlen(text);
    int ok = fd >= 0 && write(fd, text, n) == (ssize_t)n;
    if (fd >= 0) close(fd);
    if (!ok) return sd_err_set(err, SD_EIO, "%s: cannot write it", d->path);
    return sd_model_config_read(d->path, class_name, &d->text, &d->a, &d->root, err);
}

/* The buffers and the file of config_doc_read. */
static void config_doc_free(config_doc *d)
{
    sd_arena_free(&d->a);
    sd_buf_free(&d->text);
    unlink(d->path);
}

/* The loaders' one config reader (sd_model_config_read, _int): a config
 * that is not an object, or of another class than the loader builds (a
 * UNet's config given as the VAE's), is refused naming the file and the
 * class; members that count things must be whole numbers in range. */
static void check_config_reader(void)
{
    static const struct {
        const char *text, *class_name;
        sd_status want;
        const char *msg;
    } cases[] = {
        {"[1, 2]", NULL, SD_EFORMAT, "not a JSON object"},
        {"{\"_class_name\": \"UNet2DConditionModel\"}", "AutoencoderKL", SD_EUNSUPPORTED,
         "_class_name UNet2DConditionModel, expected AutoencoderKL"},
        {"{\"_class_name\": 5}", "AutoencoderKL", SD_EUNSUPPORTED, "(not a string), expected AutoencoderKL"},
        {"{\"_class_name\": \"AutoencoderKL\"}", "AutoencoderKL", SD_OK, NULL},
        {"{}", "AutoencoderKL", SD_OK, NULL},
        {"{\"_class_name\": \"CLIPTextModel\"}", NULL, SD_OK, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        config_doc d;
        sd_error err = {0};
        sd_status st = config_doc_read(&d, cases[i].text, cases[i].class_name, &err);
        if (!CHECK(st == cases[i].want)) fprintf(stderr, "  case %zu: %s\n", i, err.msg);
        if (cases[i].msg) CHECK(strstr(err.msg, cases[i].msg) != NULL && strstr(err.msg, d.path) != NULL);
        config_doc_free(&d);
    }
    /* counting members */
    config_doc d;
    sd_error err = {0};
    if (CHECK(config_doc_read(&d, "{\"a\": 3, \"b\": -1, \"c\": 2.5, \"d\": null, \"e\": 2e6, \"f\": \"x\"}", NULL,
                              &err) == SD_OK)) {
        int v = 7;
        CHECK(sd_model_config_int(d.root, "a", 1e6, &v, d.path, &err) == SD_OK && v == 3);
        CHECK(sd_model_config_int(d.root, "d", 1e6, &v, d.path, &err) == SD_OK && v == 3); /* null keeps */
        CHECK(sd_model_config_int(d.root, "absent", 1e6, &v, d.path, &err) == SD_OK && v == 3);
        const char *bad[] = {"b", "c", "e", "f"};
        for (int i = 0; i < 4; i++) {
            CHECK(sd_model_config_int(d.root, bad[i], 1e6, &v, d.path, &err) == SD_EFORMAT && v == 3);
            CHECK(strstr(err.msg, "must be a non-negative integer") != NULL);
        }
    }
    config_doc_free(&d);
    /* through the loader: the golden UNet's config given as the VAE's */
    sd_vae v;
    char weights[512], conf[512];
    snprintf(weights, sizeof weights, "%s/sd/single.safetensors", GOLDEN_DIR);
    snprintf(conf, sizeof conf, "%s/../unet/sd1/unet/config.json", GOLDEN_DIR);
    sd_vae_opts o = {.config_path = conf};
    CHECK(sd_vae_load(&v, weights, &o, &err) == SD_EUNSUPPORTED);
    CHECK(strstr(err.msg, "expected AutoencoderKL") != NULL);
}

int main(void)
{
    check_small_inputs();
    check_config("sd", 4, 0.18215);
    check_config("sdxl", 2, 0.13025);
    check_act16("sd");
    check_act16("sdxl");
    check_act16_shapes();
    check_old_names();
    check_errors();
    check_config_reader();
    return check_done("test_vae");
}
