/* sd-train --masked-loss: a record's loss mask at the latent size, as
 * sd-scripts' apply_masked_loss makes it (library/custom_train_functions.py:
 * the alpha mask, 0..1 at the image's size, interpolated with mode "area"
 * to the loss's size: with an image 8 times the latent, each latent pixel
 * takes the mean of its 8 x 8 pixels), mirrored for a flipped sample as
 * sd-scripts mirrors the cached mask. */
#include <stdio.h>
#include <string.h>

#include "data.h"
#include "data_int.h"

/* The record's mask into out [h, w] (the latent size), mirrored when flip;
 * ones when the record has none (sd-scripts fills a batch's missing masks
 * with ones). A reason string when the mask cannot be used, the numbers
 * behind it in note (NOTE_CAP bytes). */
const char *sd_data_mask_load(const sd_shard_rec *r, int flip, int h, int w, float *out, char *note)
{
    const sd_shard_tensor *m = sd_shard_rec_tensor(r, SD_ROLE_MASK);
    size_t n = (size_t)h * (size_t)w;
    if (!m) {
        for (size_t i = 0; i < n; i++) out[i] = 1.0f;
        return NULL;
    }
    /* the parser checked fp32 [H, W] of the bucket's or the latent size */
    int mh = (int)m->shape[0], mw = (int)m->shape[1], f;
    if (mh == h && mw == w) f = 1;
    else if (mh == 8 * h && mw == 8 * w) f = 8;
    else {
        snprintf(note, NOTE_CAP, "mask %dx%d, latent %dx%d", mw, mh, w, h);
        return "loss mask size differs from the latent's";
    }
    const unsigned char *src = m->data;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            /* area: the mean of the f x f block, summed in row order as torch's adaptive average */
            float s = 0;
            for (int dy = 0; dy < f; dy++)
                for (int dx = 0; dx < f; dx++) {
                    float v;
                    memcpy(&v, src + 4 * ((size_t)(y * f + dy) * (size_t)mw + (size_t)(x * f + dx)), 4);
                    s += v;
                }
            float a = s / (float)(f * f);
            if (!(a >= 0.0f && a <= 1.0f)) {
                snprintf(note, NOTE_CAP, "a latent pixel's weight %g", (double)a);
                return "loss mask value outside 0..1";
            }
            out[(size_t)y * (size_t)w + (size_t)(flip ? w - 1 - x : x)] = a;
        }
    return NULL;
}
