/* The UNet's layer table and every parameter slot registered under its
 * names in both layouts (diffusers and the original ldm input_blocks /
 * middle_block / output_blocks), with how each slot starts from-scratch
 * training (torch-style random init). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
#include "hash.h"
#include "unet.h"

/* How one slot starts a new training run. */
typedef enum { INIT_UNIFORM, INIT_ONES, INIT_ZEROS } init_kind;

struct sd_unet_init {
    size_t off, n;
    init_kind kind;
    float bound; /* uniform in [-bound, bound) */
};

/* Registration state. */
typedef struct {
    sd_unet *u;
    sd_error *err;
} reg;

/* "prefix.suffix" in a name-sized buffer; a name that does not fit
 * becomes "" (no real UNet name comes near the limit). */
static const char *cat(char *buf, const char *prefix, const char *suffix)
{
    int n = snprintf(buf, SD_WEIGHT_NAME_MAX, "%s.%s", prefix, suffix);
    if (n < 0 || n >= SD_WEIGHT_NAME_MAX) buf[0] = 0;
    return buf;
}

/* Remember how a slot is initialised for from-scratch training. */
static sd_status add_init(reg *r, size_t off, size_t n, init_kind kind, float bound)
{
    sd_unet *u = r->u;
    if (u->ninit == u->initcap) {
        size_t cap = u->initcap ? 2 * u->initcap : 256;
        struct sd_unet_init *p = realloc(u->init, cap * sizeof(*p));
        if (!p) return sd_err_set(r->err, SD_ENOMEM, "out of memory");
        u->init = p;
        u->initcap = cap;
    }
    u->init[u->ninit++] = (struct sd_unet_init){off, n, kind, bound};
    return SD_OK;
}

/* One parameter known as d.suffix (diffusers) and l.suffix (ldm). */
static sd_status add(reg *r, const char *d, const char *l, const char *suffix, int ndim, const int *shape,
                     size_t *off, init_kind kind, float bound)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    sd_status rc = sd_weights_add(&r->u->w, cat(a, d, suffix), cat(b, l, suffix), ndim, shape, off, r->err);
    if (rc) return rc;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return add_init(r, *off, n, kind, bound);
}

/* A conv's weight [cout, cin, k, k] and bias, torch's default init. */
static sd_status add_conv(reg *r, sd_unet_conv *cv, const char *d, const char *l, int cin, int cout, int k)
{
    int ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    float bound = (float)(1.0 / sqrt((double)cin * k * k));
    cv->cin = cin;
    cv->cout = cout;
    cv->k = k;
    sd_status rc = add(r, d, l, "weight", 4, ws, &cv->w, INIT_UNIFORM, bound);
    if (!rc) rc = add(r, d, l, "bias", 1, bs, &cv->b, INIT_UNIFORM, bound);
    return rc;
}

/* A linear's weight [out, in] (or [out, in, 1, 1] when the model stores it
 * as a 1x1 conv) and optional bias. */
static sd_status add_linear(reg *r, sd_unet_linear *ln, const char *d, const char *l, int in, int out, int bias,
                            int conv1x1)
{
    int ws[4] = {out, in, 1, 1}, bs[1] = {out};
    float bound = (float)(1.0 / sqrt((double)in));
    ln->in = in;
    ln->out = out;
    ln->b = SIZE_MAX;
    sd_status rc = add(r, d, l, "weight", conv1x1 ? 4 : 2, ws, &ln->w, INIT_UNIFORM, bound);
    if (!rc && bias) rc = add(r, d, l, "bias", 1, bs, &ln->b, INIT_UNIFORM, bound);
    return rc;
}

/* A norm's gamma (ones) and beta (zeros). */
static sd_status add_norm(reg *r, sd_unet_norm *nm, const char *d, const char *l, int c)
{
    int s[1] = {c};
    sd_status rc = add(r, d, l, "weight", 1, s, &nm->g, INIT_ONES, 0);
    if (!rc) rc = add(r, d, l, "bias", 1, s, &nm->b, INIT_ZEROS, 0);
    return rc;
}

/* ResnetBlock2D with its time projection; ldm names from ResBlock
 * (in_layers, emb_layers, out_layers, skip_connection). */
