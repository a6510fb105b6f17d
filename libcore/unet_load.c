/* The UNet's layer table and weight names in both layouts (diffusers and
 * the original ldm input_blocks / middle_block / output_blocks), its config
 * (config.json, or inferred from weight shapes), loading, torch-style
 * random init for from-scratch training, and saving. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arena.h"
#include "buf.h"
#include "f16.h"
#include "json.h"
#include "model_dir.h"
#include "outfile.h"
#include "slurp.h"
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

/* Check a config the graph can run. */
sd_status sd_unet_config_check(const sd_unet_config *c, sd_error *err)
{
    if (c->nblocks < 1 || c->nblocks > SD_UNET_MAX_BLOCKS)
        return sd_err_set(err, SD_EUNSUPPORTED, "UNet with %d blocks (1..%d supported)", c->nblocks,
                          SD_UNET_MAX_BLOCKS);
    if (c->in_channels < 1 || c->out_channels < 1 || c->groups < 1 || c->cross_dim < 1 || !(c->eps > 0))
        return sd_err_set(err, SD_EINVAL, "UNet config: bad channel, group or norm eps value");
    if (c->down_pad != 0 && c->down_pad != 1)
        return sd_err_set(err, SD_EUNSUPPORTED, "UNet config: downsample_padding %d (0 or 1 supported)", c->down_pad);
    for (int i = 0; i < c->nblocks; i++) {
        if (c->block_out[i] < 1 || c->block_out[i] % c->groups)
            return sd_err_set(err, SD_EINVAL, "UNet config: %d channels not divisible by %d norm groups",
                              c->block_out[i], c->groups);
        if (c->layers[i] < 1 || c->layers[i] > SD_UNET_MAX_LAYERS)
            return sd_err_set(err, SD_EUNSUPPORTED, "UNet config: %d layers in block %d (1..%d supported)",
                              c->layers[i], i, SD_UNET_MAX_LAYERS);
        int ui = c->nblocks - 1 - i;
        if (c->heads[i] < 1 || c->heads[i] > c->block_out[i] || c->depth[i] < 1 || c->depth[i] > 64 ||
            c->depth_up[ui] < 1 || c->depth_up[ui] > 64)
            return sd_err_set(err, SD_EINVAL, "UNet config: bad attention heads or transformer depth in block %d", i);
    }
    if (c->text_time && (c->add_time_dim < 2 || c->add_in_dim <= SD_UNET_TIME_IDS * c->add_time_dim))
        return sd_err_set(err, SD_EINVAL,
                          "UNet config: addition_time_embed_dim %d and projection_class_embeddings_input_dim %d "
                          "leave no room for the pooled text embedding",
                          c->add_time_dim, c->add_in_dim);
    return SD_OK;
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

/* splitmix64: a small seeded generator, the same stream on every machine. */
static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fill each slot as its init record says, one generator stream for all. */
void sd_unet_init_random(sd_unet *u, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < u->ninit; i++) {
        const struct sd_unet_init *in = &u->init[i];
        float *p = u->w.data + in->off;
        for (size_t j = 0; j < in->n; j++) {
            if (in->kind == INIT_ONES) p[j] = 1.0f;
            else if (in->kind == INIT_ZEROS) p[j] = 0.0f;
            else p[j] = (float)(((double)(mix64(&s) >> 11) * 0x1p-53 * 2.0 - 1.0) * in->bound);
        }
    }
}

/* ---- config ---------------------------------------------------------------- */

/* Diffusers' UNet2DConditionModel defaults (the SD 1.x architecture). */
void sd_unet_config_default(sd_unet_config *c)
{
    static const int bo[4] = {320, 640, 1280, 1280};
    memset(c, 0, sizeof(*c));
    c->in_channels = c->out_channels = 4;
    c->nblocks = 4;
    for (int i = 0; i < 4; i++) {
        c->block_out[i] = bo[i];
        c->layers[i] = 2;
        c->down_attn[i] = i < 3;
        c->up_attn[i] = i > 0;
        c->heads[i] = 8;
        c->depth[i] = c->depth_up[i] = 1;
    }
    c->mid_attn = 1;
    c->groups = 32;
    c->eps = 1e-5f;
    c->cross_dim = 1280;
    c->flip_sin_to_cos = 1;
    c->down_pad = 1;
}

/* Reading state of one config file. */
typedef struct {
    const sd_json *root;
    const char *path;
    sd_error *err;
} cfgr;

/* A member that is absent or null. */
static int absent(const cfgr *r, const char *key)
{
    const sd_json *m = sd_json_get(r->root, key);
    return !m || m->type == SD_JSON_NULL;
}

/* An integer value in [lo, hi]. */
static sd_status int_of(const cfgr *r, const sd_json *m, const char *key, int lo, int hi, int *out)
{
    double d;
    if (sd_json_whole(m, lo, hi, &d))
        return sd_err_set(r->err, SD_EFORMAT, "%s: %s must be an integer in %d..%d", r->path, key, lo, hi);
    *out = (int)d;
    return SD_OK;
}

