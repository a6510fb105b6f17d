/* The CLIP text encoder on any backend from host buffers, as vae_runner.c
 * does for the VAE: the parameters are copied into the backend's memory
 * once, the workspace, ids and output buffers live there and grow on
 * demand, and each call copies the ids in, encodes and copies the hidden
 * states (and pooled output) back. This is what lets sd-latents --device
 * cuda:K run the text encoders on the GPU next to the VAE. On the CPU
 * backend the parameters are the model's own (no copy), the other copies
 * are memcpy, and the results equal sd_clip_text_encode's bit for bit. */
#include <string.h>

#include "clip_text.h"
#include "dtype.h"

/* A runner buffer of at least `bytes` (sd_backend_grow). */
static sd_status grow(sd_clip_text_runner *r, void **p, size_t *cap, size_t bytes, const char *what, sd_error *err)
{
    return sd_backend_grow(r->be, r->exec, p, cap, bytes, "CLIP text encoder", what, err);
}

/* Parameters into the backend's memory once, so each encode only moves
 * ids and outputs; on a host backend the model's own buffer serves (no
 * second copy of the weights: 2.8 GB for SDXL's bigG). */
sd_status sd_clip_text_runner_init(sd_clip_text_runner *r, const sd_clip_text *m, const sd_backend *be, void *exec,
                                   sd_error *err)
{
    memset(r, 0, sizeof *r);
    r->be = be;
    r->exec = exec;
    if (be->is_device && m->wdtype)
        return sd_err_set(err, SD_EUNSUPPORTED, "CLIP text encoder: %s weights run on the CPU only, not on %s",
                          sd_dtype_name(m->wdtype), be->name);
    return sd_backend_params_in(be, exec, m->w.data, m->w.total, &r->params, &r->params_borrowed,
                                "CLIP text encoder", err);
}

/* ids [n, t] in host memory -> hidden [n, t, width] and pooled [n,
 * pooled_dim] in host memory (either may be NULL, as for
 * sd_clip_text_encode), through the backend: the sizes are checked before
 * any buffer grows, the ids are validated by sd_clip_text_encode_on on the
 * host copy. */
sd_status sd_clip_text_runner_encode(sd_clip_text_runner *r, const sd_clip_text *m, int n, int t, const int32_t *ids,
                                     const sd_clip_text_out *out, float *hidden, float *pooled, sd_error *err)
{
    if (!r->params) return sd_err_set(err, SD_EINVAL, "CLIP text encode: runner not initialised");
    if (n < 1 || t < 1 || t > m->cfg.positions)
        return sd_err_set(err, SD_EINVAL, "CLIP text encode: %d sequences of %d tokens (1..%d tokens allowed)", n, t,
                          m->cfg.positions);
    size_t nid = (size_t)n * (size_t)t;
    size_t nh = nid * (size_t)m->cfg.width, np = (size_t)n * (size_t)sd_clip_text_pooled_dim(m);
    void *ws = r->ws, *ib = r->ids_be, *hb = r->hidden, *pb = r->pooled;
    sd_status st = grow(r, &ws, &r->ws_cap, sd_clip_text_workspace_floats(m, n, t) * sizeof(float), "workspace", err);
    r->ws = ws;
    if (!st) st = grow(r, &ib, &r->ids_cap, nid * sizeof(int32_t), "token ids", err);
    r->ids_be = ib;
    if (!st && hidden) st = grow(r, &hb, &r->hidden_cap, nh * sizeof(float), "hidden-state buffer", err);
    r->hidden = hb;
    if (!st && pooled) st = grow(r, &pb, &r->pooled_cap, np * sizeof(float), "pooled buffer", err);
    r->pooled = pb;
    if (st) return st;
    r->be->h2d(r->exec, r->ids_be, ids, nid * sizeof(int32_t));
    st = sd_clip_text_encode_on(m, r->be, r->exec, r->params, n, t, ids, r->ids_be, out, hidden ? r->hidden : NULL,
                                pooled ? r->pooled : NULL, r->ws, err);
    if (st) return st;
    if (hidden) r->be->d2h(r->exec, hidden, r->hidden, nh * sizeof(float));
    if (pooled) r->be->d2h(r->exec, pooled, r->pooled, np * sizeof(float));
    return r->be->sync(r->exec, err);
}

/* Everything the runner holds in the backend's memory; a second call (or
 * one on a runner whose init failed) does nothing more. */
void sd_clip_text_runner_free(sd_clip_text_runner *r)
{
    if (!r->be) return;
    void *bufs[5] = {r->params_borrowed ? NULL : r->params, r->ws, r->ids_be, r->hidden, r->pooled};
    for (int i = 0; i < 5; i++) sd_backend_drop(r->be, r->exec, &bufs[i]);
    r->params = r->ws = r->hidden = r->pooled = NULL;
    r->ids_be = NULL;
    r->ws_cap = r->ids_cap = r->hidden_cap = r->pooled_cap = 0;
}
