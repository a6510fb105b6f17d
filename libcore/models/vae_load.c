/* The VAE encoder's layer table, its weight names in both layouts, its
 * config (config.json or inferred from shapes) and loading. */
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "json.h"
#include "model_dir.h"
#include "slurp.h"
#include "vae.h"

/* Registration state: the names of the current layer in both layouts. */
typedef struct {
    sd_vae *v;
    sd_error *err;
} reg;

/* One parameter known as d (diffusers) and l (ldm). */
static sd_status add(reg *r, const char *d, const char *l, int ndim, int a, int b, int c, int e, size_t *off)
{
    int shape[4] = {a, b, c, e};
    return sd_weights_add(&r->v->w, d, l, ndim, shape, off, r->err);
}

/* "prefix.suffix" in a small buffer, for names built from parts. */
static const char *cat(char *buf, const char *prefix, const char *suffix)
{
    snprintf(buf, SD_WEIGHT_NAME_MAX, "%s.%s", prefix, suffix);
    return buf;
}

/* A conv's weight [cout, cin, k, k] and bias. */
static sd_status add_conv(reg *r, sd_vae_conv *cv, const char *d, const char *l, int cin, int cout, int k)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    cv->cin = cin;
    cv->cout = cout;
    cv->k = k;
    sd_status rc = add(r, cat(a, d, "weight"), cat(b, l, "weight"), 4, cout, cin, k, k, &cv->w);
    if (!rc) rc = add(r, cat(a, d, "bias"), cat(b, l, "bias"), 1, cout, 0, 0, 0, &cv->b);
    return rc;
}

/* A group norm's gamma and beta. */
static sd_status add_norm(reg *r, sd_vae_norm *n, const char *d, const char *l, int c)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    sd_status rc = add(r, cat(a, d, "weight"), cat(b, l, "weight"), 1, c, 0, 0, 0, &n->g);
    if (!rc) rc = add(r, cat(a, d, "bias"), cat(b, l, "bias"), 1, c, 0, 0, 0, &n->b);
    return rc;
}

/* A linear's weight [out, in] and bias (ldm: a 1x1 conv, squeezed). */
static sd_status add_linear(reg *r, size_t *w, size_t *b, const char *d, const char *l, int c)
{
    char x[SD_WEIGHT_NAME_MAX], y[SD_WEIGHT_NAME_MAX];
    sd_status rc = add(r, cat(x, d, "weight"), cat(y, l, "weight"), 2, c, c, 0, 0, w);
    if (!rc) rc = add(r, cat(x, d, "bias"), cat(y, l, "bias"), 1, c, 0, 0, 0, b);
    return rc;
}

/* ResnetBlock2D: norm1, conv1, norm2, conv2, 1x1 shortcut when cin != cout
 * (diffusers conv_shortcut, ldm nin_shortcut). */
static sd_status add_resnet(reg *r, sd_vae_resnet *rs, const char *d, const char *l, int cin, int cout)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    rs->cin = cin;
    rs->cout = cout;
    rs->has_sc = cin != cout;
    sd_status rc = add_norm(r, &rs->n1, cat(a, d, "norm1"), cat(b, l, "norm1"), cin);
    if (!rc) rc = add_conv(r, &rs->c1, cat(a, d, "conv1"), cat(b, l, "conv1"), cin, cout, 3);
    if (!rc) rc = add_norm(r, &rs->n2, cat(a, d, "norm2"), cat(b, l, "norm2"), cout);
    if (!rc) rc = add_conv(r, &rs->c2, cat(a, d, "conv2"), cat(b, l, "conv2"), cout, cout, 3);
    if (!rc && rs->has_sc)
        rc = add_conv(r, &rs->sc, cat(a, d, "conv_shortcut"), cat(b, l, "nin_shortcut"), cin, cout, 1);
    return rc;
}

