/* sd-selftest: the tiny golden UNets (tests/golden/unet) through the
 * trainer on a GPU against the same trainer on the CPU: the forward pass,
 * the loss and every parameter gradient of one micro-batch, the path
 * sd-train --device takes. */
#include "selftest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "train.h"

/* Open dir/name/expected.safetensors; 0 on success (selftest.h). */
int selftest_inputs_open(selftest_in *in, const char *path)
{
    sd_error err = {0};
    memset(in, 0, sizeof *in);
    if (sd_st_open(&in->st, path, &err)) {
        fprintf(stderr, "sd-selftest: %s\n", err.msg);
        return -1;
    }
    in->x = sd_st_find(in->st, "x");
    in->t = sd_st_find(in->st, "t");
    in->ctx = sd_st_find(in->st, "ctx");
    in->target = sd_st_find(in->st, "target");
    in->text = sd_st_find(in->st, "text");
    in->tids = sd_st_find(in->st, "tids");
    if (!in->x || !in->t || !in->ctx || !in->target || in->x->ndim != 4 || in->ctx->ndim != 3) {
        fprintf(stderr, "sd-selftest: %s: no x/t/ctx/target tensors\n", path);
        return -1;
    }
    return 0;
}

/* Options for a quiet trainer of model on device (-1: the CPU). */
static sd_train_opts opts_for(const char *model, int device, int tf32, int mixed)
{
    sd_train_opts o;
    sd_train_opts_default(&o);
    o.unet = model;
    o.device = device;
    o.tf32 = tf32;
    o.mixed = mixed;
    o.quiet = 1;
    return o;
}

/* One micro-batch of the golden inputs on an open trainer; its loss out
 * (selftest.h). */
sd_status selftest_micro(sd_trainer *tr, const selftest_in *in, double *loss, sd_error *err)
{
    int b = (int)in->x->shape[0], t[64];
    if (b > 64) return sd_err_set(err, SD_EINVAL, "golden batch of %d: at most 64", b);
    for (int i = 0; i < b; i++) t[i] = (int)((const float *)in->t->data)[i];
    return sd_train_micro(tr, b, (int)in->x->shape[2], (int)in->x->shape[3], (int)in->ctx->shape[1], in->x->data,
                          in->ctx->data, in->text ? in->text->data : NULL, in->tids ? in->tids->data : NULL,
                          in->target->data, t, 1.0, loss, err);
}

/* What run_trainer copies out. */
enum { WANT_GRAD, WANT_EMA, WANT_MOMENTS };

/* Open a trainer with o, run `steps` micro-batches (each followed by an
 * optimizer step when steps > 1), bring the state to the host and copy
 * out (malloc'd) the gradient (steps 1), the EMA weights, or the AdamW
 * moments as fp32 (m then v, 2n floats); with slots, also the model's
 * parameter tensors (malloc'd, *nslots of them). 0 on success. */
static int run_trainer(const sd_train_opts *o, const selftest_in *in, int steps, int want, double *loss, float **out,
                       size_t *n, sd_weight_slot **slots, size_t *nslots)
{
    sd_trainer tr;
    sd_error err = {0};
    *out = NULL;
    if (sd_trainer_open(&tr, o, &err)) {
        fprintf(stderr, "sd-selftest: UNet %s: %s\n", o->unet, err.msg);
        return -1;
    }
    sd_status rc = SD_OK;
    for (int s = 0; s < steps && !rc; s++) {
        rc = selftest_micro(&tr, in, loss, &err);
        if (!rc && steps > 1) sd_train_apply(&tr);
    }
    if (!rc) rc = steps > 1 ? sd_train_sync_host(&tr, &err) : sd_train_grad_to_host(&tr, &err);
    if (rc) fprintf(stderr, "sd-selftest: UNet %s on %s: %s\n", o->unet, tr.be->name, err.msg);
    const float *src = want == WANT_GRAD ? tr.grad : tr.ema;
    *n = tr.unet.w.total;
    if (!rc && want == WANT_MOMENTS && tr.m && (*out = malloc(2 * *n * sizeof(float)))) {
        sd_train_moments_convert(*out, SD_DT_F32, tr.m, o->moments, *n);
        sd_train_moments_convert(*out + *n, SD_DT_F32, tr.v, o->moments, *n);
    } else if (!rc && want != WANT_MOMENTS && src && (*out = malloc(*n * sizeof(float)))) {
        memcpy(*out, src, *n * sizeof(float));
    }
    if (*out && slots) {
        *nslots = tr.unet.w.nslots;
        *slots = malloc(*nslots * sizeof **slots);
        if (*slots) memcpy(*slots, tr.unet.w.slots, *nslots * sizeof **slots);
        else {
            free(*out);
            *out = NULL;
        }
    }
    sd_trainer_close(&tr);
    return *out ? 0 : -1;
}

