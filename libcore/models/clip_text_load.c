/* The CLIP text encoder's layer table, its weight names in the transformers
 * and OpenCLIP layouts, its config (config.json or inferred from shapes),
 * loading, and the output each SD variant uses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "clip_text.h"
#include "json.h"
#include "model_dir.h"
#include "slurp.h"

/* The slot name of the fused q|k|v projection in the transformers layout,
 * which stores q_proj, k_proj and v_proj separately; the loader joins them. */
static const char qkv_tag[] = ".qkv_proj.";
static const char proj_name[] = "text_projection.weight";

/* Registration state. */
typedef struct {
    sd_clip_text *m;
    sd_error *err;
} reg;

/* One parameter known as hf (transformers, relative to text_model.) and oc
 * (OpenCLIP, relative to the model prefix). */
static sd_status add(reg *r, const char *hf, const char *oc, int ndim, int a, int b, size_t *off)
{
    int shape[2] = {a, b};
    return sd_weights_add(&r->m->w, hf, oc, ndim, shape, off, r->err);
}

/* A layer norm's gamma and beta under hf.{weight,bias} / oc.{weight,bias}. */
static sd_status add_norm(reg *r, sd_clip_norm *n, const char *hf, const char *oc, int c)
{
    char a[SD_WEIGHT_NAME_MAX], b[SD_WEIGHT_NAME_MAX];
    snprintf(a, sizeof a, "%s.weight", hf);
    snprintf(b, sizeof b, "%s.weight", oc);
    sd_status rc = add(r, a, b, 1, c, 0, &n->g);
    snprintf(a, sizeof a, "%s.bias", hf);
    snprintf(b, sizeof b, "%s.bias", oc);
    return rc ? rc : add(r, a, b, 1, c, 0, &n->b);
}

/* A linear's weight [out, in] and bias [out]; OpenCLIP's fused attention
 * projection names them in_proj_weight / in_proj_bias, hence two oc names. */
static sd_status add_linear(reg *r, size_t *w, size_t *b, const char *hf, const char *ocw, const char *ocb, int out,
                            int in)
{
    char a[SD_WEIGHT_NAME_MAX];
    snprintf(a, sizeof a, "%s.weight", hf);
    sd_status rc = add(r, a, ocw, 2, out, in, w);
    snprintf(a, sizeof a, "%s.bias", hf);
    return rc ? rc : add(r, a, ocb, 1, out, 0, b);
}

/* One encoder layer's parameters in the order transformers lists them. */
static sd_status add_layer(reg *r, sd_clip_layer *L, int i, const sd_clip_text_config *c)
{
    char hf[SD_WEIGHT_NAME_MAX], oc[SD_WEIGHT_NAME_MAX], ocw[SD_WEIGHT_NAME_MAX], ocb[SD_WEIGHT_NAME_MAX];
    int W = c->width;
    snprintf(hf, sizeof hf, "encoder.layers.%d.self_attn.qkv_proj", i);
    snprintf(ocw, sizeof ocw, "transformer.resblocks.%d.attn.in_proj_weight", i);
    snprintf(ocb, sizeof ocb, "transformer.resblocks.%d.attn.in_proj_bias", i);
    sd_status rc = add_linear(r, &L->wqkv, &L->bqkv, hf, ocw, ocb, 3 * W, W);
    snprintf(hf, sizeof hf, "encoder.layers.%d.self_attn.out_proj", i);
    snprintf(ocw, sizeof ocw, "transformer.resblocks.%d.attn.out_proj.weight", i);
    snprintf(ocb, sizeof ocb, "transformer.resblocks.%d.attn.out_proj.bias", i);
    if (!rc) rc = add_linear(r, &L->wo, &L->bo, hf, ocw, ocb, W, W);
    snprintf(hf, sizeof hf, "encoder.layers.%d.layer_norm1", i);
    snprintf(oc, sizeof oc, "transformer.resblocks.%d.ln_1", i);
    if (!rc) rc = add_norm(r, &L->ln1, hf, oc, W);
    snprintf(hf, sizeof hf, "encoder.layers.%d.mlp.fc1", i);
    snprintf(ocw, sizeof ocw, "transformer.resblocks.%d.mlp.c_fc.weight", i);
    snprintf(ocb, sizeof ocb, "transformer.resblocks.%d.mlp.c_fc.bias", i);
    if (!rc) rc = add_linear(r, &L->w1, &L->b1, hf, ocw, ocb, c->mlp, W);
    snprintf(hf, sizeof hf, "encoder.layers.%d.mlp.fc2", i);
    snprintf(ocw, sizeof ocw, "transformer.resblocks.%d.mlp.c_proj.weight", i);
    snprintf(ocb, sizeof ocb, "transformer.resblocks.%d.mlp.c_proj.bias", i);
    if (!rc) rc = add_linear(r, &L->w2, &L->b2, hf, ocw, ocb, W, c->mlp);
    snprintf(hf, sizeof hf, "encoder.layers.%d.layer_norm2", i);
    snprintf(oc, sizeof oc, "transformer.resblocks.%d.ln_2", i);
    if (!rc) rc = add_norm(r, &L->ln2, hf, oc, W);
    return rc;
}

