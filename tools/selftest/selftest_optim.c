/* sd-selftest: the optimizer case's calls on a target (sum of squares,
 * AdamW, EMA) and the bit-for-bit check of AdamW with bf16 moments against
 * the CPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "err.h"
#include "selftest.h"

/* Optimizer: p m v (updated in place) | g | sum of squares / n | ema. */
static const sd_adamw_args adamw_args = {.decay = 0.9999f, .b1 = 0.9f, .b2 = 0.999f, .step_size = 1e-3f,
                                         .bc2_sqrt = 0.0447f, .eps = 1e-8f, .gscale = 0.7f};
/* The case's two calls: "forward" the sum of squares (stored as mean_sq, an output checked like
 * the others) and one AdamW step, "backward" the EMA. */
void selftest_opt_f(const target *t, float **p)
{
    float mean_sq = (float)(t->be->sum_squares(t->ex, ELEM_N, p[3]) / ELEM_N);
    t->be->h2d(t->ex, p[4], &mean_sq, sizeof mean_sq);
    t->be->adamw(t->ex, &adamw_args, ELEM_N, p[0], p[1], p[2], p[3]);
}
void selftest_opt_b(const target *t, float **p) { t->be->ema(t->ex, ELEM_N, p[5], p[0], 0.05f); }

/* One AdamW step with bf16 moments on t from the host arrays (p, m and v
 * updated in place); 0 on success. */
static int adamw16_on(const target *t, size_t n, float *p, uint16_t *m, uint16_t *v, const float *g,
                      const sd_adamw_args *a, sd_error *err)
{
    float *dp = t->be->alloc(t->ex, n * sizeof(float)), *dg = t->be->alloc(t->ex, n * sizeof(float));
    uint16_t *dm = t->be->alloc(t->ex, n * sizeof(uint16_t)), *dv = t->be->alloc(t->ex, n * sizeof(uint16_t));
    int rc = -1;
    if (dp && dg && dm && dv) {
        t->be->h2d(t->ex, dp, p, n * sizeof(float));
        t->be->h2d(t->ex, dg, g, n * sizeof(float));
        t->be->h2d(t->ex, dm, m, n * sizeof(uint16_t));
        t->be->h2d(t->ex, dv, v, n * sizeof(uint16_t));
        t->be->adamw_bf16(t->ex, a, n, 7, dp, dm, dv, dg); /* from global index 7 */
        t->be->d2h(t->ex, p, dp, n * sizeof(float));
        t->be->d2h(t->ex, m, dm, n * sizeof(uint16_t));
        t->be->d2h(t->ex, v, dv, n * sizeof(uint16_t));
        rc = t->be->sync(t->ex, err) ? -1 : 0;
    } else {
        sd_err_set(err, SD_ENOMEM, "adamw (bf16 moments): out of memory");
    }
    void *bufs[4] = {dp, dg, dm, dv};
    for (int i = 0; i < 4; i++)
        if (bufs[i]) t->be->release(t->ex, bufs[i]);
    return rc;
}

/* AdamW with bf16 moments, bit for bit: the stochastic rounding takes its
 * random bits from (key, global index) on both backends, so the stored
 * moments must be the same bf16 values. Only where a moment's fp32
 * arithmetic differs in its last bit (the GPU contracts a multiply-add the
 * CPU build does not) may it round the other way, by exactly one bf16
 * step, about once in 65536 elements: allowed up to 1 in 2048. The
 * weights (from the fp32 moments) within the optimizer's tolerance
 * (op_tols; the update is fp32 in every mode). Failures (0 or 1), or -1 on
 * an error. */
int selftest_check_adamw_bf16(const target *dev, const target *ref, int mode)
{
    enum { N = 100003 };
    const sd_adamw_args a = {.decay = 0.9999f, .b1 = 0.9f, .b2 = 0.999f, .step_size = 1e-3f, .bc2_sqrt = 0.0447f,
                             .eps = 1e-8f, .gscale = 0.7f, .sr_key = 0x5eedu};
    float *p[2], *g = malloc(N * sizeof(float)), *tmp = malloc(N * sizeof(float));
    uint16_t *m[2], *v[2];
    int ok = g && tmp;
    for (int k = 0; k < 2; k++) {
        p[k] = malloc(N * sizeof(float));
        m[k] = malloc(N * sizeof(uint16_t));
        v[k] = malloc(N * sizeof(uint16_t));
        ok = ok && p[k] && m[k] && v[k];
    }
    int rc = -1;
    sd_error err = {0};
    if (ok) {
        selftest_fill(g, N, 501, -1, 1);
        selftest_fill(p[0], N, 502, -1, 1);
        memcpy(p[1], p[0], N * sizeof(float));
        selftest_fill(tmp, N, 503, -0.1f, 0.1f);
        sd_dtype_store(m[0], tmp, N, SD_DT_BF16);
        selftest_fill(tmp, N, 504, 0, 0.01f);
        sd_dtype_store(v[0], tmp, N, SD_DT_BF16);
        memcpy(m[1], m[0], N * sizeof(uint16_t));
        memcpy(v[1], v[0], N * sizeof(uint16_t));
        if (adamw16_on(dev, N, p[0], m[0], v[0], g, &a, &err) || adamw16_on(ref, N, p[1], m[1], v[1], g, &a, &err)) {
            fprintf(stderr, "sd-selftest: %s\n", err.msg);
        } else {
            size_t differ = 0, far = 0;
            for (size_t i = 0; i < N; i++) {
                for (int k = 0; k < 2; k++) {
                    uint16_t x = k ? v[0][i] : m[0][i], y = k ? v[1][i] : m[1][i];
                    differ += x != y;
                    far += x != y && (x ^ y) >> 15 == 0 && (x > y ? x - y : y - x) != 1; /* not one step apart */
                    far += x != y && (x ^ y) >> 15 != 0;                                  /* sign differs */
                }
            }
            double e = selftest_tensor_error(p[0], p[1], N);
            int pass = far == 0 && differ <= 2 * N / 2048 && e <= selftest_tol_of(OC_OPTIM, GRAD, mode);
            printf("%-34s moments: %zu of %d bf16 values differ (one step each: %s), weights %.2e (tol %.1e)  %s\n",
                   "adamw (bf16 moments)", differ, 2 * N, far ? "NO" : "yes", e, selftest_tol_of(OC_OPTIM, GRAD, mode),
                   pass ? "pass" : "FAIL");
            rc = !pass;
        }
    }
    for (int k = 0; k < 2; k++) {
        free(p[k]);
        free(m[k]);
        free(v[k]);
    }
    free(g);
    free(tmp);
    return rc;
}
