/* CPU reference ops of the compute engine: explicit forward and backward
 * per op, fp32 storage with fp32 accumulation, contiguous row-major data.
 *
 * Conventions shared by every op:
 * - pool may be NULL (single thread); work is split so each thread owns
 *   whole output rows/planes/channels, so results are bit-identical for any
 *   thread count (no atomics, no cross-thread reductions).
 * - Backward ADDS into the gradient buffers (llm.c style; the caller zeroes
 *   them once per step), so residual branches just accumulate. Any gradient
 *   pointer may be NULL to skip that gradient.
 * - Shapes come in small structs; sd_*_check validates one before use, the
 *   ops themselves trust it. */
#ifndef SDTK_OPS_CPU_H
#define SDTK_OPS_CPU_H

#include <stddef.h>

#include "err.h"
#include "pool.h"

/* conv2d: x [n, cin, h, w], w [cout, cin, kh, kw], b [cout] or NULL,
 * y [n, cout, oh, ow]; padding per side so the VAE's (0,1,0,1) works. */
typedef struct {
    int n, cin, h, w;
    int cout, kh, kw;
    int stride;
    int pad_t, pad_b, pad_l, pad_r;
} sd_conv2d_shape;

int sd_conv2d_out_h(const sd_conv2d_shape *s);
int sd_conv2d_out_w(const sd_conv2d_shape *s);
sd_status sd_conv2d_check(const sd_conv2d_shape *s, sd_error *err);
void sd_conv2d_fwd(sd_pool *pool, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                   const float *b);
void sd_conv2d_bwd(sd_pool *pool, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w);

/* group_norm: x, y [n, c, hw]; gamma, beta [c] or NULL (no affine);
 * mean, rstd [n, groups] saved by forward for backward. */
typedef struct {
    int n, c, hw, groups;
    float eps;
} sd_gn_shape;

sd_status sd_group_norm_check(const sd_gn_shape *s, sd_error *err);
void sd_group_norm_fwd(sd_pool *pool, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x,
                       const float *gamma, const float *beta);
void sd_group_norm_bwd(sd_pool *pool, const sd_gn_shape *s, float *dx, float *dgamma, float *dbeta,
                       const float *dy, const float *x, const float *mean, const float *rstd, const float *gamma);

/* linear: x [m, k], w [n, k] (torch layout), b [n] or NULL, y [m, n];
 * y = x w^T + b. m is every leading dim flattened (B*T). */
typedef struct {
    int m, k, n;
} sd_linear_shape;

sd_status sd_linear_check(const sd_linear_shape *s, sd_error *err);
void sd_linear_fwd(sd_pool *pool, const sd_linear_shape *s, float *y, const float *x, const float *w,
                   const float *b);
void sd_linear_bwd(sd_pool *pool, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w);

/* Element-wise ops over n floats. y may alias x (silu) or a/b (add). */
void sd_silu_fwd(sd_pool *pool, size_t n, float *y, const float *x);
void sd_silu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x);
void sd_add_fwd(sd_pool *pool, size_t n, float *y, const float *a, const float *b);
void sd_add_bwd(sd_pool *pool, size_t n, float *da, float *db, const float *dy);

/* Nearest 2x upsample: x [planes, h, w] -> y [planes, 2h, 2w], planes = n*c. */
void sd_upsample2x_fwd(sd_pool *pool, int planes, int h, int w, float *y, const float *x);
void sd_upsample2x_bwd(sd_pool *pool, int planes, int h, int w, float *dx, const float *dy);

/* Scaled dot-product attention: q [b, heads, tq, d], k and v [b, heads,
 * tk, d], y [b, heads, tq, d]; softmax(q k^T * scale) v in fp32. causal
 * masks key j > query i (torch's is_causal, top-left aligned). Forward
 * saves only lse [b, heads, tq] (log-sum-exp of each score row); backward
 * recomputes scores, so memory stays O(T*d), never O(T^2). */
typedef struct {
    int b, heads, tq, tk, d;
    int causal;
    float scale; /* usually 1/sqrt(d) */
} sd_attn_shape;

sd_status sd_attn_check(const sd_attn_shape *s, sd_error *err);
void sd_attn_fwd(sd_pool *pool, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                 const float *v);
void sd_attn_bwd(sd_pool *pool, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                 const float *q, const float *k, const float *v, const float *y, const float *lse);

#endif