/* An integer member; absent keeps *out. */
static sd_status get_int(const cfgr *r, const char *key, int lo, int hi, int *out)
{
    return absent(r, key) ? SD_OK : int_of(r, sd_json_get(r->root, key), key, lo, hi, out);
}

/* A number member; absent keeps *out. */
static sd_status get_float(const cfgr *r, const char *key, float *out)
{
    double d;
    if (absent(r, key)) return SD_OK;
    if (sd_json_num(sd_json_get(r->root, key), &d))
        return sd_err_set(r->err, SD_EFORMAT, "%s: %s must be a number", r->path, key);
    *out = (float)d;
    return SD_OK;
}

/* A boolean member; absent keeps *out. */
static sd_status get_bool(const cfgr *r, const char *key, int *out)
{
    if (absent(r, key)) return SD_OK;
    const sd_json *m = sd_json_get(r->root, key);
    if (m->type != SD_JSON_TRUE && m->type != SD_JSON_FALSE)
        return sd_err_set(r->err, SD_EFORMAT, "%s: %s must be true or false", r->path, key);
    *out = m->type == SD_JSON_TRUE;
    return SD_OK;
}

/* An integer or a list of n integers into out[0..n); absent keeps out. */
static sd_status get_ints(const cfgr *r, const char *key, int n, int lo, int hi, int *out)
{
    if (absent(r, key)) return SD_OK;
    const sd_json *m = sd_json_get(r->root, key);
    if (m->type != SD_JSON_ARRAY) {
        int v = 0; /* set by int_of on success; GCC -O2 cannot tell */
        sd_status rc = int_of(r, m, key, lo, hi, &v);
        for (int i = 0; i < n && !rc; i++) out[i] = v;
        return rc;
    }
    if ((int)m->len != n)
        return sd_err_set(r->err, SD_EFORMAT, "%s: %s has %u entries, the model has %d blocks", r->path, key,
                          (unsigned)m->len, n);
    int i = 0;
    for (const sd_json *e = m->child; e; e = e->next, i++) {
        if (e->type == SD_JSON_ARRAY)
            return sd_err_set(r->err, SD_EUNSUPPORTED, "%s: %s as nested lists is not supported", r->path, key);
        sd_status rc = int_of(r, e, key, lo, hi, &out[i]);
        if (rc) return rc;
    }
    return SD_OK;
}

/* Block type lists: each entry one of two names, 1 for the attention one. */
static sd_status get_types(const cfgr *r, const char *key, const char *with, const char *without, int n, int *out)
{
    if (absent(r, key)) return SD_OK;
    const sd_json *m = sd_json_get(r->root, key);
    if (m->type != SD_JSON_ARRAY || (int)m->len != n)
        return sd_err_set(r->err, SD_EFORMAT, "%s: %s must list %d block types", r->path, key, n);
    int i = 0;
    for (const sd_json *e = m->child; e; e = e->next, i++) {
        const char *s = sd_json_str(e);
        if (s && strcmp(s, with) == 0) out[i] = 1;
        else if (s && strcmp(s, without) == 0) out[i] = 0;
        else
            return sd_err_set(r->err, SD_EUNSUPPORTED, "%s: %s[%d] is %s (%s or %s supported)", r->path, key, i,
                              s ? s : "not a string", with, without);
    }
    return SD_OK;
}

/* Options sdtk does not implement must keep diffusers' default: absent,
 * null, false, 0, or the named default value. */
static sd_status check_defaults(const cfgr *r)
{
    static const char *null_keys[] = {"class_embed_type", "encoder_hid_dim", "encoder_hid_dim_type",
                                      "num_class_embeds", "time_cond_proj_dim", "time_embedding_act_fn",
                                      "timestep_post_act", "cross_attention_norm", "time_embedding_dim"};
    static const char *false_keys[] = {"center_input_sample", "dual_cross_attention", "only_cross_attention",
                                       "resnet_skip_time_act", "class_embeddings_concat",
                                       "mid_block_only_cross_attention"};
    static const struct {
        const char *key, *value;
    } str_keys[] = {{"act_fn", "silu"}, {"resnet_time_scale_shift", "default"}, {"time_embedding_type", "positional"},
                    {"attention_type", "default"}};
    static const struct {
        const char *key;
        double value;
    } num_keys[] = {{"conv_in_kernel", 3}, {"conv_out_kernel", 3}, {"mid_block_scale_factor", 1},
                    {"resnet_out_scale_factor", 1}, {"dropout", 0}};
    for (size_t i = 0; i < sizeof null_keys / sizeof *null_keys; i++)
        if (!absent(r, null_keys[i]))
            return sd_err_set(r->err, SD_EUNSUPPORTED, "%s: %s is set; sdtk supports only SD/SDXL UNets without it",
                              r->path, null_keys[i]);
    for (size_t i = 0; i < sizeof false_keys / sizeof *false_keys; i++)
        if (!absent(r, false_keys[i]) && sd_json_get(r->root, false_keys[i])->type != SD_JSON_FALSE)
            return sd_err_set(r->err, SD_EUNSUPPORTED, "%s: %s must be false for sdtk", r->path, false_keys[i]);
    for (size_t i = 0; i < sizeof str_keys / sizeof *str_keys; i++) {
        if (absent(r, str_keys[i].key)) continue;
        const char *s = sd_json_str(sd_json_get(r->root, str_keys[i].key));
        if (!s || strcmp(s, str_keys[i].value) != 0)
            return sd_err_set(r->err, SD_EUNSUPPORTED, "%s: %s must be \"%s\" for sdtk", r->path, str_keys[i].key,
                              str_keys[i].value);
    }
    for (size_t i = 0; i < sizeof num_keys / sizeof *num_keys; i++) {
        double d;
        if (absent(r, num_keys[i].key)) continue;
        if (sd_json_num(sd_json_get(r->root, num_keys[i].key), &d) || d != num_keys[i].value)
            return sd_err_set(r->err, SD_EUNSUPPORTED, "%s: %s must be %g for sdtk", r->path, num_keys[i].key,
                              num_keys[i].value);
    }
    return SD_OK;
}

