/* The UNet graph's op records, shared by the forward (unet.c) and backward
 * (unet_bwd.c) runners and the gradient layout (unet_grads.c). Every tensor
 * is a float offset into the flat activation buffer (or, for weights, the
 * parameter buffer). */
#ifndef SDTK_UNET_INT_H
#define SDTK_UNET_INT_H

#include <stdint.h>

#include "unet.h"

typedef enum {
    UOP_CONV,   /* y = conv(x; w, b) */
    UOP_GN,     /* y = group_norm(x; w, b), stats s1, s2 */
    UOP_LINEAR, /* y = x w^T + b */
    UOP_SILU,   /* y = silu(x) */
    UOP_ADD,    /* y = x + x2 */
    UOP_UP2X,   /* y = nearest 2x upsample of x */
    UOP_ATTN,   /* y = attention(q = x, k = x2, v = x3), lse s1 */
    UOP_LN,     /* y = layer_norm(x; w, b), stats s1, s2 */
    UOP_GEGLU,  /* y = geglu(x) */
    UOP_CONCAT, /* y = channel concat of x, x2 */
    UOP_BCAST,  /* y = x + x2 broadcast over each channel plane */
    UOP_TEMB,   /* y = sinusoidal embedding of x (timesteps) */
    UOP_TRANS   /* y [n, cols, rows] = x [n, rows, cols] (NCHW <-> tokens, heads) */
} sd_unet_op_kind;

struct sd_unet_op {
    sd_unet_op_kind kind;
    union {
        sd_conv2d_shape conv;
        sd_gn_shape gn;
        sd_linear_shape lin;
        sd_attn_shape attn;
        sd_ln_shape ln;
        sd_concat_shape cat;
        sd_temb_shape temb;
        struct {
            int n, rows, cols;   /* transpose */
        } tr;
        size_t n;                /* silu, add: elements */
        struct {
            size_t m, n;         /* geglu: rows, output columns */
        } gg;
        struct {
            int planes, h, w;    /* upsample */
        } up;
        struct {
            int n, c, hw;        /* broadcast add */
        } bc;
    } s;
    size_t x, x2, x3; /* inputs */
    size_t y, ny;     /* output and its floats */
    size_t s1, s2;    /* saved statistics */
    size_t w, b;      /* parameters, SIZE_MAX when absent */
    /* backward: gradient offsets in dact of the output and the inputs
     * (SIZE_MAX: no gradient), and which input gradients start here (their
     * last reader in the forward order is this op: zeroed before it adds) */
    size_t gy, gx, gx2, gx3;
    unsigned zero; /* bit 0: gx, bit 1: gx2, bit 2: gx3 */
    size_t px[3];  /* the ops that wrote x, x2, x3 (SIZE_MAX: an input or none) */
};

/* Run ops [begin, end) of the plan, in order (the forward, and the
 * backward's recomputation of a checkpointed segment). */
void sd_unet_run_ops(const sd_unet_graph *g, size_t begin, size_t end, const sd_backend *be, void *exec,
                     const sd_unet_wts *w, float *act);

/* Op o's weight and bias (*pw, *pb; *pb NULL when absent) as fp32 for the
 * op to read: pointers into w->f32, or w's bf16 values widened into
 * w->scratch by be's bf16_widen (unet_wts.c). */
void sd_unet_op_params(const sd_unet_op *o, const sd_unet_wts *w, const sd_backend *be, void *exec, const float **pw,
                       const float **pb);

/* Lay out the gradient buffer (unet_grads.c): each activation's gradient
 * lives from its last reader's backward to its producer's, and blocks of
 * gradients no longer live are reused; sets the ops' g* offsets, their zero
 * bits, their producers px, g->outp and g->ndact. Runs on the planning
 * offsets, where outputs grow with the op index. */
sd_status sd_unet_plan_grads(sd_unet_graph *g, sd_error *err);

#endif