/* Check a config the forward pass can run. */
static sd_status check_config(const sd_vae_config *c, sd_error *err)
{
    if (c->nblocks < 1 || c->nblocks > SD_VAE_MAX_BLOCKS)
        return sd_err_set(err, SD_EUNSUPPORTED, "VAE with %d down blocks (1..%d supported)", c->nblocks,
                          SD_VAE_MAX_BLOCKS);
    if (c->layers_per_block < 1 || c->layers_per_block > SD_VAE_MAX_LAYERS)
        return sd_err_set(err, SD_EUNSUPPORTED, "VAE with %d layers per block (1..%d supported)",
                          c->layers_per_block, SD_VAE_MAX_LAYERS);
    if (c->in_channels < 1 || c->latent_channels < 1 || c->groups < 1)
        return sd_err_set(err, SD_EINVAL, "VAE config: bad channel or group count");
    for (int i = 0; i < c->nblocks; i++)
        if (c->block_out[i] < 1 || c->block_out[i] % c->groups)
            return sd_err_set(err, SD_EINVAL, "VAE config: %d channels not divisible by %d norm groups",
                              c->block_out[i], c->groups);
    return SD_OK;
}

/* Register every encoder parameter in the order diffusers lists them. */
sd_status sd_vae_build(sd_vae *v, const sd_vae_config *cfg, sd_error *err)
{
    sd_status rc = check_config(cfg, err);
    if (rc) return rc;
    memset(v, 0, sizeof(*v));
    v->cfg = *cfg;
    sd_weights_init(&v->w);
    reg r = {v, err};
    const int *bo = cfg->block_out;
    int nb = cfg->nblocks, top = bo[nb - 1];
    rc = add_conv(&r, &v->conv_in, "encoder.conv_in", "encoder.conv_in", cfg->in_channels, bo[0], 3);
    char d[SD_WEIGHT_NAME_MAX], l[SD_WEIGHT_NAME_MAX];
    int cin = bo[0];
    for (int i = 0; i < nb && !rc; i++) {
        for (int j = 0; j < cfg->layers_per_block && !rc; j++) {
            snprintf(d, sizeof d, "encoder.down_blocks.%d.resnets.%d", i, j);
            snprintf(l, sizeof l, "encoder.down.%d.block.%d", i, j);
            rc = add_resnet(&r, &v->res[i][j], d, l, cin, bo[i]);
            cin = bo[i];
        }
        if (!rc && i < nb - 1) {
            snprintf(d, sizeof d, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            snprintf(l, sizeof l, "encoder.down.%d.downsample.conv", i);
            rc = add_conv(&r, &v->down[i], d, l, bo[i], bo[i], 3);
        }
    }
    if (!rc) rc = add_resnet(&r, &v->mid[0], "encoder.mid_block.resnets.0", "encoder.mid.block_1", top, top);
    if (!rc && cfg->mid_attention) {
        const char *a = "encoder.mid_block.attentions.0", *b = "encoder.mid.attn_1";
        char x[SD_WEIGHT_NAME_MAX], y[SD_WEIGHT_NAME_MAX];
        sd_vae_attn *at = &v->attn;
        at->c = top;
        rc = add_norm(&r, &at->n, cat(x, a, "group_norm"), cat(y, b, "norm"), top);
        if (!rc) rc = add_linear(&r, &at->wq, &at->bq, cat(x, a, "to_q"), cat(y, b, "q"), top);
        if (!rc) rc = add_linear(&r, &at->wk, &at->bk, cat(x, a, "to_k"), cat(y, b, "k"), top);
        if (!rc) rc = add_linear(&r, &at->wv, &at->bv, cat(x, a, "to_v"), cat(y, b, "v"), top);
        if (!rc) rc = add_linear(&r, &at->wo, &at->bo, cat(x, a, "to_out.0"), cat(y, b, "proj_out"), top);
    }
    if (!rc) rc = add_resnet(&r, &v->mid[1], "encoder.mid_block.resnets.1", "encoder.mid.block_2", top, top);
    if (!rc) rc = add_norm(&r, &v->norm_out, "encoder.conv_norm_out", "encoder.norm_out", top);
    if (!rc) rc = add_conv(&r, &v->conv_out, "encoder.conv_out", "encoder.conv_out", top, 2 * cfg->latent_channels, 3);
    if (!rc && cfg->use_quant_conv)
        rc = add_conv(&r, &v->quant, "quant_conv", "quant_conv", 2 * cfg->latent_channels,
                      2 * cfg->latent_channels, 1);
    if (!rc) rc = sd_weights_alloc(&v->w, err);
    if (rc) sd_weights_free(&v->w);
    return rc;
}

/* Release the parameters. */
void sd_vae_free(sd_vae *v)
{
    sd_weights_free(&v->w);
}

/* Defaults every SD / SDXL VAE shares. */
static void default_config(sd_vae_config *c)
{
    memset(c, 0, sizeof(*c));
    c->in_channels = 3;
    c->latent_channels = 4;
    c->layers_per_block = 2;
    c->groups = 32;
    c->use_quant_conv = 1;
    c->mid_attention = 1;
    c->eps = 1e-6f;
    c->scaling_factor = 0.18215;
    snprintf(c->scale_source, sizeof c->scale_source, "default (SD 1.x/2.x)");
}

/* A boolean member; absent keeps *out. */
static sd_status cfg_bool(const sd_json *root, const char *key, int *out, const char *path, sd_error *err)
{
    const sd_json *m = sd_json_get(root, key);
    if (!m || m->type == SD_JSON_NULL) return SD_OK;
    if (m->type != SD_JSON_TRUE && m->type != SD_JSON_FALSE)
        return sd_err_set(err, SD_EFORMAT, "%s: %s must be true or false", path, key);
    *out = m->type == SD_JSON_TRUE;
    return SD_OK;
}

/* Read a diffusers AutoencoderKL config.json into c (keys it lacks keep
 * their defaults; unknown keys are ignored, as diffusers does). */
static sd_status read_config(const char *path, sd_vae_config *c, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 14);
    sd_status rc = sd_model_config_read(path, "AutoencoderKL", &text, &a, &root, err);
    const sd_json *bo = rc ? NULL : sd_json_get(root, "block_out_channels");
    if (!rc && bo) {
        if (bo->type != SD_JSON_ARRAY || bo->len < 1 || bo->len > SD_VAE_MAX_BLOCKS)
            rc = sd_err_set(err, SD_EFORMAT, "%s: block_out_channels must be a list of 1..%d numbers", path,
                            SD_VAE_MAX_BLOCKS);
        int i = 0;
        for (const sd_json *e = bo->child; e && !rc; e = e->next, i++) {
            double d;
            if (sd_json_whole(e, 1, 65536, &d))
                rc = sd_err_set(err, SD_EFORMAT, "%s: block_out_channels[%d] is not a channel count", path, i);
            else
                c->block_out[i] = (int)d;
        }
        if (!rc) c->nblocks = i;
    }
    if (!rc) rc = sd_model_config_int(root, "in_channels", 1e6, &c->in_channels, path, err);
    if (!rc) rc = sd_model_config_int(root, "latent_channels", 1e6, &c->latent_channels, path, err);
    if (!rc) rc = sd_model_config_int(root, "layers_per_block", 1e6, &c->layers_per_block, path, err);
    if (!rc) rc = sd_model_config_int(root, "norm_num_groups", 1e6, &c->groups, path, err);
    if (!rc) rc = cfg_bool(root, "use_quant_conv", &c->use_quant_conv, path, err);
    if (!rc) rc = cfg_bool(root, "mid_block_add_attention", &c->mid_attention, path, err);
    if (!rc) {
        const sd_json *sf = sd_json_get(root, "scaling_factor");
        double d;
        if (sf && sf->type != SD_JSON_NULL) {
            if (sd_json_num(sf, &d) || !(d > 0))
                rc = sd_err_set(err, SD_EFORMAT, "%s: scaling_factor must be a positive number", path);
            else {
                c->scaling_factor = d;
                snprintf(c->scale_source, sizeof c->scale_source, "config.json");
            }
        }
        const sd_json *sh = sd_json_get(root, "shift_factor");
        if (!rc && sh && sh->type != SD_JSON_NULL) {
            if (sd_json_num(sh, &d)) rc = sd_err_set(err, SD_EFORMAT, "%s: shift_factor must be a number", path);
            else c->shift_factor = d;
        }
    }
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* The names one file uses: which prefix, which layout. */
static int detect_layout(const sd_safetensors *st, sd_weight_layout *lay, char *desc, size_t cap)
{
    static const char *prefixes[] = {"", "first_stage_model.", "vae."};
    char name[160];
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) {
        snprintf(name, sizeof name, "%sencoder.conv_in.weight", prefixes[i]);
        if (!sd_st_find(st, name)) continue;
        lay->prefix = prefixes[i];
        snprintf(name, sizeof name, "%sencoder.down.0.block.0.norm1.weight", prefixes[i]);
        lay->use_alt = sd_st_find(st, name) != NULL;
        snprintf(desc, cap, "%s%s%s", lay->use_alt ? "ldm" : "diffusers", *prefixes[i] ? " prefix " : "",
                 prefixes[i]);
        return 1;
    }
    return 0;
}