static sd_status add_resnet(reg *r, sd_unet_resnet *rs, const char *d, const char *l, int cin, int cout, int temb)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    rs->cin = cin;
    rs->cout = cout;
    rs->has_sc = cin != cout;
    sd_status rc = add_norm(r, &rs->n1, cat(a, d, "norm1"), cat(b, l, "in_layers.0"), cin);
    if (!rc) rc = add_conv(r, &rs->c1, cat(a, d, "conv1"), cat(b, l, "in_layers.2"), cin, cout, 3);
    if (!rc)
        rc = add_linear(r, &rs->temb, cat(a, d, "time_emb_proj"), cat(b, l, "emb_layers.1"), temb, cout, 1, 0);
    if (!rc) rc = add_norm(r, &rs->n2, cat(a, d, "norm2"), cat(b, l, "out_layers.0"), cout);
    if (!rc) rc = add_conv(r, &rs->c2, cat(a, d, "conv2"), cat(b, l, "out_layers.3"), cout, cout, 3);
    if (!rc && rs->has_sc)
        rc = add_conv(r, &rs->sc, cat(a, d, "conv_shortcut"), cat(b, l, "skip_connection"), cin, cout, 1);
    return rc;
}

/* Attention's to_q/to_k/to_v (no bias) and to_out.0 (bias); the names are
 * the same in both layouts below the block prefix. */
static sd_status add_attn(reg *r, sd_unet_linear *q, sd_unet_linear *k, sd_unet_linear *v, sd_unet_linear *o,
                          const char *d, const char *l, int c, int inner, int kv_dim)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    sd_status rc = add_linear(r, q, cat(a, d, "to_q"), cat(b, l, "to_q"), c, inner, 0, 0);
    if (!rc) rc = add_linear(r, k, cat(a, d, "to_k"), cat(b, l, "to_k"), kv_dim, inner, 0, 0);
    if (!rc) rc = add_linear(r, v, cat(a, d, "to_v"), cat(b, l, "to_v"), kv_dim, inner, 0, 0);
    if (!rc) rc = add_linear(r, o, cat(a, d, "to_out.0"), cat(b, l, "to_out.0"), inner, c, 1, 0);
    return rc;
}

/* Transformer2DModel (ldm SpatialTransformer): norm, proj_in, the blocks
 * (self-attention, cross-attention, GEGLU feed-forward), proj_out. */
static sd_status add_xformer(reg *r, sd_unet_xformer *xf, const char *d, const char *l, int c, int heads, int depth)
{
    sd_unet *u = r->u;
    const sd_unet_config *cfg = &u->cfg;
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX], x[SD_WEIGHT_NAME_MAX], y[SD_WEIGHT_NAME_MAX];
    int inner = heads * (c / heads), conv = !cfg->linear_proj;
    xf->c = c;
    xf->heads = heads;
    xf->depth = depth;
    xf->first = u->ntb;
    if (u->ntb + depth > u->tbcap) {
        int cap = u->tbcap ? 2 * u->tbcap : 16;
        while (cap < u->ntb + depth) cap *= 2;
        sd_unet_tblock *p = realloc(u->tb, (size_t)cap * sizeof(*p));
        if (!p) return sd_err_set(r->err, SD_ENOMEM, "out of memory");
        u->tb = p;
        u->tbcap = cap;
    }
    sd_status rc = add_norm(r, &xf->gn, cat(a, d, "norm"), cat(b, l, "norm"), c);
    if (!rc) rc = add_linear(r, &xf->pin, cat(a, d, "proj_in"), cat(b, l, "proj_in"), c, inner, 1, conv);
    for (int i = 0; i < depth && !rc; i++) {
        sd_unet_tblock *t = &u->tb[u->ntb++];
        memset(t, 0, sizeof(*t));
        char bd[SD_WEIGHT_NAME_MAX], bl[SD_WEIGHT_NAME_MAX];
        snprintf(bd, sizeof bd, "%s.transformer_blocks.%d", d, i);
        snprintf(bl, sizeof bl, "%s.transformer_blocks.%d", l, i);
        rc = add_norm(r, &t->ln1, cat(a, bd, "norm1"), cat(b, bl, "norm1"), inner);
        if (!rc)
            rc = add_attn(r, &t->q1, &t->k1, &t->v1, &t->o1, cat(x, bd, "attn1"), cat(y, bl, "attn1"), inner, inner,
                          inner);
        if (!rc) rc = add_norm(r, &t->ln2, cat(a, bd, "norm2"), cat(b, bl, "norm2"), inner);
        if (!rc)
            rc = add_attn(r, &t->q2, &t->k2, &t->v2, &t->o2, cat(x, bd, "attn2"), cat(y, bl, "attn2"), inner, inner,
                          cfg->cross_dim);
        if (!rc) rc = add_norm(r, &t->ln3, cat(a, bd, "norm3"), cat(b, bl, "norm3"), inner);
        if (!rc)
            rc = add_linear(r, &t->ff1, cat(a, bd, "ff.net.0.proj"), cat(b, bl, "ff.net.0.proj"), inner, 8 * inner, 1,
                            0);
        if (!rc) rc = add_linear(r, &t->ff2, cat(a, bd, "ff.net.2"), cat(b, bl, "ff.net.2"), 4 * inner, inner, 1, 0);
    }
    if (!rc) rc = add_linear(r, &xf->pout, cat(a, d, "proj_out"), cat(b, l, "proj_out"), inner, c, 1, conv);
    return rc;
}