/* Check a config the forward pass can run. */
static sd_status check_config(const sd_clip_text_config *c, sd_error *err)
{
    if (c->layers < 1 || c->layers > SD_CLIP_MAX_LAYERS)
        return sd_err_set(err, SD_EUNSUPPORTED, "CLIP text encoder with %d layers (1..%d supported)", c->layers,
                          SD_CLIP_MAX_LAYERS);
    if (c->vocab < 1 || c->positions < 1 || c->width < 1 || c->mlp < 1 || c->proj < 0)
        return sd_err_set(err, SD_EINVAL, "CLIP text config: vocab, positions, width and mlp must be positive");
    if (c->heads < 1 || c->width % c->heads)
        return sd_err_set(err, SD_EINVAL, "CLIP text config: width %d is not divisible by %d heads", c->width,
                          c->heads);
    if (c->act != SD_CLIP_QUICK_GELU && c->act != SD_CLIP_GELU)
        return sd_err_set(err, SD_EUNSUPPORTED, "CLIP text config: activation must be quick_gelu or gelu");
    if (!(c->eps > 0.0f)) return sd_err_set(err, SD_EINVAL, "CLIP text config: layer_norm_eps must be positive");
    return SD_OK;
}

/* Register every parameter: embeddings, layers, final norm, projection. */
sd_status sd_clip_text_build(sd_clip_text *m, const sd_clip_text_config *cfg, sd_error *err)
{
    sd_status rc = check_config(cfg, err);
    if (rc) return rc;
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    sd_weights_init(&m->w);
    reg r = {m, err};
    rc = add(&r, "embeddings.token_embedding.weight", "token_embedding.weight", 2, cfg->vocab, cfg->width, &m->tok);
    if (!rc)
        rc = add(&r, "embeddings.position_embedding.weight", "positional_embedding", 2, cfg->positions, cfg->width,
                 &m->pos);
    for (int i = 0; i < cfg->layers && !rc; i++) rc = add_layer(&r, &m->layer[i], i, cfg);
    if (!rc) rc = add_norm(&r, &m->final_ln, "final_layer_norm", "ln_final", cfg->width);
    if (!rc && cfg->proj) rc = add(&r, proj_name, "text_projection", 2, cfg->proj, cfg->width, &m->proj_w);
    if (!rc) rc = sd_weights_alloc(&m->w, err);
    if (rc) sd_weights_free(&m->w);
    return rc;
}

/* Release the parameters. */
void sd_clip_text_free(sd_clip_text *m)
{
    sd_weights_free(&m->w);
    free(m->half);
    m->half = NULL;
    m->half_total = 0;
    m->wdtype = 0;
}

