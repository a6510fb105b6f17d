/* Shard store benchmark (run by hand through bench_shard.sh):
 *   size DIR              bytes on disk per cached sample: SD 512^2 (4x64x64)
 *                         and SDXL 1024^2 (4x128x128), fp16/bf16, with and
 *                         without the flipped variant
 *   make SHARD N C H W F  write N latent records C x H x W fp16 (F: flipped)
 *   read SHARD N SECS V   random-key reads of records 0..N-1 as a trainer
 *                         does (read txn renewed every 256 samples, header
 *                         parse, copy of the sample out; V=1 also verifies
 *                         the payload checksum): samples/s on one core */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hash.h"
#include "progress.h"
#include "shard.h"

static void key_of(int i, char name[32], uint8_t key[16])
{
    snprintf(name, 32, "train/%08d.png", i);
    uint64_t a = sd_hash64(name, strlen(name), 1), b = sd_hash64(name, strlen(name), 2);
    memcpy(key, &a, 8);
    memcpy(key + 8, &b, 8);
}

/* Write n records of shape c x h x w; random-ish finite values. */
static int make(const char *path, int n, int c, int h, int w, int flip, int dtype)
{
    sd_shard_opts o = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, 0, 0};
    sd_shard *s;
    sd_error err;
    if (sd_shard_open(&s, path, &o, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t elems = (size_t)c * h * w;
    uint16_t *lat = malloc(elems * 2 * 2);
    uint64_t x = 1;
    for (size_t i = 0; i < elems * 2; i++) {
        x = sd_mix64(x + i);
        lat[i] = (uint16_t)(0x3000 | (x & 0x0fff));
    }
    sd_buf b;
    sd_buf_init(&b);
    int st = 0;
    for (int i = 0; !st && i < n; i += 64) {
        st |= sd_shard_begin(s, &err);
        for (int j = i; !st && j < n && j < i + 64; j++) {
            char name[32];
            uint8_t key[16];
            key_of(j, name, key);
            sd_shard_rec r;
            memset(&r, 0, sizeof r);
            r.kind = SD_REC_LATENT;
            r.flags = flip ? SD_REC_F_FLIPPED : 0;
            r.bucket_w = (uint32_t)w * 8, r.bucket_h = (uint32_t)h * 8;
            r.orig_w = r.bucket_w, r.orig_h = r.bucket_h;
            r.crop[2] = r.bucket_w, r.crop[3] = r.bucket_h;
            r.name = name, r.name_len = strlen(name);
            r.ntensors = 1 + flip;
            for (int t = 0; t < r.ntensors; t++)
                r.t[t] = (sd_shard_tensor){(uint8_t)dtype, (uint8_t)(t ? SD_ROLE_SAMPLE_FLIP : SD_ROLE_SAMPLE), 3,
                                           {(uint32_t)c, (uint32_t)h, (uint32_t)w, 0}, 0, 0, lat + (size_t)t * elems + (size_t)(j % 7)};
            st |= sd_shard_rec_build(&r, &b, &err);
            if (!st) st |= sd_shard_put(s, key, 16, b.data, b.len, &err);
        }
        if (!st) st |= sd_shard_commit(s, &err);
    }
    if (st) fprintf(stderr, "%s\n", err.msg);
    sd_shard_close(s, &err);
    sd_buf_free(&b);
    free(lat);
    return st;
}

static int size_all(const char *dir)
{
    static const struct { const char *what; int h, w; } cfg[2] = {{"SD 512^2 4x64x64", 64, 64}, {"SDXL 1024^2 4x128x128", 128, 128}};
    const int n = 400;
    for (int c = 0; c < 2; c++)
        for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++)
            for (int flip = 0; flip < 2; flip++) {
                char path[4096];
                snprintf(path, sizeof path, "%s/size_%d_%d_%d.shard", dir, c, dt, flip);
                remove(path);
                if (make(path, n, 4, cfg[c].h, cfg[c].w, flip, dt)) return 1;
                struct stat sb;
                stat(path, &sb);
                printf("%-22s %s flip=%d: %.0f bytes/sample on disk (file %lld bytes, %d samples)\n", cfg[c].what,
                       sd_dtype_name(dt), flip, (double)sb.st_size / n, (long long)sb.st_size, n);
            }
    return 0;
}

static int read_bench(const char *path, int n, double secs, int verify)
{
    sd_shard_opts o = {SD_SHARD_RDONLY | SD_SHARD_RANDOM, 0, 0};
    sd_shard *s;
    sd_error err;
    if (sd_shard_open(&s, path, &o, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    sd_shard_txn *t;
    if (sd_shard_read_begin(s, &t, &err)) return 1;
    static uint8_t out[4 * 128 * 128 * 4];
    uint64_t x = 42, done = 0, bad = 0;
    double t0 = sd_now(), now = t0;
    while (now - t0 < secs) {
        for (int k = 0; k < 256; k++) {
            x = sd_mix64(x + 1);
            char name[32];
            uint8_t key[16];
            key_of((int)(x % (uint64_t)n), name, key);
            const void *v;
            size_t vl;
            sd_shard_rec r;
            if (sd_shard_get(t, key, 16, &v, &vl, &err) || sd_shard_rec_parse(v, vl, &r, &err) ||
                (verify && sd_shard_rec_check_payload(&r, &err))) {
                bad++;
                continue;
            }
            const sd_shard_tensor *st = sd_shard_rec_tensor(&r, SD_ROLE_SAMPLE);
            memcpy(out, st->data, st->length < sizeof out ? st->length : sizeof out);
            done++;
        }
        sd_shard_read_reset(t);
        if (sd_shard_read_renew(t, &err)) return 1;
        now = sd_now();
    }
    printf("random read%s: %.0f samples/s on one core (%llu samples, %llu errors, %.1f s)\n",
           verify ? " + checksum" : "", done / (now - t0), (unsigned long long)done, (unsigned long long)bad, now - t0);
    sd_shard_read_end(t);
    sd_shard_close(s, &err);
    return bad != 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "size")) return size_all(argv[2]);
    if (argc == 8 && !strcmp(argv[1], "make"))
        return make(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), atoi(argv[7]), SD_DT_F16);
    if (argc == 6 && !strcmp(argv[1], "read")) return read_bench(argv[2], atoi(argv[3]), atof(argv[4]), atoi(argv[5]));
    fprintf(stderr, "usage: bench_shard size DIR | make SHARD N C H W FLIP | read SHARD N SECS VERIFY\n");
    return 2;
}
