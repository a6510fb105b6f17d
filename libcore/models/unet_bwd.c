/* The UNet's backward pass: the planned ops' backward in reverse order.
 * Activation gradients live in dact, one block per tensor from its last
 * reader's backward (where it is zeroed) to its producer's; a tensor read by
 * several ops (residual streams, the time embedding, skip connections)
 * accumulates there, since every backward op adds into its gradients.
 * Blocks of finished gradients are reused, so dact is a fraction of the
 * activations. The inputs [0, nconst) get no gradient. */
#include <stdlib.h>
#include <string.h>

#include "unet_int.h"

/* Free blocks of the gradient buffer, sorted by offset. */
typedef struct {
    size_t *off, *len;
    size_t n, cap, top; /* top: the buffer's size so far */
} freelist;

/* First fit, else grow the buffer; SIZE_MAX when out of memory. */
static size_t fl_alloc(freelist *f, size_t len)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->len[i] >= len) {
            size_t off = f->off[i];
            f->off[i] += len;
            f->len[i] -= len;
            if (!f->len[i]) {
                memmove(f->off + i, f->off + i + 1, (f->n - i - 1) * sizeof(size_t));
                memmove(f->len + i, f->len + i + 1, (f->n - i - 1) * sizeof(size_t));
                f->n--;
            }
            return off;
        }
    size_t off = f->top;
    /* a free block at the very top grows in place */
    if (f->n && f->off[f->n - 1] + f->len[f->n - 1] == f->top) {
        off = f->off[f->n - 1];
        f->n--;
    }
    f->top = off + len;
    return off;
}

/* Return a block, merging it with free neighbours; 0 on success. */
static int fl_free(freelist *f, size_t off, size_t len)
{
    size_t i = 0;
    while (i < f->n && f->off[i] < off) i++;
    if (i > 0 && f->off[i - 1] + f->len[i - 1] == off) {
        f->len[i - 1] += len;
        if (i < f->n && off + len == f->off[i]) {
            f->len[i - 1] += f->len[i];
            memmove(f->off + i, f->off + i + 1, (f->n - i - 1) * sizeof(size_t));
            memmove(f->len + i, f->len + i + 1, (f->n - i - 1) * sizeof(size_t));
            f->n--;
        }
        return 0;
    }
    if (i < f->n && off + len == f->off[i]) {
        f->off[i] = off;
        f->len[i] += len;
        return 0;
    }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        size_t *a = realloc(f->off, cap * sizeof(size_t)), *b = a ? realloc(f->len, cap * sizeof(size_t)) : NULL;
        if (a) f->off = a;
        if (!b) return -1;
        f->len = b;
        f->cap = cap;
    }
    memmove(f->off + i + 1, f->off + i, (f->n - i) * sizeof(size_t));
    memmove(f->len + i + 1, f->len + i, (f->n - i) * sizeof(size_t));
    f->off[i] = off;
    f->len[i] = len;
    f->n++;
    return 0;
}

/* The op whose output starts at off (outputs grow with the op index), or
 * SIZE_MAX for an input or a statistic. */
static size_t producer(const sd_unet_graph *g, size_t off)
{
    size_t lo = 0, hi = g->nops;
    if (off < g->nconst) return SIZE_MAX;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g->ops[mid].y < off) lo = mid + 1;
        else hi = mid;
    }
    return lo < g->nops && g->ops[lo].y == off ? lo : SIZE_MAX;
}

/* Gradient sizes are rounded like activations. */
static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Simulate the backward pass: allocate an input's gradient at its last
 * reader, free an output's gradient after its producer. */
sd_status sd_unet_plan_grads(sd_unet_graph *g, sd_error *err)
{
    size_t n = g->nops, *last = malloc((n ? n : 1) * sizeof(size_t));
    freelist f = {0};
    if (!last) return sd_err_set(err, SD_ENOMEM, "out of memory planning the UNet");
    for (size_t i = 0; i < n; i++) {
        last[i] = SIZE_MAX;
        g->ops[i].gy = g->ops[i].gx = g->ops[i].gx2 = g->ops[i].gx3 = SIZE_MAX;
        g->ops[i].zero = 0;
    }
    for (size_t j = 0; j < n; j++) {
        sd_unet_op *o = &g->ops[j];
        const size_t in[3] = {o->x, o->x2, o->x3};
        for (int k = 0; k < 3; k++) {
            size_t p = in[k] == SIZE_MAX ? SIZE_MAX : producer(g, in[k]);
            o->px[k] = p;
            if (p != SIZE_MAX && (last[p] == SIZE_MAX || last[p] < j)) last[p] = j;
        }
    }
    size_t outp = producer(g, g->out);
    g->outp = outp;
    int oom = 0;
    if (outp != SIZE_MAX) g->ops[outp].gy = fl_alloc(&f, round16(g->ops[outp].ny));
    for (size_t j = n; j-- > 0;) {
        sd_unet_op *o = &g->ops[j];
        size_t *gx[3] = {&o->gx, &o->gx2, &o->gx3};
        for (int k = 0; k < 3; k++) {
            size_t p = o->px[k];
            if (p == SIZE_MAX) continue;
            if (last[p] == j && g->ops[p].gy == SIZE_MAX) {
                g->ops[p].gy = fl_alloc(&f, round16(g->ops[p].ny));
                o->zero |= 1u << k;
            }
            *gx[k] = g->ops[p].gy;
        }
        if (o->gy != SIZE_MAX && fl_free(&f, o->gy, round16(o->ny))) oom = 1;
    }
    g->ndact = f.top;
    free(last);
    free(f.off);
    free(f.len);
    return oom ? sd_err_set(err, SD_ENOMEM, "out of memory planning the UNet") : SD_OK;
}

