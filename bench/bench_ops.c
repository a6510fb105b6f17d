/* Per-layer times of the engine's heavy CPU ops on the representative
 * SD-VAE encoder layers at a 512x512 input (the same list, order and output
 * format as bench_ops_torch.py, its PyTorch peer): best of REPEATS after one
 * warm-up, in ms. --bwd adds backward (all gradients), --ref times the
 * direct-loop reference ops instead (slow: use REPEATS 1), --only N runs
 * layer N alone (0-based), --conv CIN COUT HW runs one 3x3 pad-1 conv of
 * that shape instead, --cpu reports the calling thread's CPU time rather
 * than wall time (with 1 thread: steadier while others load the machine).
 * --adamw N times one AdamW step over N weights with fp32 moments and with
 * bf16 moments (stochastic rounding; sd-train --adam-moments bf16) instead.
 * usage: bench_ops THREADS REPEATS [--bwd] [--ref] [--cpu] [--only N] [--linear M K N]
 *                  [--conv CIN COUT HW] [--attn HEADS TQ TK D] [--adamw N] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops_cpu.h"
#include "ops_ref.h"

typedef struct {
    const char *name;
    int kind; /* 0 conv, 1 three linears (q, k, v), 2 attention */
    sd_conv2d_shape conv;
} layer;

static int use_ref, use_cpu;
static uint64_t rng = 88172645463325252ull;

