/* Training data straight from latent shards: every record of every shard
 * (read-only), grouped by bucket; per epoch a seeded shuffle of each
 * bucket's records cut into batches (the last one of a bucket may be
 * smaller, or with sd_data_set_carry filled from the next epoch's
 * shuffle), then a seeded shuffle of all batches, so a batch never mixes
 * latent sizes. The epoch's order depends only on the seed and the epoch
 * number, so a cursor (epoch, batch) is all a checkpoint needs to resume.
 *
 * Loading a batch turns records into training inputs: a latent drawn from
 * the cached mean + std * N(0, 1) (or the cached sample), the flipped
 * variant at random when the record has one, times the shard's scaling
 * factor; the text embedding the record references (SD1/SD2: one hidden
 * state; SDXL: both encoders' hidden states side by side plus the pooled
 * one), or the shard's empty-caption embedding for conditioning dropout;
 * and for SDXL the size ids. Records that fail their checks (corrupt,
 * non-finite values, wrong shape, missing text) are skipped, counted by
 * reason and never trained on. */
#ifndef SDTK_TRAIN_DATA_H
#define SDTK_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "rng.h"
#include "shard.h"
#include "tally.h"

typedef struct {
    uint32_t shard, klen;
    size_t koff; /* key bytes in sd_data.keys */
} sd_data_item;

typedef struct {
    uint32_t w, h; /* pixels */
    size_t first, n; /* items[first .. first + n) */
} sd_data_bucket;

typedef struct {
    uint32_t bucket;
    size_t start, n; /* perm[start .. start + n) */
} sd_data_batch;

/* What one shard holds beyond latents and captions, counted while it is
 * indexed (each record once, whatever SHARD@N repeats): its latent
 * records, those whose header (parsed) says a loss mask, those with caption
 * variants and the variants in all. */
typedef struct {
    uint64_t records, masks, varied, variants;
} sd_data_facts;

typedef struct {
    sd_shard **shards;
    int nshards;
    sd_data_facts *facts;    /* per shard */
    double scaling;          /* the first shard's scaling_factor (the others' unless allow_mixed); the
                              * first shard with records: one without any is skipped with a warning */
    double *shard_scaling;   /* each shard's own, which its latents are multiplied by */
    char model[80];          /* their model_hash ("" when absent) */
    char text_encoder[200];  /* their text_encoder identity ("" when absent) */
    unsigned char *keys;
    size_t keys_len, keys_cap;
    sd_data_item *items;
    size_t nitems, items_cap;
    sd_data_bucket *buckets;
    size_t nbuckets;
    uint8_t empty_text[16];  /* the shards' empty-caption embedding key */
    int has_empty;
    int empty_shard;
    uint64_t fingerprint;    /* hash of every shard's keys in order */
    /* the planned epoch */
    uint64_t seed;
    int batch;
    long epoch;              /* -1 before the first plan */
    uint32_t *perm;          /* the epoch's records, batch after batch */
    sd_data_batch *batches;
    size_t nbatches;
    int carry;               /* a bucket's partial last batch continues into the next epoch */
    uint32_t *order;         /* carry: two consecutive epochs' shuffles of one bucket */
} sd_data;

/* Where the next batch comes from. */
typedef struct {
    long epoch;
    size_t batch;
} sd_data_cursor;

/* Open every shard read-only and index its records by bucket. Shards must
 * agree on scaling_factor and model_hash unless allow_mixed. A shard with
 * no latent records (an sd-latents part that got none, without meta) is
 * skipped with a warning; all of them empty is an error. */
sd_status sd_data_open(sd_data *d, const char *const *paths, int n, int batch, uint64_t seed, int allow_mixed,
                       sd_error *err);
void sd_data_close(sd_data *d);
/* The caption tokens the shards' embeddings were made with (their
 * text_encoder identity: 75, or 150 / 225 of sd-latents --max-tokens); 0
 * when the shards do not say (an import-kohya cache). */
int sd_data_max_tokens(const sd_data *d);
/* The shards' caption variants and loss masks logged (info, one line each,
 * when log and the shards hold any), and --masked-loss (masked) checked
 * against them (data_facts.c): SD_EINVAL naming the shards when no record
 * has a mask; a warning with the count when only some have one. paths:
 * the shard arguments, d->nshards of them. */
