/* sd-selftest: the optimizers of --optimizer adamw8bit and adafactor and
 * the bf16 weights' widening and rounded store, on a target against the
 * CPU reference: three steps of each optimizer from the same state and
 * gradients, every state buffer and the weights compared. The kernels
 * follow the CPU's arithmetic operation for operation, so the expected
 * difference is none; the tolerances below leave room only for what the
 * design cannot pin down (stated per check). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "selftest.h"

enum { MAXBUF = 8 };

/* Host buffers mirrored on a target for one run. */
typedef struct {
    int n;
    void *host[MAXBUF];
    size_t bytes[MAXBUF];
    void *dev[MAXBUF];
} mirror;

/* Register a host buffer; its device twin is made by mirror_up. */
static void mirror_add(mirror *m, void *host, size_t bytes)
{
    m->host[m->n] = host;
    m->bytes[m->n++] = bytes;
}

/* Every buffer allocated on t and uploaded; 0 on success. */
static int mirror_up(mirror *m, const target *t, sd_error *err)
{
    for (int i = 0; i < m->n; i++) {
        m->dev[i] = t->be->alloc(t->ex, m->bytes[i] ? m->bytes[i] : 1);
        if (!m->dev[i]) {
            sd_err_set(err, SD_ENOMEM, "out of memory on %s (%zu bytes)", t->be->name, m->bytes[i]);
            return -1;
        }
        t->be->h2d(t->ex, m->dev[i], m->host[i], m->bytes[i]);
    }
    return 0;
}

/* Every buffer downloaded (when ok), the queue synced and the device
 * buffers released; 0 on success. */
static int mirror_down(mirror *m, const target *t, int ok, sd_error *err)
{
    for (int i = 0; i < m->n && ok; i++) t->be->d2h(t->ex, m->host[i], m->dev[i], m->bytes[i]);
    int rc = t->be->sync(t->ex, err) || !ok ? -1 : 0;
    for (int i = 0; i < m->n; i++)
        if (m->dev[i]) t->be->release(t->ex, m->dev[i]);
    return rc;
}

/* The 8-bit case: a tensor of 41 blocks (the last one partial), one
 * below the 8-bit size (fp32 moments), and one of 20 blocks whose fourth
 * block gets zero gradients (its moments all zero: the absmax-0 path). */
enum { Q8_NT = 3, Q8_A = 10317, Q8_B = 1000, Q8_C = 5000, Q8_N = Q8_A + Q8_B + Q8_C, Q8_CODES = Q8_A + Q8_C,
       Q8_BLOCKS = (Q8_A + 255) / 256 + (Q8_C + 255) / 256 };

/* One run's 8-bit state (host), as both targets start and end. */
typedef struct {
    float p[Q8_N];
    uint8_t qm[Q8_CODES], qv[Q8_CODES];
    float am[Q8_BLOCKS], av[Q8_BLOCKS], m32[Q8_B], v32[Q8_B];
} q8_state;

/* The step's constants for step t as the trainer computes them
 * (optim_state.c): lr 1e-3, betas 0.9/0.999, eps 1e-8, decay 1e-2. */
static sd_adamw8_args q8_args_at(long t)
{
    double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr = 1e-3, wd = 1e-2;
    double c1 = 1.0 - pow(b1, (double)t), c2 = sqrt(1.0 - pow(b2, (double)t));
    sd_adamw8_args a = {.b1 = (float)b1, .b2 = (float)b2, .one_b1 = (float)(1.0 - b1), .one_b2 = (float)(1.0 - b2),
                        .eps = (float)eps, .bc2 = (float)c2, .neg_lr_c1 = (float)(-lr / c1),
                        .eps_c2 = (float)(eps * c2), .step_size = (float)(-lr * c2 / c1),
                        .decay = (float)(1.0 - lr * wd), .gscale = 0.7f, .decay_on = 1};
    return a;
}

