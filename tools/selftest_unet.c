/* sd-selftest: the tiny golden UNets (tests/golden/unet) through the
 * trainer on a GPU against the same trainer on the CPU: the forward pass,
 * the loss and every parameter gradient of one micro-batch, the path
 * sd-train --device takes. */
#include "selftest_unet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "train.h"

/* The golden inputs of one config. */
typedef struct {
    sd_safetensors *st;
    const sd_st_tensor *x, *t, *ctx, *text, *tids, *target;
} inputs;

/* Open dir/name/expected.safetensors; 0 on success. */
static int inputs_open(inputs *in, const char *path)
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

/* One micro-batch of the golden inputs on an open trainer; its loss out. */
static sd_status micro_on(sd_trainer *tr, const inputs *in, double *loss, sd_error *err)
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
 * moments as fp32 (m then v, 2n floats). 0 on success. */
static int run_trainer(const sd_train_opts *o, const inputs *in, int steps, int want, double *loss, float **out,
                       size_t *n)
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
        rc = micro_on(&tr, in, loss, &err);
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

int selftest_unet(const char *dir, const char *name, int device, int tf32, int mixed, double tol)
{
    char path[4096], model[4096];
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", dir, name);
    snprintf(model, sizeof model, "%s/%s/unet", dir, name);
    inputs in;
    if (inputs_open(&in, path)) {
        if (in.st) sd_st_close(in.st);
        return -1;
    }
    double lc, emax, vmax;
    float *gc = NULL;
    size_t nc = 0;
    sd_train_opts cpu = opts_for(model, -1, 0, 0);
    int rc = run_trainer(&cpu, &in, 1, WANT_GRAD, &lc, &gc, &nc) ? -1 : 1;
    /* the device without and with gradient checkpointing (the backward
     * recomputing each block's forward), each against the CPU */
    for (int ck = 0; ck < 2 && rc == 1; ck++) {
        double lg;
        float *gg = NULL;
        size_t ng = 0;
        sd_train_opts o = opts_for(model, device, tf32, mixed);
        o.checkpointing = ck;
        rc = -1;
        if (!run_trainer(&o, &in, 1, WANT_GRAD, &lg, &gg, &ng) && ng == nc) {
            max_diff(gg, gc, ng, &emax, &vmax);
            double rel = vmax > 0 ? emax / vmax : emax, lrel = fabs(lg - lc) / (fabs(lc) > 0 ? fabs(lc) : 1);
            rc = rel <= tol && lrel <= tol;
            printf("tiny UNet %-4s (%zu parameters) one training micro-batch%s: loss %.7f vs CPU %.7f, gradient max "
                   "error %.2e of max |grad| %.2e (%.2e)  %s\n",
                   name, ng, ck ? ", checkpointed" : "", lg, lc, emax, vmax, rel, rc ? "pass" : "FAIL");
        }
        free(gg);
    }
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
        if (!run_trainer(&od, &in, 3, WANT_EMA, &loss, &ed, &nd) && !run_trainer(&oh, &in, 3, WANT_EMA, &loss, &eh, &nh) &&
            nd == nh) {
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
        if (!run_trainer(&o32, &in, 3, WANT_MOMENTS, &loss, &m32, &n32) &&
            !run_trainer(&o16, &in, 3, WANT_MOMENTS, &loss, &m16, &n16) && n16 == n32) {
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
