#include "arena.h"

#include <stdlib.h>
#include <string.h>

struct sd_arena_block {
    sd_arena_block *next;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

/* Prepare an empty arena; blocks are allocated lazily. */
void sd_arena_init(sd_arena *a, size_t block_size)
{
    a->head = NULL;
    a->block_size = block_size ? block_size : 65536;
    a->cur = a->end = NULL;
}

/* The head block is full: start a new one (n is already rounded up). */
void *sd_arena_alloc_slow(sd_arena *a, size_t n)
{
    size_t cap = n > a->block_size ? n : a->block_size;
    sd_arena_block *b = malloc(sizeof *b + cap);
    if (!b) return NULL;
    b->cap = cap;
    b->next = a->head;
    a->head = b;
    a->cur = (char *)b->data + n;
    a->end = (char *)b->data + cap;
    return b->data;
}

/* Copy n bytes into the arena and NUL-terminate them. */
char *sd_arena_strndup(sd_arena *a, const char *s, size_t n)
{
    char *d = sd_arena_alloc(a, n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Free everything but the newest block, which is kept for reuse. */
void sd_arena_reset(sd_arena *a)
{
    if (!a->head) return;
    sd_arena_block *keep = a->head, *b = keep->next;
    while (b) {
        sd_arena_block *n = b->next;
        free(b);
        b = n;
    }
    keep->next = NULL;
    a->cur = (char *)keep->data;
    a->end = (char *)keep->data + keep->cap;
}

/* Release all memory. */
void sd_arena_free(sd_arena *a)
{
    sd_arena_block *b = a->head;
    while (b) {
        sd_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->cur = a->end = NULL;
}
