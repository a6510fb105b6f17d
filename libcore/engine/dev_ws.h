/* How much scratch a CUDA context sets aside beside the tensors: cuDNN's
 * workspace cap, and the zero-padded input copy of an asymmetrically
 * padded convolution. Here, not in libcore/engine/cuda, because the memory
 * plan (sd-train --memory-plan) counts them in builds without CUDA too. */
#ifndef SDTK_DEV_WS_H
#define SDTK_DEV_WS_H

#include <stddef.h>

#include "ops_cpu.h"

/* An eighth of the free device memory, between 1 and 8 GiB (1 GiB when
 * free_bytes is 0: unknown); under a memory limit no more than an eighth
 * of the limit. */
static inline size_t sd_dev_conv_workspace(size_t free_bytes, size_t mem_limit)
{
    size_t lo = (size_t)1 << 30, hi = (size_t)8 << 30, w = lo;
    if (free_bytes) w = free_bytes / 8 < lo ? lo : free_bytes / 8 > hi ? hi : free_bytes / 8;
    return mem_limit && mem_limit / 8 < w ? mem_limit / 8 : w;
}

/* Bytes of the fp32 zero-padded copy of the input the CUDA conv makes
 * when the padding differs between sides (cuDNN pads symmetrically; the
 * VAE's downsample pads (0, 1, 0, 1)); 0 when it takes x itself. */
static inline size_t sd_dev_conv_pad_bytes(const sd_conv2d_shape *s)
{
    if (s->pad_t == s->pad_b && s->pad_l == s->pad_r) return 0;
    return (size_t)s->n * (size_t)s->cin * (size_t)(s->h + s->pad_t + s->pad_b) *
           (size_t)(s->w + s->pad_l + s->pad_r) * sizeof(float);
}

#endif