/* Three 8-bit AdamW steps on t from s (updated in place) with the
 * gradients g[3][Q8_N]; 0 on success. */
static int adamw8_on(const target *t, const sd_q8_tables *tab, q8_state *s, float (*g)[Q8_N], sd_error *err)
{
    mirror m = {0};
    mirror_add(&m, s->p, sizeof s->p);
    mirror_add(&m, s->qm, sizeof s->qm);
    mirror_add(&m, s->qv, sizeof s->qv);
    mirror_add(&m, s->am, sizeof s->am);
    mirror_add(&m, s->av, sizeof s->av);
    mirror_add(&m, s->m32, sizeof s->m32);
    mirror_add(&m, s->v32, sizeof s->v32);
    mirror_add(&m, g, 3 * sizeof g[0]);
    int ok = mirror_up(&m, t, err) == 0;
    if (ok) {
        uint8_t *qm = m.dev[1], *qv = m.dev[2];
        float *am = m.dev[3], *av = m.dev[4], *gd = m.dev[7];
        size_t ba = (Q8_A + 255) / 256;
        const sd_q8_tensor ts[Q8_NT] = {
            {.off = 0, .n = Q8_A, .qm = qm, .qv = qv, .am = am, .av = av},
            {.off = Q8_A, .n = Q8_B, .m32 = m.dev[5], .v32 = m.dev[6]},
            {.off = Q8_A + Q8_B, .n = Q8_C, .qm = qm + Q8_A, .qv = qv + Q8_A, .am = am + ba, .av = av + ba}};
        for (long step = 1; step <= 3; step++) {
            sd_adamw8_args a = q8_args_at(step);
            t->be->adamw8(t->ex, &a, tab, Q8_NT, ts, m.dev[0], gd + (step - 1) * Q8_N);
        }
    }
    return mirror_down(&m, t, ok, err);
}

/* Codes that differ, and those that differ by more than one code. */
static void codes_apart(const uint8_t *a, const uint8_t *b, size_t n, size_t *differ, size_t *far)
{
    for (size_t i = 0; i < n; i++) {
        int d = (int)a[i] - (int)b[i];
        *differ += d != 0;
        *far += d > 1 || d < -1;
    }
}

/* The verdict on an 8-bit run (dev) against the reference (ref): codes
 * equal but for at most 1 in 4096 one code apart (a rounding the design
 * cannot rule out; none expected), absmax and the fp32 moments and weights
 * within 1e-6 normwise (the bound against bitsandbytes; expected
 * 0). 1 pass. */
static int judge_q8(const q8_state *dev, const q8_state *ref, int print)
{
    size_t differ = 0, far = 0;
    codes_apart(dev->qm, ref->qm, Q8_CODES, &differ, &far);
    codes_apart(dev->qv, ref->qv, Q8_CODES, &differ, &far);
    double e[4] = {selftest_tensor_error(dev->am, ref->am, Q8_BLOCKS), selftest_tensor_error(dev->av, ref->av, Q8_BLOCKS),
                   fmax(selftest_tensor_error(dev->m32, ref->m32, Q8_B), selftest_tensor_error(dev->v32, ref->v32, Q8_B)),
                   selftest_tensor_error(dev->p, ref->p, Q8_N)};
    int pass = far == 0 && differ <= 2 * Q8_CODES / 4096 && e[0] <= 1e-6 && e[1] <= 1e-6 && e[2] <= 1e-6 &&
               e[3] <= 1e-6;
    if (print)
        printf("%-34s 3 steps: %zu of %d codes differ (none by more than one: %s), absmax m %.2e v %.2e, fp32 "
               "moments %.2e, weights %.2e (tol 1e-6)  %s\n",
               "adamw8bit", differ, 2 * Q8_CODES, far ? "NO" : "yes", e[0], e[1], e[2], e[3], pass ? "pass" : "FAIL");
    return pass;
}

