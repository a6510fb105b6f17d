#include "strmap.h"

#include "hash.h"

#include <stdlib.h>
#include <string.h>


/* Empty map. */
void sd_strmap_init(sd_strmap *m)
{
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* Free keys and slots (values are owned by the caller). */
void sd_strmap_free(sd_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) free(m->slots[i].key);
    free(m->slots);
    sd_strmap_init(m);
}

/* Slot index for key: its own slot if present, else the empty one it would take. */
static size_t find(const sd_strmap_slot *slots, size_t cap, const char *key, size_t len, uint64_t h)
{
    size_t i = (size_t)h & (cap - 1);
    while (slots[i].key) {
        if (slots[i].hash == h && slots[i].key_len == len && memcmp(slots[i].key, key, len) == 0) return i;
        i = (i + 1) & (cap - 1);
    }
    return i;
}

/* Double the table when it is over half full; 0 on success. */
static int grow(sd_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    sd_strmap_slot *s = calloc(cap, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) s[find(s, cap, m->slots[i].key, m->slots[i].key_len, m->slots[i].hash)] = m->slots[i];
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

/* The slot for key, created (zeroed values) if new; NULL on allocation failure. */
sd_strmap_slot *sd_strmap_put(sd_strmap *m, const char *key, size_t len)
{
    if ((m->n + 1) * 2 > m->cap && grow(m)) return NULL;
    uint64_t h = sd_strmap_hash(key, len);
    size_t i = find(m->slots, m->cap, key, len, h);
    sd_strmap_slot *s = &m->slots[i];
    if (!s->key) {
        s->key = malloc(len + 1);
        if (!s->key) return NULL;
        memcpy(s->key, key, len);
        s->key[len] = 0;
        s->key_len = len;
        s->hash = h;
        s->sval = NULL;
        s->nval = 0;
        m->n++;
    }
    return s;
}

/* The hash the map uses, exposed so a key looked up in several maps is
 * hashed once. */
uint64_t sd_strmap_hash(const char *key, size_t len)
{
    return sd_hash64(key, len, 0);
}

/* Look a key up with its precomputed sd_strmap_hash; NULL when absent. */
const sd_strmap_slot *sd_strmap_get_h(const sd_strmap *m, const char *key, size_t len, uint64_t h)
{
    if (!m->n) return NULL;
    size_t i = find(m->slots, m->cap, key, len, h);
    return m->slots[i].key ? &m->slots[i] : NULL;
}

/* Look a key up; NULL when absent. Safe to call from many threads at once. */
const sd_strmap_slot *sd_strmap_get(const sd_strmap *m, const char *key, size_t len)
{
    return m->n ? sd_strmap_get_h(m, key, len, sd_strmap_hash(key, len)) : NULL;
}
