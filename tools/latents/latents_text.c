/* sd-latents --text: CLIP text embeddings cached once per distinct
 * (caption, encoders, options) in the shard's `text` database, referenced
 * by each latent record. SD 1.x: CLIP-L last layer + final LN; SD 2.x:
 * OpenCLIP-H penultimate + final LN; SDXL: CLIP-L penultimate and OpenCLIP
 * bigG penultimate (no final LN) plus bigG's pooled output. --max-tokens
 * 150/225 encodes 75-token chunks and joins them as sd-scripts does
 * (152/227 rows; the pooled output is the first chunk's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "hash.h"
#include "keyset.h"
#include "latents_text.h"
#include "log.h"
#include "model_dir.h"
#include "progress.h"
#include "shard.h"

/* Load encoder `which` (0/1) of the model and its tokenizer. */
static sd_status open_encoder(text_cache *t, int which, const char *model, const char *tok_dir, sd_error *err)
{
    sd_clip_text_opts o = {.which = which};
    sd_status st = sd_clip_text_load(&t->enc[which], model, &o, err);
    if (st) return st;
    t->loaded[which] = 1;
    return sd_clip_tok_load_model(tok_dir, which + 1, &t->tok[which], err);
}

/* A 64-bit identity of an encoder: its flat weights. */
static uint64_t enc_hash(const sd_clip_text *m)
{
    return sd_hash64(m->w.data, sd_weights_bytes(&m->w), 0);
}

/* --text-weights fp16|bf16: every encoder's layer matrices to 16 bits,
 * after the identity was taken from the fp32 weights. Exact conversions
 * (fp16 files into fp16) give the fp32 model's embeddings bit for bit, so
 * they keep its identity and its stored records; rounded ones are other
 * numbers and get other text keys. */
static sd_status weights_16bit(text_cache *t, int wdtype, sd_error *err)
{
    if (wdtype != SD_DT_F16 && wdtype != SD_DT_BF16) return SD_OK;
    int all_exact = 1;
    size_t before = 0, after = 0;
    for (int i = 0; i < t->n; i++) {
        int exact = 0;
        before += sd_weights_bytes(&t->enc[i].w);
        sd_status st = sd_clip_text_to_16bit(&t->enc[i], wdtype, &exact, err);
        if (st) return st;
        after += sd_weights_bytes(&t->enc[i].w) + t->enc[i].half_total * 2;
        all_exact &= exact;
    }
    size_t il = strlen(t->ident);
    if (!all_exact) snprintf(t->ident + il, sizeof t->ident - il, "|w%s", sd_dtype_name(wdtype));
    sd_log(SD_LOG_INFO, "text: encoder matrices held as %s, %zu -> %zu MB (%s)", sd_dtype_name(wdtype), before >> 20,
           after >> 20, all_exact ? "exact: the fp32 embeddings bit for bit" : "rounded: embeddings get their own keys");
    return SD_OK;
}

/* Load the tokenizer(s) and encoder(s) of `model` (a diffusers folder; or a
 * single-file checkpoint with tokenizers from tok_dir) and pick the SD
 * variant: two encoders = SDXL, one with GELU = SD 2.x, else SD 1.x; the
 * identity is taken, then the weights stored as wdtype says. */
