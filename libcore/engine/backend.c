/* The CPU backend table: the reference ops of ops_cpu.h behind the table's
 * void *exec signatures, and host memory behind its memory entries. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* One wrapper per op: the table's entries take void *exec, the ops take
 * sd_pool *, and calling a function through a pointer of another type is
 * undefined behaviour (UBSan's -fsanitize=function reports it), so each
 * entry is a real function of the table's type that converts exec back. */
#define CPU_OP(op, params, args)                                                                                     \
    static void cpu_##op params                                                                                      \
    {                                                                                                                \
        sd_pool *pool = exec;                                                                                        \
        sd_##op args;                                                                                                \
    }

CPU_OP(conv2d_fwd, (void *exec, const sd_conv2d_shape *s, float *y, const float *x, const float *w, const float *b),
       (pool, s, y, x, w, b))
CPU_OP(conv2d_bwd,
       (void *exec, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy, const float *x,
        const float *w),
       (pool, s, dx, dw, db, dy, x, w))
CPU_OP(group_norm_fwd,
       (void *exec, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x, const float *gamma,
        const float *beta),
       (pool, s, y, mean, rstd, x, gamma, beta))
CPU_OP(group_norm_bwd,
       (void *exec, const sd_gn_shape *s, float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
        const float *mean, const float *rstd, const float *gamma),
       (pool, s, dx, dgamma, dbeta, dy, x, mean, rstd, gamma))
CPU_OP(linear_fwd, (void *exec, const sd_linear_shape *s, float *y, const float *x, const float *w, const float *b),
       (pool, s, y, x, w, b))
CPU_OP(linear_act_fwd,
       (void *exec, const sd_linear_shape *s, sd_act act, int wdtype, float *y, const float *x, const void *w,
        const float *b),
       (pool, s, act, wdtype, y, x, w, b))
CPU_OP(linear_bwd,
       (void *exec, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy, const float *x,
        const float *w),
       (pool, s, dx, dw, db, dy, x, w))
CPU_OP(silu_fwd, (void *exec, size_t n, float *y, const float *x), (pool, n, y, x))
CPU_OP(silu_bwd, (void *exec, size_t n, float *dx, const float *dy, const float *x), (pool, n, dx, dy, x))
CPU_OP(add_fwd, (void *exec, size_t n, float *y, const float *a, const float *b), (pool, n, y, a, b))
CPU_OP(add_bwd, (void *exec, size_t n, float *da, float *db, const float *dy), (pool, n, da, db, dy))
CPU_OP(upsample2x_fwd, (void *exec, int planes, int h, int w, float *y, const float *x), (pool, planes, h, w, y, x))
CPU_OP(upsample2x_bwd, (void *exec, int planes, int h, int w, float *dx, const float *dy),
       (pool, planes, h, w, dx, dy))
CPU_OP(attn_fwd,
       (void *exec, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k, const float *v),
       (pool, s, y, lse, q, k, v))
CPU_OP(attn_rows_fwd,
       (void *exec, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q, const float *k,
        const float *v),
       (pool, s, ld, y, lse, q, k, v))
CPU_OP(conv2d_fwd_st,
       (void *exec, const sd_conv2d_shape *s, int ydt, void *y, int xdt, const void *x, const float *w,
        const float *b),
       (pool, s, ydt, y, xdt, x, w, b))
CPU_OP(group_norm_fwd_st,
       (void *exec, const sd_gn_shape *s, int silu, int ydt, void *y, float *mean, float *rstd, int xdt,
        const void *x, const float *gamma, const float *beta),
       (pool, s, silu, ydt, y, mean, rstd, xdt, x, gamma, beta))
CPU_OP(add_fwd_st, (void *exec, size_t n, int dt, void *y, const void *a, const void *b), (pool, n, dt, y, a, b))
CPU_OP(convert_st, (void *exec, size_t n, int ydt, void *y, int xdt, const void *x), (pool, n, ydt, y, xdt, x))
CPU_OP(attn_bwd,
       (void *exec, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy, const float *q,
        const float *k, const float *v, const float *y, const float *lse),
       (pool, s, dq, dk, dv, dy, q, k, v, y, lse))
