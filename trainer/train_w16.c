/* --weight-dtype bf16: the trainable weights held as bf16 (tr->w16, no
 * fp32 copy of the model at any time). The UNet widens one op's weights
 * at a time (sd_unet_wts); the update widens a chunk of weights, runs the
 * fp32 optimizer on it and stores it back with stochastic rounding keyed
 * by (seed, step, element), so a resumed run rounds as the uninterrupted
 * one did. Widening, optimizer and store all go through the backend
 * table (d_w16, d_upd: the host buffers on the CPU, device ones on a
 * GPU). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
#include "ops_cpu.h"
#include "ops_math.h"
#include "optim.h"
#include "train_int.h"

/* Elements of one AdamW update chunk: the fp32 scratch the update widens
 * into. */
enum { W16_CHUNK = 1 << 16 };

/* The floats of the update's scratch: AdamW's chunk (the whole model when
 * smaller); the per-tensor optimizers (adamw8bit, adafactor) update whole
 * tensors, so at least the largest one. The memory plan counts these. */
size_t sd_train_w16_chunk(const sd_train_opts *o, const sd_weights *w)
{
    size_t c = W16_CHUNK;
    if (o->optimizer != SD_OPT_ADAMW)
        for (size_t i = 0; i < w->nslots; i++)
            if (w->slots[i].n > c) c = w->slots[i].n;
    if (c > w->total) c = w->total;
    return c ? c : 1;
}

/* The bytes of the per-tensor optimizers' group descriptors (copied per
 * group with relative offsets; sd_opt_state_step_group), 0 for AdamW. */
size_t sd_train_w16_desc_bytes(const sd_train_opts *o, const sd_weights *w)
{
    size_t one = sizeof(sd_q8_tensor) > sizeof(sd_adafactor_tensor) ? sizeof(sd_q8_tensor)
                                                                     : sizeof(sd_adafactor_tensor);
    return o->optimizer == SD_OPT_ADAMW ? 0 : (w->nslots ? w->nslots : 1) * one;
}

/* n floats narrowed into the bf16 weights (nearest even, NaN kept a NaN):
 * exact for values that came from bf16 weights; a resume of fp32 weights. */
void sd_train_w16_narrow(sd_trainer *tr, const float *src)
{
    for (size_t i = 0; i < tr->unet.w.total; i++) tr->w16[i] = sd_f32_to_bf16(src[i]);
}

/* n bf16 values widened into dst (exact). */
void sd_train_w16_widen(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = sdm_bf16_widen(src[i]);
}

/* Start a bf16 run whose weights open_model (train_open.c) loaded or
 * initialised straight into w16: the update's scratch and the group
 * descriptors. unet.w.data stays NULL except while a checkpoint is written
 * or read (sd_train_w16_f32). */
sd_status sd_train_w16_open(sd_trainer *tr, sd_error *err)
{
    size_t desc = sd_train_w16_desc_bytes(&tr->o, &tr->unet.w);
    tr->upd = malloc(sd_train_w16_chunk(&tr->o, &tr->unet.w) * sizeof(float));
    tr->desc = desc ? malloc(desc) : NULL;
    if (!tr->w16 || tr->unet.w.data)
        return sd_err_set(err, SD_EINVAL, "bf16 weights: the model was not opened as bf16 (open_model)");
    if (!tr->upd || (desc && !tr->desc))
        return sd_err_set(err, SD_ENOMEM, "out of memory for the bf16 weights' update scratch");
    return SD_OK;
}

/* A bf16 run's weights as fp32 in unet.w.data, for a resume to read into
 * or a --save-full file to be written from: the gradient buffer lends its
 * n floats (between steps it holds zeros, and a resume zeroes it), so no
 * memory is allocated. sd_train_w16_f32_done gives it back. Nothing for
 * fp32 runs. */
sd_status sd_train_w16_f32(sd_trainer *tr, sd_error *err)
{
    if (!tr->w16 || tr->unet.w.data) return SD_OK;
    /* --fused-backward and --grad-dtype bf16 have no fp32 gradient buffer to
     * lend: a temporary one, for the save or resume only (4 bytes a
     * parameter at those moments) */
    tr->unet.w.data = tr->grad ? tr->grad : malloc(tr->unet.w.total * sizeof(float));
    if (!tr->unet.w.data)
        return sd_err_set(err, SD_ENOMEM, "out of memory for an fp32 view of the bf16 weights (%zu MB)",
                          tr->unet.w.total * sizeof(float) >> 20);
    sd_train_w16_widen(tr->unet.w.data, tr->w16, tr->unet.w.total);
    return SD_OK;
}

