/* The UNet's forward pass: planning the graph (every op with its tensors as
 * offsets into one activation buffer) the way diffusers' UNet2DConditionModel
 * runs its modules, and running it over the backend table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "unet_int.h"

/* Activation offsets are rounded to 16 floats (64 bytes), as the weights. */
static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* One reservation of the activation buffer while planning: its planning
 * offset (they only grow), size, and the checkpointed segment it belongs to
 * (-1: kept for the whole step). */
typedef struct {
    size_t off, len;
    long seg;
} alloc;

/* Planning state: the graph being built, the model, the reservations, the
 * segment being planned (-1 outside one; checkpoint off: always -1) and the
 * first error. */
typedef struct {
    sd_unet_graph *g;
    const sd_unet *u;
    int checkpoint;
    long seg;
    size_t seg_begin;
    alloc *a;
    size_t na, acap;
    sd_status rc;
    sd_error *err;
} plan;

/* Room for one more element in the planner's array *arr (used entries
 * `used`, capacity *cap, elements of `size` bytes), doubling it; 0 and the
 * plan's error set when out of memory. */
static int room(plan *p, void **arr, size_t used, size_t *cap, size_t size, size_t first)
{
    if (used < *cap) return 1;
    size_t n = *cap ? 2 * *cap : first;
    void *a = realloc(*arr, n * size);
    if (!a) {
        p->rc = sd_err_set(p->err, SD_ENOMEM, "out of memory planning the UNet");
        return 0;
    }
    *arr = a;
    *cap = n;
    return 1;
}

/* Reserve n floats of the activation buffer (a planning offset: the
 * segments' reservations move to the shared region when planning ends). */
static size_t take(plan *p, size_t n)
{
    size_t off = p->g->nact;
    void *arr = p->a;
    if (p->rc || !room(p, &arr, p->na, &p->acap, sizeof(alloc), 1024)) return off;
    p->a = arr;
    p->g->nact += round16(n ? n : 1);
    p->a[p->na++] = (alloc){.off = off, .len = p->g->nact - off, .seg = p->seg};
    return off;
}

/* Reserve an op's output of n floats. */
static void take_y(plan *p, sd_unet_op *o, size_t n)
{
    o->y = take(p, n);
    o->ny = n;
}

/* Append an op record with no tensors yet; NULL (and the error set) when
 * out of memory, after which every later push fails too. */
static sd_unet_op *push(plan *p, sd_unet_op_kind kind)
{
    sd_unet_graph *g = p->g;
    void *arr = g->ops;
    if (p->rc || !room(p, &arr, g->nops, &g->cap, sizeof(sd_unet_op), 256)) return NULL;
    g->ops = arr;
    sd_unet_op *o = &g->ops[g->nops++];
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->x = o->x2 = o->x3 = o->s1 = o->s2 = o->w = o->b = SIZE_MAX;
    return o;
}

/* Record a failed shape check once. */
static void fail(plan *p, sd_status rc)
{
    if (!p->rc) p->rc = rc;
}

/* y = conv(x) for an n x cin x h x w input; stride 2 uses the config's
 * downsample padding. Returns y; *oh, *ow get its size. */
static size_t op_conv(plan *p, const sd_unet_conv *cv, int n, int h, int w, int stride, size_t x, int *oh, int *ow)
{
    int pad = cv->k / 2, pb = pad, pr = pad;
    if (stride == 2 && p->u->cfg.down_pad == 0) {
        pad = 0;
        pb = pr = 1;
    }
    sd_conv2d_shape s = {.n = n, .cin = cv->cin, .h = h, .w = w, .cout = cv->cout, .kh = cv->k, .kw = cv->k,
                         .stride = stride, .pad_t = pad, .pad_b = pb, .pad_l = pad, .pad_r = pr};
    if (sd_conv2d_check(&s, p->err)) fail(p, SD_EINVAL);
    int yh = sd_conv2d_out_h(&s), yw = sd_conv2d_out_w(&s);
    sd_unet_op *o = push(p, UOP_CONV);
    if (!o) return 0;
    o->s.conv = s;
    o->x = x;
    o->w = cv->w;
    o->b = cv->b;
    take_y(p, o, (size_t)n * (size_t)cv->cout * (size_t)yh * (size_t)yw);
    if (oh) *oh = yh;
    if (ow) *ow = yw;
    return o->y;
}

