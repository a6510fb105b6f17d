/* --sample-prompts in the memory plan (mem_plan.h): what rendering the
 * samples (train_samples.c, through libcore/models' txt2img.h) holds on
 * top of the training buffers, which stay allocated meanwhile. Sizes come
 * from the functions that allocate them: the VAE decoder's parameter
 * table (sd_vae_decoder_layout: nothing read) and its decode workspace
 * (sd_vae_decode_workspace_floats), the inference graph of the UNet
 * (sd_unet_plan, checkpointed as sample_denoise.c plans it) with the
 * forward walked on the planning backend for its op scratch, the
 * sampler's and the image's buffers as sd_sample_generate allocates them,
 * and the conditioning train_samples.c keeps per prompt line. */
#include <stdlib.h>
#include <string.h>

#include "mem_plan.h"
#include "plan_backend.h"
#include "slurp.h"
#include "train_int.h"
#include "txt2img.h"
#include "vae_decode.h"

/* One sample image's shape: the guidance batch (2 with CFG > 1) and size. */
typedef struct {
    int n, w, h;
} shape;

/* The model the samples take their VAE and text encoders from, in
 * train_samples.c's order. */
static const char *sample_model(const sd_train_opts *o)
{
    return o->sample_model ? o->sample_model : o->base_model ? o->base_model : o->unet;
}

/* The lines of the prompts file as train_samples.c reads them (a bad line
 * is left out, as it is there; nothing logged: the run names them). */
static sd_status read_shapes(const char *path, int dw, int dh, shape **out, size_t *n, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_status rc = sd_read_file(path, &text, err);
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    sd_sample_job def, j;
    sd_sample_job_default(&def);
    char why[256];
    for (size_t at = 0; !rc && at < text.len;) {
        char *line = (char *)text.data + at, *nl = memchr(line, '\n', text.len - at);
        size_t len = nl ? (size_t)(nl - line) : text.len - at;
        at += len + 1;
        if (sd_sample_parse_line(line, len, &def, &j, why, sizeof why)) continue;
        free(j.prompt);
        free(j.negative);
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            shape *s = realloc(*out, cap * sizeof(*s));
            if (!s) {
                rc = sd_err_set(err, SD_ENOMEM, "out of memory");
                break;
            }
            *out = s;
        }
        (*out)[(*n)++] = (shape){j.cfg > 1 ? 2 : 1, j.width ? j.width : dw, j.height ? j.height : dh};
    }
    sd_buf_free(&text);
    return rc;
}

/* One image's buffers, as sd_sample_generate holds them at its peak:
 * *unet the inference graph's activations, the largest op's scratch on top
 * and the staging of the predictions (on the run's backend); *decode the
 * decoder's workspace, latent and image buffers (on the backend); *host
 * the latent, the sampler's state, the decoded image, its 8-bit RGB and
 * PNG. An image the UNet cannot take (it fails alone at the run) adds
 * nothing. */
static void plan_image(const sd_train_opts *o, const sd_unet *u, const sd_vae_decoder *vae, int tctx, shape s,
                       size_t *unet, size_t *decode, size_t *host)
{
    const sd_vae_config *vc = &vae->cfg;
    int f = 1 << (vc->nblocks - 1), lh = s.h / f, lw = s.w / f;
    sd_unet_graph g = {0};
    *unet = *decode = *host = 0;
    if (s.w % f || s.h % f || sd_unet_plan(u, s.n, lh, lw, tctx, 1, &g, NULL)) return;
    size_t wbytes = u->w.total * sizeof(float), per = (size_t)u->cfg.in_channels * (size_t)lh * (size_t)lw;
    sd_plan_exec x;
    if (!sd_plan_exec_init(&x, sd_plan_round(wbytes) + sd_plan_round(g.nact * sizeof(float)), o->threads, NULL)) {
        x.device = o->device >= 0;
        x.attn_flash = o->attn_flash;
        x.attn_block = o->attn_block;
        const sd_backend *be = sd_backend_plan();
        float *w = be->alloc(&x, wbytes), *act = be->alloc(&x, g.nact * sizeof(float));
        if (w && act) {
            sd_unet_forward(u, &g, be, &x, w, act);
            /* the walk's peak less the weights, which the training already holds */
            *unet = x.peak_total - sd_plan_round(wbytes) + (size_t)s.n * per * sizeof(float);
        }
        sd_plan_exec_free(&x);
    }
    sd_unet_graph_free(&g);
    size_t px = (size_t)s.w * (size_t)s.h, lat = (size_t)vc->latent_channels * (size_t)lh * (size_t)lw;
    *decode = (sd_vae_decode_workspace_floats(vae, lh, lw) + lat + (size_t)vc->out_channels * px) * sizeof(float);
    /* lat and img of sd_sample_generate, the sampler's 6 latents, rgb and its PNG (at most the raw rows) */
    *host = (per + 6 * per + 3 * px) * sizeof(float) + 3 * px + (3 * px + (size_t)s.h);
}

