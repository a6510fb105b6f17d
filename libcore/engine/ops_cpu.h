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
#include <stdint.h>

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
/* The forward with x stored as xdt and y as ydt (SD_DT_F32, F16 or BF16:
 * 16-bit activation storage, act_store.h); fp32 weights and arithmetic:
 * y is sd_conv2d_fwd's result for the widened x, rounded once. */
void sd_conv2d_fwd_st(sd_pool *pool, const sd_conv2d_shape *s, int ydt, void *y, int xdt, const void *x,
                      const float *w, const float *b);
void sd_conv2d_bwd(sd_pool *pool, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                   const float *x, const float *w);
/* The bytes of scratch the forward, and the most the backward (with or
 * without dx, dw) hold at once, on a pool of nworkers: computed by the
 * functions that allocate it, for the memory plan (0: none). */
size_t sd_conv2d_fwd_scratch_bytes(int nworkers, const sd_conv2d_shape *s);
size_t sd_conv2d_bwd_scratch_bytes(int nworkers, const sd_conv2d_shape *s, int dx, int dw);

/* group_norm: x, y [n, c, hw]; gamma, beta [c] or NULL (no affine);
 * mean, rstd [n, groups] saved by forward for backward. */
typedef struct {
    int n, c, hw, groups;
    float eps;
} sd_gn_shape;

sd_status sd_group_norm_check(const sd_gn_shape *s, sd_error *err);
void sd_group_norm_fwd(sd_pool *pool, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x,
                       const float *gamma, const float *beta);
/* 16-bit activation storage (ops_store.c; dtypes SD_DT_F32, F16, BF16):
 * each is the fp32 op's result for the widened inputs, rounded once into
 * its output. group_norm_fwd_st applies SiLU after the norm when silu is
 * set (the VAE's norm + SiLU pairs); y may be x. */
void sd_group_norm_fwd_st(sd_pool *pool, const sd_gn_shape *s, int silu, int ydt, void *y, float *mean, float *rstd,
                          int xdt, const void *x, const float *gamma, const float *beta);
void sd_add_fwd_st(sd_pool *pool, size_t n, int dt, void *y, const void *a, const void *b);
void sd_convert_st(sd_pool *pool, size_t n, int ydt, void *y, int xdt, const void *x);
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
/* The bytes of scratch sd_linear_fwd allocates on nworkers (the backward
 * takes none): for the memory plan. */
size_t sd_linear_fwd_scratch_bytes(int nworkers);

/* An activation applied in place by sd_act_rows and the fused linear. */
typedef enum { SD_ACT_NONE = 0, SD_ACT_GELU = 1, SD_ACT_QUICK_GELU = 2 } sd_act;

/* y = act(x w^T + b), the activation applied to each block of y as soon as
 * it is final, while it is still in cache; bit-identical to sd_linear_fwd
 * followed by sd_gelu_fwd / sd_quick_gelu_fwd. w holds floats (wdtype
 * SD_DT_F32) or 16-bit values (SD_DT_F16, SD_DT_BF16: half the memory, the
 * bits of float weights holding the same values). Forward only (inference). */
void sd_linear_act_fwd(sd_pool *pool, const sd_linear_shape *s, sd_act act, int wdtype, float *y, const float *x,
                       const void *w, const float *b);

/* layer_norm over the last dim (torch F.layer_norm): x, y [m, c]; gamma,
 * beta [c] or NULL; mean, rstd [m] saved by forward for backward. */
typedef struct {
    int m, c;
    float eps;
} sd_ln_shape;

sd_status sd_layer_norm_check(const sd_ln_shape *s, sd_error *err);
void sd_layer_norm_fwd(sd_pool *pool, const sd_ln_shape *s, float *y, float *mean, float *rstd, const float *x,
                       const float *gamma, const float *beta);
void sd_layer_norm_bwd(sd_pool *pool, const sd_ln_shape *s, float *dx, float *dgamma, float *dbeta,
                       const float *dy, const float *x, const float *mean, const float *rstd, const float *gamma);

/* Element-wise ops over n floats. y may alias x (silu, gelu, quick_gelu,
 * scale) or a/b (add, mul). Backward of silu, gelu, quick_gelu and mul
 * needs the forward's inputs, so those must not have been overwritten. */