/* Where one text encoder sits in a file: the prefix of its names, the
 * prefix text_projection hangs under (transformers keeps it outside
 * text_model), the layout, and which encoder of a model it is (-1: a
 * standalone file, whichever was asked for). */
typedef struct {
    const char *prefix, *outer;
    int openclip, which;
} layout;

static const layout layouts[] = {
    {"text_model.", "", 0, -1},
    {"", "", 0, -1}, /* transformers 5 saves CLIPTextModel without text_model. */
    {"cond_stage_model.transformer.text_model.", "cond_stage_model.transformer.", 0, 0},
    {"cond_stage_model.transformer.", "cond_stage_model.transformer.", 0, 0},
    {"conditioner.embedders.0.transformer.text_model.", "conditioner.embedders.0.transformer.", 0, 0},
    {"cond_stage_model.model.", "cond_stage_model.model.", 1, 0},
    {"conditioner.embedders.1.model.", "conditioner.embedders.1.model.", 1, 1},
    {"", "", 1, -1},
};

/* The tensor prefix+name, or NULL. */
static const sd_st_tensor *find2(const sd_safetensors *st, const char *prefix, const char *name)
{
    char full[2 * SD_WEIGHT_NAME_MAX];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return sd_st_find(st, full);
}

/* Does the single-file checkpoint at path hold a second (SDXL) text
 * encoder under its own names? A standalone encoder file matches any
 * `which` when loading, so it cannot tell; only conditioner.embedders.1.*
 * does. */
sd_status sd_clip_text_file_has_second(const char *path, int *yes, sd_error *err)
{
    *yes = 0;
    sd_safetensors *st = NULL;
    sd_status rc = sd_st_open(&st, path, err);
    if (rc) return rc;
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts && !*yes; i++)
        if (layouts[i].which == 1 && find2(st, layouts[i].prefix, "token_embedding.weight")) *yes = 1;
    sd_st_close(st);
    return SD_OK;
}

/* The first layout whose token embedding the file holds for encoder
 * `which`; NULL when there is none. */
static const layout *detect_layout(const sd_safetensors *st, int which)
{
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        const layout *l = &layouts[i];
        if (l->which >= 0 && l->which != which) continue;
        if (find2(st, l->prefix, l->openclip ? "token_embedding.weight" : "embeddings.token_embedding.weight"))
            return l;
    }
    return NULL;
}

/* Dimension d of prefix+name, or 0 when absent or lower-dimensional. */
static int dim_of(const sd_safetensors *st, const char *prefix, const char *name, int d)
{
    const sd_st_tensor *t = find2(st, prefix, name);
    return t && t->ndim > d && t->shape[d] < (1u << 30) ? (int)t->shape[d] : 0;
}

/* Infer the architecture from weight shapes: vocabulary and width from the
 * token embedding, positions, layers (counted), MLP width, projection from
 * its presence. Not in the weights: heads (width / 64, every SD encoder's
 * head size, unless given), the activation (OpenCLIP: gelu; transformers
 * layout: quick_gelu, OpenAI's CLIP-L, unless the width is ViT-H's 1024 or
 * bigG's 1280, which SD only uses with gelu), eps 1e-5, and the pooling
 * rule (argmax of the ids, as OpenCLIP and every SD config do). */
