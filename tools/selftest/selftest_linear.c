/* sd-selftest: the linear layer cases' shapes and their forward and backward
 * calls on a target (with and without bias, without dx). The cases are
 * listed in selftest_ops.c. */
#include <stddef.h>

#include "selftest.h"

/* Shapes of the linear cases: small, but past every tile edge. */
const sd_linear_shape selftest_lin_bias = {.m = 77, .k = 96, .n = 130};
const sd_linear_shape selftest_lin_nobias = {.m = 300, .k = 64, .n = 64};

/* linear: x w b | y | dx dw db | dy (b and db absent without bias). */
void selftest_lin_bias_fwd(const target *t, float **p)
{
    t->be->linear_fwd(t->ex, &selftest_lin_bias, p[3], p[0], p[1], p[2]);
}
void selftest_lin_bias_bwd(const target *t, float **p)
{
    t->be->linear_bwd(t->ex, &selftest_lin_bias, p[4], p[5], p[6], p[7], p[0], p[1]);
}
void selftest_lin_nobias_fwd(const target *t, float **p)
{
    t->be->linear_fwd(t->ex, &selftest_lin_nobias, p[2], p[0], p[1], NULL);
}
void selftest_lin_nobias_bwd(const target *t, float **p)
{
    t->be->linear_bwd(t->ex, &selftest_lin_nobias, p[3], p[4], NULL, p[5], p[0], p[1]);
}
/* linear without dx: x w b | y | dw db | dy. */
void selftest_lin_nodx_bwd(const target *t, float **p)
{
    t->be->linear_bwd(t->ex, &selftest_lin_bias, NULL, p[4], p[5], p[6], p[0], p[1]);
}
