/* sd-selftest: runs every engine op on a device backend and on the CPU
 * reference with the same random inputs and compares outputs and
 * gradients, runs the tiny golden VAE on the device against diffusers'
 * values, and probes throughput. The one command a user with a GPU runs to
 * check the CUDA path, which the project itself could not run.
 *
 * Exit codes: 0 every check passed, 1 a check failed, 2 usage, 3 fatal
 * error, 4 no usable GPU or no CUDA backend in this build (ctest reports
 * that as skipped). --plan prints the VAE's memory plan (no GPU needed). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "attn_blocks.h"
#include "backend.h"
#include "cli.h"
#include "dtype.h"
#include "err.h"
#include "pool.h"
#include "progress.h"
#include "safetensors.h"
#include "selftest_unet.h"
#include "vae.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

#ifndef SDTK_GOLDEN_VAE
#define SDTK_GOLDEN_VAE "tests/golden/vae/sd"
#endif
#ifndef SDTK_GOLDEN_UNET
#define SDTK_GOLDEN_UNET "tests/golden/unet"
#endif

enum { EXIT_NO_GPU = 4, MAXB = 12 };

/* A backend and its exec context. */
typedef struct {
    const sd_backend *be;
    void *ex;
} target;

/* Buffer roles: inputs (random), forward outputs (pre-filled with a
 * sentinel that differs between the two runs, so an unwritten element
 * shows), gradients (random: backward must add into them), token ids. */
enum { IN, OUT, GRAD, IDS };

typedef struct {
    const char *name;
    size_t n;
    int role;
    float lo, hi; /* IN and GRAD values; IDS: ids in [0, hi) */
} buf_spec;

/* Op classes, each with its own tolerances (op_tols). */
enum { OC_CONV, OC_LINEAR, OC_ATTN, OC_NORM, OC_ELEM, OC_TEMB, OC_OPTIM, OC_N };

typedef struct {
    const char *name;
    int nb;
    buf_spec b[MAXB];
    void (*fwd)(const target *t, float **p);
    void (*bwd)(const target *t, float **p);
    int cls; /* OC_* */
} op_case;

#define SZ(x) ((size_t)(x))