static sd_status infer_config(const sd_safetensors *st, const layout *l, const sd_clip_text_opts *o,
                              sd_clip_text_config *c, const char *path, sd_error *err)
{
    const char *p = l->prefix;
    char n[SD_WEIGHT_NAME_MAX];
    memset(c, 0, sizeof(*c));
    const char *tok = l->openclip ? "token_embedding.weight" : "embeddings.token_embedding.weight";
    c->vocab = dim_of(st, p, tok, 0);
    c->width = dim_of(st, p, tok, 1);
    c->positions = dim_of(st, p, l->openclip ? "positional_embedding" : "embeddings.position_embedding.weight", 0);
    for (c->layers = 0; c->layers < SD_CLIP_MAX_LAYERS + 1; c->layers++) {
        snprintf(n, sizeof n, l->openclip ? "transformer.resblocks.%d.ln_1.weight" : "encoder.layers.%d.layer_norm1.weight",
                 c->layers);
        if (!find2(st, p, n)) break;
    }
    c->mlp = dim_of(st, p, l->openclip ? "transformer.resblocks.0.mlp.c_fc.weight" : "encoder.layers.0.mlp.fc1.weight",
                    0);
    c->proj = l->openclip ? dim_of(st, p, "text_projection", 1) : dim_of(st, l->outer, proj_name, 0);
    if (o->heads > 0) c->heads = o->heads;
    else if (c->width % 64 == 0) c->heads = c->width / 64;
    else
        return sd_err_set(err, SD_EINVAL, "%s: width %d is not a multiple of 64; give the number of heads", path,
                          c->width);
    if (o->act) c->act = o->act;
    else c->act = l->openclip || c->width == 1024 || c->width == 1280 ? SD_CLIP_GELU : SD_CLIP_QUICK_GELU;
    c->eps = 1e-5f;
    c->eos_id = SD_CLIP_LEGACY_EOS;
    snprintf(c->source, sizeof c->source, "inferred");
    return SD_OK;
}

/* Whether the config's "architectures" list names the projection model. */
static int has_projection_arch(const sd_json *root)
{
    const sd_json *a = sd_json_get(root, "architectures");
    if (!a || a->type != SD_JSON_ARRAY) return 0;
    for (const sd_json *e = a->child; e; e = e->next)
        if (e->type == SD_JSON_STRING && strcmp(e->str, "CLIPTextModelWithProjection") == 0) return 1;
    return 0;
}

/* Read a transformers CLIPTextConfig (or a CLIPConfig's text_config) into c,
 * starting from transformers' defaults; unknown keys are ignored. */
static sd_status read_config(const char *path, sd_clip_text_config *c, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 14);
    *c = (sd_clip_text_config){.vocab = 49408, .positions = 77, .width = 512, .layers = 12, .heads = 8,
                               .mlp = 2048, .act = SD_CLIP_QUICK_GELU, .eps = 1e-5f, .eos_id = 49407};
    snprintf(c->source, sizeof c->source, "config.json");
    sd_status rc = sd_model_config_read(path, NULL, &text, &a, &root, err);
    const sd_json *tc = rc ? NULL : sd_json_get(root, "text_config");
    const sd_json *obj = tc && tc->type == SD_JSON_OBJECT ? tc : root;
    int proj = 512;
    if (!rc) rc = sd_model_config_int(obj, "vocab_size", 1e8, &c->vocab, path, err);
    if (!rc) rc = sd_model_config_int(obj, "max_position_embeddings", 1e8, &c->positions, path, err);
    if (!rc) rc = sd_model_config_int(obj, "hidden_size", 1e8, &c->width, path, err);
    if (!rc) rc = sd_model_config_int(obj, "num_hidden_layers", 1e8, &c->layers, path, err);
    if (!rc) rc = sd_model_config_int(obj, "num_attention_heads", 1e8, &c->heads, path, err);
    if (!rc) rc = sd_model_config_int(obj, "intermediate_size", 1e8, &c->mlp, path, err);
    if (!rc) rc = sd_model_config_int(obj, "eos_token_id", 1e8, &c->eos_id, path, err);
    if (!rc) rc = sd_model_config_int(obj, "projection_dim", 1e8, &proj, path, err);
    if (!rc && obj != root) rc = sd_model_config_int(root, "projection_dim", 1e8, &proj, path, err);
    if (!rc && has_projection_arch(root)) c->proj = proj;
    const sd_json *act = rc ? NULL : sd_json_get(obj, "hidden_act");
    if (act && act->type == SD_JSON_STRING) {
        if (strcmp(act->str, "quick_gelu") == 0) c->act = SD_CLIP_QUICK_GELU;
        else if (strcmp(act->str, "gelu") == 0) c->act = SD_CLIP_GELU;
        else rc = sd_err_set(err, SD_EUNSUPPORTED, "%s: hidden_act %s (quick_gelu or gelu supported)", path, act->str);
    } else if (act && act->type != SD_JSON_NULL) {
        rc = sd_err_set(err, SD_EFORMAT, "%s: hidden_act must be a string", path);
    }
    const sd_json *eps = rc ? NULL : sd_json_get(obj, "layer_norm_eps");
    double d;
    if (eps && eps->type != SD_JSON_NULL) {
        if (sd_json_num(eps, &d) || !(d > 0)) rc = sd_err_set(err, SD_EFORMAT, "%s: layer_norm_eps must be positive", path);
        else c->eps = (float)d;
    }
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* Copy one tensor (prefix+name) into dst with the given shape. */
static sd_status copy_named(float *dst, int ndim, const int *shape, const sd_safetensors *st, const char *prefix,
                            const char *name, const char *path, sd_error *err)
{
    const sd_st_tensor *t = find2(st, prefix, name);
    if (!t) return sd_err_set(err, SD_ENOTFOUND, "%s: no tensor %s%s (model needs it)", path, prefix, name);
    return sd_weights_copy_tensor(dst, ndim, shape, t, path, err);
}

