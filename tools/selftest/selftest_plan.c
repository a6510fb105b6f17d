/* sd-selftest --plan: the VAE encoder's device memory per op at 512x512 and
 * 1024x1024, from the engine's own allocation plan (no GPU needed). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "attn_blocks.h"
#include "cli.h"
#include "err.h"
#include "selftest.h"

/* --plan: a backend that records every call sd_vae_encode_on makes, with
 * the bytes of the tensors it touches, instead of computing. */
enum { MAX_REC = 256 };
typedef struct {
    char op[96];
    size_t tensors, scratch; /* bytes: inputs + outputs + parameters; device scratch */
    int count;
} rec_row;

/* The calls recorded so far: the recording backend's exec context. */
typedef struct {
    rec_row row[MAX_REC];
    int n;
} recorder;

/* Add a call to the row of the same description (or a new row). */
static void rec_add(void *ex, const char *op, size_t tensors, size_t scratch)
{
    recorder *r = ex;
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->row[i].op, op) == 0) {
            r->row[i].count++;
            return;
        }
    if (r->n == MAX_REC) return;
    rec_row *w = &r->row[r->n++];
    snprintf(w->op, sizeof w->op, "%s", op);
    w->tensors = tensors;
    w->scratch = scratch;
    w->count = 1;
}

/* conv2d: input, output, weights, bias; scratch is the padded input copy
 * the CUDA backend makes for asymmetric padding (cuDNN's own workspace
 * comes on top, bounded by the context's limit). */
static void rec_conv(void *ex, const sd_conv2d_shape *s, float *y, const float *x, const float *w, const float *b)
{
    (void)y, (void)x, (void)w, (void)b;
    char d[96];
    size_t in = SZ(s->n) * SZ(s->cin) * SZ(s->h) * SZ(s->w);
    size_t out = SZ(s->n) * SZ(s->cout) * SZ(sd_conv2d_out_h(s)) * SZ(sd_conv2d_out_w(s));
    size_t par = SZ(s->cout) * SZ(s->cin) * SZ(s->kh) * SZ(s->kw) + SZ(s->cout);
    int asym = s->pad_t != s->pad_b || s->pad_l != s->pad_r;
    size_t pad = asym ? SZ(s->n) * SZ(s->cin) * SZ(s->h + s->pad_t + s->pad_b) * SZ(s->w + s->pad_l + s->pad_r) : 0;
    snprintf(d, sizeof d, "conv2d %dx%d%s %d->%d at %dx%d", s->kh, s->kw, s->stride > 1 ? " s2" : "", s->cin, s->cout,
             s->h, s->w);
    rec_add(ex, d, (in + out + par) * sizeof(float), pad * sizeof(float));
}

/* group norm: x, y (in place counts once), stats, affine; scratch is the
 * per-chunk partials of the CUDA kernels. */
static void rec_gn(void *ex, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x,
                   const float *gamma, const float *beta)
{
    (void)mean, (void)rstd, (void)gamma, (void)beta;
    char d[96];
    size_t units = SZ(s->n) * SZ(s->groups), m = SZ(s->c / s->groups) * SZ(s->hw), el = SZ(s->n) * SZ(s->c) * SZ(s->hw);
    size_t chunks = (m + 8191) / 8192;
    if (chunks > 1024) chunks = 1024;
    snprintf(d, sizeof d, "group_norm %d ch at %d px", s->c, s->hw);
    rec_add(ex, d, ((y == x ? 1 : 2) * el + 2 * units + 2 * SZ(s->c)) * sizeof(float), units * chunks * 3 * sizeof(float));
}

/* silu in place or not. */
static void rec_silu(void *ex, size_t n, float *y, const float *x)
{
    char d[96];
    snprintf(d, sizeof d, "silu %zu", n);
    rec_add(ex, d, (y == x ? 1 : 2) * n * sizeof(float), 0);
}

