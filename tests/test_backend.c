/* The backend boundary (backend.h): every table entry is filled (CPU, and
 * the CUDA table when the build has one: no GPU needed to read a table;
 * optional entries on the CPU only),
 * the CPU memory entries, calls through the table equal direct calls, and
 * the two ops the VAE needed to stop touching tensor memory itself
 * (transpose, posterior std) against plain loops and finite differences,
 * bit-identical for 1 and 3 threads, and the VAE runner (host buffers in,
 * the backend's memory inside) equal to sd_vae_encode bit for bit. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_blocks.h"
#include "backend.h"
#include "check.h"
#include "ops_math.h"
#include "plan_backend.h"
#include "safetensors.h"
#include "vae.h"
#ifndef GOLDEN_VAE
#define GOLDEN_VAE "tests/golden/vae/sd"
#endif
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

/* Every entry of the table, by name: adding a member to sd_backend
 * without listing it here fails the size check below. */
#define ENTRIES(X)                                                                                                   \
    X(alloc) X(release) X(h2d) X(d2h) X(d2d) X(zero) X(sync) X(conv2d_fwd) X(conv2d_bwd) X(group_norm_fwd)          \
    X(group_norm_bwd) X(linear_fwd) X(linear_bwd) X(silu_fwd) X(silu_bwd) X(add_fwd) X(add_bwd) X(upsample2x_fwd)  \
    X(upsample2x_bwd) X(attn_fwd) X(attn_bwd) X(layer_norm_fwd) X(layer_norm_bwd) X(gelu_fwd) X(gelu_bwd)           \
    X(quick_gelu_fwd) X(quick_gelu_bwd) X(geglu_fwd) X(geglu_bwd) X(scale_fwd) X(scale_bwd) X(mul_fwd) X(mul_bwd)   \
    X(concat_fwd) X(concat_bwd) X(add_bcast_channel_fwd) X(add_bcast_channel_bwd) X(timestep_emb_fwd)              \
    X(timestep_emb_bwd) X(transpose_fwd) X(transpose_bwd) X(gauss_std_fwd) X(gauss_std_bwd) X(embedding_fwd)       \
    X(embedding_bwd) X(sum_squares) X(adamw) X(adamw_bf16) X(ema) \
    X(adamw8) X(adafactor) X(bf16_widen) X(bf16_store_sr)
/* Entries a backend may leave NULL (backend.h: the caller falls back, or
 * refuses, as the VAE does 16-bit activations without the *_st ops). */
#define OPTIONAL_ENTRIES(X)                                                                                          \
    X(attn_rows_fwd) X(linear_act_fwd) X(conv2d_fwd_st) X(group_norm_fwd_st) X(add_fwd_st) X(convert_st)