/* After sd_train_w16_f32: with narrow set (a resume read new weights into
 * it) the values go into w16 first; the gradient buffer is zeroed again. */
void sd_train_w16_f32_done(sd_trainer *tr, int narrow)
{
    if (!tr->w16 || !tr->unet.w.data) return;
    if (narrow) sd_train_w16_narrow(tr, tr->unet.w.data);
    if (tr->grad) memset(tr->grad, 0, tr->unet.w.total * sizeof(float));
    else free(tr->unet.w.data);
    tr->unet.w.data = NULL;
}

/* The parameters the UNet reads in this run, on its backend. */
sd_unet_wts sd_train_wts(const sd_trainer *tr)
{
    sd_unet_wts w = {tr->d_w, tr->d_w16, tr->wscr};
    return w;
}

/* The stochastic-rounding key of the weights' update that makes `step`:
 * from the seed and the step alone (another stream than the moments'). */
static uint32_t w16_key(const sd_trainer *tr, long step)
{
    return (uint32_t)(sd_train_mix64(sd_train_mix64(tr->o.seed ^ 0x7765696768743136ULL) ^ (uint64_t)step) >> 32);
}

/* The values [lo, hi) of the update's scratch rounded back into the bf16
 * weights with the step's key (element i's bits from its global index). */
static void store(sd_trainer *tr, uint32_t key, size_t lo, size_t hi)
{
    tr->be->bf16_store_sr(tr->exec, hi - lo, lo, key, tr->d_w16 + lo, tr->d_upd);
}

/* Weights [lo, lo + n) widened into the update's scratch. */
static void widen_chunk(sd_trainer *tr, size_t lo, size_t n)
{
    tr->be->bf16_widen(tr->exec, n, tr->d_upd, tr->d_w16 + lo);
}

/* AdamW on the bf16 weights, chunk by chunk: widened, updated by the
 * backend's fp32 AdamW (moments fp32 or bf16 as the run keeps them), and
 * rounded back stochastically. */
void sd_train_w16_adamw(sd_trainer *tr, sd_adamw_args *a)
{
    sd_train_w16_adamw_range(tr, a, 0, tr->unet.w.total, tr->d_grad);
}

/* The same on elements [lo, lo + n) with their gradient g (g[0] is element
 * lo's): element-wise, keyed by the global index, so any split of the
 * model gives the same bits. */
void sd_train_w16_adamw_range(sd_trainer *tr, sd_adamw_args *a, size_t lo, size_t n, const float *g)
{
    size_t chunk = sd_train_w16_chunk(&tr->o, &tr->unet.w);
    uint32_t key = w16_key(tr, tr->step + 1);
    for (size_t at = lo; at < lo + n; at += chunk) {
        size_t k = lo + n - at < chunk ? lo + n - at : chunk;
        widen_chunk(tr, at, k);
        if (tr->moment_size == 2) {
            tr->be->adamw_bf16(tr->exec, a, k, at, tr->d_upd, (uint16_t *)tr->d_m + at, (uint16_t *)tr->d_v + at,
                               g + (at - lo));
        } else {
            tr->be->adamw(tr->exec, a, k, tr->d_upd, (float *)tr->d_m + at, (float *)tr->d_v + at, g + (at - lo));
        }
        store(tr, key, at, at + k);
    }
}

/* Tensors [t0, t1) of --optimizer adamw8bit or adafactor on the bf16
 * weights (g: the gradient from tensor t0's offset on): widened, stepped
 * in fp32, rounded back. */
void sd_train_w16_other_group(sd_trainer *tr, double lr, double gscale, size_t t0, size_t t1, const float *g)
{
    size_t lo, n, off, m;
    sd_opt_state_tensor(&tr->opt, t0, &lo, &n);
    sd_opt_state_tensor(&tr->opt, t1 - 1, &off, &m);
    size_t hi = off + m;
    widen_chunk(tr, lo, hi - lo);
    sd_opt_state_step_group(&tr->opt, tr->be, tr->exec, &tr->o.adam, tr->o.adafactor_beta1, lr, tr->step + 1, gscale,
                            t0, t1, tr->desc, tr->d_upd, g);
    store(tr, w16_key(tr, tr->step + 1), lo, hi);
}

