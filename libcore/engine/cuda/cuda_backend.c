/* The CUDA backend table: each entry takes the sd_cuda * as exec, skips
 * its work when an earlier op of this sync window failed (the first error
 * is what sync reports), and records a failed launch. */
#include <math.h>

#include "cuda_int.h"

/* Everything the context owns: first the convolution plans the ops
 * cached in it, then the context itself (cuda_ctx.c), after the queued
 * work has finished. */
void sd_cuda_destroy(sd_cuda *c)
{
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    sdc_conv_plans_free(c);
    sdc_ctx_free(c);
}

/* The context, or NULL when an earlier failure is pending. */
static sd_cuda *live(void *exec)
{
    sd_cuda *c = exec;
    return c->failed ? NULL : c;
}

/* Record a launcher's status under the op's name. */
static void done(sd_cuda *c, cudaError_t e, const char *what)
{
    sdc_cuda_ok(c, e, what);
}

/* conv2d forward on cuDNN. */
static void cu_conv2d_fwd(void *exec, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                          const float *b)
{
    sd_cuda *c = live(exec);
    if (c) sdc_conv2d_fwd(c, s, y, x, w, b);
}

/* conv2d backward on cuDNN. */
static void cu_conv2d_bwd(void *exec, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w)
{
    sd_cuda *c = live(exec);
    if (c) sdc_conv2d_bwd(c, s, dx, dw, db, dy, x, w);
}

/* Group norm forward. */
static void cu_group_norm_fwd(void *exec, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x,
                              const float *gamma, const float *beta)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_group_norm_fwd(c, s, y, mean, rstd, x, gamma, beta), "group_norm forward");
}

/* Group norm backward. */
static void cu_group_norm_bwd(void *exec, const sd_gn_shape *s, float *dx, float *dgamma, float *dbeta,
                              const float *dy, const float *x, const float *mean, const float *rstd,
                              const float *gamma)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_group_norm_bwd(c, s, dx, dgamma, dbeta, dy, x, mean, rstd, gamma), "group_norm backward");
}

/* Layer norm is group norm of [m, c, 1] with one group, as on the CPU. */
static sd_gn_shape ln_as_gn(const sd_ln_shape *s)
{
    sd_gn_shape g = {.n = s->m, .c = s->c, .hw = 1, .groups = 1, .eps = s->eps};
    return g;
}

/* Layer norm forward. */
static void cu_layer_norm_fwd(void *exec, const sd_ln_shape *s, float *y, float *mean, float *rstd, const float *x,
                              const float *gamma, const float *beta)
{
    sd_cuda *c = live(exec);
    sd_gn_shape g = ln_as_gn(s);
    if (c) done(c, sdk_group_norm_fwd(c, &g, y, mean, rstd, x, gamma, beta), "layer_norm forward");
}

/* Layer norm backward. */
static void cu_layer_norm_bwd(void *exec, const sd_ln_shape *s, float *dx, float *dgamma, float *dbeta,
                              const float *dy, const float *x, const float *mean, const float *rstd,
                              const float *gamma)
{
    sd_cuda *c = live(exec);
    sd_gn_shape g = ln_as_gn(s);
    if (c) done(c, sdk_group_norm_bwd(c, &g, dx, dgamma, dbeta, dy, x, mean, rstd, gamma), "layer_norm backward");
}

/* Linear forward on cuBLAS. */
static void cu_linear_fwd(void *exec, const sd_linear_shape *s, float *y, const float *x, const float *w,
                          const float *b)
{
    sd_cuda *c = live(exec);
    if (c) sdc_linear_fwd(c, s, y, x, w, b);
}

/* Linear backward on cuBLAS. */
static void cu_linear_bwd(void *exec, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w)
{
    sd_cuda *c = live(exec);
    if (c) sdc_linear_bwd(c, s, dx, dw, db, dy, x, w);
}

/* SiLU forward. */
static void cu_silu_fwd(void *exec, size_t n, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_fwd(c, SDK_SILU, n, y, x), "silu forward");
}

/* SiLU backward. */
static void cu_silu_bwd(void *exec, size_t n, float *dx, const float *dy, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_bwd(c, SDK_SILU, n, dx, dy, x), "silu backward");
}

/* Exact GELU forward. */
static void cu_gelu_fwd(void *exec, size_t n, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_fwd(c, SDK_GELU, n, y, x), "gelu forward");
}