/* The structural keys: blocks, their types, widths and per-block lists. */
static sd_status read_structure(const cfgr *r, sd_unet_config *c)
{
    const sd_json *bo = sd_json_get(r->root, "block_out_channels");
    sd_status rc = SD_OK;
    if (bo && bo->type != SD_JSON_NULL) {
        if (bo->type != SD_JSON_ARRAY || bo->len < 1 || bo->len > SD_UNET_MAX_BLOCKS)
            return sd_err_set(r->err, SD_EFORMAT, "%s: block_out_channels must be a list of 1..%d numbers", r->path,
                              SD_UNET_MAX_BLOCKS);
        int n = (int)bo->len;
        if (n != c->nblocks) {
            /* another block count: the per-block defaults follow SD's pattern */
            for (int i = 0; i < n; i++) {
                c->down_attn[i] = i < n - 1;
                c->up_attn[i] = i > 0;
                c->layers[i] = c->layers[0];
                c->heads[i] = c->heads[0];
                c->depth[i] = c->depth_up[i] = 1;
            }
            c->nblocks = n;
        }
        rc = get_ints(r, "block_out_channels", n, 1, 1 << 16, c->block_out);
    }
    int n = c->nblocks;
    if (!rc) rc = get_types(r, "down_block_types", "CrossAttnDownBlock2D", "DownBlock2D", n, c->down_attn);
    if (!rc) rc = get_types(r, "up_block_types", "CrossAttnUpBlock2D", "UpBlock2D", n, c->up_attn);
    if (!rc && !absent(r, "mid_block_type")) {
        const char *s = sd_json_str(sd_json_get(r->root, "mid_block_type"));
        if (!s || strcmp(s, "UNetMidBlock2DCrossAttn") != 0)
            rc = sd_err_set(r->err, SD_EUNSUPPORTED, "%s: mid_block_type %s (UNetMidBlock2DCrossAttn or null supported)",
                            r->path, s ? s : "is not a string");
    } else if (!rc && sd_json_get(r->root, "mid_block_type")) {
        c->mid_attn = 0; /* explicit null: no mid block */
    }
    if (!rc) rc = get_ints(r, "layers_per_block", n, 1, SD_UNET_MAX_LAYERS, c->layers);
    if (!rc) rc = get_ints(r, "attention_head_dim", n, 1, 1 << 16, c->heads);
    if (!rc) rc = get_ints(r, "num_attention_heads", n, 1, 1 << 16, c->heads);
    if (!rc) rc = get_ints(r, "transformer_layers_per_block", n, 1, 64, c->depth);
    if (!rc)
        for (int i = 0; i < n; i++) c->depth_up[i] = c->depth[n - 1 - i];
    if (!rc && !absent(r, "reverse_transformer_layers_per_block"))
        rc = sd_err_set(r->err, SD_EUNSUPPORTED, "%s: reverse_transformer_layers_per_block is not supported", r->path);
    if (!rc && !absent(r, "cross_attention_dim")) {
        int cd[SD_UNET_MAX_BLOCKS];
        rc = get_ints(r, "cross_attention_dim", n, 1, 1 << 16, cd);
        for (int i = 1; i < n && !rc; i++)
            if (cd[i] != cd[0])
                rc = sd_err_set(r->err, SD_EUNSUPPORTED, "%s: per-block cross_attention_dim is not supported", r->path);
        if (!rc) c->cross_dim = cd[0];
    }
    return rc;
}