void sd_silu_fwd(sd_pool *pool, size_t n, float *y, const float *x);
void sd_silu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x);
void sd_add_fwd(sd_pool *pool, size_t n, float *y, const float *a, const float *b);
void sd_add_bwd(sd_pool *pool, size_t n, float *da, float *db, const float *dy);
/* y = alpha * x with a constant alpha (no gradient for alpha). */
void sd_scale_fwd(sd_pool *pool, size_t n, float *y, const float *x, float alpha);
void sd_scale_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, float alpha);
/* y = a * b element-wise. */
void sd_mul_fwd(sd_pool *pool, size_t n, float *y, const float *a, const float *b);
void sd_mul_bwd(sd_pool *pool, size_t n, float *da, float *db, const float *dy, const float *a, const float *b);
/* Exact GELU, x * Phi(x) with the erf (torch F.gelu, approximate='none'). */
void sd_gelu_fwd(sd_pool *pool, size_t n, float *y, const float *x);
void sd_gelu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x);
/* CLIP's quick_gelu, x * sigmoid(1.702 x). */
void sd_quick_gelu_fwd(sd_pool *pool, size_t n, float *y, const float *x);
void sd_quick_gelu_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x);
/* act in place on rows x cols floats (rows ldy apart), on the calling
 * thread: the same bits as the ops above on those elements. */
void sd_act_rows(sd_act act, float *y, size_t ldy, int rows, int cols);

/* GEGLU (diffusers): x [m, 2n] holds [a | gate] per row, y [m, n] =
 * a * gelu(gate) with the exact GELU. y must not alias x. */
void sd_geglu_fwd(sd_pool *pool, size_t m, size_t n, float *y, const float *x);
void sd_geglu_bwd(sd_pool *pool, size_t m, size_t n, float *dx, const float *dy, const float *x);

/* Channel concat of NCHW tensors: a [n, c1, hw], b [n, c2, hw] -> y
 * [n, c1 + c2, hw] (torch.cat dim 1, the UNet's skip connections);
 * backward splits dy back into da and db. */
typedef struct {
    int n, c1, c2, hw;
} sd_concat_shape;

sd_status sd_concat_check(const sd_concat_shape *s, sd_error *err);
void sd_concat_fwd(sd_pool *pool, const sd_concat_shape *s, float *y, const float *a, const float *b);
void sd_concat_bwd(sd_pool *pool, const sd_concat_shape *s, float *da, float *db, const float *dy);

/* Per-channel broadcast add: y[n, c, hw] = x[n, c, hw] + b[n, c] (the
 * UNet's time embedding added to feature maps); y may alias x. */
void sd_add_bcast_channel_fwd(sd_pool *pool, int n, int c, int hw, float *y, const float *x, const float *b);
void sd_add_bcast_channel_bwd(sd_pool *pool, int n, int c, int hw, float *dx, float *db, const float *dy);

/* Sinusoidal timestep embedding, diffusers' get_timestep_embedding:
 * t [n] (may be fractional) -> y [n, dim]. half = dim / 2,
 * freq_i = exp(-ln(max_period) * i / (half - freq_shift)),
 * arg = scale * t * freq_i; rows are [sin | cos], or [cos | sin] with
 * flip_sin_to_cos; an odd dim gets a zero last column. SD's UNet uses
 * flip_sin_to_cos = 1, freq_shift = 0, scale = 1, max_period = 10000. */
typedef struct {
    int n, dim;
    int flip_sin_to_cos;
    float freq_shift;
    float scale;
    float max_period;
} sd_temb_shape;

sd_status sd_timestep_emb_check(const sd_temb_shape *s, sd_error *err);
void sd_timestep_emb_fwd(sd_pool *pool, const sd_temb_shape *s, float *y, const float *t);
void sd_timestep_emb_bwd(sd_pool *pool, const sd_temb_shape *s, float *dt, const float *dy, const float *t);

/* Batched transpose: x [n, rows, cols] -> y [n, cols, rows] (NCHW feature
 * maps to token-major [n, hw, c] and back, around the VAE's attention);
 * backward adds dy [n, cols, rows] transposed back into dx [n, rows, cols].
 * y must not alias x. */
