/* The per-tensor state of 8-bit AdamW and Adafactor: laid out from the
 * model's slots (shapes as diffusers has them), held in a few flat
 * buffers the checkpoint stores by name, and one step of either at the
 * scheduled rate (the element-wise work is ops_optim8.c's and
 * ops_adafactor.c's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"
#include "safetensors.h"

/* The names --optimizer takes, in sd_optimizer order. */
static const char *const opt_names[] = {"adamw", "adamw8bit", "adafactor"};

/* The option's name of an optimizer. */
const char *sd_optimizer_name(sd_optimizer o)
{
    return (unsigned)o < 3 ? opt_names[o] : "?";
}

/* One of the names --optimizer takes. */
int sd_optimizer_parse(const char *name, sd_optimizer *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, opt_names[i]) == 0) {
            *out = (sd_optimizer)i;
            return 1;
        }
    return 0;
}

/* Register a flat buffer of count values (zeroed); its data pointer is
 * filled by alloc_bufs. */
static void add_buf(sd_opt_state *s, const char *name, int st_dtype, size_t count)
{
    s->bufs[s->nbufs++] = (sd_opt_buf){.name = name, .st_dtype = st_dtype, .count = count};
}

/* Allocate every registered buffer zeroed; 0 when out of memory. */
static int alloc_bufs(sd_opt_state *s)
{
    for (size_t i = 0; i < s->nbufs; i++) {
        size_t es = s->bufs[i].st_dtype == SD_ST_U8 ? 1 : 4;
        s->bufs[i].data = calloc(s->bufs[i].count ? s->bufs[i].count : 1, es);
        if (!s->bufs[i].data) return 0;
    }
    return 1;
}

/* AdamW8bit's layout: tensors of SD_Q8_MIN_SIZE values and more get codes
 * (q8_m, q8_v) and per-block absmax (q8_absmax_m, q8_absmax_v), packed in
 * slot order; smaller ones fp32 moments (q8_m32, q8_v32). */
static void layout_q8(sd_opt_state *s, const sd_weights *w)
{
    size_t codes = 0, blocks = 0, small = 0;
    for (size_t k = 0; k < w->nslots; k++) {
        size_t n = w->slots[k].n;
        if (n >= SD_Q8_MIN_SIZE) {
            codes += n;
            blocks += (n + SD_Q8_BLOCK - 1) / SD_Q8_BLOCK;
        } else {
            small += n;
        }
    }
    add_buf(s, "q8_m", SD_ST_U8, codes);
    add_buf(s, "q8_v", SD_ST_U8, codes);
    add_buf(s, "q8_absmax_m", SD_ST_F32, blocks);
    add_buf(s, "q8_absmax_v", SD_ST_F32, blocks);
    add_buf(s, "q8_m32", SD_ST_F32, small);
    add_buf(s, "q8_v32", SD_ST_F32, small);
}

/* That layout allocated, the tables made and each tensor's views set. */
static int init_q8(sd_opt_state *s, const sd_weights *w)
{
    size_t codes = 0, blocks = 0, small = 0;
    s->q8 = calloc(w->nslots ? w->nslots : 1, sizeof *s->q8);
    s->tables = malloc(sizeof *s->tables);
    if (!s->q8 || !s->tables || !alloc_bufs(s)) return 0;
    sd_q8_dynamic_map(1, s->tables->code_m);
    sd_q8_dynamic_map(0, s->tables->code_v);
    sd_q8_lut(s->tables->code_m, s->tables->lut_m);
    sd_q8_lut(s->tables->code_v, s->tables->lut_v);
    codes = blocks = small = 0;
    for (size_t k = 0; k < w->nslots; k++) {
        sd_q8_tensor *t = &s->q8[k];
        t->off = w->slots[k].off;
        t->n = w->slots[k].n;
        if (t->n >= SD_Q8_MIN_SIZE) {
            t->qm = (uint8_t *)s->bufs[0].data + codes;
            t->qv = (uint8_t *)s->bufs[1].data + codes;
            t->am = (float *)s->bufs[2].data + blocks;
            t->av = (float *)s->bufs[3].data + blocks;
            codes += t->n;
            blocks += (t->n + SD_Q8_BLOCK - 1) / SD_Q8_BLOCK;
        } else {
            t->m32 = (float *)s->bufs[4].data + small;
            t->v32 = (float *)s->bufs[5].data + small;
            small += t->n;
        }
    }
    return 1;
}

/* The sizes of a slot's factored state: rows = n / last dim, cols = n /
 * second-last dim (transformers' shape[:-1] and shape[:-2] + shape[-1:]). */
static void factored_sizes(const sd_weight_slot *sl, size_t *rows, size_t *cols)
{
    *rows = sl->n / (size_t)sl->shape[sl->ndim - 1];
    *cols = sl->n / (size_t)sl->shape[sl->ndim - 2];
}