/* The transformers layout's q_proj, k_proj and v_proj (weight or bias) into
 * the thirds of a fused slot. */
static sd_status load_qkv(float *dst, const sd_weight_slot *s, const sd_safetensors *st, const layout *l,
                          const char *path, sd_error *err)
{
    static const char *parts[3] = {".q_proj.", ".k_proj.", ".v_proj."};
    const char *tag = strstr(s->name, qkv_tag);
    int shape[2] = {s->shape[0] / 3, s->ndim > 1 ? s->shape[1] : 0};
    for (int i = 0; i < 3; i++) {
        char n[SD_WEIGHT_NAME_MAX];
        snprintf(n, sizeof n, "%.*s%s%s", (int)(tag - s->name), s->name, parts[i], tag + strlen(qkv_tag));
        sd_status rc = copy_named(dst + (size_t)i * (s->n / 3), s->ndim, shape, st, l->prefix, n, path, err);
        if (rc) return rc;
    }
    return SD_OK;
}

/* OpenCLIP's text_projection [width, proj] (used as x @ P) transposed into
 * the slot's transformers layout [proj, width]. */
static sd_status load_projection_t(float *dst, const sd_weight_slot *s, const sd_safetensors *st, const layout *l,
                                   const char *path, sd_error *err)
{
    int P = s->shape[0], W = s->shape[1], shape[2] = {W, P};
    float *tmp = malloc(s->n * sizeof(float));
    if (!tmp) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status rc = copy_named(tmp, 2, shape, st, l->prefix, s->alt, path, err);
    if (!rc)
        for (int w = 0; w < W; w++)
            for (int p = 0; p < P; p++) dst[(size_t)p * (size_t)W + (size_t)w] = tmp[(size_t)w * (size_t)P + (size_t)p];
    free(tmp);
    return rc;
}

/* Fill every slot from st under layout l; the error names the first missing
 * or mismatched tensor and the file. */