/* Dimension d of the tensor prefix+name, or 0 when absent. */
static int dim_of(const sd_safetensors *st, const sd_weight_layout *lay, const char *name, int d)
{
    char full[160];
    snprintf(full, sizeof full, "%s%s", lay->prefix, name);
    const sd_st_tensor *t = sd_st_find(st, full);
    return t && t->ndim > d ? (int)t->shape[d] : 0;
}

/* Infer the architecture from weight shapes: blocks and their widths from
 * each block's first conv, layers from the resnets present, latent
 * channels from conv_out, attention and quant_conv from their presence.
 * Norm groups are not in the weights: 32 (every SD/SDXL VAE) unless given.
 * SDXL and SD VAEs share one architecture; the scaling factor is SDXL's
 * when the same file holds an SDXL conditioner, else SD's. */
static void infer_config(const sd_safetensors *st, const sd_weight_layout *lay, sd_vae_config *c)
{
    char n[160];
    int alt = lay->use_alt;
    c->in_channels = dim_of(st, lay, "encoder.conv_in.weight", 1);
    c->nblocks = 0;
    for (int i = 0; i < SD_VAE_MAX_BLOCKS; i++) {
        snprintf(n, sizeof n, alt ? "encoder.down.%d.block.0.conv1.weight" : "encoder.down_blocks.%d.resnets.0.conv1.weight",
                 i);
        int co = dim_of(st, lay, n, 0);
        if (!co) break;
        c->block_out[c->nblocks++] = co;
    }
    c->layers_per_block = 0;
    for (int j = 0; j < SD_VAE_MAX_LAYERS + 1; j++) {
        snprintf(n, sizeof n, alt ? "encoder.down.0.block.%d.conv1.weight" : "encoder.down_blocks.0.resnets.%d.conv1.weight",
                 j);
        if (!dim_of(st, lay, n, 0)) break;
        c->layers_per_block = j + 1;
    }
    c->latent_channels = dim_of(st, lay, "encoder.conv_out.weight", 0) / 2;
    c->use_quant_conv = dim_of(st, lay, "quant_conv.weight", 0) > 0;
    c->mid_attention = dim_of(st, lay, alt ? "encoder.mid.attn_1.norm.weight"
                                           : "encoder.mid_block.attentions.0.group_norm.weight", 0) > 0;
    for (size_t i = 0; i < sd_st_count(st); i++)
        if (strncmp(sd_st_tensor_at(st, i)->name, "conditioner.embedders.", 22) == 0) {
            c->scaling_factor = 0.13025;
            snprintf(c->scale_source, sizeof c->scale_source, "SDXL checkpoint");
            break;
        }
}

