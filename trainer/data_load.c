/* Records to batches: latents, text embeddings and size ids, each
 * checked against what the UNet expects. */
#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_int.h"
#include "f16.h"
#include "hash.h"

/* n stored elements of dtype at src (any alignment) as floats; 0 when the
 * dtype is unknown or a value is not finite. */
static int to_floats(float *dst, const void *src, size_t n, int dtype)
{
    const unsigned char *p = src;
    for (size_t i = 0; i < n; i++) {
        float f;
        uint16_t h;
        if (dtype == SD_DT_F32) memcpy(&f, p + 4 * i, 4);
        else if (dtype == SD_DT_F16 || dtype == SD_DT_BF16) {
            memcpy(&h, p + 2 * i, 2);
            f = dtype == SD_DT_F16 ? sd_f16_to_f32(h) : sd_bf16_to_f32(h);
        } else return 0;
        if (!isfinite(f)) return 0;
        dst[i] = f;
    }
    return 1;
}

/* The seed of record idx's own stream under base (sd_load_opts.record_seed):
 * one splitmix64 step, so neighbouring indices get unrelated streams. */
uint64_t sd_data_record_seed(uint64_t base, uint32_t idx)
{
    uint64_t s = base ^ ((uint64_t)idx * 0x9E3779B97F4A7C15ULL);
    return sd_splitmix64(&s);
}

/* Make room for n floats in *p; 0 on success. */
static int need_floats(float **p, size_t *cap, size_t n)
{
    return sd_data_grow((void **)p, cap, n ? n : 1, sizeof(float));
}

/* Room for the numbers behind a record's reason (what it has, what the
 * UNet or the bucket takes). */

/* The hidden states a UNet of o reads from a text record (SDXL: both
 * encoders' side by side, plus the pooled output; else the one encoder's)
 * and their length; a reason when the record does not fit the UNet, the
 * numbers compared in note. */
static const char *text_parts(const sd_shard_rec *r, const sd_load_opts *o, const sd_shard_tensor *parts[2], int *np,
                              int *T, char *note)
{
    const sd_shard_tensor *h = sd_shard_rec_tensor(r, SD_ROLE_HIDDEN);
    const sd_shard_tensor *h1 = sd_shard_rec_tensor(r, SD_ROLE_HIDDEN1);
    const sd_shard_tensor *h2 = sd_shard_rec_tensor(r, SD_ROLE_HIDDEN2);
    const sd_shard_tensor *pl = sd_shard_rec_tensor(r, SD_ROLE_POOLED);
    note[0] = 0;
    parts[0] = h;
    parts[1] = NULL;
    *np = 1;
    if (o->pooled) {
        if (!h1 || !h2 || !pl) {
            snprintf(note, NOTE_CAP, "%s; the UNet is an SDXL one (text_time)",
                     h ? "one encoder's hidden state" : "no SDXL hidden states");
            return "text embedding lacks SDXL's two hidden states and pooled output";
        }
        parts[0] = h1;
        parts[1] = h2;
        *np = 2;
        if (pl->ndim != 1 || (int)pl->shape[0] != o->pooled) {
            snprintf(note, NOTE_CAP, "pooled width %u, the UNet's text_time projection takes %d",
                     pl->ndim == 1 ? pl->shape[0] : 0, o->pooled);
            return "pooled text embedding width differs from the UNet's text_time projection";
        }
    } else if (!h) {
        snprintf(note, NOTE_CAP, "%s; the UNet takes one encoder's (no text_time)",
                 h1 ? "SDXL's two encoders' hidden states" : "no hidden state");
        return "text embedding lacks a single-encoder hidden state";
    }
    *T = (int)parts[0]->shape[0];
    int W = 0;
    for (int i = 0; i < *np; i++) {
        if (parts[i]->ndim != 2 || (int)parts[i]->shape[0] != *T) return "text hidden states of different lengths";
        W += (int)parts[i]->shape[1];
    }
    if (W != o->cross_dim) {
        snprintf(note, NOTE_CAP, "width %d%s, the UNet's cross_attention_dim %d", W,
                 *np == 2 ? " (both encoders summed)" : "", o->cross_dim);
        return "text embedding width differs from the UNet's cross_attention_dim";
    }
    return NULL;
}

/* A text record's embedding into ctx [tctx, cross] and pooled; a reason
 * string when it cannot be used (the numbers behind it in note). */