/* Shapes of the op cases: small, but past every tile and chunk edge. */
static const sd_conv2d_shape conv_same = {.n = 2, .cin = 5, .h = 17, .w = 19, .cout = 7, .kh = 3, .kw = 3,
                                          .stride = 1, .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
static const sd_conv2d_shape conv_down = {.n = 2, .cin = 6, .h = 16, .w = 15, .cout = 5, .kh = 3, .kw = 3,
                                          .stride = 2, .pad_t = 0, .pad_b = 1, .pad_l = 0, .pad_r = 1};
static const sd_conv2d_shape conv_1x1 = {.n = 1, .cin = 16, .h = 9, .w = 11, .cout = 24, .kh = 1, .kw = 1, .stride = 1};
static const sd_gn_shape gn_small = {.n = 2, .c = 32, .hw = 300, .groups = 8, .eps = 1e-6f};
static const sd_gn_shape gn_chunked = {.n = 1, .c = 64, .hw = 4096, .groups = 4, .eps = 1e-6f};
/* one pixel, several groups: statistics per (image, group), not per image
 * (4 channels a group: with 2, dx is ~0 and a dropped dx would not show) */
static const sd_gn_shape gn_1x1 = {.n = 2, .c = 16, .hw = 1, .groups = 4, .eps = 1e-6f};
static const sd_ln_shape ln_shape = {.m = 77, .c = 96, .eps = 1e-5f};
static const sd_linear_shape lin_bias = {.m = 77, .k = 96, .n = 130};
static const sd_linear_shape lin_nobias = {.m = 300, .k = 64, .n = 64};
static const sd_attn_shape at_cross = {.b = 2, .heads = 3, .tq = 70, .tk = 45, .d = 40, .causal = 0, .scale = 0.158f};
static const sd_attn_shape at_causal = {.b = 1, .heads = 2, .tq = 100, .tk = 100, .d = 64, .causal = 1,
                                        .scale = 0.125f};
/* longer than a [blocks] context's block holds: split into query rows, with the mask / with tq != tk */
static const sd_attn_shape at_causal_long = {.b = 1, .heads = 2, .tq = 150, .tk = 150, .d = 64, .causal = 1,
                                             .scale = 0.125f};
static const sd_attn_shape at_cross_long = {.b = 1, .heads = 2, .tq = 300, .tk = 77, .d = 40, .causal = 0,
                                            .scale = 0.158f};
static const sd_attn_shape at_vae = {.b = 1, .heads = 1, .tq = 256, .tk = 256, .d = 512, .causal = 0,
                                     .scale = 0.0441941738f};
static const sd_attn_shape at_vae_odd = {.b = 2, .heads = 1, .tq = 300, .tk = 300, .d = 512, .causal = 0,
                                         .scale = 0.0441941738f};
/* long and narrow: 8 MiB of scores against 0.6 MiB of tensors, so that a
 * context limited to 4 MiB of device memory must take the flash kernel */
static const sd_attn_shape at_narrow = {.b = 1, .heads = 2, .tq = 1024, .tk = 1024, .d = 8, .causal = 0,
                                        .scale = 0.35f};
/* wide heads: the flash kernel needs (16 d + 3696) floats of shared memory
 * per block, past the default 48 KiB from d = 538 (the opt-in path) */
static const sd_attn_shape at_wide = {.b = 1, .heads = 2, .tq = 40, .tk = 33, .d = 576, .causal = 0,
                                      .scale = 0.0416666667f};
static const sd_concat_shape cat_shape = {.n = 2, .c1 = 3, .c2 = 5, .hw = 37};
static const sd_temb_shape temb_shape = {.n = 6, .dim = 321, .flip_sin_to_cos = 1, .freq_shift = 0.0f, .scale = 1.0f,
                                         .max_period = 10000.0f};
static const sd_embedding_shape emb_shape = {.n = 3, .t = 77, .dim = 64, .vocab = 500, .npos = 77};
static const sd_embedding_shape emb_nopos = {.n = 2, .t = 40, .dim = 48, .vocab = 300, .npos = 0};
enum { ELEM_N = 10007, GEGLU_M = 33, GEGLU_N = 50, UP_P = 6, UP_H = 7, UP_W = 9, BC_N = 2, BC_C = 8, BC_HW = 300,
       TR_N = 2, TR_R = 70, TR_C = 45 };

/* conv2d: x w b | y | dx dw db | dy. */
static void conv_fwd(const target *t, const sd_conv2d_shape *s, float **p)
{
    t->be->conv2d_fwd(t->ex, s, p[3], p[0], p[1], p[2]);
}
static void conv_bwd(const target *t, const sd_conv2d_shape *s, float **p)
{
    t->be->conv2d_bwd(t->ex, s, p[4], p[5], p[6], p[7], p[0], p[1]);
}
static void conv_same_fwd(const target *t, float **p) { conv_fwd(t, &conv_same, p); }
static void conv_same_bwd(const target *t, float **p) { conv_bwd(t, &conv_same, p); }
static void conv_down_fwd(const target *t, float **p) { conv_fwd(t, &conv_down, p); }
static void conv_down_bwd(const target *t, float **p) { conv_bwd(t, &conv_down, p); }
static void conv_1x1_fwd(const target *t, float **p) { conv_fwd(t, &conv_1x1, p); }
static void conv_1x1_bwd(const target *t, float **p) { conv_bwd(t, &conv_1x1, p); }

/* conv2d without dx (a model's first layer): x w b | y | dw db | dy. */
static void conv_nodx_bwd(const target *t, float **p)
{
    t->be->conv2d_bwd(t->ex, &conv_same, NULL, p[4], p[5], p[6], p[0], p[1]);
}

/* conv2d without bias, asymmetric padding: x w | y | dx dw | dy. */
static void conv_nob_fwd(const target *t, float **p)
{
    t->be->conv2d_fwd(t->ex, &conv_down, p[2], p[0], p[1], NULL);
}
static void conv_nob_bwd(const target *t, float **p)
{
    t->be->conv2d_bwd(t->ex, &conv_down, p[3], p[4], NULL, p[5], p[0], p[1]);
}

/* group_norm: x gamma beta | y mean rstd | dx dgamma dbeta | dy. */
static void gn_fwd(const target *t, const sd_gn_shape *s, float **p)
{
    t->be->group_norm_fwd(t->ex, s, p[3], p[4], p[5], p[0], p[1], p[2]);
}
static void gn_bwd(const target *t, const sd_gn_shape *s, float **p)
{
    t->be->group_norm_bwd(t->ex, s, p[6], p[7], p[8], p[9], p[0], p[4], p[5], p[1]);
}
static void gn_small_fwd(const target *t, float **p) { gn_fwd(t, &gn_small, p); }
static void gn_small_bwd(const target *t, float **p) { gn_bwd(t, &gn_small, p); }
static void gn_chunked_fwd(const target *t, float **p) { gn_fwd(t, &gn_chunked, p); }
static void gn_chunked_bwd(const target *t, float **p) { gn_bwd(t, &gn_chunked, p); }
static void gn_1x1_fwd(const target *t, float **p) { gn_fwd(t, &gn_1x1, p); }
static void gn_1x1_bwd(const target *t, float **p) { gn_bwd(t, &gn_1x1, p); }

/* group_norm without gamma and beta: x | y mean rstd | dx | dy. */
static void gn_plain_fwd(const target *t, float **p)
{
    t->be->group_norm_fwd(t->ex, &gn_small, p[1], p[2], p[3], p[0], NULL, NULL);
}
static void gn_plain_bwd(const target *t, float **p)
{
    t->be->group_norm_bwd(t->ex, &gn_small, p[4], NULL, NULL, p[5], p[0], p[2], p[3], NULL);
}

/* layer_norm: same layout as group_norm. */
static void ln_fwd(const target *t, float **p)
{
    t->be->layer_norm_fwd(t->ex, &ln_shape, p[3], p[4], p[5], p[0], p[1], p[2]);
}
static void ln_bwd(const target *t, float **p)
{
    t->be->layer_norm_bwd(t->ex, &ln_shape, p[6], p[7], p[8], p[9], p[0], p[4], p[5], p[1]);
}

/* linear: x w b | y | dx dw db | dy (b and db absent without bias). */
static void lin_bias_fwd(const target *t, float **p)
{
    t->be->linear_fwd(t->ex, &lin_bias, p[3], p[0], p[1], p[2]);
}
static void lin_bias_bwd(const target *t, float **p)
{
    t->be->linear_bwd(t->ex, &lin_bias, p[4], p[5], p[6], p[7], p[0], p[1]);
}
static void lin_nobias_fwd(const target *t, float **p)
{
    t->be->linear_fwd(t->ex, &lin_nobias, p[2], p[0], p[1], NULL);
}
static void lin_nobias_bwd(const target *t, float **p)
{
    t->be->linear_bwd(t->ex, &lin_nobias, p[3], p[4], NULL, p[5], p[0], p[1]);
}
/* linear without dx: x w b | y | dw db | dy. */
static void lin_nodx_bwd(const target *t, float **p)
{
    t->be->linear_bwd(t->ex, &lin_bias, NULL, p[4], p[5], p[6], p[0], p[1]);
}

/* attention: q k v | y lse | dq dk dv | dy. */
static void attn_fwd(const target *t, const sd_attn_shape *s, float **p)
{
    t->be->attn_fwd(t->ex, s, p[3], p[4], p[0], p[1], p[2]);
}
static void attn_bwd(const target *t, const sd_attn_shape *s, float **p)
{
    t->be->attn_bwd(t->ex, s, p[5], p[6], p[7], p[8], p[0], p[1], p[2], p[3], p[4]);
}
static void at_cross_fwd(const target *t, float **p) { attn_fwd(t, &at_cross, p); }
static void at_cross_bwd(const target *t, float **p) { attn_bwd(t, &at_cross, p); }
static void at_causal_fwd(const target *t, float **p) { attn_fwd(t, &at_causal, p); }
static void at_causal_bwd(const target *t, float **p) { attn_bwd(t, &at_causal, p); }
static void at_causal_long_fwd(const target *t, float **p) { attn_fwd(t, &at_causal_long, p); }
static void at_causal_long_bwd(const target *t, float **p) { attn_bwd(t, &at_causal_long, p); }
static void at_cross_long_fwd(const target *t, float **p) { attn_fwd(t, &at_cross_long, p); }
static void at_cross_long_bwd(const target *t, float **p) { attn_bwd(t, &at_cross_long, p); }
static void at_vae_fwd(const target *t, float **p) { attn_fwd(t, &at_vae, p); }
static void at_vae_bwd(const target *t, float **p) { attn_bwd(t, &at_vae, p); }
static void at_vae_odd_fwd(const target *t, float **p) { attn_fwd(t, &at_vae_odd, p); }
static void at_vae_odd_bwd(const target *t, float **p) { attn_bwd(t, &at_vae_odd, p); }
static void at_narrow_fwd(const target *t, float **p) { attn_fwd(t, &at_narrow, p); }
static void at_narrow_bwd(const target *t, float **p) { attn_bwd(t, &at_narrow, p); }
static void at_wide_fwd(const target *t, float **p) { attn_fwd(t, &at_wide, p); }
static void at_wide_bwd(const target *t, float **p) { attn_bwd(t, &at_wide, p); }

/* attention with only dv asked for (no score gradients): q k v | y lse | dv | dy. */
static void at_dv_bwd(const target *t, float **p)
{
    t->be->attn_bwd(t->ex, &at_cross, NULL, NULL, p[5], p[6], p[0], p[1], p[2], p[3], p[4]);
}

/* Activations: x | y | dx | dy. */
static void silu_f(const target *t, float **p) { t->be->silu_fwd(t->ex, ELEM_N, p[1], p[0]); }
static void silu_b(const target *t, float **p) { t->be->silu_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
static void gelu_f(const target *t, float **p) { t->be->gelu_fwd(t->ex, ELEM_N, p[1], p[0]); }
static void gelu_b(const target *t, float **p) { t->be->gelu_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
static void qgelu_f(const target *t, float **p) { t->be->quick_gelu_fwd(t->ex, ELEM_N, p[1], p[0]); }
static void qgelu_b(const target *t, float **p) { t->be->quick_gelu_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
static void gstd_f(const target *t, float **p) { t->be->gauss_std_fwd(t->ex, ELEM_N, p[1], p[0]); }
static void gstd_b(const target *t, float **p) { t->be->gauss_std_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
static void scale_f(const target *t, float **p) { t->be->scale_fwd(t->ex, ELEM_N, p[1], p[0], -0.37f); }
static void scale_b(const target *t, float **p) { t->be->scale_bwd(t->ex, ELEM_N, p[2], p[3], -0.37f); }

/* Binary: a b | y | da db | dy. */
static void add_f(const target *t, float **p) { t->be->add_fwd(t->ex, ELEM_N, p[2], p[0], p[1]); }
static void add_b(const target *t, float **p) { t->be->add_bwd(t->ex, ELEM_N, p[3], p[4], p[5]); }
static void mul_f(const target *t, float **p) { t->be->mul_fwd(t->ex, ELEM_N, p[2], p[0], p[1]); }
static void mul_b(const target *t, float **p) { t->be->mul_bwd(t->ex, ELEM_N, p[3], p[4], p[5], p[0], p[1]); }
static void cat_f(const target *t, float **p) { t->be->concat_fwd(t->ex, &cat_shape, p[2], p[0], p[1]); }
static void cat_b(const target *t, float **p) { t->be->concat_bwd(t->ex, &cat_shape, p[3], p[4], p[5]); }

/* Shape ops with one input: x | y | dx | dy. */
static void geglu_f(const target *t, float **p) { t->be->geglu_fwd(t->ex, GEGLU_M, GEGLU_N, p[1], p[0]); }
static void geglu_b(const target *t, float **p) { t->be->geglu_bwd(t->ex, GEGLU_M, GEGLU_N, p[2], p[3], p[0]); }
static void up_f(const target *t, float **p) { t->be->upsample2x_fwd(t->ex, UP_P, UP_H, UP_W, p[1], p[0]); }
static void up_b(const target *t, float **p) { t->be->upsample2x_bwd(t->ex, UP_P, UP_H, UP_W, p[2], p[3]); }
static void tr_f(const target *t, float **p) { t->be->transpose_fwd(t->ex, TR_N, TR_R, TR_C, p[1], p[0]); }
static void tr_b(const target *t, float **p) { t->be->transpose_bwd(t->ex, TR_N, TR_R, TR_C, p[2], p[3]); }
static void temb_f(const target *t, float **p) { t->be->timestep_emb_fwd(t->ex, &temb_shape, p[1], p[0]); }
static void temb_b(const target *t, float **p) { t->be->timestep_emb_bwd(t->ex, &temb_shape, p[2], p[3], p[0]); }

/* Optimizer: p m v (updated in place) | g | sum of squares / n | ema. */
static const sd_adamw_args adamw_args = {.decay = 0.9999f, .b1 = 0.9f, .b2 = 0.999f, .step_size = 1e-3f,
                                         .bc2_sqrt = 0.0447f, .eps = 1e-8f, .gscale = 0.7f};
static void opt_f(const target *t, float **p)
{
    float mean_sq = (float)(t->be->sum_squares(t->ex, ELEM_N, p[3]) / ELEM_N);
    t->be->h2d(t->ex, p[4], &mean_sq, sizeof mean_sq);
    t->be->adamw(t->ex, &adamw_args, ELEM_N, p[0], p[1], p[2], p[3]);
}
static void opt_b(const target *t, float **p) { t->be->ema(t->ex, ELEM_N, p[5], p[0], 0.05f); }


/* Broadcast add: x b | y | dx db | dy. */
static void bc_f(const target *t, float **p)
{
    t->be->add_bcast_channel_fwd(t->ex, BC_N, BC_C, BC_HW, p[2], p[0], p[1]);
}
static void bc_b(const target *t, float **p)
{
    t->be->add_bcast_channel_bwd(t->ex, BC_N, BC_C, BC_HW, p[3], p[4], p[5]);
}

/* Embedding: ids tok pos | y | dtok dpos | dy. */
static void emb_f(const target *t, float **p)
{
    t->be->embedding_fwd(t->ex, &emb_shape, p[3], (const int32_t *)(void *)p[0], p[1], p[2]);
}
static void emb_b(const target *t, float **p)
{
    t->be->embedding_bwd(t->ex, &emb_shape, p[4], p[5], p[6], (const int32_t *)(void *)p[0]);
}

/* Embedding without positions (npos 0): ids tok | y | dtok | dy. */
static void emb_np_f(const target *t, float **p)
{
    t->be->embedding_fwd(t->ex, &emb_nopos, p[2], (const int32_t *)(void *)p[0], p[1], NULL);
}
static void emb_np_b(const target *t, float **p)
{
    t->be->embedding_bwd(t->ex, &emb_nopos, p[3], NULL, p[4], (const int32_t *)(void *)p[0]);
}

#define CONV_CASE(nm, s, F_, B_)                                                                                       \
    {nm, 8,                                                                                                            \
     {{"x", SZ(s.n) * SZ(s.cin) * SZ(s.h) * SZ(s.w), IN, -1, 1},                                                       \
      {"w", SZ(s.cout) * SZ(s.cin) * SZ(s.kh) * SZ(s.kw), IN, -0.3f, 0.3f},                                            \
      {"b", SZ(s.cout), IN, -1, 1},                                                                                    \
      {"y", SZ(s.n) * SZ(s.cout) * SZ((s.h + s.pad_t + s.pad_b - s.kh) / s.stride + 1) *                               \
                SZ((s.w + s.pad_l + s.pad_r - s.kw) / s.stride + 1),                                                   \
       OUT, 0, 0},                                                                                                     \
      {"dx", SZ(s.n) * SZ(s.cin) * SZ(s.h) * SZ(s.w), GRAD, -1, 1},                                                    \
      {"dw", SZ(s.cout) * SZ(s.cin) * SZ(s.kh) * SZ(s.kw), GRAD, -1, 1},                                               \
      {"db", SZ(s.cout), GRAD, -1, 1},                                                                                 \
      {"dy", SZ(s.n) * SZ(s.cout) * SZ((s.h + s.pad_t + s.pad_b - s.kh) / s.stride + 1) *                              \
                 SZ((s.w + s.pad_l + s.pad_r - s.kw) / s.stride + 1),                                                  \
       IN, -1, 1}},                                                                                                    \
     F_, B_, OC_CONV}
/* total: elements of x; ch: channels (gamma); units: (image, group) or rows. */
#define NORM_CASE(nm, total, ch, units, F_, B_)                                                                        \
    {nm, 10,                                                                                                           \
     {{"x", SZ(total), IN, -2, 3},                                                                                     \
      {"gamma", SZ(ch), IN, 0.5f, 1.5f},                                                                               \
      {"beta", SZ(ch), IN, -1, 1},                                                                                     \
      {"y", SZ(total), OUT, 0, 0},                                                                                     \
      {"mean", SZ(units), OUT, 0, 0},                                                                                  \
      {"rstd", SZ(units), OUT, 0, 0},                                                                                  \
      {"dx", SZ(total), GRAD, -1, 1},                                                                                  \
      {"dgamma", SZ(ch), GRAD, -1, 1},                                                                                 \
      {"dbeta", SZ(ch), GRAD, -1, 1},                                                                                  \
      {"dy", SZ(total), IN, -1, 1}},                                                                                   \
     F_, B_, OC_NORM}
#define ATTN_CASE(nm, s, F_, B_)                                                                                       \
    {nm, 9,                                                                                                            \
     {{"q", SZ(s.b) * SZ(s.heads) * SZ(s.tq) * SZ(s.d), IN, -1, 1},                                                    \
      {"k", SZ(s.b) * SZ(s.heads) * SZ(s.tk) * SZ(s.d), IN, -1, 1},                                                    \
      {"v", SZ(s.b) * SZ(s.heads) * SZ(s.tk) * SZ(s.d), IN, -1, 1},                                                    \
      {"y", SZ(s.b) * SZ(s.heads) * SZ(s.tq) * SZ(s.d), OUT, 0, 0},                                                    \
      {"lse", SZ(s.b) * SZ(s.heads) * SZ(s.tq), OUT, 0, 0},                                                            \
      {"dq", SZ(s.b) * SZ(s.heads) * SZ(s.tq) * SZ(s.d), GRAD, -1, 1},                                                 \
      {"dk", SZ(s.b) * SZ(s.heads) * SZ(s.tk) * SZ(s.d), GRAD, -1, 1},                                                 \
      {"dv", SZ(s.b) * SZ(s.heads) * SZ(s.tk) * SZ(s.d), GRAD, -1, 1},                                                 \
      {"dy", SZ(s.b) * SZ(s.heads) * SZ(s.tq) * SZ(s.d), IN, -1, 1}},                                                  \
     F_, B_, OC_ATTN}
#define UNARY_CASE(nm, nin, nout, lo, hi, F_, B_)                                                                      \
    {nm, 4, {{"x", nin, IN, lo, hi}, {"y", nout, OUT, 0, 0}, {"dx", nin, GRAD, -1, 1}, {"dy", nout, IN, -1, 1}},    \
     F_, B_, OC_ELEM}
#define BINARY_CASE(nm, na, nb_, nout, F_, B_)                                                                         \
    {nm, 6,                                                                                                            \
     {{"a", na, IN, -2, 2},                                                                                            \
      {"b", nb_, IN, -2, 2},                                                                                           \
      {"y", nout, OUT, 0, 0},                                                                                          \
      {"da", na, GRAD, -1, 1},                                                                                         \
      {"db", nb_, GRAD, -1, 1},                                                                                        \
      {"dy", nout, IN, -1, 1}},                                                                                        \
     F_, B_, OC_ELEM}


/* Elements of a convolution's output. */
static size_t conv_y_count(const sd_conv2d_shape *s)
{
    return SZ(s->n) * SZ(s->cout) * SZ((s->h + s->pad_t + s->pad_b - s->kh) / s->stride + 1) *
           SZ((s->w + s->pad_l + s->pad_r - s->kw) / s->stride + 1);
}

/* Deterministic uniform values in [lo, hi) from a per-buffer seed. */
static void fill(float *p, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = lo + (hi - lo) * (float)(s >> 40) / 16777216.0f;
    }
}

/* Token ids in [0, vocab) stored in a float-sized slot. */
static void fill_ids(float *p, size_t n, uint64_t seed, int vocab)
{
    int32_t *ids = (int32_t *)(void *)p;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
}

/* Runs one case on t: buffers from the backend, initial values copied in,
 * forward then backward, everything copied back into out[i]. */
static sd_status run_case(const op_case *oc, const target *t, float *const *init, float sentinel, float **out,
                          sd_error *err)
{
    float *p[MAXB] = {0};
    sd_status st = SD_OK;
    for (int i = 0; i < oc->nb && !st; i++) {
        size_t bytes = oc->b[i].n * sizeof(float);
        p[i] = t->be->alloc(t->ex, bytes);
        if (!p[i]) {
            st = sd_err_set(err, SD_ENOMEM, "%s: cannot allocate %s (%zu bytes)", oc->name, oc->b[i].name, bytes);
            break;
        }
        if (oc->b[i].role == OUT) {
            for (size_t j = 0; j < oc->b[i].n; j++) out[i][j] = sentinel;
            t->be->h2d(t->ex, p[i], out[i], bytes);
        } else {
            t->be->h2d(t->ex, p[i], init[i], bytes);
        }
    }
    if (!st) {
        oc->fwd(t, p);
        oc->bwd(t, p);
        st = t->be->sync(t->ex, err);
    }
    for (int i = 0; i < oc->nb && !st; i++) t->be->d2h(t->ex, out[i], p[i], oc->b[i].n * sizeof(float));
    if (!st) st = t->be->sync(t->ex, err);
    for (int i = 0; i < oc->nb; i++)
        if (p[i]) t->be->release(t->ex, p[i]);
    return st;
}

/* max |a - b| (NaN anywhere: infinite) and max |b| of n floats. */
static void max_abs(const float *a, const float *b, size_t n, double *emax, double *rmax)
{
    *emax = *rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]), r = fabs((double)b[i]);
        if (e != e) e = INFINITY;
        if (e > *emax) *emax = e;
        if (r > *rmax) *rmax = r;
    }
}

/* Normwise error of one tensor: max |a - b| / max |b| (the absolute error
 * where the reference is all zeros). */
static double tensor_error(const float *a, const float *b, size_t n)
{
    double e, r;
    max_abs(a, b, n, &e, &r);
    return r > 0 ? e / r : e;
}

/* Tolerances per op class, for its outputs (forward) and its gradients
 * (backward), per numerics mode (strict, TF32, bf16, fp16), for
 * tensor_error: each output and gradient tensor is judged by itself. From
 * the H100 runs (docs/gpu-runs; the table and its derivation in
 * docs/GPU.md, "Tolerances"): the logs give a case's largest absolute
 * error over its outputs and over its gradients; divided by each tensor's
 * own largest reference value (the same inputs, so the same on every
 * machine), that bounds each tensor's error there. Every tolerance is 5 to
 * 10 times the largest bound of its class, role and mode (strict: runs 11,
 * 14, 23, 25; TF32: 11, 14, 25; bf16: 17, 20, 23; fp16: 17, 22):
 *             forward                          backward
 *   conv    2.0e-7 (2.4e-4) 2.5e-3 4.1e-4   2.0e-6 2.4e-4 1.9e-2 3.0e-3
 *   linear  3.5e-7  3.4e-4  2.8e-3 3.4e-4   3.6e-6 1.6e-3 1.2e-2 1.6e-3
 *   attn    1.7e-5  6.0e-4  5.0e-3 4.1e-4   2.9e-6 5.2e-4 3.4e-3 5.2e-4
 *   norm 9.4e-7 / 7.6e-6, elementwise 1.2e-7 / 3.8e-6, timestep 6.1e-5 /
 *   3.3e-5, optimizer 0 / 5.7e-6 in every mode.
 * TF32 convolutions forward measured 2.0e-7 (cuDNN took an FMA algorithm
 * there); another GPU may take a TF32 one, so they get the backward's
 * tolerance. TF32 and mixed precision change only convolutions, linear
 * layers and attention's GEMMs; the flash kernel and every other op stay
 * fp32 and are judged as strict. */
static const double op_tols[OC_N][2][SELFTEST_NMODES] = {
    [OC_CONV] = {{2e-6, 2e-3, 2e-2, 3e-3}, {1.5e-5, 2e-3, 1e-1, 2e-2}},
    [OC_LINEAR] = {{3e-6, 3e-3, 2e-2, 3e-3}, {3e-5, 1e-2, 1e-1, 1e-2}},
    [OC_ATTN] = {{1e-4, 5e-3, 4e-2, 3e-3}, {2e-5, 4e-3, 2e-2, 4e-3}},
    [OC_NORM] = {{8e-6, 8e-6, 8e-6, 8e-6}, {5e-5, 5e-5, 5e-5, 5e-5}},
    [OC_ELEM] = {{1e-6, 1e-6, 1e-6, 1e-6}, {3e-5, 3e-5, 3e-5, 3e-5}},
    [OC_TEMB] = {{5e-4, 5e-4, 5e-4, 5e-4}, {3e-4, 3e-4, 3e-4, 3e-4}},
    [OC_OPTIM] = {{1e-6, 1e-6, 1e-6, 1e-6}, {5e-5, 5e-5, 5e-5, 5e-5}},
};

/* The tolerance of a tensor of role (OUT or GRAD) of class cls in mode. */
static double tol_of(int cls, int role, int mode)
{
    return op_tols[cls][role == GRAD][mode];
}

/* The worst tensor_error among a case's tensors of one role (OUT or GRAD);
 * *which: that tensor's index (-1 when the case has none). */
static double worst_of(const op_case *oc, int role, float *const *a, float *const *b, int *which)
{
    double worst = 0;
    *which = -1;
    for (int i = 0; i < oc->nb; i++) {
        if (oc->b[i].role != role) continue;
        double e = tensor_error(a[i], b[i], oc->b[i].n);
        if (*which < 0 || !(e <= worst)) {
            worst = e;
            *which = i;
        }
    }
    return worst;
}

/* 1 when every output and gradient tensor of a case is within its
 * tolerance in mode. */
static int case_passes(const op_case *oc, float *const *a, float *const *b, int mode)
{
    int wf, wg;
    return worst_of(oc, OUT, a, b, &wf) <= tol_of(oc->cls, OUT, mode) &&
           worst_of(oc, GRAD, a, b, &wg) <= tol_of(oc->cls, GRAD, mode);
}

/* The check of the check (--mutate, the CPU against itself): each output
 * of a passing case zeroed, and each gradient put back to its starting
 * values (as if backward had not added into it), one at a time, judged
 * with every mode's tolerance for the case's class; each must fail.
 * Returns how many did not (or -1 when out of memory); prints the count. */
static int mutations_missed(const op_case *oc, float *const *init, float **a, float *const *b)
{
    int tried = 0, missed = 0;
    for (int i = 0; i < oc->nb; i++) {
        if (oc->b[i].role != OUT && oc->b[i].role != GRAD) continue;
        size_t bytes = oc->b[i].n * sizeof(float);
        float *keep = malloc(bytes);
        if (!keep) return -1;
        memcpy(keep, a[i], bytes);
        if (oc->b[i].role == OUT) memset(a[i], 0, bytes);
        else memcpy(a[i], init[i], bytes);
        for (int m = 0; m < SELFTEST_NMODES; m++) {
            tried++;
            if (case_passes(oc, a, b, m)) {
                missed++;
                printf("  %s %s passed under the %s tolerance %.1e\n", oc->b[i].name,
                       oc->b[i].role == OUT ? "zeroed" : "without its gradient", selftest_mode_name(m),
                       tol_of(oc->cls, oc->b[i].role, m));
            }
        }
        memcpy(a[i], keep, bytes);
        free(keep);
    }
    printf("  %d of %d mutations caught (every output zeroed, every gradient dropped; strict, tf32, bf16, fp16)\n",
           tried - missed, tried);
    return missed;
}

/* Every case on dev against the CPU (ref), or those whose name starts with
 * `only` (when not NULL), each printed with `tag` after its name, judged
 * with mode's tolerances; mutate: also check that broken results would
 * fail (mutations_missed). Returns the number of failures (or -1 on a
 * device error). */
static int check_ops(const target *dev, const target *ref, int mode, const char *only, const char *tag, int mutate)
{
    /* automatic storage: the sizes below are not C constant expressions */
    const op_case cases[] = {
        CONV_CASE("conv2d 3x3 pad 1", conv_same, conv_same_fwd, conv_same_bwd),
        CONV_CASE("conv2d 3x3 s2 pad 0,1,0,1", conv_down, conv_down_fwd, conv_down_bwd),
        CONV_CASE("conv2d 1x1", conv_1x1, conv_1x1_fwd, conv_1x1_bwd),
        NORM_CASE("group_norm", SZ(gn_small.n) * SZ(gn_small.c) * SZ(gn_small.hw), gn_small.c,
                  SZ(gn_small.n) * SZ(gn_small.groups), gn_small_fwd, gn_small_bwd),
        NORM_CASE("group_norm 64k/group", SZ(gn_chunked.n) * SZ(gn_chunked.c) * SZ(gn_chunked.hw), gn_chunked.c,
                  SZ(gn_chunked.n) * SZ(gn_chunked.groups), gn_chunked_fwd, gn_chunked_bwd),
        NORM_CASE("layer_norm", SZ(ln_shape.m) * SZ(ln_shape.c), ln_shape.c, ln_shape.m, ln_fwd, ln_bwd),
        {"linear",
         8,
         {{"x", SZ(lin_bias.m) * SZ(lin_bias.k), IN, -1, 1},
          {"w", SZ(lin_bias.n) * SZ(lin_bias.k), IN, -0.3f, 0.3f},
          {"b", SZ(lin_bias.n), IN, -1, 1},
          {"y", SZ(lin_bias.m) * SZ(lin_bias.n), OUT, 0, 0},
          {"dx", SZ(lin_bias.m) * SZ(lin_bias.k), GRAD, -1, 1},
          {"dw", SZ(lin_bias.n) * SZ(lin_bias.k), GRAD, -1, 1},
          {"db", SZ(lin_bias.n), GRAD, -1, 1},
          {"dy", SZ(lin_bias.m) * SZ(lin_bias.n), IN, -1, 1}},
         lin_bias_fwd,
         lin_bias_bwd,
         OC_LINEAR},
        {"linear no bias",
         6,
         {{"x", SZ(lin_nobias.m) * SZ(lin_nobias.k), IN, -1, 1},
          {"w", SZ(lin_nobias.n) * SZ(lin_nobias.k), IN, -0.3f, 0.3f},
          {"y", SZ(lin_nobias.m) * SZ(lin_nobias.n), OUT, 0, 0},
          {"dx", SZ(lin_nobias.m) * SZ(lin_nobias.k), GRAD, -1, 1},
          {"dw", SZ(lin_nobias.n) * SZ(lin_nobias.k), GRAD, -1, 1},
          {"dy", SZ(lin_nobias.m) * SZ(lin_nobias.n), IN, -1, 1}},
         lin_nobias_fwd,
         lin_nobias_bwd,
         OC_LINEAR},
        ATTN_CASE("attention cross", at_cross, at_cross_fwd, at_cross_bwd),
        ATTN_CASE("attention causal", at_causal, at_causal_fwd, at_causal_bwd),
        ATTN_CASE("attention causal T=150", at_causal_long, at_causal_long_fwd, at_causal_long_bwd),
        ATTN_CASE("attention cross 300x77", at_cross_long, at_cross_long_fwd, at_cross_long_bwd),
        ATTN_CASE("attention d=512 (VAE)", at_vae, at_vae_fwd, at_vae_bwd),
        ATTN_CASE("attention d=512 T=300 b=2", at_vae_odd, at_vae_odd_fwd, at_vae_odd_bwd),
        ATTN_CASE("attention T=1024 d=8", at_narrow, at_narrow_fwd, at_narrow_bwd),
        UNARY_CASE("silu", ELEM_N, ELEM_N, -8, 8, silu_f, silu_b),
        UNARY_CASE("gelu", ELEM_N, ELEM_N, -8, 8, gelu_f, gelu_b),
        UNARY_CASE("quick_gelu", ELEM_N, ELEM_N, -8, 8, qgelu_f, qgelu_b),
        UNARY_CASE("gauss_std", ELEM_N, ELEM_N, -40, 30, gstd_f, gstd_b),
        UNARY_CASE("scale", ELEM_N, ELEM_N, -2, 2, scale_f, scale_b),
        UNARY_CASE("geglu", SZ(GEGLU_M) * 2 * GEGLU_N, SZ(GEGLU_M) * GEGLU_N, -4, 4, geglu_f, geglu_b),
        UNARY_CASE("upsample2x", SZ(UP_P) * UP_H * UP_W, SZ(UP_P) * 4 * UP_H * UP_W, -1, 1, up_f, up_b),
        UNARY_CASE("transpose", SZ(TR_N) * TR_R * TR_C, SZ(TR_N) * TR_R * TR_C, -1, 1, tr_f, tr_b),
        /* t up to 999: CUDA's expf may differ from glibc's by 2 ulp in a frequency, which moves
         * t * freq by up to 1.2e-4 rad (measured: 6.1e-5 both ways, OC_TEMB) */
        {"timestep_emb",
         4,
         {{"t", SZ(temb_shape.n), IN, 0, 999},
          {"y", SZ(temb_shape.n) * SZ(temb_shape.dim), OUT, 0, 0},
          {"dt", SZ(temb_shape.n), GRAD, -1, 1},
          {"dy", SZ(temb_shape.n) * SZ(temb_shape.dim), IN, -1, 1}},
         temb_f,
         temb_b,
         OC_TEMB},
        BINARY_CASE("add", ELEM_N, ELEM_N, ELEM_N, add_f, add_b),
        BINARY_CASE("mul", ELEM_N, ELEM_N, ELEM_N, mul_f, mul_b),
        BINARY_CASE("concat", SZ(cat_shape.n) * SZ(cat_shape.c1) * SZ(cat_shape.hw),
                    SZ(cat_shape.n) * SZ(cat_shape.c2) * SZ(cat_shape.hw),
                    SZ(cat_shape.n) * SZ(cat_shape.c1 + cat_shape.c2) * SZ(cat_shape.hw), cat_f, cat_b),
        {"add_bcast_channel",
         6,
         {{"x", SZ(BC_N) * BC_C * BC_HW, IN, -1, 1},
          {"b", SZ(BC_N) * BC_C, IN, -1, 1},
          {"y", SZ(BC_N) * BC_C * BC_HW, OUT, 0, 0},
          {"dx", SZ(BC_N) * BC_C * BC_HW, GRAD, -1, 1},
          {"db", SZ(BC_N) * BC_C, GRAD, -1, 1},
          {"dy", SZ(BC_N) * BC_C * BC_HW, IN, -1, 1}},
         bc_f,
         bc_b,
         OC_ELEM},
        {"sum_squares + adamw / ema",
         6,
         {{"p", ELEM_N, GRAD, -1, 1},
          {"m", ELEM_N, GRAD, -0.1f, 0.1f},
          {"v", ELEM_N, GRAD, 0, 0.01f},
          {"g", ELEM_N, IN, -1, 1},
          {"mean_sq", 1, OUT, 0, 0},
          {"ema", ELEM_N, GRAD, -1, 1}},
         opt_f,
         opt_b,
         OC_OPTIM},
        {"embedding",
         7,
         {{"ids", SZ(emb_shape.n) * SZ(emb_shape.t), IDS, 0, (float)emb_shape.vocab},
          {"tok", SZ(emb_shape.vocab) * SZ(emb_shape.dim), IN, -1, 1},
          {"pos", SZ(emb_shape.npos) * SZ(emb_shape.dim), IN, -1, 1},
          {"y", SZ(emb_shape.n) * SZ(emb_shape.t) * SZ(emb_shape.dim), OUT, 0, 0},
          {"dtok", SZ(emb_shape.vocab) * SZ(emb_shape.dim), GRAD, -1, 1},
          {"dpos", SZ(emb_shape.npos) * SZ(emb_shape.dim), GRAD, -1, 1},
          {"dy", SZ(emb_shape.n) * SZ(emb_shape.t) * SZ(emb_shape.dim), IN, -1, 1}},
         emb_f,
         emb_b,
         OC_ELEM},
        /* added after the H100 runs (never run on a GPU), at the end so that
         * the cases above keep their seeds, and so their measured errors */
        NORM_CASE("group_norm 1x1, 4 groups of 4", SZ(gn_1x1.n) * SZ(gn_1x1.c), gn_1x1.c,
                  SZ(gn_1x1.n) * SZ(gn_1x1.groups), gn_1x1_fwd, gn_1x1_bwd),
        {"group_norm, no gamma/beta",
         6,
         {{"x", SZ(gn_small.n) * SZ(gn_small.c) * SZ(gn_small.hw), IN, -2, 3},
          {"y", SZ(gn_small.n) * SZ(gn_small.c) * SZ(gn_small.hw), OUT, 0, 0},
          {"mean", SZ(gn_small.n) * SZ(gn_small.groups), OUT, 0, 0},
          {"rstd", SZ(gn_small.n) * SZ(gn_small.groups), OUT, 0, 0},
          {"dx", SZ(gn_small.n) * SZ(gn_small.c) * SZ(gn_small.hw), GRAD, -1, 1},
          {"dy", SZ(gn_small.n) * SZ(gn_small.c) * SZ(gn_small.hw), IN, -1, 1}},
         gn_plain_fwd,
         gn_plain_bwd,
         OC_NORM},
        {"conv2d 3x3 pad 1, no dx",
         7,
         {{"x", SZ(conv_same.n) * SZ(conv_same.cin) * SZ(conv_same.h) * SZ(conv_same.w), IN, -1, 1},
          {"w", SZ(conv_same.cout) * SZ(conv_same.cin) * 9, IN, -0.3f, 0.3f},
          {"b", SZ(conv_same.cout), IN, -1, 1},
          {"y", SZ(conv_same.n) * SZ(conv_same.cout) * SZ(conv_same.h) * SZ(conv_same.w), OUT, 0, 0},
          {"dw", SZ(conv_same.cout) * SZ(conv_same.cin) * 9, GRAD, -1, 1},
          {"db", SZ(conv_same.cout), GRAD, -1, 1},
          {"dy", SZ(conv_same.n) * SZ(conv_same.cout) * SZ(conv_same.h) * SZ(conv_same.w), IN, -1, 1}},
         conv_same_fwd,
         conv_nodx_bwd,
         OC_CONV},
        {"conv2d s2 pad 0,1,0,1, no bias",
         6,
         {{"x", SZ(conv_down.n) * SZ(conv_down.cin) * SZ(conv_down.h) * SZ(conv_down.w), IN, -1, 1},
          {"w", SZ(conv_down.cout) * SZ(conv_down.cin) * 9, IN, -0.3f, 0.3f},
          {"y", conv_y_count(&conv_down), OUT, 0, 0},
          {"dx", SZ(conv_down.n) * SZ(conv_down.cin) * SZ(conv_down.h) * SZ(conv_down.w), GRAD, -1, 1},
          {"dw", SZ(conv_down.cout) * SZ(conv_down.cin) * 9, GRAD, -1, 1},
          {"dy", conv_y_count(&conv_down), IN, -1, 1}},
         conv_nob_fwd,
         conv_nob_bwd,
         OC_CONV},
        {"linear, no dx",
         7,
         {{"x", SZ(lin_bias.m) * SZ(lin_bias.k), IN, -1, 1},
          {"w", SZ(lin_bias.n) * SZ(lin_bias.k), IN, -0.3f, 0.3f},
          {"b", SZ(lin_bias.n), IN, -1, 1},
          {"y", SZ(lin_bias.m) * SZ(lin_bias.n), OUT, 0, 0},
          {"dw", SZ(lin_bias.n) * SZ(lin_bias.k), GRAD, -1, 1},
          {"db", SZ(lin_bias.n), GRAD, -1, 1},
          {"dy", SZ(lin_bias.m) * SZ(lin_bias.n), IN, -1, 1}},
         lin_bias_fwd,
         lin_nodx_bwd,
         OC_LINEAR},
        {"embedding, no positions",
         5,
         {{"ids", SZ(emb_nopos.n) * SZ(emb_nopos.t), IDS, 0, (float)emb_nopos.vocab},
          {"tok", SZ(emb_nopos.vocab) * SZ(emb_nopos.dim), IN, -1, 1},
          {"y", SZ(emb_nopos.n) * SZ(emb_nopos.t) * SZ(emb_nopos.dim), OUT, 0, 0},
          {"dtok", SZ(emb_nopos.vocab) * SZ(emb_nopos.dim), GRAD, -1, 1},
          {"dy", SZ(emb_nopos.n) * SZ(emb_nopos.t) * SZ(emb_nopos.dim), IN, -1, 1}},
         emb_np_f,
         emb_np_b,
         OC_ELEM},
        {"attention cross, dv only",
         7,
         {{"q", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tq) * SZ(at_cross.d), IN, -1, 1},
          {"k", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tk) * SZ(at_cross.d), IN, -1, 1},
          {"v", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tk) * SZ(at_cross.d), IN, -1, 1},
          {"y", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tq) * SZ(at_cross.d), OUT, 0, 0},
          {"lse", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tq), OUT, 0, 0},
          {"dv", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tk) * SZ(at_cross.d), GRAD, -1, 1},
          {"dy", SZ(at_cross.b) * SZ(at_cross.heads) * SZ(at_cross.tq) * SZ(at_cross.d), IN, -1, 1}},
         at_cross_fwd,
         at_dv_bwd,
         OC_ATTN},
        ATTN_CASE("attention d=576 (smem opt-in)", at_wide, at_wide_fwd, at_wide_bwd),
    };
    int failures = 0;
    if (!only)
        printf("%-34s %-30s %-30s %s\n", "op", "forward: worst tensor / tol", "backward: worst tensor / tol",
               "result");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const op_case *oc = &cases[ci];
        if (only && strncmp(oc->name, only, strlen(only)) != 0) continue;
        float *init[MAXB] = {0}, *a[MAXB] = {0}, *b[MAXB] = {0};
        int ok = 1;
        for (int i = 0; i < oc->nb; i++) {
            size_t n = oc->b[i].n;
            init[i] = malloc(n * sizeof(float));
            a[i] = malloc(n * sizeof(float));
            b[i] = malloc(n * sizeof(float));
            if (!init[i] || !a[i] || !b[i]) ok = 0;
            else if (oc->b[i].role == IDS) fill_ids(init[i], n, ci * 100 + (size_t)i, (int)oc->b[i].hi);
            else if (oc->b[i].role != OUT) fill(init[i], n, ci * 100 + (size_t)i, oc->b[i].lo, oc->b[i].hi);
        }
        sd_error err = {0};
        if (!ok) {
            fprintf(stderr, "sd-selftest: out of host memory\n");
            failures = -1;
        } else if (run_case(oc, ref, init, 1e30f, b, &err) || run_case(oc, dev, init, -1e30f, a, &err)) {
            fprintf(stderr, "sd-selftest: %s: %s\n", oc->name, err.msg);
            failures = -1;
        } else {
            int wf, wg;
            double ef = worst_of(oc, OUT, a, b, &wf), eg = worst_of(oc, GRAD, a, b, &wg);
            double tf = tol_of(oc->cls, OUT, mode), tg = tol_of(oc->cls, GRAD, mode);
            int pass = ef <= tf && eg <= tg;
            char label[96];
            snprintf(label, sizeof label, "%s%s", oc->name, tag);
            printf("%-34s %9.2e %-7s / %-10.1e %9.2e %-7s / %-10.1e %s\n", label, ef, wf < 0 ? "" : oc->b[wf].name,
                   tf, eg, wg < 0 ? "" : oc->b[wg].name, tg, pass ? "pass" : "FAIL");
            failures += !pass;
            if (pass && mutate) {
                int missed = mutations_missed(oc, init, a, b);
                failures = missed < 0 ? -1 : failures + (missed > 0);
            }
        }
        for (int i = 0; i < oc->nb; i++) {
            free(init[i]);
            free(a[i]);
            free(b[i]);
        }
        if (failures < 0) return -1;
    }
    return failures;
}