/* Register every parameter: embeddings, conv_in, down blocks, mid block,
 * up blocks, output. Channel bookkeeping follows diffusers: up block i's
 * resnet j takes the running width plus the skip it pops. */
sd_status sd_unet_build_names(sd_unet *u, const sd_unet_config *cfg, sd_error *err)
{
    sd_status rc = sd_unet_config_check(cfg, err);
    if (rc) return rc;
    memset(u, 0, sizeof(*u));
    u->cfg = *cfg;
    sd_weights_init(&u->w);
    reg r = {u, err};
    const sd_unet_config *c = &u->cfg;
    int nb = c->nblocks, c0 = c->block_out[0], temb = 4 * c0;
    char d[SD_WEIGHT_NAME_MAX], l[SD_WEIGHT_NAME_MAX];
    rc = add_conv(&r, &u->conv_in, "conv_in", "input_blocks.0.0", c->in_channels, c0, 3);
    if (!rc) rc = add_linear(&r, &u->t1, "time_embedding.linear_1", "time_embed.0", c0, temb, 1, 0);
    if (!rc) rc = add_linear(&r, &u->t2, "time_embedding.linear_2", "time_embed.2", temb, temb, 1, 0);
    if (!rc && c->text_time) {
        rc = add_linear(&r, &u->a1, "add_embedding.linear_1", "label_emb.0.0", c->add_in_dim, temb, 1, 0);
        if (!rc) rc = add_linear(&r, &u->a2, "add_embedding.linear_2", "label_emb.0.2", temb, temb, 1, 0);
    }
    int skip_ch[1 + SD_UNET_MAX_BLOCKS * (SD_UNET_MAX_LAYERS + 1)], ns = 0, ch = c0, k = 1;
    skip_ch[ns++] = ch;
    for (int i = 0; i < nb && !rc; i++) {
        for (int j = 0; j < c->layers[i] && !rc; j++, k++) {
            snprintf(d, sizeof d, "down_blocks.%d.resnets.%d", i, j);
            snprintf(l, sizeof l, "input_blocks.%d.0", k);
            rc = add_resnet(&r, &u->down_res[i][j], d, l, ch, c->block_out[i], temb);
            ch = c->block_out[i];
            if (!rc && c->down_attn[i]) {
                snprintf(d, sizeof d, "down_blocks.%d.attentions.%d", i, j);
                snprintf(l, sizeof l, "input_blocks.%d.1", k);
                rc = add_xformer(&r, &u->down_att[i][j], d, l, ch, c->heads[i], c->depth[i]);
            }
            skip_ch[ns++] = ch;
        }
        if (!rc && i < nb - 1) {
            snprintf(d, sizeof d, "down_blocks.%d.downsamplers.0.conv", i);
            snprintf(l, sizeof l, "input_blocks.%d.0.op", k++);
            rc = add_conv(&r, &u->down_conv[i], d, l, ch, ch, 3);
            skip_ch[ns++] = ch;
        }
    }
    if (!rc && c->mid_attn) {
        rc = add_resnet(&r, &u->mid_res[0], "mid_block.resnets.0", "middle_block.0", ch, ch, temb);
        if (!rc)
            rc = add_xformer(&r, &u->mid_att, "mid_block.attentions.0", "middle_block.1", ch, c->heads[nb - 1],
                             c->depth[nb - 1]);
        if (!rc) rc = add_resnet(&r, &u->mid_res[1], "mid_block.resnets.1", "middle_block.2", ch, ch, temb);
    }
    k = 0;
    for (int i = 0; i < nb && !rc; i++) {
        int di = nb - 1 - i, nl = c->layers[di] + 1, out = c->block_out[di];
        for (int j = 0; j < nl && !rc; j++, k++) {
            snprintf(d, sizeof d, "up_blocks.%d.resnets.%d", i, j);
            snprintf(l, sizeof l, "output_blocks.%d.0", k);
            rc = add_resnet(&r, &u->up_res[i][j], d, l, ch + skip_ch[--ns], out, temb);
            ch = out;
            if (!rc && c->up_attn[i]) {
                snprintf(d, sizeof d, "up_blocks.%d.attentions.%d", i, j);
                snprintf(l, sizeof l, "output_blocks.%d.1", k);
                rc = add_xformer(&r, &u->up_att[i][j], d, l, ch, c->heads[di], c->depth_up[i]);
            }
            if (!rc && i < nb - 1 && j == nl - 1) {
                snprintf(d, sizeof d, "up_blocks.%d.upsamplers.0.conv", i);
                snprintf(l, sizeof l, "output_blocks.%d.%d.conv", k, c->up_attn[i] ? 2 : 1);
                rc = add_conv(&r, &u->up_conv[i], d, l, ch, ch, 3);
            }
        }
    }
    if (!rc) rc = add_norm(&r, &u->norm_out, "conv_norm_out", "out.0", c0);
    if (!rc) rc = add_conv(&r, &u->conv_out, "conv_out", "out.2", c0, c->out_channels, 3);
    if (rc) sd_unet_free(u);
    return rc;
}

