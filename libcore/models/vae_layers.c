/* The layers the VAE encoder and decoder share (diffusers ResnetBlock2D
 * without a time embedding, the mid block's single-head attention, group
 * norm + SiLU, "same"-padded convs), over the backend table. */
#include <math.h>

#include "vae_int.h"

/* y = silu(group_norm(x)), y may be x. */
void sd_vae_norm_silu(const sd_vae_fwd *f, const sd_vae_norm *nm, int c, int hw, float *y, const float *x)
{
    sd_gn_shape s = {.n = f->n, .c = c, .hw = hw, .groups = f->cfg->groups, .eps = f->cfg->eps};
    f->be->group_norm_fwd(f->pool, &s, y, f->mean, f->rstd, x, f->p + nm->g, f->p + nm->b);
    f->be->silu_fwd(f->pool, (size_t)f->n * (size_t)c * (size_t)hw, y, y);
}

/* y = conv(x) with torch's symmetric "same" padding (k / 2 per side). */
void sd_vae_conv_fwd(const sd_vae_fwd *f, const sd_vae_conv *cv, int h, int w, float *y, const float *x)
{
    int p = cv->k / 2;
    sd_conv2d_shape s = {.n = f->n, .cin = cv->cin, .h = h, .w = w, .cout = cv->cout, .kh = cv->k, .kw = cv->k,
                         .stride = 1, .pad_t = p, .pad_b = p, .pad_l = p, .pad_r = p};
    f->be->conv2d_fwd(f->pool, &s, y, x, f->p + cv->w, f->p + cv->b);
}

/* ResnetBlock2D (no time embedding, output scale 1): the input in *a is
 * replaced by shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))). */
void sd_vae_resnet_fwd(const sd_vae_fwd *f, const sd_vae_resnet *r, int h, int w, float *a, float *b, float *c)
{
    int hw = h * w;
    sd_vae_norm_silu(f, &r->n1, r->cin, hw, b, a);
    sd_vae_conv_fwd(f, &r->c1, h, w, c, b);
    sd_vae_norm_silu(f, &r->n2, r->cout, hw, c, c);
    sd_vae_conv_fwd(f, &r->c2, h, w, b, c);
    if (r->has_sc) {
        sd_vae_conv_fwd(f, &r->sc, h, w, c, a);
        f->be->add_fwd(f->pool, (size_t)f->n * (size_t)r->cout * (size_t)hw, a, c, b);
    } else {
        f->be->add_fwd(f->pool, (size_t)f->n * (size_t)r->cout * (size_t)hw, a, a, b);
    }
}

/* The mid block's single-head self-attention over all hw positions, with
 * its residual: a += to_out(attn(q, k, v)) of group_norm(a). */
void sd_vae_attn_fwd(const sd_vae_fwd *f, const sd_vae_attn *at, int hw, float *a, float *b, float *c, float *q, float *k,
                      float *v, float *lse)
{
    int C = at->c;
    sd_gn_shape gs = {.n = f->n, .c = C, .hw = hw, .groups = f->cfg->groups, .eps = f->cfg->eps};
    f->be->group_norm_fwd(f->pool, &gs, b, f->mean, f->rstd, a, f->p + at->n.g, f->p + at->n.b);
    f->be->transpose_fwd(f->pool, f->n, C, hw, c, b); /* c: [n, hw, C] */
    sd_linear_shape ls = {.m = f->n * hw, .k = C, .n = C};
    f->be->linear_fwd(f->pool, &ls, q, c, f->p + at->wq, f->p + at->bq);
    f->be->linear_fwd(f->pool, &ls, k, c, f->p + at->wk, f->p + at->bk);
    f->be->linear_fwd(f->pool, &ls, v, c, f->p + at->wv, f->p + at->bv);
    sd_attn_shape as = {.b = f->n, .heads = 1, .tq = hw, .tk = hw, .d = C, .causal = 0,
                        .scale = (float)(1.0 / sqrt((double)C))};
    f->be->attn_fwd(f->pool, &as, b, lse, q, k, v);
    f->be->linear_fwd(f->pool, &ls, c, b, f->p + at->wo, f->p + at->bo);
    f->be->transpose_fwd(f->pool, f->n, hw, C, b, c); /* b: [n, C, hw] */
    f->be->add_fwd(f->pool, (size_t)f->n * (size_t)C * (size_t)hw, a, a, b);
}
