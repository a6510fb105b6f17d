/* The VAE encoder's forward pass (diffusers Encoder + quant_conv +
 * DiagonalGaussianDistribution's mean and std), over three ping-pong
 * activation buffers sized for the largest stage. */
#include <math.h>

#include "dtype.h"
#include "vae.h"

/* Output size of the VAE's stride-2 downsample: pad right/bottom by 1,
 * 3x3 stride 2, so floor((h - 2) / 2) + 1. */
static int down_size(int h)
{
    return (h + 1 - 3) / 2 + 1;
}

/* Whether every stride-2 downsample of an h-pixel side gets at least 2
 * pixels (padded to 3 for its 3x3 kernel): torch refuses smaller inputs
 * (an empty output), and C's truncating division would quietly give 1. */
static int side_fits(const sd_vae_config *cfg, int h)
{
    for (int i = 0; i < cfg->nblocks - 1; i++) {
        if (h < 2) return 0;
        h = down_size(h);
    }
    return h >= 1;
}

/* The input check every encode entry point shares (vae.h). */
sd_status sd_vae_check_input(const sd_vae *v, int n, int h, int w, sd_error *err)
{
    if (n < 1 || !side_fits(&v->cfg, h) || !side_fits(&v->cfg, w))
        return sd_err_set(err, SD_EINVAL, "VAE encode: bad input size %dx%dx%d (each side at least %d pixels)", n, h,
                          w, 1 << (v->cfg.nblocks - 1));
    return SD_OK;
}

/* Latent height and width for an h x w image. */
void sd_vae_latent_size(const sd_vae_config *cfg, int h, int w, int *lh, int *lw)
{
    for (int i = 0; i < cfg->nblocks - 1; i++) {
        h = down_size(h);
        w = down_size(w);
    }
    *lh = h;
    *lw = w;
}

/* Floats per image of the largest activation: block i runs at its stage's
 * resolution with its input (block_out[i-1]) and output widths. */
static size_t max_act(const sd_vae_config *c, int h, int w)
{
    size_t m = 0;
    for (int i = 0; i < c->nblocks; i++) {
        size_t cmax = (size_t)c->block_out[i];
        if (i > 0 && (size_t)c->block_out[i - 1] > cmax) cmax = (size_t)c->block_out[i - 1];
        size_t a = cmax * (size_t)h * (size_t)w;
        if (a > m) m = a;
        if (i < c->nblocks - 1) {
            h = down_size(h);
            w = down_size(w);
        }
    }
    size_t out = 2 * (size_t)c->latent_channels * (size_t)h * (size_t)w;
    return out > m ? out : m;
}

/* Whether the activations are stored in 16 bits. */
static int act16(const sd_vae *v)
{
    return v->act_dtype == SD_DT_F16 || v->act_dtype == SD_DT_BF16;
}

/* Floats one 16-bit activation buffer of `elems` values takes, rounded up
 * to 64 bytes so the next one stays aligned. */
static size_t half_floats(size_t elems)
{
    return ((elems + 1) / 2 + 15) / 16 * 16;
}

/* Whether the attention's three fp32 buffers of nt floats fit in the
 * 16-bit buffers b and c (hb floats each), idle while it runs: two in b,
 * one in c. True of SD's VAEs (the mid block runs at 1/64 of the pixels). */
static int wide_in_bc(size_t nt, size_t hb)
{
    return 2 * nt <= hb;
}

/* Three activation buffers, attention q/k/v and log-sum-exp, norm stats,
 * for n images in one pass. With 16-bit activations the three buffers
 * take half the room, and fp32 room is added for the attention's widened
 * input and its two scratch buffers and for the moments. */
size_t sd_vae_batch_workspace_floats(const sd_vae *v, int n, int h, int w)
{
    const sd_vae_config *c = &v->cfg;
    int lh, lw;
    sd_vae_latent_size(c, h, w, &lh, &lw);
    size_t t = (size_t)lh * (size_t)lw, top = (size_t)c->block_out[c->nblocks - 1];
    size_t big = (size_t)n * max_act(c, h, w);
    size_t attn = c->mid_attention ? (size_t)n * (3 * t * top + t) : 0;
    size_t stats = 2 * (size_t)n * (size_t)c->groups;
    if (!act16(v)) return 3 * big + attn + stats;
    size_t nt = (size_t)n * t * top, moments = 2 * (size_t)n * (size_t)c->latent_channels * t;
    size_t wide = c->mid_attention && !wide_in_bc(nt, half_floats(big)) ? 3 * nt : 0;
    return 3 * half_floats(big) + attn + wide + moments + stats;
}