void sd_transpose_fwd(sd_pool *pool, int n, int rows, int cols, float *y, const float *x);
void sd_transpose_bwd(sd_pool *pool, int n, int rows, int cols, float *dx, const float *dy);

/* The VAE posterior's std from its logvar, y = exp(0.5 * clamp(x, -30,
 * 20)) (diffusers' DiagonalGaussianDistribution); y may be x. Backward
 * needs the forward's input. */
void sd_gauss_std_fwd(sd_pool *pool, size_t n, float *y, const float *x);
void sd_gauss_std_bwd(sd_pool *pool, size_t n, float *dx, const float *dy, const float *x);

/* Optimizer ops (ops_optim.c), the trainer's step on whichever backend
 * holds the weights. An AdamW step's constants, computed once per step in
 * double and rounded as torch rounds them; gscale multiplies each gradient
 * first (the clipping factor, 1 when none). */
typedef struct {
    float decay, b1, b2, step_size, bc2_sqrt, eps, gscale;
    uint32_t sr_key; /* bf16 moments: the step's stochastic-rounding key */
} sd_adamw_args;
/* Sum of squares of x in double over fixed chunks of 65536 (each in eight
 * running sums, element i into sum i % 8) added in order: the same value
 * for any thread count. */
double sd_sum_squares(sd_pool *pool, size_t n, const float *x);
/* p, m, v updated by one AdamW step from gradient g (n floats each). */
void sd_adamw_fwd(sd_pool *pool, const sd_adamw_args *a, size_t n, float *p, float *m, float *v, const float *g);
/* The same step with m and v stored as bf16 (uint16 bits): computed in
 * fp32 and stored back with stochastic rounding (ops_math.h's
 * sdm_adamw_bf16), the random bits of element i from (a->sr_key, index0 +
 * i), so a slice given its global offset rounds as the whole buffer does. */
void sd_adamw_bf16_fwd(sd_pool *pool, const sd_adamw_args *a, size_t n, size_t index0, float *p, uint16_t *m,
                       uint16_t *v, const float *g);
/* ema = ema - one_minus_decay * (ema - p) over n floats. */
void sd_ema_fwd(sd_pool *pool, size_t n, float *ema, const float *p, float one_minus_decay);
/* bf16 weights: dst = src widened exactly (n values); dst[i] = src[i]
 * rounded to bf16 stochastically with the bits sdm_mix32(key, index0 + i)
 * (ops_math.h's sdm_bf16_sr), so a slice given its global offset rounds
 * as the whole buffer does, on any backend. */
void sd_bf16_widen_fwd(sd_pool *pool, size_t n, float *dst, const uint16_t *src);
void sd_bf16_store_sr_fwd(sd_pool *pool, size_t n, size_t index0, uint32_t key, uint16_t *dst, const float *src);

/* 8-bit AdamW (ops_optim8.c), bitsandbytes' AdamW8bit on the CPU: the
 * moments as codes of its dynamic map in blocks of SD_Q8_BLOCK with one
 * fp32 absmax each; tensors below SD_Q8_MIN_SIZE values keep fp32
 * moments (its min_8bit_size). */
enum { SD_Q8_CODES = 256, SD_Q8_LUT = 65536, SD_Q8_BLOCK = 256, SD_Q8_MIN_SIZE = 4096 };
/* bitsandbytes' create_dynamic_map(signed): 256 sorted fp32 codes. */
void sd_q8_dynamic_map(int is_signed, float code[SD_Q8_CODES]);
/* The nearest-code table of its native CPU quantizer for a map. */
void sd_q8_lut(const float code[SD_Q8_CODES], uint8_t lut[SD_Q8_LUT]);
/* n values (a block) into codes through lut, their absmax into *absmax. */
void sd_q8_quantize_block(const uint8_t *lut, size_t n, const float *x, uint8_t *q, float *absmax);
/* The maps and their tables (made once per run). */
typedef struct {
    float code_m[SD_Q8_CODES], code_v[SD_Q8_CODES];
    uint8_t lut_m[SD_Q8_LUT], lut_v[SD_Q8_LUT];
} sd_q8_tables;
/* One tensor's state: at float offset off of the weights, n values; qm,
 * qv (n codes) and am, av (one absmax per block) for 8-bit state, else
 * m32, v32 (n floats). */