/* residual add: distinct buffers among y, a, b. */
static void rec_add_op(void *ex, size_t n, float *y, const float *a, const float *b)
{
    char d[96];
    snprintf(d, sizeof d, "add %zu", n);
    rec_add(ex, d, (1 + (a != y) + (b != y && b != a)) * n * sizeof(float), 0);
}

/* linear: x, y, w, b. */
static void rec_linear(void *ex, const sd_linear_shape *s, float *y, const float *x, const float *w, const float *b)
{
    (void)y, (void)x, (void)w, (void)b;
    char d[96];
    snprintf(d, sizeof d, "linear %dx%d->%d", s->m, s->k, s->n);
    rec_add(ex, d, (SZ(s->m) * SZ(s->k) + SZ(s->m) * SZ(s->n) + SZ(s->n) * SZ(s->k) + SZ(s->n)) * sizeof(float), 0);
}

/* attention: q, k, v, y, lse; the score block in scratch. */
static void rec_attn(void *ex, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                     const float *v)
{
    (void)y, (void)lse, (void)q, (void)k, (void)v;
    char d[96];
    size_t bh = SZ(s->b) * SZ(s->heads);
    snprintf(d, sizeof d, "attention T=%d d=%d", s->tq, s->d);
    /* scratch: one block of scores (attn_blocks.h), the cuBLAS path's */
    rec_add(ex, d, (bh * (2 * SZ(s->tq) + 2 * SZ(s->tk)) * SZ(s->d) + bh * SZ(s->tq)) * sizeof(float),
            sd_attn_block_bytes(s, 0));
}

/* transpose: in and out. */
static void rec_transpose(void *ex, int n, int rows, int cols, float *y, const float *x)
{
    (void)y, (void)x;
    char d[96];
    snprintf(d, sizeof d, "transpose %dx%d", rows, cols);
    rec_add(ex, d, 2 * SZ(n) * SZ(rows) * SZ(cols) * sizeof(float), 0);
}

/* posterior std. */
static void rec_gstd(void *ex, size_t n, float *y, const float *x)
{
    char d[96];
    snprintf(d, sizeof d, "gauss_std %zu", n);
    rec_add(ex, d, (y == x ? 1 : 2) * n * sizeof(float), 0);
}

/* device copy of the mean. */
static void rec_d2d(void *ex, void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src;
    char d[96];
    snprintf(d, sizeof d, "copy %zu bytes", bytes);
    rec_add(ex, d, 2 * bytes, 0);
}

/* Nothing is queued, nothing fails. */
static sd_status rec_sync(void *ex, sd_error *err)
{
    (void)ex, (void)err;
    return SD_OK;
}

static const sd_backend rec_backend = {.name = "plan",
                                       .d2d = rec_d2d,
                                       .sync = rec_sync,
                                       .conv2d_fwd = rec_conv,
                                       .group_norm_fwd = rec_gn,
                                       .linear_fwd = rec_linear,
                                       .silu_fwd = rec_silu,
                                       .add_fwd = rec_add_op,
                                       .attn_fwd = rec_attn,
                                       .transpose_fwd = rec_transpose,
                                       .gauss_std_fwd = rec_gstd};

/* Bytes as MiB. */
double selftest_mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* The memory plan of one resolution: every op of the SD VAE encoder with
 * its tensors, the workspace the engine allocates, and the batch sizes
 * that fit a 24 GB and an 80 GB card. Nothing runs: the recording backend
 * walks sd_vae_encode_on's calls over a reserved, never touched address
 * range. */
