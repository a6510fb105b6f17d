/* 3x3 stride-1 convolution by Winograd F(2x2, 3x3) over sgemm: 16 GEMMs
 * of 2.25x fewer multiply-adds than im2col, used by ops_conv.c for the
 * forward of every 3x3 stride-1 conv and for the input gradient of those
 * (a 3x3 stride-1 conv of dy with the flipped, transposed weights). */
#ifndef SDTK_CONV_WINO_H
#define SDTK_CONV_WINO_H

#include "pool.h"

/* One Winograd conv: x [n, cin, h, w] -> y [n, cout, oh, ow] with
 * oh = h + pt + pb - 2, ow = w + pl + pr - 2 (pads 0..2 each side). Weights
 * w are torch's [cout, cin, 3, 3], or with flip the forward conv's
 * [cin, cout, 3, 3] read transposed and rotated 180 degrees (the input
 * gradient). b [cout] or NULL. acc adds into y instead of writing it. */
typedef struct {
    int n, cin, cout, h, w;
    int pt, pb, pl, pr;
    int flip, acc;
} sd_wino_shape;

/* Whether the shape is one sd_wino_conv handles (pads 0..2, output >= 1)
 * and one where it is faster than im2col (cin >= 32, 128 or more 2x2
 * output tiles per image: 24x24 and up). */
int sd_wino_ok(const sd_wino_shape *s);

/* Runs the conv; returns 0 when its scratch could not be allocated (the
 * caller then takes another path; y is untouched). */
int sd_wino_conv(sd_pool *pool, const sd_wino_shape *s, float *y, const float *x, const float *w, const float *b);

/* sd_wino_conv with x stored as xdt and y as ydt (SD_DT_F32, F16, BF16;
 * act_store.h), computed in fp32: y is the fp32 result for the widened x,
 * rounded once. acc needs ydt fp32. */
/* The bytes sd_wino_conv(_st) allocates on nworkers workers (the
 * transformed weights and the workers' areas, live together). */
size_t sd_wino_scratch_bytes(int nworkers, const sd_wino_shape *s);

int sd_wino_conv_st(sd_pool *pool, const sd_wino_shape *s, int ydt, void *y, int xdt, const void *x, const float *w,
                    const float *b);

#endif