CPU_OP(layer_norm_fwd,
       (void *exec, const sd_ln_shape *s, float *y, float *mean, float *rstd, const float *x, const float *gamma,
        const float *beta),
       (pool, s, y, mean, rstd, x, gamma, beta))
CPU_OP(layer_norm_bwd,
       (void *exec, const sd_ln_shape *s, float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
        const float *mean, const float *rstd, const float *gamma),
       (pool, s, dx, dgamma, dbeta, dy, x, mean, rstd, gamma))
CPU_OP(gelu_fwd, (void *exec, size_t n, float *y, const float *x), (pool, n, y, x))
CPU_OP(gelu_bwd, (void *exec, size_t n, float *dx, const float *dy, const float *x), (pool, n, dx, dy, x))
CPU_OP(quick_gelu_fwd, (void *exec, size_t n, float *y, const float *x), (pool, n, y, x))
CPU_OP(quick_gelu_bwd, (void *exec, size_t n, float *dx, const float *dy, const float *x), (pool, n, dx, dy, x))
CPU_OP(geglu_fwd, (void *exec, size_t m, size_t n, float *y, const float *x), (pool, m, n, y, x))
CPU_OP(geglu_bwd, (void *exec, size_t m, size_t n, float *dx, const float *dy, const float *x),
       (pool, m, n, dx, dy, x))
CPU_OP(scale_fwd, (void *exec, size_t n, float *y, const float *x, float alpha), (pool, n, y, x, alpha))
CPU_OP(scale_bwd, (void *exec, size_t n, float *dx, const float *dy, float alpha), (pool, n, dx, dy, alpha))
CPU_OP(mul_fwd, (void *exec, size_t n, float *y, const float *a, const float *b), (pool, n, y, a, b))
CPU_OP(mul_bwd, (void *exec, size_t n, float *da, float *db, const float *dy, const float *a, const float *b),
       (pool, n, da, db, dy, a, b))
CPU_OP(concat_fwd, (void *exec, const sd_concat_shape *s, float *y, const float *a, const float *b),
       (pool, s, y, a, b))
CPU_OP(concat_bwd, (void *exec, const sd_concat_shape *s, float *da, float *db, const float *dy), (pool, s, da, db, dy))
CPU_OP(add_bcast_channel_fwd, (void *exec, int n, int c, int hw, float *y, const float *x, const float *b),
       (pool, n, c, hw, y, x, b))
CPU_OP(add_bcast_channel_bwd, (void *exec, int n, int c, int hw, float *dx, float *db, const float *dy),
       (pool, n, c, hw, dx, db, dy))
CPU_OP(timestep_emb_fwd, (void *exec, const sd_temb_shape *s, float *y, const float *t), (pool, s, y, t))
CPU_OP(timestep_emb_bwd, (void *exec, const sd_temb_shape *s, float *dt, const float *dy, const float *t),
       (pool, s, dt, dy, t))
CPU_OP(transpose_fwd, (void *exec, int n, int rows, int cols, float *y, const float *x), (pool, n, rows, cols, y, x))
CPU_OP(transpose_bwd, (void *exec, int n, int rows, int cols, float *dx, const float *dy),
       (pool, n, rows, cols, dx, dy))
CPU_OP(gauss_std_fwd, (void *exec, size_t n, float *y, const float *x), (pool, n, y, x))
CPU_OP(gauss_std_bwd, (void *exec, size_t n, float *dx, const float *dy, const float *x), (pool, n, dx, dy, x))
CPU_OP(adamw_fwd, (void *exec, const sd_adamw_args *a, size_t n, float *p, float *m, float *v, const float *g),
       (pool, a, n, p, m, v, g))