static const char *load_text(sd_shard_txn *t, const uint8_t key[16], const sd_load_opts *o, int *tctx, float *ctx,
                             float *pooled, size_t ctx_cap, char *note, sd_error *err)
{
    const void *val;
    size_t vlen;
    sd_shard_rec r;
    note[0] = 0;
    if (sd_shard_get_text(t, key, &val, &vlen, err)) return "text embedding missing";
    if (sd_shard_rec_parse(val, vlen, &r, err) || sd_shard_rec_check_payload(&r, err) || r.kind != SD_REC_TEXT)
        return "corrupt text embedding";
    const sd_shard_tensor *parts[2];
    int np = 1, T = 0, W = o->cross_dim;
    const char *why = text_parts(&r, o, parts, &np, &T, note);
    if (why) return why;
    if (*tctx && T != *tctx) return "text length differs from the batch's first record";
    if ((size_t)T * (size_t)W > ctx_cap) return "text embedding too long";
    *tctx = T;
    int col = 0;
    float row[4096];
    for (int i = 0; i < np; i++) {
        int w = (int)parts[i]->shape[1];
        size_t es = sd_dtype_size(parts[i]->dtype);
        if (!es || w > 4096) return "text embedding of an unknown dtype or width";
        for (int k = 0; k < T; k++) {
            if (!to_floats(row, (const unsigned char *)parts[i]->data + (size_t)k * (size_t)w * es, (size_t)w,
                           parts[i]->dtype))
                return "text embedding has non-finite values";
            memcpy(ctx + (size_t)k * (size_t)W + (size_t)col, row, (size_t)w * sizeof(float));
        }
        col += w;
    }
    const sd_shard_tensor *pl = sd_shard_rec_tensor(&r, SD_ROLE_POOLED);
    if (o->pooled && !to_floats(pooled, pl->data, (size_t)o->pooled, pl->dtype))
        return "pooled text embedding has non-finite values";
    return NULL;
}

/* Whether a latent tensor fits a UNet of c input channels and, with h >= 0,
 * a bucket of h x w latents: NULL, or the reason with the numbers in note. */
static const char *latent_misfit(const sd_shard_tensor *m, int c, int h, int w, char *note)
{
    note[0] = 0;
    if (m->ndim != 3) {
        snprintf(note, NOTE_CAP, "%d dimensions", m->ndim);
        return "latent is not [channels, height, width]";
    }
    if ((int)m->shape[0] != c) {
        snprintf(note, NOTE_CAP, "latent channels %u, the UNet's in_channels %d", m->shape[0], c);
        return "latent channels differ from the UNet's in_channels";
    }
    if (h >= 0 && ((int)m->shape[1] != h || (int)m->shape[2] != w)) {
        snprintf(note, NOTE_CAP, "latent %ux%u, the bucket's %dx%d", m->shape[2], m->shape[1], w, h);
        return "latent size differs from the bucket's";
    }
    return NULL;
}

/* One latent record into x0 [c, h, w] (scaled sample) and its size ids; a
 * reason string when it cannot be used (the numbers behind it in note).
 * Draws flip, dropout and noise. */
