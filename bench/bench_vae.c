/* VAE encode benchmark (bench_vae.sh and bench_gpu.sh run it): load a VAE,
 * encode a batch of BATCH copies of one raw fp32 [1, 3, H, W] input REPS
 * times after a warm-up, print the best and median seconds per batch and
 * images/s, and write the first image's mean to OUT for comparison with
 * PyTorch's. Last, one more encode with every op timed (and on a GPU
 * waited for): the time per op class. DEVICE is cpu (THREADS threads) or
 * cuda:K (strict fp32), optionally followed by modes, e.g.
 * cuda:0:search:tf32: tf32 (TF32 tensor cores), bf16 / fp16 (mixed
 * precision: matrix products on 16-bit copies), search (timed cuDNN
 * algorithm choice), ws8g (8 GiB cuDNN workspace), flash (attention on the
 * flash kernel); on a GPU the time includes copying the batch in and the
 * moments out (sd_vae_runner, what sd-latents does). On the CPU, modes
 * bf16act / fp16act store the activations in 16 bits (sd_vae_set_activations),
 * e.g. cpu:bf16act. VAE_DIR "random" builds the SD architecture (blocks
 * 128/256/512/512, 2 resnets, 32 groups) with seeded random weights, and
 * X.f32 "random" a seeded uniform input, so no PyTorch is needed to
 * compare sdtk's modes with each other.
 * usage: bench_vae VAE_DIR X.f32 H W THREADS REPS OUT.f32 [DEVICE [BATCH]] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "prof_backend.h"
#include "progress.h"
#include "vae.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

/* Ascending order of doubles, for the median. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The backend named by DEVICE: the CPU table with a pool, or a CUDA
 * context; 0 on success. */
static int open_device(const char *dev, int threads, const sd_backend **be, void **exec, sd_pool **pool,
                       void **cuda)
{
    *pool = NULL;
    *cuda = NULL;
    if (strncmp(dev, "cpu", 3) == 0 && (dev[3] == 0 || dev[3] == ':')) {
        *be = sd_backend_cpu();
        *pool = threads > 1 ? sd_pool_create(threads) : NULL;
        *exec = *pool;
        return 0;
    }
#ifdef SDTK_HAVE_CUDA
    int k = 0;
    char mode[32] = "";
    if (sscanf(dev, "cuda:%d:%31s", &k, mode) >= 1 || strcmp(dev, "cuda") == 0) {
        sd_error err = {0};
        sd_cuda_opts o = {.allow_tf32 = strstr(mode, "tf32") != NULL,
                          .mixed = strstr(mode, "bf16") ? SD_DT_BF16 : strstr(mode, "fp16") ? SD_DT_F16 : 0,
                          .conv_search = strstr(mode, "search") != NULL,
                          .conv_workspace = strstr(mode, "ws8g") ? (size_t)8 << 30 : 0,
                          .attn_flash = strstr(mode, "flash") != NULL};
        sd_cuda *c = NULL;
        if (sd_cuda_create(&c, k, &o, &err)) {
            fprintf(stderr, "bench_vae: %s\n", err.msg);
            return 1;
        }
        *be = sd_backend_cuda();
        *exec = c;
        *cuda = c;
        return 0;
    }
#endif
    fprintf(stderr, "bench_vae: unknown or unsupported device %s\n", dev);
    return 1;
}

static uint64_t rng_state = 0x853C49E6748FEA9Bull;

