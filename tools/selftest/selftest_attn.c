/* sd-selftest: the attention cases' shapes and their forward and backward
 * calls on a target (cross, causal, longer than a block, the VAE's wide
 * heads, long and narrow for the flash fallback, past the default shared
 * memory, dv only). The cases are listed in selftest_ops.c. */
#include <stddef.h>

#include "selftest.h"

/* Shapes of the attention cases: small, but past every tile and chunk edge. */
const sd_attn_shape selftest_at_cross = {.b = 2, .heads = 3, .tq = 70, .tk = 45, .d = 40, .causal = 0, .scale = 0.158f};
const sd_attn_shape selftest_at_causal = {.b = 1, .heads = 2, .tq = 100, .tk = 100, .d = 64, .causal = 1,
                                          .scale = 0.125f};
/* longer than a [blocks] context's block holds: split into query rows, with the mask / with tq != tk */
const sd_attn_shape selftest_at_causal_long = {.b = 1, .heads = 2, .tq = 150, .tk = 150, .d = 64, .causal = 1,
                                               .scale = 0.125f};
const sd_attn_shape selftest_at_cross_long = {.b = 1, .heads = 2, .tq = 300, .tk = 77, .d = 40, .causal = 0,
                                              .scale = 0.158f};
/* the UNet's cross attention over a 225-token prompt (sd-latents --max-tokens 225: 227 rows) */
const sd_attn_shape selftest_at_cross_227 = {.b = 2, .heads = 2, .tq = 256, .tk = 227, .d = 40, .causal = 0,
                                             .scale = 0.158f};
const sd_attn_shape selftest_at_vae = {.b = 1, .heads = 1, .tq = 256, .tk = 256, .d = 512, .causal = 0,
                                       .scale = 0.0441941738f};
const sd_attn_shape selftest_at_vae_odd = {.b = 2, .heads = 1, .tq = 300, .tk = 300, .d = 512, .causal = 0,
                                           .scale = 0.0441941738f};
/* long and narrow: 8 MiB of scores against 0.6 MiB of tensors, so that a
 * context limited to 4 MiB of device memory must take the flash kernel */
const sd_attn_shape selftest_at_narrow = {.b = 1, .heads = 2, .tq = 1024, .tk = 1024, .d = 8, .causal = 0,
                                          .scale = 0.35f};
/* wide heads: the flash kernel needs (16 d + 3696) floats of shared memory
 * per block, past the default 48 KiB from d = 538 (the opt-in path) */
const sd_attn_shape selftest_at_wide = {.b = 1, .heads = 2, .tq = 40, .tk = 33, .d = 576, .causal = 0,
                                        .scale = 0.0416666667f};

/* attention: q k v | y lse | dq dk dv | dy. */
static void attn_fwd(const target *t, const sd_attn_shape *s, float **p)
{
    t->be->attn_fwd(t->ex, s, p[3], p[4], p[0], p[1], p[2]);
}
static void attn_bwd(const target *t, const sd_attn_shape *s, float **p)
{
    t->be->attn_bwd(t->ex, s, p[5], p[6], p[7], p[8], p[0], p[1], p[2], p[3], p[4]);
}
/* The entry points selftest_ops.c's table names: each attention shape forward and backward. */
void selftest_at_cross_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_cross, p); }
void selftest_at_cross_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_cross, p); }
void selftest_at_causal_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_causal, p); }
void selftest_at_causal_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_causal, p); }
void selftest_at_causal_long_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_causal_long, p); }
void selftest_at_causal_long_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_causal_long, p); }
void selftest_at_cross_long_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_cross_long, p); }
void selftest_at_cross_long_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_cross_long, p); }
void selftest_at_cross_227_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_cross_227, p); }
void selftest_at_cross_227_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_cross_227, p); }
void selftest_at_vae_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_vae, p); }
void selftest_at_vae_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_vae, p); }
void selftest_at_vae_odd_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_vae_odd, p); }
void selftest_at_vae_odd_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_vae_odd, p); }
void selftest_at_narrow_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_narrow, p); }
void selftest_at_narrow_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_narrow, p); }
void selftest_at_wide_fwd(const target *t, float **p) { attn_fwd(t, &selftest_at_wide, p); }
void selftest_at_wide_bwd(const target *t, float **p) { attn_bwd(t, &selftest_at_wide, p); }

/* attention with only dv asked for (no score gradients): q k v | y lse | dv | dy. */
void selftest_at_dv_bwd(const target *t, float **p)
{
    t->be->attn_bwd(t->ex, &selftest_at_cross, NULL, NULL, p[5], p[6], p[0], p[1], p[2], p[3], p[4]);
}
