/* UNet training-step benchmark (bench_train.sh runs it): load a UNet
 * (diffusers folder), then time STEPS training steps on fixed inputs, each
 * one micro-batch (forward, MSE against the noise, backward) plus the
 * optimizer step (global-norm clipping at 1, AdamW) as sd-train does them,
 * after one warm-up step. The backend is the CPU table wrapped so every op
 * call is timed and summed per op class (conv, attention, linear, norm,
 * elementwise); the optimizer is timed on its own. Prints per-step seconds,
 * the best and the per-class split of the best step, and the warm-up
 * step's loss (to compare with PyTorch's on the same weights and inputs).
 * With DEVICE cuda:K (or cuda:K:tf32) the UNet runs on that GPU as
 * sd-train --device runs it; the op classes are not timed there (the
 * calls are asynchronous), only forward+backward and the optimizer step.
 * usage: bench_train UNET_DIR X0.f32 NOISE.f32 CTX.f32 H W T THREADS STEPS [DEVICE] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "progress.h"
#include "train.h"

enum { C_CONV, C_ATTN, C_LINEAR, C_NORM, C_ELEM, C_N };
static const char *const class_name[C_N] = {"conv", "attention", "linear", "norm", "elementwise"};
static double tsum[C_N];
static sd_backend real, prof;

/* A device op has finished when its time is read. */
static void sync_now(void *exec)
{
    real.sync(exec, NULL);
}

#define W(cls, name, P, A)                \
    static void w_##name P                \
    {                                     \
        double t0 = sd_now();             \
        real.name A;                      \
        if (real.is_device) sync_now(e);  \
        tsum[cls] += sd_now() - t0;       \
    }
#define FP float *
#define CF const float *
W(C_CONV, conv2d_fwd, (void *e, const sd_conv2d_shape *s, FP a, CF b, CF c, CF d), (e, s, a, b, c, d))
W(C_CONV, conv2d_bwd, (void *e, const sd_conv2d_shape *s, FP a, FP b, FP c, CF d, CF f, CF g), (e, s, a, b, c, d, f, g))
W(C_NORM, group_norm_fwd, (void *e, const sd_gn_shape *s, FP a, FP b, FP c, CF d, CF f, CF g), (e, s, a, b, c, d, f, g))
W(C_NORM, group_norm_bwd, (void *e, const sd_gn_shape *s, FP a, FP b, FP c, CF d, CF f, CF g, CF h, CF i),
  (e, s, a, b, c, d, f, g, h, i))
W(C_LINEAR, linear_fwd, (void *e, const sd_linear_shape *s, FP a, CF b, CF c, CF d), (e, s, a, b, c, d))
W(C_LINEAR, linear_bwd, (void *e, const sd_linear_shape *s, FP a, FP b, FP c, CF d, CF f, CF g),
  (e, s, a, b, c, d, f, g))
W(C_ELEM, silu_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, silu_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, add_fwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, add_bwd, (void *e, size_t n, FP a, FP b, CF c), (e, n, a, b, c))
W(C_ELEM, upsample2x_fwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ELEM, upsample2x_bwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ATTN, attn_fwd, (void *e, const sd_attn_shape *s, FP a, FP b, CF c, CF d, CF f), (e, s, a, b, c, d, f))
W(C_ATTN, attn_bwd, (void *e, const sd_attn_shape *s, FP a, FP b, FP c, CF d, CF f, CF g, CF h, CF i, CF j),
  (e, s, a, b, c, d, f, g, h, i, j))
W(C_NORM, layer_norm_fwd, (void *e, const sd_ln_shape *s, FP a, FP b, FP c, CF d, CF f, CF g), (e, s, a, b, c, d, f, g))
W(C_NORM, layer_norm_bwd, (void *e, const sd_ln_shape *s, FP a, FP b, FP c, CF d, CF f, CF g, CF h, CF i),
  (e, s, a, b, c, d, f, g, h, i))