static sd_status open_all(text_cache *t, const char *model, const char *tok_dir, int clip_skip, int max_tokens,
                          int dtype, int wdtype, const char *numerics, sd_error *err)
{
    memset(t, 0, sizeof(*t));
    t->dtype = dtype;
    t->clip_skip = clip_skip;
    t->rows = sd_clip_kohya_rows(max_tokens);
    if (!t->rows) return sd_err_set(err, SD_EINVAL, "--max-tokens %d: expected 75, 150 or 225", max_tokens);
    t->max_tokens = max_tokens;
    t->nchunk = max_tokens / 75;
    if (!tok_dir) tok_dir = model;
    if (!sd_is_dir(tok_dir))
        return sd_err_set(err, SD_EINVAL,
                          "%s: tokenizers come from a model folder (tokenizer/, tokenizer_2/); give --tokenizer DIR",
                          tok_dir);
    t->work = sd_clip_work_new();
    if (!t->work) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status st = open_encoder(t, 0, model, tok_dir, err);
    if (st) return st;
    char p2[4096];
    snprintf(p2, sizeof p2, "%s/text_encoder_2", model);
    int sdxl = sd_is_dir(p2);
    if (!sdxl && !sd_is_dir(model)) { /* single file: an SDXL checkpoint holds a second encoder */
        st = sd_clip_text_file_has_second(model, &sdxl, err);
        if (st) return st;
    }
    if (sdxl) {
        st = open_encoder(t, 1, model, tok_dir, err);
        if (st) return st;
        t->n = 2;
        t->variant = TEXT_SDXL;
        st = sd_clip_text_preset(&t->enc[0], SD_CLIP_SDXL_L, clip_skip, &t->out[0], err);
        if (!st) st = sd_clip_text_preset(&t->enc[1], SD_CLIP_SDXL_G, clip_skip, &t->out[1], err);
    } else {
        t->n = 1;
        t->variant = t->enc[0].cfg.act == SD_CLIP_GELU ? TEXT_SD2 : TEXT_SD1;
        st = sd_clip_text_preset(&t->enc[0], t->variant == TEXT_SD2 ? SD_CLIP_SD2 : SD_CLIP_SD1, clip_skip,
                                 &t->out[0], err);
    }
    if (st) return st;
    snprintf(t->ident, sizeof t->ident, "%s:%016llx:%016llx:tok%016llx,%016llx:skip%d:final%d,%d:dt%d%s",
             t->variant == TEXT_SDXL ? "sdxl" : t->variant == TEXT_SD2 ? "sd2" : "sd1",
             (unsigned long long)enc_hash(&t->enc[0]), (unsigned long long)(t->n > 1 ? enc_hash(&t->enc[1]) : 0),
             (unsigned long long)sd_clip_tok_identity(t->tok[0]),
             (unsigned long long)(t->n > 1 ? sd_clip_tok_identity(t->tok[1]) : 0), t->out[0].skip, t->out[0].final_ln,
             t->n > 1 ? t->out[1].final_ln : 0, dtype, numerics);
    size_t il = strlen(t->ident); /* 75 tokens: the identity (and every text key) of before --max-tokens */
    if (max_tokens != 75) snprintf(t->ident + il, sizeof t->ident - il, "|tok%d", max_tokens);
    sd_log(SD_LOG_INFO, "text: %s, %d encoder(s): %s%s%s", t->variant == TEXT_SDXL ? "SDXL" : t->variant == TEXT_SD2 ? "SD 2.x" : "SD 1.x",
           t->n, t->enc[0].layout, t->n > 1 ? " + " : "", t->n > 1 ? t->enc[1].layout : "");
    return weights_16bit(t, wdtype, err);
}

/* open_all, releasing what it loaded when it fails. TF32 or mixed-precision
 * embeddings are other numbers: `numerics` ("" for strict fp32, else e.g.
 * "|tf32") joins the identity, so they get other text keys. */
sd_status text_open(text_cache *t, const char *model, const char *tok_dir, int clip_skip, int max_tokens, int dtype,
                    int wdtype, const char *numerics, sd_error *err)
{
    sd_status st = open_all(t, model, tok_dir, clip_skip, max_tokens, dtype, wdtype, numerics, err);
    if (st) text_close(t);
    return st;
}

/* Put every encoder on the backend that runs the VAE (the CPU pool, or a
 * GPU with --device cuda:K): its parameters are copied there once, and
 * text_put encodes through these runners. */
sd_status text_device(text_cache *t, const sd_backend *be, void *exec, sd_error *err)
{
    sd_status st = SD_OK;
    for (int i = 0; i < t->n && !st; i++) st = sd_clip_text_runner_init(&t->run[i], &t->enc[i], be, exec, err);
    return st;
}

/* Release models, runners, tokenizers and buffers. */
void text_close(text_cache *t)
{
    for (int i = 0; i < 2; i++) {
        sd_clip_text_runner_free(&t->run[i]); /* a no-op when never initialised */
        if (t->loaded[i]) sd_clip_text_free(&t->enc[i]);
        if (t->tok[i]) sd_clip_tok_free(t->tok[i]);
    }
    if (t->work) sd_clip_work_free(t->work);
    sd_clip_ids_free(&t->ids);
    free(t->hidden);
    free(t->pooled);
    free(t->raw);
    free(t->rawpool);
    free(t->conv);
    memset(t, 0, sizeof(*t));
}

/* The text key: XXH3-128 of the encoder identity (weights, variant, layer
 * choice, dtype) and the caption's exact bytes. */
void text_key(const text_cache *t, const char *caption, size_t len, uint8_t key[16])
{
    sd_key128 k = sd_key128_of2(t->ident, strlen(t->ident) + 1, caption, len); /* ident, NUL, caption */
    memcpy(key, &k.lo, 8);
    memcpy(key + 8, &k.hi, 8);
}

/* Grow a float buffer (contents not kept); 0 on success. */
static int grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    free(*p);
    *p = malloc(n * sizeof(float));
    *cap = *p ? n : 0;
    return *p ? 0 : -1;
}

