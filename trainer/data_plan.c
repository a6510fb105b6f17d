/* Seeded epoch plans over the bucket index, and the cursor that hands
 * out their batches. */
#include "data.h"

#include <stdlib.h>

#include "hash.h"

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
