/* sd-selftest: the element-wise, shape, timestep-embedding, broadcast and
 * token-embedding cases' forward and backward calls on a target (and the
 * shapes of those that have one). The cases are listed in selftest_ops.c. */
#include <stddef.h>
#include <stdint.h>

#include "selftest.h"

/* Shapes of the cases with a shape struct: small, but past every chunk edge. */
const sd_concat_shape selftest_cat_shape = {.n = 2, .c1 = 3, .c2 = 5, .hw = 37};
const sd_temb_shape selftest_temb_shape = {.n = 6, .dim = 321, .flip_sin_to_cos = 1, .freq_shift = 0.0f, .scale = 1.0f,
                                           .max_period = 10000.0f};
const sd_embedding_shape selftest_emb_shape = {.n = 3, .t = 77, .dim = 64, .vocab = 500, .npos = 77};
const sd_embedding_shape selftest_emb_nopos = {.n = 2, .t = 40, .dim = 48, .vocab = 300, .npos = 0};

/* Activations: x | y | dx | dy. */
void selftest_silu_f(const target *t, float **p) { t->be->silu_fwd(t->ex, ELEM_N, p[1], p[0]); }
void selftest_silu_b(const target *t, float **p) { t->be->silu_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
void selftest_gelu_f(const target *t, float **p) { t->be->gelu_fwd(t->ex, ELEM_N, p[1], p[0]); }
void selftest_gelu_b(const target *t, float **p) { t->be->gelu_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
void selftest_qgelu_f(const target *t, float **p) { t->be->quick_gelu_fwd(t->ex, ELEM_N, p[1], p[0]); }
void selftest_qgelu_b(const target *t, float **p) { t->be->quick_gelu_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
void selftest_gstd_f(const target *t, float **p) { t->be->gauss_std_fwd(t->ex, ELEM_N, p[1], p[0]); }
void selftest_gstd_b(const target *t, float **p) { t->be->gauss_std_bwd(t->ex, ELEM_N, p[2], p[3], p[0]); }
void selftest_scale_f(const target *t, float **p) { t->be->scale_fwd(t->ex, ELEM_N, p[1], p[0], -0.37f); }
void selftest_scale_b(const target *t, float **p) { t->be->scale_bwd(t->ex, ELEM_N, p[2], p[3], -0.37f); }

/* Binary: a b | y | da db | dy. */
void selftest_add_f(const target *t, float **p) { t->be->add_fwd(t->ex, ELEM_N, p[2], p[0], p[1]); }
void selftest_add_b(const target *t, float **p) { t->be->add_bwd(t->ex, ELEM_N, p[3], p[4], p[5]); }
void selftest_mul_f(const target *t, float **p) { t->be->mul_fwd(t->ex, ELEM_N, p[2], p[0], p[1]); }
void selftest_mul_b(const target *t, float **p) { t->be->mul_bwd(t->ex, ELEM_N, p[3], p[4], p[5], p[0], p[1]); }
void selftest_cat_f(const target *t, float **p) { t->be->concat_fwd(t->ex, &selftest_cat_shape, p[2], p[0], p[1]); }
void selftest_cat_b(const target *t, float **p) { t->be->concat_bwd(t->ex, &selftest_cat_shape, p[3], p[4], p[5]); }

/* Shape ops with one input: x | y | dx | dy. */
void selftest_geglu_f(const target *t, float **p) { t->be->geglu_fwd(t->ex, GEGLU_M, GEGLU_N, p[1], p[0]); }
void selftest_geglu_b(const target *t, float **p) { t->be->geglu_bwd(t->ex, GEGLU_M, GEGLU_N, p[2], p[3], p[0]); }
void selftest_up_f(const target *t, float **p) { t->be->upsample2x_fwd(t->ex, UP_P, UP_H, UP_W, p[1], p[0]); }
void selftest_up_b(const target *t, float **p) { t->be->upsample2x_bwd(t->ex, UP_P, UP_H, UP_W, p[2], p[3]); }
void selftest_tr_f(const target *t, float **p) { t->be->transpose_fwd(t->ex, TR_N, TR_R, TR_C, p[1], p[0]); }
void selftest_tr_b(const target *t, float **p) { t->be->transpose_bwd(t->ex, TR_N, TR_R, TR_C, p[2], p[3]); }
void selftest_temb_f(const target *t, float **p) { t->be->timestep_emb_fwd(t->ex, &selftest_temb_shape, p[1], p[0]); }
void selftest_temb_b(const target *t, float **p)
{
    t->be->timestep_emb_bwd(t->ex, &selftest_temb_shape, p[2], p[3], p[0]);
}

/* Broadcast add: x b | y | dx db | dy. */
void selftest_bc_f(const target *t, float **p)
{
    t->be->add_bcast_channel_fwd(t->ex, BC_N, BC_C, BC_HW, p[2], p[0], p[1]);
}
void selftest_bc_b(const target *t, float **p)
{
    t->be->add_bcast_channel_bwd(t->ex, BC_N, BC_C, BC_HW, p[3], p[4], p[5]);
}

/* Embedding: ids tok pos | y | dtok dpos | dy. */
void selftest_emb_f(const target *t, float **p)
{
    t->be->embedding_fwd(t->ex, &selftest_emb_shape, p[3], (const int32_t *)(void *)p[0], p[1], p[2]);
}
void selftest_emb_b(const target *t, float **p)
{
    t->be->embedding_bwd(t->ex, &selftest_emb_shape, p[4], p[5], p[6], (const int32_t *)(void *)p[0]);
}

/* Embedding without positions (npos 0): ids tok | y | dtok | dy. */
void selftest_emb_np_f(const target *t, float **p)
{
    t->be->embedding_fwd(t->ex, &selftest_emb_nopos, p[2], (const int32_t *)(void *)p[0], p[1], NULL);
}
void selftest_emb_np_b(const target *t, float **p)
{
    t->be->embedding_bwd(t->ex, &selftest_emb_nopos, p[3], NULL, p[4], (const int32_t *)(void *)p[0]);
}
