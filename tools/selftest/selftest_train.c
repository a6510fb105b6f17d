/* sd-selftest: the trainer's other optimizers, bf16 weights and fused
 * backward on a device against the CPU, through sd_trainer itself (the
 * path sd-train --device takes: the state mirrored in device memory, the
 * update through the backend table, the host copies a checkpoint reads).
 * The two runs are fed the same gradients (the CPU's, uploaded into the
 * device's gradient buffer before each update), so what is compared is
 * the update alone, whose kernels follow the CPU's arithmetic: the
 * tolerances only allow for what the design cannot pin down. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "selftest.h"

/* A run's end on the host: the weights as fp32 (bf16 ones widened), and
 * the optimizer state as its buffers (AdamW: m then v). */
typedef struct {
    float *w;
    size_t n;
    int w16;
    size_t nbufs;
    void *buf[SD_OPT_MAX_BUFS];
    size_t count[SD_OPT_MAX_BUFS];
    int u8[SD_OPT_MAX_BUFS]; /* 8-bit codes, else fp32 (or bf16 AdamW moments: widened) */
    const char *name[SD_OPT_MAX_BUFS];
} end_state;

/* Free what end_state holds. */
static void end_free(end_state *e)
{
    free(e->w);
    for (size_t i = 0; i < e->nbufs; i++) free(e->buf[i]);
    memset(e, 0, sizeof *e);
}

/* A copy of n bytes; NULL when out of memory. */
static void *dup_bytes(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

/* bf16 bits as fp32 (exact). */
static float widen16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The trainer's state copied out after sd_train_sync_host; 0 on success. */
static int end_take(sd_trainer *tr, end_state *e)
{
    size_t n = tr->unet.w.total;
    memset(e, 0, sizeof *e);
    e->n = n;
    e->w16 = tr->w16 != NULL;
    e->w = malloc(n * sizeof(float));
    if (!e->w) return -1;
    for (size_t i = 0; i < n; i++) e->w[i] = tr->w16 ? widen16(tr->w16[i]) : tr->unet.w.data[i];
    if (tr->o.optimizer == SD_OPT_ADAMW) {
        const void *mv[2] = {tr->m, tr->v};
        for (int k = 0; k < 2; k++) {
            float *f = malloc(n * sizeof(float));
            if (!f) return -1;
            for (size_t i = 0; i < n; i++)
                f[i] = tr->moment_size == 2 ? widen16(((const uint16_t *)mv[k])[i]) : ((const float *)mv[k])[i];
            e->buf[k] = f;
            e->count[k] = n;
            e->name[k] = k ? "v" : "m";
        }
        e->nbufs = 2;
        return 0;
    }
    for (size_t i = 0; i < tr->opt.nbufs; i++) {
        const sd_opt_buf *b = &tr->opt.bufs[i];
        e->u8[i] = b->st_dtype == SD_ST_U8;
        e->count[i] = b->count;
        e->name[i] = b->name;
        e->buf[i] = dup_bytes(b->data, b->count * (e->u8[i] ? 1 : 4));
        if (!e->buf[i]) return -1;
        e->nbufs = i + 1;
    }
    return 0;
}

/* The CPU table marked is_device: with --device cpu the "device" trainer
 * runs on it, so the trainer's device paths (state copies, uploads,
 * syncs, the mirrored optimizer state) run in the harness too. */
static sd_backend host_as_device(void)
{
    sd_backend b = *sd_backend_cpu();
    b.is_device = 1;
    b.name = "cpu (as a device)";
    return b;
}

/* Three steps on a device trainer (o) and a CPU trainer (the same options
 * on the CPU) from the same gradients; their end states out. 0 on
 * success. */
static int run_pair(const sd_train_opts *o, const selftest_in *in, end_state *dev, end_state *cpu)
{
    sd_trainer td, tc;
    sd_error err = {0};
    sd_train_opts oc = *o;
    oc.device = -1;
    oc.tf32 = 0;
    oc.mixed = 0;
    oc.backend = NULL;
    if (sd_trainer_open(&td, o, &err)) {
        fprintf(stderr, "sd-selftest: UNet %s: %s\n", o->unet, err.msg);
        return -1;
    }
    if (sd_trainer_open(&tc, &oc, &err)) {
        fprintf(stderr, "sd-selftest: UNet %s: %s\n", o->unet, err.msg);
        sd_trainer_close(&td);
        return -1;
    }
    sd_status rc = SD_OK;
    double loss;
    size_t n = tc.unet.w.total;
    for (int s = 0; s < 3 && !rc; s++) {
        rc = selftest_micro(&tc, in, &loss, &err);
        if (!rc) rc = selftest_micro(&td, in, &loss, &err);
        if (rc) break;
        td.be->h2d(td.exec, td.d_grad, tc.grad, n * sizeof(float)); /* the CPU's gradient on both */
        sd_train_apply(&tc);
        sd_train_apply(&td);
    }
    if (!rc) rc = sd_train_sync_host(&td, &err);
    if (rc) fprintf(stderr, "sd-selftest: UNet %s on %s: %s\n", o->unet, td.be->name, err.msg);
    int out = rc || end_take(&td, dev) || end_take(&tc, cpu) ? -1 : 0;
    sd_trainer_close(&td);
    sd_trainer_close(&tc);
    return out;
}

/* bf16 values (as widened fp32) that differ, and those not one bf16 step
 * apart (or of another sign). */
static void bf16_apart(const float *a, const float *b, size_t n, size_t *differ, size_t *far)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x, y;
        memcpy(&x, &a[i], 4);
        memcpy(&y, &b[i], 4);
        if (x == y) continue;
        (*differ)++;
        uint32_t hx = x >> 16, hy = y >> 16;
        *far += (hx ^ hy) >> 15 || (hx > hy ? hx - hy : hy - hx) != 1;
    }
}

