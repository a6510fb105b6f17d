/* The UNet's backward pass: the planned ops' backward in reverse order,
 * into the gradient buffer unet_grads.c laid out. */
#include <stddef.h>

#include "unet_int.h"

/* Parameter gradient pointer, or NULL for an absent bias. */
static float *pgrad(float *dparams, size_t off)
{
    return off == SIZE_MAX ? NULL : dparams + off;
}

/* The floats of the parameter tensor at offset off (0 when absent): the
 * slots are registered in offset order, so a binary search finds it. */
static size_t slot_floats(const sd_weights *w, size_t off)
{
    size_t lo = 0, hi = w->nslots;
    if (off == SIZE_MAX) return 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->slots[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo < w->nslots && w->slots[lo].off == off ? w->slots[lo].n : 0;
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
    sd_unet_wts w = {params, NULL, NULL};
    sd_unet_backward_wts(u, g, be, exec, &w, act, dact, dout, dparams);
}

/* The same with w's parameters: each op's fetched (widened, for bf16) just
 * before its backward, after any recomputation that widened others. */
void sd_unet_backward_wts(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                          const sd_unet_wts *w, float *act, float *dact, const float *dout, float *dparams)
{
    (void)sd_unet_backward_fused(u, g, be, exec, w, act, dact, dout, dparams, NULL);
}

/* The largest parameter scratch one op needs: its weight's and bias's
 * floats together (what --fused-backward allocates instead of a gradient
 * buffer of the whole model). */
size_t sd_unet_fused_scratch(const sd_unet *u, const sd_unet_graph *g)
{
    size_t most = 0;
    for (size_t i = 0; i < g->nops; i++) {
        size_t k = slot_floats(&u->w, g->ops[i].w) + slot_floats(&u->w, g->ops[i].b);
        if (k > most) most = k;
    }
    return most;
}

/* The walk of sd_unet_backward_fused without the arithmetic: the last op
 * first, ops whose output nothing reads skipped, weight then bias. */
size_t sd_unet_fused_order(const sd_unet *u, const sd_unet_graph *g, size_t *off, size_t *len)
{
    size_t k = 0;
    if (g->outp == SIZE_MAX) return 0;
    for (size_t i = g->nops; i-- > 0;) {
        const sd_unet_op *o = &g->ops[i];
        if (o->gy == SIZE_MAX || o->w == SIZE_MAX) continue;
        off[k] = o->w;
        len[k++] = slot_floats(&u->w, o->w);
        if (o->b == SIZE_MAX) continue;
        off[k] = o->b;
        len[k++] = slot_floats(&u->w, o->b);
    }
    return k;
}

/* The backward pass, with f (not NULL) each op's parameter gradients
 * computed into f->scratch (zeroed first) instead of dparams and handed to
 * f->done as soon as the op's backward is over (weight, then bias); a
 * nonzero answer from done stops the pass and is returned. */
int sd_unet_backward_fused(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                           const sd_unet_wts *w, float *act, float *dact, const float *dout, float *dparams,
                           const sd_unet_fuse *f)
{
    const sd_unet_config *c = &u->cfg;
    if (g->outp == SIZE_MAX) return 0;
    be->d2d(exec, dact + g->ops[g->outp].gy, dout,
            (size_t)g->n * (size_t)c->out_channels * (size_t)g->h * (size_t)g->w * sizeof(float));
    size_t seg = g->nsegs;
    for (size_t i = g->nops; i-- > 0;) {
        if (seg > 0 && i + 1 == g->segs[seg - 1].end) {
            seg--;
            sd_unet_run_ops(g, g->segs[seg].begin, i, be, exec, w, act);
        }
        const sd_unet_op *o = &g->ops[i];
        if (o->gy == SIZE_MAX) continue; /* nothing reads this output */
        const size_t gin[3] = {o->gx, o->gx2, o->gx3};
        for (int k = 0; k < 3; k++)
            if (o->zero & (1u << k)) be->zero(exec, dact + gin[k], g->ops[o->px[k]].ny * sizeof(float));
        const float *dy = dact + o->gy, *x = act + o->x, *pw = NULL;
        sd_unet_op_params(o, w, be, exec, &pw, NULL);
        size_t nw = 0, nb = 0;
        float *gw = NULL, *gb = NULL;
        if (!f && o->w != SIZE_MAX) {
            gw = dparams + o->w;
            gb = pgrad(dparams, o->b);
        } else if (f && o->w != SIZE_MAX) {
            nw = slot_floats(&u->w, o->w);
            nb = slot_floats(&u->w, o->b);
            gw = f->scratch;
            gb = o->b == SIZE_MAX ? NULL : f->scratch + nw;
            be->zero(exec, f->scratch, (nw + nb) * sizeof(float));
        }
        float *dx = gp(dact, o->gx), *dx2 = gp(dact, o->gx2), *dx3 = gp(dact, o->gx3);
        switch (o->kind) {
        case UOP_CONV:
            be->conv2d_bwd(exec, &o->s.conv, dx, gw, gb, dy, x, pw);
            break;
        case UOP_GN:
            be->group_norm_bwd(exec, &o->s.gn, dx, gw, gb, dy, x, act + o->s1, act + o->s2,
                               pw);
            break;
        case UOP_LINEAR:
            be->linear_bwd(exec, &o->s.lin, dx, gw, gb, dy, x, pw);
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
            be->layer_norm_bwd(exec, &o->s.ln, dx, gw, gb, dy, x, act + o->s1, act + o->s2,
                               pw);
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
        if (f && o->w != SIZE_MAX) {
            int stop = f->done(f->ctx, o->w, gw, nw);
            if (!stop && gb) stop = f->done(f->ctx, o->b, gb, nb);
            if (stop) return stop;
        }
    }
    return 0;
}
