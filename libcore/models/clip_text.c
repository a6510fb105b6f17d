/* The CLIP text encoder's forward pass (transformers' CLIPTextTransformer):
 * token + position embeddings, pre-LN blocks with causal multi-head
 * self-attention and an MLP, the final layer norm, the pooled end-token
 * state and text_projection, over a scratch workspace. On a host backend
 * up to SD_CLIP_BATCH sequences go through the model together (the CPU
 * linear gives a row the same bits whatever the row count, and every other
 * op works per row or per sequence), so the weights are packed once per
 * chunk instead of once per caption; a device backend runs them one at a
 * time (cuBLAS picks its kernels by the row count). Where the backend has
 * attn_rows_fwd (the CPU) attention reads the fused q|k|v rows as they are;
 * elsewhere the heads are transposed out and back around attn_fwd. */
#include <math.h>

#include "clip_text.h"
#include "dtype.h"

/* Offsets are rounded up to 16 floats so every scratch tensor starts on a
 * cache line. */
static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* The scratch tensors of a chunk of nb sequences, carved from the
 * workspace (in the backend's memory). */
typedef struct {
    float *x;    /* [nb, t, W] residual stream */
    float *h;    /* [nb, t, W] normed input of a sub-block, then merged heads */
    float *big;  /* [nb, t, max(3W, mlp)] q|k|v rows, then the MLP's hidden */
    float *tmp;  /* [nb, t, W] sub-block outputs; without attn_rows_fwd also [nb, 3W, t] q|k|v transposed,
                    [nb, W, t] heads on the way back */
    float *qkv;  /* [nb, 3H, t, D] per sequence q, k and v head-major (without attn_rows_fwd) */
    float *o;    /* [nb, H, t, D] attention output (without attn_rows_fwd) */
    float *lse;  /* [nb, H, t] */
    float *mean; /* [nb, t] layer-norm statistics */
    float *rstd; /* [nb, t] */
    float *row;  /* [W] the pooled row after the final LN */
    size_t total;
} scratch;

/* Lay the scratch tensors of nb sequences out from base (NULL: only count
 * floats). */
static void scratch_plan(const sd_clip_text_config *c, int nb, int t, float *base, scratch *s)
{
    size_t nt = (size_t)nb * (size_t)t, tw = nt * (size_t)c->width;
    size_t wide = nt * (size_t)(3 * c->width > c->mlp ? 3 * c->width : c->mlp);
    size_t sizes[10] = {tw, tw, wide, 3 * tw, 3 * tw, tw, (size_t)c->heads * nt, nt, nt, (size_t)c->width};
    float **dst[10] = {&s->x, &s->h, &s->big, &s->tmp, &s->qkv, &s->o, &s->lse, &s->mean, &s->rstd, &s->row};
    size_t off = 0;
    for (int i = 0; i < 10; i++) {
        *dst[i] = base ? base + off : NULL;
        off += round16(sizes[i]);
    }
    s->total = off;
}

/* Sequences per pass through the model for n sequences on be: up to
 * SD_CLIP_BATCH on a host backend, one on a device. */
static int chunk_of(const sd_backend *be, int n)
{
    if (be && be->is_device) return 1;
    return n < SD_CLIP_BATCH ? n : SD_CLIP_BATCH;
}

/* Scratch floats for n sequences of t tokens on any backend: a chunk of
 * min(n, SD_CLIP_BATCH) (a device uses the first sequence's share). */
size_t sd_clip_text_workspace_floats(const sd_clip_text *m, int n, int t)
{
    scratch s;
    scratch_plan(&m->cfg, chunk_of(NULL, n < 1 ? 1 : n), t, NULL, &s);
    return s.total;
}

/* The pooled output's width. */
int sd_clip_text_pooled_dim(const sd_clip_text *m)
{
    return m->cfg.proj > 0 ? m->cfg.proj : m->cfg.width;
}

/* What every layer needs: the backend and its exec context, the
 * parameters, config, chunk size, length and scratch (all in the backend's
 * memory). */
typedef struct {
    const sd_backend *be;
    void *exec;
    const float *p;
    const uint16_t *ph; /* the layers' matrices when wdtype is fp16 / bf16 (host memory) */
    int wdtype;         /* the layers' matrices: SD_DT_F32 (in p), SD_DT_F16 or SD_DT_BF16 (in ph) */
    const sd_clip_text_config *cfg;
    int nb, t; /* sequences in this chunk, tokens each */
    scratch *s;
} fwd;

/* y [rows, W] = layer_norm(x) with the given gamma/beta. */
static void norm(const fwd *f, const sd_clip_norm *nm, int rows, float *y, const float *x)
{
    sd_ln_shape ls = {.m = rows, .c = f->cfg->width, .eps = f->cfg->eps};
    f->be->layer_norm_fwd(f->exec, &ls, y, f->s->mean, f->s->rstd, x, f->p + nm->g, f->p + nm->b);
}

/* y [nb * t, out] = act(x [nb * t, in] w^T + b), w one of the layers'
 * matrices: one call where the backend has linear_act_fwd (the CPU, which
 * also reads 16-bit matrices; the same bits as the two ops), else
 * linear_fwd and the activation op. */
static void linear(const fwd *f, size_t w, size_t b, int out, int in, sd_act act, float *y, const float *x)
{
    sd_linear_shape ls = {.m = f->nb * f->t, .k = in, .n = out};
    if (f->be->linear_act_fwd) {
        const void *wp = f->wdtype == SD_DT_F32 ? (const void *)(f->p + w) : (const void *)(f->ph + w);
        f->be->linear_act_fwd(f->exec, &ls, act, f->wdtype, y, x, wp, f->p + b);
        return;
    }
    f->be->linear_fwd(f->exec, &ls, y, x, f->p + w, f->p + b);
    size_t n = (size_t)ls.m * (size_t)out;
    if (act == SD_ACT_GELU) f->be->gelu_fwd(f->exec, n, y, y);
    else if (act == SD_ACT_QUICK_GELU) f->be->quick_gelu_fwd(f->exec, n, y, y);
}

/* Per sequence, [t, 3W] rows of q|k|v, i.e. [t, 3H, D], -> [3H, t, D]
 * (q, k, v each [H, t, D]) by two transposes: [t, 3H*D] -> [3H*D, t],
 * then each of the 3H [D, t] planes -> [t, D]. */
static void split_heads(const fwd *f)
{
    int nb = f->nb, t = f->t, W = f->cfg->width, H = f->cfg->heads;
    f->be->transpose_fwd(f->exec, nb, t, 3 * W, f->s->tmp, f->s->big);
    f->be->transpose_fwd(f->exec, nb * 3 * H, W / H, t, f->s->qkv, f->s->tmp);
}

/* Per sequence, [H, t, D] -> [t, W] with heads side by side in each row:
 * each [t, D] plane -> [D, t], then [H*D, t] -> [t, H*D]. */
static void merge_heads(const fwd *f, float *y, const float *o)
{
    int nb = f->nb, t = f->t, W = f->cfg->width, H = f->cfg->heads;
    f->be->transpose_fwd(f->exec, nb * H, t, W / H, f->s->tmp, o);
    f->be->transpose_fwd(f->exec, nb, W, t, y, f->s->tmp);
}

/* Causal self-attention of each sequence (scores scaled by
 * head_dim ** -0.5) from its q|k|v planes. */
static void attend(const fwd *f)
{
    const sd_clip_text_config *c = f->cfg;
    scratch *s = f->s;
    int t = f->t, D = c->width / c->heads;
    size_t tw = (size_t)t * (size_t)c->width, th = (size_t)t * (size_t)c->heads;
    sd_attn_shape as = {.b = 1, .heads = c->heads, .tq = t, .tk = t, .d = D, .causal = 1,
                        .scale = (float)(1.0 / sqrt((double)D))};
    for (int i = 0; i < f->nb; i++) {
        const float *q = s->qkv + (size_t)i * 3 * tw;
        f->be->attn_fwd(f->exec, &as, s->o + (size_t)i * tw, s->lse + (size_t)i * th, q, q + tw, q + 2 * tw);
    }
}

/* The same attention straight from the q|k|v rows in big into h with the
 * heads side by side (no transposes), where the backend has that op. */
static void attend_rows(const fwd *f)
{
    const sd_clip_text_config *c = f->cfg;
    scratch *s = f->s;
    int W = c->width, D = W / c->heads;
    sd_attn_shape as = {.b = f->nb, .heads = c->heads, .tq = f->t, .tk = f->t, .d = D, .causal = 1,
                        .scale = (float)(1.0 / sqrt((double)D))};
    f->be->attn_rows_fwd(f->exec, &as, 3 * W, s->h, s->lse, s->big, s->big + W, s->big + 2 * W);
}

/* One CLIPEncoderLayer on the residual stream x:
 * x += out_proj(attn(split(qkv(ln1(x))))) then x += fc2(act(fc1(ln2(x)))). */
static void block(const fwd *f, const sd_clip_layer *L)
{
    const sd_clip_text_config *c = f->cfg;
    scratch *s = f->s;
    int rows = f->nb * f->t, W = c->width;
    size_t tw = (size_t)rows * (size_t)W;
    norm(f, &L->ln1, rows, s->h, s->x);
    linear(f, L->wqkv, L->bqkv, 3 * W, W, SD_ACT_NONE, s->big, s->h);
    if (f->be->attn_rows_fwd) {
        attend_rows(f);
    } else {
        split_heads(f);
        attend(f);
        merge_heads(f, s->h, s->o);
    }
    linear(f, L->wo, L->bo, W, W, SD_ACT_NONE, s->tmp, s->h);
    f->be->add_fwd(f->exec, tw, s->x, s->x, s->tmp);
    norm(f, &L->ln2, rows, s->h, s->x);
    linear(f, L->w1, L->b1, c->mlp, W, c->act == SD_CLIP_GELU ? SD_ACT_GELU : SD_ACT_QUICK_GELU, s->big, s->h);
    linear(f, L->w2, L->b2, W, c->mlp, SD_ACT_NONE, s->tmp, s->big);
    f->be->add_fwd(f->exec, tw, s->x, s->x, s->tmp);
}

/* The position transformers pools at: with the legacy eos_token_id 2 the
 * argmax of the ids (first maximum), else the first position holding
 * eos_id (argmax of a 0/1 mask: 0 when there is none). */
static int pool_position(const sd_clip_text_config *c, const int32_t *ids, int t)
{
    int best = 0;
    if (c->eos_id == SD_CLIP_LEGACY_EOS) {
        for (int i = 1; i < t; i++)
            if (ids[i] > ids[best]) best = i;
        return best;
    }
    for (int i = 0; i < t; i++)
        if (ids[i] == c->eos_id) return i;
    return 0;
}

/* The selected hidden state of the chunk's sequences into dst [nb, t, W]. */
static void emit_hidden(const fwd *f, const sd_clip_text *m, const sd_clip_text_out *out, float *dst)
{
    int rows = f->nb * f->t;
    if (out->final_ln) norm(f, &m->final_ln, rows, dst, f->s->x);
    else f->be->d2d(f->exec, dst, f->s->x, (size_t)rows * (size_t)m->cfg.width * sizeof(float));
}

/* The pooled output of sequence i of the chunk: the final LN of its
 * pooling row, projected when the model has text_projection. */
static void emit_pooled(const fwd *f, const sd_clip_text *m, int i, const int32_t *ids, float *pooled)
{
    const sd_clip_text_config *c = &m->cfg;
    const float *last = f->s->x + ((size_t)i * (size_t)f->t + (size_t)pool_position(c, ids, f->t)) * (size_t)c->width;
    if (!c->proj) {
        norm(f, &m->final_ln, 1, pooled, last);
        return;
    }
    norm(f, &m->final_ln, 1, f->s->row, last);
    sd_linear_shape ps = {.m = 1, .k = c->width, .n = c->proj};
    f->be->linear_fwd(f->exec, &ps, pooled, f->s->row, f->p + m->proj_w, NULL);
}

/* One chunk of f->nb sequences: embeddings, the blocks up to the last one
 * any output needs, the hidden states when the selected layer is reached,
 * the pooled rows at the end. ids is the host copy (pooling positions),
 * ids_be the backend's. */
static void encode_chunk(const sd_clip_text *m, const fwd *f, const int32_t *ids, const int32_t *ids_be,
                         const sd_clip_text_out *out, float *hidden, float *pooled)
{
    const sd_clip_text_config *c = &m->cfg;
    sd_embedding_shape es = {.n = f->nb, .t = f->t, .dim = c->width, .vocab = c->vocab, .npos = c->positions};
    f->be->embedding_fwd(f->exec, &es, f->s->x, ids_be, f->p + m->tok, f->p + m->pos);
    int want = hidden ? c->layers - out->skip : c->layers, run = pooled ? c->layers : want;
    for (int l = 0; l <= run; l++) {
        if (hidden && l == want) emit_hidden(f, m, out, hidden);
        if (l < run) block(f, &m->layer[l]);
    }
    if (!pooled) return;
    size_t pd = (size_t)sd_clip_text_pooled_dim(m);
    for (int i = 0; i < f->nb; i++) emit_pooled(f, m, i, ids + (size_t)i * (size_t)f->t, pooled + (size_t)i * pd);
}

/* Validate the request once on the host ids, then run the sequences in
 * chunks (chunk_of); ends with the backend's sync so a device failure is
 * reported here. */
sd_status sd_clip_text_encode_on(const sd_clip_text *m, const sd_backend *be, void *exec, const float *params, int n,
                                 int t, const int32_t *ids, const int32_t *ids_be, const sd_clip_text_out *out,
                                 float *hidden, float *pooled, float *ws, sd_error *err)
{
    const sd_clip_text_config *c = &m->cfg;
    if (n < 1 || t < 1 || t > c->positions)
        return sd_err_set(err, SD_EINVAL, "CLIP text encode: %d sequences of %d tokens (1..%d tokens allowed)", n, t,
                          c->positions);
    if (hidden && (!out || out->skip < 0 || out->skip > c->layers))
        return sd_err_set(err, SD_EINVAL, "CLIP text encode: skip %d outside 0..%d layers", out ? out->skip : -1,
                          c->layers);
    sd_embedding_shape es = {.n = n, .t = t, .dim = c->width, .vocab = c->vocab, .npos = c->positions};
    if (m->wdtype && (be->is_device || !be->linear_act_fwd))
        return sd_err_set(err, SD_EUNSUPPORTED, "CLIP text encode: %s weights need the CPU backend (%s has no "
                          "16-bit linear)", sd_dtype_name(m->wdtype), be->name);
    sd_status rc = sd_embedding_check_ids(&es, ids, err);
    if (rc || (!hidden && !pooled)) return rc;
    int chunk = chunk_of(be, n);
    scratch s;
    scratch_plan(c, chunk, t, ws, &s);
    fwd f = {.be = be, .exec = exec, .p = params, .ph = m->half, .wdtype = m->wdtype ? m->wdtype : SD_DT_F32,
             .cfg = c, .t = t, .s = &s};
    size_t per = (size_t)t * (size_t)c->width, pd = (size_t)sd_clip_text_pooled_dim(m);
    for (int i = 0; i < n; i += chunk) {
        f.nb = n - i < chunk ? n - i : chunk;
        encode_chunk(m, &f, ids + (size_t)i * (size_t)t, ids_be + (size_t)i * (size_t)t, out,
                     hidden ? hidden + (size_t)i * per : NULL, pooled ? pooled + (size_t)i * pd : NULL);
    }
    return be->sync(exec, err);
}

/* The host-memory case: parameters from the model's own flat buffer, the
 * ids read in place. */
sd_status sd_clip_text_encode(const sd_clip_text *m, const sd_backend *be, sd_pool *pool, int n, int t,
                              const int32_t *ids, const sd_clip_text_out *out, float *hidden, float *pooled, float *ws,
                              sd_error *err)
{
    return sd_clip_text_encode_on(m, be, pool, m->w.data, n, t, ids, ids, out, hidden, pooled, ws, err);
}
