/* 8-bit AdamW and Adafactor against tests/golden/optim (made by
 * tests/golden/make_optim_golden.py: bitsandbytes' AdamW8bit CPU path with
 * its native quantizer, transformers' Adafactor, three steps with fixed
 * gradients and per-step rates on tensors of the tiny UNet's shapes), run
 * through the trainer's own state layout (optim_state.c): the dynamic maps
 * equal, the 8-bit codes and absmax equal and the weights within 1e-6
 * relative per value; Adafactor's weights within 1e-5 relative per tensor
 * (its state within 1e-4), with and without a first moment; the same bits
 * on 1 and 3 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "optim.h"
#include "pool.h"
#include "safetensors.h"
#include "weights.h"

enum { NT = 7 };
static const char *const names[NT] = {"conv", "ff", "odd", "proj", "to_q", "bias", "norm"};
static const int ndims[NT] = {4, 2, 2, 4, 2, 1, 1};
static const int shapes[NT][4] = {{32, 16, 3, 3}, {32, 128}, {40, 130}, {32, 32, 1, 1}, {32, 32}, {32}, {32}};
static const double lrs[3] = {1e-3, 2e-3, 5e-4};

/* The golden tensor `name` (fp32 or uint8, n values), or NULL (a failed check). */
static const void *golden(const sd_safetensors *st, const char *name, size_t n, int dtype)
{
    const sd_st_tensor *t = sd_st_find(st, name);
    size_t es = dtype == SD_ST_U8 ? 1 : 4;
    if (!CHECK(t && (int)t->dtype == dtype && t->nbytes == n * es)) {
        fprintf(stderr, "  golden tensor %s\n", name);
        return NULL;
    }
    return t->data;
}

/* The model of the golden tensors in the trainer's flat layout. */
static void build(sd_weights *w)
{
    sd_error err = {0};
    sd_weights_init(w);
    for (int k = 0; k < NT; k++) {
        size_t off;
        CHECK(sd_weights_add(w, names[k], "", ndims[k], shapes[k], &off, &err) == SD_OK);
    }
    CHECK(sd_weights_alloc(w, &err) == SD_OK);
}

/* Three steps of kind from the golden p0 with the golden gradients on a
 * pool of `threads`; the weights left in w, the state in s. */
static void run(const sd_safetensors *st, sd_optimizer kind, double beta1, int threads, sd_weights *w,
                sd_opt_state *s)
{
    sd_error err = {0};
    build(w);
    CHECK(sd_opt_state_init(s, kind, beta1 >= 0, w, &err) == SD_OK);
    float *g = calloc(w->total, sizeof(float));
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    char nm[64];
    for (int k = 0; k < NT; k++) {
        snprintf(nm, sizeof nm, "%s.p0", names[k]);
        const float *p0 = golden(st, nm, w->slots[k].n, SD_ST_F32);
        if (p0) memcpy(w->data + w->slots[k].off, p0, w->slots[k].n * 4);
    }
    sd_adamw_opts o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
    for (int step = 1; step <= 3; step++) {
        for (int k = 0; k < NT; k++) {
            snprintf(nm, sizeof nm, "%s.g%d", names[k], step);
            const float *gk = golden(st, nm, w->slots[k].n, SD_ST_F32);
            if (gk) memcpy(g + w->slots[k].off, gk, w->slots[k].n * 4);
        }
        sd_opt_state_step(s, sd_backend_cpu(), pool, &o, beta1, lrs[step - 1], step, 1.0, w->data, g);
    }
    if (pool) sd_pool_destroy(pool);
    free(g);
}

/* The largest |got - want| / |want| over n values (|want| at least floor). */
static double rel_each(const float *got, const float *want, size_t n, double floor)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]), r = d / fmax(fabs((double)want[i]), floor);
        if (!(r <= worst)) worst = r; /* NaN sticks */
    }
    return worst;
}

/* max |got - want| / max |want| over one tensor. */
static double rel_tensor(const float *got, const float *want, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= d)) d = e;
        m = fmax(m, fabs((double)want[i]));
    }
    return d / (m > 0 ? m : 1);
}

/* bitsandbytes' dynamic maps as create_dynamic_map makes them. */
static void test_maps(const sd_safetensors *st)
{
    float code[SD_Q8_CODES];
    sd_q8_dynamic_map(1, code);
    const float *want = golden(st, "q8.code_m", SD_Q8_CODES, SD_ST_F32);
    CHECK(want && memcmp(code, want, sizeof code) == 0);
    sd_q8_dynamic_map(0, code);
    want = golden(st, "q8.code_v", SD_Q8_CODES, SD_ST_F32);
    CHECK(want && memcmp(code, want, sizeof code) == 0);
}