typedef struct {
    size_t off, n;
    uint8_t *qm, *qv;
    float *am, *av;
    float *m32, *v32;
} sd_q8_tensor;
/* A step's constants, rounded to fp32 as torch passes Python floats:
 * one_b1 = 1 - b1, one_b2 = 1 - b2, bc2 = sqrt(1 - b2^t), neg_lr_c1 =
 * -lr / (1 - b1^t) (8-bit path); eps_c2 = eps bc2, step_size = -lr bc2 /
 * (1 - b1^t) (32-bit path); decay = 1 - lr wd when decay_on. */
typedef struct {
    float b1, b2, one_b1, one_b2, eps, bc2, neg_lr_c1, eps_c2, step_size, decay, gscale;
    int decay_on;
} sd_adamw8_args;
/* One AdamW8bit step over every tensor (p and g the flat weights and
 * gradients); each tensor is done by one worker: the same bits for any
 * thread count. */
void sd_adamw8_fwd(sd_pool *pool, const sd_adamw8_args *a, const sd_q8_tables *t, size_t ntensors,
                   const sd_q8_tensor *ts, float *p, const float *g);

/* Adafactor (ops_adafactor.c), transformers' Adafactor with
 * relative_step, scale_parameter and warmup_init off: one tensor's
 * state. Rank >= 2: row (n / last dim values) and col (n / second-last
 * dim values), factored over the last two dims; rank 1: v (n values); m
 * (n values) only with a first moment. */
typedef struct {
    size_t off, n;
    int ndim, shape[4];
    float *row, *col, *v, *m;
} sd_adafactor_tensor;
/* A step's constants: beta2t = 1 - t^-0.8 and 1 - beta2t, the rate, the
 * first moment's beta1 and 1 - beta1, -wd lr (decay_on), clip_threshold
 * 1, gscale the clipping factor. */
typedef struct {
    float beta2t, one_beta2t, lr, beta1, one_beta1, neg_wd_lr, gscale;
    double clip_threshold;
    int decay_on;
} sd_adafactor_args;
/* One Adafactor step over every tensor, each on one worker (no scratch:
 * the update is computed once for its RMS and again to apply it). */
void sd_adafactor_fwd(sd_pool *pool, const sd_adafactor_args *a, size_t ntensors, const sd_adafactor_tensor *ts,
                      float *p, const float *g);

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
/* The bytes of scratch the forward and the backward allocate on nworkers:
 * for the memory plan. */
size_t sd_attn_fwd_scratch_bytes(int nworkers, const sd_attn_shape *s);
size_t sd_attn_bwd_scratch_bytes(int nworkers, const sd_attn_shape *s);
/* The forward on token-major rows: q, k, v element (batch n, head h,
 * token i, c) at [(n * t + i) * ld + h * d + c] (t = tq for q, tk for k
 * and v; e.g. the three column blocks of a fused q|k|v projection, ld =
 * 3 * heads * d), y [b, tq, heads * d] with the heads side by side, lse
 * [b, heads, tq]. Every value bit-identical to sd_attn_fwd on the same
 * data transposed to head-major (tests/test_ops_fast.c). */
void sd_attn_rows_fwd(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                      const float *k, const float *v);

/* Token + position embeddings (CLIP text): ids [n, t] index tok [vocab,
 * dim]; y [n, t, dim] = tok[ids] + pos[0..t) with pos [npos, dim], or no
 * positions when npos is 0. Ids are checked by sd_embedding_check_ids, not
 * by the ops. Backward scatters into dtok and sums over the batch into
 * dpos, each thread owning whole table rows (deterministic). */
typedef struct {
    int n, t, dim;
    int vocab, npos;
} sd_embedding_shape;

sd_status sd_embedding_check(const sd_embedding_shape *s, sd_error *err);
sd_status sd_embedding_check_ids(const sd_embedding_shape *s, const int32_t *ids, sd_error *err);
void sd_embedding_fwd(sd_pool *pool, const sd_embedding_shape *s, float *y, const int32_t *ids, const float *tok,
                      const float *pos);
void sd_embedding_bwd(sd_pool *pool, const sd_embedding_shape *s, float *dtok, float *dpos, const float *dy,
                      const int32_t *ids);

#endif
