/* sd-latents records: the flipped variant, --sample noise, and one
 * latent record (header fields, tensors in the stored dtype). */
#include <math.h>
#include <string.h>

#include "hash.h"
#include "latents.h"
#include "shard.h"

/* Mirror each CHW image left-right: the flipped variant of a decoded image. */
void latents_flip_lr(float *dst, const float *src, int planes, int h, int w)
{
    for (int p = 0; p < planes * h; p++) {
        const float *s = src + (size_t)p * (size_t)w;
        float *d = dst + (size_t)p * (size_t)w;
        for (int x = 0; x < w; x++) d[x] = s[w - 1 - x];
    }
}

/* mean + std * N(0, 1) in place of mean (Box-Muller), seeded by the record
 * name, the variant and --seed, so a sample never depends on batch order. */
static void sample_into(float *mean, const float *std, size_t n, const char *name, int variant, uint64_t seed)
{
    uint64_t s = sd_hash64(name, strlen(name), seed) ^ (uint64_t)variant * 0xD6E8FEB86659FD93ull;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((double)(sd_splitmix64(&s) >> 11) + 1.0) / 9007199254740993.0;
        double u2 = (double)(sd_splitmix64(&s) >> 11) / 9007199254740992.0;
        double rad = sqrt(-2.0 * log(u1));
        mean[i] += std[i] * (float)(rad * cos(2.0 * M_PI * u2));
        if (i + 1 < n) mean[i + 1] += std[i + 1] * (float)(rad * sin(2.0 * M_PI * u2));
    }
}

/* The record of job j: roles by mode and variant, tensors [lc, lh, lw] in
 * dtype, the loss mask (fp32 [lh, lw]) when it has one, bucket, original
 * size, the crop actually cut, the text reference.
 * --sample turns the means into samples in place. */
sd_status latents_record(const latent_job *j, const latents_opts *o, int dtype, float *const mean[2],
                         float *const std[2], const latent_shape *ls, const uint8_t *text_ref, sd_buf *conv,
                         sd_buf *out, sd_error *err)
{
    int variants = o->flip ? 2 : 1, nt = 0;
    size_t lat = ls->n, esz = sd_dtype_size(dtype);
    sd_buf_clear(conv);
    if (sd_buf_reserve(conv, 4 * lat * esz)) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_shard_rec rec = {.kind = SD_REC_LATENT, .orig_w = (uint32_t)j->orig_w, .orig_h = (uint32_t)j->orig_h,
                        .bucket_w = (uint32_t)j->bucket_w, .bucket_h = (uint32_t)j->bucket_h, .name = j->name,
                        .name_len = strlen(j->name)};
    rec.crop[0] = j->plan.crop_l;
    rec.crop[1] = j->plan.crop_t;
    rec.crop[2] = j->plan.crop_r;
    rec.crop[3] = j->plan.crop_b;
    rec.flags = (uint16_t)((o->flip ? SD_REC_F_FLIPPED : 0) | (o->sample ? 0 : SD_REC_F_MEANSTD) |
                           (j->transposed ? SD_REC_F_TRANSPOSED : 0));
    if (text_ref) memcpy(rec.text_ref, text_ref, 16);
    for (int v = 0; v < variants; v++) {
        if (o->sample) sample_into(mean[v], std[v], lat, j->name, v, o->seed);
        int nr = o->sample ? 1 : 2;
        int roles[2] = {o->sample ? (v ? SD_ROLE_SAMPLE_FLIP : SD_ROLE_SAMPLE) : (v ? SD_ROLE_MEAN_FLIP : SD_ROLE_MEAN),
                        v ? SD_ROLE_STD_FLIP : SD_ROLE_STD};
        for (int t = 0; t < nr; t++) {
            unsigned char *dst = (unsigned char *)conv->data + (size_t)nt * lat * esz;
            sd_dtype_store(dst, t ? std[v] : mean[v], lat, dtype);
            rec.t[nt] = (sd_shard_tensor){.dtype = (uint8_t)dtype, .role = (uint8_t)roles[t], .ndim = 3,
                                          .shape = {(uint32_t)ls->c, (uint32_t)ls->h, (uint32_t)ls->w, 0},
                                          .data = dst};
            nt++;
        }
    }
    if (j->mask) { /* unflipped: a flipped sample's mask is this one mirrored */
        rec.t[nt++] = (sd_shard_tensor){.dtype = SD_DT_F32, .role = SD_ROLE_MASK, .ndim = 2,
                                        .shape = {(uint32_t)ls->h, (uint32_t)ls->w, 0, 0}, .data = j->mask};
        rec.flags |= SD_REC_F_MASK;
    }
    rec.ntensors = nt;
    return sd_shard_rec_build(&rec, out, err);
}