/* The golden VAE's tolerance per mode: its mean and std against
 * diffusers', each normwise (tensor_error). Measured on the H100, the
 * largest absolute error over both (largest |value|: mean 2.42, std
 * 1.96): strict 2.0e-6 (runs 11, 14, 23, 25), TF32 7.3e-5 (runs 11, 14,
 * 25), bf16 3.2e-2 (runs 19, 20, 23), fp16 3.5e-3 (runs 17, 22), so at
 * most 1.0e-6, 3.7e-5, 1.6e-2, 1.8e-3 normwise; the tolerances are 6 to
 * 10 times that. The CPU itself is within 8e-7 of diffusers. */
static const double vae_tols[SELFTEST_NMODES] = {1e-5, 3e-4, 1e-1, 1.5e-2};

/* The golden VAE (diffusers folder + expected.safetensors from
 * tests/golden/make_vae_golden.py) encoded on t, judged with mode's
 * tolerance; 1 pass, 0 fail, -1 error. Also compared with the CPU. */
static int check_vae(const target *t, const char *dir, int mode)
{
    char path[4096];
    sd_error err = {0};
    sd_vae v;
    snprintf(path, sizeof path, "%s/vae", dir);
    if (sd_vae_load(&v, path, NULL, &err)) {
        fprintf(stderr, "sd-selftest: golden VAE: %s\n", err.msg);
        return -1;
    }
    sd_safetensors *st = NULL;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    const sd_st_tensor *x = NULL, *em = NULL, *es = NULL;
    if (sd_st_open(&st, path, &err) == SD_OK) {
        x = sd_st_find(st, "x");
        em = sd_st_find(st, "mean");
        es = sd_st_find(st, "std");
    }
    if (!x || !em || !es || x->ndim != 4 || em->nbytes != es->nbytes) {
        fprintf(stderr, "sd-selftest: %s: %s\n", path, st ? "no x/mean/std tensors" : err.msg);
        if (st) sd_st_close(st);
        sd_vae_free(&v);
        return -1;
    }
    int n = (int)x->shape[0], h = (int)x->shape[2], w = (int)x->shape[3];
    size_t nl = em->nbytes / sizeof(float), ws = sd_vae_workspace_floats(&v, n, h, w);
    float *m = malloc(nl * sizeof(float)), *s = malloc(nl * sizeof(float));
    float *cm = malloc(nl * sizeof(float)), *cs = malloc(nl * sizeof(float)), *cws = malloc(ws * sizeof(float));
    int rc = -1;
    sd_vae_runner r = {0};
    if (!m || !s || !cm || !cs || !cws) {
        fprintf(stderr, "sd-selftest: golden VAE: out of memory\n");
    } else {
        /* the runner: what a tool uses to encode host images on a backend */
        double t0 = sd_now();
        sd_status r1 = sd_vae_runner_init(&r, &v, t->be, t->ex, &err);
        if (!r1) r1 = sd_vae_runner_encode(&r, &v, n, h, w, x->data, m, s, &err);
        double dt = sd_now() - t0;
        sd_status r2 = r1 ? r1 : sd_vae_encode(&v, sd_backend_cpu(), NULL, n, h, w, x->data, cm, cs, cws, &err);
        if (r1 || r2) {
            fprintf(stderr, "sd-selftest: golden VAE encode: %s\n", err.msg);
        } else {
            double gm = tensor_error(m, em->data, nl), gs = tensor_error(s, es->data, nl);
            double cpu = fmax(tensor_error(m, cm, nl), tensor_error(s, cs, nl)), e = fmax(gm, gs);
            rc = e <= vae_tols[mode];
            printf("golden VAE (%s, %dx3x%dx%d, %.3f s): normwise error vs diffusers mean %.2e, std %.2e (tol %.0e), "
                   "vs CPU %.2e  %s\n",
                   dir, n, h, w, dt, gm, gs, vae_tols[mode], cpu, rc ? "pass" : "FAIL");
        }
    }
    sd_vae_runner_free(&r);
    free(m);
    free(s);
    free(cm);
    free(cs);
    free(cws);
    sd_st_close(st);
    sd_vae_free(&v);
    return rc;
}