CPU_OP(adamw_bf16_fwd,
       (void *exec, const sd_adamw_args *a, size_t n, size_t index0, float *p, uint16_t *m, uint16_t *v,
        const float *g),
       (pool, a, n, index0, p, m, v, g))
CPU_OP(ema_fwd, (void *exec, size_t n, float *ema, const float *p, float w), (pool, n, ema, p, w))
CPU_OP(adamw8_fwd,
       (void *exec, const sd_adamw8_args *a, const sd_q8_tables *t, size_t nt, const sd_q8_tensor *ts, float *p,
        const float *g),
       (pool, a, t, nt, ts, p, g))
CPU_OP(adafactor_fwd,
       (void *exec, const sd_adafactor_args *a, size_t nt, const sd_adafactor_tensor *ts, float *p, const float *g),
       (pool, a, nt, ts, p, g))
CPU_OP(bf16_widen_fwd, (void *exec, size_t n, float *dst, const uint16_t *src), (pool, n, dst, src))
CPU_OP(bf16_store_sr_fwd, (void *exec, size_t n, size_t index0, uint32_t key, uint16_t *dst, const float *src),
       (pool, n, index0, key, dst, src))

/* The sum is ready on return on the CPU. */
static double cpu_sum_squares(void *exec, size_t n, const float *x)
{
    return sd_sum_squares(exec, n, x);
}

CPU_OP(embedding_fwd,
       (void *exec, const sd_embedding_shape *s, float *y, const int32_t *ids, const float *tok, const float *pos),
       (pool, s, y, ids, tok, pos))
CPU_OP(embedding_bwd,
       (void *exec, const sd_embedding_shape *s, float *dtok, float *dpos, const float *dy, const int32_t *ids),
       (pool, s, dtok, dpos, dy, ids))

/* Host memory, 64-byte aligned like sd_flat_take's tensors; a zero-byte
 * request still returns a unique pointer. */
static void *cpu_alloc(void *exec, size_t bytes)
{
    (void)exec;
    size_t rounded = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded ? rounded : 64);
}

/* Gives back what cpu_alloc returned (NULL is a no-op). */
static void cpu_release(void *exec, void *p)
{
    (void)exec;
    free(p);
}

/* Host to "device" is host to host here; memmove so a caller copying
 * within one buffer needs no special case. */
static void cpu_copy(void *exec, void *dst, const void *src, size_t bytes)
{
    (void)exec;
    if (bytes) memmove(dst, src, bytes);
}

/* Clears bytes of backend memory. */
static void cpu_zero(void *exec, void *p, size_t bytes)
{
    (void)exec;
    if (bytes) memset(p, 0, bytes);
}

/* CPU ops are finished when they return and cannot fail, so there is
 * nothing to wait for and no error to report. */
static sd_status cpu_sync(void *exec, sd_error *err)
{
    (void)exec;
    (void)err;
    return SD_OK;
}

