/* The UNet's backward pass: the planned ops' backward in reverse order,
 * into the gradient buffer unet_grads.c laid out. */
#include <stddef.h>

#include "unet_int.h"

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
    sd_unet_wts w = {params, NULL, NULL};
    sd_unet_backward_wts(u, g, be, exec, &w, act, dact, dout, dparams);
}

/* The same with w's parameters: each op's fetched (widened, for bf16) just
 * before its backward, after any recomputation that widened others. */
void sd_unet_backward_wts(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                          const sd_unet_wts *w, float *act, float *dact, const float *dout, float *dparams)
{
    const sd_unet_config *c = &u->cfg;
    if (g->outp == SIZE_MAX) return;
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
        const float *dy = dact + o->gy, *x = act + o->x, *pw = NULL, *pb = NULL;
        sd_unet_op_params(o, w, &pw, &pb);
        (void)pb;
        float *dx = gp(dact, o->gx), *dx2 = gp(dact, o->gx2), *dx3 = gp(dact, o->gx3);
        switch (o->kind) {
        case UOP_CONV:
            be->conv2d_bwd(exec, &o->s.conv, dx, dparams + o->w, pgrad(dparams, o->b), dy, x, pw);
            break;
        case UOP_GN:
            be->group_norm_bwd(exec, &o->s.gn, dx, dparams + o->w, dparams + o->b, dy, x, act + o->s1, act + o->s2,
                               pw);
            break;
        case UOP_LINEAR:
            be->linear_bwd(exec, &o->s.lin, dx, dparams + o->w, pgrad(dparams, o->b), dy, x, pw);
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
    }
}