/* y = group_norm(x) over n x c x hw with the norm's affine. */
static size_t op_gn(plan *p, const sd_unet_norm *nm, int n, int c, int hw, float eps, size_t x)
{
    sd_gn_shape s = {.n = n, .c = c, .hw = hw, .groups = p->u->cfg.groups, .eps = eps};
    if (sd_group_norm_check(&s, p->err)) fail(p, SD_EINVAL);
    sd_unet_op *o = push(p, UOP_GN);
    if (!o) return 0;
    o->s.gn = s;
    o->x = x;
    o->w = nm->g;
    o->b = nm->b;
    o->s1 = take(p, (size_t)n * (size_t)s.groups);
    o->s2 = take(p, (size_t)n * (size_t)s.groups);
    take_y(p, o, (size_t)n * (size_t)c * (size_t)hw);
    return o->y;
}

/* y [m, out] = x [m, in] W^T + b. */
static size_t op_linear(plan *p, const sd_unet_linear *l, int m, size_t x)
{
    sd_linear_shape s = {.m = m, .k = l->in, .n = l->out};
    if (sd_linear_check(&s, p->err)) fail(p, SD_EINVAL);
    sd_unet_op *o = push(p, UOP_LINEAR);
    if (!o) return 0;
    o->s.lin = s;
    o->x = x;
    o->w = l->w;
    o->b = l->b;
    take_y(p, o, (size_t)m * (size_t)l->out);
    return o->y;
}

/* An element-wise op over n floats: silu (x2 unused) or add. */
static size_t op_elem(plan *p, sd_unet_op_kind kind, size_t n, size_t x, size_t x2)
{
    sd_unet_op *o = push(p, kind);
    if (!o) return 0;
    o->s.n = n;
    o->x = x;
    o->x2 = x2;
    take_y(p, o, n);
    return o->y;
}

/* y = layer_norm(x) over the last dim c of [m, c]. */
static size_t op_ln(plan *p, const sd_unet_norm *nm, int m, int c, size_t x)
{
    sd_ln_shape s = {.m = m, .c = c, .eps = 1e-5f};
    if (sd_layer_norm_check(&s, p->err)) fail(p, SD_EINVAL);
    sd_unet_op *o = push(p, UOP_LN);
    if (!o) return 0;
    o->s.ln = s;
    o->x = x;
    o->w = nm->g;
    o->b = nm->b;
    o->s1 = take(p, (size_t)m);
    o->s2 = take(p, (size_t)m);
    take_y(p, o, (size_t)m * (size_t)c);
    return o->y;
}

/* y [n, cols, rows] = x [n, rows, cols]. */
static size_t op_trans(plan *p, int n, int rows, int cols, size_t x)
{
    sd_unet_op *o = push(p, UOP_TRANS);
    if (!o) return 0;
    o->s.tr.n = n;
    o->s.tr.rows = rows;
    o->s.tr.cols = cols;
    o->x = x;
    take_y(p, o, (size_t)n * (size_t)rows * (size_t)cols);
    return o->y;
}

/* y [a, c, b, d] = x [a, b, c, d] with the backend's transpose: one for
 * d = 1; else [a, b, c*d] -> [a, c*d, b] = [a, c, d, b], then each (a, c)
 * block [d, b] -> [b, d]. With b or c of 1 the layout is already right. */
static size_t op_swap(plan *p, int a, int b, int c, int d, size_t x)
{
    if (b == 1 || c == 1) return x;
    if (d == 1) return op_trans(p, a, b, c, x);
    size_t t = op_trans(p, a, b, c * d, x);
    return op_trans(p, a * c, d, b, t);
}

/* y = [a | b] along channels of [n, c1, hw] and [n, c2, hw]. */
static size_t op_concat(plan *p, int n, int c1, int c2, int hw, size_t a, size_t b)
{
    sd_concat_shape s = {.n = n, .c1 = c1, .c2 = c2, .hw = hw};
    if (sd_concat_check(&s, p->err)) fail(p, SD_EINVAL);
    sd_unet_op *o = push(p, UOP_CONCAT);
    if (!o) return 0;
    o->s.cat = s;
    o->x = a;
    o->x2 = b;
    take_y(p, o, (size_t)n * (size_t)(c1 + c2) * (size_t)hw);
    return o->y;
}

