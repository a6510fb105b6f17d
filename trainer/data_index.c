/* Opening the training shards: each checked against the first, every
 * record indexed by bucket, the index fingerprinted. */
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_int.h"
#include "hash.h"
#include "log.h"

/* One record found while indexing, before grouping by bucket. */
typedef struct {
    uint32_t w, h, shard, klen;
    size_t koff;
} found;

/* Grow an array of elem-sized entries to hold need; 0 on success. */
int sd_data_grow(void **p, size_t *cap, size_t need, size_t elem)
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

/* The caption tokens a text_encoder identity was made with: sd-latents
 * --max-tokens 150/225 ends it with "|tok150"/"|tok225"; without the
 * suffix 75 (77 rows). */
static int te_tokens(const char *te)
{
    const char *p = strstr(te, "|tok");
    int n = p ? atoi(p + 4) : 75;
    return n > 0 ? n : 75;
}

/* See data.h. */
int sd_data_max_tokens(const sd_data *d)
{
    return d->text_encoder[0] ? te_tokens(d->text_encoder) : 0;
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
    } else if (te[0] && d->text_encoder[0] && te_tokens(te) != te_tokens(d->text_encoder)) {
        /* one batch holds one sequence length; even --allow-mixed cannot
         * mix them without dropping the other length's records */
        return sd_err_set(err, SD_EFORMAT,
                          "%s: text embeddings of %d caption tokens (%d rows), the first shard's of %d (%d rows): a "
                          "run trains on one length; make the shards with one sd-latents --max-tokens",
                          path, te_tokens(te), te_tokens(te) + 2, te_tokens(d->text_encoder),
                          te_tokens(d->text_encoder) + 2);
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

/* What one record adds to its shard's facts: its header's mask flag (a
 * header that does not parse counts as none; loading skips it), its
 * caption variants. The header is all that is read of the record. */
static void count_facts(sd_data_facts *fa, sd_shard_txn *t, const void *key, size_t klen, const void *val,
                        size_t vlen)
{
    sd_shard_rec r;
    const uint8_t *refs;
    size_t nv;
    fa->records++;
    if (val && sd_shard_rec_parse(val, vlen, &r, NULL) == SD_OK && (r.flags & SD_REC_F_MASK)) fa->masks++;
    if (sd_shard_get_variants(t, key, klen, &refs, &nv, NULL) == SD_OK && nv) {
        fa->varied++;
        fa->variants += nv;
    }
}

/* Every record key of one shard, bucket by bucket, each `repeats` times;
 * the shard's facts counted on the way. */
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
            if (sd_data_grow((void **)&d->keys, &d->keys_cap, d->keys_len + klen, 1) ||
                sd_data_grow((void **)f, fcap, *nf + (size_t)repeats, sizeof(found))) {
                rc = sd_err_set(err, SD_ENOMEM, "out of memory indexing shards");
                break;
            }
            memcpy(d->keys + d->keys_len, key, klen);
            count_facts(&d->facts[si], t, key, klen, val, vlen);
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
    d->facts = calloc((size_t)n, sizeof(*d->facts));
    if (!d->shards || !d->shard_scaling || !d->facts) {
        free(d->shards);
        free(d->shard_scaling);
        free(d->facts);
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
    free(d->facts);
    free(d->keys);
    free(d->items);
    free(d->buckets);
    free(d->perm);
    free(d->batches);
    free(d->order);
    memset(d, 0, sizeof(*d));
}