/* --optimizer adamw8bit or adafactor on the bf16 weights: consecutive
 * whole tensors grouped up to the scratch's size, widened, stepped in
 * fp32 (sd_opt_state_step_group: per tensor the arithmetic of the fp32
 * run) and rounded back as AdamW's are. */
void sd_train_w16_other(sd_trainer *tr, double lr, double gscale)
{
    size_t chunk = sd_train_w16_chunk(&tr->o, &tr->unet.w), nt = tr->opt.ntensors;
    for (size_t t0 = 0, t1; t0 < nt; t0 = t1) {
        size_t lo, n, off, m;
        sd_opt_state_tensor(&tr->opt, t0, &lo, &n);
        for (t1 = t0 + 1; t1 < nt; t1++) {
            sd_opt_state_tensor(&tr->opt, t1, &off, &m);
            if (off + m - lo > chunk) break;
        }
        sd_train_w16_other_group(tr, lr, gscale, t0, t1, tr->d_grad + lo);
    }
}

/* The fp32 EMA's step toward the bf16 weights, chunk by chunk: on the
 * backend that holds the EMA, or (a GPU run with --ema-on-cpu, no d_ema)
 * each widened chunk copied into the host's update scratch and stepped by
 * the CPU's EMA op, as an fp32 run's host EMA steps toward its copied
 * weights: the same arithmetic either way. */
void sd_train_w16_ema(sd_trainer *tr, float rate)
{
    size_t n = tr->unet.w.total, chunk = sd_train_w16_chunk(&tr->o, &tr->unet.w);
    for (size_t lo = 0; lo < n; lo += chunk) {
        size_t k = n - lo < chunk ? n - lo : chunk;
        widen_chunk(tr, lo, k);
        if (tr->d_ema) {
            tr->be->ema(tr->exec, k, tr->d_ema + lo, tr->d_upd, rate);
        } else {
            tr->be->d2h(tr->exec, tr->upd, tr->d_upd, k * sizeof(float));
            sd_ema_fwd(tr->pool, k, tr->ema + lo, tr->upd, rate);
        }
    }
}

/* Whether every bf16 weight is finite: none has an all-ones exponent. On
 * a device, chunk by chunk widened and summed in squares there (finite
 * exactly when every value is); NaN from a failed device counts as not
 * finite, and its error is what the caller's sync reports. */
int sd_train_w16_finite(sd_trainer *tr)
{
    size_t n = tr->unet.w.total;
    if (tr->be->is_device) {
        size_t chunk = sd_train_w16_chunk(&tr->o, &tr->unet.w);
        for (size_t lo = 0; lo < n; lo += chunk) {
            size_t k = n - lo < chunk ? n - lo : chunk;
            widen_chunk(tr, lo, k);
            if (!isfinite(tr->be->sum_squares(tr->exec, k, tr->d_upd))) return 0;
        }
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        if ((tr->w16[i] & 0x7f80u) == 0x7f80u) return 0;
    return 1;
}

/* The training weights as fp32 in the backend's memory for the samples:
 * on a device, widened into the gradient buffer (zero between steps) or,
 * with --fused-backward (none), into a buffer of their own (*tmp, the
 * caller releases it); on the CPU the host view (sd_train_w16_f32). NULL
 * on an error. sd_train_w16_dev_f32_done gives the gradient buffer back. */
const float *sd_train_w16_dev_f32(sd_trainer *tr, float **tmp, sd_error *err)
{
    size_t n = tr->unet.w.total;
    *tmp = NULL;
    if (!tr->be->is_device) return sd_train_w16_f32(tr, err) ? NULL : tr->unet.w.data;
    float *dst = tr->d_grad;
    if (!dst) {
        dst = *tmp = tr->be->alloc(tr->exec, n * sizeof(float));
        if (!dst) {
            sd_err_set(err, SD_ENOMEM, "out of device memory for an fp32 view of the bf16 weights (%zu MiB)",
                       n * sizeof(float) >> 20);
            return NULL;
        }
    }
    tr->be->bf16_widen(tr->exec, n, dst, tr->d_w16);
    return dst;
}

/* After sd_train_w16_dev_f32: the gradient buffer zeroed again when it
 * was lent (the host view's end on the CPU). */
void sd_train_w16_dev_f32_done(sd_trainer *tr, const float *view)
{
    if (!tr->be->is_device) {
        sd_train_w16_f32_done(tr, 0);
        return;
    }
    if (view && view == tr->d_grad) tr->be->zero(tr->exec, tr->d_grad, tr->unet.w.total * sizeof(float));
}