/* y = sinusoidal embedding [n, dim] of n timesteps at x. */
static size_t op_temb(plan *p, int n, int dim, size_t x)
{
    const sd_unet_config *c = &p->u->cfg;
    sd_temb_shape s = {.n = n, .dim = dim, .flip_sin_to_cos = c->flip_sin_to_cos, .freq_shift = c->freq_shift,
                       .scale = 1.0f, .max_period = 10000.0f};
    if (sd_timestep_emb_check(&s, p->err)) fail(p, SD_EINVAL);
    sd_unet_op *o = push(p, UOP_TEMB);
    if (!o) return 0;
    o->s.temb = s;
    o->x = x;
    take_y(p, o, (size_t)n * (size_t)dim);
    return o->y;
}

/* Open a checkpointed segment at the next op (nothing without checkpointing). */
static void seg_open(plan *p)
{
    if (!p->checkpoint) return;
    p->seg = (long)p->g->nsegs;
    p->seg_begin = p->g->nops;
}

/* The reservation that starts at planning offset off (binary search: they
 * are in offset order), or SIZE_MAX. */
static size_t alloc_at(const plan *p, size_t off)
{
    size_t lo = 0, hi = p->na;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->a[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo < p->na && p->a[lo].off == off ? lo : SIZE_MAX;
}

/* Close the segment: its output out (the last op's) is kept, the rest of
 * its reservations stay in the shared region. */
static void seg_close(plan *p, size_t out)
{
    if (!p->checkpoint || p->rc) return;
    sd_unet_graph *g = p->g;
    size_t a = alloc_at(p, out);
    if (a == SIZE_MAX || !g->nops || g->ops[g->nops - 1].y != out) {
        p->rc = sd_err_set(p->err, SD_EINVAL, "UNet plan: a checkpointed segment's output is not its last op's");
        return;
    }
    p->a[a].seg = -1;
    sd_unet_seg *sg = realloc(g->segs, (g->nsegs + 1) * sizeof(*sg));
    if (!sg) {
        p->rc = sd_err_set(p->err, SD_ENOMEM, "out of memory planning the UNet");
        return;
    }
    g->segs = sg;
    g->segs[g->nsegs++] = (sd_unet_seg){.begin = p->seg_begin, .end = g->nops};
    p->seg = -1;
}

/* Attention (diffusers Attention with AttnProcessor2_0): q from xq [n, tq,
 * cq], k and v from xkv [n, tk, ckv], heads split and merged around the
 * scaled dot product, then to_out. Returns [n, tq, out]. */
static size_t attention(plan *p, const sd_unet_linear *wq, const sd_unet_linear *wk, const sd_unet_linear *wv,
                        const sd_unet_linear *wo, int heads, int n, int tq, int tk, size_t xq, size_t xkv)
{
    int inner = wq->out, d = inner / heads;
    size_t q = op_linear(p, wq, n * tq, xq);
    size_t k = op_linear(p, wk, n * tk, xkv);
    size_t v = op_linear(p, wv, n * tk, xkv);
    size_t qh = op_swap(p, n, tq, heads, d, q);
    size_t kh = op_swap(p, n, tk, heads, d, k);
    size_t vh = op_swap(p, n, tk, heads, d, v);
    sd_attn_shape s = {.b = n, .heads = heads, .tq = tq, .tk = tk, .d = d, .causal = 0,
                       .scale = (float)(1.0 / sqrt((double)d))};
    if (sd_attn_check(&s, p->err)) fail(p, SD_EINVAL);
    sd_unet_op *o = push(p, UOP_ATTN);
    if (!o) return 0;
    o->s.attn = s;
    o->x = qh;
    o->x2 = kh;
    o->x3 = vh;
    o->s1 = take(p, (size_t)n * (size_t)heads * (size_t)tq);
    take_y(p, o, (size_t)n * (size_t)inner * (size_t)tq);
    size_t merged = op_swap(p, n, heads, tq, d, o->y);
    return op_linear(p, wo, n * tq, merged);
}

/* BasicTransformerBlock on tokens h [n, t, c]: pre-norm self-attention,
 * cross-attention on the text context, GEGLU feed-forward, each added
 * back to the stream. */
static size_t tblock(plan *p, const sd_unet_tblock *b, int heads, int n, int t, int c, size_t h, size_t ctx,
                     int tctx)
{
    size_t m = (size_t)n * (size_t)t * (size_t)c;
    seg_open(p);
    size_t l1 = op_ln(p, &b->ln1, n * t, c, h);
    size_t a1 = attention(p, &b->q1, &b->k1, &b->v1, &b->o1, heads, n, t, t, l1, l1);
    h = op_elem(p, UOP_ADD, m, h, a1);
    size_t l2 = op_ln(p, &b->ln2, n * t, c, h);
    size_t a2 = attention(p, &b->q2, &b->k2, &b->v2, &b->o2, heads, n, t, tctx, l2, ctx);
    h = op_elem(p, UOP_ADD, m, h, a2);
    size_t l3 = op_ln(p, &b->ln3, n * t, c, h);
    size_t f1 = op_linear(p, &b->ff1, n * t, l3);
    sd_unet_op *o = push(p, UOP_GEGLU);
    if (!o) return 0;
    o->s.gg.m = (size_t)n * (size_t)t;
    o->s.gg.n = (size_t)b->ff1.out / 2;
    o->x = f1;
    take_y(p, o, o->s.gg.m * o->s.gg.n);
    size_t f2 = op_linear(p, &b->ff2, n * t, o->y);
    size_t y = op_elem(p, UOP_ADD, m, h, f2);
    seg_close(p, y);
    return y;
}

/* Transformer2DModel on x [n, c, h*w]: group norm (eps 1e-6), to tokens,
 * proj_in, the blocks, proj_out, back to NCHW, plus the input. proj_in and
 * proj_out run as linears on tokens whether the model stores them as 1x1
 * convs (SD1) or linears (use_linear_projection): the same arithmetic. */
static size_t xformer(plan *p, const sd_unet_xformer *xf, int n, int hw, size_t x, size_t ctx, int tctx)
{
    int c = xf->c, inner = xf->pin.out;
    size_t g = op_gn(p, &xf->gn, n, c, hw, 1e-6f, x);
    size_t tok = op_swap(p, n, c, hw, 1, g);
    size_t h = op_linear(p, &xf->pin, n * hw, tok);
    for (int i = 0; i < xf->depth; i++)
        h = tblock(p, &p->u->tb[xf->first + i], xf->heads, n, hw, inner, h, ctx, tctx);
    size_t o = op_linear(p, &xf->pout, n * hw, h);
    size_t back = op_swap(p, n, hw, c, 1, o);
    return op_elem(p, UOP_ADD, (size_t)n * (size_t)c * (size_t)hw, back, x);
}

/* ResnetBlock2D with the time embedding: x + conv2(silu(norm2(conv1(silu(
 * norm1(x))) + time_emb_proj(silu(emb))))), x through the 1x1 shortcut when
 * the widths differ. semb is silu(emb), shared by every resnet. */
static size_t resnet(plan *p, const sd_unet_resnet *r, int n, int h, int w, size_t x, size_t semb)
{
    const sd_unet_config *c = &p->u->cfg;
    int hw = h * w;
    size_t cells = (size_t)n * (size_t)r->cout * (size_t)hw;
    seg_open(p);
    size_t a = op_gn(p, &r->n1, n, r->cin, hw, c->eps, x);
    a = op_elem(p, UOP_SILU, (size_t)n * (size_t)r->cin * (size_t)hw, a, SIZE_MAX);
    a = op_conv(p, &r->c1, n, h, w, 1, a, NULL, NULL);
    size_t tp = op_linear(p, &r->temb, n, semb);
    sd_unet_op *o = push(p, UOP_BCAST);
    if (!o) return 0;
    o->s.bc.n = n;
    o->s.bc.c = r->cout;
    o->s.bc.hw = hw;
    o->x = a;
    o->x2 = tp;
    take_y(p, o, cells);
    a = op_gn(p, &r->n2, n, r->cout, hw, c->eps, o->y);
    a = op_elem(p, UOP_SILU, cells, a, SIZE_MAX);
    a = op_conv(p, &r->c2, n, h, w, 1, a, NULL, NULL);
    size_t sc = r->has_sc ? op_conv(p, &r->sc, n, h, w, 1, x, NULL, NULL) : x;
    size_t y = op_elem(p, UOP_ADD, cells, sc, a);
    seg_close(p, y);
    return y;
}

/* The skip connections the down path leaves for the up path. */
typedef struct {
    size_t off[1 + SD_UNET_MAX_BLOCKS * (SD_UNET_MAX_LAYERS + 1)];
    int ch[1 + SD_UNET_MAX_BLOCKS * (SD_UNET_MAX_LAYERS + 1)];
    int n;
} skips;

/* Where a planning offset lives in act: kept reservations packed from 0
 * in order, each segment's from the start of the shared region (after the
 * kept ones), so segments overlap there. */
static size_t relocate(const plan *p, const size_t *phys, size_t off)
{
    if (off == SIZE_MAX) return off;
    return phys[alloc_at(p, off)];
}

/* Move the checkpointed segments' reservations into the shared region and
 * rewrite every offset; first check that no op outside a segment reads its
 * intermediates (they are gone once another segment runs). */
static sd_status place_segments(plan *p)
{
    sd_unet_graph *g = p->g;
    for (size_t j = 0, sg = 0; j < g->nops; j++) {
        while (sg < g->nsegs && g->segs[sg].end <= j) sg++;
        long mine = sg < g->nsegs && g->segs[sg].begin <= j ? (long)sg : -1;
        const sd_unet_op *o = &g->ops[j];
        const size_t in[3] = {o->x, o->x2, o->x3};
        for (int k = 0; k < 3; k++) {
            size_t a = in[k] == SIZE_MAX ? SIZE_MAX : alloc_at(p, in[k]);
            if (in[k] != SIZE_MAX && a == SIZE_MAX)
                return sd_err_set(p->err, SD_EINVAL, "UNet plan: op %zu reads an unknown tensor", j);
            if (a != SIZE_MAX && p->a[a].seg >= 0 && p->a[a].seg != mine)
                return sd_err_set(p->err, SD_EINVAL, "UNet plan: op %zu reads inside checkpointed segment %ld", j,
                                  p->a[a].seg);
        }
    }
    size_t *phys = malloc((p->na ? p->na : 1) * sizeof(size_t)), kept = 0, shared = 0, cur = 0;
    if (!phys) return sd_err_set(p->err, SD_ENOMEM, "out of memory planning the UNet");
    long last = -1;
    for (size_t i = 0; i < p->na; i++) {
        if (p->a[i].seg < 0) {
            phys[i] = kept;
            kept += p->a[i].len;
            continue;
        }
        if (p->a[i].seg != last) cur = 0;
        last = p->a[i].seg;
        phys[i] = cur; /* within the shared region, shifted below */
        cur += p->a[i].len;
        if (cur > shared) shared = cur;
    }
    for (size_t i = 0; i < p->na; i++)
        if (p->a[i].seg >= 0) phys[i] += kept;
    for (size_t j = 0; j < g->nops; j++) {
        sd_unet_op *o = &g->ops[j];
        o->x = relocate(p, phys, o->x);
        o->x2 = relocate(p, phys, o->x2);
        o->x3 = relocate(p, phys, o->x3);
        o->y = relocate(p, phys, o->y);
        o->s1 = relocate(p, phys, o->s1);
        o->s2 = relocate(p, phys, o->s2);
    }
    size_t *io[] = {&g->x, &g->t, &g->ctx, &g->text, &g->tids, &g->out};
    for (size_t i = 0; i < sizeof io / sizeof io[0]; i++) *io[i] = relocate(p, phys, *io[i]);
    g->nact = kept + shared;
    g->nrecompute = shared;
    free(phys);
    return SD_OK;
}

/* Plan the whole forward: embeddings, conv_in, down blocks (pushing their
 * outputs), mid block, up blocks (concatenating them back in reverse), the
 * output norm and conv. Mirrors UNet2DConditionModel.forward. */
sd_status sd_unet_plan(const sd_unet *u, int n, int h, int w, int tctx, int checkpoint, sd_unet_graph *g,
                       sd_error *err)
{
    const sd_unet_config *c = &u->cfg;
    int f = 1 << (c->nblocks - 1);
    memset(g, 0, sizeof(*g));
    if (n < 1 || h < 1 || w < 1 || tctx < 1 || h % f || w % f)
        return sd_err_set(err, SD_EINVAL, "UNet input %dx%dx%d with %d text tokens: sizes must be multiples of %d",
                          n, h, w, tctx, f);
    g->n = n;
    g->h = h;
    g->w = w;
    g->tctx = tctx;
    plan p = {.g = g, .u = u, .checkpoint = checkpoint, .seg = -1, .err = err};
    /* inputs first: [0, nconst) gets no gradient */
    g->x = take(&p, (size_t)n * (size_t)c->in_channels * (size_t)h * (size_t)w);
    g->t = take(&p, (size_t)n);
    g->ctx = take(&p, (size_t)n * (size_t)tctx * (size_t)c->cross_dim);
    g->text = g->tids = SIZE_MAX;
    int pooled = c->add_in_dim - SD_UNET_TIME_IDS * c->add_time_dim;
    if (c->text_time) {
        g->text = take(&p, (size_t)n * (size_t)pooled);
        g->tids = take(&p, (size_t)n * SD_UNET_TIME_IDS);
    }
    g->nconst = g->nact;

    int c0 = c->block_out[0];
    size_t e = op_temb(&p, n, c0, g->t);
    e = op_linear(&p, &u->t1, n, e);
    e = op_elem(&p, UOP_SILU, (size_t)n * (size_t)u->t1.out, e, SIZE_MAX);
    e = op_linear(&p, &u->t2, n, e);
    if (c->text_time) {
        size_t tt = op_temb(&p, n * SD_UNET_TIME_IDS, c->add_time_dim, g->tids);
        size_t cat = op_concat(&p, n, pooled, SD_UNET_TIME_IDS * c->add_time_dim, 1, g->text, tt);
        size_t a = op_linear(&p, &u->a1, n, cat);
        a = op_elem(&p, UOP_SILU, (size_t)n * (size_t)u->a1.out, a, SIZE_MAX);
        a = op_linear(&p, &u->a2, n, a);
        e = op_elem(&p, UOP_ADD, (size_t)n * (size_t)u->t2.out, e, a);
    }
    size_t semb = op_elem(&p, UOP_SILU, (size_t)n * (size_t)u->t2.out, e, SIZE_MAX);

    skips sk = {.n = 0};
    size_t x = op_conv(&p, &u->conv_in, n, h, w, 1, g->x, NULL, NULL);
    int ch = c0;
    sk.off[sk.n] = x;
    sk.ch[sk.n++] = ch;
    for (int i = 0; i < c->nblocks; i++) {
        for (int j = 0; j < c->layers[i]; j++) {
            const sd_unet_resnet *r = &u->down_res[i][j];
            if (r->cin != ch) fail(&p, sd_err_set(err, SD_EINVAL, "UNet plan: down block %d width mismatch", i));
            x = resnet(&p, r, n, h, w, x, semb);
            ch = r->cout;
            if (c->down_attn[i]) x = xformer(&p, &u->down_att[i][j], n, h * w, x, g->ctx, tctx);
            sk.off[sk.n] = x;
            sk.ch[sk.n++] = ch;
        }
        if (i < c->nblocks - 1) {
            x = op_conv(&p, &u->down_conv[i], n, h, w, 2, x, &h, &w);
            sk.off[sk.n] = x;
            sk.ch[sk.n++] = ch;
        }
    }
    if (c->mid_attn) {
        x = resnet(&p, &u->mid_res[0], n, h, w, x, semb);
        x = xformer(&p, &u->mid_att, n, h * w, x, g->ctx, tctx);
        x = resnet(&p, &u->mid_res[1], n, h, w, x, semb);
    }
    for (int i = 0; i < c->nblocks; i++) {
        int nl = c->layers[c->nblocks - 1 - i] + 1;
        for (int j = 0; j < nl; j++) {
            const sd_unet_resnet *r = &u->up_res[i][j];
            if (sk.n < 1 || r->cin != ch + sk.ch[sk.n - 1]) {
                fail(&p, sd_err_set(err, SD_EINVAL, "UNet plan: up block %d skip width mismatch", i));
                break;
            }
            sk.n--;
            x = op_concat(&p, n, ch, sk.ch[sk.n], h * w, x, sk.off[sk.n]);
            x = resnet(&p, r, n, h, w, x, semb);
            ch = r->cout;
            if (c->up_attn[i]) x = xformer(&p, &u->up_att[i][j], n, h * w, x, g->ctx, tctx);
        }
        if (i < c->nblocks - 1) {
            sd_unet_op *o = push(&p, UOP_UP2X);
            if (!o) break;
            o->s.up.planes = n * ch;
            o->s.up.h = h;
            o->s.up.w = w;
            o->x = x;
            take_y(&p, o, (size_t)n * (size_t)ch * (size_t)h * (size_t)w * 4);
            h *= 2;
            w *= 2;
            x = op_conv(&p, &u->up_conv[i], n, h, w, 1, o->y, NULL, NULL);
        }
    }
    x = op_gn(&p, &u->norm_out, n, ch, h * w, c->eps, x);
    x = op_elem(&p, UOP_SILU, (size_t)n * (size_t)ch * (size_t)h * (size_t)w, x, SIZE_MAX);
    g->out = op_conv(&p, &u->conv_out, n, h, w, 1, x, NULL, NULL);
    if (!p.rc && sk.n != 0) p.rc = sd_err_set(err, SD_EINVAL, "UNet plan: %d skip connections left over", sk.n);
    if (!p.rc) p.rc = sd_unet_plan_grads(g, err);
    if (!p.rc && checkpoint) p.rc = place_segments(&p);
    free(p.a);
    if (p.rc) sd_unet_graph_free(g);
    return p.rc;
}

/* Release the op list and the segments. */
void sd_unet_graph_free(sd_unet_graph *g)
{
    free(g->ops);
    free(g->segs);
    g->ops = NULL;
    g->segs = NULL;
    g->nops = g->cap = g->nsegs = 0;
}

/* Run every planned op in order. */
void sd_unet_forward(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                     const float *params, float *act)
{
    (void)u;
    sd_unet_wts w = {params, NULL, NULL};
    sd_unet_run_ops(g, 0, g->nops, be, exec, &w, act);
}

/* Every planned op in order, with w's parameters. */
void sd_unet_forward_wts(const sd_unet_graph *g, const sd_backend *be, void *exec, const sd_unet_wts *w,
                         float *act)
{
    sd_unet_run_ops(g, 0, g->nops, be, exec, w, act);
}

/* Each op of [begin, end) through its backend entry, its parameters (if
 * any) fetched just before it. */
void sd_unet_run_ops(const sd_unet_graph *g, size_t begin, size_t end, const sd_backend *be, void *exec,
                     const sd_unet_wts *wts, float *act)
{
    for (size_t i = begin; i < end; i++) {
        const sd_unet_op *o = &g->ops[i];
        float *y = act + o->y;
        const float *x = act + o->x, *pw = NULL, *pb = NULL;
        sd_unet_op_params(o, wts, be, exec, &pw, &pb);
        switch (o->kind) {
        case UOP_CONV: be->conv2d_fwd(exec, &o->s.conv, y, x, pw, pb); break;
        case UOP_GN: be->group_norm_fwd(exec, &o->s.gn, y, act + o->s1, act + o->s2, x, pw, pb); break;
        case UOP_LINEAR: be->linear_fwd(exec, &o->s.lin, y, x, pw, pb); break;
        case UOP_SILU: be->silu_fwd(exec, o->s.n, y, x); break;
        case UOP_ADD: be->add_fwd(exec, o->s.n, y, x, act + o->x2); break;
        case UOP_UP2X: be->upsample2x_fwd(exec, o->s.up.planes, o->s.up.h, o->s.up.w, y, x); break;
        case UOP_ATTN: be->attn_fwd(exec, &o->s.attn, y, act + o->s1, x, act + o->x2, act + o->x3); break;
        case UOP_LN: be->layer_norm_fwd(exec, &o->s.ln, y, act + o->s1, act + o->s2, x, pw, pb); break;
        case UOP_GEGLU: be->geglu_fwd(exec, o->s.gg.m, o->s.gg.n, y, x); break;
        case UOP_CONCAT: be->concat_fwd(exec, &o->s.cat, y, x, act + o->x2); break;
        case UOP_BCAST: be->add_bcast_channel_fwd(exec, o->s.bc.n, o->s.bc.c, o->s.bc.hw, y, x, act + o->x2); break;
        case UOP_TEMB: be->timestep_emb_fwd(exec, &o->s.temb, y, x); break;
        case UOP_TRANS: be->transpose_fwd(exec, o->s.tr.n, o->s.tr.rows, o->s.tr.cols, y, x); break;
        }
    }
}