/* See mem_plan.h. */
sd_status sd_mem_plan_samples(const sd_train_opts *o, const sd_unet *u, const sd_data *d, int rank, sd_mem_plan *p,
                              sd_error *err)
{
    if (!o->sample_prompts || rank != 0) return SD_OK; /* rank 0 alone samples */
    sd_vae_decoder vae;
    memset(&vae, 0, sizeof vae);
    sd_sample_source src = {.path = sample_model(o)};
    if (!src.path || sd_vae_decoder_layout(&vae, src.path, NULL, NULL)) {
        sd_vae_decoder_free(&vae);
        return SD_OK; /* no usable VAE: the run warns and renders nothing */
    }
    const sd_unet_config *c = &u->cfg;
    sd_load_opts lo = sd_train_unet_load_opts(c);
    int tctx = sd_clip_kohya_rows(sd_data_caption_tokens(d, &lo)), dw, dh, side = c->sample_size > 0 ? c->sample_size : 64;
    sd_vae_decoded_size(&vae.cfg, side, side, &dh, &dw);
    shape *sh = NULL;
    size_t n = 0;
    sd_status rc = read_shapes(o->sample_prompts, dw, dh, &sh, &n, err);
    int device = o->device >= 0;
    size_t unet = 0, decode = 0, host = 0, cond = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t a, b, h;
        plan_image(o, u, &vae, tctx, sh[i], &a, &b, &h);
        /* the graph's and the decoder's buffers grow to the largest image and stay until the step's last */
        unet = a > unet ? a : unet;
        decode = b > decode ? b : decode;
        host = h > host ? h : host;
        if (a && (size_t)sh[i].w * sh[i].h >= (size_t)p->sample_w * p->sample_h) {
            p->sample_w = sh[i].w;
            p->sample_h = sh[i].h;
        }
        cond += (size_t)sh[i].n * ((size_t)tctx * (size_t)c->cross_dim + (size_t)lo.pooled) * sizeof(float);
    }
    size_t vae_bytes = vae.w.total * sizeof(float), wbytes = u->w.total * sizeof(float);
    sd_vae_decoder_free(&vae);
    free(sh);
    if (rc) return rc;
    /* kept for the whole run (host memory): the decoder's weights and every line's conditioning */
    p->sample_vae = vae_bytes;
    p->sample_cond = cond;
    p->sample_unet = unet;
    p->sample_decode = decode;
    /* the weights sampled from, where they are not already in place: bf16 weights without a gradient
     * buffer to widen into (--fused-backward), or a host EMA lent to the device */
    size_t lent = (o->weight_dtype == SD_DT_BF16 && o->fused_backward) || (device && o->ema_host && o->ema_decay > 0)
                      ? wbytes
                      : 0;
    if (device) /* the plan is the device's: the decoder's weights go up for the samples; host buffers do not count */
        p->samples = vae_bytes + unet + decode + lent;
    else
        p->samples = vae_bytes + cond + unet + decode + host + lent;
    return SD_OK;
}
