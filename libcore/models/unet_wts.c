/* The parameters a UNet run reads (sd_unet_wts): fp32 pointers into the
 * flat buffer, or bf16 weights widened one op at a time into a small fp32
 * scratch, so a run on bf16 weights never holds an fp32 model. */
#include <stddef.h>
#include <stdint.h>

#include "unet_int.h"

/* The floats of op o's weight (*nw) and bias (*nb), from its shape: 0 for
 * ops without parameters and for an absent bias. */
static void op_param_counts(const sd_unet_op *o, size_t *nw, size_t *nb)
{
    *nw = *nb = 0;
    switch (o->kind) {
    case UOP_CONV:
        *nw = (size_t)o->s.conv.cout * (size_t)o->s.conv.cin * (size_t)o->s.conv.kh * (size_t)o->s.conv.kw;
        *nb = (size_t)o->s.conv.cout;
        break;
    case UOP_GN: *nw = *nb = (size_t)o->s.gn.c; break;
    case UOP_LINEAR:
        *nw = (size_t)o->s.lin.n * (size_t)o->s.lin.k;
        *nb = (size_t)o->s.lin.n;
        break;
    case UOP_LN: *nw = *nb = (size_t)o->s.ln.c; break;
    default: break;
    }
    if (o->w == SIZE_MAX) *nw = 0;
    if (o->b == SIZE_MAX) *nb = 0;
}

/* The largest op's weight plus bias, in floats: the scratch a bf16 run
 * widens into. */
size_t sd_unet_graph_wscratch(const sd_unet_graph *g)
{
    size_t most = 0;
    for (size_t i = 0; i < g->nops; i++) {
        size_t nw, nb;
        op_param_counts(&g->ops[i], &nw, &nb);
        if (nw + nb > most) most = nw + nb;
    }
    return most;
}

/* Op o's parameters for the op to read: fp32 pointers into w->f32, or the
 * bf16 weight then the bias widened into w->scratch by the backend's
 * bf16_widen (exact on every backend; w->bf16 and w->scratch are then the
 * backend's memory). */
void sd_unet_op_params(const sd_unet_op *o, const sd_unet_wts *w, const sd_backend *be, void *exec, const float **pw,
                       const float **pb)
{
    size_t nw, nb;
    op_param_counts(o, &nw, &nb);
    *pw = NULL;
    if (pb) *pb = NULL;
    if (nw == 0 && nb == 0) return;
    if (!w->bf16) {
        if (o->w != SIZE_MAX) *pw = w->f32 + o->w;
        if (pb && o->b != SIZE_MAX) *pb = w->f32 + o->b;
        return;
    }
    if (nw) {
        be->bf16_widen(exec, nw, w->scratch, w->bf16 + o->w);
        *pw = w->scratch;
    }
    if (nb && pb) { /* the backward reads no bias: not widened for it */
        be->bf16_widen(exec, nb, w->scratch + nw, w->bf16 + o->b);
        *pb = w->scratch + nw;
    }
}