static const sd_backend cpu_backend = {
    .name = "cpu",
    .is_device = 0,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .h2d = cpu_copy,
    .d2h = cpu_copy,
    .d2d = cpu_copy,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .conv2d_fwd = cpu_conv2d_fwd,
    .conv2d_bwd = cpu_conv2d_bwd,
    .group_norm_fwd = cpu_group_norm_fwd,
    .group_norm_bwd = cpu_group_norm_bwd,
    .linear_fwd = cpu_linear_fwd,
    .linear_act_fwd = cpu_linear_act_fwd,
    .linear_bwd = cpu_linear_bwd,
    .silu_fwd = cpu_silu_fwd,
    .silu_bwd = cpu_silu_bwd,
    .add_fwd = cpu_add_fwd,
    .add_bwd = cpu_add_bwd,
    .upsample2x_fwd = cpu_upsample2x_fwd,
    .upsample2x_bwd = cpu_upsample2x_bwd,
    .attn_fwd = cpu_attn_fwd,
    .attn_rows_fwd = cpu_attn_rows_fwd,
    .attn_bwd = cpu_attn_bwd,
    .conv2d_fwd_st = cpu_conv2d_fwd_st,
    .group_norm_fwd_st = cpu_group_norm_fwd_st,
    .add_fwd_st = cpu_add_fwd_st,
    .convert_st = cpu_convert_st,
    .layer_norm_fwd = cpu_layer_norm_fwd,
    .layer_norm_bwd = cpu_layer_norm_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .quick_gelu_fwd = cpu_quick_gelu_fwd,
    .quick_gelu_bwd = cpu_quick_gelu_bwd,
    .geglu_fwd = cpu_geglu_fwd,
    .geglu_bwd = cpu_geglu_bwd,
    .scale_fwd = cpu_scale_fwd,
    .scale_bwd = cpu_scale_bwd,
    .mul_fwd = cpu_mul_fwd,
    .mul_bwd = cpu_mul_bwd,
    .concat_fwd = cpu_concat_fwd,
    .concat_bwd = cpu_concat_bwd,
    .add_bcast_channel_fwd = cpu_add_bcast_channel_fwd,
    .add_bcast_channel_bwd = cpu_add_bcast_channel_bwd,
    .timestep_emb_fwd = cpu_timestep_emb_fwd,
    .timestep_emb_bwd = cpu_timestep_emb_bwd,
    .transpose_fwd = cpu_transpose_fwd,
    .transpose_bwd = cpu_transpose_bwd,
    .gauss_std_fwd = cpu_gauss_std_fwd,
    .gauss_std_bwd = cpu_gauss_std_bwd,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = cpu_embedding_bwd,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw_fwd,
    .adamw_bf16 = cpu_adamw_bf16_fwd,
    .ema = cpu_ema_fwd,
    .adamw8 = cpu_adamw8_fwd,
    .adafactor = cpu_adafactor_fwd,
    .bf16_widen = cpu_bf16_widen_fwd,
    .bf16_store_sr = cpu_bf16_store_sr_fwd,
};

/* The table every caller uses until a device backend is chosen. */
const sd_backend *sd_backend_cpu(void)
{
    return &cpu_backend;
}

/* Grow-only buffers: a runner's steady state allocates nothing. */
sd_status sd_backend_grow(const sd_backend *be, void *exec, void **p, size_t *cap, size_t bytes, const char *who,
                          const char *what, sd_error *err)
{
    if (*p && *cap >= bytes) return SD_OK;
    sd_backend_drop(be, exec, p);
    *cap = 0;
    *p = be->alloc(exec, bytes);
    if (!*p) {
        sd_error why = {0};
        sd_status st = be->sync(exec, &why); /* a device backend has the reason */
        return sd_err_set(err, SD_ENOMEM, "%s on %s: cannot allocate the %s (%zu MiB)%s%s", who, be->name, what,
                          bytes >> 20, st ? ": " : "", st ? why.msg : "");
    }
    *cap = bytes;
    return SD_OK;
}

/* Weights are uploaded once per runner; the host path must not copy them. */
sd_status sd_backend_params_in(const sd_backend *be, void *exec, const float *host, size_t floats, float **out,
                               int *borrowed, const char *who, sd_error *err)
{
    *out = NULL;
    *borrowed = !be->is_device;
    if (*borrowed) {
        *out = (float *)host;
        return SD_OK;
    }
    size_t cap = 0;
    void *p = NULL;
    sd_status st = sd_backend_grow(be, exec, &p, &cap, floats * sizeof(float), who, "parameters", err);
    *out = p;
    if (st) return st;
    be->h2d(exec, p, host, floats * sizeof(float));
    return be->sync(exec, err);
}

/* Release and forget. */
void sd_backend_drop(const sd_backend *be, void *exec, void **p)
{
    if (*p) be->release(exec, *p);
    *p = NULL;
}
