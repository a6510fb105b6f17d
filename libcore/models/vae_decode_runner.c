/* The VAE decoder on any backend from host buffers: parameters copied into
 * the backend's memory once (a host backend's are the decoder's own), the
 * workspace, latent and image buffers kept there and grown on demand. */
#include <string.h>

#include "vae_decode.h"

/* A runner buffer of at least `floats` (sd_backend_grow; *cap in bytes). */
static sd_status grow(sd_vae_decode_runner *r, float **p, size_t *cap, size_t floats, const char *what, sd_error *err)
{
    void *v = *p;
    sd_status st = sd_backend_grow(r->be, r->exec, &v, cap, floats * sizeof(float), "VAE decoder", what, err);
    *p = v;
    return st;
}

/* Parameters into the backend's memory (on the host: borrowed). */
sd_status sd_vae_decode_runner_init(sd_vae_decode_runner *r, const sd_vae_decoder *d, const sd_backend *be,
                                    void *exec, sd_error *err)
{
    memset(r, 0, sizeof *r);
    r->be = be;
    r->exec = exec;
    return sd_backend_params_in(be, exec, d->w.data, d->w.total, &r->params, &r->params_borrowed, "VAE decoder", err);
}

/* z [n, latent, lh, lw] in host memory -> img [n, out, h, w] in host
 * memory through the backend. */
sd_status sd_vae_decode_runner_decode(sd_vae_decode_runner *r, const sd_vae_decoder *d, int n, int lh, int lw,
                                      const float *z, float *img, sd_error *err)
{
    sd_status st = sd_vae_decode_check_input(d, n, lh, lw, err);
    if (st) return st;
    int h, w;
    sd_vae_decoded_size(&d->cfg, lh, lw, &h, &w);
    size_t lat = (size_t)n * (size_t)d->cfg.latent_channels * (size_t)lh * (size_t)lw;
    size_t px = (size_t)n * (size_t)d->cfg.out_channels * (size_t)h * (size_t)w;
    st = grow(r, &r->ws, &r->ws_cap, sd_vae_decode_workspace_floats(d, lh, lw), "workspace", err);
    if (!st) st = grow(r, &r->z, &r->z_cap, lat, "latent buffer", err);
    if (!st) st = grow(r, &r->img, &r->img_cap, px, "image buffer", err);
    if (st) return st;
    r->be->h2d(r->exec, r->z, z, lat * sizeof(float));
    st = sd_vae_decode_on(d, r->be, r->exec, r->params, n, lh, lw, r->z, r->img, r->ws, err);
    if (st) return st;
    r->be->d2h(r->exec, img, r->img, px * sizeof(float));
    return r->be->sync(r->exec, err);
}

/* Everything the runner holds in the backend's memory. */
void sd_vae_decode_runner_free(sd_vae_decode_runner *r)
{
    if (!r->be) return;
    void *p[4] = {r->params_borrowed ? NULL : r->params, r->ws, r->z, r->img};
    for (int i = 0; i < 4; i++) sd_backend_drop(r->be, r->exec, &p[i]);
    r->params = r->ws = r->z = r->img = NULL;
    r->ws_cap = r->z_cap = r->img_cap = 0;
}
