/* Fuzz target for the shard page walk (formats/shard_pages.c): any bytes
 * are written as a shard file and opened read-only the way sd-verify opens
 * it; the deep walk must finish (of the newest snapshot, and of the one
 * before it, which the salvage reads too), and when the open walk found no damage
 * every database is read to its end through LMDB's own cursors, which
 * trust the pages: a page the walk let through that sends LMDB outside the
 * file crashes here, under ASan (or trips one of liblmdb's assertions).
 * Then it is opened as a writer (the deep walk) and, when that succeeds, a
 * meta entry is put and the first latent record deleted, so LMDB's writer
 * takes pages from the freelist and frees a record's pages. One file per
 * process, rewritten per input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "shard.h"
#include "shard_int.h"

/* Count the entries the walk hands over (their bytes touched for ASan). */
static sd_status touch(void *ctx, sd_shard_db db, const void *key, size_t klen, const void *val, size_t vlen,
                       sd_error *err)
{
    (void)db;
    (void)err;
    unsigned *sum = ctx;
    for (size_t i = 0; i < klen; i++) *sum += ((const uint8_t *)key)[i];
    for (size_t i = 0; i < vlen; i++) *sum += ((const uint8_t *)val)[i];
    return SD_OK;
}

/* Every entry of every database through LMDB's cursors. */
static void read_all(sd_shard *s)
{
    sd_shard_txn *t;
    sd_error err;
    if (sd_shard_read_begin(s, &t, &err)) return;
    unsigned sum = 0;
    for (int db = SD_SHARD_DB_LATENTS; db <= SD_SHARD_DB_META; db++) {
        sd_shard_cursor *c;
        if (sd_shard_cursor_open(t, (sd_shard_db)db, &c, &err)) continue;
        const void *k, *v;
        size_t kl, vl;
        while (sd_shard_cursor_next(c, &k, &kl, &v, &vl, &err) == SD_OK) {
            for (size_t i = 0; i < vl; i++) sum += ((const uint8_t *)v)[i];
            sum += kl;
        }
        sd_shard_cursor_close(c);
    }
    sd_shard_bucket *b;
    size_t nb;
    if (sd_shard_buckets(t, &b, &nb, &err) == SD_OK) {
        for (size_t i = 0; i < nb; i++) { /* bindex's dups through LMDB's dup cursor */
            sd_shard_cursor *c;
            if (sd_shard_cursor_bucket(t, b[i].w, b[i].h, &c, &err)) continue;
            const void *k, *v;
            size_t kl, vl;
            while (sd_shard_cursor_next(c, &k, &kl, &v, &vl, &err) == SD_OK) sum += kl + vl;
            sd_shard_cursor_close(c);
        }
        free(b);
    }
    sd_shard_read_end(t);
    if (sum == 0xdeadbeef) abort(); /* keeps the reads */
}

/* The writer's side: one put and one delete, committed. */
static void write_some(const char *path)
{
    sd_shard *s;
    sd_error err;
    sd_shard_opts so = {SD_SHARD_NOGROW, 1 << 20, 1 << 20};
    if (sd_shard_open(&s, path, &so, &err)) return;
    sd_shard_txn *t;
    uint8_t key[SD_SHARD_MAX_KEY];
    size_t klen = 0;
    if (sd_shard_read_begin(s, &t, &err) == SD_OK) {
        sd_shard_cursor *c;
        const void *k, *v;
        size_t vl;
        if (sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, &err) == SD_OK) {
            if (sd_shard_cursor_next(c, &k, &klen, &v, &vl, &err) == SD_OK && klen <= sizeof key) memcpy(key, k, klen);
            else klen = 0;
            sd_shard_cursor_close(c);
        }
        sd_shard_read_end(t);
    }
    if (sd_shard_begin(s, &err) == SD_OK) {
        sd_shard_meta_set(s, "fuzz", "a value long enough to need a page of its own now and then", &err);
        if (klen) sd_shard_del(s, key, klen, &err);
        sd_shard_commit(s, &err);
    }
    sd_shard_close(s, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], lock[80];
    snprintf(path, sizeof path, "/tmp/sdtk-fuzz-pages-%d.shard", (int)getpid());
    snprintf(lock, sizeof lock, "%s-lock", path);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    sd_shard *s;
    sd_error err;
    sd_shard_opts so = {SD_SHARD_RDONLY | SD_SHARD_KEEP_DAMAGED, 0, 0};
    if (sd_shard_open(&s, path, &so, &err) == SD_OK) {
        sd_shard_pages pages;
        unsigned sum = 0;
        if (sd_shard_check_pages(s, 1, touch, &sum, &pages, &err) == SD_OK && !sd_shard_damaged(s) &&
            sum != 0xdeadbeef)
            read_all(s);
        sd_shard_walk_snapshot(s, 1, 1, touch, &sum, &pages, &err); /* the salvage's walk of the older snapshot */
        sd_shard_close(s, &err);
        write_some(path);
    }
    unlink(path);
    unlink(lock);
    return 0;
}
