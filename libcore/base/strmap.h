/* A string-keyed hash map (open addressing, XXH3) used for tag sets and tag
 * maps; keys are copied, values are a pointer and a number. Built once,
 * then read concurrently by workers without locks. */
#ifndef SDTK_STRMAP_H
#define SDTK_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *key;
    size_t key_len;
    uint64_t hash;
    const char *sval;
    double nval;
} sd_strmap_slot;

typedef struct {
    sd_strmap_slot *slots;
    size_t cap, n;
} sd_strmap;

void sd_strmap_init(sd_strmap *m);
void sd_strmap_free(sd_strmap *m);
sd_strmap_slot *sd_strmap_put(sd_strmap *m, const char *key, size_t len);
const sd_strmap_slot *sd_strmap_get(const sd_strmap *m, const char *key, size_t len);
uint64_t sd_strmap_hash(const char *key, size_t len);
const sd_strmap_slot *sd_strmap_get_h(const sd_strmap *m, const char *key, size_t len, uint64_t h);

#endif