/* The largest |a - b| (NaN counts as infinite) and the largest |b|. */
static void max_diff(const float *a, const float *b, size_t n, double *emax, double *vmax)
{
    *emax = *vmax = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e != e) e = INFINITY;
        if (e > *emax) *emax = e;
        if (fabs((double)b[i]) > *vmax) *vmax = fabs((double)b[i]);
    }
}

/* The gradient check's tolerances in one numerics mode. Each parameter
 * tensor is judged by itself: max |gpu - cpu| / max(max |cpu|, floor) <=
 * tol, with floor = floor_frac x the largest |grad| G of the whole model
 * (so a tensor whose gradient is ~0 is judged on an absolute scale); the
 * loss by its relative difference. The H100 runs (docs/gpu-runs) logged
 * only the whole model's largest error A, not each tensor's, and no
 * tensor's error can exceed A: with tol x floor_frac x G >= 5 A a correct
 * GPU passes with a margin of at least 5 on the worst error measured, and
 * zeroing a tensor's gradient fails wherever its largest |grad| is above
 * tol x floor_frac x G. A over the two tiny UNets (G 0.216 SDXL, 0.226
 * SD), as a fraction of G: strict 4.1e-7 (runs 11, 14, 23, 25), TF32
 * 2.1e-4 (runs 11, 14, 25), bf16 4.0e-3 (runs 17, 20, 23), fp16 4.9e-4
 * (runs 17, 22); tol is about 12 times that and floor_frac 1/2, so tol x
 * floor_frac x G is 6 to 8 times A. Loss differences measured: equal in
 * strict mode (7 digits), 3.0e-6 TF32, 2.4e-4 bf16, 3.7e-5 fp16; the loss
 * tolerances are 8 to 14 times those. */
typedef struct {
    double tol, floor_frac, loss;
} grad_tols;

static const grad_tols unet_tols[SELFTEST_NMODES] = {
    [SELFTEST_STRICT] = {5e-6, 0.5, 1e-6},
    [SELFTEST_TF32] = {2.5e-3, 0.5, 3e-5},
    [SELFTEST_BF16] = {5e-2, 0.5, 2e-3},
    [SELFTEST_FP16] = {6e-3, 0.5, 3e-4},
};

/* The CPU's gradient and the model's tensors, which the device's
 * gradients are judged against. */
typedef struct {
    const float *g;
    size_t n;
    const sd_weight_slot *slots;
    size_t nslots;
    double gmax; /* largest |g| */
} grad_ref;

/* How one gradient fared: its worst tensor (error, slot), how many
 * tensors were over the tolerance, and for the record the worst error
 * relative to each tensor's own largest |grad| (no floor). */
typedef struct {
    double worst, own;
    size_t worst_slot, own_slot, failed;
} grad_verdict;

/* max |a - b| / max(max |b|, lo) over n floats; NaN: infinite. */
static double tensor_error(const float *a, const float *b, size_t n, double lo)
{
    double e, r;
    max_diff(a, b, n, &e, &r);
    return e / (r > lo ? r : lo);
}

/* Every tensor of g against the reference under t. */
static grad_verdict judge_grad(const grad_ref *ref, const float *g, const grad_tols *t)
{
    grad_verdict v = {0};
    double lo = t->floor_frac * ref->gmax;
    if (!(lo > 0)) lo = 1e-30;
    for (size_t i = 0; i < ref->nslots; i++) {
        const sd_weight_slot *s = &ref->slots[i];
        double e = tensor_error(g + s->off, ref->g + s->off, s->n, lo);
        double own = tensor_error(g + s->off, ref->g + s->off, s->n, 1e-30);
        if (!(e <= v.worst)) {
            v.worst = e;
            v.worst_slot = i;
        }
        if (!(own <= v.own)) {
            v.own = own;
            v.own_slot = i;
        }
        v.failed += !(e <= t->tol);
    }
    return v;
}