static const char *load_latent(sd_data *d, const sd_shard_rec *r, uint32_t shard, const sd_load_opts *o, sd_rng *rng,
                               int c, int h, int w, float *x0, float *tmp, float *tids, float *mask, int *use_empty,
                               char *note)
{
    int meanstd = (r->flags & SD_REC_F_MEANSTD) != 0;
    int flip = 0;
    note[0] = 0;
    if ((r->flags & SD_REC_F_FLIPPED) && !o->no_flip) flip = sd_rng_uniform(rng) < 0.5;
    *use_empty = o->dropout > 0 && sd_rng_uniform(rng) < o->dropout;
    int rm = meanstd ? (flip ? SD_ROLE_MEAN_FLIP : SD_ROLE_MEAN) : (flip ? SD_ROLE_SAMPLE_FLIP : SD_ROLE_SAMPLE);
    const sd_shard_tensor *m = sd_shard_rec_tensor(r, rm);
    const sd_shard_tensor *s = meanstd ? sd_shard_rec_tensor(r, flip ? SD_ROLE_STD_FLIP : SD_ROLE_STD) : NULL;
    size_t per = (size_t)c * (size_t)h * (size_t)w;
    if (meanstd) sd_rng_normal(rng, tmp + per, per);
    if (!m || (meanstd && !s)) return "latent record lacks its tensors";
    const char *why = latent_misfit(m, c, h, w, note);
    if (why) return why;
    if (!to_floats(x0, m->data, per, m->dtype)) return "latent has non-finite values";
    if (meanstd) {
        if (!to_floats(tmp, s->data, per, s->dtype)) return "latent std has non-finite values";
        for (size_t i = 0; i < per; i++) x0[i] += tmp[i] * tmp[per + i];
    }
    if (mask) {
        why = sd_data_mask_load(r, flip, h, w, mask, note);
        if (why) return why;
    }
    float sf = (float)d->shard_scaling[shard]; /* each shard's own: --allow-mixed mixes factors */
    for (size_t i = 0; i < per; i++) x0[i] *= sf;
    /* SDXL size conditioning: original (h, w), crop (top, left), target (h, w).
     * A crop box kept as kohya's crop_ltrb (flag 4) gives a flipped sample
     * the left sd-scripts uses, target_w - right; for sdtk's own records the
     * flipped left would be resize_w - right, which the record does not hold,
     * so it takes the unflipped left (at most a pixel off for a centred crop) */
    tids[0] = (float)r->orig_h;
    tids[1] = (float)r->orig_w;
    tids[2] = (float)r->crop[1];
    tids[3] = (float)(flip && (r->flags & SD_REC_F_CROP_FLOAT) ? r->bucket_w - r->crop[2] : r->crop[0]);
    tids[4] = (float)r->bucket_h;
    tids[5] = (float)r->bucket_w;
    return NULL;
}

/* Load every record of the batch that passes its checks. */
sd_status sd_data_load(sd_data *d, const sd_data_batch *b, const sd_load_opts *o, sd_rng *rng, sd_batch *out,
                       sd_tally *tally, sd_error *err)
{
    const sd_data_bucket *bk = &d->buckets[b->bucket];
    int c = o->channels, h = (int)bk->h / 8, w = (int)bk->w / 8;
    size_t per = (size_t)c * (size_t)h * (size_t)w, n = b->n, tmax = 512 * (size_t)o->cross_dim;
    if (o->dropout > 0 && !d->has_empty)
        return sd_err_set(err, SD_EINVAL, "conditioning dropout needs the shards' empty_text embedding, none has one");
    if (need_floats(&out->x0, &out->cap_x0, n * per) || need_floats(&out->ctx, &out->cap_ctx, n * tmax) ||
        need_floats(&out->text, &out->cap_text, n * (size_t)(o->pooled ? o->pooled : 1)) ||
        need_floats(&out->tids, &out->cap_tids, n * 6) || need_floats(&out->tmp, &out->cap_tmp, 2 * per) ||
        (o->masked && need_floats(&out->mask, &out->cap_mask, n * (size_t)h * (size_t)w)) ||
        sd_data_grow((void **)&out->item, &out->cap_item, n ? n : 1, sizeof(uint32_t)))
        return sd_err_set(err, SD_ENOMEM, "out of memory loading a batch");
    out->n = 0;
    out->c = c;
    out->h = h;
    out->w = w;
    out->tctx = 0;
    sd_shard_txn **tx = calloc((size_t)d->nshards, sizeof(*tx));
    if (!tx) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status rc = SD_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        uint32_t idx = d->perm[b->start + i];
        const sd_data_item *it = &d->items[idx];
        if (o->record_seed) sd_rng_seed(rng, sd_data_record_seed(o->record_seed, idx));
        if (!tx[it->shard] && (rc = sd_shard_read_begin(d->shards[it->shard], &tx[it->shard], err))) break;
        if (d->has_empty && !tx[d->empty_shard] &&
            (rc = sd_shard_read_begin(d->shards[d->empty_shard], &tx[d->empty_shard], err)))
            break;
        const void *val = NULL;
        size_t vlen = 0;
        sd_shard_rec r;
        sd_error e = {0};
        const char *why = NULL;
        char note[NOTE_CAP] = "";
        int k = out->n, use_empty = 0, named = 0;
        if (sd_shard_get(tx[it->shard], d->keys + it->koff, it->klen, &val, &vlen, &e)) why = "record missing";
        else if (sd_shard_rec_parse(val, vlen, &r, &e)) why = "corrupt latent record";
        else if ((named = 1, sd_shard_rec_check_payload(&r, &e) || r.kind != SD_REC_LATENT))
            why = "corrupt latent record";
        if (!why)
            why = load_latent(d, &r, it->shard, o, rng, c, h, w, out->x0 + (size_t)k * per, out->tmp,
                              out->tids + 6 * k, o->masked ? out->mask + (size_t)k * (size_t)h * (size_t)w : NULL,
                              &use_empty, note);
        if (!why) {
            static const uint8_t zero[16];
            int tc = out->tctx;
            if (!use_empty && memcmp(r.text_ref, zero, 16) == 0) why = "record has no text embedding";
            else
                why = load_text(tx[use_empty ? (uint32_t)d->empty_shard : it->shard],
                                use_empty ? d->empty_text : r.text_ref, o,
                                &tc, out->ctx + (size_t)k * tmax, out->text + (size_t)k * (size_t)o->pooled, tmax,
                                note, &e);
            if (!why) out->tctx = tc;
        }
        if (why) {
            char name[96];
            if (!named) snprintf(name, sizeof name, "(unnamed, key of %u bytes)", it->klen);
            else snprintf(name, sizeof name, "%.*s", (int)(r.name_len < 80 ? r.name_len : 80), r.name);
            sd_skip(tally, why, "%s: record %s%s%s%s", sd_shard_path(d->shards[it->shard]), name, note[0] ? " (" : "",
                    note, note[0] ? ")" : "");
            continue;
        }
        out->item[out->n++] = idx;
    }
    /* text rows were written at stride tmax: pack them to [n, tctx, cross] */
    size_t row = (size_t)out->tctx * (size_t)o->cross_dim;
    for (int k = 1; k < out->n && row; k++) memmove(out->ctx + (size_t)k * row, out->ctx + (size_t)k * tmax, row * 4);
    for (int i = 0; i < d->nshards; i++)
        if (tx[i]) sd_shard_read_end(tx[i]);
    free(tx);
    return rc;
}

