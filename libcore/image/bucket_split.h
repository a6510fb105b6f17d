/* Splitting bucketed records into N parts so that every part gets an even
 * share of every bucket (per-bucket counts differ by at most 1 between parts)
 * and the parts' totals differ by at most 1 as well. */
#ifndef SDTK_BUCKET_SPLIT_H
#define SDTK_BUCKET_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct {
    int nparts;
    size_t nbuckets;
    int *start;     /* first part of each bucket's round-robin */
    uint64_t *seen; /* records of each bucket assigned so far */
} sd_splitter;

sd_status sd_splitter_init(sd_splitter *s, const uint64_t *counts, const uint64_t *keys, size_t nbuckets, int nparts,
                           uint64_t seed, sd_error *err);
int sd_splitter_next(sd_splitter *s, size_t bucket);
void sd_splitter_free(sd_splitter *s);
int sd_part_name(const char *pattern, int part, char *out, size_t cap);
int sd_part_pattern_ok(const char *pattern);
int sd_part_glob(const char *pattern, char *out, size_t cap);
/* existing parts numbered nparts and up (an earlier, larger split's) */
int sd_part_leftovers(const char *pattern, int nparts, char *list, size_t cap);
/* Warn, naming them, about such leftovers: a glob of the parts would read
 * them too. `earlier` says what made them ("split into more parts"). */
void sd_part_warn_leftovers(const char *pattern, int nparts, const char *earlier);


/* Streaming form of the same split, for when counts are not known in advance
 * (sd-bucket reads a stream once): each bucket's records are held back only
 * until a full round of N is there, then go one to each part (so every part
 * gets the same from complete rounds); at the end each bucket's incomplete
 * round is laid around the ring of parts in the seeded bucket order, as
 * sd_splitter does. Memory: under N records per bucket. */
typedef int (*sd_part_write_fn)(void *ctx, int part, const char *data, size_t len);

typedef struct {
    uint64_t key;
    int base;      /* part that gets record 0 of every complete round */
    int npend;     /* records waiting in the current round */
    char *data;    /* their bytes, back to back */
    size_t len, cap;
    uint32_t *lens; /* nparts entries */
} sd_split_pending;

typedef struct {
    int nparts;
    uint64_t seed;
    sd_split_pending *b;
    size_t nb;
} sd_stream_splitter;

sd_status sd_stream_splitter_init(sd_stream_splitter *s, int nparts, uint64_t seed, sd_error *err);
int sd_stream_splitter_add(sd_stream_splitter *s, size_t bucket, uint64_t key, const char *rec, size_t len,
                           sd_part_write_fn fn, void *ctx);
int sd_stream_splitter_finish(sd_stream_splitter *s, sd_part_write_fn fn, void *ctx);
void sd_stream_splitter_free(sd_stream_splitter *s);

#endif
