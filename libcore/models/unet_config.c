/* The UNet's config: diffusers' defaults, the check that the graph can run
 * it, and its config.json read, written and compared field by field. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "dtoa.h"
#include "json.h"
#include "model_dir.h"
#include "outfile.h"
#include "slurp.h"
#include "unet.h"

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

/* Every key of a parsed config over c's values; name (a path, or a file
 * and the metadata key) goes into the messages. */
static sd_status config_from_root(const sd_json *root, const char *name, sd_unet_config *c, sd_error *err)
{
    cfgr r = {root, name, err};
    sd_status rc = check_defaults(&r);
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
            rc = sd_err_set(err, SD_EUNSUPPORTED, "%s: addition_embed_type %s (text_time or null supported)", name,
                            s ? s : "is not a string");
        c->text_time = 1;
        if (!rc) rc = get_int(&r, "addition_time_embed_dim", 2, 1 << 16, &c->add_time_dim);
        if (!rc) rc = get_int(&r, "projection_class_embeddings_input_dim", 1, 1 << 20, &c->add_in_dim);
    }
    if (!rc) rc = sd_unet_config_check(c, err);
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
    sd_status rc = sd_model_config_read(path, "UNet2DConditionModel", &text, &a, &root, err);
    if (!rc) rc = config_from_root(root, path, c, err);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* The same from config.json's text held elsewhere (a single file's
 * safetensors metadata); name says where in messages. */
sd_status sd_unet_config_parse(const char *json, size_t len, const char *name, sd_unet_config *c, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 14);
    sd_buf_put(&text, json, len);
    sd_status rc = text.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : SD_OK;
    if (!rc) rc = sd_json_parse(&a, text.data, text.len, &root, err);
    if (rc == SD_EPARSE) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = sd_err_set(err, SD_EPARSE, "%s: %s", name, why);
    }
    const sd_json *cls = rc ? NULL : sd_json_get(root, "_class_name");
    const char *s = cls ? sd_json_str(cls) : NULL;
    if (!rc && root->type != SD_JSON_OBJECT) rc = sd_err_set(err, SD_EFORMAT, "%s: not a JSON object", name);
    else if (!rc && (!s || strcmp(s, "UNet2DConditionModel") != 0))
        rc = sd_err_set(err, SD_EUNSUPPORTED, "%s: _class_name %s, expected UNet2DConditionModel", name,
                        s ? s : "missing or not a string");
    if (!rc) rc = config_from_root(root, name, c, err);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* The next member's key as Python's json.dumps(indent=2) puts it: a comma
 * after the previous member, a new line, two spaces. */
static void key(sd_buf *b, int *first, const char *k)
{
    sd_buf_puts(b, *first ? "\n  " : ",\n  ");
    *first = 0;
    sd_buf_json_cstr(b, k);
    sd_buf_puts(b, ": ");
}

/* A member whose value is JSON text written as is. */
static void put_raw(sd_buf *b, int *first, const char *k, const char *json)
{
    key(b, first, k);
    sd_buf_puts(b, json);
}

/* An integer member, or null when !present. */
static void put_int(sd_buf *b, int *first, const char *k, int v, int present)
{
    key(b, first, k);
    if (present) sd_buf_json_int(b, v);
    else sd_buf_puts(b, "null");
}

/* A number member as Python prints the float it was given (1e-05). */
static void put_float(sd_buf *b, int *first, const char *k, float v)
{
    key(b, first, k);
    sd_buf_json_num(b, sd_f32_shortest(v));
}

/* A list of n ints, one per line, as json.dumps(indent=2) writes it. */
static void put_ints(sd_buf *b, int *first, const char *k, const int *v, int n)
{
    key(b, first, k);
    sd_buf_putc(b, '[');
    for (int i = 0; i < n; i++) sd_buf_printf(b, "%s\n    %d", i ? "," : "", v[i]);
    sd_buf_puts(b, "\n  ]");
}

