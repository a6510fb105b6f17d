/* sd-sample's two heavy parts on their own (bench_sample.sh runs it):
 *   bench_sample decode VAE_DIR Z.f32 LH LW THREADS REPS OUT.f32
 *     the VAE decoder on one raw fp32 latent [1, 4, LH, LW] (scaled, as
 *     sampled), REPS timed decodes after a warm-up: best and median
 *     seconds; the image [1, 3, 8 LH, 8 LW] written to OUT.f32 for
 *     comparison with diffusers' AutoencoderKL.decode.
 *   bench_sample unet UNET_DIR LH LW THREADS REPS
 *     one UNet call as sd-sample makes it for classifier-free guidance: a
 *     batch of 2 latents of LH x LW, 77 text tokens (seeded random inputs,
 *     timestep 500), planned as sd-sample plans it; best and median, and
 *     the best call's process CPU time (steadier than wall time on a
 *     loaded machine when THREADS is 1); a hash of the prediction's bits,
 *     so two builds' runs show whether they compute the same bits.
 * Both end with one more run with every op timed: the time per op class. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "pool.h"
#include "prof_backend.h"
#include "progress.h"
#include "unet.h"
#include "vae_decode.h"

/* Ascending order of doubles, for the median. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best and median of ts[0..reps) (sorted here), printed after what. */
static void report(const char *what, double *ts, int reps)
{
    qsort(ts, (size_t)reps, sizeof(double), cmp_double);
    printf("%s: best %.3f s, median %.3f s\n", what, ts[0], ts[reps / 2]);
}

/* The per-class seconds of the profiled run. */
static void report_classes(const char *what, double total)
{
    printf("  profiled %s %.3f s:", what, total);
    for (int k = 0; k < C_N; k++) printf(" %s %.3f s,", class_name[k], tsum[k]);
    printf("\n");
}

/* n floats of a raw fp32 file; NULL when it is missing or short. */
static float *read_f32(const char *path, size_t n)
{
    float *p = malloc(n * sizeof(float));
    FILE *f = fopen(path, "rb");
    if (!p || !f || fread(p, sizeof(float), n, f) != n) {
        fprintf(stderr, "bench_sample: cannot read %zu floats from %s\n", n, path);
        free(p);
        p = NULL;
    }
    if (f) fclose(f);
    return p;
}

/* The decode mode (see the top). */
static int bench_decode(char **argv, sd_pool *pool, int threads, int reps, double *ts)
{
    int lh = atoi(argv[4]), lw = atoi(argv[5]);
    sd_vae_decoder d;
    sd_error err = {0};
    if (sd_vae_decoder_load(&d, argv[2], NULL, &err)) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        return 1;
    }
    int h, w;
    sd_vae_decoded_size(&d.cfg, lh, lw, &h, &w);
    size_t px = (size_t)d.cfg.out_channels * (size_t)h * (size_t)w;
    float *z = read_f32(argv[3], (size_t)d.cfg.latent_channels * (size_t)lh * (size_t)lw);
    float *img = malloc(px * sizeof(float));
    sd_vae_decode_runner run;
    const sd_backend *be = sd_backend_cpu();
    int rc = 1;
    if (z && img && !sd_vae_decode_runner_init(&run, &d, be, pool, &err)) {
        rc = sd_vae_decode_runner_decode(&run, &d, 1, lh, lw, z, img, &err); /* warm-up: pages, workspace */
        for (int r = 0; r < reps && !rc; r++) {
            double t0 = sd_now();
            rc = sd_vae_decode_runner_decode(&run, &d, 1, lh, lw, z, img, &err);
            ts[r] = sd_now() - t0;
        }
        if (!rc) {
            char what[160];
            snprintf(what, sizeof what, "sdtk VAE decode, %d thread(s), %dx%d latents -> %dx%d", threads, lh, lw, h,
                     w);
            report(what, ts, reps);
            memset(tsum, 0, sizeof tsum);
            run.be = prof_backend(be);
            double t0 = sd_now();
            rc = sd_vae_decode_runner_decode(&run, &d, 1, lh, lw, z, img, &err);
            if (!rc) report_classes("decode", sd_now() - t0);
            run.be = be;
        }
        FILE *f = rc ? NULL : fopen(argv[8], "wb");
        if (f) {
            if (fwrite(img, sizeof(float), px, f) != px) rc = 1;
            fclose(f);
        }
        sd_vae_decode_runner_free(&run);
    }
    if (rc) fprintf(stderr, "bench_sample: decode: %s\n", err.msg[0] ? err.msg : "failed");
    free(z);
    free(img);
    sd_vae_decoder_free(&d);
    return rc ? 1 : 0;
}

static uint64_t rng_state = 0x853C49E6748FEA9Bull;

/* Seeded normal-ish floats (sum of uniforms, xorshift64*): inputs of a
 * plausible scale, no more. */