W(C_ELEM, gelu_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, gelu_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, quick_gelu_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, quick_gelu_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, geglu_fwd, (void *e, size_t n, size_t m, FP a, CF b), (e, n, m, a, b))
W(C_ELEM, geglu_bwd, (void *e, size_t n, size_t m, FP a, CF b, CF c), (e, n, m, a, b, c))
W(C_ELEM, scale_fwd, (void *e, size_t n, FP a, CF b, float x), (e, n, a, b, x))
W(C_ELEM, scale_bwd, (void *e, size_t n, FP a, CF b, float x), (e, n, a, b, x))
W(C_ELEM, mul_fwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, mul_bwd, (void *e, size_t n, FP a, FP b, CF c, CF d, CF f), (e, n, a, b, c, d, f))
W(C_ELEM, concat_fwd, (void *e, const sd_concat_shape *s, FP a, CF b, CF c), (e, s, a, b, c))
W(C_ELEM, concat_bwd, (void *e, const sd_concat_shape *s, FP a, FP b, CF c), (e, s, a, b, c))
W(C_ELEM, add_bcast_channel_fwd, (void *e, int x, int y, int z, FP a, CF b, CF c), (e, x, y, z, a, b, c))
W(C_ELEM, add_bcast_channel_bwd, (void *e, int x, int y, int z, FP a, FP b, CF c), (e, x, y, z, a, b, c))
W(C_ELEM, timestep_emb_fwd, (void *e, const sd_temb_shape *s, FP a, CF b), (e, s, a, b))
W(C_ELEM, timestep_emb_bwd, (void *e, const sd_temb_shape *s, FP a, CF b, CF c), (e, s, a, b, c))
W(C_ELEM, transpose_fwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ELEM, transpose_bwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ELEM, gauss_std_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, gauss_std_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, embedding_fwd, (void *e, const sd_embedding_shape *s, FP a, const int32_t *b, CF c, CF d), (e, s, a, b, c, d))
W(C_ELEM, embedding_bwd, (void *e, const sd_embedding_shape *s, FP a, FP b, CF c, const int32_t *d), (e, s, a, b, c, d))

/* A backend's table with every op it has replaced by its timed wrapper
 * (on a device each op is waited for, so the classes add up to the step). */
static void make_prof(const sd_backend *be)
{
    real = *be;
    prof = real;
#define P(name) \
    if (real.name) prof.name = w_##name
    P(conv2d_fwd); P(conv2d_bwd); P(group_norm_fwd); P(group_norm_bwd); P(linear_fwd); P(linear_bwd);
    P(silu_fwd); P(silu_bwd); P(add_fwd); P(add_bwd); P(upsample2x_fwd); P(upsample2x_bwd); P(attn_fwd);
    P(attn_bwd); P(layer_norm_fwd); P(layer_norm_bwd); P(gelu_fwd); P(gelu_bwd); P(quick_gelu_fwd);
    P(quick_gelu_bwd); P(geglu_fwd); P(geglu_bwd); P(scale_fwd); P(scale_bwd); P(mul_fwd); P(mul_bwd);
    P(concat_fwd); P(concat_bwd); P(add_bcast_channel_fwd); P(add_bcast_channel_bwd); P(timestep_emb_fwd);
    P(timestep_emb_bwd); P(transpose_fwd); P(transpose_bwd); P(gauss_std_fwd); P(gauss_std_bwd);
    P(embedding_fwd); P(embedding_bwd);
#undef P
}

static float *read_f32(const char *path, size_t n)
{
    float *x = malloc(n * sizeof(float));
    FILE *f = fopen(path, "rb");
    if (!x || !f || fread(x, sizeof(float), n, f) != n) {
        fprintf(stderr, "bench_train: cannot read %zu floats from %s\n", n, path);
        exit(1);
    }
    fclose(f);
    return x;
}

