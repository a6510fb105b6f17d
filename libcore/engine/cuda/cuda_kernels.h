/* The hand-written kernels' launchers (defined in the .cu files, callable
 * from C) and the context services they use. Every launcher queues its
 * kernels on the context's stream and returns the launch status; shapes
 * and conventions are those of ops_cpu.h (backward adds into gradients,
 * NULL skips one). Pointers are device memory. */
#ifndef SDTK_CUDA_KERNELS_H
#define SDTK_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ops_cpu.h"

typedef struct sd_cuda sd_cuda;

/* Context services for launchers: the stream, scratch memory from the
 * caching allocator (NULL when out of memory, the error recorded), and the
 * shared memory one block may opt in to. */
cudaStream_t sdc_stream(const sd_cuda *c);
void *sdc_alloc(sd_cuda *c, size_t bytes);
/* The same without recording a failure (*why says what it was). */
void *sdc_try_alloc(sd_cuda *c, size_t bytes, cudaError_t *why);
void sdc_release(sd_cuda *c, void *p);
size_t sdc_smem_optin(const sd_cuda *c);

/* Blocks of `threads` for a grid-stride loop over n items (1 to 65536). */
unsigned sdk_grid_blocks(size_t n, unsigned threads);
/* cudaSuccess when this build holds code the current device can run (one
 * of the kernels looked up), else the runtime's reason (no kernel image). */
cudaError_t sdk_kernel_image(void);

/* Element-wise activations, by kind. */
typedef enum { SDK_SILU, SDK_GELU, SDK_QUICK_GELU, SDK_GAUSS_STD } sdk_act;
cudaError_t sdk_act_fwd(sd_cuda *c, sdk_act kind, size_t n, float *y, const float *x);
cudaError_t sdk_act_bwd(sd_cuda *c, sdk_act kind, size_t n, float *dx, const float *dy, const float *x);

cudaError_t sdk_add_fwd(sd_cuda *c, size_t n, float *y, const float *a, const float *b);
cudaError_t sdk_add_bwd(sd_cuda *c, size_t n, float *da, float *db, const float *dy);
cudaError_t sdk_scale_fwd(sd_cuda *c, size_t n, float *y, const float *x, float alpha);
cudaError_t sdk_scale_bwd(sd_cuda *c, size_t n, float *dx, const float *dy, float alpha);
cudaError_t sdk_mul_fwd(sd_cuda *c, size_t n, float *y, const float *a, const float *b);
cudaError_t sdk_mul_bwd(sd_cuda *c, size_t n, float *da, float *db, const float *dy, const float *a, const float *b);
cudaError_t sdk_geglu_fwd(sd_cuda *c, size_t m, size_t n, float *y, const float *x);
cudaError_t sdk_geglu_bwd(sd_cuda *c, size_t m, size_t n, float *dx, const float *dy, const float *x);
cudaError_t sdk_upsample2x_fwd(sd_cuda *c, int planes, int h, int w, float *y, const float *x);
cudaError_t sdk_upsample2x_bwd(sd_cuda *c, int planes, int h, int w, float *dx, const float *dy);
cudaError_t sdk_concat_fwd(sd_cuda *c, const sd_concat_shape *s, float *y, const float *a, const float *b);
cudaError_t sdk_concat_bwd(sd_cuda *c, const sd_concat_shape *s, float *da, float *db, const float *dy);
cudaError_t sdk_add_bcast_fwd(sd_cuda *c, int n, int ch, int hw, float *y, const float *x, const float *b);
cudaError_t sdk_add_bcast_bwd(sd_cuda *c, int n, int ch, int hw, float *dx, float *db, const float *dy);
cudaError_t sdk_temb_fwd(sd_cuda *c, const sd_temb_shape *s, float *y, const float *t);
cudaError_t sdk_temb_bwd(sd_cuda *c, const sd_temb_shape *s, float *dt, const float *dy, const float *t);
cudaError_t sdk_embedding_fwd(sd_cuda *c, const sd_embedding_shape *s, float *y, const int32_t *ids,
                              const float *tok, const float *pos);
cudaError_t sdk_embedding_bwd(sd_cuda *c, const sd_embedding_shape *s, float *dtok, float *dpos, const float *dy,
                              const int32_t *ids);
/* y [n, cols, rows] = x [n, rows, cols] transposed; accumulate adds. */
cudaError_t sdk_transpose(sd_cuda *c, int n, int rows, int cols, float *y, const float *x, int accumulate);

/* Convolution and linear helpers: zero-padded copy of [planes, h, w] into
 * [planes, h + pt + pb, w + pl + pr]; dx [planes, h, w] += the interior of
 * the padded gradient; y [m, n] rows set to b; out[j] += sum over rows of
 * x [m, n] column j. */
cudaError_t sdk_pad(sd_cuda *c, size_t planes, int h, int w, int pt, int pb, int pl, int pr, float *xp,
                    const float *x);
