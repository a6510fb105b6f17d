/* How attention through cuBLAS (libcore/engine/cuda/cuda_attn_gemm.c) cuts the
 * score matrix into blocks: a block holds `heads` heads x `rows` query
 * rows x tk scores and at most SD_ATTN_BLOCK_FLOATS floats (256 MiB), so
 * the forward needs one such buffer and the backward two, whatever T is
 * (the VAE's 16384-token attention at 1024^2 goes through in blocks of
 * 4096 query rows). Here, not in the CUDA code, because sd-selftest --plan
 * counts that scratch in builds without CUDA too. */
#ifndef SDTK_ATTN_BLOCKS_H
#define SDTK_ATTN_BLOCKS_H

#include <stddef.h>

#include "ops_cpu.h"

enum { SD_ATTN_BLOCK_FLOATS = 1 << 26 };

typedef struct {
    int heads, rows;
} sd_attn_blocks;

/* Whole heads (as many as fit in max_floats, 0: SD_ATTN_BLOCK_FLOATS)
 * when one head's tq x tk scores fit, else one head and as many query
 * rows as fit (at least one). */
static inline sd_attn_blocks sd_attn_blocking(const sd_attn_shape *s, size_t max_floats)
{
    size_t cap = max_floats ? max_floats : SD_ATTN_BLOCK_FLOATS;
    size_t bh = (size_t)s->b * (size_t)s->heads, per = (size_t)s->tq * (size_t)s->tk;
    sd_attn_blocks k = {1, s->tq};
    if (s->tq < 1 || s->tk < 1) return (sd_attn_blocks){1, 1}; /* nothing to block (shapes are checked elsewhere) */
    if (per <= cap) {
        size_t h = cap / per;
        k.heads = (int)(h < bh ? h : bh);
    } else {
        size_t r = cap / (size_t)s->tk;
        k.rows = r < 1 ? 1 : (int)r;
    }
    return k;
}

/* Bytes of one score block. */
static inline size_t sd_attn_block_bytes(const sd_attn_shape *s, size_t max_floats)
{
    sd_attn_blocks k = sd_attn_blocking(s, max_floats);
    return (size_t)k.heads * (size_t)k.rows * (size_t)s->tk * sizeof(float);
}

#endif
