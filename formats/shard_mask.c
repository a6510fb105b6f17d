/* Loss masks at the latent size: what sd-scripts' apply_masked_loss makes of
 * an alpha mask (library/custom_train_functions.py: the mask, 0..1 at the
 * image's size, interpolated with mode "area" to the loss's size). With the
 * image f times the latent on each side, area interpolation is the mean of
 * each f x f block; torch sums the block in row order and divides by its
 * count, and so does this, in float. sd-latents stores masks reduced so,
 * and sd-train reduces a mask stored at the image's size (an imported kohya
 * alpha_mask) the same way. */
#include <string.h>

#include "shard.h"

/* src: fp32 [mh, mw] as stored bytes (any alignment); out: [mh / f, mw / f],
 * mirrored left-right when flip (a flipped sample's mask). */
void sd_shard_mask_reduce(const void *src, int mh, int mw, int f, int flip, float *out)
{
    const unsigned char *b = src;
    int h = mh / f, w = mw / f;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            float s = 0;
            for (int dy = 0; dy < f; dy++)
                for (int dx = 0; dx < f; dx++) {
                    float v;
                    memcpy(&v, b + 4 * ((size_t)(y * f + dy) * (size_t)mw + (size_t)(x * f + dx)), 4);
                    s += v;
                }
            out[(size_t)y * (size_t)w + (size_t)(flip ? w - 1 - x : x)] = s / (float)(f * f);
        }
}
