/* The benchmarks' timing wrapper around a backend table (prof_backend.h). */
#include "prof_backend.h"

#include "progress.h"

const char *const class_name[C_N] = {"conv", "attention", "linear", "norm", "elementwise"};
double tsum[C_N];
static sd_backend real, prof;

/* A device op has finished when its time is read. */
static void sync_now(void *exec)
{
    real.sync(exec, NULL);
}

#define W(cls, name, P, A)                \
    static void w_##name P                \
    {                                     \
        double t0 = sd_now();             \
        real.name A;                      \
        if (real.is_device) sync_now(e);  \
        tsum[cls] += sd_now() - t0;       \
    }
#define FP float *
#define CF const float *
W(C_CONV, conv2d_fwd, (void *e, const sd_conv2d_shape *s, FP a, CF b, CF c, CF d), (e, s, a, b, c, d))
W(C_CONV, conv2d_bwd, (void *e, const sd_conv2d_shape *s, FP a, FP b, FP c, CF d, CF f, CF g), (e, s, a, b, c, d, f, g))
W(C_NORM, group_norm_fwd, (void *e, const sd_gn_shape *s, FP a, FP b, FP c, CF d, CF f, CF g), (e, s, a, b, c, d, f, g))
W(C_NORM, group_norm_bwd, (void *e, const sd_gn_shape *s, FP a, FP b, FP c, CF d, CF f, CF g, CF h, CF i),
  (e, s, a, b, c, d, f, g, h, i))
W(C_LINEAR, linear_fwd, (void *e, const sd_linear_shape *s, FP a, CF b, CF c, CF d), (e, s, a, b, c, d))
W(C_LINEAR, linear_act_fwd, (void *e, const sd_linear_shape *s, sd_act act, int t, FP a, CF b, const void *c, CF d),
  (e, s, act, t, a, b, c, d))
W(C_LINEAR, linear_bwd, (void *e, const sd_linear_shape *s, FP a, FP b, FP c, CF d, CF f, CF g),
  (e, s, a, b, c, d, f, g))
W(C_ELEM, silu_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, silu_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, add_fwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, add_bwd, (void *e, size_t n, FP a, FP b, CF c), (e, n, a, b, c))
W(C_ELEM, upsample2x_fwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ELEM, upsample2x_bwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ATTN, attn_fwd, (void *e, const sd_attn_shape *s, FP a, FP b, CF c, CF d, CF f), (e, s, a, b, c, d, f))
W(C_ATTN, attn_rows_fwd, (void *e, const sd_attn_shape *s, int ld, FP a, FP b, CF c, CF d, CF f),
  (e, s, ld, a, b, c, d, f))
W(C_ATTN, attn_bwd, (void *e, const sd_attn_shape *s, FP a, FP b, FP c, CF d, CF f, CF g, CF h, CF i, CF j),
  (e, s, a, b, c, d, f, g, h, i, j))
W(C_NORM, layer_norm_fwd, (void *e, const sd_ln_shape *s, FP a, FP b, FP c, CF d, CF f, CF g), (e, s, a, b, c, d, f, g))
W(C_NORM, layer_norm_bwd, (void *e, const sd_ln_shape *s, FP a, FP b, FP c, CF d, CF f, CF g, CF h, CF i),
  (e, s, a, b, c, d, f, g, h, i))