/* Exact GELU backward. */
static void cu_gelu_bwd(void *exec, size_t n, float *dx, const float *dy, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_bwd(c, SDK_GELU, n, dx, dy, x), "gelu backward");
}

/* quick_gelu forward. */
static void cu_quick_gelu_fwd(void *exec, size_t n, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_fwd(c, SDK_QUICK_GELU, n, y, x), "quick_gelu forward");
}

/* quick_gelu backward. */
static void cu_quick_gelu_bwd(void *exec, size_t n, float *dx, const float *dy, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_bwd(c, SDK_QUICK_GELU, n, dx, dy, x), "quick_gelu backward");
}

/* Posterior std forward. */
static void cu_gauss_std_fwd(void *exec, size_t n, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_fwd(c, SDK_GAUSS_STD, n, y, x), "gauss_std forward");
}

/* Posterior std backward. */
static void cu_gauss_std_bwd(void *exec, size_t n, float *dx, const float *dy, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_act_bwd(c, SDK_GAUSS_STD, n, dx, dy, x), "gauss_std backward");
}

/* Residual add forward. */
static void cu_add_fwd(void *exec, size_t n, float *y, const float *a, const float *b)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_add_fwd(c, n, y, a, b), "add forward");
}

/* Residual add backward. */
static void cu_add_bwd(void *exec, size_t n, float *da, float *db, const float *dy)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_add_bwd(c, n, da, db, dy), "add backward");
}

/* Scale forward. */
static void cu_scale_fwd(void *exec, size_t n, float *y, const float *x, float alpha)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_scale_fwd(c, n, y, x, alpha), "scale forward");
}

/* Scale backward. */
static void cu_scale_bwd(void *exec, size_t n, float *dx, const float *dy, float alpha)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_scale_bwd(c, n, dx, dy, alpha), "scale backward");
}

/* Element-wise product forward. */
static void cu_mul_fwd(void *exec, size_t n, float *y, const float *a, const float *b)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_mul_fwd(c, n, y, a, b), "mul forward");
}

/* Element-wise product backward. */
static void cu_mul_bwd(void *exec, size_t n, float *da, float *db, const float *dy, const float *a, const float *b)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_mul_bwd(c, n, da, db, dy, a, b), "mul backward");
}

/* GEGLU forward. */
static void cu_geglu_fwd(void *exec, size_t m, size_t n, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_geglu_fwd(c, m, n, y, x), "geglu forward");
}

/* GEGLU backward. */
static void cu_geglu_bwd(void *exec, size_t m, size_t n, float *dx, const float *dy, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_geglu_bwd(c, m, n, dx, dy, x), "geglu backward");
}

/* Nearest 2x upsample forward. */
static void cu_upsample2x_fwd(void *exec, int planes, int h, int w, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_upsample2x_fwd(c, planes, h, w, y, x), "upsample2x forward");
}

/* Nearest 2x upsample backward. */
static void cu_upsample2x_bwd(void *exec, int planes, int h, int w, float *dx, const float *dy)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_upsample2x_bwd(c, planes, h, w, dx, dy), "upsample2x backward");
}

/* Shared memory the flash attention kernels need per block, against the
 * device's limit: a clear error for heads too wide for one block. */
static int attn_fits(sd_cuda *c, const sd_attn_shape *s)
{
    size_t need = ((size_t)16 * (size_t)s->d + 3696) * sizeof(float);
    if (need <= sdc_smem_optin(c)) return 1;
    sdc_fail(c, SD_EUNSUPPORTED, "attention: head dim %d needs %zu bytes of shared memory per block, the device "
             "allows %zu", s->d, need, sdc_smem_optin(c));
    return 0;
}

/* Attention forward: through cuBLAS with blocks of scores, or the flash
 * kernel when the context asks for it or that scratch is not available. */
static void cu_attn_fwd(void *exec, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                        const float *v)
{
    sd_cuda *c = live(exec);
    if (!c || (!c->opts.attn_flash && sdc_attn_gemm_fwd(c, s, y, lse, q, k, v))) return;
    if (attn_fits(c, s)) done(c, sdk_attn_fwd(c, s, y, lse, q, k, v), "attention forward");
}

/* Attention backward (scores recomputed from lse), the same two ways. */
static void cu_attn_bwd(void *exec, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                        const float *q, const float *k, const float *v, const float *y, const float *lse)
{
    sd_cuda *c = live(exec);
    if (!c || (!c->opts.attn_flash && sdc_attn_gemm_bwd(c, s, dq, dk, dv, dy, q, k, v, y, lse))) return;
    if (attn_fits(c, s)) done(c, sdk_attn_bwd(c, s, dq, dk, dv, dy, q, k, v, y, lse), "attention backward");
}