/* What the start-up check has seen of a shard: nothing usable yet, a
 * latent record that fits the UNet, or that and a text embedding too. */
enum { SEEN_NONE, SEEN_LATENT, SEEN_TEXT };

/* One record of its shard against the UNet: the shard's first readable
 * latent record's channels, then the first text embedding it references
 * that the shard holds. Records that cannot be read are passed over (the
 * loader skips and counts them); a misfit is an error naming the shard,
 * the record and both numbers. */
static sd_status check_record(const sd_data *d, const sd_data_item *it, sd_shard_txn *t, const sd_load_opts *o,
                              int *seen, sd_error *err)
{
    static const uint8_t zero[16];
    const char *path = sd_shard_path(d->shards[it->shard]);
    const void *val, *tval;
    size_t vlen, tlen;
    sd_shard_rec r, tr;
    char note[NOTE_CAP];
    if (sd_shard_get(t, d->keys + it->koff, it->klen, &val, &vlen, NULL) || sd_shard_rec_parse(val, vlen, &r, NULL) ||
        r.kind != SD_REC_LATENT)
        return SD_OK;
    int nl = r.name_len < 80 ? (int)r.name_len : 80;
    const sd_shard_tensor *m = sd_shard_rec_tensor(&r, r.flags & SD_REC_F_MEANSTD ? SD_ROLE_MEAN : SD_ROLE_SAMPLE);
    if (*seen == SEEN_NONE && m) {
        const char *why = latent_misfit(m, o->channels, -1, -1, note);
        if (why)
            return sd_err_set(err, SD_EFORMAT, "%s: %s (%s; record %.*s): this UNet cannot train on the shard's "
                              "latents (made with another VAE?)", path, why, note, nl, r.name);
        *seen = SEEN_LATENT;
    }
    if (*seen == SEEN_NONE || memcmp(r.text_ref, zero, 16) == 0 ||
        sd_shard_get_text(t, r.text_ref, &tval, &tlen, NULL) || sd_shard_rec_parse(tval, tlen, &tr, NULL) ||
        tr.kind != SD_REC_TEXT)
        return SD_OK;
    const sd_shard_tensor *parts[2];
    int np, T;
    const char *why = text_parts(&tr, o, parts, &np, &T, note);
    if (why)
        return sd_err_set(err, SD_EFORMAT, "%s: %s (%s; record %.*s): this UNet cannot read the shard's text "
                          "embeddings (made with another text encoder?)", path, why, note, nl, r.name);
    *seen = SEEN_TEXT;
    return SD_OK;
}

