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
 * moments out (sd_vae_runner, what sd-latents does).
 * usage: bench_vae VAE_DIR X.f32 H W THREADS REPS OUT.f32 [DEVICE [BATCH]] */
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
    if (strcmp(dev, "cpu") == 0) {
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
    if (sd_vae_load(&v, argv[1], NULL, &err)) {
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    size_t px = (size_t)3 * (size_t)h * (size_t)w;
    float *x = malloc(px * (size_t)batch * sizeof(float));
    FILE *f = fopen(argv[2], "rb");
    if (!x || !f || fread(x, sizeof(float), px, f) != px) {
        fprintf(stderr, "bench_vae: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
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
    printf("sdtk %s fp32, %d thread(s), batch %d, %dx%d: best %.4f s, median %.4f s, %.2f images/s "
           "(workspace %zu MB, weights %zu MB)\n",
           dev, threads, batch, w, h, ts[0], ts[reps / 2], batch / ts[reps / 2],
           (batch > 1 && strcmp(dev, "cpu") != 0 ? sd_vae_batch_workspace_floats(&v, batch, h, w)
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