/* Diffusers folders saved before 0.14 (the hub's SD 1.x / 2.x vae/ and
 * sd-vae-ft-mse) name the mid-block attention's projections query, key,
 * value and proj_attn; diffusers renames each such tensor on load
 * (_convert_deprecated_attention_blocks: to_q, to_k, to_v, to_out.0;
 * group_norm kept). Point each of those slots at its old name when the
 * file has that and not the current one. */
static void use_deprecated_attn_names(sd_vae *v, const sd_safetensors *st, const sd_weight_layout *lay)
{
    static const struct {
        const char *now, *old;
    } ren[] = {{"to_q.", "query."}, {"to_k.", "key."}, {"to_v.", "value."}, {"to_out.0.", "proj_attn."}};
    static const char base[] = "encoder.mid_block.attentions.0.";
    char now[2 * SD_WEIGHT_NAME_MAX], old[2 * SD_WEIGHT_NAME_MAX];
    for (size_t i = 0; i < v->w.nslots; i++) {
        sd_weight_slot *s = &v->w.slots[i];
        if (strncmp(s->name, base, sizeof base - 1) != 0) continue;
        const char *rest = s->name + sizeof base - 1;
        for (size_t k = 0; k < sizeof ren / sizeof *ren; k++) {
            size_t n = strlen(ren[k].now);
            if (strncmp(rest, ren[k].now, n) != 0) continue;
            snprintf(now, sizeof now, "%s%s", lay->prefix, s->name);
            snprintf(old, sizeof old, "%s%s%s%s", lay->prefix, base, ren[k].old, rest + n);
            if (!sd_st_find(st, now) && sd_st_find(st, old))
                snprintf(s->name, sizeof s->name, "%s", old + strlen(lay->prefix));
        }
    }
}

