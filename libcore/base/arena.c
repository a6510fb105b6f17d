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
    a->spare = NULL;
    a->block_size = block_size ? block_size : 65536;
    a->cur = a->end = NULL;
}

/* The head block is full: take a spare block or allocate one (n is already
 * rounded up). Spares come from earlier resets, so a batch loop stops paying
 * for fresh pages (page faults and zeroing) once it has reached its size. */
void *sd_arena_alloc_slow(sd_arena *a, size_t n)
{
    sd_arena_block *b = a->spare;
    if (b && b->cap >= n) {
        a->spare = b->next;
    } else {
        size_t cap = n > a->block_size ? n : a->block_size;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->cap = cap;
    }
    b->next = a->head;
    a->head = b;
    a->cur = (char *)b->data + n;
    a->end = (char *)b->data + b->cap;
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

/* Forget every allocation; the blocks are kept as spares for reuse. */
void sd_arena_reset(sd_arena *a)
{
    sd_arena_block *b = a->head;
    while (b) {
        sd_arena_block *n = b->next;
        b->next = a->spare;
        a->spare = b;
        b = n;
    }
    a->head = NULL;
    a->cur = a->end = NULL;
}

/* Free a chain of blocks. */
static void free_chain(sd_arena_block *b)
{
    while (b) {
        sd_arena_block *n = b->next;
        free(b);
        b = n;
    }
}

/* Release all memory. */
void sd_arena_free(sd_arena *a)
{
    free_chain(a->head);
    free_chain(a->spare);
    a->head = a->spare = NULL;
    a->cur = a->end = NULL;
}