/* Channel concat forward. */
static void cu_concat_fwd(void *exec, const sd_concat_shape *s, float *y, const float *a, const float *b)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_concat_fwd(c, s, y, a, b), "concat forward");
}

/* Channel concat backward. */
static void cu_concat_bwd(void *exec, const sd_concat_shape *s, float *da, float *db, const float *dy)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_concat_bwd(c, s, da, db, dy), "concat backward");
}

/* Per-channel broadcast add forward. */
static void cu_add_bcast_channel_fwd(void *exec, int n, int ch, int hw, float *y, const float *x, const float *b)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_add_bcast_fwd(c, n, ch, hw, y, x, b), "add_bcast_channel forward");
}

/* Per-channel broadcast add backward. */
static void cu_add_bcast_channel_bwd(void *exec, int n, int ch, int hw, float *dx, float *db, const float *dy)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_add_bcast_bwd(c, n, ch, hw, dx, db, dy), "add_bcast_channel backward");
}

/* Timestep embedding forward. */
static void cu_timestep_emb_fwd(void *exec, const sd_temb_shape *s, float *y, const float *t)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_temb_fwd(c, s, y, t), "timestep_emb forward");
}

/* Timestep embedding backward. */
static void cu_timestep_emb_bwd(void *exec, const sd_temb_shape *s, float *dt, const float *dy, const float *t)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_temb_bwd(c, s, dt, dy, t), "timestep_emb backward");
}

/* Batched transpose forward. */
static void cu_transpose_fwd(void *exec, int n, int rows, int cols, float *y, const float *x)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_transpose(c, n, rows, cols, y, x, 0), "transpose forward");
}

/* Transpose backward: dy [n, cols, rows] transposed back, added into dx. */
static void cu_transpose_bwd(void *exec, int n, int rows, int cols, float *dx, const float *dy)
{
    sd_cuda *c = live(exec);
    if (c && dx) done(c, sdk_transpose(c, n, cols, rows, dx, dy, 1), "transpose backward");
}

/* Token + position embedding forward (ids in device memory). */
static void cu_embedding_fwd(void *exec, const sd_embedding_shape *s, float *y, const int32_t *ids, const float *tok,
                             const float *pos)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_embedding_fwd(c, s, y, ids, tok, pos), "embedding forward");
}

/* Token + position embedding backward. */
static void cu_embedding_bwd(void *exec, const sd_embedding_shape *s, float *dtok, float *dpos, const float *dy,
                             const int32_t *ids)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_embedding_bwd(c, s, dtok, dpos, dy, ids), "embedding backward");
}

/* The gradient's sum of squares, waited for; NaN after a failure. */
static double cu_sum_squares(void *exec, size_t n, const float *x)
{
    sd_cuda *c = live(exec);
    double s = 0;
    if (!c) return NAN;
    cudaError_t e = sdk_sum_squares(c, n, x, &s);
    done(c, e, "sum of squares");
    return e == cudaSuccess ? s : NAN;
}

/* One AdamW step. */
static void cu_adamw(void *exec, const sd_adamw_args *a, size_t n, float *p, float *m, float *v, const float *g)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_adamw(c, a, n, p, m, v, g), "AdamW");
}

/* One AdamW step with bf16 moments. */
static void cu_adamw_bf16(void *exec, const sd_adamw_args *a, size_t n, size_t index0, float *p, uint16_t *m,
                          uint16_t *v, const float *g)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_adamw_bf16(c, a, n, index0, p, m, v, g), "AdamW (bf16 moments)");
}

/* One EMA update. */
static void cu_ema(void *exec, size_t n, float *ema, const float *p, float one_minus_decay)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_ema(c, n, ema, p, one_minus_decay), "EMA update");
}

/* 8-bit AdamW's maps and tables in device memory: uploaded from the
 * caller's host copy once (they are bitsandbytes' fixed maps) and kept
 * with the context. */
static const sd_q8_tables *q8_tables_on(sd_cuda *c, const sd_q8_tables *host)
{
    if (c->q8_tables) return c->q8_tables;
    c->q8_tables = sdc_alloc(c, sizeof *host);
    if (c->q8_tables) sdc_mem_h2d(c, c->q8_tables, host, sizeof *host);
    return c->q8_tables;
}

