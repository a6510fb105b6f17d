/* sd-selftest: the convolution cases' shapes and their forward and backward
 * calls on a target (3x3 with symmetric and asymmetric padding, 1x1, without
 * dx, without bias). The cases themselves are listed in selftest_ops.c. */
#include "selftest.h"

/* Shapes of the convolution cases: small, but past every tile and chunk edge. */
const sd_conv2d_shape selftest_conv_same = {.n = 2, .cin = 5, .h = 17, .w = 19, .cout = 7, .kh = 3, .kw = 3,
                                            .stride = 1, .pad_t = 1, .pad_b = 1, .pad_l = 1, .pad_r = 1};
const sd_conv2d_shape selftest_conv_down = {.n = 2, .cin = 6, .h = 16, .w = 15, .cout = 5, .kh = 3, .kw = 3,
                                            .stride = 2, .pad_t = 0, .pad_b = 1, .pad_l = 0, .pad_r = 1};
const sd_conv2d_shape selftest_conv_1x1 = {.n = 1, .cin = 16, .h = 9, .w = 11, .cout = 24, .kh = 1, .kw = 1,
                                           .stride = 1};

/* conv2d: x w b | y | dx dw db | dy. */
static void conv_fwd(const target *t, const sd_conv2d_shape *s, float **p)
{
    t->be->conv2d_fwd(t->ex, s, p[3], p[0], p[1], p[2]);
}
static void conv_bwd(const target *t, const sd_conv2d_shape *s, float **p)
{
    t->be->conv2d_bwd(t->ex, s, p[4], p[5], p[6], p[7], p[0], p[1]);
}
/* The entry points selftest_ops.c's table names: each convolution shape forward and backward. */
void selftest_conv_same_fwd(const target *t, float **p) { conv_fwd(t, &selftest_conv_same, p); }
void selftest_conv_same_bwd(const target *t, float **p) { conv_bwd(t, &selftest_conv_same, p); }
void selftest_conv_down_fwd(const target *t, float **p) { conv_fwd(t, &selftest_conv_down, p); }
void selftest_conv_down_bwd(const target *t, float **p) { conv_bwd(t, &selftest_conv_down, p); }
void selftest_conv_1x1_fwd(const target *t, float **p) { conv_fwd(t, &selftest_conv_1x1, p); }
void selftest_conv_1x1_bwd(const target *t, float **p) { conv_bwd(t, &selftest_conv_1x1, p); }

/* conv2d without dx (a model's first layer): x w b | y | dw db | dy. */
void selftest_conv_nodx_bwd(const target *t, float **p)
{
    t->be->conv2d_bwd(t->ex, &selftest_conv_same, NULL, p[4], p[5], p[6], p[0], p[1]);
}

/* conv2d without bias, asymmetric padding: x w | y | dx dw | dy. */
void selftest_conv_nob_fwd(const target *t, float **p)
{
    t->be->conv2d_fwd(t->ex, &selftest_conv_down, p[2], p[0], p[1], NULL);
}
void selftest_conv_nob_bwd(const target *t, float **p)
{
    t->be->conv2d_bwd(t->ex, &selftest_conv_down, p[3], p[4], NULL, p[5], p[0], p[1]);
}