/* --mutate: one code off by two, then one weight off by 1e-5 relative,
 * each must fail the verdict; the number the verdict missed. */
static int mutate_q8(const q8_state *dev, const q8_state *ref)
{
    q8_state *x = malloc(sizeof *x);
    if (!x) return 1;
    int missed = 0;
    memcpy(x, dev, sizeof *x);
    x->qm[Q8_A + 17] = (uint8_t)(x->qm[Q8_A + 17] + 2);
    missed += judge_q8(x, ref, 0);
    memcpy(x, dev, sizeof *x);
    x->p[Q8_A + 3] *= 1.00001f;
    missed += judge_q8(x, ref, 0);
    free(x);
    printf("%-34s mutations (a code two apart, a weight 1e-5 off) %s\n", "adamw8bit", missed ? "MISSED" : "caught");
    return missed;
}

/* 8-bit AdamW: three steps on dev and on ref; failures (0 or 1), or -1 on
 * an error. */
int selftest_check_adamw8(const target *dev, const target *ref, int mutate)
{
    sd_q8_tables *tab = malloc(sizeof *tab);
    q8_state *s[2] = {calloc(1, sizeof(q8_state)), calloc(1, sizeof(q8_state))};
    float(*g)[Q8_N] = malloc(3 * sizeof *g);
    int rc = -1;
    sd_error err = {0};
    if (tab && s[0] && s[1] && g) {
        sd_q8_dynamic_map(1, tab->code_m);
        sd_q8_dynamic_map(0, tab->code_v);
        sd_q8_lut(tab->code_m, tab->lut_m);
        sd_q8_lut(tab->code_v, tab->lut_v);
        selftest_fill(s[0]->p, Q8_N, 801, -1, 1);
        for (int k = 0; k < 3; k++) {
            selftest_fill(g[k], Q8_N, 802 + (uint64_t)k, -0.5f, 0.5f);
            memset(g[k] + Q8_A + Q8_B + 3 * 256, 0, 256 * sizeof(float)); /* a block of zero moments */
        }
        memcpy(s[1], s[0], sizeof(q8_state));
        if (adamw8_on(dev, tab, s[0], g, &err) || adamw8_on(ref, tab, s[1], g, &err)) {
            fprintf(stderr, "sd-selftest: adamw8bit: %s\n", err.msg);
        } else {
            rc = !judge_q8(s[0], s[1], 1);
            if (mutate) rc += mutate_q8(s[0], s[1]);
        }
    }
    free(tab);
    free(s[0]);
    free(s[1]);
    free(g);
    return rc;
}

/* The Adafactor case: a linear weight [48, 80], a conv kernel [6, 4, 3, 3]
 * (factored over its last two dimensions: 24 leading indices) and a bias
 * [80] (a whole second moment), with the first moment and weight decay. */
enum { AF_NT = 3, AF_LIN = 48 * 80, AF_CONV = 6 * 4 * 3 * 3, AF_BIAS = 80, AF_N = AF_LIN + AF_CONV + AF_BIAS,
       AF_ROWS = 48 + 24 * 3, AF_COLS = 80 + 24 * 3 };

/* One run's Adafactor state (host). */
typedef struct {
    float p[AF_N], row[AF_ROWS], col[AF_COLS], v[AF_BIAS], m[AF_N];
} af_state;

/* Three Adafactor steps on t from s with the gradients g[3][AF_N]
 * (constants as optim_state.c's af_args: lr 1e-3, beta1 0.9, decay 1e-2);
 * 0 on success. */