#define COUNT_ONE(m) +1
#define CHECK_ONE(m)                                                                                                 \
    if (!be->m) {                                                                                                    \
        fprintf(stderr, "%s backend: no %s\n", be->name, #m);                                                        \
        missing++;                                                                                                   \
    }

/* No NULL entry but optional ones (none on the CPU), and the lists above
 * cover the whole struct. */
static void check_complete(const sd_backend *be)
{
    int missing = 0;
    ENTRIES(CHECK_ONE)
    if (!be->is_device) {
        OPTIONAL_ENTRIES(CHECK_ONE)
    }
    CHECK(missing == 0);
    size_t listed = 0 ENTRIES(COUNT_ONE) OPTIONAL_ENTRIES(COUNT_ONE);
    CHECK(sizeof(sd_backend) == offsetof(sd_backend, alloc) + listed * sizeof(void (*)(void)));
}

/* The planning backend: blocks counted live and at their peak, each op's
 * scratch the size its allocating function gives, on top of the live
 * blocks; the blocks are never readable (an op touching one would fault). */
static void test_plan_backend(void)
{
    sd_plan_exec x;
    sd_error err = {0};
    const sd_backend *be = sd_backend_plan();
    check_complete(be);
    CHECK(be->is_device);
    if (!CHECK(sd_plan_exec_init(&x, 1 << 20, 3, &err) == SD_OK)) return;
    float *a = be->alloc(&x, 1000), *b = be->alloc(&x, 64);
    CHECK(a && b && (char *)b - (char *)a == 1024);
    CHECK(x.live == 1088 && x.peak == 1088);
    be->release(&x, a);
    CHECK(x.live == 64 && x.peak == 1088);
    CHECK(be->alloc(&x, 1 << 20) == NULL); /* past the reservation: out of memory, as a full device */
    /* a 3x3 conv takes Winograd's scratch: more with more workers */
    sd_conv2d_shape wino = {.n = 1, .cin = 64, .cout = 64, .h = 32, .w = 32, .kh = 3, .kw = 3, .stride = 1,
                            .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
    size_t sw = sd_conv2d_fwd_scratch_bytes(3, &wino);
    CHECK(sw > 16 * 64 * 64 * sizeof(float)); /* the transformed weights and the workers' areas */
    CHECK(sd_conv2d_fwd_scratch_bytes(1, &wino) < sw);
    be->conv2d_fwd(&x, &wino, b, b, b, NULL);
    CHECK(x.scratch == sw && x.peak_total == 64 + sw);
    float *c = be->alloc(&x, 1 << 16);
    be->conv2d_fwd(&x, &wino, b, b, b, NULL);
    CHECK(x.peak_total == 64 + (1 << 16) + sw);
    /* a 1x1 conv is one GEMM over the input itself: no scratch */
    sd_conv2d_shape pw = {.n = 1, .cin = 8, .cout = 8, .h = 16, .w = 16, .kh = 1, .kw = 1, .stride = 1};
    CHECK(sd_conv2d_fwd_scratch_bytes(3, &pw) == 0);
    sd_attn_shape at = {.b = 1, .heads = 2, .tq = 64, .tk = 64, .d = 16, .scale = 0.25f};
    be->attn_bwd(&x, &at, b, b, b, b, b, b, b, b, b);
    CHECK(x.scratch >= sd_attn_bwd_scratch_bytes(3, &at));
    be->linear_fwd(&x, &(sd_linear_shape){.m = 4, .k = 8, .n = 8}, b, b, b, NULL);
    CHECK(sd_linear_fwd_scratch_bytes(3) == 3 * sd_linear_fwd_scratch_bytes(1));
    /* a device plan: attention's score blocks, one forward, two backward */
    x.device = 1;
    size_t before = x.scratch;
    x.scratch = 0;
    be->attn_bwd(&x, &at, b, b, b, b, b, b, b, b, b);
    CHECK(x.scratch == 2 * sd_attn_block_bytes(&at, 0));
    x.scratch = before;
    be->release(&x, c);
    be->release(&x, b);
    CHECK(x.live == 0);
    sd_plan_exec_free(&x);
}

/* Deterministic values in [lo, hi). */
static void fill(float *p, size_t n, uint32_t seed, float lo, float hi)
{
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(s >> 8) / 16777216.0f;
    }
}

/* alloc/h2d/d2d/zero/d2h/release/sync on the CPU table. */
static void test_memory(void)
{
    const sd_backend *be = sd_backend_cpu();
    float src[300], back[300];
    fill(src, 300, 1, -1, 1);
    float *a = be->alloc(NULL, sizeof src), *b = be->alloc(NULL, sizeof src);
    if (!CHECK(a && b)) return;
    CHECK(((uintptr_t)a & 63) == 0 && ((uintptr_t)b & 63) == 0);
    be->h2d(NULL, a, src, sizeof src);
    be->d2d(NULL, b, a, sizeof src);
    be->zero(NULL, a, 100 * sizeof(float));
    be->d2h(NULL, back, b, sizeof back);
    CHECK(memcmp(back, src, sizeof src) == 0);
    be->d2h(NULL, back, a, sizeof back);
    int zeros = 1;
    for (int i = 0; i < 100; i++) zeros &= back[i] == 0.0f;
    CHECK(zeros && memcmp(back + 100, src + 100, 200 * sizeof(float)) == 0);
    sd_error err = {0};
    CHECK(be->sync(NULL, &err) == SD_OK);
    void *z = be->alloc(NULL, 0);
    CHECK(z != NULL);
    be->release(NULL, z);
    be->release(NULL, NULL);
    be->release(NULL, a);
    be->release(NULL, b);
}

/* The table's wrapper gives the same bytes as the op itself. */
static void test_through_table(void)
{
    const sd_backend *be = sd_backend_cpu();
    sd_pool *pool = sd_pool_create(2);
    float x[1000], y1[1000], y2[1000];
    fill(x, 1000, 2, -5, 5);
    sd_silu_fwd(pool, 1000, y1, x);
    be->silu_fwd(pool, 1000, y2, x);
    CHECK(memcmp(y1, y2, sizeof y1) == 0);
    sd_linear_shape ls = {.m = 7, .k = 9, .n = 5};
    float w[45], bias[5], out1[35], out2[35];
    fill(w, 45, 3, -1, 1);
    fill(bias, 5, 4, -1, 1);
    sd_linear_fwd(NULL, &ls, out1, x, w, bias);
    be->linear_fwd(NULL, &ls, out2, x, w, bias);
    CHECK(memcmp(out1, out2, sizeof out1) == 0);
    sd_pool_destroy(pool);
}

/* Transpose against indexing, backward adds, any thread count. */
static void test_transpose(void)
{
    enum { N = 3, R = 37, C = 70 };
    static float x[N * R * C], y[N * R * C], y3[N * R * C], dx[N * R * C], dx0[N * R * C];
    fill(x, N * R * C, 5, -1, 1);
    fill(dx0, N * R * C, 6, -1, 1);
    sd_pool *pool = sd_pool_create(3);
    sd_transpose_fwd(NULL, N, R, C, y, x);
    sd_transpose_fwd(pool, N, R, C, y3, x);
    int ok = memcmp(y, y3, sizeof y) == 0;
    for (int b = 0; b < N; b++)
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) ok &= y[(b * C + c) * R + r] == x[(b * R + r) * C + c];
    CHECK(ok);
    memcpy(dx, dx0, sizeof dx);
    sd_transpose_bwd(pool, N, R, C, dx, y); /* transposing back adds x */
    ok = 1;
    for (int i = 0; i < N * R * C; i++) ok &= dx[i] == dx0[i] + x[i];
    CHECK(ok);
    sd_transpose_bwd(pool, N, R, C, NULL, y); /* NULL gradient: nothing */
    sd_pool_destroy(pool);
}

