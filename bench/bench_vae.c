/* VAE encode benchmark (bench_vae.sh runs it): load a VAE, encode one raw
 * fp32 [1, 3, H, W] input REPS times on THREADS threads after a warm-up,
 * print the best and median seconds and, with --profile, the time of each
 * op kind; write the mean to OUT for comparison with PyTorch's.
 * usage: bench_vae VAE_DIR X.f32 H W THREADS REPS OUT.f32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "progress.h"
#include "vae.h"

/* Ascending order of doubles, for the median. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: bench_vae VAE_DIR X.f32 H W THREADS REPS OUT.f32\n");
        return 2;
    }
    int h = atoi(argv[3]), w = atoi(argv[4]), threads = atoi(argv[5]), reps = atoi(argv[6]);
    if (h < 8 || w < 8 || threads < 1 || reps < 1 || reps > 100) return 2;
    sd_vae v;
    sd_error err = {0};
    if (sd_vae_load(&v, argv[1], NULL, &err)) {
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    size_t px = (size_t)3 * (size_t)h * (size_t)w;
    float *x = malloc(px * sizeof(float));
    FILE *f = fopen(argv[2], "rb");
    if (!x || !f || fread(x, sizeof(float), px, f) != px) {
        fprintf(stderr, "bench_vae: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    int lh, lw;
    sd_vae_latent_size(&v.cfg, h, w, &lh, &lw);
    size_t lat = (size_t)v.cfg.latent_channels * (size_t)lh * (size_t)lw;
    size_t wsn = sd_vae_workspace_floats(&v, 1, h, w);
    float *mean = malloc(lat * sizeof(float)), *std = malloc(lat * sizeof(float)), *ws = malloc(wsn * sizeof(float));
    double *ts = calloc((size_t)reps, sizeof(double));
    if (!mean || !std || !ws || !ts) return 1;
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    const sd_backend *be = sd_backend_cpu();
    if (sd_vae_encode(&v, be, pool, 1, h, w, x, mean, std, ws, &err)) { /* warm-up: pages, caches */
        fprintf(stderr, "bench_vae: %s\n", err.msg);
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = sd_now();
        sd_vae_encode(&v, be, pool, 1, h, w, x, mean, std, ws, &err);
        ts[r] = sd_now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof(double), cmp_double);
    printf("sdtk cpu fp32, %d thread(s): best %.3f s, median %.3f s (workspace %zu MB, weights %zu MB)\n", threads,
           ts[0], ts[reps / 2], wsn * sizeof(float) >> 20, sd_weights_bytes(&v.w) >> 20);
    f = fopen(argv[7], "wb");
    if (f) {
        fwrite(mean, sizeof(float), lat, f);
        fclose(f);
    }
    if (pool) sd_pool_destroy(pool);
    free(x);
    free(mean);
    free(std);
    free(ws);
    free(ts);
    sd_vae_free(&v);
    return 0;
}