static int adafactor_on(const target *t, af_state *s, float (*g)[AF_N], sd_error *err)
{
    mirror m = {0};
    mirror_add(&m, s->p, sizeof s->p);
    mirror_add(&m, s->row, sizeof s->row);
    mirror_add(&m, s->col, sizeof s->col);
    mirror_add(&m, s->v, sizeof s->v);
    mirror_add(&m, s->m, sizeof s->m);
    mirror_add(&m, g, 3 * sizeof g[0]);
    int ok = mirror_up(&m, t, err) == 0;
    if (ok) {
        float *row = m.dev[1], *col = m.dev[2], *mm = m.dev[4], *gd = m.dev[5];
        const sd_adafactor_tensor ts[AF_NT] = {
            {.off = 0, .n = AF_LIN, .ndim = 2, .shape = {48, 80}, .row = row, .col = col, .m = mm},
            {.off = AF_LIN, .n = AF_CONV, .ndim = 4, .shape = {6, 4, 3, 3}, .row = row + 48, .col = col + 80,
             .m = mm + AF_LIN},
            {.off = AF_LIN + AF_CONV, .n = AF_BIAS, .ndim = 1, .shape = {AF_BIAS}, .v = m.dev[3],
             .m = mm + AF_LIN + AF_CONV}};
        for (long step = 1; step <= 3; step++) {
            double b2t = 1.0 - pow((double)step, -0.8), lr = 1e-3, wd = 1e-2, b1 = 0.9;
            sd_adafactor_args a = {.beta2t = (float)b2t, .one_beta2t = (float)(1.0 - b2t), .lr = (float)lr,
                                   .beta1 = (float)b1, .one_beta1 = (float)(1.0 - b1), .neg_wd_lr = (float)(-wd * lr),
                                   .gscale = 0.7f, .clip_threshold = 1.0, .decay_on = 1};
            t->be->adafactor(t->ex, &a, AF_NT, ts, m.dev[0], gd + (step - 1) * AF_N);
        }
    }
    return mirror_down(&m, t, ok, err);
}

/* The verdict on an Adafactor run: every state buffer and the weights
 * within 1e-6 normwise of the CPU (the sums match the CPU's order but the
 * RMS's, a tree on the GPU: its divisor may round one ulp apart; the
 * issue's bound against torch is 1e-5). 1 pass. */
static int judge_af(const af_state *dev, const af_state *ref, int print)
{
    double e[5] = {selftest_tensor_error(dev->row, ref->row, AF_ROWS),
                   selftest_tensor_error(dev->col, ref->col, AF_COLS), selftest_tensor_error(dev->v, ref->v, AF_BIAS),
                   selftest_tensor_error(dev->m, ref->m, AF_N), selftest_tensor_error(dev->p, ref->p, AF_N)};
    int pass = 1;
    for (int i = 0; i < 5; i++) pass = pass && e[i] <= 1e-6;
    if (print)
        printf("%-34s 3 steps: row %.2e, col %.2e, v %.2e, m %.2e, weights %.2e (tol 1e-6)  %s\n", "adafactor", e[0],
               e[1], e[2], e[3], e[4], pass ? "pass" : "FAIL");
    return pass;
}

/* --mutate: a column state and a weight off by 1e-5 relative must fail. */
static int mutate_af(const af_state *dev, const af_state *ref)
{
    af_state x;
    int missed = 0;
    x = *dev;
    x.col[81] *= 1.00001f;
    missed += judge_af(&x, ref, 0);
    x = *dev;
    x.p[AF_LIN + 5] *= 1.00001f;
    missed += judge_af(&x, ref, 0);
    printf("%-34s mutations (a column state, a weight 1e-5 off) %s\n", "adafactor", missed ? "MISSED" : "caught");
    return missed;
}