int main(int argc, char **argv)
{
    if (argc != 10 && argc != 11) {
        fprintf(stderr, "usage: bench_train UNET_DIR X0.f32 NOISE.f32 CTX.f32 H W T THREADS STEPS [DEVICE]\n");
        return 2;
    }
    int h = atoi(argv[5]), w = atoi(argv[6]), tctx = atoi(argv[7]), threads = atoi(argv[8]), steps = atoi(argv[9]);
    if (h < 8 || w < 8 || tctx < 1 || threads < 1 || steps < 1 || steps > 100) return 2;
    sd_train_opts o;
    sd_train_opts_default(&o);
    o.unet = argv[1];
    o.threads = threads;
    o.out_dir = "/nonexistent-bench-train";
    o.quiet = 1;
    const char *dev = argc > 10 ? argv[10] : "cpu";
    char base[32];
    snprintf(base, sizeof base, "%s", dev);
    char *mode = strchr(base + (strncmp(base, "cuda:", 5) == 0 ? 5 : 0), ':');
    if (mode) *mode++ = 0;
    o.tf32 = mode && strcmp(mode, "tf32") == 0;
    if (sd_cli_parse_device(base, &o.device)) {
        fprintf(stderr, "bench_train: bad device %s\n", dev);
        return 2;
    }
    sd_trainer tr;
    sd_error err = {0};
    double t0 = sd_now();
    if (sd_trainer_open(&tr, &o, &err)) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "bench_train: loaded %zu parameters in %.1f s\n", tr.unet.w.total, sd_now() - t0);
    make_prof(tr.be);
    if (o.device < 0) tr.be = &prof; /* a GPU: timed steps unprofiled, then one profiled step */
    size_t lat = (size_t)tr.unet.cfg.in_channels * (size_t)h * (size_t)w;
    float *x0 = read_f32(argv[2], lat), *noise = read_f32(argv[3], lat);
    float *ctx = read_f32(argv[4], (size_t)tctx * (size_t)tr.unet.cfg.cross_dim);
    int t = 500;
    double best = 1e30, best_cls[C_N + 1] = {0}, first_loss = 0;
    int profiled = o.device >= 0 ? steps + 1 : -1;
    for (int s = 0; s <= steps + (o.device >= 0); s++) { /* step 0: warm-up (page faults, allocation) */
        memset(tsum, 0, sizeof tsum);
        if (s == profiled) tr.be = &prof;
        double loss, a = sd_now();
        if (sd_train_micro(&tr, 1, h, w, tctx, x0, ctx, NULL, NULL, noise, &t, 1.0, &loss, &err)) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        double b = sd_now();
        sd_train_apply(&tr);
        if (tr.be->sync(tr.exec, &err)) { /* a GPU's AdamW has finished when the step's time is read */
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        double c = sd_now(), total = c - a;
        if (s == 0) first_loss = loss;
        printf("sdtk step %d%s: %.3f s (forward+backward %.3f s, clip+AdamW %.3f s), loss %.6f\n", s,
               s == profiled ? " (profiled: every op waited for)" : s ? "" : " (warm-up)", total, b - a, c - b, loss);
        if (s == profiled) {
            printf("sdtk %s profiled step by op class:", dev);
            for (int k = 0; k < C_N; k++) printf(" %s %.3f s,", class_name[k], tsum[k]);
            printf(" optimizer %.3f s\n", c - b);
        }
        if (s > 0 && s != profiled && total < best) {
            best = total;
            memcpy(best_cls, tsum, sizeof tsum);
            best_cls[C_N] = c - b;
        }
    }
    if (o.device >= 0) {
        printf("sdtk %s best %.3f s (optimizer %.3f s)\n", dev, best, best_cls[C_N]);
        printf("sdtk best %.3f s\n", best);
        printf("sdtk warm-up loss %.6f\n", first_loss);
        goto done;
    }
    double other = best - best_cls[C_N];
    printf("sdtk best %.3f s; by op class:", best);
    for (int k = 0; k < C_N; k++) {
        printf(" %s %.2f s (%.0f%%),", class_name[k], best_cls[k], 100 * best_cls[k] / best);
        other -= best_cls[k];
    }
    printf(" optimizer %.2f s (%.0f%%), other %.2f s\n", best_cls[C_N], 100 * best_cls[C_N] / best, other);
    printf("sdtk warm-up loss %.6f\n", first_loss);
done:
    free(x0);
    free(noise);
    free(ctx);
    sd_trainer_close(&tr);
    return 0;
}