/* The nchunk x 77 ids of caption for tokenizer i: 77 padded ids for 75
 * tokens, else sd-scripts' chunks (sd_clip_kohya_chunks, padded with the
 * tokenizer's own pad and mended as sd-scripts mends them). */
static sd_status tokenize(text_cache *t, int i, const char *caption, size_t len, int32_t *out, sd_error *err)
{
    sd_status st = sd_clip_encode(t->tok[i], t->work, caption, len, &t->ids, err);
    if (st) return st;
    if (t->ids.replaced) t->invalid_utf8++;
    if (i == 0 && t->ids.n > (size_t)t->max_tokens + 2) t->cut++; /* ids hold BOS + tokens + EOS */
    const sd_clip_tok *tk = t->tok[i];
    sd_clip_kohya_chunks(t->ids.ids, t->ids.n, sd_clip_tok_eos(tk), sd_clip_tok_pad(tk), t->max_tokens, out);
    return SD_OK;
}

/* Caption j of the pending list: its text record (every encoder's hidden
 * state, the pooled output, in the cache's dtype) put under its key. np is
 * the number of pending captions, whose outputs lie encoder by encoder in
 * t->hidden ([np, rows, width] each) and t->pooled ([np, pdim]). */
static sd_status put_one(text_cache *t, sd_shard *s, size_t j, size_t np, size_t pdim, const uint8_t *key, sd_buf *rec,
                         sd_error *err)
{
    size_t esz = sd_dtype_size(t->dtype), off = 0, base = 0;
    sd_shard_rec r = {.kind = SD_REC_TEXT};
    for (int i = 0; i < t->n; i++) {
        size_t nh = (size_t)t->rows * (size_t)t->enc[i].cfg.width;
        sd_dtype_store(t->conv + off * esz, t->hidden + base + j * nh, nh, t->dtype);
        int role = t->n == 1 ? SD_ROLE_HIDDEN : i == 0 ? SD_ROLE_HIDDEN1 : SD_ROLE_HIDDEN2;
        r.t[r.ntensors++] = (sd_shard_tensor){.dtype = (uint8_t)t->dtype, .role = (uint8_t)role, .ndim = 2,
                                              .shape = {(uint32_t)t->rows, (uint32_t)t->enc[i].cfg.width, 0, 0},
                                              .data = t->conv + off * esz};
        off += nh;
        base += np * nh;
    }
    if (pdim) {
        sd_dtype_store(t->conv + off * esz, t->pooled + j * pdim, pdim, t->dtype);
        r.t[r.ntensors++] = (sd_shard_tensor){.dtype = (uint8_t)t->dtype, .role = SD_ROLE_POOLED, .ndim = 1,
                                              .shape = {(uint32_t)pdim, 0, 0, 0}, .data = t->conv + off * esz};
    }
    sd_status st = sd_shard_rec_build(&r, rec, err);
    if (!st) st = sd_shard_put_text(s, key, rec->data, rec->len, err);
    if (!st) {
        t->encoded++;
        t->record_bytes = rec->len;
    }
    return st;
}

/* Whether key is among the first n pending keys. */
static int pending_has(const uint8_t *const *keys, const size_t *pend, size_t n, const uint8_t *key)
{
    for (size_t i = 0; i < n; i++)
        if (!memcmp(keys[pend[i]], key, 16)) return 1;
    return 0;
}

/* Encode every caption of the list the shard does not hold yet (each
 * distinct key once) in one call per encoder, then put their text
 * records. The encoder runs several captions through the model at once on
 * the CPU (clip_text.h), and a caption's embedding never depends on which
 * others share the call, so this stores exactly what one call per caption
 * would; a caption met again counts as reused, as it would then be found
 * in the shard. */