W(C_ELEM, gelu_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, gelu_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, quick_gelu_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, quick_gelu_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, geglu_fwd, (void *e, size_t n, size_t m, FP a, CF b), (e, n, m, a, b))
W(C_ELEM, geglu_bwd, (void *e, size_t n, size_t m, FP a, CF b, CF c), (e, n, m, a, b, c))
W(C_ELEM, scale_fwd, (void *e, size_t n, FP a, CF b, float x), (e, n, a, b, x))
W(C_ELEM, scale_bwd, (void *e, size_t n, FP a, CF b, float x), (e, n, a, b, x))
W(C_ELEM, mul_fwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_ELEM, mul_bwd, (void *e, size_t n, FP a, FP b, CF c, CF d, CF f), (e, n, a, b, c, d, f))
W(C_ELEM, concat_fwd, (void *e, const sd_concat_shape *s, FP a, CF b, CF c), (e, s, a, b, c))
W(C_ELEM, concat_bwd, (void *e, const sd_concat_shape *s, FP a, FP b, CF c), (e, s, a, b, c))
W(C_ELEM, add_bcast_channel_fwd, (void *e, int x, int y, int z, FP a, CF b, CF c), (e, x, y, z, a, b, c))
W(C_ELEM, add_bcast_channel_bwd, (void *e, int x, int y, int z, FP a, FP b, CF c), (e, x, y, z, a, b, c))
W(C_ELEM, timestep_emb_fwd, (void *e, const sd_temb_shape *s, FP a, CF b), (e, s, a, b))
W(C_ELEM, timestep_emb_bwd, (void *e, const sd_temb_shape *s, FP a, CF b, CF c), (e, s, a, b, c))
W(C_ELEM, transpose_fwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ELEM, transpose_bwd, (void *e, int x, int y, int z, FP a, CF b), (e, x, y, z, a, b))
W(C_ELEM, gauss_std_fwd, (void *e, size_t n, FP a, CF b), (e, n, a, b))
W(C_ELEM, gauss_std_bwd, (void *e, size_t n, FP a, CF b, CF c), (e, n, a, b, c))
W(C_CONV, conv2d_fwd_st, (void *e, const sd_conv2d_shape *s, int a, void *b, int c, const void *d, CF f, CF g),
  (e, s, a, b, c, d, f, g))
W(C_NORM, group_norm_fwd_st,
  (void *e, const sd_gn_shape *s, int a, int b, void *c, FP d, FP f, int g, const void *h, CF i, CF j),
  (e, s, a, b, c, d, f, g, h, i, j))
W(C_ELEM, add_fwd_st, (void *e, size_t n, int a, void *b, const void *c, const void *d), (e, n, a, b, c, d))
W(C_ELEM, convert_st, (void *e, size_t n, int a, void *b, int c, const void *d), (e, n, a, b, c, d))
W(C_ELEM, embedding_fwd, (void *e, const sd_embedding_shape *s, FP a, const int32_t *b, CF c, CF d), (e, s, a, b, c, d))
W(C_ELEM, embedding_bwd, (void *e, const sd_embedding_shape *s, FP a, FP b, CF c, const int32_t *d), (e, s, a, b, c, d))

/* A backend's table with every op it has replaced by its timed wrapper
 * (on a device each op is waited for, so the classes add up to the step). */
const sd_backend *prof_backend(const sd_backend *be)
{
    real = *be;
    prof = real;
#define P(name) \
    if (real.name) prof.name = w_##name
    P(conv2d_fwd); P(conv2d_bwd); P(group_norm_fwd); P(group_norm_bwd); P(linear_fwd); P(linear_act_fwd); P(linear_bwd);
    P(silu_fwd); P(silu_bwd); P(add_fwd); P(add_bwd); P(upsample2x_fwd); P(upsample2x_bwd); P(attn_fwd);
    P(attn_rows_fwd); P(attn_bwd); P(layer_norm_fwd); P(layer_norm_bwd); P(gelu_fwd); P(gelu_bwd); P(quick_gelu_fwd);
    P(quick_gelu_bwd); P(geglu_fwd); P(geglu_bwd); P(scale_fwd); P(scale_bwd); P(mul_fwd); P(mul_bwd);
    P(concat_fwd); P(concat_bwd); P(add_bcast_channel_fwd); P(add_bcast_channel_bwd); P(timestep_emb_fwd);
    P(timestep_emb_bwd); P(transpose_fwd); P(transpose_bwd); P(gauss_std_fwd); P(gauss_std_bwd);
    P(embedding_fwd); P(embedding_bwd); P(conv2d_fwd_st); P(group_norm_fwd_st); P(add_fwd_st); P(convert_st);
#undef P
    return &prof;
}