/* The layer table plus the zeroed parameter buffer. */
sd_status sd_unet_build(sd_unet *u, const sd_unet_config *cfg, sd_error *err)
{
    sd_status rc = sd_unet_build_names(u, cfg, err);
    if (!rc) rc = sd_weights_alloc(&u->w, err);
    if (rc) sd_unet_free(u);
    return rc;
}

/* Release the parameters and tables. */
void sd_unet_free(sd_unet *u)
{
    sd_weights_free(&u->w);
    free(u->tb);
    free(u->init);
    u->tb = NULL;
    u->init = NULL;
    u->ntb = u->tbcap = 0;
    u->ninit = u->initcap = 0;
}

/* Each slot as its init record says, one generator stream for all, into
 * fp32 (f32) or, each value rounded to the nearest bf16 as it is drawn,
 * into bf16 (b16): the same stream, so the bf16 weights are the fp32
 * ones rounded, without the fp32 model ever existing. */
static void init_fill(const sd_unet *u, uint64_t seed, float *f32, uint16_t *b16)
{
    uint64_t s = seed;
    for (size_t i = 0; i < u->ninit; i++) {
        const struct sd_unet_init *in = &u->init[i];
        for (size_t j = 0; j < in->n; j++) {
            float v;
            if (in->kind == INIT_ONES) v = 1.0f;
            else if (in->kind == INIT_ZEROS) v = 0.0f;
            else v = (float)(((double)(sd_splitmix64(&s) >> 11) * 0x1p-53 * 2.0 - 1.0) * in->bound);
            if (f32) f32[in->off + j] = v;
            else b16[in->off + j] = sd_f32_to_bf16(v);
        }
    }
}

/* torch's init into the fp32 weights (unet.h). */
void sd_unet_init_random(sd_unet *u, uint64_t seed)
{
    init_fill(u, seed, u->w.data, NULL);
}

/* The same rounded into bf16 weights (unet.h). */
void sd_unet_init_random_bf16(const sd_unet *u, uint64_t seed, uint16_t *dst)
{
    init_fill(u, seed, NULL, dst);
}