sd_status sd_data_facts_report(const sd_data *d, const char *const *paths, int masked, int log, sd_error *err);
/* Full batches only (training): each bucket's records are one endless
 * stream, epoch after epoch's shuffle, cut into batches of `batch`; an
 * epoch holds the batches that start inside it, so the last one of a
 * bucket takes the first records of the next epoch's shuffle instead of
 * running short (a bucket smaller than the batch still gives one short
 * batch). Still a function of (seed, epoch) alone. Off by default (the
 * validation set keeps every record exactly once). */
sd_status sd_data_set_carry(sd_data *d, sd_error *err);
/* Batches in one epoch, on average: with full batches (sd_data_set_carry)
 * each bucket's records over the batch size, else each bucket's count
 * rounded up to whole batches. What --epochs turns into steps. */
double sd_data_epoch_batches(const sd_data *d);
/* Batches handed out from the start of epoch 0 up to the cursor: what a
 * run has consumed, whatever its world size and accumulation. */
double sd_data_batches_served(const sd_data *d, const sd_data_cursor *cur);
/* The batch at the cursor (planning its epoch when needed), and the cursor
 * moved past it (into the next epoch after the last batch). */
sd_status sd_data_next(sd_data *d, sd_data_cursor *cur, sd_data_batch *out, sd_error *err);

/* What the model expects of each record. */
typedef struct {
    int channels;      /* latent channels (UNet in_channels) */
    int cross_dim;     /* text hidden width (SDXL: both encoders' widths summed) */
    int pooled;        /* SDXL pooled width, 0 for SD1/SD2 */
    double dropout;    /* probability of the empty-caption embedding */
    int no_flip;       /* never use the flipped variant */
    int masked;        /* load each record's loss mask at the latent size (ones without one) */
    uint64_t record_seed; /* nonzero: the rng is seeded per record from this and the record's index, so
                           * its draws do not depend on the batch it falls in (validation) */
    int variants;      /* draw one of a record's caption variants per epoch (training); 0: its caption */
} sd_load_opts;

/* Which of a record's n caption variants it trains on in epoch: uniform,
 * a hash of (seed, epoch, record key), so neither the call order, the
 * batch, the rank nor a resume changes it. */
size_t sd_data_variant(uint64_t seed, long epoch, const void *key, size_t klen, size_t n);

/* Before training, every shard against the model: the first readable
 * latent record's channels (in_channels) and the first text embedding's
 * widths (cross_attention_dim; SDXL: both encoders summed, and the pooled
 * width); a shard where no record has a text embedding is refused too.
 * The error names the shard, the record and both numbers. The loader
 * still checks every record (a shard may mix). */
sd_status sd_data_check_model(const sd_data *d, const sd_load_opts *o, sd_error *err);

/* The most text tokens among the first SD_DATA_TOKEN_PEEK records of
 * bucket (the memory plan's batch; captions of several CLIP chunks are
 * longer than 77); 0 when none has a readable text embedding. */
enum { SD_DATA_TOKEN_PEEK = 64 };
sd_status sd_data_bucket_tokens(const sd_data *d, size_t bucket, const sd_load_opts *o, int *tokens, sd_error *err);
/* The caption tokens to condition samples with, so that the UNet samples
 * on the sequence length it trains on (data_facts.c): sd_data_max_tokens,
 * else, where the shards do not say (an import-kohya cache), the rows of
 * the first bucket's embeddings (152: 150, 227: 225), else 75. */
int sd_data_caption_tokens(const sd_data *d, const sd_load_opts *lo);

/* A loaded batch, buffers reused between calls. */
typedef struct {
    int n, c, h, w;    /* latents [n, c, h, w] */
    int tctx;          /* text tokens */
    float *x0, *ctx, *text, *tids;
    size_t cap_x0, cap_ctx, cap_text, cap_tids;
    float *tmp;        /* one record's std or scratch */
    size_t cap_tmp;
    float *mask;       /* with sd_load_opts.masked: loss weights [n, h, w] */
    size_t cap_mask;
    uint32_t *item;    /* each loaded record's index in sd_data.items */
    size_t cap_item;
} sd_batch;

/* Read batch b's records into out, drawing from rng in record order (flip,
 * dropout, latent noise). Skipped records are counted in tally; out->n may
 * be smaller than the batch, or 0. */
sd_status sd_data_load(sd_data *d, const sd_data_batch *b, const sd_load_opts *o, sd_rng *rng, sd_batch *out,
                       sd_tally *tally, sd_error *err);
/* The seed of record idx's own stream under base (sd_load_opts.record_seed). */
uint64_t sd_data_record_seed(uint64_t base, uint32_t idx);
void sd_batch_free(sd_batch *b);

#endif