/* See vae.h. */
sd_status sd_vae_set_activations(sd_vae *v, int dtype, sd_error *err)
{
    if (dtype != SD_DT_F32 && dtype != SD_DT_F16 && dtype != SD_DT_BF16)
        return sd_err_set(err, SD_EINVAL, "VAE activations must be fp32, fp16 or bf16");
    v->act_dtype = dtype;
    return SD_OK;
}

/* sd_vae_encode runs one image at a time: one image's scratch. */
size_t sd_vae_workspace_floats(const sd_vae *v, int n, int h, int w)
{
    (void)n;
    return sd_vae_batch_workspace_floats(v, 1, h, w);
}

/* What every layer needs: the backend, its exec context, weights, batch
 * and scratch (all in the backend's memory). */
typedef struct {
    const sd_backend *be;
    void *pool;     /* the backend's exec: an sd_pool * on the CPU */
    const float *p; /* flat parameters */
    const sd_vae_config *cfg;
    int n;
    float *mean, *rstd; /* group-norm stats [n * groups] */
} fwd;

/* y = silu(group_norm(x)), y may be x. */
static void norm_silu(const fwd *f, const sd_vae_norm *nm, int c, int hw, float *y, const float *x)
{
    sd_gn_shape s = {.n = f->n, .c = c, .hw = hw, .groups = f->cfg->groups, .eps = f->cfg->eps};
    f->be->group_norm_fwd(f->pool, &s, y, f->mean, f->rstd, x, f->p + nm->g, f->p + nm->b);
    f->be->silu_fwd(f->pool, (size_t)f->n * (size_t)c * (size_t)hw, y, y);
}

/* y = conv(x) with torch's symmetric "same" padding (k / 2 per side). */
static void conv(const fwd *f, const sd_vae_conv *cv, int h, int w, float *y, const float *x)
{
    int p = cv->k / 2;
    sd_conv2d_shape s = {.n = f->n, .cin = cv->cin, .h = h, .w = w, .cout = cv->cout, .kh = cv->k, .kw = cv->k,
                         .stride = 1, .pad_t = p, .pad_b = p, .pad_l = p, .pad_r = p};
    f->be->conv2d_fwd(f->pool, &s, y, x, f->p + cv->w, f->p + cv->b);
}

/* Downsample2D(padding=0): pad (0, 1, 0, 1), 3x3 stride 2. */
static void conv_down(const fwd *f, const sd_vae_conv *cv, int h, int w, float *y, const float *x)
{
    sd_conv2d_shape s = {.n = f->n, .cin = cv->cin, .h = h, .w = w, .cout = cv->cout, .kh = 3, .kw = 3,
                         .stride = 2, .pad_t = 0, .pad_b = 1, .pad_l = 0, .pad_r = 1};
    f->be->conv2d_fwd(f->pool, &s, y, x, f->p + cv->w, f->p + cv->b);
}

/* ResnetBlock2D (no time embedding, output scale 1): the input in *a is
 * replaced by shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x)))))). */
static void resnet(const fwd *f, const sd_vae_resnet *r, int h, int w, float *a, float *b, float *c)
{
    int hw = h * w;
    norm_silu(f, &r->n1, r->cin, hw, b, a);
    conv(f, &r->c1, h, w, c, b);
    norm_silu(f, &r->n2, r->cout, hw, c, c);
    conv(f, &r->c2, h, w, b, c);
    if (r->has_sc) {
        conv(f, &r->sc, h, w, c, a);
        f->be->add_fwd(f->pool, (size_t)f->n * (size_t)r->cout * (size_t)hw, a, c, b);
    } else {
        f->be->add_fwd(f->pool, (size_t)f->n * (size_t)r->cout * (size_t)hw, a, a, b);
    }
}

/* The mid block's single-head self-attention over all hw positions, with
 * its residual: a += to_out(attn(q, k, v)) of group_norm(a). */
