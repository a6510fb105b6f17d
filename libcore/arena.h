/* Bump allocator for per-record and per-batch scratch memory: many small
 * allocations, freed all at once by a reset. */
#ifndef SDTK_ARENA_H
#define SDTK_ARENA_H

#include <stddef.h>

typedef struct sd_arena_block sd_arena_block;
typedef struct {
    sd_arena_block *head;
    size_t block_size;
} sd_arena;

void sd_arena_init(sd_arena *a, size_t block_size);
void *sd_arena_alloc(sd_arena *a, size_t n);
char *sd_arena_strndup(sd_arena *a, const char *s, size_t n);
void sd_arena_reset(sd_arena *a);
void sd_arena_free(sd_arena *a);

#endif
