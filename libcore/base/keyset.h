/* A set of 128-bit content hashes, for spotting duplicate record keys in
 * streams of millions of records without keeping the keys themselves
 * (16 bytes a key; a false duplicate needs a 128-bit collision). */
#ifndef SDTK_KEYSET_H
#define SDTK_KEYSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t lo, hi;
} sd_key128;

typedef struct {
    sd_key128 *slots;
    size_t cap, n;
} sd_keyset;

void sd_keyset_init(sd_keyset *s);
void sd_keyset_free(sd_keyset *s);
sd_key128 sd_key128_of(const void *data, size_t len);
sd_key128 sd_key128_of2(const void *a, size_t alen, const void *b, size_t blen); /* of a then b */
int sd_keyset_insert(sd_keyset *s, sd_key128 k);

#endif
