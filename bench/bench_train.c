/* UNet training-step benchmark (bench_train.sh runs it): load a UNet
 * (diffusers folder), then time STEPS training steps on fixed inputs, each
 * one micro-batch (forward, MSE against the noise, backward) plus the
 * optimizer step (global-norm clipping at 1, AdamW) as sd-train does them,
 * after one warm-up step. The backend is the CPU table wrapped so every op
 * call is timed and summed per op class (conv, attention, linear, norm,
 * elementwise); the optimizer is timed on its own. Prints per-step seconds,
 * the best and the per-class split of the best step, and the warm-up
 * step's loss (to compare with PyTorch's on the same weights and inputs).
 * An SDXL UNet (text_time) also reads text.f32 (pooled text embedding) and
 * tids.f32 (time ids) from CTX.f32's folder (bench_train.py make DIR sdxl).
 * With DEVICE cuda:K (or cuda:K:tf32) the UNet runs on that GPU as
 * sd-train --device runs it; the op classes are not timed there (the
 * calls are asynchronous), only forward+backward and the optimizer step.
 * DEVICE may end in modes joined by '+': :tf32 (GPU), :bf16 (GPU: mixed
 * precision, sd-train --mixed-precision bf16), :blkN (GPU: attention's
 * score blocks of 2^N floats, sd_cuda_opts.attn_block), :flash (GPU:
 * attention on the flash kernel, sd-train --attn-flash), :ckpt (gradient
 * checkpointing), :m16 (AdamW moments in bf16, sd-train --adam-moments
 * bf16), e.g. cpu:ckpt or cuda:0:tf32+ckpt+m16. The activation
 * buffer's size is printed after the steps. BENCH_BATCH=N (default 1)
 * makes the micro-batch N copies of the one sample (bench_train.py reads
 * the same variable).
 * usage: bench_train UNET_DIR X0.f32 NOISE.f32 CTX.f32 H W T THREADS STEPS [DEVICE] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "dtype.h"
#include "progress.h"
#include "prof_backend.h"
#include "train.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

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

/* x (n floats) replaced by k copies of itself in a row; NULL when out of
 * memory (x freed). */
static float *repeat(float *x, size_t n, int k)
{
    float *y = realloc(x, n * (size_t)k * sizeof(float));
    if (!y) {
        free(x);
        return NULL;
    }
    for (int i = 1; i < k; i++) memcpy(y + (size_t)i * n, y, n * sizeof(float));
    return y;
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
    o.tf32 = mode && strstr(mode, "tf32") != NULL;
    o.mixed = mode && strstr(mode, "bf16") != NULL ? SD_DT_BF16 : 0;
    o.checkpointing = mode && strstr(mode, "ckpt") != NULL;
    o.moments = mode && strstr(mode, "m16") != NULL ? SD_DT_BF16 : SD_DT_F32;
    o.attn_flash = mode && strstr(mode, "flash") != NULL;
    const char *blk = mode ? strstr(mode, "blk") : NULL; /* blkN: attention score blocks of 2^N floats */
    if (blk) o.attn_block = (size_t)1 << atoi(blk + 3);
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
    const sd_backend *prof = prof_backend(tr.be);
    if (o.device < 0) tr.be = prof; /* a GPU: timed steps unprofiled, then one profiled step */
    size_t lat = (size_t)tr.unet.cfg.in_channels * (size_t)h * (size_t)w;
    const char *be_env = getenv("BENCH_BATCH");
    int nb = be_env ? atoi(be_env) : 1;
    if (nb < 1 || nb > 64) {
        fprintf(stderr, "bench_train: BENCH_BATCH must be 1..64\n");
        return 2;
    }
    size_t nctx = (size_t)tctx * (size_t)tr.unet.cfg.cross_dim;
    float *x0 = read_f32(argv[2], lat), *noise = read_f32(argv[3], lat);
    float *ctx = read_f32(argv[4], nctx);
    float *text = NULL, *tids = NULL;
    if (tr.unet.cfg.text_time) { /* SDXL: text.f32 and tids.f32 beside CTX.f32 (bench_train.py make DIR sdxl) */
        char path[4096];
        const char *slash = strrchr(argv[4], '/');
        int dir = slash ? (int)(slash - argv[4]) : 1;
        snprintf(path, sizeof path, "%.*s/text.f32", dir, slash ? argv[4] : ".");
        text = read_f32(path, (size_t)(tr.unet.cfg.add_in_dim - SD_UNET_TIME_IDS * tr.unet.cfg.add_time_dim));
        snprintf(path, sizeof path, "%.*s/tids.f32", dir, slash ? argv[4] : ".");
        tids = read_f32(path, SD_UNET_TIME_IDS);
    }
    size_t ntext = text ? (size_t)(tr.unet.cfg.add_in_dim - SD_UNET_TIME_IDS * tr.unet.cfg.add_time_dim) : 0;
    if (nb > 1 && (!(x0 = repeat(x0, lat, nb)) || !(noise = repeat(noise, lat, nb)) || !(ctx = repeat(ctx, nctx, nb)) ||
                   (text && (!(text = repeat(text, ntext, nb)) || !(tids = repeat(tids, SD_UNET_TIME_IDS, nb)))))) {
        fprintf(stderr, "bench_train: out of memory for a batch of %d\n", nb);
        return 1;
    }
    int t[64];
    for (int i = 0; i < nb; i++) t[i] = 500;
    double best = 1e30, best_cls[C_N + 1] = {0}, first_loss = 0;
    int profiled = o.device >= 0 ? steps + 1 : -1;
    for (int s = 0; s <= steps + (o.device >= 0); s++) { /* step 0: warm-up (page faults, allocation) */
        memset(tsum, 0, sizeof tsum);
        if (s == profiled) tr.be = prof;
        double loss, a = sd_now();
        if (sd_train_micro(&tr, nb, h, w, tctx, x0, ctx, text, tids, noise, t, 1.0, &loss, &err)) {
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
    printf("sdtk activations %.1f MiB%s, their gradients %.1f MiB\n", (double)tr.g.nact * 4 / 1048576.0,
           o.checkpointing ? " (gradient checkpointing)" : "", (double)tr.g.ndact * 4 / 1048576.0);
    if (o.device >= 0) {
#ifdef SDTK_HAVE_CUDA
        sd_cuda_mem mem;
        sd_cuda_get_mem(tr.exec, &mem);
        printf("sdtk device memory peak %.1f MiB (the caching allocator's)\n", (double)mem.peak / 1048576.0);
#endif
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
    free(text);
    free(tids);
    sd_trainer_close(&tr);
    return 0;
}
