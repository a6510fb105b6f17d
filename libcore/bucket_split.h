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

#endif