cudaError_t sdk_crop_add(sd_cuda *c, size_t planes, int h, int w, int pt, int pb, int pl, int pr, float *dx,
                         const float *dxp);
cudaError_t sdk_bias_rows(sd_cuda *c, size_t m, size_t n, float *y, const float *b);
cudaError_t sdk_col_sum_add(sd_cuda *c, size_t m, size_t n, float *out, const float *x);

/* Group norm (layer norm is [m, c, 1] with one group), statistics from
 * per-chunk two-pass partials combined in double. */
cudaError_t sdk_group_norm_fwd(sd_cuda *c, const sd_gn_shape *s, float *y, float *mean, float *rstd,
                               const float *x, const float *gamma, const float *beta);
cudaError_t sdk_group_norm_bwd(sd_cuda *c, const sd_gn_shape *s, float *dx, float *dgamma, float *dbeta,
                               const float *dy, const float *x, const float *mean, const float *rstd,
                               const float *gamma);

/* Flash-style attention: forward saves lse, backward recomputes scores. */
cudaError_t sdk_attn_fwd(sd_cuda *c, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                         const float *v);
cudaError_t sdk_attn_bwd(sd_cuda *c, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                         const float *q, const float *k, const float *v, const float *y, const float *lse);
/* drow[r] = dy_r . y_r over rows of d: the backward's D. */
cudaError_t sdk_attn_drow(sd_cuda *c, size_t rows, int d, const float *dy, const float *y, float *drow);
/* Score blocks of attention through cuBLAS (cuda_scores.cu): `rows` rows
 * of tk scores, n query rows per head starting at query q0, lse and drow
 * of the block's first head (tq apart per head). Forward: scores to
 * probabilities, lse written. Backward: scores to probabilities and, when
 * dp is not NULL, dp (dy v^T) to the score gradients. */
cudaError_t sdk_attn_softmax(sd_cuda *c, int rows, int n, int tk, int q0, int tq, int causal, float *s, float *lse);
cudaError_t sdk_attn_dscores(sd_cuda *c, int rows, int n, int tk, int q0, int tq, int causal, float scale, float *s,
                             float *dp, const float *lse, const float *drow);

/* Mixed precision (cuda_half.cu): y = x rounded to 16 bits of kind
 * (SD_DT_BF16 or SD_DT_F16, dtype.h); then with a transpose of each of n
 * images, y [n, cols, rows] from x [n, rows, cols] (NCHW to NHWC is
 * rows = C, cols = H W), to 16 bits, or widened to fp32 and set or added. */
cudaError_t sdk_to_half(sd_cuda *c, int kind, size_t n, void *y, const float *x);
cudaError_t sdk_to_half_t(sd_cuda *c, int kind, int n, int rows, int cols, void *y, const float *x);
cudaError_t sdk_from_half_t(sd_cuda *c, int kind, int n, int rows, int cols, float *y, const void *x,
                            int accumulate);

/* Optimizer: the sum of squares of x (waits for it: the value is in
 * *host_out on return), AdamW, EMA (ops_cpu.h's conventions). */
cudaError_t sdk_sum_squares(sd_cuda *c, size_t n, const float *x, double *host_out);
cudaError_t sdk_adamw(sd_cuda *c, const sd_adamw_args *a, size_t n, float *p, float *m, float *v, const float *g);
cudaError_t sdk_adamw_bf16(sd_cuda *c, const sd_adamw_args *a, size_t n, size_t index0, float *p, uint16_t *m,
                           uint16_t *v, const float *g);
cudaError_t sdk_ema(sd_cuda *c, size_t n, float *ema, const float *p, float one_minus_decay);
/* 8-bit AdamW (cuda_optim8.cu) with the tables in device memory, and
 * Adafactor (cuda_adafactor.cu), one tensor after another: ts is a host
 * array whose pointers are device memory (sd_adamw8_fwd's and
 * sd_adafactor_fwd's conventions). */
cudaError_t sdk_adamw8(sd_cuda *c, const sd_adamw8_args *a, const sd_q8_tables *dev_tables, size_t nt,
                       const sd_q8_tensor *ts, float *p, const float *g);
cudaError_t sdk_adafactor(sd_cuda *c, const sd_adafactor_args *a, size_t nt, const sd_adafactor_tensor *ts, float *p,
                          const float *g);
/* bf16 weights (cuda_bf16w.cu): widened exactly; stored with keyed
 * stochastic rounding (sd_bf16_store_sr_fwd). */
cudaError_t sdk_bf16_widen(sd_cuda *c, size_t n, float *dst, const uint16_t *src);
cudaError_t sdk_bf16_store_sr(sd_cuda *c, size_t n, size_t index0, uint32_t key, uint16_t *dst, const float *src);

#ifdef __cplusplus
}
#endif

#endif