/* The verdict on one configuration, printed: fp32 weights and fp32 state
 * within 1e-6 normwise (AdamW's shared formulas may be contracted into a
 * multiply-add on the GPU: an ulp; the others' kernels none expected);
 * bf16 weights at most 1 in 2048 values one bf16 step
 * apart (a last-bit difference before the stochastic rounding takes the
 * other side about once in 65536); 8-bit codes at most 1 in 4096 one code
 * apart. 1 pass. */
static int judge(const char *name, const char *what, const char *vs, const end_state *d, const end_state *c)
{
    int pass = d->n == c->n && d->nbufs == c->nbufs;
    char detail[512] = "";
    size_t at = 0;
    if (pass && d->w16) {
        size_t differ = 0, far = 0;
        bf16_apart(d->w, c->w, d->n, &differ, &far);
        pass = far == 0 && differ <= d->n / 2048;
        at += (size_t)snprintf(detail + at, sizeof detail - at, "weights: %zu bf16 values differ%s", differ,
                               far ? " (some by more than one step)" : "");
    } else if (pass) {
        double e = selftest_tensor_error(d->w, c->w, d->n);
        pass = e <= 1e-6;
        at += (size_t)snprintf(detail + at, sizeof detail - at, "weights %.2e", e);
    }
    for (size_t i = 0; pass && i < d->nbufs && at < sizeof detail; i++) {
        if (d->count[i] != c->count[i]) {
            pass = 0;
            break;
        }
        if (d->u8[i]) {
            size_t differ = 0, far = 0;
            const uint8_t *x = d->buf[i], *y = c->buf[i];
            for (size_t k = 0; k < d->count[i]; k++) {
                int dd = (int)x[k] - (int)y[k];
                differ += dd != 0;
                far += dd > 1 || dd < -1;
            }
            pass = far == 0 && differ <= d->count[i] / 4096;
            at += (size_t)snprintf(detail + at, sizeof detail - at, ", %s %zu codes differ", d->name[i], differ);
        } else {
            double e = selftest_tensor_error(d->buf[i], c->buf[i], d->count[i]);
            pass = e <= 1e-6;
            at += (size_t)snprintf(detail + at, sizeof detail - at, ", %s %.2e", d->name[i], e);
        }
    }
    if (vs) printf("tiny UNet %-4s 3 steps %-22s %s: %s  %s\n", name, what, vs, detail, pass ? "pass" : "FAIL");
    return pass;
}

/* --mutate, the check of the check: the device's weights with the
 * largest one 1e-5 off (fp32) or one value two bf16 steps off, and (8-bit
 * state) one code two apart, must each fail the verdict. 0 when every
 * mutation was caught. */
static int mutate_end(const char *name, const char *what, end_state *d, const end_state *c)
{
    int missed = 0;
    size_t big = 0;
    for (size_t i = 0; i < d->n; i++)
        if (fabsf(d->w[i]) > fabsf(d->w[big])) big = i;
    float keep = d->w[big];
    if (d->w16) {
        uint32_t u;
        memcpy(&u, &d->w[big], 4);
        u += 2u << 16;
        memcpy(&d->w[big], &u, 4);
    } else {
        d->w[big] *= 1.00001f;
    }
    missed += judge(name, what, NULL, d, c);
    d->w[big] = keep;
    for (size_t i = 0; i < d->nbufs; i++)
        if (d->u8[i] && d->count[i]) {
            uint8_t *q = d->buf[i], k = q[0];
            q[0] = (uint8_t)(k < 128 ? k + 2 : k - 2);
            missed += judge(name, what, NULL, d, c);
            q[0] = k;
        }
    printf("tiny UNet %-4s 3 steps %-22s mutations (a weight%s off) %s\n", name, what,
           d->nbufs && d->u8[0] ? ", a code" : "", missed ? "MISSED" : "caught");
    return missed;
}