/* Adafactor's layout: adafactor_row and adafactor_col for tensors of rank
 * >= 2, adafactor_v for the rest, adafactor_m (every value) with a first
 * moment; packed in slot order. */
static void layout_af(sd_opt_state *s, const sd_weights *w, int with_m)
{
    size_t nr = 0, nc = 0, nv = 0, nm = 0;
    for (size_t k = 0; k < w->nslots; k++) {
        const sd_weight_slot *sl = &w->slots[k];
        if (sl->ndim >= 2) {
            size_t r, c;
            factored_sizes(sl, &r, &c);
            nr += r;
            nc += c;
        } else {
            nv += sl->n;
        }
        nm += sl->n;
    }
    add_buf(s, "adafactor_row", SD_ST_F32, nr);
    add_buf(s, "adafactor_col", SD_ST_F32, nc);
    add_buf(s, "adafactor_v", SD_ST_F32, nv);
    if (with_m) add_buf(s, "adafactor_m", SD_ST_F32, nm);
}

/* That layout allocated and each tensor's views set. */
static int init_af(sd_opt_state *s, const sd_weights *w, int with_m)
{
    size_t nr = 0, nc = 0, nv = 0, nm = 0;
    s->af = calloc(w->nslots ? w->nslots : 1, sizeof *s->af);
    if (!s->af || !alloc_bufs(s)) return 0;
    nr = nc = nv = nm = 0;
    for (size_t k = 0; k < w->nslots; k++) {
        const sd_weight_slot *sl = &w->slots[k];
        sd_adafactor_tensor *t = &s->af[k];
        t->off = sl->off;
        t->n = sl->n;
        t->ndim = sl->ndim;
        memcpy(t->shape, sl->shape, sizeof t->shape);
        if (sl->ndim >= 2) {
            size_t r, c;
            factored_sizes(sl, &r, &c);
            t->row = (float *)s->bufs[0].data + nr;
            t->col = (float *)s->bufs[1].data + nc;
            nr += r;
            nc += c;
        } else {
            t->v = (float *)s->bufs[2].data + nv;
            nv += sl->n;
        }
        if (with_m) t->m = (float *)s->bufs[3].data + nm;
        nm += sl->n;
    }
    return 1;
}

/* The buffers' names and sizes for w's tensors, nothing allocated: what
 * sd_opt_state_init allocates, and what the memory plan counts. */
void sd_opt_state_layout(sd_opt_state *s, sd_optimizer kind, int with_m, const sd_weights *w)
{
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->ntensors = w->nslots;
    if (kind == SD_OPT_ADAMW8BIT) layout_q8(s, w);
    else if (kind == SD_OPT_ADAFACTOR) layout_af(s, w, with_m);
}

/* The zeroed state for w's tensors. */
sd_status sd_opt_state_init(sd_opt_state *s, sd_optimizer kind, int with_m, const sd_weights *w, sd_error *err)
{
    sd_opt_state_layout(s, kind, with_m, w);
    if (kind == SD_OPT_ADAMW) return SD_OK;
    int ok = kind == SD_OPT_ADAMW8BIT ? init_q8(s, w) : init_af(s, w, with_m);
    if (ok) return SD_OK;
    size_t bytes = sd_opt_state_bytes(s);
    sd_opt_state_free(s);
    return sd_err_set(err, SD_ENOMEM, "out of memory for the %s state (%zu MiB)", sd_optimizer_name(kind),
                      bytes >> 20);
}

/* Free the buffers and views. */
void sd_opt_state_free(sd_opt_state *s)
{
    for (size_t i = 0; i < s->nbufs; i++) free(s->bufs[i].data);
    free(s->q8);
    free(s->tables);
    free(s->af);
    free(s->dq8); /* the device buffers themselves go with sd_opt_state_release */
    free(s->daf);
    memset(s, 0, sizeof *s);
}

/* Buffers, per-tensor views and tables. */
size_t sd_opt_state_bytes(const sd_opt_state *s)
{
    size_t b = 0;
    for (size_t i = 0; i < s->nbufs; i++) b += s->bufs[i].count * (s->bufs[i].st_dtype == SD_ST_U8 ? 1 : 4);
    if (s->kind == SD_OPT_ADAMW8BIT) b += sizeof(sd_q8_tables) + s->ntensors * sizeof(sd_q8_tensor);
    if (s->kind == SD_OPT_ADAFACTOR) b += s->ntensors * sizeof(sd_adafactor_tensor);
    return b;
}

/* The buffer of that name. */
sd_opt_buf *sd_opt_state_buf(sd_opt_state *s, const char *name)
{
    for (size_t i = 0; i < s->nbufs; i++)
        if (strcmp(s->bufs[i].name, name) == 0) return &s->bufs[i];
    return NULL;
}

/* AdamW8bit's constants for step t, as bitsandbytes' CPU path rounds its
 * Python floats into fp32 tensor operations. */
