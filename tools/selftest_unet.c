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

/* One micro-batch on a trainer for `device`, with gradient checkpointing
 * or without; the loss and the gradient (malloc'd) out. 0 on success. */
static int one_micro(const char *model, int device, int tf32, int checkpoint, const inputs *in, double *loss,
                     float **grad, size_t *n)
{
    sd_train_opts o;
    sd_train_opts_default(&o);
    o.unet = model;
    o.device = device;
    o.tf32 = tf32;
    o.checkpointing = checkpoint;
    o.quiet = 1;
    sd_trainer tr;
    sd_error err = {0};
    if (sd_trainer_open(&tr, &o, &err)) {
        fprintf(stderr, "sd-selftest: UNet %s: %s\n", model, err.msg);
        return -1;
    }
    int b = (int)in->x->shape[0];
    int t[64];
    for (int i = 0; i < b && i < 64; i++) t[i] = (int)((const float *)in->t->data)[i];
    int rc = b > 64 ? -1 : 0;
    if (!rc && (sd_train_micro(&tr, b, (int)in->x->shape[2], (int)in->x->shape[3], (int)in->ctx->shape[1],
                               in->x->data, in->ctx->data, in->text ? in->text->data : NULL,
                               in->tids ? in->tids->data : NULL, in->target->data, t, 1.0, loss, &err) ||
                sd_train_grad_to_host(&tr, &err))) {
        fprintf(stderr, "sd-selftest: UNet %s on %s: %s\n", model, tr.be->name, err.msg);
        rc = -1;
    }
    *n = tr.unet.w.total;
    *grad = rc ? NULL : malloc(*n * sizeof(float));
    if (*grad) memcpy(*grad, tr.grad, *n * sizeof(float));
    else rc = -1;
    sd_trainer_close(&tr);
    return rc;
}

/* Three optimizer steps on the same micro-batch with an EMA (decay 0.9)
 * kept on the device or, with host set, in host memory (--ema-on-cpu); the
 * EMA weights (malloc'd) out. 0 on success. */
static int ema_after_steps(const char *model, int device, int tf32, int host, const inputs *in, float **ema,
                           size_t *n)
{
    sd_train_opts o;
    sd_train_opts_default(&o);
    o.unet = model;
    o.device = device;
    o.tf32 = tf32;
    o.ema_decay = 0.9;
    o.ema_host = host;
    o.quiet = 1;
    sd_trainer tr;
    sd_error err = {0};
    if (sd_trainer_open(&tr, &o, &err)) {
        fprintf(stderr, "sd-selftest: UNet %s: %s\n", model, err.msg);
        return -1;
    }
    int b = (int)in->x->shape[0], t[64], rc = b > 64 ? -1 : 0;
    for (int i = 0; i < b && i < 64; i++) t[i] = (int)((const float *)in->t->data)[i];
    for (int step = 0; step < 3 && !rc; step++) {
        double loss;
        rc = sd_train_micro(&tr, b, (int)in->x->shape[2], (int)in->x->shape[3], (int)in->ctx->shape[1], in->x->data,
                            in->ctx->data, in->text ? in->text->data : NULL, in->tids ? in->tids->data : NULL,
                            in->target->data, t, 1.0, &loss, &err)
                 ? -1
                 : 0;
        if (!rc) sd_train_apply(&tr);
    }
    if (!rc && sd_train_sync_host(&tr, &err)) rc = -1;
    if (rc) fprintf(stderr, "sd-selftest: UNet %s EMA on %s: %s\n", model, tr.be->name, err.msg);
    *n = tr.unet.w.total;
    *ema = rc ? NULL : malloc(*n * sizeof(float));
    if (*ema) memcpy(*ema, tr.ema, *n * sizeof(float));
    else rc = -1;
    sd_trainer_close(&tr);
    return rc;
}

int selftest_unet(const char *dir, const char *name, int device, int tf32, double tol)
{
    char path[4096], model[4096];
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", dir, name);
    snprintf(model, sizeof model, "%s/%s/unet", dir, name);
    inputs in;
    if (inputs_open(&in, path)) {
        if (in.st) sd_st_close(in.st);
        return -1;
    }
    double lc;
    float *gc = NULL;
    size_t nc = 0;
    int rc = one_micro(model, -1, 0, 0, &in, &lc, &gc, &nc) ? -1 : 1;
    /* the device without and with gradient checkpointing (the backward
     * recomputing each block's forward), each against the CPU */
    for (int ck = 0; ck < 2 && rc == 1; ck++) {
        double lg;
        float *gg = NULL;
        size_t ng = 0;
        rc = -1;
        if (!one_micro(model, device, tf32, ck, &in, &lg, &gg, &ng) && ng == nc) {
            double emax = 0, gmax = 0;
            for (size_t i = 0; i < ng; i++) {
                double e = fabs((double)gg[i] - (double)gc[i]);
                if (e != e) e = INFINITY;
                if (e > emax) emax = e;
                if (fabs((double)gc[i]) > gmax) gmax = fabs((double)gc[i]);
            }
            double rel = gmax > 0 ? emax / gmax : emax, lrel = fabs(lg - lc) / (fabs(lc) > 0 ? fabs(lc) : 1);
            rc = rel <= tol && lrel <= tol;
            printf("tiny UNet %-4s (%zu parameters) one training micro-batch%s: loss %.7f vs CPU %.7f, gradient max "
                   "error %.2e of max |grad| %.2e (%.2e)  %s\n",
                   name, ng, ck ? ", checkpointed" : "", lg, lc, emax, gmax, rel, rc ? "pass" : "FAIL");
        }
        free(gg);
    }
    free(gc);
    /* the EMA kept in host memory (--ema-on-cpu) against the EMA on the device */
    float *ed = NULL, *eh = NULL;
    size_t nd = 0, nh = 0;
    if (rc == 1) {
        rc = -1;
        if (!ema_after_steps(model, device, tf32, 0, &in, &ed, &nd) &&
            !ema_after_steps(model, device, tf32, 1, &in, &eh, &nh) && nd == nh) {
            double emax = 0, vmax = 0;
            for (size_t i = 0; i < nd; i++) {
                double e = fabs((double)ed[i] - (double)eh[i]);
                if (e != e) e = INFINITY;
                if (e > emax) emax = e;
                if (fabs((double)ed[i]) > vmax) vmax = fabs((double)ed[i]);
            }
            double rel = vmax > 0 ? emax / vmax : emax;
            rc = rel <= 1e-6;
            printf("tiny UNet %-4s 3 AdamW steps, EMA in host memory vs on the device: max error %.2e of max |ema| "
                   "%.2e (%.2e)  %s\n",
                   name, emax, vmax, rel, rc ? "pass" : "FAIL");
        }
    }
    free(ed);
    free(eh);
    sd_st_close(in.st);
    return rc;
}