/* Posterior std: value, clamp, derivative by central differences. */
static void test_gauss_std(void)
{
    enum { N = 2000 };
    static float x[N], y[N], dy[N], dx[N];
    fill(x, N, 7, -40, 30);
    fill(dy, N, 8, -1, 1);
    sd_gauss_std_fwd(NULL, N, y, x);
    memset(dx, 0, sizeof dx);
    sd_gauss_std_bwd(NULL, N, dx, dy, x);
    int ok = 1;
    double worst = 0;
    for (int i = 0; i < N; i++) {
        float c = x[i] < -30.0f ? -30.0f : x[i] > 20.0f ? 20.0f : x[i];
        ok &= y[i] == expf(0.5f * c);
        if (x[i] < -30.0f || x[i] > 20.0f) {
            ok &= dx[i] == 0.0f;
            continue;
        }
        if (x[i] < -29.9f || x[i] > 19.9f) continue;
        double h = 1e-3, num = dy[i] * (exp(0.5 * (x[i] + h)) - exp(0.5 * (x[i] - h))) / (2 * h);
        double e = fabs(num - dx[i]) / fmax(1.0, fabs(num));
        if (e > worst) worst = e;
    }
    CHECK(ok);
    printf("gauss_std: max relative gradient error %.2e\n", worst);
    CHECK(worst < 1e-5);
    CHECK(sdm_gauss_std_grad(20.0f) > 0.0f && sdm_gauss_std_grad(20.001f) == 0.0f); /* torch: bounds included */
    float same[4] = {-31.0f, 0.0f, 1.0f, 25.0f};
    sd_gauss_std_fwd(NULL, 4, same, same); /* in place */
    CHECK(same[0] == expf(-15.0f) && same[1] == 1.0f && same[3] == expf(10.0f));
}