/* AdamW8bit: codes and absmax equal, weights within 1e-6 per value. */
static void test_adamw8(const sd_safetensors *st)
{
    sd_weights w;
    sd_opt_state s;
    run(st, SD_OPT_ADAMW8BIT, -1, 1, &w, &s);
    char nm[80];
    for (int k = 0; k < NT; k++) {
        size_t n = w.slots[k].n, nb = (n + SD_Q8_BLOCK - 1) / SD_Q8_BLOCK;
        const sd_q8_tensor *t = &s.q8[k];
        snprintf(nm, sizeof nm, "adamw8bit.%s.p3", names[k]);
        const float *p3 = golden(st, nm, n, SD_ST_F32);
        double r = p3 ? rel_each(w.data + w.slots[k].off, p3, n, 1e-30) : 1;
        if (!CHECK(r <= 1e-6)) fprintf(stderr, "  adamw8bit %s: weights off by %g relative\n", names[k], r);
        if (n >= SD_Q8_MIN_SIZE) {
            CHECK(t->qm != NULL);
            const char *what[4] = {"qm", "qv", "am", "av"};
            const void *mine[4] = {t->qm, t->qv, t->am, t->av};
            size_t bytes[4] = {n, n, nb * 4, nb * 4};
            for (int j = 0; j < 4; j++) {
                snprintf(nm, sizeof nm, "adamw8bit.%s.%s", names[k], what[j]);
                const void *want = golden(st, nm, j < 2 ? n : nb, j < 2 ? SD_ST_U8 : SD_ST_F32);
                if (!CHECK(want && t->qm && memcmp(mine[j], want, bytes[j]) == 0))
                    fprintf(stderr, "  adamw8bit %s: %s differs\n", names[k], what[j]);
            }
        } else {
            CHECK(t->m32 != NULL);
            snprintf(nm, sizeof nm, "adamw8bit.%s.m32", names[k]);
            const float *m = golden(st, nm, n, SD_ST_F32);
            CHECK(m && t->m32 && rel_each(t->m32, m, n, 1e-30) <= 1e-6);
            snprintf(nm, sizeof nm, "adamw8bit.%s.v32", names[k]);
            const float *v = golden(st, nm, n, SD_ST_F32);
            CHECK(v && t->v32 && rel_each(t->v32, v, n, 1e-30) <= 1e-6);
        }
    }
    /* the same bits on three threads */
    sd_weights w3;
    sd_opt_state s3;
    run(st, SD_OPT_ADAMW8BIT, -1, 3, &w3, &s3);
    CHECK(memcmp(w.data, w3.data, w.total * 4) == 0);
    for (size_t i = 0; i < s.nbufs; i++)
        CHECK(memcmp(s.bufs[i].data, s3.bufs[i].data, s.bufs[i].count * (s.bufs[i].st_dtype == SD_ST_U8 ? 1 : 4)) == 0);
    sd_opt_state_free(&s3);
    sd_weights_free(&w3);
    sd_opt_state_free(&s);
    sd_weights_free(&w);
}

/* Adafactor: weights within 1e-5 per tensor, state within 1e-4. */
static void test_adafactor(const sd_safetensors *st, const char *cs, double beta1)
{
    sd_weights w;
    sd_opt_state s;
    run(st, SD_OPT_ADAFACTOR, beta1, 1, &w, &s);
    char nm[80];
    for (int k = 0; k < NT; k++) {
        size_t n = w.slots[k].n, last = (size_t)shapes[k][ndims[k] - 1];
        const sd_adafactor_tensor *t = &s.af[k];
        snprintf(nm, sizeof nm, "%s.%s.p3", cs, names[k]);
        const float *p3 = golden(st, nm, n, SD_ST_F32);
        double r = p3 ? rel_tensor(w.data + w.slots[k].off, p3, n) : 1;
        if (!CHECK(r <= 1e-5)) fprintf(stderr, "  %s %s: weights off by %g relative\n", cs, names[k], r);
        const float *mine[4] = {t->row, t->col, t->v, t->m};
        const char *what[4] = {"row", "col", "v", "m"};
        size_t cnt[4] = {ndims[k] >= 2 ? n / last : 0, ndims[k] >= 2 ? n / (size_t)shapes[k][ndims[k] - 2] : 0,
                         ndims[k] >= 2 ? 0 : n, beta1 >= 0 ? n : 0};
        for (int j = 0; j < 4; j++) {
            CHECK((mine[j] != NULL) == (cnt[j] > 0));
            if (!cnt[j] || !mine[j]) continue;
            snprintf(nm, sizeof nm, "%s.%s.%s", cs, names[k], what[j]);
            const float *want = golden(st, nm, cnt[j], SD_ST_F32);
            double rs = want ? rel_tensor(mine[j], want, cnt[j]) : 1;
            if (!CHECK(rs <= 1e-4)) fprintf(stderr, "  %s %s: %s off by %g relative\n", cs, names[k], what[j], rs);
        }
    }
    sd_weights w3;
    sd_opt_state s3;
    run(st, SD_OPT_ADAFACTOR, beta1, 3, &w3, &s3);
    CHECK(memcmp(w.data, w3.data, w.total * 4) == 0);
    sd_opt_state_free(&s3);
    sd_weights_free(&w3);
    sd_opt_state_free(&s);
    sd_weights_free(&w);
}

int main(void)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    if (!CHECK(sd_st_open(&st, GOLDEN_DIR "/optim.safetensors", &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_maps(st);
    test_adamw8(st);
    test_adafactor(st, "adafactor", -1);
    test_adafactor(st, "adafactor_b1", 0.9);
    sd_st_close(st);
    return check_done("test_optim_golden");
}
