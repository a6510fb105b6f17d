/* Shards to training batches: the record index by bucket, seeded epoch
 * plans, and records to latents, text embeddings and size ids. */
#include "data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "f16.h"
#include "hash.h"
#include "log.h"

/* One record found while indexing, before grouping by bucket. */
typedef struct {
    uint32_t w, h, shard, klen;
    size_t koff;
} found;

/* Grow an array of elem-sized entries to hold need; 0 on success. */
static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Order records by bucket (width, then height), keeping shard and key
 * order inside a bucket (the index is what made it sortable stably). */
static int cmp_found(const void *a, const void *b)
{
    const found *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? -1 : 1;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->koff < y->koff ? -1 : x->koff > y->koff;
}

/* A meta entry as text, "" when absent. */
static sd_status meta(sd_shard *s, const char *key, char *out, size_t cap, sd_error *err)
{
    char *v = NULL;
    out[0] = 0;
    sd_status rc = sd_shard_meta_get(s, key, &v, err);
    if (rc == SD_ENOTFOUND) return SD_OK;
    if (rc) return rc;
    snprintf(out, cap, "%s", v);
    free(v);
    return SD_OK;
}

/* Whether the shard holds the text embedding under key. */
static int has_text(sd_shard *s, const uint8_t key[16])
{
    sd_shard_txn *t = NULL;
    const void *v;
    size_t vl;
    int held = sd_shard_read_begin(s, &t, NULL) == SD_OK && sd_shard_get_text(t, key, &v, &vl, NULL) == SD_OK;
    if (t) sd_shard_read_end(t);
    return held;
}

/* Check one shard's identity against the first one's (first: this is the
 * first shard with records, which the others are compared with). */
static sd_status check_meta(sd_data *d, int i, const char *path, int first, int allow_mixed, sd_error *err)
{
    char sf[64], model[80], empty[80], te[200];
    sd_status rc = meta(d->shards[i], SD_SHARD_META_SCALING, sf, sizeof sf, err);
    if (!rc) rc = meta(d->shards[i], SD_SHARD_META_MODEL, model, sizeof model, err);
    if (!rc) rc = meta(d->shards[i], SD_SHARD_META_EMPTY_TEXT, empty, sizeof empty, err);
    if (!rc) rc = meta(d->shards[i], SD_SHARD_META_TEXT_ENCODER, te, sizeof te, err);
    if (rc) return rc;
    char *end;
    double s = strtod(sf, &end);
    if (!sf[0] || *end || !(s > 0))
        return sd_err_set(err, SD_EFORMAT, "%s: no usable scaling_factor in the shard's meta (got '%s')", path, sf);
    d->shard_scaling[i] = s;
    if (first) {
        d->scaling = s;
        snprintf(d->model, sizeof d->model, "%s", model);
        snprintf(d->text_encoder, sizeof d->text_encoder, "%s", te);
    } else if (!allow_mixed && (s != d->scaling || strcmp(model, d->model) != 0)) {
        return sd_err_set(err, SD_EFORMAT,
                          "%s: made with another VAE than the first shard (scaling_factor %s, model_hash '%s' vs "
                          "%g, '%s'); --allow-mixed trains on both",
                          path, sf, model, d->scaling, d->model);
    } else if (!allow_mixed && strcmp(te, d->text_encoder) != 0) {
        /* other embeddings for the same words (another encoder, clip skip,
         * tokenizer or numerics), and dropout would use the first shard's
         * empty caption for all */
        return sd_err_set(err, SD_EFORMAT,
                          "%s: text embeddings from another text encoder setup than the first shard's ('%s' vs "
                          "'%s'); --allow-mixed trains on both",
                          path, te[0] ? te : "(none)", d->text_encoder[0] ? d->text_encoder : "(none)");
    }
    uint8_t key[16];
    if (!d->has_empty && sd_shard_text_key_parse(empty, key)) {
        if (has_text(d->shards[i], key)) {
            memcpy(d->empty_text, key, 16);
            d->has_empty = 1;
            d->empty_shard = i;
        } else {
            sd_log(SD_LOG_WARN, "%s: its empty_text meta names an embedding the shard does not hold (a merge or split "
                   "by an older sd-pack?): conditioning dropout cannot use it", path);
        }
    }
    return SD_OK;
}