/* The CUDA attention's blocks of scores (attn_blocks.h): every block
 * within the cap, whole heads while one head fits, query rows of one head
 * (at least one) when it does not; the blocks tile every head's queries. */
static void test_attn_blocking(void)
{
    const sd_attn_shape shapes[] = {
        {.b = 1, .heads = 8, .tq = 4096, .tk = 4096, .d = 40},   /* SD UNet 64x64: 4 heads per block */
        {.b = 2, .heads = 8, .tq = 4096, .tk = 77, .d = 40},     /* cross-attention: all heads at once */
        {.b = 1, .heads = 1, .tq = 16384, .tk = 16384, .d = 512}, /* VAE at 1024^2: 4096 rows */
        {.b = 8, .heads = 1, .tq = 4096, .tk = 4096, .d = 512},  /* VAE batch 8 */
        {.b = 3, .heads = 5, .tq = 70, .tk = 45, .d = 16},
    };
    const size_t caps[] = {0, 6400, 100, 1};
    int ok = 1;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
            const sd_attn_shape *s = &shapes[i];
            size_t cap = caps[c] ? caps[c] : SD_ATTN_BLOCK_FLOATS, per = (size_t)s->tq * (size_t)s->tk;
            size_t bh = (size_t)s->b * (size_t)s->heads;
            sd_attn_blocks k = sd_attn_blocking(s, caps[c]);
            size_t floats = sd_attn_block_bytes(s, caps[c]) / sizeof(float);
            int whole = per <= cap;
            ok &= k.heads >= 1 && (size_t)k.heads <= bh && k.rows >= 1 && k.rows <= s->tq;
            ok &= floats == (size_t)k.heads * (size_t)k.rows * (size_t)s->tk;
            ok &= floats <= cap || (k.heads == 1 && k.rows == 1); /* one row is the least a block holds */
            ok &= whole ? k.rows == s->tq && ((size_t)k.heads == bh || (size_t)(k.heads + 1) * per > cap)
                        : k.heads == 1 && ((size_t)(k.rows + 1) * (size_t)s->tk > cap);
        }
    }
    CHECK(ok);
    sd_attn_blocks unet = sd_attn_blocking(&shapes[0], 0), vae = sd_attn_blocking(&shapes[2], 0);
    CHECK(unet.heads == 4 && unet.rows == 4096);
    CHECK(vae.heads == 1 && vae.rows == 4096);
    CHECK(sd_attn_block_bytes(&shapes[2], 0) == (size_t)256 << 20);
}

/* sd_vae_runner on the CPU table: the golden VAE's moments equal
 * sd_vae_encode's bytes, for a first call of one image and a second of
 * the whole batch (buffers grown), and stay within 1e-4 of diffusers. */
