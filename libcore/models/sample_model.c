/* The text-to-image model (sd-sample's, and sd-train's for its samples): a
 * diffusers folder's (or a single-file checkpoint's) tokenizer(s) and text
 * encoder(s), UNet (sd-sample only), VAE decoder and the scheduler's
 * prediction type, put on the run's backend; and a prompt's text
 * conditioning. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "model_dir.h"
#include "txt2img.h"

/* The folder's last path component, for A1111's "Model:" field. */
static void model_name(const char *path, char *out, size_t cap)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t s = len;
    while (s > 0 && path[s - 1] != '/') s--;
    snprintf(out, cap, "%.*s", (int)(len - s), path + s);
    char *dot = strrchr(out, '.');
    if (dot && !strcmp(dot, ".safetensors")) *dot = 0;
}

/* Tokenizer and encoder `which` (0, or 1 for SDXL's second). */
static sd_status open_encoder(sd_sample_model *m, const sd_sample_source *src, int which, sd_error *err)
{
    sd_clip_text_opts o = {.which = which, .config_path = src->text_config[which]};
    sd_status st = sd_clip_text_load(&m->enc[which], src->path, &o, err);
    if (st) return st;
    m->enc_loaded[which] = 1;
    return sd_clip_tok_load_model(src->tokenizer ? src->tokenizer : src->path, which + 1, &m->tok[which], err);
}

/* Load the text side: one encoder (SD 1.x: last layer, SD 2.x: OpenCLIP's
 * penultimate), or SDXL's two (a folder with text_encoder_2/, a file with
 * conditioner.embedders.1; both penultimate, the second's pooled output);
 * the context width is their sum. */
static sd_status open_text(sd_sample_model *m, const sd_sample_source *src, sd_error *err)
{
    char p2[4096];
    snprintf(p2, sizeof p2, "%s/text_encoder_2", src->path);
    m->sdxl = sd_is_dir(p2);
    sd_status st = SD_OK;
    if (!sd_is_dir(src->path)) st = sd_clip_text_file_has_second(src->path, &m->sdxl, err);
    if (st) return st;
    m->n_enc = m->sdxl ? 2 : 1;
    m->work = sd_clip_work_new();
    if (!m->work) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_enc && !st; i++) st = open_encoder(m, src, i, err);
    if (st) return st;
    if (m->sdxl) {
        st = sd_clip_text_preset(&m->enc[0], SD_CLIP_SDXL_L, 0, &m->out[0], err);
        if (!st) st = sd_clip_text_preset(&m->enc[1], SD_CLIP_SDXL_G, 0, &m->out[1], err);
        m->pooled_dim = sd_clip_text_pooled_dim(&m->enc[1]);
    } else {
        sd_clip_variant v = m->enc[0].cfg.act == SD_CLIP_GELU ? SD_CLIP_SD2 : SD_CLIP_SD1;
        st = sd_clip_text_preset(&m->enc[0], v, 0, &m->out[0], err);
    }
    m->max_tokens = src->max_tokens ? src->max_tokens : 75;
    m->tctx = sd_clip_kohya_rows(m->max_tokens);
    if (!st && !m->tctx)
        return sd_err_set(err, SD_EINVAL, "--max-tokens %d: expected 75, 150 or 225", src->max_tokens);
    m->cross = 0;
    for (int i = 0; i < m->n_enc; i++) m->cross += m->enc[i].cfg.width;
    return st;
}

/* The UNet must take what the text side gives: the context width, and for
 * SDXL the pooled width plus six time ids (a model folder mixing families
 * fails here, naming both numbers; see txt2img.h). */
sd_status sd_sample_model_fits(const sd_sample_model *m, const sd_unet *unet, const char *path, sd_error *err)
{
    const sd_unet_config *c = &unet->cfg;
    if (c->cross_dim != m->cross)
        return sd_err_set(err, SD_EFORMAT, "%s: the text encoder%s give%s %d-wide embeddings, the UNet's "
                          "cross_attention_dim is %d (components of different model families?)", path,
                          m->n_enc > 1 ? "s" : "", m->n_enc > 1 ? "" : "s", m->cross, c->cross_dim);
    if (m->sdxl != !!c->text_time)
        return sd_err_set(err, SD_EFORMAT, "%s: %s, but the UNet %s SDXL's text_time conditioning", path,
                          m->sdxl ? "two text encoders (SDXL)" : "one text encoder", c->text_time ? "takes" : "lacks");
    if (m->sdxl && c->add_in_dim != m->pooled_dim + SD_UNET_TIME_IDS * c->add_time_dim)
        return sd_err_set(err, SD_EFORMAT, "%s: pooled width %d + 6 x %d time ids differ from the UNet's "
                          "projection_class_embeddings_input_dim %d", path, m->pooled_dim, c->add_time_dim,
                          c->add_in_dim);
    if (c->in_channels != m->vae.cfg.latent_channels || c->out_channels != m->vae.cfg.latent_channels)
        return sd_err_set(err, SD_EFORMAT, "%s: the UNet takes %d channels and gives %d, the VAE's latents have %d",
                          path, c->in_channels, c->out_channels, m->vae.cfg.latent_channels);
    return SD_OK;
}