/* A shard argument: "PATH@N" (N in 1..10000) is PATH with each record
 * repeated N times an epoch, as kohya's N_name folders repeat theirs; an
 * argument that exists as a file is taken whole, '@' and all. *path is
 * malloc'ed. */
static sd_status shard_arg(const char *arg, char **path, int *repeats, sd_error *err)
{
    const char *at = strrchr(arg, '@');
    *repeats = 1;
    if (at && at[1] && access(arg, F_OK) != 0) {
        char *end;
        long n = strtol(at + 1, &end, 10);
        if (*end || at[1] < '0' || at[1] > '9' || n < 1 || n > 10000)
            return sd_err_set(err, SD_EINVAL, "%s: the repeat count after '@' must be a whole number from 1 to "
                              "10000 (no such file either)", arg);
        *repeats = (int)n;
        *path = strndup(arg, (size_t)(at - arg));
    } else {
        *path = strdup(arg);
    }
    return *path ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory");
}

/* Every record key of one shard, bucket by bucket, each `repeats` times. */
static sd_status index_shard(sd_data *d, int si, int repeats, found **f, size_t *nf, size_t *fcap, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_shard_bucket *bk = NULL;
    size_t nb = 0;
    sd_status rc = sd_shard_read_begin(d->shards[si], &t, err);
    if (!rc) rc = sd_shard_buckets(t, &bk, &nb, err);
    for (size_t b = 0; b < nb && !rc; b++) {
        sd_shard_cursor *c = NULL;
        rc = sd_shard_cursor_bucket(t, bk[b].w, bk[b].h, &c, err);
        while (!rc) {
            const void *key, *val;
            size_t klen, vlen;
            sd_status r2 = sd_shard_cursor_next(c, &key, &klen, &val, &vlen, err);
            if (r2 == SD_ENOTFOUND) break;
            if (r2) {
                rc = r2;
                break;
            }
            if (*nf + (size_t)repeats > UINT32_MAX) { /* the plan indexes records in 32 bits */
                rc = sd_err_set(err, SD_ERANGE, "more than %u records to train on (repeats included)", UINT32_MAX);
                break;
            }
            if (grow((void **)&d->keys, &d->keys_cap, d->keys_len + klen, 1) ||
                grow((void **)f, fcap, *nf + (size_t)repeats, sizeof(found))) {
                rc = sd_err_set(err, SD_ENOMEM, "out of memory indexing shards");
                break;
            }
            memcpy(d->keys + d->keys_len, key, klen);
            for (int r = 0; r < repeats; r++)
                (*f)[(*nf)++] = (found){bk[b].w, bk[b].h, (uint32_t)si, (uint32_t)klen, d->keys_len};
            d->keys_len += klen;
        }
        if (c) sd_shard_cursor_close(c);
    }
    free(bk);
    if (t) sd_shard_read_end(t);
    return rc;
}

/* Group the found records into buckets and fingerprint the whole index. */
static sd_status build_index(sd_data *d, found *f, size_t nf, sd_error *err)
{
    qsort(f, nf, sizeof *f, cmp_found);
    d->items = malloc((nf ? nf : 1) * sizeof(sd_data_item));
    d->buckets = malloc((nf ? nf : 1) * sizeof(sd_data_bucket));
    d->perm = malloc((nf ? nf : 1) * sizeof(uint32_t));
    d->batches = malloc((nf ? nf : 1) * sizeof(sd_data_batch));
    if (!d->items || !d->buckets || !d->perm || !d->batches)
        return sd_err_set(err, SD_ENOMEM, "out of memory indexing shards");
    uint64_t h = 0x5d7a11;
    for (size_t i = 0; i < nf; i++) {
        d->items[i] = (sd_data_item){f[i].shard, f[i].klen, f[i].koff};
        if (!d->nbuckets || d->buckets[d->nbuckets - 1].w != f[i].w || d->buckets[d->nbuckets - 1].h != f[i].h)
            d->buckets[d->nbuckets++] = (sd_data_bucket){f[i].w, f[i].h, i, 0};
        d->buckets[d->nbuckets - 1].n++;
        uint32_t tag[3] = {f[i].shard, f[i].w, f[i].h};
        h = sd_hash64(tag, sizeof tag, h);
        h = sd_hash64(d->keys + f[i].koff, f[i].klen, h);
    }
    d->nitems = nf;
    d->fingerprint = h;
    return SD_OK;
}