static void test_vae_runner(void)
{
    sd_vae v;
    sd_error err = {0};
    sd_safetensors *st = NULL;
    if (!CHECK(sd_vae_load(&v, GOLDEN_VAE "/vae", NULL, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    if (!CHECK(sd_st_open(&st, GOLDEN_VAE "/expected.safetensors", &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        sd_vae_free(&v);
        return;
    }
    const sd_st_tensor *x = sd_st_find(st, "x"), *em = sd_st_find(st, "mean");
    if (CHECK(x && em && x->ndim == 4)) {
        int n = (int)x->shape[0], h = (int)x->shape[2], w = (int)x->shape[3];
        size_t nl = em->nbytes / sizeof(float), per = nl / (size_t)n;
        float *m1 = malloc(nl * sizeof(float)), *s1 = malloc(nl * sizeof(float));
        float *m2 = malloc(nl * sizeof(float)), *s2 = malloc(nl * sizeof(float));
        float *ws = malloc(sd_vae_workspace_floats(&v, n, h, w) * sizeof(float));
        sd_pool *pool = sd_pool_create(2);
        sd_vae_runner r;
        if (CHECK(m1 && s1 && m2 && s2 && ws) &&
            CHECK(sd_vae_encode(&v, sd_backend_cpu(), pool, n, h, w, x->data, m1, s1, ws, &err) == SD_OK) &&
            CHECK(sd_vae_runner_init(&r, &v, sd_backend_cpu(), pool, &err) == SD_OK)) {
            CHECK(sd_vae_runner_encode(&r, &v, 1, h, w, x->data, m2, s2, &err) == SD_OK);
            CHECK(memcmp(m2, m1, per * sizeof(float)) == 0 && memcmp(s2, s1, per * sizeof(float)) == 0);
            CHECK(sd_vae_runner_encode(&r, &v, n, h, w, x->data, m2, s2, &err) == SD_OK);
            CHECK(memcmp(m2, m1, nl * sizeof(float)) == 0 && memcmp(s2, s1, nl * sizeof(float)) == 0);
            double e = 0;
            for (size_t i = 0; i < nl; i++) e = fmax(e, fabs((double)m2[i] - (double)((const float *)em->data)[i]));
            CHECK(e < 1e-4);
            CHECK(sd_vae_runner_encode(&r, &v, 0, h, w, x->data, m2, s2, &err) == SD_EINVAL);
            /* submit, then collect (sd-latents prepares the next batch in
             * between): the same bytes; one batch in flight at a time */
            float *xc = malloc(x->nbytes);
            if (CHECK(xc != NULL)) {
                memcpy(xc, x->data, x->nbytes);
                memset(m2, 0, nl * sizeof(float));
                CHECK(sd_vae_runner_collect(&r, m2, s2, &err) == SD_EINVAL);
                CHECK(sd_vae_runner_submit(&r, &v, n, h, w, xc, &err) == SD_OK);
                memset(xc, 0, x->nbytes); /* the input may be reused once submitted */
                CHECK(sd_vae_runner_submit(&r, &v, n, h, w, xc, &err) == SD_EINVAL);
                CHECK(sd_vae_runner_collect(&r, m2, s2, &err) == SD_OK);
                CHECK(memcmp(m2, m1, nl * sizeof(float)) == 0 && memcmp(s2, s1, nl * sizeof(float)) == 0);
                CHECK(sd_vae_runner_collect(&r, m2, s2, &err) == SD_EINVAL);
            }
            free(xc);
            /* the whole batch in one pass (a GPU runner's way): the same
             * function, to rounding */
            r.whole_batch = 1;
            memset(m2, 0, nl * sizeof(float));
            CHECK(sd_vae_runner_encode(&r, &v, n, h, w, x->data, m2, s2, &err) == SD_OK);
            double eb = 0;
            for (size_t i = 0; i < nl; i++)
                eb = fmax(eb, fmax(fabs((double)m2[i] - (double)m1[i]), fabs((double)s2[i] - (double)s1[i])));
            CHECK(eb < 1e-5);
            CHECK(r.ws_cap >= sd_vae_batch_workspace_floats(&v, n, h, w) * sizeof(float));
            sd_vae_runner_free(&r);
            sd_vae_runner_free(&r); /* twice is harmless */
        }
        sd_pool_destroy(pool);
        free(m1);
        free(s1);
        free(m2);
        free(s2);
        free(ws);
    }
    sd_st_close(st);
    sd_vae_free(&v);
}

int main(void)
{
    check_complete(sd_backend_cpu());
    CHECK(strcmp(sd_backend_cpu()->name, "cpu") == 0 && !sd_backend_cpu()->is_device);
#ifdef SDTK_HAVE_CUDA
    check_complete(sd_backend_cuda());
    CHECK(strcmp(sd_backend_cuda()->name, "cuda") == 0 && sd_backend_cuda()->is_device);
#endif
    test_memory();
    test_plan_backend();
    test_through_table();
    test_transpose();
    test_gauss_std();
    test_attn_blocking();
    test_vae_runner();
    return check_done("test_backend");
}
