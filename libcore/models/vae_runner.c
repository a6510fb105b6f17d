/* The VAE encoder on any backend from host buffers: the parameters are
 * copied into the backend's memory once, the workspace and the image and
 * latent buffers live there and grow on demand, and each call copies a
 * batch in, encodes it and copies the moments back. This is what a tool
 * needs to switch from the CPU to a GPU (sd-latents --device cuda:K):
 * replace sd_vae_encode by sd_vae_runner_encode. On the CPU backend the
 * parameters are the model's own (no copy), the other copies are memcpy,
 * and the results equal sd_vae_encode's bit for bit. */
#include <string.h>

#include "vae.h"

/* A runner buffer of at least `floats` (sd_backend_grow; *cap in bytes). */
static sd_status grow(sd_vae_runner *r, float **p, size_t *cap, size_t floats, const char *what, sd_error *err)
{
    void *v = *p;
    sd_status st = sd_backend_grow(r->be, r->exec, &v, cap, floats * sizeof(float), "VAE", what, err);
    *p = v;
    return st;
}

/* Release one buffer and clear its pointer. */
static void drop(sd_vae_runner *r, float **p)
{
    void *v = *p;
    sd_backend_drop(r->be, r->exec, &v);
    *p = NULL;
}

/* Parameters into the backend's memory; a host backend's memory is host
 * memory, so there the model's own buffer serves (a second copy of the
 * weights would only double the resident size). */
sd_status sd_vae_runner_init(sd_vae_runner *r, const sd_vae *v, const sd_backend *be, void *exec, sd_error *err)
{
    memset(r, 0, sizeof *r);
    r->be = be;
    r->exec = exec;
    r->whole_batch = be->is_device;
    return sd_backend_params_in(be, exec, v->w.data, v->w.total, &r->params, &r->params_borrowed, "VAE", err);
}

/* x [n, 3, h, w] in host memory into the backend and its encode queued
 * (on a host backend: run); x may be reused when this returns. One batch
 * at a time: the previous one must have been collected. */
sd_status sd_vae_runner_submit(sd_vae_runner *r, const sd_vae *v, int n, int h, int w, const float *x, sd_error *err)
{
    sd_status st = sd_vae_check_input(v, n, h, w, err);
    if (!st) st = sd_vae_check_backend(v, r->be, err);
    if (st) return st;
    st = SD_ENOMEM;
    if (r->pending) return sd_err_set(err, SD_EINVAL, "VAE encode: the previous batch was not collected");
    int lh, lw;
    sd_vae_latent_size(&v->cfg, h, w, &lh, &lw);
    size_t px = (size_t)n * 3 * (size_t)h * (size_t)w;
    size_t lat = (size_t)n * (size_t)v->cfg.latent_channels * (size_t)lh * (size_t)lw;
    int whole = r->whole_batch && n > 1;
    if (whole) { /* too big for the device: one image at a time */
        sd_error why = {0};
        st = grow(r, &r->ws, &r->ws_cap, sd_vae_batch_workspace_floats(v, n, h, w), "workspace", &why);
        whole = st == SD_OK;
        if (!whole) r->whole_batch = 0; /* not again for every batch: each failed try empties the cache */
    }
    if (!whole) st = grow(r, &r->ws, &r->ws_cap, sd_vae_workspace_floats(v, n, h, w), "workspace", err);
    if (!st) st = grow(r, &r->x, &r->x_cap, px, "image buffer", err);
    if (!st) st = grow(r, &r->mean, &r->mean_cap, lat, "latent buffer", err);
    if (!st) st = grow(r, &r->std, &r->std_cap, lat, "latent buffer", err);
    if (st) return st;
    r->be->h2d(r->exec, r->x, x, px * sizeof(float));
    sd_vae_encode_queue(v, r->be, r->exec, r->params, n, h, w, !whole, r->x, r->mean, r->std, r->ws);
    r->pending = lat;
    return SD_OK;
}

/* Waits for the submitted batch and copies its mean and std [n, latent,
 * lh, lw] into host memory; the first failure since submit is returned. */
sd_status sd_vae_runner_collect(sd_vae_runner *r, float *mean, float *std, sd_error *err)
{
    size_t lat = r->pending;
    if (!lat) return sd_err_set(err, SD_EINVAL, "VAE encode: no batch submitted");
    r->pending = 0;
    sd_status st = r->be->sync(r->exec, err);
    if (st) return st;
    r->be->d2h(r->exec, mean, r->mean, lat * sizeof(float));
    r->be->d2h(r->exec, std, r->std, lat * sizeof(float));
    return r->be->sync(r->exec, err);
}

/* Submit and collect in one call: x [n, 3, h, w] in host memory -> mean,
 * std [n, latent, lh, lw] in host memory, through the backend. */
sd_status sd_vae_runner_encode(sd_vae_runner *r, const sd_vae *v, int n, int h, int w, const float *x, float *mean,
                               float *std, sd_error *err)
{
    sd_status st = sd_vae_runner_submit(r, v, n, h, w, x, err);
    return st ? st : sd_vae_runner_collect(r, mean, std, err);
}

/* One image's workspace: what submit grows to when it goes one at a time
 * (sd_vae_workspace_floats is the same for any n). */
size_t sd_vae_runner_image_workspace(const sd_vae *v, int h, int w)
{
    return sd_vae_workspace_floats(v, 1, h, w) * sizeof(float);
}

/* A size whose workspace cannot be had is then known before its images are
 * decoded (a tall bucket's decode can take minutes), not at submit. */
sd_status sd_vae_runner_reserve(sd_vae_runner *r, const sd_vae *v, int h, int w, sd_error *err)
{
    sd_status st = sd_vae_check_input(v, 1, h, w, err);
    if (st) return st;
    size_t bytes = sd_vae_runner_image_workspace(v, h, w);
    if (r->ws && r->ws_cap >= bytes) return SD_OK;
    if (r->pending) return sd_err_set(err, SD_EINVAL, "VAE workspace: the previous batch was not collected");
    return grow(r, &r->ws, &r->ws_cap, bytes / sizeof(float), "workspace", err);
}

/* One image at a time from now on, and the whole batch's workspace (about
 * n times one image's) given back, so the retry that follows has the
 * room. 0 when it went one at a time already. */
int sd_vae_runner_one_at_a_time(sd_vae_runner *r)
{
    if (!r->whole_batch) return 0;
    r->whole_batch = 0;
    drop(r, &r->ws);
    r->ws_cap = 0;
    return 1;
}

/* Everything the runner holds in the backend's memory. */
void sd_vae_runner_free(sd_vae_runner *r)
{
    if (!r->be) return;
    if (r->params_borrowed) r->params = NULL; /* the model's, not ours */
    drop(r, &r->params);
    drop(r, &r->ws);
    drop(r, &r->x);
    drop(r, &r->mean);
    drop(r, &r->std);
    r->ws_cap = r->x_cap = r->mean_cap = r->std_cap = 0;
}