/* A record key's hash and where it was found, to find keys in two shards. */
typedef struct {
    uint64_t h;
    uint32_t shard, klen;
    size_t koff;
} keyed;

/* By hash, then shard. */
static int cmp_keyed(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    return x->shard < y->shard ? -1 : x->shard > y->shard;
}

/* Warn when one record (the same key) is in more than one shard: it would
 * train as often as it appears. Parts of two `sd-pack split` runs (a kill
 * between the renames; their split_set meta tells) or overlapping inputs
 * do that; repeats on purpose are SHARD@N. Out of memory only skips the
 * check. */
static void warn_shared_records(const sd_data *d, const found *f, size_t nf, const char *const *paths)
{
    keyed *k = malloc((nf ? nf : 1) * sizeof(*k));
    if (!k) return;
    size_t m = 0;
    for (size_t i = 0; i < nf; i++)
        if (!i || f[i].koff != f[i - 1].koff) /* SHARD@N's copies of a record lie side by side: one is enough */
            k[m++] = (keyed){sd_hash64(d->keys + f[i].koff, f[i].klen, 0), f[i].shard, f[i].klen, f[i].koff};
    nf = m;
    qsort(k, nf, sizeof(*k), cmp_keyed);
    uint64_t shared = 0;
    size_t first = 0;
    for (size_t i = 1; i < nf; i++) {
        const keyed *a = &k[i - 1], *b = &k[i];
        if (a->h != b->h || a->shard == b->shard || a->klen != b->klen ||
            memcmp(d->keys + a->koff, d->keys + b->koff, a->klen) != 0)
            continue;
        if (!shared++) first = i;
    }
    if (shared) {
        char sa[80], sb[80];
        char *va = NULL, *vb = NULL;
        sd_shard_meta_get(d->shards[k[first - 1].shard], "split_set", &va, NULL);
        sd_shard_meta_get(d->shards[k[first].shard], "split_set", &vb, NULL);
        snprintf(sa, sizeof sa, "%s", va ? va : "none");
        snprintf(sb, sizeof sb, "%s", vb ? vb : "none");
        sd_log(SD_LOG_WARN, "%llu more copies of records already in another shard (the first in %s, split_set %s, "
               "and %s, split_set %s): a record trains once per shard that holds it. Parts of two sd-pack split "
               "runs (other run ids) or overlapping inputs? SHARD@N repeats a shard on purpose",
               (unsigned long long)shared, paths[k[first - 1].shard], sa, paths[k[first].shard], sb);
        free(va);
        free(vb);
    }
    free(k);
}