/* The prediction type: src->prediction, else a folder's
 * scheduler/scheduler_config.json, else epsilon (a single file cannot say:
 * a v model needs --prediction v_prediction, warned about). */
static sd_status read_prediction(sd_sample_model *m, const sd_sample_source *src, sd_error *err)
{
    char pred[64] = "", from[4096] = "--prediction";
    if (src->prediction) snprintf(pred, sizeof pred, "%s", src->prediction);
    else if (sd_is_dir(src->path)) {
        sd_status st = sd_model_prediction(src->path, pred, sizeof pred, from, sizeof from, err);
        if (st) return st;
    } else {
        sd_log(SD_LOG_WARN, "%s: a single file does not say its prediction type: epsilon assumed (SD 2.x-768 and "
               "other v models need --prediction v_prediction)", src->path);
    }
    if (!pred[0] || !strcmp(pred, "epsilon")) m->pred = SD_PRED_EPSILON;
    else if (!strcmp(pred, "v_prediction")) m->pred = SD_PRED_V;
    else
        return sd_err_set(err, SD_EUNSUPPORTED, "%s: prediction_type \"%s\" (epsilon and v_prediction are supported)",
                          from, pred);
    return SD_OK;
}

/* The UNet's weights on the backend (the CPU uses its own buffer). */
static sd_status unet_to_backend(sd_sample_model *m, sd_error *err)
{
    if (!m->be->is_device) {
        m->params = m->unet.w.data;
        return SD_OK;
    }
    size_t bytes = m->unet.w.total * sizeof(float);
    m->params = m->be->alloc(m->exec, bytes);
    if (!m->params) return sd_err_set(err, SD_ENOMEM, "out of device memory for the UNet (%zu MiB)", bytes >> 20);
    m->be->h2d(m->exec, m->params, m->unet.w.data, bytes);
    return m->be->sync(m->exec, err);
}

/* Load everything (see txt2img.h); on failure the caller closes. */
sd_status sd_sample_model_open(sd_sample_model *m, const sd_sample_source *src, const sd_backend *be, void *exec,
                            sd_error *err)
{
    memset(m, 0, sizeof(*m));
    m->be = be;
    m->exec = exec;
    const char *path = src->path;
    model_name(path, m->name, sizeof m->name);
    if (!sd_is_dir(path) && !sd_is_file(path))
        return sd_err_set(err, SD_ENOTFOUND, "--model %s: no such file or folder", path);
    if (!sd_is_dir(path) && !src->tokenizer)
        return sd_err_set(err, SD_EINVAL, "--model %s: a single-file checkpoint needs --tokenizer DIR (a folder "
                          "holding tokenizer/ and, for SDXL, tokenizer_2/)", path);
    sd_status st = open_text(m, src, err);
    if (!st && !src->no_unet) {
        sd_unet_opts uo = {.config_path = src->unet_config};
        st = sd_unet_load(&m->unet, path, &uo, err);
        m->unet_loaded = !st;
    }
    if (!st) {
        sd_vae_opts vo = {.config_path = src->vae_config};
        st = sd_vae_decoder_load(&m->vae, path, &vo, err);
        m->vae_loaded = !st;
    }
    if (!st && !src->no_unet) st = sd_sample_model_fits(m, &m->unet, path, err);
    if (!st) st = read_prediction(m, src, err);
    for (int i = 0; i < m->n_enc && !st; i++) st = sd_clip_text_runner_init(&m->run[i], &m->enc[i], be, exec, err);
    if (!st) st = sd_vae_decode_runner_init(&m->vrun, &m->vae, be, exec, err);
    if (!st && !src->no_unet) st = unet_to_backend(m, err);
    if (!st)
        sd_log(SD_LOG_INFO, "model %s: %s, UNet %s, VAE %s, %s prediction", path,
               m->sdxl ? "SDXL" : m->enc[0].cfg.act == SD_CLIP_GELU ? "SD 2.x" : "SD 1.x",
               src->no_unet ? "(the trained one)" : m->unet.layout, m->vae.layout, m->pred == SD_PRED_V ? "v" : "epsilon");
    return st;
}