/* One 8-bit AdamW step over ntensors tensors. */
static void cu_adamw8(void *exec, const sd_adamw8_args *a, const sd_q8_tables *t, size_t nt, const sd_q8_tensor *ts,
                      float *p, const float *g)
{
    sd_cuda *c = live(exec);
    const sd_q8_tables *dt = c ? q8_tables_on(c, t) : NULL;
    if (dt) done(c, sdk_adamw8(c, a, dt, nt, ts, p, g), "AdamW (8-bit)");
}

/* One Adafactor step over ntensors tensors. */
static void cu_adafactor(void *exec, const sd_adafactor_args *a, size_t nt, const sd_adafactor_tensor *ts, float *p,
                         const float *g)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_adafactor(c, a, nt, ts, p, g), "Adafactor");
}

/* bf16 weights widened. */
static void cu_bf16_widen(void *exec, size_t n, float *dst, const uint16_t *src)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_bf16_widen(c, n, dst, src), "bf16 widening");
}

/* fp32 values stored as bf16 with keyed stochastic rounding. */
static void cu_bf16_store_sr(void *exec, size_t n, size_t index0, uint32_t key, uint16_t *dst, const float *src)
{
    sd_cuda *c = live(exec);
    if (c) done(c, sdk_bf16_store_sr(c, n, index0, key, dst, src), "bf16 store (stochastic rounding)");
}

static const sd_backend cuda_backend = {
    .name = "cuda",
    .is_device = 1,
    .alloc = sdc_mem_alloc,
    .release = sdc_mem_release,
    .h2d = sdc_mem_h2d,
    .d2h = sdc_mem_d2h,
    .d2d = sdc_mem_d2d,
    .zero = sdc_mem_zero,
    .sync = sdc_sync,
    .conv2d_fwd = cu_conv2d_fwd,
    .conv2d_bwd = cu_conv2d_bwd,
    .group_norm_fwd = cu_group_norm_fwd,
    .group_norm_bwd = cu_group_norm_bwd,
    .linear_fwd = cu_linear_fwd,
    .linear_bwd = cu_linear_bwd,
    .silu_fwd = cu_silu_fwd,
    .silu_bwd = cu_silu_bwd,
    .add_fwd = cu_add_fwd,
    .add_bwd = cu_add_bwd,
    .upsample2x_fwd = cu_upsample2x_fwd,
    .upsample2x_bwd = cu_upsample2x_bwd,
    .attn_fwd = cu_attn_fwd,
    .attn_bwd = cu_attn_bwd,
    .layer_norm_fwd = cu_layer_norm_fwd,
    .layer_norm_bwd = cu_layer_norm_bwd,
    .gelu_fwd = cu_gelu_fwd,
    .gelu_bwd = cu_gelu_bwd,
    .quick_gelu_fwd = cu_quick_gelu_fwd,
    .quick_gelu_bwd = cu_quick_gelu_bwd,
    .geglu_fwd = cu_geglu_fwd,
    .geglu_bwd = cu_geglu_bwd,
    .scale_fwd = cu_scale_fwd,
    .scale_bwd = cu_scale_bwd,
    .mul_fwd = cu_mul_fwd,
    .mul_bwd = cu_mul_bwd,
    .concat_fwd = cu_concat_fwd,
    .concat_bwd = cu_concat_bwd,
    .add_bcast_channel_fwd = cu_add_bcast_channel_fwd,
    .add_bcast_channel_bwd = cu_add_bcast_channel_bwd,
    .timestep_emb_fwd = cu_timestep_emb_fwd,
    .timestep_emb_bwd = cu_timestep_emb_bwd,
    .transpose_fwd = cu_transpose_fwd,
    .transpose_bwd = cu_transpose_bwd,
    .gauss_std_fwd = cu_gauss_std_fwd,
    .gauss_std_bwd = cu_gauss_std_bwd,
    .embedding_fwd = cu_embedding_fwd,
    .embedding_bwd = cu_embedding_bwd,
    .sum_squares = cu_sum_squares,
    .adamw = cu_adamw,
    .adamw_bf16 = cu_adamw_bf16,
    .ema = cu_ema,
    .adamw8 = cu_adamw8,
    .adafactor = cu_adafactor,
    .bf16_widen = cu_bf16_widen,
    .bf16_store_sr = cu_bf16_store_sr,
};

/* The CUDA table; pass an sd_cuda * as exec. */
const sd_backend *sd_backend_cuda(void)
{
    return &cuda_backend;
}
