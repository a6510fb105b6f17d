/* The UNet's backward pass: the planned ops' backward in reverse order.
 * Activation gradients live in dact, laid out like the activations, so a
 * tensor read by several ops (residual streams, the time embedding, skip
 * connections, the text context) simply accumulates: every backward op adds
 * into its gradients. The inputs [0, nconst) get no gradient. */
#include <string.h>

#include "unet_int.h"

/* Gradient pointer of activation off, or NULL for an input (no gradient). */
static float *dgrad(const sd_unet_graph *g, float *dact, size_t off)
{
    return off < g->nconst ? NULL : dact + off;
}

/* Parameter gradient pointer, or NULL for an absent bias. */
static float *pgrad(float *dparams, size_t off)
{
    return off == SIZE_MAX ? NULL : dparams + off;
}

/* Zero dact, seed the output's gradient, then each op's backward from the
 * last to the first. */
void sd_unet_backward(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, sd_pool *pool,
                      const float *params, const float *act, float *dact, const float *dout, float *dparams)
{
    const sd_unet_config *c = &u->cfg;
    memset(dact, 0, g->nact * sizeof(float));
    memcpy(dact + g->out, dout, (size_t)g->n * (size_t)c->out_channels * (size_t)g->h * (size_t)g->w * sizeof(float));
    for (size_t i = g->nops; i-- > 0;) {
        const sd_unet_op *o = &g->ops[i];
        const float *dy = dact + o->y, *x = act + o->x;
        float *dx = dgrad(g, dact, o->x);
        switch (o->kind) {
        case UOP_CONV:
            be->conv2d_bwd(pool, &o->s.conv, dx, dparams + o->w, pgrad(dparams, o->b), dy, x, params + o->w);
            break;
        case UOP_GN:
            be->group_norm_bwd(pool, &o->s.gn, dx, dparams + o->w, dparams + o->b, dy, x, act + o->s1, act + o->s2,
                               params + o->w);
            break;
        case UOP_LINEAR:
            be->linear_bwd(pool, &o->s.lin, dx, dparams + o->w, pgrad(dparams, o->b), dy, x, params + o->w);
            break;
        case UOP_SILU:
            if (dx) be->silu_bwd(pool, o->s.n, dx, dy, x);
            break;
        case UOP_ADD: be->add_bwd(pool, o->s.n, dx, dgrad(g, dact, o->x2), dy); break;
        case UOP_UP2X:
            if (dx) be->upsample2x_bwd(pool, o->s.up.planes, o->s.up.h, o->s.up.w, dx, dy);
            break;
        case UOP_ATTN:
            be->attn_bwd(pool, &o->s.attn, dx, dgrad(g, dact, o->x2), dgrad(g, dact, o->x3), dy, x, act + o->x2,
                         act + o->x3, act + o->y, act + o->s1);
            break;
        case UOP_LN:
            be->layer_norm_bwd(pool, &o->s.ln, dx, dparams + o->w, dparams + o->b, dy, x, act + o->s1, act + o->s2,
                               params + o->w);
            break;
        case UOP_GEGLU:
            if (dx) be->geglu_bwd(pool, o->s.gg.m, o->s.gg.n, dx, dy, x);
            break;
        case UOP_CONCAT: be->concat_bwd(pool, &o->s.cat, dx, dgrad(g, dact, o->x2), dy); break;
        case UOP_BCAST:
            be->add_bcast_channel_bwd(pool, o->s.bc.n, o->s.bc.c, o->s.bc.hw, dx, dgrad(g, dact, o->x2), dy);
            break;
        case UOP_TEMB:
            /* timesteps and size conditioning are inputs: nothing to propagate */
            break;
        case UOP_SWAP:
            if (dx) sd_unet_swap_bwd(pool, &o->s.sw, dx, dy);
            break;
        }
    }
}