/* The device's gradient g and loss against the CPU's under mode's
 * tolerances, printed; 1 pass, 0 fail. */
static int report_grad(const char *name, const char *what, const grad_ref *ref, const float *g, double loss,
                       double loss_ref, int mode)
{
    const grad_tols *t = &unet_tols[mode];
    grad_verdict v = judge_grad(ref, g, t);
    double lrel = fabs(loss - loss_ref) / (fabs(loss_ref) > 0 ? fabs(loss_ref) : 1);
    int pass = v.failed == 0 && lrel <= t->loss;
    printf("tiny UNet %-4s (%zu parameters in %zu tensors) one training micro-batch%s: loss %.7f vs CPU %.7f (%.1e, "
           "tol %.0e); worst tensor %s %.2e (tol %.1e, floor %.1f x max |grad| %.2e), %zu over; on its own scale "
           "worst %s %.2e  %s\n",
           name, ref->n, ref->nslots, what, loss, loss_ref, lrel, t->loss, ref->slots[v.worst_slot].name, v.worst,
           t->tol, t->floor_frac, ref->gmax, v.failed, ref->slots[v.own_slot].name, v.own, pass ? "pass" : "FAIL");
    return pass;
}

/* The check of the check: g (a copy of a passing gradient) with each
 * tensor's gradient zeroed in turn, judged under every mode's tolerances.
 * Zeroing must fail for every tensor whose largest |grad| is above tol x
 * floor (6 to 8 times the mode's measured error); the tensors below that are
 * counted, not required. 1 when all that must be caught were, 0 otherwise
 * (or out of memory). */
static int mutate_grad(const char *name, const grad_ref *ref, float *g)
{
    int ok = 1;
    printf("tiny UNet %-4s each tensor's gradient zeroed in turn, caught:", name);
    for (int m = 0; m < SELFTEST_NMODES && ok >= 0; m++) {
        const grad_tols *t = &unet_tols[m];
        size_t caught = 0, must = 0, escaped = 0;
        for (size_t i = 0; i < ref->nslots && ok >= 0; i++) {
            const sd_weight_slot *s = &ref->slots[i];
            double e, r;
            max_diff(ref->g + s->off, ref->g + s->off, s->n, &e, &r);
            float *keep = malloc(s->n * sizeof(float));
            if (!keep) {
                ok = -1;
                break;
            }
            memcpy(keep, g + s->off, s->n * sizeof(float));
            memset(g + s->off, 0, s->n * sizeof(float));
            int hit = judge_grad(ref, g, t).failed > 0;
            memcpy(g + s->off, keep, s->n * sizeof(float));
            free(keep);
            caught += hit;
            if (r > t->tol * t->floor_frac * ref->gmax) {
                must++;
                escaped += !hit;
            }
        }
        printf(" %s %zu of %zu (of the %zu above %.1e: %s)%s", selftest_mode_name(m), caught, ref->nslots, must,
               t->tol * t->floor_frac * ref->gmax, escaped ? "NOT ALL" : "all", m + 1 < SELFTEST_NMODES ? "," : "");
        if (escaped) ok = 0;
    }
    printf("  %s\n", ok > 0 ? "pass" : "FAIL");
    return ok > 0;
}

