/* sd-train --masked-loss: a record's loss mask at the latent size, as
 * sd-scripts' apply_masked_loss makes it (sd_shard_mask_reduce: with an
 * image 8 times the latent, each latent pixel takes the mean of its 8 x 8
 * pixels), mirrored for a flipped sample as sd-scripts mirrors the cached
 * mask. */
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
    sd_shard_mask_reduce(m->data, mh, mw, f, flip, out);
    for (size_t i = 0; i < n; i++)
        if (!(out[i] >= 0.0f && out[i] <= 1.0f)) {
            snprintf(note, NOTE_CAP, "a latent pixel's weight %g", (double)out[i]);
            return "loss mask value outside 0..1";
        }
    return NULL;
}
