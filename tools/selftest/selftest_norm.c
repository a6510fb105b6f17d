/* sd-selftest: the group norm and layer norm cases' shapes and their forward
 * and backward calls on a target. The cases are listed in selftest_ops.c. */
#include "selftest.h"

/* Shapes of the norm cases: small, but past every tile and chunk edge. */
const sd_gn_shape selftest_gn_small = {.n = 2, .c = 32, .hw = 300, .groups = 8, .eps = 1e-6f};
const sd_gn_shape selftest_gn_chunked = {.n = 1, .c = 64, .hw = 4096, .groups = 4, .eps = 1e-6f};
/* one pixel, several groups: statistics per (image, group), not per image
 * (4 channels a group: with 2, dx is ~0 and a dropped dx would not show) */
const sd_gn_shape selftest_gn_1x1 = {.n = 2, .c = 16, .hw = 1, .groups = 4, .eps = 1e-6f};
const sd_ln_shape selftest_ln_shape = {.m = 77, .c = 96, .eps = 1e-5f};

/* group_norm: x gamma beta | y mean rstd | dx dgamma dbeta | dy. */
static void gn_fwd(const target *t, const sd_gn_shape *s, float **p)
{
    t->be->group_norm_fwd(t->ex, s, p[3], p[4], p[5], p[0], p[1], p[2]);
}
static void gn_bwd(const target *t, const sd_gn_shape *s, float **p)
{
    t->be->group_norm_bwd(t->ex, s, p[6], p[7], p[8], p[9], p[0], p[4], p[5], p[1]);
}
/* The entry points selftest_ops.c's table names: each group norm shape forward and backward. */
void selftest_gn_small_fwd(const target *t, float **p) { gn_fwd(t, &selftest_gn_small, p); }
void selftest_gn_small_bwd(const target *t, float **p) { gn_bwd(t, &selftest_gn_small, p); }
void selftest_gn_chunked_fwd(const target *t, float **p) { gn_fwd(t, &selftest_gn_chunked, p); }
void selftest_gn_chunked_bwd(const target *t, float **p) { gn_bwd(t, &selftest_gn_chunked, p); }
void selftest_gn_1x1_fwd(const target *t, float **p) { gn_fwd(t, &selftest_gn_1x1, p); }
void selftest_gn_1x1_bwd(const target *t, float **p) { gn_bwd(t, &selftest_gn_1x1, p); }

/* group_norm without gamma and beta: x | y mean rstd | dx | dy. */
void selftest_gn_plain_fwd(const target *t, float **p)
{
    t->be->group_norm_fwd(t->ex, &selftest_gn_small, p[1], p[2], p[3], p[0], NULL, NULL);
}
void selftest_gn_plain_bwd(const target *t, float **p)
{
    t->be->group_norm_bwd(t->ex, &selftest_gn_small, p[4], NULL, NULL, p[5], p[0], p[2], p[3], NULL);
}

/* layer_norm: same layout as group_norm. */
void selftest_ln_fwd(const target *t, float **p)
{
    t->be->layer_norm_fwd(t->ex, &selftest_ln_shape, p[3], p[4], p[5], p[0], p[1], p[2]);
}
void selftest_ln_bwd(const target *t, float **p)
{
    t->be->layer_norm_bwd(t->ex, &selftest_ln_shape, p[6], p[7], p[8], p[9], p[0], p[4], p[5], p[1]);
}
