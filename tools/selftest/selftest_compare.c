/* sd-selftest: the comparison harness: the numerics modes, the normwise
 * error of a tensor, the tolerances per op class, role and mode, the
 * judging of a case, and the check of the check (--mutate). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "selftest.h"

/* The mode of a device run from its numerics options (see selftest.h). */
int selftest_mode(int tf32, int mixed)
{
    if (mixed == SD_DT_BF16) return SELFTEST_BF16;
    if (mixed) return SELFTEST_FP16;
    return tf32 ? SELFTEST_TF32 : SELFTEST_STRICT;
}

/* A mode's name, for the messages. */
const char *selftest_mode_name(int mode)
{
    static const char *const names[SELFTEST_NMODES] = {"strict", "tf32", "bf16", "fp16"};
    return mode >= 0 && mode < SELFTEST_NMODES ? names[mode] : "?";
}

/* max |a - b| (NaN anywhere: infinite) and max |b| of n floats. */
static void max_abs(const float *a, const float *b, size_t n, double *emax, double *rmax)
{
    *emax = *rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]), r = fabs((double)b[i]);
        if (e != e) e = INFINITY;
        if (e > *emax) *emax = e;
        if (r > *rmax) *rmax = r;
    }
}

/* Normwise error of one tensor: max |a - b| / max |b| (the absolute error
 * where the reference is all zeros). */
double selftest_tensor_error(const float *a, const float *b, size_t n)
{
    double e, r;
    max_abs(a, b, n, &e, &r);
    return r > 0 ? e / r : e;
}

/* Tolerances per op class, for its outputs (forward) and its gradients
 * (backward), per numerics mode (strict, TF32, bf16, fp16), for
 * selftest_tensor_error: each output and gradient tensor is judged by itself. From
 * the H100 runs (docs/gpu-runs; the table and its derivation in
 * docs/GPU.md, "Tolerances"): the logs give a case's largest absolute
 * error over its outputs and over its gradients; divided by each tensor's
 * own largest reference value (the same inputs, so the same on every
 * machine), that bounds each tensor's error there. Every tolerance is 5 to
 * 10 times the largest bound of its class, role and mode (strict: runs 11,
 * 14, 23, 25; TF32: 11, 14, 25; bf16: 17, 20, 23; fp16: 17, 22):
 *             forward                          backward
 *   conv    2.0e-7 (2.4e-4) 2.5e-3 4.1e-4   2.0e-6 2.4e-4 1.9e-2 3.0e-3
 *   linear  3.5e-7  3.4e-4  2.8e-3 3.4e-4   3.6e-6 1.6e-3 1.2e-2 1.6e-3
 *   attn    1.7e-5  6.0e-4  5.0e-3 4.1e-4   2.9e-6 5.2e-4 3.4e-3 5.2e-4
 *   norm 9.4e-7 / 7.6e-6, elementwise 1.2e-7 / 3.8e-6, timestep 6.1e-5 /
 *   3.3e-5, optimizer 0 / 5.7e-6 in every mode.
 * TF32 convolutions forward measured 2.0e-7 (cuDNN took an FMA algorithm
 * there); another GPU may take a TF32 one, so they get the backward's
 * tolerance. TF32 and mixed precision change only convolutions, linear
 * layers and attention's GEMMs; the flash kernel and every other op stay
 * fp32 and are judged as strict. */
static const double op_tols[OC_N][2][SELFTEST_NMODES] = {
    [OC_CONV] = {{2e-6, 2e-3, 2e-2, 3e-3}, {1.5e-5, 2e-3, 1e-1, 2e-2}},
    [OC_LINEAR] = {{3e-6, 3e-3, 2e-2, 3e-3}, {3e-5, 1e-2, 1e-1, 1e-2}},
    [OC_ATTN] = {{1e-4, 5e-3, 4e-2, 3e-3}, {2e-5, 4e-3, 2e-2, 4e-3}},
    [OC_NORM] = {{8e-6, 8e-6, 8e-6, 8e-6}, {5e-5, 5e-5, 5e-5, 5e-5}},
    [OC_ELEM] = {{1e-6, 1e-6, 1e-6, 1e-6}, {3e-5, 3e-5, 3e-5, 3e-5}},
    [OC_TEMB] = {{5e-4, 5e-4, 5e-4, 5e-4}, {3e-4, 3e-4, 3e-4, 3e-4}},
    [OC_OPTIM] = {{1e-6, 1e-6, 1e-6, 1e-6}, {5e-5, 5e-5, 5e-5, 5e-5}},
};

/* The tolerance of a tensor of role (OUT or GRAD) of class cls in mode. */
double selftest_tol_of(int cls, int role, int mode)
{
    return op_tols[cls][role == GRAD][mode];
}

/* The worst selftest_tensor_error among a case's tensors of one role (OUT or GRAD);
 * *which: that tensor's index (-1 when the case has none). */
double selftest_worst_of(const op_case *oc, int role, float *const *a, float *const *b, int *which)
{
    double worst = 0;
    *which = -1;
    for (int i = 0; i < oc->nb; i++) {
        if (oc->b[i].role != role) continue;
        double e = selftest_tensor_error(a[i], b[i], oc->b[i].n);
        if (*which < 0 || !(e <= worst)) {
            worst = e;
            *which = i;
        }
    }
    return worst;
}

/* 1 when every output and gradient tensor of a case is within its
 * tolerance in mode. */
static int case_passes(const op_case *oc, float *const *a, float *const *b, int mode)
{
    int wf, wg;
    return selftest_worst_of(oc, OUT, a, b, &wf) <= selftest_tol_of(oc->cls, OUT, mode) &&
           selftest_worst_of(oc, GRAD, a, b, &wg) <= selftest_tol_of(oc->cls, GRAD, mode);
}

/* The check of the check (--mutate, the CPU against itself): each output
 * of a passing case zeroed, and each gradient put back to its starting
 * values (as if backward had not added into it), one at a time, judged
 * with every mode's tolerance for the case's class; each must fail.
 * Returns how many did not (or -1 when out of memory); prints the count. */
int selftest_mutations_missed(const op_case *oc, float *const *init, float **a, float *const *b)
{
    int tried = 0, missed = 0;
    for (int i = 0; i < oc->nb; i++) {
        if (oc->b[i].role != OUT && oc->b[i].role != GRAD) continue;
        size_t bytes = oc->b[i].n * sizeof(float);
        float *keep = malloc(bytes);
        if (!keep) return -1;
        memcpy(keep, a[i], bytes);
        if (oc->b[i].role == OUT) memset(a[i], 0, bytes);
        else memcpy(a[i], init[i], bytes);
        for (int m = 0; m < SELFTEST_NMODES; m++) {
            tried++;
            if (case_passes(oc, a, b, m)) {
                missed++;
                printf("  %s %s passed under the %s tolerance %.1e\n", oc->b[i].name,
                       oc->b[i].role == OUT ? "zeroed" : "without its gradient", selftest_mode_name(m),
                       selftest_tol_of(oc->cls, oc->b[i].role, m));
            }
        }
        memcpy(a[i], keep, bytes);
        free(keep);
    }
    printf("  %d of %d mutations caught (every output zeroed, every gradient dropped; strict, tf32, bf16, fp16)\n",
           tried - missed, tried);
    return missed;
}