/* Read a diffusers UNet2DConditionModel config.json over c's values. */
sd_status sd_unet_config_read(const char *path, sd_unet_config *c, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 14);
    sd_status rc = sd_parse_json_file(path, &text, &a, &root, err);
    if (!rc && root->type != SD_JSON_OBJECT) rc = sd_err_set(err, SD_EFORMAT, "%s: not a JSON object", path);
    cfgr r = {root, path, err};
    if (!rc) {
        const sd_json *cls = sd_json_get(root, "_class_name");
        const char *s = cls ? sd_json_str(cls) : NULL;
        if (cls && (!s || strcmp(s, "UNet2DConditionModel") != 0))
            rc = sd_err_set(err, SD_EUNSUPPORTED, "%s: _class_name %s, expected UNet2DConditionModel", path,
                            s ? s : "(not a string)");
    }
    if (!rc) rc = check_defaults(&r);
    if (!rc) rc = read_structure(&r, c);
    if (!rc) rc = get_int(&r, "in_channels", 1, 1 << 16, &c->in_channels);
    if (!rc) rc = get_int(&r, "out_channels", 1, 1 << 16, &c->out_channels);
    if (!rc) rc = get_int(&r, "norm_num_groups", 1, 1 << 16, &c->groups);
    if (!rc) rc = get_float(&r, "norm_eps", &c->eps);
    if (!rc) rc = get_bool(&r, "use_linear_projection", &c->linear_proj);
    if (!rc) rc = get_bool(&r, "upcast_attention", &c->upcast_attention);
    if (!rc) rc = get_bool(&r, "flip_sin_to_cos", &c->flip_sin_to_cos);
    if (!rc) rc = get_float(&r, "freq_shift", &c->freq_shift);
    if (!rc) rc = get_int(&r, "downsample_padding", 0, 1, &c->down_pad);
    if (!rc && !absent(&r, "sample_size")) {
        int ss[2] = {0, 0};
        const sd_json *m = sd_json_get(root, "sample_size");
        rc = m->type == SD_JSON_ARRAY ? get_ints(&r, "sample_size", 2, 1, 1 << 16, ss)
                                      : get_int(&r, "sample_size", 1, 1 << 16, &ss[0]);
        c->sample_size = ss[0];
    }
    if (!rc && !absent(&r, "addition_embed_type")) {
        const char *s = sd_json_str(sd_json_get(root, "addition_embed_type"));
        if (!s || strcmp(s, "text_time") != 0)
            rc = sd_err_set(err, SD_EUNSUPPORTED, "%s: addition_embed_type %s (text_time or null supported)", path,
                            s ? s : "is not a string");
        c->text_time = 1;
        if (!rc) rc = get_int(&r, "addition_time_embed_dim", 2, 1 << 16, &c->add_time_dim);
        if (!rc) rc = get_int(&r, "projection_class_embeddings_input_dim", 1, 1 << 20, &c->add_in_dim);
    }
    if (!rc) rc = sd_unet_config_check(c, err);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* A JSON list of n ints. */
static void put_ints(sd_buf *b, int *first, const char *key, const int *v, int n)
{
    sd_buf_json_key(b, first, key);
    sd_buf_putc(b, '[');
    for (int i = 0; i < n; i++) sd_buf_printf(b, "%s%d", i ? ", " : "", v[i]);
    sd_buf_putc(b, ']');
}

/* A JSON list of block type names, attention ones where flag[i]. */
static void put_types(sd_buf *b, int *first, const char *key, const int *flag, int n, const char *with,
                      const char *without)
{
    sd_buf_json_key(b, first, key);
    sd_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        if (i) sd_buf_puts(b, ", ");
        sd_buf_json_cstr(b, flag[i] ? with : without);
    }
    sd_buf_putc(b, ']');
}

/* One architecture field of sd_unet_config: its diffusers name, where it
 * lies and whether it has a value per block. */
typedef struct {
    const char *name;
    size_t off;
    int per_block, is_float;
} unet_field;

_Static_assert(sizeof(int) == 4 && sizeof(float) == 4, "sd_unet_config_diff compares 4-byte fields");

/* One field's value at p as text. */
static void field_text(const char *p, int is_float, char *out, size_t cap)
{
    if (is_float) {
        float x;
        memcpy(&x, p, 4);
        snprintf(out, cap, "%g", (double)x);
    } else {
        int x;
        memcpy(&x, p, 4);
        snprintf(out, cap, "%d", x);
    }
}

/* The first architecture field in which a and b differ, beside the config
 * reader and writer so the list follows the struct: 1 with its diffusers
 * name (and block) in field and both values as text; 0 when they agree.
 * sample_size is informational and not compared. */