/* --fused-backward on the device against the unfused update with
 * per-tensor clipping, also on the device: Adafactor on bf16 weights,
 * three steps each. The gradients come from each run's own backward
 * (the fused one into the per-op scratch), so they are the same unless
 * the device's backward depends on where its gradient goes. 1 pass, 0
 * fail, -1 error. */
static int check_fused(const char *name, const sd_train_opts *base, const selftest_in *in)
{
    end_state e[2];
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        sd_train_opts o = *base;
        o.optimizer = SD_OPT_ADAFACTOR;
        o.weight_dtype = SD_DT_BF16;
        o.fused_backward = k == 0;
        o.clip_per_tensor = k == 1;
        sd_trainer tr;
        sd_error err = {0};
        double loss;
        if (sd_trainer_open(&tr, &o, &err)) {
            fprintf(stderr, "sd-selftest: UNet %s: %s\n", o.unet, err.msg);
            return -1;
        }
        sd_status st = SD_OK;
        for (int s = 0; s < 3 && !st; s++) {
            st = selftest_micro(&tr, in, &loss, &err);
            if (!st) (void)(o.fused_backward ? sd_train_apply_fused(&tr) : sd_train_apply(&tr));
        }
        if (!st) st = sd_train_sync_host(&tr, &err);
        if (st) fprintf(stderr, "sd-selftest: UNet %s on %s: %s\n", o.unet, tr.be->name, err.msg);
        rc = st || end_take(&tr, &e[k]) ? -1 : 0;
        sd_trainer_close(&tr);
        if (rc) {
            if (k) end_free(&e[0]);
            return -1;
        }
    }
    int pass = judge(name, "adafactor bf16 fused", "fused vs unfused (per-tensor clip) on the device", &e[0], &e[1]);
    end_free(&e[0]);
    end_free(&e[1]);
    return pass;
}

/* See selftest.h. */
int selftest_train_optim(const char *dir, const char *name, int device, int tf32, int mixed, int mutate)
{
    sd_backend fake = host_as_device();
    char path[4096], model[4096];
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", dir, name);
    snprintf(model, sizeof model, "%s/%s/unet", dir, name);
    selftest_in in;
    if (selftest_inputs_open(&in, path)) {
        if (in.st) sd_st_close(in.st);
        return -1;
    }
    struct {
        const char *what;
        sd_optimizer opt;
        int w16;
        double beta1;
    } cfg[] = {{"adamw8bit", SD_OPT_ADAMW8BIT, 0, -1}, {"adafactor (beta1 0.9)", SD_OPT_ADAFACTOR, 0, 0.9},
               {"adamw bf16", SD_OPT_ADAMW, 1, -1}, {"adafactor bf16", SD_OPT_ADAFACTOR, 1, -1}};
    int rc = 1;
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0] && rc >= 0; i++) {
        sd_train_opts o;
        sd_train_opts_default(&o);
        o.unet = model;
        o.device = device;
        o.tf32 = tf32;
        o.mixed = mixed;
        o.quiet = 1;
        if (device < 0) o.backend = &fake; /* the harness: the device paths on the host */
        o.max_grad_norm = 0; /* no clipping: the factor's sum differs in its last bits between backends */
        o.lr.base = 1e-3;
        o.optimizer = cfg[i].opt;
        o.adafactor_beta1 = cfg[i].beta1;
        o.weight_dtype = cfg[i].w16 ? SD_DT_BF16 : SD_DT_F32;
        end_state d, c;
        if (run_pair(&o, &in, &d, &c)) {
            rc = -1;
            break;
        }
        rc = judge(name, cfg[i].what, "device vs CPU, same gradients", &d, &c) ? rc : 0;
        if (mutate && mutate_end(name, cfg[i].what, &d, &c)) rc = 0;
        end_free(&d);
        end_free(&c);
    }
    if (rc >= 0) {
        sd_train_opts o;
        sd_train_opts_default(&o);
        o.unet = model;
        o.device = device;
        o.tf32 = tf32;
        o.mixed = mixed;
        o.quiet = 1;
        if (device < 0) o.backend = &fake;
        o.lr.base = 1e-3;
        int f = check_fused(name, &o, &in);
        rc = f < 0 ? -1 : rc && f;
    }
    sd_st_close(in.st);
    return rc;
}
