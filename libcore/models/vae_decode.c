/* The VAE decoder's forward pass (diffusers Decoder after post_quant_conv,
 * on latents divided by the scaling factor), over three ping-pong
 * activation buffers sized for the largest stage, one image at a time. */
#include <math.h>

#include "vae_decode.h"
#include "vae_int.h"

/* Image size for lh x lw latents: every up block but the last doubles. */
void sd_vae_decoded_size(const sd_vae_config *cfg, int lh, int lw, int *h, int *w)
{
    *h = lh << (cfg->nblocks - 1);
    *w = lw << (cfg->nblocks - 1);
}

/* The input check every decode entry point shares (vae_decode.h): the
 * image side stays within 65536 pixels. */
sd_status sd_vae_decode_check_input(const sd_vae_decoder *d, int n, int lh, int lw, sd_error *err)
{
    int most = 65536 >> (d->cfg.nblocks - 1);
    if (n < 1 || lh < 1 || lw < 1 || lh > most || lw > most)
        return sd_err_set(err, SD_EINVAL, "VAE decode: bad latent size %dx%dx%d (each side 1..%d)", n, lh, lw, most);
    return SD_OK;
}

/* Floats of the largest activation of one image: the latents at their
 * resolution, then each up block at its stage's resolution with its input
 * and output widths (an upsample's output is the next stage's input). */
static size_t max_act(const sd_vae_config *c, int h, int w)
{
    int top = c->block_out[c->nblocks - 1];
    size_t hw = (size_t)h * (size_t)w;
    size_t m = (size_t)(c->latent_channels > top ? c->latent_channels : top) * hw;
    int cin = top;
    for (int i = 0; i < c->nblocks; i++) {
        int cout = c->block_out[c->nblocks - 1 - i];
        size_t a = (size_t)(cin > cout ? cin : cout) * hw;
        if (a > m) m = a;
        cin = cout;
        if (i < c->nblocks - 1) hw *= 4;
    }
    return m;
}

/* Three activation buffers, the attention's q/k/v and log-sum-exp at the
 * latent resolution, norm stats. */
size_t sd_vae_decode_workspace_floats(const sd_vae_decoder *d, int lh, int lw)
{
    const sd_vae_config *c = &d->cfg;
    size_t t = (size_t)lh * (size_t)lw, top = (size_t)c->block_out[c->nblocks - 1];
    size_t attn = c->mid_attention ? 3 * t * top + t : 0;
    return 3 * max_act(c, lh, lw) + attn + 2 * (size_t)c->groups;
}

/* One image: z / scaling_factor, post_quant_conv, conv_in, the mid block,
 * the up blocks (resnets, then nearest 2x and a conv), norm_out + SiLU,
 * conv_out into img. */
static void decode_one(const sd_vae_decoder *d, const sd_backend *be, void *exec, const float *params, int h, int w,
                       const float *z, float *img, float *ws)
{
    const sd_vae_config *cfg = &d->cfg;
    size_t big = max_act(cfg, h, w), t = (size_t)h * (size_t)w;
    size_t top = (size_t)cfg->block_out[cfg->nblocks - 1];
    float *a = ws, *b = ws + big, *c = ws + 2 * big, *tail = ws + 3 * big;
    float *q = tail, *k = NULL, *vv = NULL, *lse = NULL;
    if (cfg->mid_attention) {
        k = q + t * top;
        vv = k + t * top;
        lse = vv + t * top;
        tail = lse + t;
    }
    sd_vae_fwd f = {.be = be, .pool = exec, .p = params, .cfg = cfg, .n = 1, .mean = tail, .rstd = tail + cfg->groups};

    be->scale_fwd(exec, (size_t)cfg->latent_channels * t, b, z, (float)(1.0 / cfg->scaling_factor));
    const float *in = b;
    if (cfg->use_post_quant_conv) {
        sd_vae_conv_fwd(&f, &d->post_quant, h, w, c, b);
        in = c;
    }
    sd_vae_conv_fwd(&f, &d->conv_in, h, w, a, in);
    sd_vae_resnet_fwd(&f, &d->mid[0], h, w, a, b, c);
    if (cfg->mid_attention) sd_vae_attn_fwd(&f, &d->attn, h * w, a, b, c, q, k, vv, lse);
    sd_vae_resnet_fwd(&f, &d->mid[1], h, w, a, b, c);
    for (int i = 0; i < cfg->nblocks; i++) {
        for (int j = 0; j < cfg->layers_per_block + 1; j++) sd_vae_resnet_fwd(&f, &d->res[i][j], h, w, a, b, c);
        if (i < cfg->nblocks - 1) {
            be->upsample2x_fwd(exec, d->up[i].cin, h, w, b, a);
            h *= 2;
            w *= 2;
            sd_vae_conv_fwd(&f, &d->up[i], h, w, a, b);
        }
    }
    sd_vae_norm_silu(&f, &d->norm_out, cfg->block_out[0], h * w, b, a);
    sd_vae_conv_fwd(&f, &d->conv_out, h, w, img, b);
}

/* One image at a time, so an image never depends on its batch; ends with
 * the backend's sync, which reports a device failure. */
sd_status sd_vae_decode_on(const sd_vae_decoder *d, const sd_backend *be, void *exec, const float *params, int n,
                           int lh, int lw, const float *z, float *img, float *ws, sd_error *err)
{
    sd_status st = sd_vae_decode_check_input(d, n, lh, lw, err);
    if (st) return st;
    int h, w;
    sd_vae_decoded_size(&d->cfg, lh, lw, &h, &w);
    size_t lat = (size_t)d->cfg.latent_channels * (size_t)lh * (size_t)lw;
    size_t px = (size_t)d->cfg.out_channels * (size_t)h * (size_t)w;
    for (int i = 0; i < n; i++) decode_one(d, be, exec, params, lh, lw, z + (size_t)i * lat, img + (size_t)i * px, ws);
    return be->sync(exec, err);
}

/* Host memory: the decoder's own parameter buffer. */
sd_status sd_vae_decode(const sd_vae_decoder *d, const sd_backend *be, sd_pool *pool, int n, int lh, int lw,
                        const float *z, float *img, float *ws, sd_error *err)
{
    return sd_vae_decode_on(d, be, pool, d->w.data, n, lh, lw, z, img, ws, err);
}

/* diffusers' postprocess ("pil" output): (x / 2 + 0.5).clamp(0, 1) in
 * fp32, then numpy's (x * 255).round() (half to even) as uint8, planes
 * interleaved. */
void sd_vae_image_to_rgb8(int n, int h, int w, const float *img, uint8_t *rgb)
{
    size_t hw = (size_t)h * (size_t)w;
    for (size_t b = 0; b < (size_t)n; b++)
        for (size_t c = 0; c < 3; c++)
            for (size_t i = 0; i < hw; i++) {
                float v = img[(b * 3 + c) * hw + i] / 2.0f + 0.5f;
                v = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
                float s = nearbyintf(v * 255.0f); /* ties to even in the default rounding mode */
                rgb[(b * hw + i) * 3 + c] = s == s ? (uint8_t)s : 0;
            }
}