static void attention(const fwd *f, const sd_vae_attn *at, int hw, float *a, float *b, float *c, float *q, float *k,
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

/* The posterior from the moments [n, 2L, hw]: mean = first L channels,
 * std = exp(0.5 * clamp(logvar, -30, 20)) of the rest, as diffusers'
 * DiagonalGaussianDistribution computes them (the gauss_std op). */
static void moments(const fwd *f, int L, size_t hw, const float *m, float *mean, float *std)
{
    size_t per = (size_t)L * hw;
    for (int b = 0; b < f->n; b++) {
        const float *mb = m + (size_t)b * 2 * per;
        f->be->d2d(f->pool, mean + (size_t)b * per, mb, per * sizeof(float));
        f->be->gauss_std_fwd(f->pool, per, std + (size_t)b * per, mb + per);
    }
}

/* conv_in, the down blocks, the mid block, norm_out + silu + conv_out,
 * quant_conv, then mean and std, for n images at once. */
static void encode_batch(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n, int h, int w,
                         const float *x, float *mean, float *std, float *ws)
{
    const sd_vae_config *cfg = &v->cfg;
    size_t big = (size_t)n * max_act(cfg, h, w);
    float *a = ws, *b = ws + big, *c = ws + 2 * big, *tail = ws + 3 * big;
    int lh, lw;
    sd_vae_latent_size(cfg, h, w, &lh, &lw);
    size_t t = (size_t)lh * (size_t)lw, top = (size_t)cfg->block_out[cfg->nblocks - 1];
    float *q = tail, *k = NULL, *vv = NULL, *lse = NULL;
    if (cfg->mid_attention) {
        k = q + (size_t)n * t * top;
        vv = k + (size_t)n * t * top;
        lse = vv + (size_t)n * t * top;
        tail = lse + (size_t)n * t;
    }
    fwd f = {.be = be, .pool = exec, .p = params, .cfg = cfg, .n = n, .mean = tail,
             .rstd = tail + (size_t)n * (size_t)cfg->groups};

    conv(&f, &v->conv_in, h, w, a, x);
    for (int i = 0; i < cfg->nblocks; i++) {
        for (int j = 0; j < cfg->layers_per_block; j++) resnet(&f, &v->res[i][j], h, w, a, b, c);
        if (i < cfg->nblocks - 1) {
            conv_down(&f, &v->down[i], h, w, b, a);
            float *s = a;
            a = b;
            b = s;
            h = down_size(h);
            w = down_size(w);
        }
    }
    resnet(&f, &v->mid[0], h, w, a, b, c);
    if (cfg->mid_attention) attention(&f, &v->attn, h * w, a, b, c, q, k, vv, lse);
    resnet(&f, &v->mid[1], h, w, a, b, c);
    norm_silu(&f, &v->norm_out, (int)top, h * w, b, a);
    conv(&f, &v->conv_out, h, w, c, b);
    const float *m = c;
    if (cfg->use_quant_conv) {
        conv(&f, &v->quant, h, w, b, c);
        m = b;
    }
    moments(&f, cfg->latent_channels, (size_t)h * (size_t)w, m, mean, std);
}

/* ---- 16-bit activations: the same layers, a, b, c stored as dt ---- */

/* y = silu(group_norm(x)) with typed x and y (y may be x). */
static void norm_silu_st(const fwd *f, int dt, const sd_vae_norm *nm, int c, int hw, void *y, const void *x)
{
    sd_gn_shape s = {.n = f->n, .c = c, .hw = hw, .groups = f->cfg->groups, .eps = f->cfg->eps};
    f->be->group_norm_fwd_st(f->pool, &s, 1, dt, y, f->mean, f->rstd, dt, x, f->p + nm->g, f->p + nm->b);
}

/* conv with torch's "same" padding or, down set, the (0, 1, 0, 1)-padded
 * stride-2 downsample; x and y typed as xdt / ydt. */
static void conv_st(const fwd *f, const sd_vae_conv *cv, int down, int h, int w, int ydt, void *y, int xdt,
                    const void *x)
{
    int p = cv->k / 2;
    sd_conv2d_shape s = {.n = f->n, .cin = cv->cin, .h = h, .w = w, .cout = cv->cout, .kh = cv->k, .kw = cv->k,
                         .stride = 1, .pad_t = p, .pad_b = p, .pad_l = p, .pad_r = p};
    if (down) {
        s.kh = s.kw = 3;
        s.stride = 2;
        s.pad_t = s.pad_l = 0;
        s.pad_b = s.pad_r = 1;
    }
    f->be->conv2d_fwd_st(f->pool, &s, ydt, y, xdt, x, f->p + cv->w, f->p + cv->b);
}

/* resnet() with typed buffers. */
static void resnet_st(const fwd *f, int dt, const sd_vae_resnet *r, int h, int w, void *a, void *b, void *c)
{
    int hw = h * w;
    size_t n = (size_t)f->n * (size_t)r->cout * (size_t)hw;
    norm_silu_st(f, dt, &r->n1, r->cin, hw, b, a);
    conv_st(f, &r->c1, 0, h, w, dt, c, dt, b);
    norm_silu_st(f, dt, &r->n2, r->cout, hw, c, c);
    conv_st(f, &r->c2, 0, h, w, dt, b, dt, c);
    if (r->has_sc) {
        conv_st(f, &r->sc, 0, h, w, dt, c, dt, a);
        f->be->add_fwd_st(f->pool, n, dt, a, c, b);
    } else {
        f->be->add_fwd_st(f->pool, n, dt, a, a, b);
    }
}

/* encode_batch with a, b, c stored as dt: the mid block's attention (at
 * the smallest resolution) runs in fp32 on a widened copy (in b and c's
 * room when it fits, wide_in_bc), and the last
 * conv writes fp32 moments, so only the 16-bit activations between layers
 * are rounded. */
static void encode_batch_st(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n, int h,
                            int w, const float *x, float *mean, float *std, float *ws)
{
    const sd_vae_config *cfg = &v->cfg;
    int dt = v->act_dtype;
    size_t big = half_floats((size_t)n * max_act(cfg, h, w));
    void *a = ws, *b = ws + big, *c = ws + 2 * big;
    float *tail = ws + 3 * big;
    int lh, lw;
    sd_vae_latent_size(cfg, h, w, &lh, &lw);
    size_t t = (size_t)lh * (size_t)lw, top = (size_t)cfg->block_out[cfg->nblocks - 1];
    float *q = tail, *k = NULL, *vv = NULL, *lse = NULL, *fa = NULL, *fb = NULL, *fc = NULL;
    if (cfg->mid_attention) {
        k = q + (size_t)n * t * top;
        vv = k + (size_t)n * t * top;
        lse = vv + (size_t)n * t * top;
        tail = lse + (size_t)n * t;
        size_t nt = (size_t)n * t * top;
        if (!wide_in_bc(nt, big)) { /* else set where the attention runs: a and b swap on the way down */
            fa = tail;
            fb = fa + nt;
            fc = fb + nt;
            tail = fc + nt;
        }
    }
    float *mom = tail;
    tail = mom + 2 * (size_t)n * (size_t)cfg->latent_channels * t;
    fwd f = {.be = be, .pool = exec, .p = params, .cfg = cfg, .n = n, .mean = tail,
             .rstd = tail + (size_t)n * (size_t)cfg->groups};

    conv_st(&f, &v->conv_in, 0, h, w, dt, a, SD_DT_F32, x);
    for (int i = 0; i < cfg->nblocks; i++) {
        for (int j = 0; j < cfg->layers_per_block; j++) resnet_st(&f, dt, &v->res[i][j], h, w, a, b, c);
        if (i < cfg->nblocks - 1) {
            conv_st(&f, &v->down[i], 1, h, w, dt, b, dt, a);
            void *s = a;
            a = b;
            b = s;
            h = down_size(h);
            w = down_size(w);
        }
    }
    resnet_st(&f, dt, &v->mid[0], h, w, a, b, c);
    if (cfg->mid_attention) {
        size_t nt = (size_t)n * t * top;
        if (!fa) {
            fa = b;
            fb = (float *)b + nt;
            fc = c;
        }
        be->convert_st(exec, nt, SD_DT_F32, fa, dt, a);
        attention(&f, &v->attn, h * w, fa, fb, fc, q, k, vv, lse);
        be->convert_st(exec, nt, dt, a, SD_DT_F32, fa);
    }
    resnet_st(&f, dt, &v->mid[1], h, w, a, b, c);
    norm_silu_st(&f, dt, &v->norm_out, (int)top, h * w, b, a);
    if (cfg->use_quant_conv) {
        conv_st(&f, &v->conv_out, 0, h, w, dt, c, dt, b);
        conv_st(&f, &v->quant, 0, h, w, SD_DT_F32, mom, dt, c);
    } else {
        conv_st(&f, &v->conv_out, 0, h, w, SD_DT_F32, mom, dt, b);
    }
    moments(&f, cfg->latent_channels, (size_t)h * (size_t)w, mom, mean, std);
}

/* Whether the backend can run this VAE's activation storage (vae.h). */
sd_status sd_vae_check_backend(const sd_vae *v, const sd_backend *be, sd_error *err)
{
    if (!act16(v) || (be->conv2d_fwd_st && be->group_norm_fwd_st && be->add_fwd_st && be->convert_st)) return SD_OK;
    return sd_err_set(err, SD_EUNSUPPORTED, "%s activations: the %s backend has no 16-bit activation ops yet (fp32 "
                      "only there)", sd_dtype_name(v->act_dtype), be->name);
}

/* One image at a time through encode_batch: an image's latents then never
 * depend on which images share its batch (GEMM tilings may differ with the
 * row count), so resumed or split sd-latents runs give the same bytes; on
 * the CPU a single 512x512 image already fills every thread. Ends with the
 * backend's sync, so a device failure is reported here. */
sd_status sd_vae_encode_on(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n, int h,
                           int w, const float *x, float *mean, float *std, float *ws, sd_error *err)
{
    sd_status st = sd_vae_check_input(v, n, h, w, err);
    if (!st) st = sd_vae_check_backend(v, be, err);
    if (st) return st;
    sd_vae_encode_queue(v, be, exec, params, n, h, w, 1, x, mean, std, ws);
    return be->sync(exec, err);
}

/* The ops of an encode, queued without waiting for them (a device runs
 * them while the caller goes on; the next sync reports a failure): one
 * image at a time (per_image, sd_vae_encode_on's order) or all in one
 * pass (sd_vae_encode_batch_on's). The size must have been checked. */
void sd_vae_encode_queue(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n, int h, int w,
                         int per_image, const float *x, float *mean, float *std, float *ws)
{
    void (*batch)(const sd_vae *, const sd_backend *, void *, const float *, int, int, int, const float *, float *,
                  float *, float *) = act16(v) ? encode_batch_st : encode_batch;
    if (!per_image) {
        batch(v, be, exec, params, n, h, w, x, mean, std, ws);
        return;
    }
    int lh, lw;
    sd_vae_latent_size(&v->cfg, h, w, &lh, &lw);
    size_t px = (size_t)3 * (size_t)h * (size_t)w, lat = (size_t)v->cfg.latent_channels * (size_t)lh * (size_t)lw;
    for (int i = 0; i < n; i++)
        batch(v, be, exec, params, 1, h, w, x + (size_t)i * px, mean + (size_t)i * lat, std + (size_t)i * lat,
                     ws);
}

/* All n images in one pass: what keeps a GPU busy (one 512x512 image does
 * not fill it). An image's latents may differ in the last bits from the
 * same image's in a batch of another size (the convolution algorithms
 * chosen depend on the batch size), so callers use fixed batch boundaries
 * when results must be reproducible. */
sd_status sd_vae_encode_batch_on(const sd_vae *v, const sd_backend *be, void *exec, const float *params, int n,
                                 int h, int w, const float *x, float *mean, float *std, float *ws, sd_error *err)
{
    sd_status st = sd_vae_check_input(v, n, h, w, err);
    if (!st) st = sd_vae_check_backend(v, be, err);
    if (st) return st;
    sd_vae_encode_queue(v, be, exec, params, n, h, w, 0, x, mean, std, ws);
    return be->sync(exec, err);
}

/* The host-memory case: parameters from the model's own flat buffer. */
sd_status sd_vae_encode(const sd_vae *v, const sd_backend *be, sd_pool *pool, int n, int h, int w, const float *x,
                        float *mean, float *std, float *ws, sd_error *err)
{
    return sd_vae_encode_on(v, be, pool, v->w.data, n, h, w, x, mean, std, ws, err);
}
