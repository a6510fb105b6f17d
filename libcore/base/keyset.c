#include "keyset.h"

#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation that can fail */
#include <xxhash.h>

/* Empty set. */
void sd_keyset_init(sd_keyset *s)
{
    s->slots = NULL;
    s->cap = s->n = 0;
}

/* Release the table. */
void sd_keyset_free(sd_keyset *s)
{
    free(s->slots);
    sd_keyset_init(s);
}

/* The 128-bit XXH3 of a key; never all-zero (zero marks an empty slot). */
sd_key128 sd_key128_of(const void *data, size_t len)
{
    XXH128_hash_t h = XXH3_128bits(data, len);
    sd_key128 k = {h.low64, h.high64};
    if (!k.lo && !k.hi) k.lo = 1;
    return k;
}

/* sd_key128_of of a's bytes followed by b's, without joining them (XXH3's
 * streaming state gives the one-shot hash of the concatenation). */
sd_key128 sd_key128_of2(const void *a, size_t alen, const void *b, size_t blen)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, a, alen);
    XXH3_128bits_update(&st, b, blen);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    sd_key128 k = {h.low64, h.high64};
    if (!k.lo && !k.hi) k.lo = 1;
    return k;
}

/* Place k in a table without growing it. */
static int place(sd_key128 *slots, size_t cap, sd_key128 k)
{
    size_t i = (size_t)k.lo & (cap - 1);
    while (slots[i].lo || slots[i].hi) {
        if (slots[i].lo == k.lo && slots[i].hi == k.hi) return 0;
        i = (i + 1) & (cap - 1);
    }
    slots[i] = k;
    return 1;
}

/* Insert k: 1 if it was new, 0 if already present, -1 out of memory. */
int sd_keyset_insert(sd_keyset *s, sd_key128 k)
{
    if ((s->n + 1) * 10 > s->cap * 7) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        sd_key128 *ns = calloc(cap, sizeof *ns);
        if (!ns) return -1;
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i].lo || s->slots[i].hi) place(ns, cap, s->slots[i]);
        free(s->slots);
        s->slots = ns;
        s->cap = cap;
    }
    int r = place(s->slots, s->cap, k);
    s->n += (size_t)r;
    return r;
}