/* One AdamW step with bf16 moments on t from the host arrays (p, m and v
 * updated in place); 0 on success. */
static int adamw16_on(const target *t, size_t n, float *p, uint16_t *m, uint16_t *v, const float *g,
                      const sd_adamw_args *a, sd_error *err)
{
    float *dp = t->be->alloc(t->ex, n * sizeof(float)), *dg = t->be->alloc(t->ex, n * sizeof(float));
    uint16_t *dm = t->be->alloc(t->ex, n * sizeof(uint16_t)), *dv = t->be->alloc(t->ex, n * sizeof(uint16_t));
    int rc = -1;
    if (dp && dg && dm && dv) {
        t->be->h2d(t->ex, dp, p, n * sizeof(float));
        t->be->h2d(t->ex, dg, g, n * sizeof(float));
        t->be->h2d(t->ex, dm, m, n * sizeof(uint16_t));
        t->be->h2d(t->ex, dv, v, n * sizeof(uint16_t));
        t->be->adamw_bf16(t->ex, a, n, 7, dp, dm, dv, dg); /* from global index 7 */
        t->be->d2h(t->ex, p, dp, n * sizeof(float));
        t->be->d2h(t->ex, m, dm, n * sizeof(uint16_t));
        t->be->d2h(t->ex, v, dv, n * sizeof(uint16_t));
        rc = t->be->sync(t->ex, err) ? -1 : 0;
    } else {
        sd_err_set(err, SD_ENOMEM, "adamw (bf16 moments): out of memory");
    }
    void *bufs[4] = {dp, dg, dm, dv};
    for (int i = 0; i < 4; i++)
        if (bufs[i]) t->be->release(t->ex, bufs[i]);
    return rc;
}