sd_status text_put_many(text_cache *t, sd_shard *s, size_t count, const char *const *captions, const size_t *lens,
                        const uint8_t *const *keys, sd_buf *rec, sd_error *err)
{
    size_t *pend = malloc((count ? count : 1) * sizeof(*pend)), np = 0;
    if (!pend) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status st = SD_OK;
    for (size_t c = 0; c < count && !st; c++) {
        int found = 0;
        t->total++;
        st = sd_shard_text_exists(s, keys[c], &found, err);
        if (!st && (found || pending_has(keys, pend, np, keys[c]))) t->reused++;
        else if (!st) pend[np++] = c;
    }
    if (st || !np) {
        free(pend);
        return st;
    }
    double t0 = sd_now();
    size_t esz = sd_dtype_size(t->dtype), need = 0, wmax = 0, k = (size_t)t->nchunk, rows = (size_t)t->rows;
    size_t seq = k * SD_CLIP_CTX, nseq = np * k; /* ids per caption, sequences through the encoder */
    for (int i = 0; i < t->n; i++) {
        size_t wd = (size_t)t->enc[i].cfg.width;
        need += rows * wd;
        wmax = wd > wmax ? wd : wmax;
    }
    size_t pdim = t->n > 1 ? (size_t)sd_clip_text_pooled_dim(&t->enc[1]) : 0;
    int32_t *ids = malloc(np * seq * sizeof(int32_t));
    size_t cbytes = (need + pdim) * esz;
    if (!ids || grow(&t->hidden, &t->hidden_cap, np * need) || grow(&t->pooled, &t->pooled_cap, np * pdim + 1) ||
        (k > 1 && (grow(&t->raw, &t->raw_cap, np * seq * wmax) || grow(&t->rawpool, &t->rawpool_cap, nseq * pdim + 1))))
        st = sd_err_set(err, SD_ENOMEM, "out of memory for text encoding");
    if (!st && cbytes > t->conv_cap) {
        unsigned char *c = realloc(t->conv, cbytes);
        if (!c) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        else {
            t->conv = c;
            t->conv_cap = cbytes;
        }
    }
    size_t base = 0;
    for (int i = 0; i < t->n && !st; i++) {
        size_t wd = (size_t)t->enc[i].cfg.width;
        for (size_t j = 0; j < np && !st; j++)
            st = tokenize(t, i, captions[pend[j]], lens[pend[j]], ids + j * seq, err);
        /* one chunk (75 tokens) is the joined sequence itself: straight into hidden and pooled */
        float *h = k > 1 ? t->raw : t->hidden + base, *p = k > 1 ? t->rawpool : t->pooled;
        if (!st)
            st = sd_clip_text_runner_encode(&t->run[i], &t->enc[i], (int)nseq, SD_CLIP_CTX, ids, &t->out[i], h,
                                            i == 1 ? p : NULL, err);
        for (size_t j = 0; j < np && k > 1 && !st; j++) {
            sd_clip_kohya_join(t->raw + j * seq * wd, k, wd, t->hidden + base + j * rows * wd);
            if (i == 1) /* the first chunk's, as sd-scripts' pool2[::n] */
                memcpy(t->pooled + j * pdim, t->rawpool + j * k * pdim, pdim * sizeof(float));
        }
        base += np * rows * wd;
    }
    for (size_t j = 0; j < np && !st; j++) st = put_one(t, s, j, np, pdim, keys[pend[j]], rec, err);
    t->seconds += sd_now() - t0;
    free(ids);
    free(pend);
    return st;
}

/* One caption: text_put_many with a list of one. */
sd_status text_put(text_cache *t, sd_shard *s, const char *caption, size_t len, const uint8_t key[16], sd_buf *rec,
                   sd_error *err)
{
    const char *c[1] = {caption};
    const uint8_t *k[1] = {key};
    return text_put_many(t, s, 1, c, &len, k, rec, err);
}

/* Whether a --text or --text-only run must write the empty caption's
 * embedding again (*lost 1; 2 where the meta names it but the embedding
 * is gone): the shard's empty_text meta names another key or none (a shard
 * made without --text), or the embedding it names is gone (deleted by
 * sd-verify --repair as damaged; a damaged one still there is --repair's
 * to delete). Without this a rerun with every record cached never wrote
 * the meta again, and the shard stayed without it for good. */
sd_status text_empty_lost(sd_shard *shard, const uint8_t empty_key[16], int *lost, sd_error *err)
{
    char hex[33], *meta = NULL;
    sd_error e = {0};
    *lost = 0;
    sd_shard_text_key_hex(empty_key, hex);
    sd_status st = sd_shard_meta_get(shard, SD_SHARD_META_EMPTY_TEXT, &meta, &e);
    if (st && st != SD_ENOTFOUND) return sd_err_set(err, st, "%s", e.msg);
    *lost = !meta || strcmp(meta, hex) != 0;
    free(meta);
    if (*lost) return SD_OK;
    sd_shard_txn *t = NULL;
    const void *v;
    size_t vl;
    if ((st = sd_shard_read_begin(shard, &t, err))) return st;
    sd_status g = sd_shard_get_text(t, empty_key, &v, &vl, &e); /* a damaged one: sd-verify --repair first */
    *lost = g == SD_ENOTFOUND ? 2 : 0;
    sd_shard_read_end(t);
    if (g && g != SD_ENOTFOUND) return sd_err_set(err, g, "%s", e.msg);
    return SD_OK;
}
