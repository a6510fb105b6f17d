/* The UNet graph's op records, shared by the forward (unet.c) and backward
 * (unet_bwd.c) runners. Every tensor is a float offset into the flat
 * activation buffer (or, for weights, the parameter buffer). */
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
    UOP_SWAP    /* y [a, c, b, d] = x [a, b, c, d] (NCHW <-> tokens, heads) */
} sd_unet_op_kind;

typedef struct {
    int a, b, c, d;
} sd_unet_swap_shape;

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
        sd_unet_swap_shape sw;
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
    size_t y;         /* output */
    size_t s1, s2;    /* saved statistics */
    size_t w, b;      /* parameters, SIZE_MAX when absent */
};

/* The host-side layout op behind UOP_SWAP (no backend slot yet). */
void sd_unet_swap_fwd(sd_pool *pool, const sd_unet_swap_shape *s, float *y, const float *x);
void sd_unet_swap_bwd(sd_pool *pool, const sd_unet_swap_shape *s, float *dx, const float *dy);

#endif
