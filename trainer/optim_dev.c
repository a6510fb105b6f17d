/* The state of 8-bit AdamW and Adafactor on a device backend: each flat
 * buffer mirrored in device memory, and the per-tensor views rebuilt with
 * device pointers at the same offsets, so the backend's adamw8 and
 * adafactor entries step the device copy. The host buffers stay the
 * checkpoint's: pulled before a save, pushed after a resume. */
#include <stdint.h>
#include <stdlib.h>

#include "optim.h"
#include "safetensors.h"

/* Bytes of buffer i. */
static size_t buf_bytes(const sd_opt_buf *b)
{
    return b->count * (b->st_dtype == SD_ST_U8 ? 1 : 4);
}

/* A host pointer into one of the state's buffers as the same offset in
 * that buffer's device twin (NULL stays NULL). */
static void *on_dev(const sd_opt_state *s, const void *host)
{
    if (!host) return NULL;
    for (size_t i = 0; i < s->nbufs; i++) {
        const char *lo = s->bufs[i].data, *p = host;
        if (p >= lo && p < lo + (buf_bytes(&s->bufs[i]) ? buf_bytes(&s->bufs[i]) : 1))
            return (char *)s->dev[i] + (p - lo);
    }
    return NULL;
}

/* The device views of every tensor from the host ones. */
static int make_views(sd_opt_state *s)
{
    size_t n = s->ntensors ? s->ntensors : 1;
    if (s->kind == SD_OPT_ADAMW8BIT) {
        s->dq8 = calloc(n, sizeof *s->dq8);
        if (!s->dq8) return 0;
        for (size_t k = 0; k < s->ntensors; k++) {
            const sd_q8_tensor *h = &s->q8[k];
            s->dq8[k] = (sd_q8_tensor){.off = h->off, .n = h->n, .qm = on_dev(s, h->qm), .qv = on_dev(s, h->qv),
                                       .am = on_dev(s, h->am), .av = on_dev(s, h->av), .m32 = on_dev(s, h->m32),
                                       .v32 = on_dev(s, h->v32)};
        }
    } else if (s->kind == SD_OPT_ADAFACTOR) {
        s->daf = calloc(n, sizeof *s->daf);
        if (!s->daf) return 0;
        for (size_t k = 0; k < s->ntensors; k++) {
            s->daf[k] = s->af[k];
            s->daf[k].row = on_dev(s, s->af[k].row);
            s->daf[k].col = on_dev(s, s->af[k].col);
            s->daf[k].v = on_dev(s, s->af[k].v);
            s->daf[k].m = on_dev(s, s->af[k].m);
        }
    }
    return 1;
}

/* See optim.h: the buffers in be's memory (zeroed, as the host ones start)
 * and the views into them. */
sd_status sd_opt_state_device(sd_opt_state *s, const sd_backend *be, void *exec, sd_error *err)
{
    if (s->kind == SD_OPT_ADAMW || !be->is_device) return SD_OK;
    for (size_t i = 0; i < s->nbufs; i++) {
        size_t b = buf_bytes(&s->bufs[i]);
        s->dev[i] = be->alloc(exec, b ? b : 1);
        if (!s->dev[i]) {
            sd_opt_state_release(s, be, exec);
            return sd_err_set(err, SD_ENOMEM, "%s: no room for the %s state on the device (%.1f MiB for %s)",
                              be->name, sd_optimizer_name(s->kind), (double)b / (1 << 20), s->bufs[i].name);
        }
        be->zero(exec, s->dev[i], b);
    }
    if (!make_views(s)) {
        sd_opt_state_release(s, be, exec);
        return sd_err_set(err, SD_ENOMEM, "out of memory for the %s state's device views", sd_optimizer_name(s->kind));
    }
    return SD_OK;
}

/* Host buffers onto the device (after a resume). */
void sd_opt_state_push(sd_opt_state *s, const sd_backend *be, void *exec)
{
    for (size_t i = 0; i < s->nbufs; i++)
        if (s->dev[i]) be->h2d(exec, s->dev[i], s->bufs[i].data, buf_bytes(&s->bufs[i]));
}

/* Device buffers into the host ones (before a checkpoint; the caller
 * syncs). */
void sd_opt_state_pull(sd_opt_state *s, const sd_backend *be, void *exec)
{
    for (size_t i = 0; i < s->nbufs; i++)
        if (s->dev[i]) be->d2h(exec, s->bufs[i].data, s->dev[i], buf_bytes(&s->bufs[i]));
}

/* The device buffers and views released. */
void sd_opt_state_release(sd_opt_state *s, const sd_backend *be, void *exec)
{
    for (size_t i = 0; i < SD_OPT_MAX_BUFS; i++) {
        if (s->dev[i]) be->release(exec, s->dev[i]);
        s->dev[i] = NULL;
    }
    free(s->dq8);
    free(s->daf);
    s->dq8 = NULL;
    s->daf = NULL;
}