/* Load the encoder from a folder or a file, config from config.json
 * (folder's, or opts->config_path) or inferred from the weights. */
sd_status sd_vae_load(sd_vae *v, const char *path, const sd_vae_opts *opts, sd_error *err)
{
    char weights[4096], config[4096];
    sd_vae_opts none = {0};
    if (!opts) opts = &none;
    static const char *const files[] = {"diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"};
    sd_status rc = sd_model_files(path, "vae", files, 2, opts->config_path, weights, config, sizeof weights, err);
    if (rc) return rc;

    sd_safetensors *st = NULL;
    rc = sd_st_open(&st, weights, err);
    if (rc) return rc;
    sd_weight_layout lay;
    char desc[64];
    sd_vae_config cfg;
    default_config(&cfg);
    if (!detect_layout(st, &lay, desc, sizeof desc)) {
        sd_st_close(st);
        return sd_err_set(err, SD_EFORMAT,
                          "%s: no VAE encoder in it (looked for encoder.conv_in.weight, with no prefix, "
                          "first_stage_model. or vae.)",
                          weights);
    }
    if (config[0]) rc = read_config(config, &cfg, err);
    else {
        infer_config(st, &lay, &cfg);
        if (opts->groups > 0) cfg.groups = opts->groups;
    }
    if (!rc && opts->scaling_factor > 0) {
        cfg.scaling_factor = opts->scaling_factor;
        snprintf(cfg.scale_source, sizeof cfg.scale_source, "command line");
    }
    if (!rc) rc = sd_vae_build(v, &cfg, err);
    if (!rc) {
        if (!lay.use_alt) use_deprecated_attn_names(v, st, &lay);
        rc = sd_weights_load(&v->w, st, &lay, weights, err);
        if (rc) sd_vae_free(v);
        else snprintf(v->layout, sizeof v->layout, "%s", desc);
    }
    sd_st_close(st);
    return rc;
}