static sd_adamw8_args q8_args(const sd_adamw_opts *o, double lr, long t, double gscale)
{
    double c1 = 1.0 - pow(o->beta1, (double)t), c2 = sqrt(1.0 - pow(o->beta2, (double)t));
    sd_adamw8_args a = {.b1 = (float)o->beta1, .b2 = (float)o->beta2, .one_b1 = (float)(1.0 - o->beta1),
                        .one_b2 = (float)(1.0 - o->beta2), .eps = (float)o->eps, .bc2 = (float)c2,
                        .neg_lr_c1 = (float)(-lr / c1), .eps_c2 = (float)(o->eps * c2),
                        .step_size = (float)(-lr * c2 / c1), .decay = (float)(1.0 - lr * o->weight_decay),
                        .gscale = (float)gscale, .decay_on = o->weight_decay > 0.0};
    return a;
}

/* Adafactor's constants for step t: beta2t = 1 - t^-0.8. */
static sd_adafactor_args af_args(const sd_adamw_opts *o, double beta1, double lr, long t, double gscale)
{
    double b2t = 1.0 - pow((double)t, -0.8);
    sd_adafactor_args a = {.beta2t = (float)b2t, .one_beta2t = (float)(1.0 - b2t), .lr = (float)lr,
                           .beta1 = (float)(beta1 >= 0 ? beta1 : 0), .one_beta1 = (float)(1.0 - beta1),
                           .neg_wd_lr = (float)(-o->weight_decay * lr), .gscale = (float)gscale,
                           .clip_threshold = 1.0, .decay_on = o->weight_decay != 0.0};
    return a;
}

/* One step of the state's optimizer on be (the device views when the
 * state is on a device). */
void sd_opt_state_step(sd_opt_state *s, const sd_backend *be, void *exec, const sd_adamw_opts *o,
                       double adafactor_beta1, double lr, long step, double gscale, float *p, const float *g)
{
    if (s->kind == SD_OPT_ADAMW8BIT) {
        sd_adamw8_args a = q8_args(o, lr, step, gscale);
        be->adamw8(exec, &a, s->tables, s->ntensors, s->dq8 ? s->dq8 : s->q8, p, g);
    } else if (s->kind == SD_OPT_ADAFACTOR) {
        sd_adafactor_args a = af_args(o, adafactor_beta1, lr, step, gscale);
        be->adafactor(exec, &a, s->ntensors, s->daf ? s->daf : s->af, p, g);
    }
}

/* Tensor t's float offset and size (*off, *n) in the flat weights. */
void sd_opt_state_tensor(const sd_opt_state *s, size_t t, size_t *off, size_t *n)
{
    if (s->kind == SD_OPT_ADAMW8BIT) {
        *off = s->q8[t].off;
        *n = s->q8[t].n;
    } else {
        *off = s->af[t].off;
        *n = s->af[t].n;
    }
}

/* The bytes of descriptors sd_opt_state_step_group copies for a group. */
size_t sd_opt_state_group_bytes(const sd_opt_state *s)
{
    size_t one = s->kind == SD_OPT_ADAMW8BIT ? sizeof(sd_q8_tensor) : sizeof(sd_adafactor_tensor);
    return (s->ntensors ? s->ntensors : 1) * one;
}

/* One step on tensors [t0, t1) only, with p and g holding the floats from
 * tensor t0's offset on (bf16 weights widen one group of tensors at a
 * time): their descriptors copied into tmp (sd_opt_state_group_bytes)
 * with the offsets made relative, the state itself shared. Per tensor the
 * same arithmetic as sd_opt_state_step. */
void sd_opt_state_step_group(sd_opt_state *s, const sd_backend *be, void *exec, const sd_adamw_opts *o,
                             double adafactor_beta1, double lr, long step, double gscale, size_t t0, size_t t1,
                             void *tmp, float *p, const float *g)
{
    size_t base, n;
    sd_opt_state_tensor(s, t0, &base, &n);
    if (s->kind == SD_OPT_ADAMW8BIT) {
        const sd_q8_tensor *from = s->dq8 ? s->dq8 : s->q8;
        sd_q8_tensor *ts = tmp;
        for (size_t k = t0; k < t1; k++) {
            ts[k - t0] = from[k];
            ts[k - t0].off -= base;
        }
        sd_adamw8_args a = q8_args(o, lr, step, gscale);
        be->adamw8(exec, &a, s->tables, t1 - t0, ts, p, g);
    } else if (s->kind == SD_OPT_ADAFACTOR) {
        const sd_adafactor_tensor *from = s->daf ? s->daf : s->af;
        sd_adafactor_tensor *ts = tmp;
        for (size_t k = t0; k < t1; k++) {
            ts[k - t0] = from[k];
            ts[k - t0].off -= base;
        }
        sd_adafactor_args a = af_args(o, adafactor_beta1, lr, step, gscale);
        be->adafactor(exec, &a, t1 - t0, ts, p, g);
    }
}