static float nrand(void)
{
    double s = 0;
    for (int i = 0; i < 4; i++) {
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        s += (double)((rng_state * 2685821657736338717ull) >> 40) / (double)(1ull << 24) - 0.5;
    }
    return (float)(s * sqrt(3.0));
}

/* CPU seconds of the whole process (every thread), for A/B runs on a
 * machine others load: unlike wall time it does not count the time the
 * threads wait for a core. */
static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The unet mode (see the top). */
static int bench_unet(char **argv, sd_pool *pool, int threads, int reps, double *ts)
{
    int lh = atoi(argv[3]), lw = atoi(argv[4]), n = 2, tctx = 77;
    sd_unet u;
    sd_unet_graph g = {0};
    sd_error err = {0};
    if (sd_unet_load(&u, argv[2], NULL, &err)) {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
        return 1;
    }
    const sd_backend *be = sd_backend_cpu();
    float *act = NULL;
    int rc = sd_unet_plan(&u, n, lh, lw, tctx, 1, &g, &err) != SD_OK; /* as sd-sample plans it */
    if (!rc) act = calloc(g.nact, sizeof(float));
    if (!rc && act) {
        size_t nx = (size_t)n * (size_t)u.cfg.in_channels * (size_t)lh * (size_t)lw;
        size_t nc = (size_t)n * (size_t)tctx * (size_t)u.cfg.cross_dim;
        for (size_t i = 0; i < nx; i++) act[g.x + i] = nrand();
        for (size_t i = 0; i < nc; i++) act[g.ctx + i] = nrand();
        act[g.t] = act[g.t + 1] = 500.0f;
        if (u.cfg.text_time) {
            fprintf(stderr, "bench_sample: the unet mode takes SD 1.x/2.x UNets (no SDXL inputs here)\n");
            rc = 1;
        }
        if (!rc) sd_unet_forward(&u, &g, be, pool, u.w.data, act); /* warm-up */
        double cpu_best = 1e30;
        for (int r = 0; r < reps && !rc; r++) {
            double t0 = sd_now(), c0 = cpu_now();
            sd_unet_forward(&u, &g, be, pool, u.w.data, act);
            ts[r] = sd_now() - t0;
            if (cpu_now() - c0 < cpu_best) cpu_best = cpu_now() - c0;
        }
        if (!rc) {
            char what[160];
            snprintf(what, sizeof what, "sdtk UNet call, batch %d, %dx%d latents, %d tokens, %d thread(s) "
                     "(activations %zu MB)", n, lh, lw, tctx, threads, g.nact * sizeof(float) >> 20);
            report(what, ts, reps);
            printf("  process CPU time per call, best: %.3f s (all threads; with 1 thread the figure a loaded "
                   "machine changes least)\n", cpu_best);
            memset(tsum, 0, sizeof tsum);
            double t0 = sd_now();
            sd_unet_forward(&u, &g, prof_backend(be), pool, u.w.data, act);
            report_classes("UNet call", sd_now() - t0);
            double s = 0;
            for (size_t i = 0; i < nx / 2; i++) s += fabs(act[g.out + i]);
            uint32_t hash = 2166136261u; /* FNV-1a of the prediction's bytes: equal bits, equal hash */
            const unsigned char *bytes = (const unsigned char *)(act + g.out);
            for (size_t i = 0; i < nx * sizeof(float); i++) hash = (hash ^ bytes[i]) * 16777619u;
            printf("  mean |prediction| %.4f, bits hash %08x\n", s / (double)(nx / 2), (unsigned)hash);
        }
    } else if (!rc) {
        fprintf(stderr, "bench_sample: out of memory for %zu MB of activations\n", g.nact * sizeof(float) >> 20);
        rc = 1;
    } else {
        fprintf(stderr, "bench_sample: %s\n", err.msg);
    }
    free(act);
    sd_unet_graph_free(&g);
    sd_unet_free(&u);
    return rc;
}

/* The mode from the command line, the thread pool, the run. */
int main(int argc, char **argv)
{
    int decode = argc == 9 && !strcmp(argv[1], "decode"), unet = argc == 7 && !strcmp(argv[1], "unet");
    if (!decode && !unet) {
        fprintf(stderr, "usage: bench_sample decode VAE_DIR Z.f32 LH LW THREADS REPS OUT.f32\n"
                        "       bench_sample unet UNET_DIR LH LW THREADS REPS\n");
        return 2;
    }
    int threads = atoi(argv[decode ? 6 : 5]), reps = atoi(argv[decode ? 7 : 6]);
    if (threads < 1 || reps < 1 || reps > 1000 || atoi(argv[decode ? 4 : 3]) < 1 || atoi(argv[decode ? 5 : 4]) < 1)
        return 2;
    sd_pool *pool = sd_pool_create(threads);
    double *ts = calloc((size_t)reps, sizeof(double));
    if (!pool || !ts) return 1;
    int rc = decode ? bench_decode(argv, pool, threads, reps, ts) : bench_unet(argv, pool, threads, reps, ts);
    free(ts);
    sd_pool_destroy(pool);
    return rc;
}