/* AdamW with bf16 moments, bit for bit: the stochastic rounding takes its
 * random bits from (key, global index) on both backends, so the stored
 * moments must be the same bf16 values. Only where a moment's fp32
 * arithmetic differs in its last bit (the GPU contracts a multiply-add the
 * CPU build does not) may it round the other way, by exactly one bf16
 * step, about once in 65536 elements: allowed up to 1 in 2048. The
 * weights (from the fp32 moments) within the optimizer's tolerance
 * (op_tols; the update is fp32 in every mode). Failures (0 or 1), or -1 on
 * an error. */
static int check_adamw_bf16(const target *dev, const target *ref, int mode)
{
    enum { N = 100003 };
    const sd_adamw_args a = {.decay = 0.9999f, .b1 = 0.9f, .b2 = 0.999f, .step_size = 1e-3f, .bc2_sqrt = 0.0447f,
                             .eps = 1e-8f, .gscale = 0.7f, .sr_key = 0x5eedu};
    float *p[2], *g = malloc(N * sizeof(float)), *tmp = malloc(N * sizeof(float));
    uint16_t *m[2], *v[2];
    int ok = g && tmp;
    for (int k = 0; k < 2; k++) {
        p[k] = malloc(N * sizeof(float));
        m[k] = malloc(N * sizeof(uint16_t));
        v[k] = malloc(N * sizeof(uint16_t));
        ok = ok && p[k] && m[k] && v[k];
    }
    int rc = -1;
    sd_error err = {0};
    if (ok) {
        fill(g, N, 501, -1, 1);
        fill(p[0], N, 502, -1, 1);
        memcpy(p[1], p[0], N * sizeof(float));
        fill(tmp, N, 503, -0.1f, 0.1f);
        sd_dtype_store(m[0], tmp, N, SD_DT_BF16);
        fill(tmp, N, 504, 0, 0.01f);
        sd_dtype_store(v[0], tmp, N, SD_DT_BF16);
        memcpy(m[1], m[0], N * sizeof(uint16_t));
        memcpy(v[1], v[0], N * sizeof(uint16_t));
        if (adamw16_on(dev, N, p[0], m[0], v[0], g, &a, &err) || adamw16_on(ref, N, p[1], m[1], v[1], g, &a, &err)) {
            fprintf(stderr, "sd-selftest: %s\n", err.msg);
        } else {
            size_t differ = 0, far = 0;
            for (size_t i = 0; i < N; i++) {
                for (int k = 0; k < 2; k++) {
                    uint16_t x = k ? v[0][i] : m[0][i], y = k ? v[1][i] : m[1][i];
                    differ += x != y;
                    far += x != y && (x ^ y) >> 15 == 0 && (x > y ? x - y : y - x) != 1; /* not one step apart */
                    far += x != y && (x ^ y) >> 15 != 0;                                  /* sign differs */
                }
            }
            double e = tensor_error(p[0], p[1], N);
            int pass = far == 0 && differ <= 2 * N / 2048 && e <= tol_of(OC_OPTIM, GRAD, mode);
            printf("%-34s moments: %zu of %d bf16 values differ (one step each: %s), weights %.2e (tol %.1e)  %s\n",
                   "adamw (bf16 moments)", differ, 2 * N, far ? "NO" : "yes", e, tol_of(OC_OPTIM, GRAD, mode),
                   pass ? "pass" : "FAIL");
            rc = !pass;
        }
    }
    for (int k = 0; k < 2; k++) {
        free(p[k]);
        free(m[k]);
        free(v[k]);
    }
    free(g);
    free(tmp);
    return rc;
}

