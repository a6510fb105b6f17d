/* The planning backend: a backend table (backend.h) that counts memory
 * instead of computing. alloc hands out addresses in a reserved range that
 * is never readable (PROT_NONE), release gives them back, and every op
 * adds the scratch the real op would allocate for its shape, asked of the
 * function that allocates it (ops_cpu.h's *_scratch_bytes for the CPU;
 * the attention score blocks of attn_blocks.h for CUDA). Running a
 * model's real forward and backward on it gives the peak bytes those
 * calls hold, by the allocator's own arithmetic, without touching a byte:
 * sd-train --memory-plan walks the training step on it. */
#ifndef SDTK_PLAN_BACKEND_H
#define SDTK_PLAN_BACKEND_H

#include <stddef.h>

#include "backend.h"

enum { SD_PLAN_MAX_BLOCKS = 64 };

typedef struct {
    int workers;       /* CPU: the pool size the ops' scratch is sized for */
    int device;        /* 1: count a CUDA context's op scratch instead of the CPU's */
    int attn_flash;    /* device: attention on the flash kernel (no score blocks) */
    size_t attn_block; /* device: floats in one score block; 0: attn_blocks.h's default */
    char *base;        /* the reserved range alloc hands out, span bytes */
    size_t span, used;
    size_t live, peak;  /* bytes handed out and not released; their most */
    size_t scratch;     /* the most one op held on top of them */
    size_t peak_total;  /* the most live + op scratch at any call */
    struct {
        char *p;
        size_t bytes;
    } blk[SD_PLAN_MAX_BLOCKS];
    size_t nblk;
} sd_plan_exec;

/* Reserve span bytes of address space (nothing committed) for alloc;
 * workers as the CPU pool's size (0 or 1: one thread). */
sd_status sd_plan_exec_init(sd_plan_exec *x, size_t span, int workers, sd_error *err);
void sd_plan_exec_free(sd_plan_exec *x);
/* The table; its exec argument is an sd_plan_exec *. */
const sd_backend *sd_backend_plan(void);
/* alloc's rounding: what a block of `bytes` takes of the range. */
size_t sd_plan_round(size_t bytes);

#endif