/* Seconds on the monotonic clock, or of this thread's CPU time. */
static double now(void)
{
    struct timespec t;
    clock_gettime(use_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* n floats uniform in [-scale, scale) (xorshift64), exiting on no memory. */
static float *rnd(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_ops: out of memory\n");
        exit(3);
    }
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        p[i] = ((float)(rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
    return p;
}

/* A 3x3 (or kxk) conv layer of the VAE encoder, one image. */
static layer conv(const char *name, int cin, int cout, int hw, int k, int stride, int pt, int pb)
{
    return (layer){.name = name, .conv = {.n = 1, .cin = cin, .h = hw, .w = hw, .cout = cout, .kh = k, .kw = k,
                                          .stride = stride, .pad_t = pt, .pad_b = pb, .pad_l = pt, .pad_r = pb}};
}

/* All buffers of one layer: inputs, weights, outputs and gradients. */
typedef struct {
    float *x, *w, *b, *y, *dy, *dx, *dw, *db;
    float *wq[3], *bq[3], *yq[3], *dyq[3], *dwq[3], *dbq[3];
    float *q, *k, *v, *lse, *dq, *dk, *dv;
} bufs;

static sd_linear_shape lin = {.m = 4096, .k = 512, .n = 512};
static sd_attn_shape att = {.b = 1, .heads = 1, .tq = 4096, .tk = 4096, .d = 512, .scale = 0.04419417f};

/* One forward (bwd = 0) or backward (bwd = 1) run of layer l. */
static void run(sd_pool *pool, const layer *l, bufs *B, int bwd)
{
    if (l->kind == 0) {
        if (!bwd)
            (use_ref ? sd_conv2d_fwd_ref : sd_conv2d_fwd)(pool, &l->conv, B->y, B->x, B->w, B->b);
        else
            (use_ref ? sd_conv2d_bwd_ref : sd_conv2d_bwd)(pool, &l->conv, B->dx, B->dw, B->db, B->dy, B->x, B->w);
    } else if (l->kind == 1) {
        for (int i = 0; i < 3; i++) {
            if (!bwd)
                (use_ref ? sd_linear_fwd_ref : sd_linear_fwd)(pool, &lin, B->yq[i], B->x, B->wq[i], B->bq[i]);
            else
                (use_ref ? sd_linear_bwd_ref : sd_linear_bwd)(pool, &lin, B->dx, B->dwq[i], B->dbq[i], B->dyq[i],
                                                              B->x, B->wq[i]);
        }
    } else if (!bwd) {
        (use_ref ? sd_attn_fwd_ref : sd_attn_fwd)(pool, &att, B->y, B->lse, B->q, B->k, B->v);
    } else {
        (use_ref ? sd_attn_bwd_ref : sd_attn_bwd)(pool, &att, B->dq, B->dk, B->dv, B->dy, B->q, B->k, B->v, B->y,
                                                  B->lse);
    }
}

/* Allocate and fill the buffers layer l needs (weights scaled like a
 * default init so activations stay O(1)). */
static void setup(const layer *l, bufs *B)
{
    memset(B, 0, sizeof *B);
    if (l->kind == 0) {
        const sd_conv2d_shape *s = &l->conv;
        size_t nx = (size_t)s->n * s->cin * s->h * s->w, nw = (size_t)s->cout * s->cin * s->kh * s->kw;
        size_t ny = (size_t)s->n * s->cout * sd_conv2d_out_h(s) * sd_conv2d_out_w(s);
        B->x = rnd(nx, 1.0f);
        B->w = rnd(nw, 1.0f / sqrtf((float)(nw / (size_t)s->cout)));
        B->b = rnd((size_t)s->cout, 0.1f);
        B->y = rnd(ny, 0.0f);
        B->dy = rnd(ny, 1.0f);
        B->dx = rnd(nx, 0.0f);
        B->dw = rnd(nw, 0.0f);
        B->db = rnd((size_t)s->cout, 0.0f);
    } else if (l->kind == 1) {
        B->x = rnd((size_t)lin.m * lin.k, 1.0f);
        B->dx = rnd((size_t)lin.m * lin.k, 0.0f);
        for (int i = 0; i < 3; i++) {
            B->wq[i] = rnd((size_t)lin.n * lin.k, 0.044f);
            B->bq[i] = rnd((size_t)lin.n, 0.1f);
            B->yq[i] = rnd((size_t)lin.m * lin.n, 0.0f);
            B->dyq[i] = rnd((size_t)lin.m * lin.n, 1.0f);
            B->dwq[i] = rnd((size_t)lin.n * lin.k, 0.0f);
            B->dbq[i] = rnd((size_t)lin.n, 0.0f);
        }
    } else {
        size_t n = (size_t)att.b * att.heads * att.tq * att.d, nk = (size_t)att.b * att.heads * att.tk * att.d;
        B->q = rnd(n, 1.0f);
        B->k = rnd(nk, 1.0f);
        B->v = rnd(nk, 1.0f);
        B->y = rnd(n, 0.0f);
        B->dy = rnd(n, 1.0f);
        B->dq = rnd(n, 0.0f);
        B->dk = rnd(nk, 0.0f);
        B->dv = rnd(nk, 0.0f);
        B->lse = rnd((size_t)att.b * att.heads * att.tq, 0.0f);
    }
}

/* Free what setup allocated (free(NULL) is fine for the unused ones). */
static void teardown(bufs *B)
{
    float **all = (float **)B;
    for (size_t i = 0; i < sizeof *B / sizeof(float *); i++) free(all[i]);
}

/* Best wall time of reps runs after one warm-up, in ms. */
static double best_ms(sd_pool *pool, const layer *l, bufs *B, int bwd, int reps)
{
    run(pool, l, B, bwd);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now();
        run(pool, l, B, bwd);
        t = now() - t;
        if (t < best) best = t;
    }
    return best * 1e3;
}

/* One AdamW step over n weights, fp32 moments against bf16 moments: best
 * of reps, ms, and the bytes each moves per weight (28 and 20). */
static int bench_adamw(sd_pool *pool, size_t n, int reps)
{
    float *p = rnd(n, 1), *g = rnd(n, 1), *m = rnd(n, 0.1f), *v = rnd(n, 0.01f);
    uint16_t *m16 = malloc(n * sizeof(uint16_t)), *v16 = malloc(n * sizeof(uint16_t));
    if (!m16 || !v16) {
        fprintf(stderr, "bench_ops: out of memory for %zu bf16 moments\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        v[i] = fabsf(v[i]);
        uint32_t a, b;
        memcpy(&a, &m[i], 4);
        memcpy(&b, &v[i], 4);
        m16[i] = (uint16_t)(a >> 16);
        v16[i] = (uint16_t)(b >> 16);
    }
    sd_adamw_args a = {.decay = 0.9999f, .b1 = 0.9f, .b2 = 0.999f, .step_size = 1e-4f, .bc2_sqrt = 0.03f,
                       .eps = 1e-8f, .gscale = 1.0f, .sr_key = 1};
    double best[3] = {1e30, 1e30, 1e30}, ss = 0;
    for (int r = 0; r <= reps; r++) { /* round 0 warms up */
        for (int k = 0; k < 2; k++) {
            double t0 = now();
            if (k) sd_adamw_bf16_fwd(pool, &a, n, 0, p, m16, v16, g);
            else sd_adamw_fwd(pool, &a, n, p, m, v, g);
            double dt = now() - t0;
            if (r > 0 && dt < best[k]) best[k] = dt;
            a.sr_key++;
        }
        double t0 = now();
        ss += sd_sum_squares(pool, n, g); /* the clipping's norm, which precedes every step */
        double dt = now() - t0;
        if (r > 0 && dt < best[2]) best[2] = dt;
    }
    printf("adamw %zu weights: fp32 moments %.1f ms (%.1f GB/s), bf16 moments %.1f ms (%.1f GB/s), bf16/fp32 %.2fx "
           "time\n",
           n, best[0] * 1e3, 28.0 * n / best[0] * 1e-9, best[1] * 1e3, 20.0 * n / best[1] * 1e-9, best[1] / best[0]);
    printf("sum of squares %zu floats: %.1f ms (%.1f GB/s; %g)\n", n, best[2] * 1e3, 4.0 * n / best[2] * 1e-9, ss);
    free(p);
    free(g);
    free(m);
    free(v);
    free(m16);
    free(v16);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_ops THREADS REPEATS [--bwd] [--ref] [--cpu] [--only N] [--conv CIN COUT HW] [--attn HEADS TQ TK D] [--linear M K N]\n");
        return 2;
    }
    int threads = atoi(argv[1]), reps = atoi(argv[2]), bwd = 0, only = -1, custom[3] = {0, 0, 0};
    long adamw_n = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--bwd")) bwd = 1;
        else if (!strcmp(argv[i], "--ref")) use_ref = 1;
        else if (!strcmp(argv[i], "--cpu")) use_cpu = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--conv") && i + 3 < argc)
            for (int k = 0; k < 3; k++) custom[k] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--linear") && i + 3 < argc) {
            lin.m = atoi(argv[++i]);
            lin.k = atoi(argv[++i]);
            lin.n = atoi(argv[++i]);
            if (lin.m < 1 || lin.k < 1 || lin.n < 1) return 2;
            only = 6;
        } else if (!strcmp(argv[i], "--adamw") && i + 1 < argc) {
            adamw_n = atol(argv[++i]);
            if (adamw_n < 1) return 2;
        } else if (!strcmp(argv[i], "--attn") && i + 4 < argc) {
            att.heads = atoi(argv[++i]);
            att.tq = atoi(argv[++i]);
            att.tk = atoi(argv[++i]);
            att.d = atoi(argv[++i]);
            if (att.heads < 1 || att.tq < 1 || att.tk < 1 || att.d < 1) return 2;
            att.scale = 1.0f / sqrtf((float)att.d);
            only = 7;
        }
        else {
            fprintf(stderr, "bench_ops: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    layer layers[] = {
        conv("conv_in 3->128 @512", 3, 128, 512, 3, 1, 1, 1),
        conv("conv 128->128 @512", 128, 128, 512, 3, 1, 1, 1),
        conv("down 128 s2 @512->256", 128, 128, 512, 3, 2, 0, 1),
        conv("conv 256->256 @128", 256, 256, 128, 3, 1, 1, 1),
        conv("conv 512->512 @64", 512, 512, 64, 3, 1, 1, 1),
        conv("conv1x1 128->256 @256", 128, 256, 256, 1, 1, 0, 0),
        {.name = "linear qkv 3x 512 T4096", .kind = 1},
        {.name = "sdpa T4096 d512", .kind = 2},
    };
    char attn_name[64], lin_name[64];
    if (only == 6 && lin.k != 512) {
        snprintf(lin_name, sizeof lin_name, "linear 3x %dx%d->%d", lin.m, lin.k, lin.n);
        layers[6].name = lin_name;
    }
    if (only == 7 && att.d != 512) {
        snprintf(attn_name, sizeof attn_name, "sdpa %dh T%d x %d d%d", att.heads, att.tq, att.tk, att.d);
        layers[7].name = attn_name;
    }
    if (custom[0] > 0 && custom[1] > 0 && custom[2] > 0) {
        layers[0] = conv("conv (--conv)", custom[0], custom[1], custom[2], 3, 1, 1, 1);
        only = 0;
    }
    sd_pool *pool = sd_pool_create(threads);
    if (!pool) return 3;
    if (adamw_n > 0) {
        int rc = bench_adamw(pool, (size_t)adamw_n, reps);
        sd_pool_destroy(pool);
        return rc;
    }
    for (int i = 0; i < (int)(sizeof layers / sizeof layers[0]); i++) {
        if (only >= 0 && i != only) continue;
        bufs B;
        setup(&layers[i], &B);
        printf("%-26s fwd %9.1f ms", layers[i].name, best_ms(pool, &layers[i], &B, 0, reps));
        if (bwd) printf("  bwd %9.1f ms", best_ms(pool, &layers[i], &B, 1, reps));
        printf("\n");
        fflush(stdout);
        teardown(&B);
    }
    sd_pool_destroy(pool);
    return 0;
}