/* Open, check and index every shard. */
sd_status sd_data_open(sd_data *d, const char *const *paths, int n, int batch, uint64_t seed, int allow_mixed,
                       sd_error *err)
{
    memset(d, 0, sizeof(*d));
    d->epoch = -1;
    d->seed = seed;
    d->batch = batch;
    if (n < 1 || batch < 1) return sd_err_set(err, SD_EINVAL, "training data: no shards or a batch size below 1");
    d->shards = calloc((size_t)n, sizeof(*d->shards));
    d->shard_scaling = calloc((size_t)n, sizeof(*d->shard_scaling));
    if (!d->shards || !d->shard_scaling) {
        free(d->shards);
        free(d->shard_scaling);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    d->nshards = n;
    found *f = NULL;
    size_t nf = 0, fcap = 0;
    sd_status rc = SD_OK;
    sd_shard_opts so = {SD_SHARD_RDONLY, 0, 0};
    int used = 0; /* shards with records so far */
    for (int i = 0; i < n && !rc; i++) {
        char *path = NULL;
        int repeats = 1;
        size_t before = nf;
        rc = shard_arg(paths[i], &path, &repeats, err);
        if (!rc) rc = sd_shard_open(&d->shards[i], path, &so, err);
        if (!rc) rc = index_shard(d, i, repeats, &f, &nf, &fcap, err);
        if (!rc && nf == before) /* an sd-latents part that got no records: nothing to train on, no meta to check */
            sd_log(SD_LOG_WARN, "%s: no latent records (an sd-latents run that wrote none?): skipped", path);
        else if (!rc) rc = check_meta(d, i, path, used++ == 0, allow_mixed, err);
        if (!rc && repeats > 1 && nf > before)
            sd_log(SD_LOG_INFO, "%s: %zu records, each %d times an epoch", path, (nf - before) / (size_t)repeats,
                   repeats);
        free(path);
    }
    if (!rc && nf == 0)
        rc = sd_err_set(err, SD_ENOTFOUND, "training data: %s", n > 1 ? "none of the shards holds latent records"
                        : "the shard holds no latent records");
    if (!rc && n > 1) warn_shared_records(d, f, nf, paths);
    if (!rc) rc = build_index(d, f, nf, err);
    free(f);
    if (rc) sd_data_close(d);
    return rc;
}

/* Close the shards and free the index. */
void sd_data_close(sd_data *d)
{
    for (int i = 0; i < d->nshards; i++)
        if (d->shards[i]) sd_shard_close(d->shards[i], NULL);
    free(d->shards);
    free(d->shard_scaling);
    free(d->keys);
    free(d->items);
    free(d->buckets);
    free(d->perm);
    free(d->batches);
    free(d->order);
    memset(d, 0, sizeof(*d));
}

/* A generator for one part of one epoch's plan, from the seed alone. */
static void plan_rng(sd_rng *r, uint64_t seed, long epoch, uint64_t part)
{
    uint64_t x[3] = {seed, (uint64_t)epoch, part};
    sd_rng_seed(r, sd_hash64(x, sizeof x, 0x706c616e));
}

/* Bucket b's records in epoch e's shuffle (Fisher-Yates, seeded by the
 * seed, the epoch and the bucket) into p. */
static void shuffle_bucket(const sd_data *d, long e, size_t b, uint32_t *p)
{
    const sd_data_bucket *bk = &d->buckets[b];
    sd_rng r;
    for (size_t i = 0; i < bk->n; i++) p[i] = (uint32_t)(bk->first + i);
    plan_rng(&r, d->seed, e, b);
    for (size_t i = bk->n; i > 1; i--) {
        size_t j = (size_t)sd_rng_below(&r, i);
        uint32_t t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
}

/* Epoch e: each bucket's records shuffled and cut into batches (with
 * carry, the batches of the bucket's endless stream that start in epoch
 * e), then the batches shuffled. */
static void plan_epoch(sd_data *d, long e)
{
    sd_rng r;
    size_t w = 0, B = (size_t)d->batch;
    d->nbatches = 0;
    for (size_t b = 0; b < d->nbuckets; b++) {
        size_t n = d->buckets[b].n;
        if (!d->carry || n <= B) {
            shuffle_bucket(d, e, b, d->perm + w);
            for (size_t s = 0; s < n; s += B) {
                size_t m = n - s < B ? n - s : B;
                d->batches[d->nbatches++] = (sd_data_batch){(uint32_t)b, w + s, m};
            }
            w += n;
            continue;
        }
        /* stream positions [e n, (e + 1) n) are epoch e's shuffle; batch j covers [j B, j B + B) */
        uint32_t *cur = d->order, *next = d->order + n;
        shuffle_bucket(d, e, b, cur);
        shuffle_bucket(d, e + 1, b, next);
        uint64_t en = (uint64_t)e * n, j0 = (en + B - 1) / B, j1 = (en + n + B - 1) / B;
        for (uint64_t j = j0; j < j1; j++) {
            for (size_t k = 0; k < B; k++) {
                uint64_t pos = j * B + k - en; /* < n + B - 1 < 2n */
                d->perm[w + k] = pos < n ? cur[pos] : next[pos - n];
            }
            d->batches[d->nbatches++] = (sd_data_batch){(uint32_t)b, w, B};
            w += B;
        }
    }
    plan_rng(&r, d->seed, e, UINT64_MAX);
    for (size_t i = d->nbatches; i > 1; i--) {
        size_t j = (size_t)sd_rng_below(&r, i);
        sd_data_batch t = d->batches[i - 1];
        d->batches[i - 1] = d->batches[j];
        d->batches[j] = t;
    }
    d->epoch = e;
}

/* Sum over the buckets of records / batch, rounded up per bucket unless
 * batches run on into the next epoch; a bucket no larger than a batch is
 * one (short) batch every epoch either way, as plan_epoch cuts it. */
double sd_data_epoch_batches(const sd_data *d)
{
    double total = 0;
    for (size_t b = 0; b < d->nbuckets; b++) {
        size_t n = d->buckets[b].n, k = (size_t)d->batch;
        total += d->carry && n > k ? (double)n / (double)k : (double)((n + k - 1) / k);
    }
    return total;
}

/* The cursor's batch in its epoch plus every earlier epoch's batches, as
 * plan_epoch cuts them: per bucket e x its batches when cut per epoch,
 * else the batches of its endless stream that start before record e x n. */
double sd_data_batches_served(const sd_data *d, const sd_data_cursor *cur)
{
    double total = (double)cur->batch;
    uint64_t e = cur->epoch > 0 ? (uint64_t)cur->epoch : 0, B = (uint64_t)d->batch;
    for (size_t b = 0; b < d->nbuckets; b++) {
        uint64_t n = d->buckets[b].n;
        total += (double)(d->carry && n > B ? (e * n + B - 1) / B : e * ((n + B - 1) / B));
    }
    return total;
}

/* Room for an epoch's carried batches: up to batch - 1 more records and
 * one more batch per bucket, and two shuffles of the largest bucket. */
sd_status sd_data_set_carry(sd_data *d, sd_error *err)
{
    size_t maxn = 0, B = (size_t)d->batch;
    for (size_t b = 0; b < d->nbuckets; b++) maxn = d->buckets[b].n > maxn ? d->buckets[b].n : maxn;
    uint32_t *perm = realloc(d->perm, (d->nitems + d->nbuckets * B) * sizeof(uint32_t));
    if (perm) d->perm = perm;
    sd_data_batch *bt = realloc(d->batches, (d->nitems + d->nbuckets) * sizeof(sd_data_batch));
    if (bt) d->batches = bt;
    d->order = malloc(2 * (maxn ? maxn : 1) * sizeof(uint32_t));
    if (!perm || !bt || !d->order) return sd_err_set(err, SD_ENOMEM, "out of memory planning batches");
    d->carry = 1;
    d->epoch = -1; /* replanned on the next batch */
    return SD_OK;
}

/* Hand out the batch at the cursor and step past it. */
sd_status sd_data_next(sd_data *d, sd_data_cursor *cur, sd_data_batch *out, sd_error *err)
{
    if (cur->epoch < 0) return sd_err_set(err, SD_EINVAL, "data cursor before epoch 0");
    if (d->epoch != cur->epoch) plan_epoch(d, cur->epoch);
    if (cur->batch >= d->nbatches) {
        cur->epoch++;
        cur->batch = 0;
        plan_epoch(d, cur->epoch);
    }
    *out = d->batches[cur->batch++];
    return SD_OK;
}

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

/* Make room for n floats in *p; 0 on success. */
static int need_floats(float **p, size_t *cap, size_t n)
{
    return grow((void **)p, cap, n ? n : 1, sizeof(float));
}

/* Room for the numbers behind a record's reason (what it has, what the
 * UNet or the bucket takes). */
enum { NOTE_CAP = 112 };

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
                               int c, int h, int w, float *x0, float *tmp, float *tids, int *use_empty, char *note)
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
        need_floats(&out->tids, &out->cap_tids, n * 6) || need_floats(&out->tmp, &out->cap_tmp, 2 * per))
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
        const sd_data_item *it = &d->items[d->perm[b->start + i]];
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
                              out->tids + 6 * k, &use_empty, note);
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
        out->n++;
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

/* Release a batch's buffers. */
void sd_batch_free(sd_batch *b)
{
    free(b->x0);
    free(b->ctx);
    free(b->text);
    free(b->tids);
    free(b->tmp);
    memset(b, 0, sizeof(*b));
}
