/* A shard of random latents and text embeddings of one bucket, for the
 * memory-plan bench (bench_mem_plan.sh): N records of W x H pixels
 * (latents [4, H/8, W/8]), each with its own 77-token embedding of width
 * CROSS (SD 1.x / 2.x) or, with POOLED > 0, SDXL's two hidden states
 * (768 + CROSS - 768) and a pooled output of POOLED. Values are random:
 * only the shapes matter to memory.
 * usage: bench_mem_shard OUT W H CROSS POOLED N */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "f16.h"
#include "shard.h"

/* Deterministic floats in [-1, 1). */
static float frand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Record i's text embedding under key: [77, cross] fp16, or SDXL's parts. */
static int put_text(sd_shard *s, const uint8_t key[16], int cross, int pooled, uint32_t seed, sd_error *err)
{
    int w1 = pooled ? 768 : cross, w2 = pooled ? cross - 768 : 0;
    size_t n = 77 * (size_t)(w1 + w2) + (size_t)pooled;
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) return 0;
    for (size_t i = 0; i < n; i++) h[i] = sd_f32_to_f16(0.5f * frand(&seed));
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_TEXT;
    if (pooled) {
        r.ntensors = 3;
        r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN1, 2, {77, (uint32_t)w1, 0, 0}, 0, 0, h};
        r.t[1] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN2, 2, {77, (uint32_t)w2, 0, 0}, 0, 0, h + 77 * w1};
        r.t[2] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_POOLED, 1, {(uint32_t)pooled, 0, 0, 0}, 0, 0,
                                   h + 77 * (size_t)(w1 + w2)};
    } else {
        r.ntensors = 1;
        r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN, 2, {77, (uint32_t)w1, 0, 0}, 0, 0, h};
    }
    sd_buf b;
    sd_buf_init(&b);
    int ok = sd_shard_rec_build(&r, &b, err) == SD_OK && sd_shard_put_text(s, key, b.data, b.len, err) == SD_OK;
    sd_buf_free(&b);
    free(h);
    return ok;
}

/* Latent record i: a sample of bucket w x h referencing text key. */
static int put_latent(sd_shard *s, int i, uint32_t w, uint32_t h, const uint8_t text[16], sd_error *err)
{
    char name[32];
    snprintf(name, sizeof name, "img%06d", i);
    size_t n = 4 * (size_t)(h / 8) * (w / 8);
    float *d = malloc(n * sizeof(float));
    if (!d) return 0;
    uint32_t seed = (uint32_t)i * 977u + 1u;
    for (size_t j = 0; j < n; j++) d[j] = frand(&seed);
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_LATENT;
    r.orig_w = w;
    r.orig_h = h;
    r.bucket_w = w;
    r.bucket_h = h;
    r.crop[2] = w;
    r.crop[3] = h;
    memcpy(r.text_ref, text, 16);
    r.name = name;
    r.name_len = strlen(name);
    r.t[0] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_SAMPLE, 3, {4, h / 8, w / 8, 0}, 0, 0, d};
    r.ntensors = 1;
    sd_buf b;
    sd_buf_init(&b);
    uint8_t key[16] = {0};
    memcpy(key, name, strlen(name) < 16 ? strlen(name) : 16);
    int ok = sd_shard_rec_build(&r, &b, err) == SD_OK && sd_shard_put(s, key, 16, b.data, b.len, err) == SD_OK;
    sd_buf_free(&b);
    free(d);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: bench_mem_shard OUT W H CROSS POOLED N\n");
        return 2;
    }
    int w = atoi(argv[2]), h = atoi(argv[3]), cross = atoi(argv[4]), pooled = atoi(argv[5]), n = atoi(argv[6]);
    if (w < 8 || h < 8 || w % 8 || h % 8 || cross < 1 || pooled < 0 || (pooled && cross <= 768) || n < 1) {
        fprintf(stderr, "bench_mem_shard: W, H multiples of 8; CROSS > 768 with POOLED; N >= 1\n");
        return 2;
    }
    sd_error err = {0};
    sd_shard *s = NULL;
    sd_shard_opts so = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, (size_t)1 << 30, 0};
    int ok = sd_shard_open(&s, argv[1], &so, &err) == SD_OK;
    ok = ok && sd_shard_meta_set(s, SD_SHARD_META_SCALING, "0.18215", &err) == SD_OK &&
         sd_shard_meta_set(s, SD_SHARD_META_MODEL, "bench-vae", &err) == SD_OK;
    for (int i = 0; i < n && ok; i++) {
        uint8_t key[16] = {0xa0, (uint8_t)i, (uint8_t)(i >> 8)};
        ok = put_text(s, key, cross, pooled, (uint32_t)i + 7u, &err) &&
             put_latent(s, i, (uint32_t)w, (uint32_t)h, key, &err);
    }
    sd_error cerr = {0};
    if (s && sd_shard_close(s, &cerr) != SD_OK && ok) {
        ok = 0;
        err = cerr;
    }
    if (!ok) fprintf(stderr, "bench_mem_shard: %s: %s\n", argv[1], err.msg[0] ? err.msg : "failed");
    return ok ? 0 : 1;
}