static int plan_one(sd_vae *v, int res, size_t conv_ws_cap)
{
    size_t wsf = sd_vae_workspace_floats(v, 1, res, res), wbytes = v->w.total * sizeof(float);
    int lh, lw;
    sd_vae_latent_size(&v->cfg, res, res, &lh, &lw);
    size_t in_img = SZ(3) * res * res * sizeof(float);
    size_t out_img = 2 * SZ(v->cfg.latent_channels) * lh * lw * sizeof(float);
    size_t span = wsf * sizeof(float) + in_img + out_img + 4096;
    char *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return fprintf(stderr, "sd-selftest: cannot reserve %zu bytes of address space\n", span), 1;
    float *ws = (float *)(void *)base, *x = ws + wsf, *mean = x + SZ(3) * res * res;
    float *std = mean + SZ(v->cfg.latent_channels) * lh * lw;
    recorder rec = {.n = 0};
    sd_error err = {0};
    sd_status st = sd_vae_encode_on(v, &rec_backend, &rec, v->w.data, 1, res, res, x, mean, std, ws, &err);
    munmap(base, span);
    if (st) return fprintf(stderr, "sd-selftest: plan: %s\n", err.msg), 1;
    size_t scratch = 0, peak_op = 0;
    printf("\n## %dx%d (latent %dx%d)\n\n", res, res, lh, lw);
    printf("| op (SD VAE encoder, one image) | calls | tensors MiB | CUDA scratch MiB |\n|---|---|---|---|\n");
    for (int i = 0; i < rec.n; i++) {
        const rec_row *w = &rec.row[i];
        printf("| %s | %d | %.1f | %.1f |\n", w->op, w->count, selftest_mib(w->tensors), selftest_mib(w->scratch));
        if (w->scratch > scratch) scratch = w->scratch;
        if (w->tensors > peak_op) peak_op = w->tensors;
    }
    size_t ctx = (size_t)1 << 30; /* CUDA context, cuBLAS and cuDNN handles and kernels: about 1 GiB */
    size_t wsb = wsf * sizeof(float), io = in_img + out_img, fixed = ctx + wbytes + conv_ws_cap;
    printf("\nweights %.1f MiB; engine workspace (sd_vae_workspace_floats) %.1f MiB; largest single op %.1f MiB; "
           "CUDA scratch %.1f MiB + cuDNN workspace <= %.0f MiB; per image in + out %.2f MiB\n",
           selftest_mib(wbytes), selftest_mib(wsf * sizeof(float)), selftest_mib(peak_op), selftest_mib(scratch),
           selftest_mib(conv_ws_cap), selftest_mib(io));
    printf("device total for one image at a time: %.2f GiB (with ~1 GiB for the CUDA context)\n",
           (double)(fixed + wsb + scratch + io) / (1 << 30));
    const double cards[2] = {24e9, 80e9};
    for (int k = 0; k < 2; k++) {
        /* 5% left for fragmentation of the caching allocator */
        double avail = cards[k] * 0.95 - (double)fixed;
        double one_at_a_time = (avail - (double)(wsb + scratch)) / (double)io;
        double batched = avail / (double)(wsb + scratch + io);
        printf("%2.0f GB card: sd_vae_encode as it is (one image at a time; a batch adds only its input and output "
               "buffers): %.0f images per batch fit; if the encoder ran n images at once (workspace and scratch x "
               "n): n <= %.0f\n",
               cards[k] / 1e9, one_at_a_time > 0 ? floor(one_at_a_time) : 0.0, batched > 0 ? floor(batched) : 0.0);
    }
    return 0;
}

/* --plan for 512^2 and 1024^2. */
int selftest_plan(size_t conv_ws_cap)
{
    sd_vae v;
    sd_error err = {0};
    sd_vae_config cfg = selftest_vae_arch();
    if (sd_vae_build(&v, &cfg, &err)) return fprintf(stderr, "sd-selftest: %s\n", err.msg), SD_EXIT_FATAL;
    printf("# sd-selftest --plan: VAE encoder memory from the engine's allocation plan\n");
    int rc = plan_one(&v, 512, conv_ws_cap) || plan_one(&v, 1024, conv_ws_cap);
    sd_vae_free(&v);
    return rc ? SD_EXIT_FATAL : SD_EXIT_OK;
}
