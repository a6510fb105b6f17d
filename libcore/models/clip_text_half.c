/* A loaded CLIP text encoder's layer matrices moved into a 16-bit buffer
 * (fp16 or bf16), the rest of the parameters compacted into a smaller fp32
 * flat buffer. The matrices are ~97% of an encoder's weights, so SDXL's two
 * encoders drop from 3.3 GB to 1.7 GB resident; the CPU linear widens the
 * values exactly while packing (gemm_rows.h), so the arithmetic is fp32
 * with exactly the weights the 16-bit buffer holds. */
#include <stdlib.h>
#include <string.h>

#include "clip_text.h"
#include "dtype.h"
#include "f16.h"

/* Whether offset off starts one of the layers' four matrices. */
static int is_matrix(const sd_clip_text *m, size_t off)
{
    for (int l = 0; l < m->cfg.layers; l++) {
        const sd_clip_layer *L = &m->layer[l];
        if (off == L->wqkv || off == L->wo || off == L->w1 || off == L->w2) return 1;
    }
    return 0;
}

/* The new offset of the slot that started at old (the slots' offsets
 * were rewritten in the same order, so index i maps old_off[i] to
 * slots[i].off); matrices map into the 16-bit buffer. */
static size_t remap(const size_t *old_off, const size_t *new_off, size_t n, size_t old)
{
    for (size_t i = 0; i < n; i++)
        if (old_off[i] == old) return new_off[i];
    return old; /* not a slot start: never happens for the model's fields */
}

/* Convert n floats to dtype; *exact cleared when one does not round-trip. */
static void narrow(uint16_t *dst, const float *src, size_t n, int dtype, int *exact)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = dtype == SD_DT_F16 ? sd_f32_to_f16(src[i]) : sd_f32_to_bf16(src[i]);
        float back = dtype == SD_DT_F16 ? sd_f16_to_f32(h) : sd_bf16_to_f32(h);
        if (memcmp(&back, &src[i], sizeof back) != 0) *exact = 0;
        dst[i] = h;
    }
}

/* Every field of the model that holds an offset, for one remapping pass. */
static void model_offsets(sd_clip_text *m, size_t **f, size_t *nf)
{
    size_t n = 0;
    f[n++] = &m->tok;
    f[n++] = &m->pos;
    f[n++] = &m->final_ln.g;
    f[n++] = &m->final_ln.b;
    if (m->cfg.proj) f[n++] = &m->proj_w;
    for (int l = 0; l < m->cfg.layers; l++) {
        sd_clip_layer *L = &m->layer[l];
        size_t *lf[12] = {&L->ln1.g, &L->ln1.b, &L->ln2.g, &L->ln2.b, &L->wqkv, &L->bqkv,
                          &L->wo,    &L->bo,    &L->w1,    &L->b1,    &L->w2,   &L->b2};
        for (int i = 0; i < 12; i++) f[n++] = lf[i];
    }
    *nf = n;
}

/* Split the parameters (clip_text.h): matrices to 16 bits, the rest into a
 * new compact fp32 buffer, every offset in the model rewritten. */
sd_status sd_clip_text_to_16bit(sd_clip_text *m, int dtype, int *exact, sd_error *err)
{
    if (dtype != SD_DT_F16 && dtype != SD_DT_BF16)
        return sd_err_set(err, SD_EINVAL, "CLIP text weights: 16-bit storage is fp16 or bf16");
    if (m->wdtype) return sd_err_set(err, SD_EINVAL, "CLIP text weights: already in 16 bits");
    sd_weights *w = &m->w;
    size_t ns = w->nslots, half_n = 0, keep_n = 0;
    for (size_t i = 0; i < ns; i++) {
        if (is_matrix(m, w->slots[i].off)) half_n += w->slots[i].n;
        else keep_n += (w->slots[i].n + 15) & ~(size_t)15; /* slots stay on cache lines */
    }
    size_t *old_off = malloc(ns * sizeof(size_t)), *new_off = malloc(ns * sizeof(size_t));
    size_t **fields = malloc((5 + 12 * (size_t)m->cfg.layers) * sizeof(size_t *));
    uint16_t *half = aligned_alloc(64, ((half_n ? half_n : 1) * sizeof(uint16_t) + 63) & ~(size_t)63);
    float *keep = aligned_alloc(64, ((keep_n ? keep_n : 16) * sizeof(float) + 63) & ~(size_t)63);
    if (!old_off || !new_off || !fields || !half || !keep) {
        free(old_off), free(new_off), free(fields), free(half), free(keep);
        return sd_err_set(err, SD_ENOMEM, "out of memory for 16-bit CLIP text weights");
    }
    memset(keep, 0, (keep_n ? keep_n : 16) * sizeof(float)); /* the padding between slots too */
    size_t hcur = 0, kcur = 0, out = 0;
    *exact = 1;
    for (size_t i = 0; i < ns; i++) {
        sd_weight_slot *s = &w->slots[i];
        old_off[i] = s->off;
        if (is_matrix(m, s->off)) {
            narrow(half + hcur, w->data + s->off, s->n, dtype, exact);
            new_off[i] = hcur;
            hcur += s->n;
            continue; /* no longer a slot of the fp32 buffer */
        }
        memcpy(keep + kcur, w->data + s->off, s->n * sizeof(float));
        new_off[i] = kcur;
        w->slots[out] = *s;
        w->slots[out++].off = kcur;
        kcur += (s->n + 15) & ~(size_t)15;
    }
    size_t nf;
    model_offsets(m, fields, &nf);
    for (size_t i = 0; i < nf; i++) *fields[i] = remap(old_off, new_off, ns, *fields[i]);
    free(w->data);
    w->data = keep;
    w->total = keep_n;
    w->nslots = out;
    m->half = half;
    m->half_total = half_n;
    m->wdtype = dtype;
    free(old_off), free(new_off), free(fields);
    return SD_OK;
}