int sd_unet_config_diff(const sd_unet_config *a, const sd_unet_config *b, char *field, size_t fcap, char *va, char *vb,
                        size_t vcap)
{
    static const unet_field f[] = {
        {"in_channels", offsetof(sd_unet_config, in_channels), 0, 0},
        {"out_channels", offsetof(sd_unet_config, out_channels), 0, 0},
        {"len(block_out_channels)", offsetof(sd_unet_config, nblocks), 0, 0},
        {"block_out_channels", offsetof(sd_unet_config, block_out), 1, 0},
        {"layers_per_block", offsetof(sd_unet_config, layers), 1, 0},
        {"down_block_types", offsetof(sd_unet_config, down_attn), 1, 0},
        {"up_block_types", offsetof(sd_unet_config, up_attn), 1, 0},
        {"attention_head_dim", offsetof(sd_unet_config, heads), 1, 0},
        {"transformer_layers_per_block", offsetof(sd_unet_config, depth), 1, 0},
        {"reverse_transformer_layers_per_block", offsetof(sd_unet_config, depth_up), 1, 0},
        {"mid_block_type", offsetof(sd_unet_config, mid_attn), 0, 0},
        {"norm_num_groups", offsetof(sd_unet_config, groups), 0, 0},
        {"norm_eps", offsetof(sd_unet_config, eps), 0, 1},
        {"cross_attention_dim", offsetof(sd_unet_config, cross_dim), 0, 0},
        {"use_linear_projection", offsetof(sd_unet_config, linear_proj), 0, 0},
        {"upcast_attention", offsetof(sd_unet_config, upcast_attention), 0, 0},
        {"flip_sin_to_cos", offsetof(sd_unet_config, flip_sin_to_cos), 0, 0},
        {"freq_shift", offsetof(sd_unet_config, freq_shift), 0, 1},
        {"downsample_padding", offsetof(sd_unet_config, down_pad), 0, 0},
        {"addition_embed_type", offsetof(sd_unet_config, text_time), 0, 0},
        {"addition_time_embed_dim", offsetof(sd_unet_config, add_time_dim), 0, 0},
        {"projection_class_embeddings_input_dim", offsetof(sd_unet_config, add_in_dim), 0, 0},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        int n = f[i].per_block ? (a->nblocks < SD_UNET_MAX_BLOCKS ? a->nblocks : SD_UNET_MAX_BLOCKS) : 1;
        for (int k = 0; k < n; k++) {
            const char *pa = (const char *)a + f[i].off + (size_t)k * 4, *pb = (const char *)b + f[i].off + (size_t)k * 4;
            if (memcmp(pa, pb, 4) == 0) continue;
            if (f[i].per_block) snprintf(field, fcap, "%s of block %d", f[i].name, k);
            else snprintf(field, fcap, "%s", f[i].name);
            field_text(pa, f[i].is_float, va, vcap);
            field_text(pb, f[i].is_float, vb, vcap);
            return 1;
        }
    }
    return 0;
}

/* Write the config as diffusers' config.json (the keys sdtk models; every
 * other option keeps diffusers' default), atomically. */
sd_status sd_unet_config_write(const sd_unet_config *c, const char *path, sd_error *err)
{
    sd_buf b;
    int first = 1, n = c->nblocks;
    sd_buf_init(&b);
    sd_buf_putc(&b, '{');
    sd_buf_json_key(&b, &first, "_class_name");
    sd_buf_json_cstr(&b, "UNet2DConditionModel");
    put_ints(&b, &first, "attention_head_dim", c->heads, n);
    put_ints(&b, &first, "block_out_channels", c->block_out, n);
    sd_buf_json_key(&b, &first, "cross_attention_dim");
    sd_buf_json_int(&b, c->cross_dim);
    sd_buf_json_key(&b, &first, "downsample_padding");
    sd_buf_json_int(&b, c->down_pad);
    put_types(&b, &first, "down_block_types", c->down_attn, n, "CrossAttnDownBlock2D", "DownBlock2D");
    sd_buf_json_key(&b, &first, "flip_sin_to_cos");
    sd_buf_puts(&b, c->flip_sin_to_cos ? "true" : "false");
    sd_buf_json_key(&b, &first, "freq_shift");
    sd_buf_json_num(&b, c->freq_shift);
    sd_buf_json_key(&b, &first, "in_channels");
    sd_buf_json_int(&b, c->in_channels);
    put_ints(&b, &first, "layers_per_block", c->layers, n);
    sd_buf_json_key(&b, &first, "mid_block_type");
    sd_buf_puts(&b, c->mid_attn ? "\"UNetMidBlock2DCrossAttn\"" : "null");
    sd_buf_json_key(&b, &first, "norm_eps");
    sd_buf_json_num(&b, c->eps);
    sd_buf_json_key(&b, &first, "norm_num_groups");
    sd_buf_json_int(&b, c->groups);
    sd_buf_json_key(&b, &first, "out_channels");
    sd_buf_json_int(&b, c->out_channels);
    if (c->sample_size > 0) {
        sd_buf_json_key(&b, &first, "sample_size");
        sd_buf_json_int(&b, c->sample_size);
    }
    put_ints(&b, &first, "transformer_layers_per_block", c->depth, n);
    put_types(&b, &first, "up_block_types", c->up_attn, n, "CrossAttnUpBlock2D", "UpBlock2D");
    sd_buf_json_key(&b, &first, "upcast_attention");
    sd_buf_puts(&b, c->upcast_attention ? "true" : "false");
    sd_buf_json_key(&b, &first, "use_linear_projection");
    sd_buf_puts(&b, c->linear_proj ? "true" : "false");
    if (c->text_time) {
        sd_buf_json_key(&b, &first, "addition_embed_type");
        sd_buf_json_cstr(&b, "text_time");
        sd_buf_json_key(&b, &first, "addition_time_embed_dim");
        sd_buf_json_int(&b, c->add_time_dim);
        sd_buf_json_key(&b, &first, "projection_class_embeddings_input_dim");
        sd_buf_json_int(&b, c->add_in_dim);
    }
    sd_buf_puts(&b, "}\n");
    sd_status rc = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(path, b.data, b.len, err);
    sd_buf_free(&b);
    return rc;
}

/* ---- inference from weight shapes ------------------------------------------- */

/* Which names a file uses. */
typedef struct {
    const sd_safetensors *st;
    sd_weight_layout lay;
} probe;