/* Seeded uniform floats in [-1, 1) (xorshift64*). */
static float urand(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 2685821657736338717ull;
    return (float)((double)(r >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* A conv as torch initialises one (weights and bias uniform within
 * 1/sqrt(fan_in)), plus bench_vae.py's spread of 0.02. */
static void init_conv(float *p, const sd_vae_conv *c)
{
    float bound = 1.0f / sqrtf((float)(c->cin * c->k * c->k));
    size_t nw = (size_t)c->cout * (size_t)c->cin * (size_t)c->k * (size_t)c->k;
    for (size_t i = 0; i < nw; i++) p[c->w + i] = urand() * bound + urand() * 0.02f;
    for (int i = 0; i < c->cout; i++) p[c->b + i] = urand() * bound + urand() * 0.02f;
}

/* A norm: gamma 1, beta 0, plus the spread. */
static void init_norm(float *p, const sd_vae_norm *n, int c)
{
    for (int i = 0; i < c; i++) {
        p[n->g + i] = 1.0f + urand() * 0.02f;
        p[n->b + i] = urand() * 0.02f;
    }
}

/* A resnet's norms and convs. */
static void init_resnet(float *p, const sd_vae_resnet *r)
{
    init_norm(p, &r->n1, r->cin);
    init_conv(p, &r->c1);
    init_norm(p, &r->n2, r->cout);
    init_conv(p, &r->c2);
    if (r->has_sc) init_conv(p, &r->sc);
}

/* The SD VAE encoder's architecture with seeded random weights in torch's
 * default ranges (the attention's linears as 1x1 convs of width c). */
static sd_status random_vae(sd_vae *v, sd_error *err)
{
    sd_vae_config c = {.in_channels = 3, .latent_channels = 4, .nblocks = 4, .block_out = {128, 256, 512, 512},
                       .layers_per_block = 2, .groups = 32, .use_quant_conv = 1, .mid_attention = 1, .eps = 1e-6f,
                       .scaling_factor = 0.18215};
    snprintf(c.scale_source, sizeof c.scale_source, "random");
    sd_status st = sd_vae_build(v, &c, err);
    if (st) return st;
    float *p = v->w.data;
    init_conv(p, &v->conv_in);
    for (int i = 0; i < c.nblocks; i++) {
        for (int j = 0; j < c.layers_per_block; j++) init_resnet(p, &v->res[i][j]);
        if (i < c.nblocks - 1) init_conv(p, &v->down[i]);
    }
    init_resnet(p, &v->mid[0]);
    init_resnet(p, &v->mid[1]);
    const sd_vae_attn *a = &v->attn;
    init_norm(p, &a->n, a->c);
    const size_t lin[4][2] = {{a->wq, a->bq}, {a->wk, a->bk}, {a->wv, a->bv}, {a->wo, a->bo}};
    for (int i = 0; i < 4; i++) {
        sd_vae_conv l = {.w = lin[i][0], .b = lin[i][1], .cin = a->c, .cout = a->c, .k = 1};
        init_conv(p, &l);
    }
    init_norm(p, &v->norm_out, c.block_out[c.nblocks - 1]);
    init_conv(p, &v->conv_out);
    init_conv(p, &v->quant);
    return SD_OK;
}

int main(int argc, char **argv)
{
    if (argc < 8 || argc > 10) {
        fprintf(stderr, "usage: bench_vae VAE_DIR X.f32 H W THREADS REPS OUT.f32 [DEVICE [BATCH]]\n");
        return 2;
    }
    int h = atoi(argv[3]), w = atoi(argv[4]), threads = atoi(argv[5]), reps = atoi(argv[6]);
    const char *dev = argc > 8 ? argv[8] : "cpu";
    int batch = argc > 9 ? atoi(argv[9]) : 1;
    if (h < 8 || w < 8 || threads < 1 || reps < 1 || reps > 1000 || batch < 1 || batch > 256) return 2;
    sd_vae v;
    sd_error err = {0};
    if (strcmp(argv[1], "random") ? sd_vae_load(&v, argv[1], NULL, &err) : random_vae(&v, &err)) {
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    int cpu = strncmp(dev, "cpu", 3) == 0, act = SD_DT_F32;
    if (cpu && dev[3] == ':') {
        act = !strcmp(dev + 4, "bf16act") ? SD_DT_BF16 : !strcmp(dev + 4, "fp16act") ? SD_DT_F16 : 0;
        if (!act) {
            fprintf(stderr, "bench_vae: %s: the CPU's modes are bf16act and fp16act\n", dev);
            return 2;
        }
    }
    if (act != SD_DT_F32 && sd_vae_set_activations(&v, act, &err)) {
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    size_t px = (size_t)3 * (size_t)h * (size_t)w;
    float *x = malloc(px * (size_t)batch * sizeof(float));
    FILE *f = strcmp(argv[2], "random") ? fopen(argv[2], "rb") : NULL;
    if (x && !strcmp(argv[2], "random")) {
        for (size_t i = 0; i < px; i++) x[i] = urand();
    } else if (!x || !f || fread(x, sizeof(float), px, f) != px) {
        fprintf(stderr, "bench_vae: cannot read %s\n", argv[2]);
        return 1;
    }
    if (f) fclose(f);
    for (int i = 1; i < batch; i++) memcpy(x + (size_t)i * px, x, px * sizeof(float));
    int lh, lw;
    sd_vae_latent_size(&v.cfg, h, w, &lh, &lw);
    size_t lat = (size_t)v.cfg.latent_channels * (size_t)lh * (size_t)lw * (size_t)batch;
    float *mean = malloc(lat * sizeof(float)), *std = malloc(lat * sizeof(float));
    double *ts = calloc((size_t)reps, sizeof(double));
    if (!mean || !std || !ts) return 1;
    const sd_backend *be;
    void *exec, *cuda;
    sd_pool *pool;
    if (open_device(dev, threads, &be, &exec, &pool, &cuda)) return 1;
    sd_vae_runner run;
    if (sd_vae_runner_init(&run, &v, be, exec, &err) ||
        sd_vae_runner_encode(&run, &v, batch, h, w, x, mean, std, &err)) { /* warm-up: pages, algorithm choice */
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = sd_now();
        if (sd_vae_runner_encode(&run, &v, batch, h, w, x, mean, std, &err)) {
            fprintf(stderr, "bench_vae: %s\n", err.msg);
            return 1;
        }
        ts[r] = sd_now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof(double), cmp_double);
    printf("sdtk %s %s activations, %d thread(s), batch %d, %dx%d: best %.4f s, median %.4f s, %.2f images/s "
           "(workspace %zu MB, weights %zu MB)\n",
           dev, sd_dtype_name(act), threads, batch, w, h, ts[0], ts[reps / 2], batch / ts[reps / 2],
           (batch > 1 && be->is_device ? sd_vae_batch_workspace_floats(&v, batch, h, w)
                                                 : sd_vae_workspace_floats(&v, batch, h, w)) *
                   sizeof(float) >> 20,
           sd_weights_bytes(&v.w) >> 20);
    memset(tsum, 0, sizeof tsum);
    run.be = prof_backend(be);
    double t0 = sd_now();
    if (sd_vae_runner_encode(&run, &v, batch, h, w, x, mean, std, &err)) {
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    printf("  profiled encode %.4f s:", sd_now() - t0);
    for (int k = 0; k < C_N; k++) printf(" %s %.4f s,", class_name[k], tsum[k]);
    printf("\n");
    run.be = be;
    f = fopen(argv[7], "wb");
    if (f) {
        fwrite(mean, sizeof(float), lat / (size_t)batch, f);
        fclose(f);
    }
    sd_vae_runner_free(&run);
#ifdef SDTK_HAVE_CUDA
    if (cuda) sd_cuda_destroy(cuda);
#endif
    if (pool) sd_pool_destroy(pool);
    free(x);
    free(mean);
    free(std);
    free(ts);
    sd_vae_free(&v);
    return 0;
}