/* See selftest.h: one tiny golden UNet through the trainer on the device and on the CPU. */
int selftest_unet(const char *dir, const char *name, int device, int tf32, int mixed, int mutate)
{
    char path[4096], model[4096];
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", dir, name);
    snprintf(model, sizeof model, "%s/%s/unet", dir, name);
    selftest_in in;
    if (selftest_inputs_open(&in, path)) {
        if (in.st) sd_st_close(in.st);
        return -1;
    }
    double lc, emax, vmax;
    float *gc = NULL;
    size_t nc = 0;
    grad_ref ref = {0};
    sd_weight_slot *slots = NULL;
    sd_train_opts cpu = opts_for(model, -1, 0, 0);
    int rc = run_trainer(&cpu, &in, 1, WANT_GRAD, &lc, &gc, &nc, &slots, &ref.nslots) ? -1 : 1;
    if (rc == 1) {
        max_diff(gc, gc, nc, &emax, &ref.gmax);
        ref.g = gc;
        ref.n = nc;
        ref.slots = slots;
    }
    /* the device without and with gradient checkpointing (the backward
     * recomputing each block's forward), each against the CPU */
    for (int ck = 0; ck < 2 && rc == 1; ck++) {
        double lg;
        float *gg = NULL;
        size_t ng = 0;
        sd_train_opts o = opts_for(model, device, tf32, mixed);
        o.checkpointing = ck;
        rc = -1;
        if (!run_trainer(&o, &in, 1, WANT_GRAD, &lg, &gg, &ng, NULL, NULL) && ng == nc) {
            rc = report_grad(name, ck ? ", checkpointed" : "", &ref, gg, lg, lc, selftest_mode(tf32, mixed));
            if (rc && mutate && !ck) rc = mutate_grad(name, &ref, gg);
        }
        free(gg);
    }
    free(slots);
    free(gc);
    /* three AdamW steps with the EMA (decay 0.9) in host memory
     * (--ema-on-cpu) against the EMA kept on the device */
    float *ed = NULL, *eh = NULL;
    size_t nd = 0, nh = 0;
    if (rc == 1) {
        sd_train_opts od = opts_for(model, device, tf32, mixed), oh = od;
        od.ema_decay = oh.ema_decay = 0.9;
        oh.ema_host = 1;
        double loss;
        rc = -1;
        if (!run_trainer(&od, &in, 3, WANT_EMA, &loss, &ed, &nd, NULL, NULL) &&
            !run_trainer(&oh, &in, 3, WANT_EMA, &loss, &eh, &nh, NULL, NULL) && nd == nh) {
            max_diff(eh, ed, nd, &emax, &vmax);
            double rel = vmax > 0 ? emax / vmax : emax;
            rc = rel <= 1e-6;
            printf("tiny UNet %-4s 3 AdamW steps, EMA in host memory vs on the device: max error %.2e of max |ema| "
                   "%.2e (%.2e)  %s\n",
                   name, emax, vmax, rel, rc ? "pass" : "FAIL");
        }
    }
    free(ed);
    free(eh);
    /* three AdamW steps with the moments in bf16 (--adam-moments bf16)
     * against fp32 moments, both on the device: brought back to the host,
     * they agree to about a bf16 spacing (2^-8 relative) per step, normwise;
     * lost, stale or misplaced moments would be off by their own size */
    float *m16 = NULL, *m32 = NULL;
    size_t n16 = 0, n32 = 0;
    if (rc == 1) {
        sd_train_opts o32 = opts_for(model, device, tf32, mixed), o16 = o32;
        o16.moments = SD_DT_BF16;
        double loss;
        rc = -1;
        if (!run_trainer(&o32, &in, 3, WANT_MOMENTS, &loss, &m32, &n32, NULL, NULL) &&
            !run_trainer(&o16, &in, 3, WANT_MOMENTS, &loss, &m16, &n16, NULL, NULL) && n16 == n32) {
            double rel[2];
            for (int k = 0; k < 2; k++) {
                double d2 = 0, r2 = 0;
                for (size_t i = k * n32; i < (k + 1) * n32; i++) {
                    double d = (double)m16[i] - (double)m32[i];
                    d2 += d * d;
                    r2 += (double)m32[i] * (double)m32[i];
                }
                rel[k] = r2 > 0 ? sqrt(d2 / r2) : (d2 > 0 ? INFINITY : 0);
                if (!(rel[k] == rel[k])) rel[k] = INFINITY;
            }
            rc = rel[0] <= 2e-2 && rel[1] <= 2e-2 && rel[0] > 0;
            printf("tiny UNet %-4s 3 AdamW steps, bf16 vs fp32 moments: normwise difference m %.2e, v %.2e  %s\n",
                   name, rel[0], rel[1], rc ? "pass" : "FAIL");
        }
    }
    free(m16);
    free(m32);
    sd_st_close(in.st);
    return rc;
}
