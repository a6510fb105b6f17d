/* Bump allocator for per-record and per-batch scratch memory: many small
 * allocations, freed all at once by a reset (which keeps the blocks). */
#ifndef SDTK_ARENA_H
#define SDTK_ARENA_H

#include <stddef.h>

typedef struct sd_arena_block sd_arena_block;
typedef struct {
    sd_arena_block *head;  /* blocks in use, newest first */
    sd_arena_block *spare; /* blocks kept by reset for reuse */
    size_t block_size;
    char *cur, *end; /* free space in the head block */
} sd_arena;

void sd_arena_init(sd_arena *a, size_t block_size);
void *sd_arena_alloc_slow(sd_arena *a, size_t n);

/* 16-byte aligned allocation; NULL only when malloc fails. Inline because
 * the JSON parser allocates every node here. */
static inline void *sd_arena_alloc(sd_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if ((size_t)(a->end - a->cur) >= n) {
        void *p = a->cur;
        a->cur += n;
        return p;
    }
    return sd_arena_alloc_slow(a, n);
}

char *sd_arena_strndup(sd_arena *a, const char *s, size_t n);
void sd_arena_reset(sd_arena *a);
void sd_arena_free(sd_arena *a);

#endif