/* Dimension d of prefix + name, 0 when absent; *ndim gets its rank. */
static int dim_of(const probe *p, const char *name, int d, int *ndim)
{
    char full[2 * SD_WEIGHT_NAME_MAX];
    snprintf(full, sizeof full, "%s%s", p->lay.prefix, name);
    const sd_st_tensor *t = sd_st_find(p->st, full);
    if (ndim) *ndim = t ? t->ndim : 0;
    return t && t->ndim > d ? (int)t->shape[d] : 0;
}

/* Whether prefix + name exists. */
static int has(const probe *p, const char *name)
{
    int nd;
    dim_of(p, name, 0, &nd);
    return nd > 0;
}

/* Transformer blocks under an attention prefix (0 when absent). */
static int count_tblocks(const probe *p, const char *att)
{
    char n[2 * SD_WEIGHT_NAME_MAX];
    int k = 0;
    for (;; k++) {
        int len = snprintf(n, sizeof n, "%s.transformer_blocks.%d.norm1.weight", att, k);
        if (len < 0 || len >= (int)sizeof n || !has(p, n)) break;
    }
    return k;
}

/* Heads when a file has no config: SD1's 8 per block with conv
 * projections, else 64-wide heads (SD2, SDXL). */
static void default_heads(sd_unet_config *c)
{
    for (int i = 0; i < c->nblocks; i++) c->heads[i] = c->linear_proj ? (c->block_out[i] + 63) / 64 : 8;
}

/* The attention facts shared by both layouts, from one attention prefix. */
static void attn_facts(const probe *p, const char *att, sd_unet_config *c)
{
    char n[2 * SD_WEIGHT_NAME_MAX];
    int nd;
    snprintf(n, sizeof n, "%s.proj_in.weight", att);
    dim_of(p, n, 0, &nd);
    c->linear_proj = nd == 2;
    snprintf(n, sizeof n, "%s.transformer_blocks.0.attn2.to_k.weight", att);
    c->cross_dim = dim_of(p, n, 1, NULL);
}

/* Transformer blocks found under each attention of a file: per down block
 * and layer, per up block and layer (up-block order), and in the mid block. */
typedef struct {
    int down[SD_UNET_MAX_BLOCKS][SD_UNET_MAX_LAYERS];
    int up[SD_UNET_MAX_BLOCKS][SD_UNET_MAX_LAYERS + 1];
    int mid;
} tcounts;

/* The one count every layer of a block has; -1 (err set) when layers
 * differ: the model gives a block one depth (diffusers' nested per-layer
 * lists are not supported), and a differing layer would leave tensors
 * unread or missing. */
static int block_count(const int *n, int layers, const char *kind, int block, const char *path, sd_error *err)
{
    for (int j = 1; j < layers; j++)
        if (n[j] != n[0]) {
            sd_err_set(err, SD_EUNSUPPORTED,
                       "%s: %s block %d: attention %d has %d transformer blocks, attention 0 has %d "
                       "(one count per block is supported)",
                       path, kind, block, j, n[j], n[0]);
            return -1;
        }
    return n[0];
}

/* Attention flags and transformer depths from the counts. diffusers'
 * transformer_layers_per_block[i] serves down block i, its mirror up
 * block nb-1-i and, for the last block, the mid block (even when that
 * block has no attention of its own: the SDXL refiner's mid block has 4
 * with a last block of none), so every user of entry i must agree. */
static sd_status settle_depths(const tcounts *t, sd_unet_config *c, const char *path, sd_error *err)
{
    int nb = c->nblocks;
    for (int i = 0; i < nb; i++) {
        int ui = nb - 1 - i;
        int d = block_count(t->down[i], c->layers[i], "down", i, path, err);
        if (d < 0) return err->code;
        int u = block_count(t->up[ui], c->layers[i] + 1, "up", ui, path, err);
        if (u < 0) return err->code;
        int m = i == nb - 1 && c->mid_attn ? t->mid : 0;
        int v = d ? d : u ? u : m;
        if ((u && u != v) || (m && m != v)) {
            char mid[48] = "";
            if (m) snprintf(mid, sizeof mid, ", the mid block %d", m);
            return sd_err_set(err, SD_EUNSUPPORTED,
                              "%s: down block %d has %d transformer blocks per attention, up block %d has %d%s: one "
                              "transformer_layers_per_block per block is supported (the mid block takes the last's)",
                              path, i, d, ui, u, mid);
        }
        c->down_attn[i] = d > 0;
        c->up_attn[ui] = u > 0;
        c->depth[i] = c->depth_up[ui] = v ? v : 1;
    }
    return SD_OK;
}

/* Infer from ldm names: input_blocks walked in order, a downsampler
 * (.0.op) closing each block but the last. */
