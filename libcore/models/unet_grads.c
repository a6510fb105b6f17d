/* The UNet's gradient buffer, laid out once at planning time: each
 * activation gradient lives in dact from its last reader's backward (where
 * it is zeroed) to its producer's; a tensor read by several ops (residual
 * streams, the time embedding, skip connections) accumulates there, since
 * every backward op adds into its gradients. Blocks of finished gradients
 * are reused, so dact is a fraction of the activations. The inputs
 * [0, nconst) get no gradient. Called by the planner (unet.c); the backward
 * runner (unet_bwd.c) reads the offsets it sets. */
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
