/* The UNet's config inferred from its weights' names and shapes (a file
 * without its config.json), in either layout. */
#include <stdio.h>
#include <string.h>

#include "unet_load_int.h"

/* Dimension d of prefix + name, 0 when absent; *ndim gets its rank. */
static int dim_of(const sd_unet_probe *p, const char *name, int d, int *ndim)
{
    char full[2 * SD_WEIGHT_NAME_MAX];
    snprintf(full, sizeof full, "%s%s", p->lay.prefix, name);
    const sd_st_tensor *t = sd_st_find(p->st, full);
    if (ndim) *ndim = t ? t->ndim : 0;
    return t && t->ndim > d ? (int)t->shape[d] : 0;
}

/* Whether prefix + name exists. */
static int has(const sd_unet_probe *p, const char *name)
{
    int nd;
    dim_of(p, name, 0, &nd);
    return nd > 0;
}

/* Transformer blocks under an attention prefix (0 when absent). */
static int count_tblocks(const sd_unet_probe *p, const char *att)
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
static void attn_facts(const sd_unet_probe *p, const char *att, sd_unet_config *c)
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
static sd_status infer_ldm(const sd_unet_probe *p, sd_unet_config *c, sd_error *err, const char *path)
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
static sd_status infer_diffusers(const sd_unet_probe *p, sd_unet_config *c, sd_error *err, const char *path)
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
sd_status sd_unet_infer_config(const sd_unet_probe *p, sd_unet_config *c, int groups, sd_error *err, const char *path)
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