static sd_status infer_ldm(const probe *p, sd_unet_config *c, sd_error *err, const char *path)
{
    char n[2 * SD_WEIGHT_NAME_MAX], a[2 * SD_WEIGHT_NAME_MAX];
    int k = 1, attn_seen = 0;
    tcounts t;
    memset(&t, 0, sizeof t);
    c->nblocks = 0;
    while (c->nblocks < SD_UNET_MAX_BLOCKS) {
        int i = c->nblocks, l = 0;
        for (;; k++, l++) {
            snprintf(n, sizeof n, "input_blocks.%d.0.in_layers.2.weight", k);
            int co = dim_of(p, n, 0, NULL);
            if (!co) break;
            c->block_out[i] = co;
            snprintf(a, sizeof a, "input_blocks.%d.1", k);
            int d = count_tblocks(p, a);
            if (l < SD_UNET_MAX_LAYERS) t.down[i][l] = d;
            if (d && !attn_seen++) attn_facts(p, a, c);
        }
        if (l < 1 || l > SD_UNET_MAX_LAYERS) break;
        c->layers[i] = l;
        c->nblocks++;
        snprintf(n, sizeof n, "input_blocks.%d.0.op.weight", k);
        if (!has(p, n)) break;
        k++;
    }
    if (c->nblocks < 1) return sd_err_set(err, SD_EFORMAT, "%s: no UNet input_blocks resnets found", path);
    c->mid_attn = has(p, "middle_block.1.norm.weight");
    if (!c->mid_attn && has(p, "middle_block.0.in_layers.0.weight"))
        return sd_err_set(err, SD_EUNSUPPORTED, "%s: a mid block without attention is not supported", path);
    t.mid = count_tblocks(p, "middle_block.1");
    k = 0;
    for (int i = 0; i < c->nblocks; i++)
        for (int j = 0; j <= c->layers[c->nblocks - 1 - i]; j++, k++) {
            snprintf(a, sizeof a, "output_blocks.%d.1", k);
            t.up[i][j] = count_tblocks(p, a);
        }
    c->in_channels = dim_of(p, "input_blocks.0.0.weight", 1, NULL);
    c->out_channels = dim_of(p, "out.2.weight", 0, NULL);
    c->add_in_dim = dim_of(p, "label_emb.0.0.weight", 1, NULL);
    return settle_depths(&t, c, path, err);
}

/* Infer from diffusers names (a weights file without its config.json). */
static sd_status infer_diffusers(const probe *p, sd_unet_config *c, sd_error *err, const char *path)
{
    char n[2 * SD_WEIGHT_NAME_MAX], a[2 * SD_WEIGHT_NAME_MAX];
    int attn_seen = 0;
    tcounts t;
    memset(&t, 0, sizeof t);
    c->nblocks = 0;
    for (int i = 0; i < SD_UNET_MAX_BLOCKS; i++) {
        int l = 0;
        for (; l <= SD_UNET_MAX_LAYERS; l++) {
            snprintf(n, sizeof n, "down_blocks.%d.resnets.%d.conv1.weight", i, l);
            int co = dim_of(p, n, 0, NULL);
            if (!co) break;
            c->block_out[i] = co;
        }
        if (l < 1 || l > SD_UNET_MAX_LAYERS) break;
        c->layers[i] = l;
        for (int j = 0; j < l; j++) {
            snprintf(a, sizeof a, "down_blocks.%d.attentions.%d", i, j);
            t.down[i][j] = count_tblocks(p, a);
            if (t.down[i][j] && !attn_seen++) attn_facts(p, a, c);
        }
        c->nblocks++;
    }
    if (c->nblocks < 1) return sd_err_set(err, SD_EFORMAT, "%s: no UNet down_blocks resnets found", path);
    c->mid_attn = has(p, "mid_block.attentions.0.norm.weight");
    if (!c->mid_attn && has(p, "mid_block.resnets.0.norm1.weight"))
        return sd_err_set(err, SD_EUNSUPPORTED, "%s: a mid block without attention is not supported", path);
    t.mid = count_tblocks(p, "mid_block.attentions.0");
    for (int i = 0; i < c->nblocks; i++)
        for (int j = 0; j <= c->layers[c->nblocks - 1 - i]; j++) {
            snprintf(a, sizeof a, "up_blocks.%d.attentions.%d", i, j);
            t.up[i][j] = count_tblocks(p, a);
        }
    c->in_channels = dim_of(p, "conv_in.weight", 1, NULL);
    c->out_channels = dim_of(p, "conv_out.weight", 0, NULL);
    c->add_in_dim = dim_of(p, "add_embedding.linear_1.weight", 1, NULL);
    return settle_depths(&t, c, path, err);
}

/* Infer the whole config from shapes; norm groups (32), eps and the SDXL
 * size-embedding width (256) are not in the weights. */
static sd_status infer_config(const probe *p, sd_unet_config *c, int groups, sd_error *err, const char *path)
{
    sd_status rc = p->lay.use_alt ? infer_ldm(p, c, err, path) : infer_diffusers(p, c, err, path);
    if (rc) return rc;
    if (!c->cross_dim) c->cross_dim = 768;
    c->text_time = c->add_in_dim > 0;
    if (c->text_time) c->add_time_dim = 256;
    default_heads(c);
    if (groups > 0) c->groups = groups;
    return sd_unet_config_check(c, err);
}

/* ---- loading ------------------------------------------------------------- */

/* The names one file uses: diffusers (no prefix or unet.) or ldm
 * (model.diffusion_model. or none). */