/* Parameter gradient pointer, or NULL for an absent bias. */
static float *pgrad(float *dparams, size_t off)
{
    return off == SIZE_MAX ? NULL : dparams + off;
}

/* A gradient pointer in dact, NULL for "no gradient". */
static float *gp(float *dact, size_t off)
{
    return off == SIZE_MAX ? NULL : dact + off;
}

/* Seed the output's gradient, then each op's backward from the last to
 * the first, zeroing each input gradient where it starts; entering a
 * checkpointed segment (at its last op), first rerun its forward to refill
 * the intermediates it shares with the other segments. */
void sd_unet_backward(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                      const float *params, float *act, float *dact, const float *dout, float *dparams)
{
    const sd_unet_config *c = &u->cfg;
    if (g->outp == SIZE_MAX) return;
    be->d2d(exec, dact + g->ops[g->outp].gy, dout,
            (size_t)g->n * (size_t)c->out_channels * (size_t)g->h * (size_t)g->w * sizeof(float));
    size_t seg = g->nsegs;
    for (size_t i = g->nops; i-- > 0;) {
        if (seg > 0 && i + 1 == g->segs[seg - 1].end) {
            seg--;
            sd_unet_run_ops(g, g->segs[seg].begin, i, be, exec, params, act);
        }
        const sd_unet_op *o = &g->ops[i];
        if (o->gy == SIZE_MAX) continue; /* nothing reads this output */
        const size_t gin[3] = {o->gx, o->gx2, o->gx3};
        for (int k = 0; k < 3; k++)
            if (o->zero & (1u << k)) be->zero(exec, dact + gin[k], g->ops[o->px[k]].ny * sizeof(float));
        const float *dy = dact + o->gy, *x = act + o->x;
        float *dx = gp(dact, o->gx), *dx2 = gp(dact, o->gx2), *dx3 = gp(dact, o->gx3);
        switch (o->kind) {
        case UOP_CONV:
            be->conv2d_bwd(exec, &o->s.conv, dx, dparams + o->w, pgrad(dparams, o->b), dy, x, params + o->w);
            break;
        case UOP_GN:
            be->group_norm_bwd(exec, &o->s.gn, dx, dparams + o->w, dparams + o->b, dy, x, act + o->s1, act + o->s2,
                               params + o->w);
            break;
        case UOP_LINEAR:
            be->linear_bwd(exec, &o->s.lin, dx, dparams + o->w, pgrad(dparams, o->b), dy, x, params + o->w);
            break;
        case UOP_SILU:
            if (dx) be->silu_bwd(exec, o->s.n, dx, dy, x);
            break;
        case UOP_ADD: be->add_bwd(exec, o->s.n, dx, dx2, dy); break;
        case UOP_UP2X:
            if (dx) be->upsample2x_bwd(exec, o->s.up.planes, o->s.up.h, o->s.up.w, dx, dy);
            break;
        case UOP_ATTN:
            be->attn_bwd(exec, &o->s.attn, dx, dx2, dx3, dy, x, act + o->x2,
                         act + o->x3, act + o->y, act + o->s1);
            break;
        case UOP_LN:
            be->layer_norm_bwd(exec, &o->s.ln, dx, dparams + o->w, dparams + o->b, dy, x, act + o->s1, act + o->s2,
                               params + o->w);
            break;
        case UOP_GEGLU:
            if (dx) be->geglu_bwd(exec, o->s.gg.m, o->s.gg.n, dx, dy, x);
            break;
        case UOP_CONCAT: be->concat_bwd(exec, &o->s.cat, dx, dx2, dy); break;
        case UOP_BCAST:
            be->add_bcast_channel_bwd(exec, o->s.bc.n, o->s.bc.c, o->s.bc.hw, dx, dx2, dy);
            break;
        case UOP_TEMB:
            /* timesteps and size conditioning are inputs: nothing to propagate */
            break;
        case UOP_TRANS:
            if (dx) be->transpose_bwd(exec, o->s.tr.n, o->s.tr.rows, o->s.tr.cols, dx, dy);
            break;
        }
    }
}
