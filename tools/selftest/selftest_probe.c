/* sd-selftest: the throughput probe (a 512x512 convolution, a 4096^3 GEMM,
 * the VAE's attention, VAE encodes) on a device. */
#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "progress.h"
#include "selftest.h"

/* Seconds of the best of `reps` runs of fn after one warm-up, synced. */
typedef void (*probe_fn)(const target *t, float **p);

/* The best of several runs, not the mean: the probe reports what the device can do, not a passing stall. */
static double time_best(const target *t, probe_fn fn, float **p, int reps, sd_error *err)
{
    fn(t, p);
    if (t->be->sync(t->ex, err)) return -1;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = sd_now();
        fn(t, p);
        if (t->be->sync(t->ex, err)) return -1;
        double d = sd_now() - t0;
        if (d < best) best = d;
    }
    return best;
}

static const sd_conv2d_shape probe_conv = {.n = 1, .cin = 128, .h = 512, .w = 512, .cout = 128, .kh = 3, .kw = 3,
                                           .stride = 1, .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
static const sd_linear_shape probe_gemm = {.m = 4096, .k = 4096, .n = 4096};
static const sd_attn_shape probe_attn = {.b = 1, .heads = 1, .tq = 4096, .tk = 4096, .d = 512,
                                         .scale = 0.0441941738f};

/* The timed calls, one op each on the probe shapes above (p: that op's buffers from probe_bufs). */
static void probe_conv_fwd(const target *t, float **p)
{
    t->be->conv2d_fwd(t->ex, &probe_conv, p[1], p[0], p[2], p[3]);
}
static void probe_conv_bwd(const target *t, float **p)
{
    t->be->conv2d_bwd(t->ex, &probe_conv, p[4], p[5], p[6], p[1], p[0], p[2]);
}
static void probe_gemm_fwd(const target *t, float **p)
{
    t->be->linear_fwd(t->ex, &probe_gemm, p[1], p[0], p[2], NULL);
}
static void probe_attn_fwd(const target *t, float **p)
{
    t->be->attn_fwd(t->ex, &probe_attn, p[3], p[4], p[0], p[1], p[2]);
}
static void probe_attn_bwd(const target *t, float **p)
{
    t->be->attn_bwd(t->ex, &probe_attn, p[5], p[6], p[7], p[3], p[0], p[1], p[2], p[3], p[4]);
}

/* Device buffers of the given sizes (floats), random; 0 when one fails. */
static int probe_bufs(const target *t, float **p, const size_t *n, int k)
{
    int ok = 1;
    for (int i = 0; i < k; i++) {
        p[i] = t->be->alloc(t->ex, n[i] * sizeof(float));
        float *h = malloc(n[i] * sizeof(float));
        if (!p[i] || !h) ok = 0;
        else {
            selftest_fill(h, n[i], 900 + (uint64_t)i, -0.5f, 0.5f);
            t->be->h2d(t->ex, p[i], h, n[i] * sizeof(float));
        }
        free(h);
    }
    return ok;
}

/* Releases probe buffers. */
static void probe_free(const target *t, float **p, int k)
{
    for (int i = 0; i < k; i++) t->be->release(t->ex, p[i]);
}

/* Throughput of the heaviest VAE layers and a big GEMM (attention also on
 * `flash`, the context that always takes the flash kernel, when not NULL),
 * and VAE encodes of 512x512 images with the SD architecture (random
 * weights): what a cache run will see. 0 on success. */
int selftest_probe(const target *t, const target *flash)
{
    sd_error err = {0};
    float *p[8] = {0};
    double conv_flop = 2.0 * 128 * 128 * 9 * 512 * 512;
    size_t cn[] = {SZ(128) * 512 * 512, SZ(128) * 512 * 512, SZ(128) * 128 * 9, 128, SZ(128) * 512 * 512,
                   SZ(128) * 128 * 9, 128};
    if (probe_bufs(t, p, cn, 7)) {
        double f = time_best(t, probe_conv_fwd, p, 5, &err), b = f < 0 ? -1 : time_best(t, probe_conv_bwd, p, 3, &err);
        if (f < 0 || b < 0) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
        printf("conv2d 3x3 128->128 at 512x512: forward %.2f ms (%.0f GFLOP/s), backward %.2f ms (%.0f GFLOP/s)\n",
               f * 1e3, conv_flop / f * 1e-9, b * 1e3, 2 * conv_flop / b * 1e-9);
    }
    probe_free(t, p, 7);
    size_t gn[] = {SZ(4096) * 4096, SZ(4096) * 4096, SZ(4096) * 4096};
    if (probe_bufs(t, p, gn, 3)) {
        double f = time_best(t, probe_gemm_fwd, p, 5, &err);
        if (f < 0) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
        printf("linear 4096x4096x4096: %.2f ms (%.0f GFLOP/s)\n", f * 1e3, 2.0 * 4096 * 4096 * 4096 / f * 1e-9);
    }
    probe_free(t, p, 3);
    size_t an[] = {SZ(4096) * 512, SZ(4096) * 512, SZ(4096) * 512, SZ(4096) * 512, 4096,
                   SZ(4096) * 512, SZ(4096) * 512, SZ(4096) * 512};
    for (int pass = 0; pass < 2; pass++) {
        const target *at = pass ? flash : t;
        if (!at) break;
        if (probe_bufs(at, p, an, 8)) {
            double flop = 4.0 * 4096 * 4096 * 512;
            double f = time_best(at, probe_attn_fwd, p, 3, &err);
            double b = f < 0 ? -1 : time_best(at, probe_attn_bwd, p, 2, &err);
            if (f < 0 || b < 0) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
            printf("attention T=4096 d=512 (VAE mid block at 512x512), %s: forward %.2f ms (%.0f GFLOP/s), "
                   "backward %.2f ms\n",
                   pass ? "flash kernel" : "default", f * 1e3, flop / f * 1e-9, b * 1e3);
        }
        probe_free(at, p, 8);
    }
    sd_vae v;
    sd_vae_config cfg = selftest_vae_arch();
    if (sd_vae_build(&v, &cfg, &err)) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
    selftest_fill(v.w.data, v.w.total, 77, -0.02f, 0.02f);
    int lh, lw;
    sd_vae_latent_size(&cfg, 512, 512, &lh, &lw);
    size_t vn[] = {v.w.total, SZ(3) * 512 * 512, SZ(4) * lh * lw, SZ(4) * lh * lw,
                   sd_vae_workspace_floats(&v, 1, 512, 512)};
    int rc = 0;
    if (probe_bufs(t, p, vn, 5)) {
        t->be->h2d(t->ex, p[0], v.w.data, v.w.total * sizeof(float));
        double best = 1e30;
        for (int r = 0; r < 4 && !rc; r++) {
            double t0 = sd_now();
            if (sd_vae_encode_on(&v, t->be, t->ex, p[0], 1, 512, 512, p[1], p[2], p[3], p[4], &err)) rc = 1;
            double d = sd_now() - t0;
            if (r > 0 && d < best) best = d; /* run 0 warms up (algorithm choice, allocations) */
        }
        if (rc) fprintf(stderr, "sd-selftest: probe VAE: %s\n", err.msg);
        else printf("VAE encode 512x512 (SD architecture, fp32): %.1f ms per image, %.1f images/s\n", best * 1e3,
                    1.0 / best);
    }
    probe_free(t, p, 5);
    sd_vae_free(&v);
    return rc;
}
