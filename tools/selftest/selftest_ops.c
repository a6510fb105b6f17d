/* sd-selftest: every op case in one table (the order fixes each case's
 * input seeds, so its measured errors), run on a device and on the CPU
 * reference, judged and printed; and, with CUDA, the attention cases again
 * in a context limited to 4 MiB of device memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "selftest.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

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

/* Every case on dev against the CPU (ref), or those whose name starts with
 * `only` (when not NULL), each printed with `tag` after its name, judged
 * with mode's tolerances; mutate: also check that broken results would
 * fail (selftest_mutations_missed). Returns the number of failures (or -1 on a
 * device error). */
int selftest_check_ops(const target *dev, const target *ref, int mode, const char *only, const char *tag, int mutate)
{
    /* automatic storage: the sizes below are not C constant expressions */
    const op_case cases[] = {
        CONV_CASE("conv2d 3x3 pad 1", selftest_conv_same, selftest_conv_same_fwd, selftest_conv_same_bwd),
        CONV_CASE("conv2d 3x3 s2 pad 0,1,0,1", selftest_conv_down, selftest_conv_down_fwd, selftest_conv_down_bwd),
        CONV_CASE("conv2d 1x1", selftest_conv_1x1, selftest_conv_1x1_fwd, selftest_conv_1x1_bwd),
        NORM_CASE("group_norm", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.c) * SZ(selftest_gn_small.hw),
                  selftest_gn_small.c, SZ(selftest_gn_small.n) * SZ(selftest_gn_small.groups), selftest_gn_small_fwd,
                  selftest_gn_small_bwd),
        NORM_CASE("group_norm 64k/group",
                  SZ(selftest_gn_chunked.n) * SZ(selftest_gn_chunked.c) * SZ(selftest_gn_chunked.hw),
                  selftest_gn_chunked.c, SZ(selftest_gn_chunked.n) * SZ(selftest_gn_chunked.groups),
                  selftest_gn_chunked_fwd, selftest_gn_chunked_bwd),
        NORM_CASE("layer_norm", SZ(selftest_ln_shape.m) * SZ(selftest_ln_shape.c), selftest_ln_shape.c,
                  selftest_ln_shape.m, selftest_ln_fwd, selftest_ln_bwd),
        {"linear",
         8,
         {{"x", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.k), IN, -1, 1},
          {"w", SZ(selftest_lin_bias.n) * SZ(selftest_lin_bias.k), IN, -0.3f, 0.3f},
          {"b", SZ(selftest_lin_bias.n), IN, -1, 1},
          {"y", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.n), OUT, 0, 0},
          {"dx", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.k), GRAD, -1, 1},
          {"dw", SZ(selftest_lin_bias.n) * SZ(selftest_lin_bias.k), GRAD, -1, 1},
          {"db", SZ(selftest_lin_bias.n), GRAD, -1, 1},
          {"dy", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.n), IN, -1, 1}},
         selftest_lin_bias_fwd,
         selftest_lin_bias_bwd,
         OC_LINEAR},
        {"linear no bias",
         6,
         {{"x", SZ(selftest_lin_nobias.m) * SZ(selftest_lin_nobias.k), IN, -1, 1},
          {"w", SZ(selftest_lin_nobias.n) * SZ(selftest_lin_nobias.k), IN, -0.3f, 0.3f},
          {"y", SZ(selftest_lin_nobias.m) * SZ(selftest_lin_nobias.n), OUT, 0, 0},
          {"dx", SZ(selftest_lin_nobias.m) * SZ(selftest_lin_nobias.k), GRAD, -1, 1},
          {"dw", SZ(selftest_lin_nobias.n) * SZ(selftest_lin_nobias.k), GRAD, -1, 1},
          {"dy", SZ(selftest_lin_nobias.m) * SZ(selftest_lin_nobias.n), IN, -1, 1}},
         selftest_lin_nobias_fwd,
         selftest_lin_nobias_bwd,
         OC_LINEAR},
        ATTN_CASE("attention cross", selftest_at_cross, selftest_at_cross_fwd, selftest_at_cross_bwd),
        ATTN_CASE("attention causal", selftest_at_causal, selftest_at_causal_fwd, selftest_at_causal_bwd),
        ATTN_CASE("attention causal T=150", selftest_at_causal_long, selftest_at_causal_long_fwd,
                  selftest_at_causal_long_bwd),
        ATTN_CASE("attention cross 300x77", selftest_at_cross_long, selftest_at_cross_long_fwd,
                  selftest_at_cross_long_bwd),
        ATTN_CASE("attention cross 256x227", selftest_at_cross_227, selftest_at_cross_227_fwd,
                  selftest_at_cross_227_bwd),
        ATTN_CASE("attention d=512 (VAE)", selftest_at_vae, selftest_at_vae_fwd, selftest_at_vae_bwd),
        ATTN_CASE("attention d=512 T=300 b=2", selftest_at_vae_odd, selftest_at_vae_odd_fwd, selftest_at_vae_odd_bwd),
        ATTN_CASE("attention T=1024 d=8", selftest_at_narrow, selftest_at_narrow_fwd, selftest_at_narrow_bwd),
        UNARY_CASE("silu", ELEM_N, ELEM_N, -8, 8, selftest_silu_f, selftest_silu_b),
        UNARY_CASE("gelu", ELEM_N, ELEM_N, -8, 8, selftest_gelu_f, selftest_gelu_b),
        UNARY_CASE("quick_gelu", ELEM_N, ELEM_N, -8, 8, selftest_qgelu_f, selftest_qgelu_b),
        UNARY_CASE("gauss_std", ELEM_N, ELEM_N, -40, 30, selftest_gstd_f, selftest_gstd_b),
        UNARY_CASE("scale", ELEM_N, ELEM_N, -2, 2, selftest_scale_f, selftest_scale_b),
        UNARY_CASE("geglu", SZ(GEGLU_M) * 2 * GEGLU_N, SZ(GEGLU_M) * GEGLU_N, -4, 4, selftest_geglu_f,
                   selftest_geglu_b),
        UNARY_CASE("upsample2x", SZ(UP_P) * UP_H * UP_W, SZ(UP_P) * 4 * UP_H * UP_W, -1, 1, selftest_up_f,
                   selftest_up_b),
        UNARY_CASE("transpose", SZ(TR_N) * TR_R * TR_C, SZ(TR_N) * TR_R * TR_C, -1, 1, selftest_tr_f, selftest_tr_b),
        /* t up to 999: CUDA's expf may differ from glibc's by 2 ulp in a frequency, which moves
         * t * freq by up to 1.2e-4 rad (measured: 6.1e-5 both ways, OC_TEMB) */
        {"timestep_emb",
         4,
         {{"t", SZ(selftest_temb_shape.n), IN, 0, 999},
          {"y", SZ(selftest_temb_shape.n) * SZ(selftest_temb_shape.dim), OUT, 0, 0},
          {"dt", SZ(selftest_temb_shape.n), GRAD, -1, 1},
          {"dy", SZ(selftest_temb_shape.n) * SZ(selftest_temb_shape.dim), IN, -1, 1}},
         selftest_temb_f,
         selftest_temb_b,
         OC_TEMB},
        BINARY_CASE("add", ELEM_N, ELEM_N, ELEM_N, selftest_add_f, selftest_add_b),
        BINARY_CASE("mul", ELEM_N, ELEM_N, ELEM_N, selftest_mul_f, selftest_mul_b),
        BINARY_CASE("concat", SZ(selftest_cat_shape.n) * SZ(selftest_cat_shape.c1) * SZ(selftest_cat_shape.hw),
                    SZ(selftest_cat_shape.n) * SZ(selftest_cat_shape.c2) * SZ(selftest_cat_shape.hw),
                    SZ(selftest_cat_shape.n) * SZ(selftest_cat_shape.c1 + selftest_cat_shape.c2) *
                        SZ(selftest_cat_shape.hw),
                    selftest_cat_f, selftest_cat_b),
        {"add_bcast_channel",
         6,
         {{"x", SZ(BC_N) * BC_C * BC_HW, IN, -1, 1},
          {"b", SZ(BC_N) * BC_C, IN, -1, 1},
          {"y", SZ(BC_N) * BC_C * BC_HW, OUT, 0, 0},
          {"dx", SZ(BC_N) * BC_C * BC_HW, GRAD, -1, 1},
          {"db", SZ(BC_N) * BC_C, GRAD, -1, 1},
          {"dy", SZ(BC_N) * BC_C * BC_HW, IN, -1, 1}},
         selftest_bc_f,
         selftest_bc_b,
         OC_ELEM},
        {"sum_squares + adamw / ema",
         6,
         {{"p", ELEM_N, GRAD, -1, 1},
          {"m", ELEM_N, GRAD, -0.1f, 0.1f},
          {"v", ELEM_N, GRAD, 0, 0.01f},
          {"g", ELEM_N, IN, -1, 1},
          {"mean_sq", 1, OUT, 0, 0},
          {"ema", ELEM_N, GRAD, -1, 1}},
         selftest_opt_f,
         selftest_opt_b,
         OC_OPTIM},
        {"embedding",
         7,
         {{"ids", SZ(selftest_emb_shape.n) * SZ(selftest_emb_shape.t), IDS, 0, (float)selftest_emb_shape.vocab},
          {"tok", SZ(selftest_emb_shape.vocab) * SZ(selftest_emb_shape.dim), IN, -1, 1},
          {"pos", SZ(selftest_emb_shape.npos) * SZ(selftest_emb_shape.dim), IN, -1, 1},
          {"y", SZ(selftest_emb_shape.n) * SZ(selftest_emb_shape.t) * SZ(selftest_emb_shape.dim), OUT, 0, 0},
          {"dtok", SZ(selftest_emb_shape.vocab) * SZ(selftest_emb_shape.dim), GRAD, -1, 1},
          {"dpos", SZ(selftest_emb_shape.npos) * SZ(selftest_emb_shape.dim), GRAD, -1, 1},
          {"dy", SZ(selftest_emb_shape.n) * SZ(selftest_emb_shape.t) * SZ(selftest_emb_shape.dim), IN, -1, 1}},
         selftest_emb_f,
         selftest_emb_b,
         OC_ELEM},
        /* added after the H100 runs (never run on a GPU), at the end so that
         * the cases above keep their seeds, and so their measured errors */
        NORM_CASE("group_norm 1x1, 4 groups of 4", SZ(selftest_gn_1x1.n) * SZ(selftest_gn_1x1.c), selftest_gn_1x1.c,
                  SZ(selftest_gn_1x1.n) * SZ(selftest_gn_1x1.groups), selftest_gn_1x1_fwd, selftest_gn_1x1_bwd),
        {"group_norm, no gamma/beta",
         6,
         {{"x", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.c) * SZ(selftest_gn_small.hw), IN, -2, 3},
          {"y", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.c) * SZ(selftest_gn_small.hw), OUT, 0, 0},
          {"mean", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.groups), OUT, 0, 0},
          {"rstd", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.groups), OUT, 0, 0},
          {"dx", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.c) * SZ(selftest_gn_small.hw), GRAD, -1, 1},
          {"dy", SZ(selftest_gn_small.n) * SZ(selftest_gn_small.c) * SZ(selftest_gn_small.hw), IN, -1, 1}},
         selftest_gn_plain_fwd,
         selftest_gn_plain_bwd,
         OC_NORM},
        {"conv2d 3x3 pad 1, no dx",
         7,
         {{"x",
           SZ(selftest_conv_same.n) * SZ(selftest_conv_same.cin) * SZ(selftest_conv_same.h) * SZ(selftest_conv_same.w),
           IN, -1, 1},
          {"w", SZ(selftest_conv_same.cout) * SZ(selftest_conv_same.cin) * 9, IN, -0.3f, 0.3f},
          {"b", SZ(selftest_conv_same.cout), IN, -1, 1},
          {"y",
           SZ(selftest_conv_same.n) * SZ(selftest_conv_same.cout) * SZ(selftest_conv_same.h) * SZ(selftest_conv_same.w),
           OUT, 0, 0},
          {"dw", SZ(selftest_conv_same.cout) * SZ(selftest_conv_same.cin) * 9, GRAD, -1, 1},
          {"db", SZ(selftest_conv_same.cout), GRAD, -1, 1},
          {"dy",
           SZ(selftest_conv_same.n) * SZ(selftest_conv_same.cout) * SZ(selftest_conv_same.h) * SZ(selftest_conv_same.w),
           IN, -1, 1}},
         selftest_conv_same_fwd,
         selftest_conv_nodx_bwd,
         OC_CONV},
        {"conv2d s2 pad 0,1,0,1, no bias",
         6,
         {{"x",
           SZ(selftest_conv_down.n) * SZ(selftest_conv_down.cin) * SZ(selftest_conv_down.h) * SZ(selftest_conv_down.w),
           IN, -1, 1},
          {"w", SZ(selftest_conv_down.cout) * SZ(selftest_conv_down.cin) * 9, IN, -0.3f, 0.3f},
          {"y", conv_y_count(&selftest_conv_down), OUT, 0, 0},
          {"dx",
           SZ(selftest_conv_down.n) * SZ(selftest_conv_down.cin) * SZ(selftest_conv_down.h) * SZ(selftest_conv_down.w),
           GRAD, -1, 1},
          {"dw", SZ(selftest_conv_down.cout) * SZ(selftest_conv_down.cin) * 9, GRAD, -1, 1},
          {"dy", conv_y_count(&selftest_conv_down), IN, -1, 1}},
         selftest_conv_nob_fwd,
         selftest_conv_nob_bwd,
         OC_CONV},
        {"linear, no dx",
         7,
         {{"x", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.k), IN, -1, 1},
          {"w", SZ(selftest_lin_bias.n) * SZ(selftest_lin_bias.k), IN, -0.3f, 0.3f},
          {"b", SZ(selftest_lin_bias.n), IN, -1, 1},
          {"y", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.n), OUT, 0, 0},
          {"dw", SZ(selftest_lin_bias.n) * SZ(selftest_lin_bias.k), GRAD, -1, 1},
          {"db", SZ(selftest_lin_bias.n), GRAD, -1, 1},
          {"dy", SZ(selftest_lin_bias.m) * SZ(selftest_lin_bias.n), IN, -1, 1}},
         selftest_lin_bias_fwd,
         selftest_lin_nodx_bwd,
         OC_LINEAR},
        {"embedding, no positions",
         5,
         {{"ids", SZ(selftest_emb_nopos.n) * SZ(selftest_emb_nopos.t), IDS, 0, (float)selftest_emb_nopos.vocab},
          {"tok", SZ(selftest_emb_nopos.vocab) * SZ(selftest_emb_nopos.dim), IN, -1, 1},
          {"y", SZ(selftest_emb_nopos.n) * SZ(selftest_emb_nopos.t) * SZ(selftest_emb_nopos.dim), OUT, 0, 0},
          {"dtok", SZ(selftest_emb_nopos.vocab) * SZ(selftest_emb_nopos.dim), GRAD, -1, 1},
          {"dy", SZ(selftest_emb_nopos.n) * SZ(selftest_emb_nopos.t) * SZ(selftest_emb_nopos.dim), IN, -1, 1}},
         selftest_emb_np_f,
         selftest_emb_np_b,
         OC_ELEM},
        {"attention cross, dv only",
         7,
         {{"q",
           SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tq) * SZ(selftest_at_cross.d),
           IN, -1, 1},
          {"k",
           SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tk) * SZ(selftest_at_cross.d),
           IN, -1, 1},
          {"v",
           SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tk) * SZ(selftest_at_cross.d),
           IN, -1, 1},
          {"y",
           SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tq) * SZ(selftest_at_cross.d),
           OUT, 0, 0},
          {"lse", SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tq), OUT, 0, 0},
          {"dv",
           SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tk) * SZ(selftest_at_cross.d),
           GRAD, -1, 1},
          {"dy",
           SZ(selftest_at_cross.b) * SZ(selftest_at_cross.heads) * SZ(selftest_at_cross.tq) * SZ(selftest_at_cross.d),
           IN, -1, 1}},
         selftest_at_cross_fwd,
         selftest_at_dv_bwd,
         OC_ATTN},
        ATTN_CASE("attention d=576 (smem opt-in)", selftest_at_wide, selftest_at_wide_fwd, selftest_at_wide_bwd),
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
            else if (oc->b[i].role == IDS) selftest_fill_ids(init[i], n, ci * 100 + (size_t)i, (int)oc->b[i].hi);
            else if (oc->b[i].role != OUT) selftest_fill(init[i], n, ci * 100 + (size_t)i, oc->b[i].lo, oc->b[i].hi);
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
            double ef = selftest_worst_of(oc, OUT, a, b, &wf), eg = selftest_worst_of(oc, GRAD, a, b, &wg);
            double tf = selftest_tol_of(oc->cls, OUT, mode), tg = selftest_tol_of(oc->cls, GRAD, mode);
            int pass = ef <= tf && eg <= tg;
            char label[96];
            snprintf(label, sizeof label, "%s%s", oc->name, tag);
            printf("%-34s %9.2e %-7s / %-10.1e %9.2e %-7s / %-10.1e %s\n", label, ef, wf < 0 ? "" : oc->b[wf].name,
                   tf, eg, wg < 0 ? "" : oc->b[wg].name, tg, pass ? "pass" : "FAIL");
            failures += !pass;
            if (pass && mutate) {
                int missed = selftest_mutations_missed(oc, init, a, b);
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

#ifdef SDTK_HAVE_CUDA
/* The fallback when attention's blocks of scores cannot be allocated: a
 * context limited to 4 MiB of device memory runs the narrow attention case
 * (8 MiB of scores), which must match the CPU, must have left the cuBLAS
 * path for the flash kernel, and must have stayed under the limit.
 * Failures, or -1 on an error. */
int selftest_check_capped(int dev, int tf32, int mixed, const target *ref)
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
    int f = selftest_check_ops(&t, ref, SELFTEST_STRICT, "attention T=1024", " [4 MiB limit]", 0);
    sd_cuda_mem m;
    sd_cuda_get_mem(cu, &m);
    if (f >= 0) {
        int ok = m.attn_fallback && m.peak <= o.mem_limit;
        printf("%-28s flash fallback %s, peak %.2f MiB of %.0f  %s\n", "attention under the limit",
               m.attn_fallback ? "taken" : "NOT taken", selftest_mib(m.peak), selftest_mib(o.mem_limit),
               ok ? "pass" : "FAIL");
        f += !ok;
    }
    sd_cuda_destroy(cu);
    return f;
}
#endif