/* Before training (data.h): per shard, records in index order until one
 * latent and one text embedding were checked; then a shard where no
 * record had a text embedding is refused. */
sd_status sd_data_check_model(const sd_data *d, const sd_load_opts *o, sd_error *err)
{
    int n = d->nshards, left = 0;
    int *seen = calloc((size_t)(n > 0 ? n : 1), sizeof(*seen)), *has = calloc((size_t)(n > 0 ? n : 1), sizeof(*has));
    sd_shard_txn **tx = calloc((size_t)(n > 0 ? n : 1), sizeof(*tx));
    sd_status rc = seen && has && tx ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < d->nitems && !rc; i++) has[d->items[i].shard] = 1;
    for (int s = 0; s < n && !rc; s++) left += has[s];
    for (size_t i = 0; i < d->nitems && left > 0 && !rc; i++) {
        const sd_data_item *it = &d->items[i];
        if (seen[it->shard] == SEEN_TEXT || (i && it->koff == d->items[i - 1].koff)) continue; /* done, or a repeat */
        if (!tx[it->shard] && (rc = sd_shard_read_begin(d->shards[it->shard], &tx[it->shard], err))) break;
        rc = check_record(d, it, tx[it->shard], o, &seen[it->shard], err);
        if (!rc && seen[it->shard] == SEEN_TEXT) left--;
    }
    for (int s = 0; s < n && !rc; s++)
        if (seen[s] == SEEN_LATENT)
            rc = sd_err_set(err, SD_EFORMAT, "%s: made without text embeddings: sd-latents --text, or --text-only "
                            "to add them (every record has no text embedding)", sd_shard_path(d->shards[s]));
    for (int s = 0; s < n && tx; s++)
        if (tx[s]) sd_shard_read_end(tx[s]);
    free(seen);
    free(has);
    free(tx);
    return rc;
}

/* The text tokens of one latent record's embedding; 0 when it has none
 * the model can read. */
static int record_tokens(const sd_data *d, const sd_data_item *it, sd_shard_txn *t, const sd_load_opts *o)
{
    static const uint8_t zero[16];
    const void *val, *tval;
    size_t vlen, tlen;
    sd_shard_rec r, tr;
    char note[NOTE_CAP];
    const sd_shard_tensor *parts[2];
    int np, T = 0;
    if (sd_shard_get(t, d->keys + it->koff, it->klen, &val, &vlen, NULL) || sd_shard_rec_parse(val, vlen, &r, NULL) ||
        r.kind != SD_REC_LATENT || memcmp(r.text_ref, zero, 16) == 0 ||
        sd_shard_get_text(t, r.text_ref, &tval, &tlen, NULL) || sd_shard_rec_parse(tval, tlen, &tr, NULL) ||
        tr.kind != SD_REC_TEXT || text_parts(&tr, o, parts, &np, &T, note))
        return 0;
    return T;
}

/* The most text tokens among the first records of a bucket (data.h). */
sd_status sd_data_bucket_tokens(const sd_data *d, size_t bucket, const sd_load_opts *o, int *tokens, sd_error *err)
{
    const sd_data_bucket *bk = &d->buckets[bucket];
    sd_shard_txn **tx = calloc((size_t)(d->nshards > 0 ? d->nshards : 1), sizeof(*tx));
    sd_status rc = tx ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory");
    *tokens = 0;
    for (size_t i = 0; i < bk->n && i < SD_DATA_TOKEN_PEEK && !rc; i++) {
        const sd_data_item *it = &d->items[bk->first + i];
        if (!tx[it->shard] && (rc = sd_shard_read_begin(d->shards[it->shard], &tx[it->shard], err))) break;
        int T = record_tokens(d, it, tx[it->shard], o);
        if (T > *tokens) *tokens = T;
    }
    for (int s = 0; s < d->nshards && tx; s++)
        if (tx[s]) sd_shard_read_end(tx[s]);
    free(tx);
    return rc;
}

/* Release a batch's buffers. */
void sd_batch_free(sd_batch *b)
{
    free(b->x0);
    free(b->ctx);
    free(b->text);
    free(b->tids);
    free(b->tmp);
    free(b->mask);
    free(b->item);
    memset(b, 0, sizeof(*b));
}