/* A list of block type names, attention ones where flag[i]. */
static void put_types(sd_buf *b, int *first, const char *k, const int *flag, int n, const char *with,
                      const char *without)
{
    key(b, first, k);
    sd_buf_putc(b, '[');
    for (int i = 0; i < n; i++) {
        sd_buf_puts(b, i ? ",\n    " : "\n    ");
        sd_buf_json_cstr(b, flag[i] ? with : without);
    }
    sd_buf_puts(b, "\n  ]");
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

/* The diffusers release whose UNet2DConditionModel.save_config output
 * sd_unet_config_json reproduces key for key (tests/golden/unet_config/,
 * made with it); diffusers reads the version to adapt older configs. */
static const char diffusers_version[] = "0.42.1";

/* The config as diffusers' save_config writes config.json: every key of
 * UNet2DConditionModel, sorted, indented by two, floats as Python prints
 * them; the options sdtk does not model keep diffusers' defaults. */
void sd_unet_config_json(const sd_unet_config *c, sd_buf *b)
{
    int f = 1, n = c->nblocks, tt = c->text_time;
    sd_buf_putc(b, '{');
    put_raw(b, &f, "_class_name", "\"UNet2DConditionModel\"");
    key(b, &f, "_diffusers_version");
    sd_buf_json_cstr(b, diffusers_version);
    put_raw(b, &f, "act_fn", "\"silu\"");
    put_raw(b, &f, "addition_embed_type", tt ? "\"text_time\"" : "null");
    put_int(b, &f, "addition_embed_type_num_heads", 64, 1);
    put_int(b, &f, "addition_time_embed_dim", c->add_time_dim, tt);
    put_ints(b, &f, "attention_head_dim", c->heads, n);
    put_raw(b, &f, "attention_type", "\"default\"");
    put_ints(b, &f, "block_out_channels", c->block_out, n);
    put_raw(b, &f, "center_input_sample", "false");
    put_raw(b, &f, "class_embed_type", "null");
    put_raw(b, &f, "class_embeddings_concat", "false");
    put_int(b, &f, "conv_in_kernel", 3, 1);
    put_int(b, &f, "conv_out_kernel", 3, 1);
    put_int(b, &f, "cross_attention_dim", c->cross_dim, 1);
    put_raw(b, &f, "cross_attention_norm", "null");
    put_types(b, &f, "down_block_types", c->down_attn, n, "CrossAttnDownBlock2D", "DownBlock2D");
    put_int(b, &f, "downsample_padding", c->down_pad, 1);
    put_raw(b, &f, "dropout", "0.0");
    put_raw(b, &f, "dual_cross_attention", "false");
    put_raw(b, &f, "encoder_hid_dim", "null");
    put_raw(b, &f, "encoder_hid_dim_type", "null");
    put_raw(b, &f, "flip_sin_to_cos", c->flip_sin_to_cos ? "true" : "false");
    put_float(b, &f, "freq_shift", c->freq_shift);
    put_int(b, &f, "in_channels", c->in_channels, 1);
    put_ints(b, &f, "layers_per_block", c->layers, n);
    put_raw(b, &f, "mid_block_only_cross_attention", "null");
    put_int(b, &f, "mid_block_scale_factor", 1, 1);
    put_raw(b, &f, "mid_block_type", c->mid_attn ? "\"UNetMidBlock2DCrossAttn\"" : "null");
    put_float(b, &f, "norm_eps", c->eps);
    put_int(b, &f, "norm_num_groups", c->groups, 1);
    put_raw(b, &f, "num_attention_heads", "null");
    put_raw(b, &f, "num_class_embeds", "null");
    put_raw(b, &f, "only_cross_attention", "false");
    put_int(b, &f, "out_channels", c->out_channels, 1);
    put_int(b, &f, "projection_class_embeddings_input_dim", c->add_in_dim, tt);
    put_raw(b, &f, "resnet_out_scale_factor", "1.0");
    put_raw(b, &f, "resnet_skip_time_act", "false");
    put_raw(b, &f, "resnet_time_scale_shift", "\"default\"");
    put_raw(b, &f, "reverse_transformer_layers_per_block", "null");
    put_int(b, &f, "sample_size", c->sample_size, c->sample_size > 0);
    put_raw(b, &f, "time_cond_proj_dim", "null");
    put_raw(b, &f, "time_embedding_act_fn", "null");
    put_raw(b, &f, "time_embedding_dim", "null");
    put_raw(b, &f, "time_embedding_type", "\"positional\"");
    put_raw(b, &f, "timestep_post_act", "null");
    put_ints(b, &f, "transformer_layers_per_block", c->depth, n);
    put_types(b, &f, "up_block_types", c->up_attn, n, "CrossAttnUpBlock2D", "UpBlock2D");
    put_raw(b, &f, "upcast_attention", c->upcast_attention ? "true" : "false");
    put_raw(b, &f, "use_linear_projection", c->linear_proj ? "true" : "false");
    sd_buf_puts(b, "\n}\n");
}

/* Write that config.json atomically. */
sd_status sd_unet_config_write(const sd_unet_config *c, const char *path, sd_error *err)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_unet_config_json(c, &b);
    sd_status rc = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(path, b.data, b.len, err);
    sd_buf_free(&b);
    return rc;
}
