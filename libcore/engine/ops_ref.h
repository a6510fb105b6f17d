/* Reference (direct-loop) versions of the GEMM-backed ops: same signatures
 * and conventions as ops_cpu.h, slow and simple. The fast ops fall back to
 * them when their scratch cannot be allocated; tests and benches use them
 * as an independent oracle for the tiled paths. */
#ifndef SDTK_OPS_REF_H
#define SDTK_OPS_REF_H

#include "ops_cpu.h"

void sd_conv2d_fwd_ref(sd_pool *pool, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                       const float *b);
void sd_conv2d_bwd_ref(sd_pool *pool, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                       const float *x, const float *w);
void sd_linear_fwd_ref(sd_pool *pool, const sd_linear_shape *s, float *y, const float *x, const float *w,
                       const float *b);
void sd_linear_bwd_ref(sd_pool *pool, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                       const float *x, const float *w);
void sd_attn_fwd_ref(sd_pool *pool, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                     const float *v);
void sd_attn_rows_fwd_ref(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                          const float *k, const float *v);
void sd_attn_bwd_ref(sd_pool *pool, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                     const float *q, const float *k, const float *v, const float *y, const float *lse);

#endif