static int detect_layout(const sd_safetensors *st, sd_weight_layout *lay, char *desc, size_t cap)
{
    static const struct {
        const char *prefix, *probe;
        int alt;
    } kinds[] = {{"", "conv_in.weight", 0},
                 {"unet.", "unet.conv_in.weight", 0},
                 {"model.diffusion_model.", "model.diffusion_model.input_blocks.0.0.weight", 1},
                 {"", "input_blocks.0.0.weight", 1}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        if (!sd_st_find(st, kinds[i].probe)) continue;
        lay->prefix = kinds[i].prefix;
        lay->use_alt = kinds[i].alt;
        snprintf(desc, cap, "%s%s%s", kinds[i].alt ? "ldm" : "diffusers", *kinds[i].prefix ? " prefix " : "",
                 kinds[i].prefix);
        return 1;
    }
    return 0;
}

/* Load weights and config from a folder or a file. */
sd_status sd_unet_load(sd_unet *u, const char *path, const sd_unet_opts *opts, sd_error *err)
{
    char weights[4096], config[4096];
    sd_unet_opts none = {0};
    if (!opts) opts = &none;
    static const char *const files[] = {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"};
    sd_status rc = sd_model_files(path, "unet", files, 2, opts->config_path, weights, config, sizeof weights, err);
    if (rc) return rc;

    sd_safetensors *st = NULL;
    rc = sd_st_open(&st, weights, err);
    if (rc) return rc;
    probe p = {.st = st};
    char desc[64];
    sd_unet_config cfg;
    sd_unet_config_default(&cfg);
    if (!detect_layout(st, &p.lay, desc, sizeof desc)) {
        sd_st_close(st);
        return sd_err_set(err, SD_EFORMAT,
                          "%s: no UNet in it (looked for conv_in.weight, unet.conv_in.weight and "
                          "[model.diffusion_model.]input_blocks.0.0.weight)",
                          weights);
    }
    rc = config[0] ? sd_unet_config_read(config, &cfg, err) : infer_config(&p, &cfg, opts->groups, err, weights);
    if (!rc) rc = sd_unet_build(u, &cfg, err);
    if (!rc) {
        rc = sd_weights_load(&u->w, st, &p.lay, weights, err);
        if (!rc) rc = sd_weights_check_unused(&u->w, st, &p.lay, weights, "UNet", err);
        if (rc) sd_unet_free(u);
        else snprintf(u->layout, sizeof u->layout, "%s", desc);
    }
    sd_st_close(st);
    return rc;
}

/* ---- saving -------------------------------------------------------------- */

/* Write every slot of params under its name in the chosen layout and dtype. */
sd_status sd_unet_save(const sd_unet *u, const float *params, const char *path, sd_unet_names names,
                       const char *prefix, int st_dtype, sd_error *err)
{
    const sd_weights *w = &u->w;
    size_t es = st_dtype == SD_ST_F32 ? 4 : 2;
    if (st_dtype != SD_ST_F32 && st_dtype != SD_ST_F16 && st_dtype != SD_ST_BF16)
        return sd_err_set(err, SD_EINVAL, "UNet save: dtype must be F32, F16 or BF16");
    sd_st_tensor *t = calloc(w->nslots ? w->nslots : 1, sizeof(*t));
    char *namebuf = malloc((w->nslots ? w->nslots : 1) * 2 * SD_WEIGHT_NAME_MAX);
    unsigned char *data = malloc((w->total ? w->total : 1) * es);
    sd_status rc = SD_OK;
    if (!t || !namebuf || !data) rc = sd_err_set(err, SD_ENOMEM, "out of memory saving the UNet");
    size_t at = 0;
    for (size_t i = 0; i < w->nslots && !rc; i++) {
        const sd_weight_slot *s = &w->slots[i];
        char *nm = namebuf + i * 2 * SD_WEIGHT_NAME_MAX;
        snprintf(nm, 2 * SD_WEIGHT_NAME_MAX, "%s%s", prefix ? prefix : "",
                 names == SD_UNET_NAMES_LDM && s->alt[0] ? s->alt : s->name);
        const float *src = params + s->off;
        unsigned char *dst = data + at;
        for (size_t j = 0; j < s->n; j++) {
            if (es == 4) memcpy(dst + 4 * j, &src[j], 4);
            else {
                uint16_t h = st_dtype == SD_ST_F16 ? sd_f32_to_f16(src[j]) : sd_f32_to_bf16(src[j]);
                memcpy(dst + 2 * j, &h, 2);
            }
        }
        t[i].name = nm;
        t[i].dtype = (sd_st_dtype)st_dtype;
        t[i].ndim = s->ndim;
        for (int k = 0; k < s->ndim; k++) t[i].shape[k] = (uint64_t)s->shape[k];
        t[i].nbytes = s->n * es;
        t[i].data = dst;
        at += s->n * es;
    }
    if (!rc) {
        sd_st_meta meta[1] = {{"format", "pt"}};
        rc = sd_st_write(path, t, w->nslots, meta, 1, err);
    }
    free(t);
    free(namebuf);
    free(data);
    return rc;
}