/* Adafactor: three steps on dev and on ref; failures, or -1 on an error. */
int selftest_check_adafactor(const target *dev, const target *ref, int mutate)
{
    af_state *s[2] = {calloc(1, sizeof(af_state)), calloc(1, sizeof(af_state))};
    float(*g)[AF_N] = malloc(3 * sizeof *g);
    int rc = -1;
    sd_error err = {0};
    if (s[0] && s[1] && g) {
        selftest_fill(s[0]->p, AF_N, 811, -1, 1);
        for (int k = 0; k < 3; k++) selftest_fill(g[k], AF_N, 812 + (uint64_t)k, -0.5f, 0.5f);
        *s[1] = *s[0];
        if (adafactor_on(dev, s[0], g, &err) || adafactor_on(ref, s[1], g, &err)) {
            fprintf(stderr, "sd-selftest: adafactor: %s\n", err.msg);
        } else {
            rc = !judge_af(s[0], s[1], 1);
            if (mutate) rc += mutate_af(s[0], s[1]);
        }
    }
    free(s[0]);
    free(s[1]);
    free(g);
    return rc;
}

enum { W16_N = 100003 };

/* bf16 weights on t: h widened into w, then f stored into h with the key
 * from global index 11; 0 on success. */
static int bf16w_on(const target *t, uint16_t *h, float *w, float *f, sd_error *err)
{
    mirror m = {0};
    mirror_add(&m, h, W16_N * sizeof(uint16_t));
    mirror_add(&m, w, W16_N * sizeof(float));
    mirror_add(&m, f, W16_N * sizeof(float));
    int ok = mirror_up(&m, t, err) == 0;
    if (ok) {
        t->be->bf16_widen(t->ex, W16_N, m.dev[1], m.dev[0]);
        t->be->bf16_store_sr(t->ex, W16_N, 11, 0x5eedu, m.dev[0], m.dev[2]);
    }
    return mirror_down(&m, t, ok, err);
}

/* The verdict: widening exact and every stored bf16 value the same bits
 * (integer arithmetic on both sides: no tolerance). 1 pass. */
static int judge_w16(const uint16_t *h0, const float *w0, const uint16_t *h1, const float *w1, int print)
{
    size_t wd = 0, hd = 0;
    for (size_t i = 0; i < W16_N; i++) {
        wd += memcmp(&w0[i], &w1[i], sizeof(float)) != 0;
        hd += h0[i] != h1[i];
    }
    int pass = wd == 0 && hd == 0;
    if (print)
        printf("%-34s widened: %zu of %d differ, stored with stochastic rounding: %zu differ (exact)  %s\n",
               "bf16 weights", wd, W16_N, hd, pass ? "pass" : "FAIL");
    return pass;
}

/* bf16 weights' widening and keyed store on dev against ref; failures,
 * or -1 on an error. With mutate, one stored value one step off must
 * fail. */
int selftest_check_bf16w(const target *dev, const target *ref, int mutate)
{
    uint16_t *h[2] = {malloc(W16_N * 2), malloc(W16_N * 2)};
    float *w[2] = {malloc(W16_N * 4), malloc(W16_N * 4)}, *f = malloc(W16_N * 4);
    int rc = -1;
    sd_error err = {0};
    if (h[0] && h[1] && w[0] && w[1] && f) {
        selftest_fill(f, W16_N, 821, -3, 3);
        for (size_t i = 0; i < W16_N; i++) {
            uint32_t u;
            memcpy(&u, &f[i], 4);
            h[0][i] = (uint16_t)(u >> 16); /* any bf16 values */
        }
        memcpy(h[1], h[0], W16_N * 2);
        selftest_fill(f, W16_N, 822, -1e-2f, 1e-2f);
        if (bf16w_on(dev, h[0], w[0], f, &err) || bf16w_on(ref, h[1], w[1], f, &err)) {
            fprintf(stderr, "sd-selftest: bf16 weights: %s\n", err.msg);
        } else {
            rc = !judge_w16(h[0], w[0], h[1], w[1], 1);
            if (mutate) {
                h[0][77]++;
                int missed = judge_w16(h[0], w[0], h[1], w[1], 0);
                printf("%-34s mutation (a stored value one step off) %s\n", "bf16 weights",
                       missed ? "MISSED" : "caught");
                rc += missed;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        free(h[k]);
        free(w[k]);
    }
    free(f);
    return rc;
}