static sd_status load_weights(sd_clip_text *m, const sd_safetensors *st, const layout *l, const char *path,
                              sd_error *err)
{
    for (size_t i = 0; i < m->w.nslots; i++) {
        sd_weight_slot *s = &m->w.slots[i];
        float *dst = m->w.data + s->off;
        int is_proj = strcmp(s->name, proj_name) == 0;
        sd_status rc;
        if (l->openclip) {
            rc = is_proj ? load_projection_t(dst, s, st, l, path, err)
                         : copy_named(dst, s->ndim, s->shape, st, l->prefix, s->alt, path, err);
        } else if (is_proj) {
            rc = copy_named(dst, s->ndim, s->shape, st, l->outer, s->name, path, err);
        } else if (strstr(s->name, qkv_tag)) {
            rc = load_qkv(dst, s, st, l, path, err);
        } else {
            rc = copy_named(dst, s->ndim, s->shape, st, l->prefix, s->name, path, err);
        }
        if (rc) return rc;
        s->loaded = 1;
    }
    return SD_OK;
}

/* Load one text encoder from a folder or a file, config from config.json
 * (the folder's, or opts->config_path) or inferred from the weights. */
sd_status sd_clip_text_load(sd_clip_text *m, const char *path, const sd_clip_text_opts *opts, sd_error *err)
{
    char weights[4096], config[4096];
    sd_clip_text_opts none = {0};
    if (!opts) opts = &none;
    if (opts->which < 0 || opts->which > 1)
        return sd_err_set(err, SD_EINVAL, "text encoder %d: only 0 (first) and 1 (second) exist", opts->which);
    static const char *const files[] = {"model.safetensors", "model.fp16.safetensors"};
    sd_status rc = sd_model_files(path, opts->which ? "text_encoder_2" : "text_encoder", files, 2, opts->config_path,
                                  weights, config, sizeof weights, err);
    if (rc) return rc;

    sd_safetensors *st = NULL;
    rc = sd_st_open(&st, weights, err);
    if (rc) return rc;
    const layout *l = detect_layout(st, opts->which);
    if (!l) {
        sd_st_close(st);
        if (opts->which)
            return sd_err_set(err, SD_EFORMAT,
                              "%s: no second text encoder in it (looked for conditioner.embedders.1.model.*, or a "
                              "standalone encoder's text_model.* / token_embedding.weight)",
                              weights);
        return sd_err_set(err, SD_EFORMAT,
                          "%s: no CLIP text encoder in it (looked for [text_model.]embeddings.*, cond_stage_model.transformer.*, "
                          "cond_stage_model.model.*, conditioner.embedders.0.transformer.*)",
                          weights);
    }
    sd_clip_text_config cfg;
    rc = config[0] ? read_config(config, &cfg, err) : infer_config(st, l, opts, &cfg, weights, err);
    if (!rc) rc = sd_clip_text_build(m, &cfg, err);
    if (!rc) {
        rc = load_weights(m, st, l, weights, err);
        if (rc) sd_clip_text_free(m);
        else {
            m->openclip = l->openclip;
            snprintf(m->layout, sizeof m->layout, "%s%s%s", l->openclip ? "OpenCLIP" : "transformers",
                     *l->prefix ? " prefix " : "", l->prefix);
        }
    }
    sd_st_close(st);
    return rc;
}

/* The layer and final-LN choice of each SD variant (see clip_text.h). */
sd_status sd_clip_text_preset(const sd_clip_text *m, sd_clip_variant v, int extra_skip, sd_clip_text_out *out,
                              sd_error *err)
{
    int base;
    switch (v) {
    case SD_CLIP_SD1: base = 0; out->final_ln = 1; break;
    case SD_CLIP_SD2: base = m->openclip ? 1 : 0; out->final_ln = 1; break;
    case SD_CLIP_SDXL_L:
    case SD_CLIP_SDXL_G: base = 1; out->final_ln = 0; break;
    default: return sd_err_set(err, SD_EINVAL, "unknown SD variant %d", (int)v);
    }
    if (extra_skip < 0 || base + extra_skip >= m->cfg.layers)
        return sd_err_set(err, SD_EINVAL, "clip skip %d leaves no layer of %d", extra_skip, m->cfg.layers);
    out->skip = base + extra_skip;
    return SD_OK;
}