/* The SD 1.x/2.x/SDXL VAE encoder architecture (they share it). */
static sd_vae_config sd_vae_arch(void)
{
    sd_vae_config c;
    memset(&c, 0, sizeof c);
    c.in_channels = 3;
    c.latent_channels = 4;
    c.nblocks = 4;
    c.block_out[0] = 128;
    c.block_out[1] = 256;
    c.block_out[2] = 512;
    c.block_out[3] = 512;
    c.layers_per_block = 2;
    c.groups = 32;
    c.use_quant_conv = 1;
    c.mid_attention = 1;
    c.eps = 1e-6f;
    c.scaling_factor = 0.18215;
    return c;
}

/* Seconds of the best of `reps` runs of fn after one warm-up, synced. */
typedef void (*probe_fn)(const target *t, float **p);

static double time_best(const target *t, probe_fn fn, float **p, int reps, sd_error *err)
{
    fn(t, p);
    if (t->be->sync(t->ex, err)) return -1;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = sd_now();
        fn(t, p);
        if (t->be->sync(t->ex, err)) return -1;
        double d = sd_now() - t0;
        if (d < best) best = d;
    }
    return best;
}

static const sd_conv2d_shape probe_conv = {.n = 1, .cin = 128, .h = 512, .w = 512, .cout = 128, .kh = 3, .kw = 3,
                                           .stride = 1, .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
static const sd_linear_shape probe_gemm = {.m = 4096, .k = 4096, .n = 4096};
static const sd_attn_shape probe_attn = {.b = 1, .heads = 1, .tq = 4096, .tk = 4096, .d = 512,
                                         .scale = 0.0441941738f};

static void probe_conv_fwd(const target *t, float **p)
{
    t->be->conv2d_fwd(t->ex, &probe_conv, p[1], p[0], p[2], p[3]);
}
static void probe_conv_bwd(const target *t, float **p)
{
    t->be->conv2d_bwd(t->ex, &probe_conv, p[4], p[5], p[6], p[1], p[0], p[2]);
}
static void probe_gemm_fwd(const target *t, float **p)
{
    t->be->linear_fwd(t->ex, &probe_gemm, p[1], p[0], p[2], NULL);
}
static void probe_attn_fwd(const target *t, float **p)
{
    t->be->attn_fwd(t->ex, &probe_attn, p[3], p[4], p[0], p[1], p[2]);
}
static void probe_attn_bwd(const target *t, float **p)
{
    t->be->attn_bwd(t->ex, &probe_attn, p[5], p[6], p[7], p[3], p[0], p[1], p[2], p[3], p[4]);
}

/* Device buffers of the given sizes (floats), random; 0 when one fails. */
static int probe_bufs(const target *t, float **p, const size_t *n, int k)
{
    int ok = 1;
    for (int i = 0; i < k; i++) {
        p[i] = t->be->alloc(t->ex, n[i] * sizeof(float));
        float *h = malloc(n[i] * sizeof(float));
        if (!p[i] || !h) ok = 0;
        else {
            fill(h, n[i], 900 + (uint64_t)i, -0.5f, 0.5f);
            t->be->h2d(t->ex, p[i], h, n[i] * sizeof(float));
        }
        free(h);
    }
    return ok;
}

/* Releases probe buffers. */
static void probe_free(const target *t, float **p, int k)
{
    for (int i = 0; i < k; i++) t->be->release(t->ex, p[i]);
}

/* Throughput of the heaviest VAE layers and a big GEMM (attention also on
 * `flash`, the context that always takes the flash kernel, when not NULL),
 * and VAE encodes of 512x512 images with the SD architecture (random
 * weights): what a cache run will see. 0 on success. */
static int probe(const target *t, const target *flash)
{
    sd_error err = {0};
    float *p[8] = {0};
    double conv_flop = 2.0 * 128 * 128 * 9 * 512 * 512;
    size_t cn[] = {SZ(128) * 512 * 512, SZ(128) * 512 * 512, SZ(128) * 128 * 9, 128, SZ(128) * 512 * 512,
                   SZ(128) * 128 * 9, 128};
    if (probe_bufs(t, p, cn, 7)) {
        double f = time_best(t, probe_conv_fwd, p, 5, &err), b = f < 0 ? -1 : time_best(t, probe_conv_bwd, p, 3, &err);
        if (f < 0 || b < 0) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
        printf("conv2d 3x3 128->128 at 512x512: forward %.2f ms (%.0f GFLOP/s), backward %.2f ms (%.0f GFLOP/s)\n",
               f * 1e3, conv_flop / f * 1e-9, b * 1e3, 2 * conv_flop / b * 1e-9);
    }
    probe_free(t, p, 7);
    size_t gn[] = {SZ(4096) * 4096, SZ(4096) * 4096, SZ(4096) * 4096};
    if (probe_bufs(t, p, gn, 3)) {
        double f = time_best(t, probe_gemm_fwd, p, 5, &err);
        if (f < 0) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
        printf("linear 4096x4096x4096: %.2f ms (%.0f GFLOP/s)\n", f * 1e3, 2.0 * 4096 * 4096 * 4096 / f * 1e-9);
    }
    probe_free(t, p, 3);
    size_t an[] = {SZ(4096) * 512, SZ(4096) * 512, SZ(4096) * 512, SZ(4096) * 512, 4096,
                   SZ(4096) * 512, SZ(4096) * 512, SZ(4096) * 512};
    for (int pass = 0; pass < 2; pass++) {
        const target *at = pass ? flash : t;
        if (!at) break;
        if (probe_bufs(at, p, an, 8)) {
            double flop = 4.0 * 4096 * 4096 * 512;
            double f = time_best(at, probe_attn_fwd, p, 3, &err);
            double b = f < 0 ? -1 : time_best(at, probe_attn_bwd, p, 2, &err);
            if (f < 0 || b < 0) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
            printf("attention T=4096 d=512 (VAE mid block at 512x512), %s: forward %.2f ms (%.0f GFLOP/s), "
                   "backward %.2f ms\n",
                   pass ? "flash kernel" : "default", f * 1e3, flop / f * 1e-9, b * 1e3);
        }
        probe_free(at, p, 8);
    }
    sd_vae v;
    sd_vae_config cfg = sd_vae_arch();
    if (sd_vae_build(&v, &cfg, &err)) return fprintf(stderr, "sd-selftest: probe: %s\n", err.msg), 1;
    fill(v.w.data, v.w.total, 77, -0.02f, 0.02f);
    int lh, lw;
    sd_vae_latent_size(&cfg, 512, 512, &lh, &lw);
    size_t vn[] = {v.w.total, SZ(3) * 512 * 512, SZ(4) * lh * lw, SZ(4) * lh * lw,
                   sd_vae_workspace_floats(&v, 1, 512, 512)};
    int rc = 0;
    if (probe_bufs(t, p, vn, 5)) {
        t->be->h2d(t->ex, p[0], v.w.data, v.w.total * sizeof(float));
        double best = 1e30;
        for (int r = 0; r < 4 && !rc; r++) {
            double t0 = sd_now();
            if (sd_vae_encode_on(&v, t->be, t->ex, p[0], 1, 512, 512, p[1], p[2], p[3], p[4], &err)) rc = 1;
            double d = sd_now() - t0;
            if (r > 0 && d < best) best = d; /* run 0 warms up (algorithm choice, allocations) */
        }
        if (rc) fprintf(stderr, "sd-selftest: probe VAE: %s\n", err.msg);
        else printf("VAE encode 512x512 (SD architecture, fp32): %.1f ms per image, %.1f images/s\n", best * 1e3,
                    1.0 / best);
    }
    probe_free(t, p, 5);
    sd_vae_free(&v);
    return rc;
}

/* --plan: a backend that records every call sd_vae_encode_on makes, with
 * the bytes of the tensors it touches, instead of computing. */
enum { MAX_REC = 256 };
typedef struct {
    char op[96];
    size_t tensors, scratch; /* bytes: inputs + outputs + parameters; device scratch */
    int count;
} rec_row;

static rec_row rec[MAX_REC];
static int nrec;

/* Add a call to the row of the same description (or a new row). */
static void rec_add(const char *op, size_t tensors, size_t scratch)
{
    for (int i = 0; i < nrec; i++)
        if (strcmp(rec[i].op, op) == 0) {
            rec[i].count++;
            return;
        }
    if (nrec == MAX_REC) return;
    snprintf(rec[nrec].op, sizeof rec[nrec].op, "%s", op);
    rec[nrec].tensors = tensors;
    rec[nrec].scratch = scratch;
    rec[nrec].count = 1;
    nrec++;
}

/* conv2d: input, output, weights, bias; scratch is the padded input copy
 * the CUDA backend makes for asymmetric padding (cuDNN's own workspace
 * comes on top, bounded by the context's limit). */
static void rec_conv(void *ex, const sd_conv2d_shape *s, float *y, const float *x, const float *w, const float *b)
{
    (void)ex, (void)y, (void)x, (void)w, (void)b;
    char d[96];
    size_t in = SZ(s->n) * SZ(s->cin) * SZ(s->h) * SZ(s->w);
    size_t out = SZ(s->n) * SZ(s->cout) * SZ(sd_conv2d_out_h(s)) * SZ(sd_conv2d_out_w(s));
    size_t par = SZ(s->cout) * SZ(s->cin) * SZ(s->kh) * SZ(s->kw) + SZ(s->cout);
    int asym = s->pad_t != s->pad_b || s->pad_l != s->pad_r;
    size_t pad = asym ? SZ(s->n) * SZ(s->cin) * SZ(s->h + s->pad_t + s->pad_b) * SZ(s->w + s->pad_l + s->pad_r) : 0;
    snprintf(d, sizeof d, "conv2d %dx%d%s %d->%d at %dx%d", s->kh, s->kw, s->stride > 1 ? " s2" : "", s->cin, s->cout,
             s->h, s->w);
    rec_add(d, (in + out + par) * sizeof(float), pad * sizeof(float));
}

/* group norm: x, y (in place counts once), stats, affine; scratch is the
 * per-chunk partials of the CUDA kernels. */
static void rec_gn(void *ex, const sd_gn_shape *s, float *y, float *mean, float *rstd, const float *x,
                   const float *gamma, const float *beta)
{
    (void)ex, (void)mean, (void)rstd, (void)gamma, (void)beta;
    char d[96];
    size_t units = SZ(s->n) * SZ(s->groups), m = SZ(s->c / s->groups) * SZ(s->hw), el = SZ(s->n) * SZ(s->c) * SZ(s->hw);
    size_t chunks = (m + 8191) / 8192;
    if (chunks > 1024) chunks = 1024;
    snprintf(d, sizeof d, "group_norm %d ch at %d px", s->c, s->hw);
    rec_add(d, ((y == x ? 1 : 2) * el + 2 * units + 2 * SZ(s->c)) * sizeof(float), units * chunks * 3 * sizeof(float));
}

/* silu in place or not. */
static void rec_silu(void *ex, size_t n, float *y, const float *x)
{
    (void)ex;
    char d[96];
    snprintf(d, sizeof d, "silu %zu", n);
    rec_add(d, (y == x ? 1 : 2) * n * sizeof(float), 0);
}

/* residual add: distinct buffers among y, a, b. */
static void rec_add_op(void *ex, size_t n, float *y, const float *a, const float *b)
{
    (void)ex;
    char d[96];
    snprintf(d, sizeof d, "add %zu", n);
    rec_add(d, (1 + (a != y) + (b != y && b != a)) * n * sizeof(float), 0);
}

/* linear: x, y, w, b. */
static void rec_linear(void *ex, const sd_linear_shape *s, float *y, const float *x, const float *w, const float *b)
{
    (void)ex, (void)y, (void)x, (void)w, (void)b;
    char d[96];
    snprintf(d, sizeof d, "linear %dx%d->%d", s->m, s->k, s->n);
    rec_add(d, (SZ(s->m) * SZ(s->k) + SZ(s->m) * SZ(s->n) + SZ(s->n) * SZ(s->k) + SZ(s->n)) * sizeof(float), 0);
}

/* attention: q, k, v, y, lse; the score block in scratch. */
static void rec_attn(void *ex, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                     const float *v)
{
    (void)ex, (void)y, (void)lse, (void)q, (void)k, (void)v;
    char d[96];
    size_t bh = SZ(s->b) * SZ(s->heads);
    snprintf(d, sizeof d, "attention T=%d d=%d", s->tq, s->d);
    /* scratch: one block of scores (attn_blocks.h), the cuBLAS path's */
    rec_add(d, (bh * (2 * SZ(s->tq) + 2 * SZ(s->tk)) * SZ(s->d) + bh * SZ(s->tq)) * sizeof(float),
            sd_attn_block_bytes(s, 0));
}

/* transpose: in and out. */
static void rec_transpose(void *ex, int n, int rows, int cols, float *y, const float *x)
{
    (void)ex, (void)y, (void)x;
    char d[96];
    snprintf(d, sizeof d, "transpose %dx%d", rows, cols);
    rec_add(d, 2 * SZ(n) * SZ(rows) * SZ(cols) * sizeof(float), 0);
}

/* posterior std. */
static void rec_gstd(void *ex, size_t n, float *y, const float *x)
{
    (void)ex;
    char d[96];
    snprintf(d, sizeof d, "gauss_std %zu", n);
    rec_add(d, (y == x ? 1 : 2) * n * sizeof(float), 0);
}

/* device copy of the mean. */
static void rec_d2d(void *ex, void *dst, const void *src, size_t bytes)
{
    (void)ex, (void)dst, (void)src;
    char d[96];
    snprintf(d, sizeof d, "copy %zu bytes", bytes);
    rec_add(d, 2 * bytes, 0);
}

/* Nothing is queued, nothing fails. */
static sd_status rec_sync(void *ex, sd_error *err)
{
    (void)ex, (void)err;
    return SD_OK;
}

static const sd_backend rec_backend = {.name = "plan",
                                       .d2d = rec_d2d,
                                       .sync = rec_sync,
                                       .conv2d_fwd = rec_conv,
                                       .group_norm_fwd = rec_gn,
                                       .linear_fwd = rec_linear,
                                       .silu_fwd = rec_silu,
                                       .add_fwd = rec_add_op,
                                       .attn_fwd = rec_attn,
                                       .transpose_fwd = rec_transpose,
                                       .gauss_std_fwd = rec_gstd};

/* Bytes as MiB. */
static double mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* The memory plan of one resolution: every op of the SD VAE encoder with
 * its tensors, the workspace the engine allocates, and the batch sizes
 * that fit a 24 GB and an 80 GB card. Nothing runs: the recording backend
 * walks sd_vae_encode_on's calls over a reserved, never touched address
 * range. */
static int plan_one(sd_vae *v, int res, size_t conv_ws_cap)
{
    size_t wsf = sd_vae_workspace_floats(v, 1, res, res), wbytes = v->w.total * sizeof(float);
    int lh, lw;
    sd_vae_latent_size(&v->cfg, res, res, &lh, &lw);
    size_t in_img = SZ(3) * res * res * sizeof(float);
    size_t out_img = 2 * SZ(v->cfg.latent_channels) * lh * lw * sizeof(float);
    size_t span = wsf * sizeof(float) + in_img + out_img + 4096;
    char *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return fprintf(stderr, "sd-selftest: cannot reserve %zu bytes of address space\n", span), 1;
    float *ws = (float *)(void *)base, *x = ws + wsf, *mean = x + SZ(3) * res * res;
    float *std = mean + SZ(v->cfg.latent_channels) * lh * lw;
    nrec = 0;
    sd_error err = {0};
    sd_status st = sd_vae_encode_on(v, &rec_backend, NULL, v->w.data, 1, res, res, x, mean, std, ws, &err);
    munmap(base, span);
    if (st) return fprintf(stderr, "sd-selftest: plan: %s\n", err.msg), 1;
    size_t scratch = 0, peak_op = 0;
    printf("\n## %dx%d (latent %dx%d)\n\n", res, res, lh, lw);
    printf("| op (SD VAE encoder, one image) | calls | tensors MiB | CUDA scratch MiB |\n|---|---|---|---|\n");
    for (int i = 0; i < nrec; i++) {
        printf("| %s | %d | %.1f | %.1f |\n", rec[i].op, rec[i].count, mib(rec[i].tensors), mib(rec[i].scratch));
        if (rec[i].scratch > scratch) scratch = rec[i].scratch;
        if (rec[i].tensors > peak_op) peak_op = rec[i].tensors;
    }
    size_t ctx = (size_t)1 << 30; /* CUDA context, cuBLAS and cuDNN handles and kernels: about 1 GiB */
    size_t wsb = wsf * sizeof(float), io = in_img + out_img, fixed = ctx + wbytes + conv_ws_cap;
    printf("\nweights %.1f MiB; engine workspace (sd_vae_workspace_floats) %.1f MiB; largest single op %.1f MiB; "
           "CUDA scratch %.1f MiB + cuDNN workspace <= %.0f MiB; per image in + out %.2f MiB\n",
           mib(wbytes), mib(wsf * sizeof(float)), mib(peak_op), mib(scratch), mib(conv_ws_cap), mib(io));
    printf("device total for one image at a time: %.2f GiB (with ~1 GiB for the CUDA context)\n",
           (double)(fixed + wsb + scratch + io) / (1 << 30));
    const double cards[2] = {24e9, 80e9};
    for (int k = 0; k < 2; k++) {
        /* 5% left for fragmentation of the caching allocator */
        double avail = cards[k] * 0.95 - (double)fixed;
        double one_at_a_time = (avail - (double)(wsb + scratch)) / (double)io;
        double batched = avail / (double)(wsb + scratch + io);
        printf("%2.0f GB card: sd_vae_encode as it is (one image at a time; a batch adds only its input and output "
               "buffers): %.0f images per batch fit; if the encoder ran n images at once (workspace and scratch x "
               "n): n <= %.0f\n",
               cards[k] / 1e9, one_at_a_time > 0 ? floor(one_at_a_time) : 0.0, batched > 0 ? floor(batched) : 0.0);
    }
    return 0;
}

#ifdef SDTK_HAVE_CUDA
/* The fallback when attention's blocks of scores cannot be allocated: a
 * context limited to 4 MiB of device memory runs the narrow attention case
 * (8 MiB of scores), which must match the CPU, must have left the cuBLAS
 * path for the flash kernel, and must have stayed under the limit.
 * Failures, or -1 on an error. */
static int check_capped(int dev, int tf32, int mixed, const target *ref)
{
    sd_cuda *cu = NULL;
    sd_error err = {0};
    sd_cuda_opts o = {.allow_tf32 = tf32, .mixed = mixed, .mem_limit = (size_t)4 << 20};
    if (sd_cuda_create(&cu, dev, &o, &err)) {
        fprintf(stderr, "sd-selftest: %s\n", err.msg);
        return -1;
    }
    target t = {sd_backend_cuda(), cu};
    /* the flash kernel is fp32 FMA in every mode: strict tolerances */
    int f = check_ops(&t, ref, SELFTEST_STRICT, "attention T=1024", " [4 MiB limit]", 0);
    sd_cuda_mem m;
    sd_cuda_get_mem(cu, &m);
    if (f >= 0) {
        int ok = m.attn_fallback && m.peak <= o.mem_limit;
        printf("%-28s flash fallback %s, peak %.2f MiB of %.0f  %s\n", "attention under the limit",
               m.attn_fallback ? "taken" : "NOT taken", mib(m.peak), mib(o.mem_limit), ok ? "pass" : "FAIL");
        f += !ok;
    }
    sd_cuda_destroy(cu);
    return f;
}
#endif

/* --plan for 512^2 and 1024^2. */
static int plan(size_t conv_ws_cap)
{
    sd_vae v;
    sd_error err = {0};
    sd_vae_config cfg = sd_vae_arch();
    if (sd_vae_build(&v, &cfg, &err)) return fprintf(stderr, "sd-selftest: %s\n", err.msg), SD_EXIT_FATAL;
    printf("# sd-selftest --plan: VAE encoder memory from the engine's allocation plan\n");
    int rc = plan_one(&v, 512, conv_ws_cap) || plan_one(&v, 1024, conv_ws_cap);
    sd_vae_free(&v);
    return rc ? SD_EXIT_FATAL : SD_EXIT_OK;
}

int main(int argc, char **argv)
{
    const char *device = "cuda:0", *golden = SDTK_GOLDEN_VAE, *golden_unet = SDTK_GOLDEN_UNET;
    const char *mixed_name = "no";
    int no_probe = 0, tf32 = 0, do_plan = 0, mixed = 0, mutate = 0;
    long threads = 0;
    const sd_opt opts[] = {
        {"device", 'd', SD_OPT_STR, &device, "DEV", "cuda:K (default cuda:0), or cpu to check the harness itself"},
        {"golden", 0, SD_OPT_STR, &golden, "DIR",
         "tiny golden VAE folder (vae/ + expected.safetensors; default: the source tree's tests/golden/vae/sd)"},
        {"golden-unet", 0, SD_OPT_STR, &golden_unet, "DIR",
         "tiny golden UNets (sd1/, sdxl/; default: the source tree's tests/golden/unet)"},
        {"no-probe", 0, SD_OPT_FLAG, &no_probe, NULL, "skip the throughput probe"},
        {"tf32", 0, SD_OPT_FLAG, &tf32, NULL,
         "allow TF32 tensor cores (checked with TF32's tolerances, per op class, docs/GPU.md)"},
        {"mixed-precision", 0, SD_OPT_STR, &mixed_name, "T",
         "no (default), bf16 or fp16: matrix products on 16-bit copies of their inputs (checked with that mode's "
         "tolerances)"},
        {"mutate", 0, SD_OPT_FLAG, &mutate, NULL,
         "with --device cpu, a check of the check: every op case again with each output zeroed and each gradient "
         "dropped, and each tiny UNet with each tensor's gradient zeroed, judged with every mode's tolerances; "
         "fails when one of them would pass"},
        {"threads", 'j', SD_OPT_INT, &threads, "N", "CPU threads for the reference (default: all CPUs)"},
        {"plan", 0, SD_OPT_FLAG, &do_plan, NULL,
         "print the VAE encoder's memory per op at 512x512 and 1024x1024 and batch sizes for 24/80 GB cards, "
         "from the engine's own allocation plan (no GPU needed), and exit"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-selftest", "[OPTIONS]",
                  "Run every engine op (forward and backward) on a device and on the CPU reference with the same "
                  "random inputs and print, per op, the worst normwise error of its output and gradient tensors "
                  "(max |dev - cpu| / max |cpu| of each tensor) against the tolerance of its op class in this "
                  "numerics mode, with pass/fail; encode the tiny golden VAE on the device against diffusers' "
                  "values; one training micro-batch of the tiny golden SD and SDXL UNets through the trainer on the "
                  "device against the CPU (the loss and each parameter tensor's gradient); then a short throughput "
                  "probe (a 512x512 convolution, a 4096^3 GEMM, the VAE's attention, VAE encodes). Exit 0 when "
                  "everything passed, 1 when a check failed, 4 when there is no usable GPU or this build has no "
                  "CUDA backend.",
                  opts,
                  "Examples:\n"
                  "  sd-selftest --device cuda:0\n"
                  "  for k in 0 1 2 3; do sd-selftest --device cuda:$k --no-probe; done\n"
                  "  sd-selftest --plan\n"
                  "  sd-selftest --device cpu --no-probe --mutate\n",
        "0 every check passed, 1 a check failed, 2 usage error, 3 fatal error, 4 no usable GPU."};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) return rc;
    int npos = pos.n;
    sd_strlist_free(&pos);
    int dev = 0;
    if (npos) {
        sd_cli_usage_error(&cli, "no positional arguments expected");
        return SD_EXIT_USAGE;
    }
    if (sd_cli_parse_device(device, &dev)) {
        sd_cli_usage_error(&cli, "--device %s: expected cuda:K or cpu", device);
        return SD_EXIT_USAGE;
    }
    if (sd_cli_parse_mixed(mixed_name, &mixed)) {
        sd_cli_usage_error(&cli, "--mixed-precision %s: expected no, bf16 or fp16", mixed_name);
        return SD_EXIT_USAGE;
    }
    if ((mixed || tf32) && dev < 0) {
        sd_cli_usage_error(&cli, "--tf32 and --mixed-precision are GPU modes: not with --device cpu");
        return SD_EXIT_USAGE;
    }
    if (mutate && dev >= 0) {
        sd_cli_usage_error(&cli, "--mutate checks the harness: only with --device cpu");
        return SD_EXIT_USAGE;
    }
    if (threads < 0 || threads > 1024) {
        sd_cli_usage_error(&cli, "--threads must be 0..1024");
        return SD_EXIT_USAGE;
    }
    if (do_plan) return plan((size_t)1 << 30);
    sd_pool *pool = sd_pool_create(threads > 0 ? (int)threads : sd_default_threads());
    target ref = {sd_backend_cpu(), pool}, t = {sd_backend_cpu(), NULL};
    int mode = selftest_mode(tf32, mixed);
#ifdef SDTK_HAVE_CUDA
    sd_cuda *cu = NULL;
    if (dev >= 0) {
        sd_error err = {0};
        int n = sd_cuda_device_count(&err);
        if (n == 0) {
            printf("sd-selftest: %s; GPU checks skipped\n", err.msg);
            sd_pool_destroy(pool);
            return EXIT_NO_GPU;
        }
        sd_cuda_opts co = {.allow_tf32 = tf32, .mixed = mixed};
        if (sd_cuda_create(&cu, dev, &co, &err)) {
            fprintf(stderr, "sd-selftest: %s\n", err.msg);
            sd_pool_destroy(pool);
            return dev >= n ? SD_EXIT_USAGE : SD_EXIT_FATAL;
        }
        sd_cuda_info info;
        sd_cuda_get_info(cu, &info);
        printf("device cuda:%d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free); driver %d, runtime %d, "
               "cuDNN %d, cuBLAS %d; %s\n",
               dev, info.name, info.cc_major, info.cc_minor, info.sm_count, (double)info.total_bytes / (1 << 30),
               (double)info.free_bytes / (1 << 30), info.driver_version, info.runtime_version, info.cudnn_version,
               info.cublas_version,
               mixed == SD_DT_BF16 ? "mixed bf16" : mixed == SD_DT_F16 ? "mixed fp16" : tf32 ? "TF32" : "strict fp32");
        t = (target){sd_backend_cuda(), cu};
    }
#else
    if (dev >= 0) {
        printf("sd-selftest: this build has no CUDA backend (configure where nvcc, cuBLAS and cuDNN are installed); "
               "GPU checks skipped\n");
        sd_pool_destroy(pool);
        return EXIT_NO_GPU;
    }
#endif
    if (dev < 0) printf("device cpu: the CPU backend on one thread against the pool (a check of the harness)\n");
    int fails = check_ops(&t, &ref, mode, NULL, "", mutate);
    target flash = {0};
#ifdef SDTK_HAVE_CUDA
    /* attention goes through cuBLAS in blocks of scores: checked again with
     * blocks of 12600 scores (heads in groups of 4 and 2 for "cross"; the
     * others split into query rows, with the causal mask and with tq !=
     * tk), and on the flash kernel, the fallback when blocks do not fit */
    sd_cuda *cu_small = NULL, *cu_flash = NULL;
    if (cu && fails >= 0) {
        sd_error err = {0};
        sd_cuda_opts so = {.allow_tf32 = tf32, .mixed = mixed, .attn_block = 12600},
                     fo = {.allow_tf32 = tf32, .mixed = mixed, .attn_flash = 1};
        if (sd_cuda_create(&cu_small, dev, &so, &err) || sd_cuda_create(&cu_flash, dev, &fo, &err)) {
            fprintf(stderr, "sd-selftest: %s\n", err.msg);
            fails = -1;
        } else {
            target small = {sd_backend_cuda(), cu_small};
            flash = (target){sd_backend_cuda(), cu_flash};
            int f = check_ops(&small, &ref, mode, "attention", " [blocks]", 0);
            /* the flash kernel is fp32 FMA in every mode: strict tolerances */
            int g = f < 0 ? -1 : check_ops(&flash, &ref, SELFTEST_STRICT, "attention", " [flash]", 0);
            fails = f < 0 || g < 0 ? -1 : fails + f + g;
        }
    }
    if (cu && fails >= 0) {
        int f = check_capped(dev, tf32, mixed, &ref);
        fails = f < 0 ? -1 : fails + f;
    }
#endif
    if (fails >= 0) {
        int f = check_adamw_bf16(&t, &ref, mode);
        fails = f < 0 ? -1 : fails + f;
    }
    int vae = fails < 0 ? -1 : check_vae(&t, golden, mode);
    int unet = 1;
    const char *unets[] = {"sd1", "sdxl"};
    for (int i = 0; i < 2 && vae >= 0 && unet >= 0; i++) {
        int r = selftest_unet(golden_unet, unets[i], dev, tf32, mixed, mutate);
        unet = r < 0 ? -1 : unet && r;
    }
    int probe_rc = 0;
    if (fails >= 0 && vae >= 0 && unet >= 0 && !no_probe && dev >= 0) probe_rc = probe(&t, flash.be ? &flash : NULL);
#ifdef SDTK_HAVE_CUDA
    if (cu) {
        sd_cuda_mem m;
        sd_cuda_get_mem(cu, &m);
        printf("device memory: peak %.1f MiB handed out by the caching allocator, %.1f MiB cached at the end\n",
               mib(m.peak), mib(m.cached + m.in_use));
        sd_cuda_destroy(cu);
    }
    if (cu_small) sd_cuda_destroy(cu_small);
    if (cu_flash) sd_cuda_destroy(cu_flash);
#endif
    sd_pool_destroy(pool);
    if (fails < 0 || vae < 0 || unet < 0 || probe_rc) {
        printf("sd-selftest: stopped by an error (above)\n");
        return SD_EXIT_FATAL;
    }
    printf("sd-selftest: %d op case%s failed, golden VAE %s, tiny UNets %s\n", fails, fails == 1 ? "" : "s",
           vae ? "passed" : "FAILED", unet ? "passed" : "FAILED");
    return fails || !vae || !unet ? 1 : SD_EXIT_OK;
}