/* Free the text side (see txt2img.h); safe twice. */
void sd_sample_model_drop_text(sd_sample_model *m)
{
    for (int i = 0; i < 2; i++) {
        sd_clip_text_runner_free(&m->run[i]);
        if (m->enc_loaded[i]) sd_clip_text_free(&m->enc[i]);
        if (m->tok[i]) sd_clip_tok_free(m->tok[i]);
        m->enc_loaded[i] = 0;
        m->tok[i] = NULL;
    }
    if (m->work) sd_clip_work_free(m->work);
    m->work = NULL;
    sd_clip_ids_free(&m->ids);
    m->n_enc = 0;
}

/* Free the UNet's workspace (see txt2img.h); the next image plans again. */
void sd_sample_model_release_work(sd_sample_model *m)
{
    if (m->be && m->be->is_device) {
        if (m->act) m->be->release(m->exec, m->act);
    } else {
        free(m->act);
    }
    m->act = NULL;
    m->act_cap = 0;
    sd_unet_graph_free(&m->g);
    m->gn = m->gh = m->gw = 0;
    free(m->stage);
    m->stage = NULL;
    m->stage_cap = 0;
    sd_vae_decode_runner_free(&m->vrun); /* its workspace too: sd_sample_generate sets it up again */
    memset(&m->vrun, 0, sizeof m->vrun);
}

/* Release everything sd_sample_model_open and the sampling made. */
void sd_sample_model_close(sd_sample_model *m)
{
    sd_sample_model_drop_text(m);
    sd_sample_model_release_work(m);
    if (m->be && m->be->is_device && m->params) m->be->release(m->exec, m->params);
    if (m->unet_loaded) sd_unet_free(&m->unet);
    if (m->vae_loaded) sd_vae_decoder_free(&m->vae);
    memset(m, 0, sizeof(*m));
}

/* diffusers' default: unet.config.sample_size * vae_scale_factor. */
void sd_sample_model_default_size(const sd_sample_model *m, const sd_unet *unet, int *w, int *h)
{
    int s = unet->cfg.sample_size > 0 ? unet->cfg.sample_size : 64;
    sd_vae_decoded_size(&m->vae.cfg, s, s, h, w);
}

/* One prompt through each encoder: its 77-long chunks of ids (one for 75
 * tokens: the 77 padded ids), each encoded alone, the hidden states joined
 * into tctx rows as sd-latents joins them and placed side by side in ctx;
 * SDXL's pooled output from the second encoder's first chunk. */
sd_status sd_sample_model_text(sd_sample_model *m, const char *prompt, float *ctx, float *pooled, sd_error *err)
{
    int off = 0;
    for (int i = 0; i < m->n_enc; i++) {
        int32_t ids[3 * SD_CLIP_CTX];
        size_t wd = (size_t)m->enc[i].cfg.width, rows = (size_t)m->tctx, pdim = (size_t)m->pooled_dim;
        sd_status st = sd_clip_encode(m->tok[i], m->work, prompt, strlen(prompt), &m->ids, err);
        if (st) return st;
        if (i == 0 && m->ids.n > (size_t)m->max_tokens + 2) /* the ids hold BOS + tokens + EOS */
            sd_log(SD_LOG_WARN, "a prompt of %zu tokens is cut to its first %d (--max-tokens: 75, 150 or 225): "
                   "\"%.60s%s\"", m->ids.n - 2, m->max_tokens, prompt, strlen(prompt) > 60 ? "..." : "");
        const sd_clip_tok *tk = m->tok[i];
        size_t k = sd_clip_kohya_chunks(m->ids.ids, m->ids.n, sd_clip_tok_eos(tk), sd_clip_tok_pad(tk), m->max_tokens,
                                        ids);
        float *h = malloc(k * SD_CLIP_CTX * wd * sizeof(float)), *joined = k > 1 ? malloc(rows * wd * sizeof(float)) : h;
        float *p = i == 1 && k > 1 ? malloc(k * pdim * sizeof(float)) : pooled;
        if (!h || !joined || (i == 1 && !p)) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        if (!st)
            st = sd_clip_text_runner_encode(&m->run[i], &m->enc[i], (int)k, SD_CLIP_CTX, ids, &m->out[i], h,
                                            i == 1 ? p : NULL, err);
        if (!st && k > 1) {
            sd_clip_kohya_join(h, k, wd, joined);
            if (i == 1) memcpy(pooled, p, pdim * sizeof(float)); /* the first chunk's, as sd-scripts' pool2[::n] */
        }
        for (size_t t = 0; t < rows && !st; t++)
            memcpy(ctx + t * (size_t)m->cross + off, joined + t * wd, wd * sizeof(float));
        if (joined != h) free(joined);
        if (p != pooled) free(p);
        free(h);
        if (st) return st;
        off += (int)wd;
    }
    return SD_OK;
}
