/* Shard store: record codec round trips and rejection of damaged headers,
 * the writer (batches, map growth, resume lookups, delete, bucket index,
 * names, reindex, meta and version check), reindex of a damaged index, a
 * full map with growth disabled, a reader in a second process while the
 * writer commits, and files cut short (refused unless every missing page is
 * free, as LMDB's own freelist says). */
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "hash.h"
#include "outfile.h"
#include "shard.h"

static char dir[] = "/tmp/sdtk_test_shard_XXXXXX";

/* Deterministic fill of n bytes from a seed. */
static void fill(void *p, size_t n, uint32_t seed)
{
    uint8_t *b = p;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (uint8_t)(x >> 8) & 0x3f; /* keeps fp16/bf16/fp32 finite */
    }
}

/* A latent record for record i: bucket from i, shape 4 x h/8 x w/8; mask 1
 * adds a loss mask of the bucket's size, 2 one of the latent size (record
 * version 2). */
static sd_status make_latent_mask(sd_buf *out, int i, int dtype, int flip, int meanstd, int mask, sd_error *err)
{
    static uint8_t data[4][4 * 32 * 32 * 4];
    static float mdata[256 * 256];
    char name[64];
    snprintf(name, sizeof name, "img/%05d.png", i);
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_LATENT;
    r.flags = (uint16_t)((flip ? SD_REC_F_FLIPPED : 0) | (meanstd ? SD_REC_F_MEANSTD : 0) | (mask ? SD_REC_F_MASK : 0));
    r.orig_w = 1000 + (uint32_t)i;
    r.orig_h = 700;
    r.bucket_w = 64 + 64 * (uint32_t)(i % 3);
    r.bucket_h = 128;
    r.crop[0] = 1.5;
    r.crop[2] = r.bucket_w;
    r.crop[3] = 128;
    r.text_ref[0] = (uint8_t)i;
    r.name = name;
    r.name_len = strlen(name);
    int roles[4] = {SD_ROLE_SAMPLE, SD_ROLE_SAMPLE_FLIP, 0, 0};
    if (meanstd) {
        roles[0] = SD_ROLE_MEAN;
        roles[1] = SD_ROLE_STD;
        roles[2] = SD_ROLE_MEAN_FLIP;
        roles[3] = SD_ROLE_STD_FLIP;
    }
    r.ntensors = (1 + flip) * (1 + meanstd);
    int k = 0;
    for (int j = 0; j < 4; j++) {
        if (!roles[j] || (!flip && (roles[j] == SD_ROLE_SAMPLE_FLIP || roles[j] >= SD_ROLE_MEAN_FLIP))) continue;
        sd_shard_tensor *t = &r.t[k++];
        t->dtype = (uint8_t)dtype;
        t->role = (uint8_t)roles[j];
        t->ndim = 3;
        t->shape[0] = 4;
        t->shape[1] = r.bucket_h / 8;
        t->shape[2] = r.bucket_w / 8;
        fill(data[j], 4 * t->shape[1] * t->shape[2] * sd_dtype_size(dtype), (uint32_t)(i * 7 + j));
        t->data = data[j];
    }
    if (mask) {
        sd_shard_tensor *t = &r.t[r.ntensors++];
        int div = mask == 1 ? 1 : 8;
        *t = (sd_shard_tensor){SD_DT_F32, SD_ROLE_MASK, 2, {r.bucket_h / div, r.bucket_w / div, 0, 0}, 0, 0, mdata};
        for (uint32_t e = 0; e < t->shape[0] * t->shape[1]; e++) mdata[e] = (float)((e * 7 + (uint32_t)i) % 256) / 255.0f;
    }
    return sd_shard_rec_build(&r, out, err);
}

/* A latent record without a mask (record version 1). */
static sd_status make_latent(sd_buf *out, int i, int dtype, int flip, int meanstd, sd_error *err)
{
    return make_latent_mask(out, i, dtype, flip, meanstd, 0, err);
}

/* Build, parse and compare every field for each dtype and tensor layout. */
static void test_codec_roundtrip(void)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_error err;
    for (int dt = SD_DT_F16; dt <= SD_DT_F32; dt++)
        for (int flip = 0; flip < 2; flip++)
            for (int ms = 0; ms < 2; ms++) {
                CHECK(make_latent(&b, 5, dt, flip, ms, &err) == SD_OK);
                sd_shard_rec r;
                if (!CHECK(sd_shard_rec_parse(b.data, b.len, &r, &err) == SD_OK)) {
                    fprintf(stderr, "%s\n", err.msg);
                    continue;
                }
                CHECK(sd_shard_rec_check_payload(&r, &err) == SD_OK);
                CHECK(r.kind == SD_REC_LATENT && r.ntensors == (1 + flip) * (1 + ms));
                CHECK(r.orig_w == 1005 && r.orig_h == 700 && r.bucket_w == 192 && r.bucket_h == 128);
                CHECK(r.crop[0] == 1.5 && r.crop[2] == 192 && r.text_ref[0] == 5);
                CHECK(r.name_len == 13 && memcmp(r.name, "img/00005.png", 13) == 0);
                CHECK(r.payload_off % 16 == 0 && b.len == sd_shard_rec_size(&r));
                for (int i = 0; i < r.ntensors; i++) {
                    CHECK(r.t[i].dtype == dt && r.t[i].ndim == 3 && r.t[i].shape[1] == 16 && r.t[i].shape[2] == 24);
                    CHECK(r.t[i].offset % 16 == 0);
                    CHECK(r.t[i].length == 4u * 16 * 24 * sd_dtype_size(dt));
                }
                CHECK(sd_shard_rec_tensor(&r, ms ? SD_ROLE_MEAN : SD_ROLE_SAMPLE) != NULL);
                CHECK((sd_shard_rec_tensor(&r, ms ? SD_ROLE_STD_FLIP : SD_ROLE_SAMPLE_FLIP) != NULL) == flip);
            }
    /* SDXL text embedding: hidden1 77x768, hidden2 77x1280, pooled 1280 */
    static uint16_t h1[77 * 768], h2[77 * 1280], pool[1280];
    fill(h1, sizeof h1, 1);
    fill(h2, sizeof h2, 2);
    fill(pool, sizeof pool, 3);
    sd_shard_rec t;
    memset(&t, 0, sizeof t);
    t.kind = SD_REC_TEXT;
    t.ntensors = 3;
    t.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN1, 2, {77, 768, 0, 0}, 0, 0, h1};
    t.t[1] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN2, 2, {77, 1280, 0, 0}, 0, 0, h2};
    t.t[2] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_POOLED, 1, {1280, 0, 0, 0}, 0, 0, pool};
    CHECK(sd_shard_rec_build(&t, &b, &err) == SD_OK);
    sd_shard_rec p;
    CHECK(sd_shard_rec_parse(b.data, b.len, &p, &err) == SD_OK);
    CHECK(p.kind == SD_REC_TEXT && p.ntensors == 3);
    const sd_shard_tensor *pt = sd_shard_rec_tensor(&p, SD_ROLE_HIDDEN2);
    CHECK(pt && memcmp(pt->data, h2, sizeof h2) == 0);
    pt = sd_shard_rec_tensor(&p, SD_ROLE_POOLED);
    CHECK(pt && memcmp(pt->data, pool, sizeof pool) == 0);
    /* a text record may not carry latent flags; a latent needs its roles */
    t.flags = SD_REC_F_FLIPPED;
    CHECK(sd_shard_rec_build(&t, &b, &err) != SD_OK);
    sd_buf_free(&b);
}

/* Records with a loss mask (version 2, 288-byte header, a fifth tensor
 * entry): both sizes round-trip with every latent layout; a version 1
 * record reads as before (256-byte header); a mask of another size, dtype
 * or a mask without its flag is refused; every bit flip of a masked
 * record is caught. */
static void test_codec_mask(void)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_error err;
    for (int mask = 1; mask <= 2; mask++)
        for (int flip = 0; flip < 2; flip++)
            for (int ms = 0; ms < 2; ms++) {
                if (!CHECK(make_latent_mask(&b, 5, SD_DT_F16, flip, ms, mask, &err) == SD_OK)) {
                    fprintf(stderr, "%s\n", err.msg);
                    continue;
                }
                const uint8_t *v = (const uint8_t *)b.data;
                CHECK(v[4] == 2 && v[5] == 0 && (v[6] | v[7] << 8) == 288);
                sd_shard_rec r;
                if (!CHECK(sd_shard_rec_parse(b.data, b.len, &r, &err) == SD_OK)) {
                    fprintf(stderr, "%s\n", err.msg);
                    continue;
                }
                CHECK(sd_shard_rec_check_payload(&r, &err) == SD_OK && b.len == sd_shard_rec_size(&r));
                CHECK(r.ntensors == (1 + flip) * (1 + ms) + 1 && (r.flags & SD_REC_F_MASK));
                CHECK(r.name_len == 13 && memcmp(r.name, "img/00005.png", 13) == 0 && r.payload_off == 304);
                const sd_shard_tensor *m = sd_shard_rec_tensor(&r, SD_ROLE_MASK);
                uint32_t h = mask == 1 ? 128 : 16, w = mask == 1 ? 192 : 24;
                CHECK(m && m->dtype == SD_DT_F32 && m->shape[0] == h && m->shape[1] == w);
                CHECK(m && ((const float *)m->data)[1] == 12.0f / 255.0f);
            }
    /* without a mask: version 1, as the previous release wrote */
    CHECK(make_latent(&b, 5, SD_DT_F16, 1, 1, &err) == SD_OK);
    CHECK(((const uint8_t *)b.data)[4] == 1 && (((const uint8_t *)b.data)[6] | ((const uint8_t *)b.data)[7] << 8) == 256);
    /* a mask of neither the bucket's nor the latent size, or not fp32, or without the flag */
    static float mk[200 * 200];
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_LATENT;
    r.flags = SD_REC_F_MASK;
    r.bucket_w = r.bucket_h = 64;
    static uint16_t lat[4 * 8 * 8];
    r.ntensors = 2;
    r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_SAMPLE, 3, {4, 8, 8, 0}, 0, 0, lat};
    r.t[1] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_MASK, 2, {64, 64, 0, 0}, 0, 0, mk};
    CHECK(sd_shard_rec_build(&r, &b, &err) == SD_OK);
    r.t[1].shape[0] = 32;
    CHECK(sd_shard_rec_build(&r, &b, &err) == SD_EFORMAT && strstr(err.msg, "neither the bucket"));
    r.t[1].shape[0] = 64;
    r.t[1].dtype = SD_DT_F16;
    CHECK(sd_shard_rec_build(&r, &b, &err) == SD_EFORMAT && strstr(err.msg, "fp32"));
    r.t[1].dtype = SD_DT_F32;
    r.flags = 0;
    CHECK(sd_shard_rec_build(&r, &b, &err) != SD_OK);
    uint8_t *v;
    /* every bit flip of a masked record is caught */
    CHECK(make_latent_mask(&b, 3, SD_DT_F16, 1, 1, 2, &err) == SD_OK);
    size_t len = b.len, missed = 0;
    v = malloc(len);
    for (size_t byte = 0; byte < len; byte++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(v, b.data, len);
            v[byte] ^= (uint8_t)(1 << bit);
            if (sd_shard_rec_parse(v, len, &r, &err) == SD_OK && sd_shard_rec_check_payload(&r, &err) == SD_OK)
                missed++;
        }
    CHECK(missed == 0);
    free(v);
    sd_buf_free(&b);
}

/* Every single-bit flip anywhere in a record, and every truncation, is
 * caught by parse + payload check. */
static void test_codec_damage(void)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_error err;
    CHECK(make_latent(&b, 3, SD_DT_F16, 1, 0, &err) == SD_OK);
    size_t len = b.len, missed = 0;
    uint8_t *v = malloc(len);
    for (size_t byte = 0; byte < len; byte++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(v, b.data, len);
            v[byte] ^= (uint8_t)(1 << bit);
            sd_shard_rec r;
            if (sd_shard_rec_parse(v, len, &r, &err) == SD_OK && sd_shard_rec_check_payload(&r, &err) == SD_OK)
                missed++;
        }
    CHECK(missed == 0);
    for (size_t n = 0; n < len; n++) {
        sd_shard_rec r;
        if (sd_shard_rec_parse(b.data, n, &r, &err) == SD_OK) missed++;
    }
    CHECK(missed == 0);
    /* the version byte alone changed: the header checksum holds for version 1, so a damaged
     * field (a corrupt record), not a newer one */
    memcpy(v, b.data, len);
    v[4] = 3;
    sd_shard_rec r;
    CHECK(sd_shard_rec_parse(v, len, &r, &err) == SD_EFORMAT && strstr(err.msg, "version field is damaged"));
    /* a newer record (its checksum made for version 3): a clear "newer" error */
    uint32_t poff = (uint32_t)v[80] | (uint32_t)v[81] << 8 | (uint32_t)v[82] << 16 | (uint32_t)v[83] << 24;
    uint64_t h = sd_hash64(v + 256, poff - 256, sd_hash64(v, 248, 0));
    for (int i = 0; i < 8; i++) v[248 + i] = (uint8_t)(h >> (8 * i));
    CHECK(sd_shard_rec_parse(v, len, &r, &err) == SD_EUNSUPPORTED && strstr(err.msg, "newer"));
    free(v);
    sd_buf_free(&b);
}

static void key_of(int i, uint8_t key[16])
{
    memset(key, 0, 16);
    snprintf((char *)key, 16, "k%07d", i);
}

/* Write n records in batches of per_batch. */
static int write_range(sd_shard *s, int from, int to, int per_batch)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_error err;
    int ok = 1;
    for (int i = from; ok && i < to; i += per_batch) {
        ok &= sd_shard_begin(s, &err) == SD_OK;
        for (int j = i; ok && j < to && j < i + per_batch; j++) {
            uint8_t key[16];
            key_of(j, key);
            ok &= make_latent(&b, j, SD_DT_F16, j % 2, 0, &err) == SD_OK;
            ok &= sd_shard_put(s, key, 16, b.data, b.len, &err) == SD_OK;
        }
        if (ok) ok &= sd_shard_commit(s, &err) == SD_OK;
        if (!ok) fprintf(stderr, "write_range: %s\n", err.msg);
    }
    sd_buf_free(&b);
    return ok;
}

/* Bucket (w) -> count from the buckets DB. */
static uint64_t bucket_count(sd_shard_txn *t, uint32_t w)
{
    sd_shard_bucket *bk;
    size_t n;
    sd_error err;
    uint64_t c = 0;
    if (sd_shard_buckets(t, &bk, &n, &err)) return UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (bk[i].w == w && bk[i].h == 128) c = bk[i].count;
    free(bk);
    return c;
}

/* The writer and reader APIs on one shard, from a tiny map upward. */
static void test_store(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/a.shard", dir);
    sd_error err;
    sd_shard *s;
    sd_shard_opts o = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, 256 << 10, 0};
    if (!CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    sd_shard *s2;
    CHECK(sd_shard_open(&s2, path, NULL, &err) == SD_EIO && strstr(err.msg, "another process"));
    size_t map0 = sd_shard_map_size(s);
    CHECK(write_range(s, 0, 600, 50));
    CHECK(sd_shard_map_size(s) > map0 * 8); /* 600 x ~2-4 KiB > 2 MiB: grown several times */
    CHECK(sd_shard_meta_set(s, SD_SHARD_META_PRODUCER, "test_shard", &err) == SD_OK);
    char *v;
    CHECK(sd_shard_meta_get(s, SD_SHARD_META_VERSION, &v, &err) == SD_OK && strcmp(v, "1") == 0);
    free(v);
    int found;
    uint8_t key[16];
    key_of(599, key);
    CHECK(sd_shard_exists(s, key, 16, &found, &err) == SD_OK && found);
    key_of(600, key);
    CHECK(sd_shard_exists(s, key, 16, &found, &err) == SD_OK && !found);
    CHECK(sd_shard_name_exists(s, "img/00042.png", 13, &found, &err) == SD_OK && found);
    CHECK(sd_shard_name_exists(s, "img/00600.png", 13, &found, &err) == SD_OK && !found);
    /* a batch sees its own puts; an aborted batch leaves nothing */
    sd_buf b;
    sd_buf_init(&b);
    CHECK(sd_shard_begin(s, &err) == SD_OK);
    CHECK(make_latent(&b, 600, SD_DT_BF16, 0, 1, &err) == SD_OK);
    CHECK(sd_shard_put(s, key, 16, b.data, b.len, &err) == SD_OK);
    CHECK(sd_shard_exists(s, key, 16, &found, &err) == SD_OK && found);
    sd_shard_abort(s);
    CHECK(sd_shard_exists(s, key, 16, &found, &err) == SD_OK && !found);

    /* read back every record byte for byte */
    sd_shard_txn *t;
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK);
    uint64_t n = 0;
    CHECK(sd_shard_count(t, SD_SHARD_DB_LATENTS, &n, &err) == SD_OK && n == 600);
    int bad = 0;
    for (int i = 0; i < 600; i++) {
        const void *val;
        size_t vlen;
        key_of(i, key);
        make_latent(&b, i, SD_DT_F16, i % 2, 0, &err);
        if (sd_shard_get(t, key, 16, &val, &vlen, &err) || vlen != b.len || memcmp(val, b.data, vlen)) bad++;
    }
    CHECK(bad == 0);
    CHECK(bucket_count(t, 64) == 200 && bucket_count(t, 128) == 200 && bucket_count(t, 192) == 200);
    /* the bucket cursor yields exactly that bucket's records */
    sd_shard_cursor *c;
    CHECK(sd_shard_cursor_bucket(t, 128, 128, &c, &err) == SD_OK);
    const void *k, *val;
    size_t klen, vlen;
    int m = 0, wrong = 0;
    while (sd_shard_cursor_next(c, &k, &klen, &val, &vlen, &err) == SD_OK) {
        sd_shard_rec r;
        m++;
        if (!val || sd_shard_rec_parse(val, vlen, &r, &err) || r.bucket_w != 128 || atoi((const char *)k + 1) % 3 != 1)
            wrong++;
    }
    sd_shard_cursor_close(c);
    CHECK(m == 200 && wrong == 0);
    /* seek on the records */
    CHECK(sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, &err) == SD_OK);
    key_of(590, key);
    CHECK(sd_shard_cursor_seek(c, key, 16, &err) == SD_OK);
    m = 0;
    while (sd_shard_cursor_next(c, &k, &klen, &val, &vlen, &err) == SD_OK) m++;
    CHECK(m == 10);
    sd_shard_cursor_close(c);
    sd_shard_read_end(t);

    /* delete 100 (bucket 64: i % 3 == 0 for i < 300), replace one into another bucket */
    CHECK(sd_shard_begin(s, &err) == SD_OK);
    for (int i = 0; i < 300; i += 3) {
        key_of(i, key);
        CHECK(sd_shard_del(s, key, 16, &err) == SD_OK);
    }
    key_of(0, key);
    CHECK(sd_shard_del(s, key, 16, &err) == SD_ENOTFOUND);
    key_of(1, key);
    make_latent(&b, 2, SD_DT_F32, 0, 0, &err); /* bucket 192, name img/00002.png */
    CHECK(sd_shard_put(s, key, 16, b.data, b.len, &err) == SD_OK);
    CHECK(sd_shard_commit(s, &err) == SD_OK);
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK);
    CHECK(sd_shard_count(t, SD_SHARD_DB_LATENTS, &n, &err) == SD_OK && n == 500);
    CHECK(bucket_count(t, 64) == 100 && bucket_count(t, 128) == 199 && bucket_count(t, 192) == 201);
    CHECK(sd_shard_count(t, SD_SHARD_DB_BINDEX, &n, &err) == SD_OK && n == 500);
    CHECK(sd_shard_get_name(t, "img/00003.png", 13, &k, &klen, &err) == SD_ENOTFOUND);
    CHECK(sd_shard_get_name(t, "img/00002.png", 13, &k, &klen, &err) == SD_OK && klen == 16 && memcmp(k, key, 16) == 0);
    sd_shard_read_end(t);
    /* reindex rebuilds the same index */
    CHECK(sd_shard_reindex(s, &err) == SD_OK);
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK);
    CHECK(bucket_count(t, 64) == 100 && bucket_count(t, 128) == 199 && bucket_count(t, 192) == 201);
    CHECK(sd_shard_count(t, SD_SHARD_DB_BINDEX, &n, &err) == SD_OK && n == 500);
    sd_shard_read_end(t);
    /* invalid records are refused */
    b.data[20] ^= 1;
    CHECK(sd_shard_put(s, key, 16, b.data, b.len, &err) == SD_EFORMAT);
    CHECK(sd_shard_close(s, &err) == SD_OK);

    /* a read-only reopen sees everything; a newer format version is refused */
    sd_shard_opts ro = {SD_SHARD_RDONLY, 0, 0};
    CHECK(sd_shard_open(&s, path, &ro, &err) == SD_OK);
    CHECK(sd_shard_meta_get(s, SD_SHARD_META_PRODUCER, &v, &err) == SD_OK && strcmp(v, "test_shard") == 0);
    free(v);
    CHECK(sd_shard_begin(s, &err) == SD_EINVAL);
    sd_shard_close(s, &err);
    CHECK(sd_shard_open(&s, path, NULL, &err) == SD_OK);
    CHECK(sd_shard_meta_set(s, SD_SHARD_META_VERSION, "2", &err) == SD_OK);
    sd_shard_close(s, &err);
    CHECK(sd_shard_open(&s, path, &ro, &err) == SD_EUNSUPPORTED && strstr(err.msg, "newer"));
    CHECK(sd_shard_open(&s, "/nonexistent/x.shard", &ro, &err) == SD_ENOTFOUND);
    snprintf(path, sizeof path, "%s/not_lmdb", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 5000; i++) fputc(i, f);
    fclose(f);
    CHECK(sd_shard_open(&s, path, &ro, &err) == SD_EFORMAT);
    sd_buf_free(&b);
}

/* Damage the index of a closed shard behind the API's back: drop the
 * bindex entries of records 0..9 and the names of records 10..14, add a
 * name for a record that does not exist and a wrong count to a bucket. */
static int break_index(const char *path)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi bindex, names, buckets;
    if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 8) || mdb_env_open(env, path, MDB_NOSUBDIR, 0644)) return -1;
    int rc = mdb_txn_begin(env, NULL, 0, &txn);
    if (!rc) rc = mdb_dbi_open(txn, "bindex", MDB_DUPSORT, &bindex);
    if (!rc) rc = mdb_dbi_open(txn, "names", 0, &names);
    if (!rc) rc = mdb_dbi_open(txn, "buckets", 0, &buckets);
    for (int i = 0; !rc && i < 15; i++) {
        uint8_t key[16], bk[8];
        char name[32];
        key_of(i, key);
        snprintf(name, sizeof name, "img/%05d.png", i);
        sd_shard_bucket_key(64 + 64 * (uint32_t)(i % 3), 128, bk);
        MDB_val k = {8, bk}, d = {16, key}, nk = {strlen(name), name};
        rc = i < 10 ? mdb_del(txn, bindex, &k, &d) : mdb_del(txn, names, &nk, NULL);
    }
    uint8_t ghost[16], bk[8], count[8] = {99};
    key_of(9999, ghost);
    sd_shard_bucket_key(192, 128, bk);
    MDB_val gk = {13, "img/ghost.png"}, gv = {16, ghost}, bkv = {8, bk}, cv = {8, count};
    if (!rc) rc = mdb_put(txn, names, &gk, &gv, 0);
    if (!rc) rc = mdb_put(txn, buckets, &bkv, &cv, 0);
    if (!rc) rc = mdb_txn_commit(txn);
    else mdb_txn_abort(txn);
    mdb_env_close(env);
    return rc ? -1 : 0;
}

/* sd_shard_reindex on a damaged index (sd-verify --repair relies on it to
 * fix index problems without deleting a record): every record is back in
 * its bucket's index, the counts are right, missing names are added and a
 * name without a record is dropped. */
static void test_reindex_broken(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/reindex.shard", dir);
    sd_error err;
    sd_shard *s;
    sd_shard_opts o = {SD_SHARD_CREATE, 0, 0};
    if (!CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK)) return;
    CHECK(write_range(s, 0, 60, 20));
    sd_shard_close(s, &err);
    if (!CHECK(break_index(path) == 0)) return;
    CHECK(sd_shard_open(&s, path, NULL, &err) == SD_OK);
    sd_shard_txn *t;
    uint64_t n = 0;
    int found = 0;
    uint8_t key[16];
    key_of(3, key);
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK);
    CHECK(sd_shard_count(t, SD_SHARD_DB_BINDEX, &n, &err) == SD_OK && n == 50);
    CHECK(sd_shard_index_has(t, 64, 128, key, 16, &found, &err) == SD_OK && !found);
    CHECK(bucket_count(t, 192) == 99);
    sd_shard_read_end(t);
    CHECK(sd_shard_reindex(s, &err) == SD_OK);
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK);
    CHECK(sd_shard_count(t, SD_SHARD_DB_LATENTS, &n, &err) == SD_OK && n == 60);
    CHECK(sd_shard_count(t, SD_SHARD_DB_BINDEX, &n, &err) == SD_OK && n == 60);
    CHECK(sd_shard_count(t, SD_SHARD_DB_NAMES, &n, &err) == SD_OK && n == 60);
    CHECK(bucket_count(t, 64) == 20 && bucket_count(t, 128) == 20 && bucket_count(t, 192) == 20);
    int missing = 0;
    for (int i = 0; i < 60; i++) {
        char name[32];
        const void *k;
        size_t kl;
        snprintf(name, sizeof name, "img/%05d.png", i);
        key_of(i, key);
        if (sd_shard_index_has(t, 64 + 64 * (uint32_t)(i % 3), 128, key, 16, &found, &err) || !found) missing++;
        if (sd_shard_get_name(t, name, strlen(name), &k, &kl, &err) || kl != 16 || memcmp(k, key, 16)) missing++;
    }
    CHECK(missing == 0);
    const void *k;
    size_t kl;
    CHECK(sd_shard_get_name(t, "img/ghost.png", 13, &k, &kl, &err) == SD_ENOTFOUND);
    sd_shard_read_end(t);
    CHECK(sd_shard_close(s, &err) == SD_OK);
}

/* Growth disabled: the put that does not fit fails with a clear error and
 * the earlier commits stay readable. */
static void test_full(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/full.shard", dir);
    sd_error err;
    sd_shard *s;
    sd_shard_opts o = {SD_SHARD_CREATE | SD_SHARD_NOGROW, 256 << 10, 0};
    CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK);
    sd_buf b;
    sd_buf_init(&b);
    int committed = 0, i;
    sd_status st = SD_OK;
    for (i = 0; i < 1000 && !st; i += 10) {
        st = sd_shard_begin(s, &err);
        for (int j = i; !st && j < i + 10; j++) {
            uint8_t key[16];
            key_of(j, key);
            make_latent(&b, j, SD_DT_F32, 1, 0, &err);
            st = sd_shard_put(s, key, 16, b.data, b.len, &err);
        }
        if (!st) st = sd_shard_commit(s, &err);
        if (!st) committed = i + 10;
    }
    CHECK(st == SD_ERANGE && strstr(err.msg, "full") && committed > 0);
    sd_shard_close(s, &err);
    sd_shard_opts ro = {SD_SHARD_RDONLY, 0, 0};
    CHECK(sd_shard_open(&s, path, &ro, &err) == SD_OK);
    sd_shard_txn *t;
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK);
    uint64_t n;
    CHECK(sd_shard_count(t, SD_SHARD_DB_LATENTS, &n, &err) == SD_OK && n == (uint64_t)committed);
    sd_shard_read_end(t);
    sd_shard_close(s, &err);
    sd_buf_free(&b);
}

/* A reader process polls while this process writes and grows the map:
 * every snapshot it sees is complete and valid. */
static void test_concurrent_reader(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/conc.shard", dir);
    sd_error err;
    sd_shard *s;
    sd_shard_opts o = {SD_SHARD_CREATE, 256 << 10, 0};
    CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK);
    CHECK(write_range(s, 0, 10, 10));
    pid_t pid = fork();
    if (pid == 0) {
        sd_shard *r;
        sd_shard_opts ro = {SD_SHARD_RDONLY, 0, 0};
        if (sd_shard_open(&r, path, &ro, &err)) _exit(2);
        uint64_t seen = 0;
        for (int round = 0; round < 100000 && seen < 400; round++) {
            sd_shard_txn *t;
            if (sd_shard_read_begin(r, &t, &err)) _exit(3);
            sd_shard_cursor *c;
            if (sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, &err)) _exit(4);
            const void *k, *v;
            size_t kl, vl;
            uint64_t m = 0;
            while (sd_shard_cursor_next(c, &k, &kl, &v, &vl, &err) == SD_OK) {
                sd_shard_rec rec;
                if (sd_shard_rec_parse(v, vl, &rec, &err) || sd_shard_rec_check_payload(&rec, &err)) _exit(5);
                m++;
            }
            sd_shard_cursor_close(c);
            uint64_t n;
            if (sd_shard_count(t, SD_SHARD_DB_BINDEX, &n, &err) || n != m || m % 10) _exit(6);
            seen = m;
            sd_shard_read_end(t);
        }
        sd_shard_close(r, &err);
        _exit(seen == 400 ? 0 : 7);
    }
    for (int i = 10; i < 400; i += 10) {
        CHECK(write_range(s, i, i + 10, 10));
        usleep(2000);
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    sd_shard_close(s, &err);
}

/* Whether another process holds an fcntl lock on byte 0 of path (LMDB's
 * lock on its -lock file while an environment is open), seen from a child
 * process: the caller's own locks are invisible to itself. 1 yes, 0 no,
 * -1 the child failed. */
static int locked_elsewhere(const char *path)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(path, O_RDONLY);
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fd < 0 || fcntl(fd, F_GETLK, &fl) != 0) _exit(2);
        _exit(fl.l_type != F_UNLCK);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) > 1) return -1;
    return WEXITSTATUS(status);
}

/* A rerun tells a killed run's temporary output from one a live process is
 * writing (sd_outfile_held): a shard another process writes is held (its
 * writer's flock), so is this process's own writer and sd_outfile's temp
 * file until committed, and the same files once their writers are gone
 * are leftovers. The probe must not drop this process's LMDB lock (closing
 * any descriptor of the -lock file would): a child still sees it after. */
static void test_leftover_holder(void)
{
    char path[256], lock[300], tmp[300];
    snprintf(path, sizeof path, "%s/out.lmdb.partial-Ab12Cd", dir);
    snprintf(lock, sizeof lock, "%s-lock", path);
    int ready[2], done[2];
    CHECK(pipe(ready) == 0 && pipe(done) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        sd_error e;
        sd_shard *w;
        sd_shard_opts o = {SD_SHARD_CREATE, 256 << 10, 0};
        char c = 1;
        if (sd_shard_open(&w, path, &o, &e) || write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) _exit(2);
        _exit(sd_shard_close(w, &e) ? 3 : 0);
    }
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    CHECK(sd_outfile_held(path) == 1);
    CHECK(write(done[1], &c, 1) == 1);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(sd_outfile_held(path) == 0); /* the file and its -lock stay, no process holds them */
    for (int i = 0; i < 2; i++) close(ready[i]), close(done[i]);

    sd_error err;
    sd_shard *s;
    CHECK(sd_shard_open(&s, path, NULL, &err) == SD_OK);
    CHECK(locked_elsewhere(lock) == 1);
    CHECK(sd_outfile_held(path) == 1);
    CHECK(locked_elsewhere(lock) == 1); /* the probe left LMDB's lock in place */
    sd_shard_close(s, &err);
    CHECK(sd_outfile_held(path) == 0 && locked_elsewhere(lock) == 0);

    snprintf(tmp, sizeof tmp, "%s/out.jsonl", dir);
    sd_outfile f;
    CHECK(sd_outfile_open(&f, tmp, &err) == SD_OK);
    CHECK(sd_outfile_held(f.tmp) == 1);
    char held[300];
    snprintf(held, sizeof held, "%s", f.tmp);
    fputs("x\n", f.f);
    CHECK(sd_outfile_commit(&f, &err) == SD_OK);
    CHECK(access(held, F_OK) != 0 && sd_outfile_held(tmp) == 0);
    CHECK(sd_outfile_held(held) == 0); /* gone */
}

/* LMDB's own view of a closed shard, read through LMDB on the whole file:
 * page size, last page, and which pages up to it are on the freelist. */
typedef struct {
    size_t psize, last;
    unsigned char *is_free;
} lmdb_pages;

static int lmdb_pages_read(const char *path, lmdb_pages *p)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_cursor *c;
    MDB_envinfo info;
    MDB_stat ms;
    memset(p, 0, sizeof *p);
    if (mdb_env_create(&env)) return -1;
    int rc = mdb_env_set_maxdbs(env, 8);
    if (!rc) rc = mdb_env_open(env, path, MDB_NOSUBDIR | MDB_RDONLY, 0644);
    if (!rc) rc = mdb_env_info(env, &info) || mdb_env_stat(env, &ms);
    if (!rc) {
        p->psize = ms.ms_psize;
        p->last = info.me_last_pgno;
        p->is_free = calloc(p->last + 1, 1);
        rc = !p->is_free || mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
    }
    if (!rc && !(rc = mdb_cursor_open(txn, 0, &c))) { /* dbi 0: the freelist, txn id -> page list */
        MDB_val k, v;
        int r;
        for (r = mdb_cursor_get(c, &k, &v, MDB_FIRST); !r; r = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
            size_t n, pg;
            memcpy(&n, v.mv_data, sizeof n);
            for (size_t i = 1; i <= n && (i + 1) * sizeof pg <= v.mv_size; i++) {
                memcpy(&pg, (const char *)v.mv_data + i * sizeof pg, sizeof pg);
                if (pg <= p->last) p->is_free[pg] = 1;
            }
        }
        rc = r != MDB_NOTFOUND;
        mdb_cursor_close(c);
    }
    if (p->is_free && !rc) mdb_txn_abort(txn);
    mdb_env_close(env);
    return rc ? -1 : 0;
}

/* Copy the first len bytes of src to dst (a fresh file). */
static int copy_prefix(const char *src, const char *dst, long len)
{
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int ok = in && out;
    char buf[8192];
    for (long done = 0; ok && done < len;) {
        size_t want = (size_t)(len - done) < sizeof buf ? (size_t)(len - done) : sizeof buf;
        size_t got = fread(buf, 1, want, in);
        ok = got > 0 && fwrite(buf, 1, got, out) == got;
        done += (long)got;
    }
    if (in) fclose(in);
    if (out && fclose(out)) ok = 0;
    return ok ? 0 : -1;
}

/* The copy of a shard cut at len bytes must open exactly when every page
 * at or past the cut is free in LMDB's freelist, and a refusal must name the
 * copy and its size. Returns 1 when it opened, 0 when refused, -1 if wrong. */
static int cut_once(const char *path, const lmdb_pages *lp, long len)
{
    char cut[300], want[64];
    snprintf(cut, sizeof cut, "%s.cut", path);
    snprintf(want, sizeof want, "the file has %ld bytes", len);
    int all_free = 1;
    for (size_t pg = (size_t)len / lp->psize; pg <= lp->last; pg++) all_free &= lp->is_free[pg];
    if (copy_prefix(path, cut, len)) return -1;
    sd_shard *s;
    sd_error err;
    sd_shard_opts ro = {SD_SHARD_RDONLY, 0, 0};
    sd_status st = sd_shard_open(&s, cut, &ro, &err);
    if (st == SD_OK) sd_shard_close(s, &err);
    int ok = all_free ? st == SD_OK
                      : st == SD_ETRUNC && strstr(err.msg, cut) && strstr(err.msg, "truncated shard") &&
                            strstr(err.msg, want);
    if (!ok)
        fprintf(stderr, "cut at %ld bytes (missing pages all free: %d): status %d, %s\n", len, all_free, (int)st,
                st ? err.msg : "opened");
    return ok ? st == SD_OK : -1;
}

/* Cut copies of a closed shard at whole and partial pages, from its end down
 * `down` pages, at half its size and after 3 pages (cut_once); counts the
 * copies that opened and those refused. */
static void cut_sweep(const char *path, int down, int *opened, int *refused)
{
    lmdb_pages lp;
    struct stat sb;
    if (!CHECK(lmdb_pages_read(path, &lp) == 0 && stat(path, &sb) == 0)) return;
    long end = (long)sb.st_size, psize = (long)lp.psize, wrong = 0;
    for (long pg = (end + psize - 1) / psize, i = 0; i < down && pg > 2; pg--, i++) {
        long lens[2] = {pg * psize < end ? pg * psize : end, (pg - 1) * psize + 100}; /* page pg - 1 partly there */
        for (int j = 0; j < 2; j++) {
            int r = lens[j] <= end ? cut_once(path, &lp, lens[j]) : 1;
            wrong += r < 0;
            *opened += r == 1;
            *refused += r == 0;
        }
    }
    long deep[2] = {end / 2, 3 * psize}; /* past page 2 lie the trees' roots */
    for (int j = 0; j < 2; j++) {
        int r = cut_once(path, &lp, deep[j]);
        wrong += r < 0;
        *opened += r == 1;
        *refused += r == 0;
    }
    CHECK(wrong == 0);
    free(lp.is_free);
}

/* A shard cut short (a copy interrupted, a full disk): every tool crashed with
 * SIGBUS on the first page past the end; now sd_shard_open refuses it, as a
 * reader and as a writer, naming the file and the sizes. */
static void test_truncated(void)
{
    char path[256], cut[300];
    snprintf(path, sizeof path, "%s/trunc.shard", dir);
    snprintf(cut, sizeof cut, "%s.half", path);
    sd_error err;
    sd_shard *s;
    sd_shard_opts o = {SD_SHARD_CREATE, 0, 0}, ro = {SD_SHARD_RDONLY, 0, 0};
    if (!CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK)) return;
    CHECK(write_range(s, 0, 60, 20));
    CHECK(sd_shard_close(s, &err) == SD_OK);
    struct stat sb;
    if (!CHECK(stat(path, &sb) == 0 && copy_prefix(path, cut, (long)sb.st_size / 2) == 0)) return;
    char want[400];
    snprintf(want, sizeof want, "%s: truncated shard: the file has %ld bytes, LMDB's last used page ends at %ld",
             cut, (long)sb.st_size / 2, (long)sb.st_size);
    CHECK(sd_shard_open(&s, cut, &ro, &err) == SD_ETRUNC && strstr(err.msg, want));
    CHECK(sd_shard_open(&s, cut, &o, &err) == SD_ETRUNC && strstr(err.msg, want));
    /* one page more than LMDB uses (a trailing page a killed writer left) is fine */
    FILE *f = fopen(path, "ab");
    static const char zero[4096];
    CHECK(f && fwrite(zero, 1, sizeof zero, f) == sizeof zero && fclose(f) == 0);
    CHECK(sd_shard_open(&s, path, &ro, &err) == SD_OK);
    sd_shard_close(s, &err);
    CHECK(truncate(path, sb.st_size) == 0);
    int opened = 0, refused = 0;
    cut_sweep(path, 12, &opened, &refused);
    CHECK(refused > 0);
}

/* Delete the 20 values put under pad%03d and let two commits pass, so that
 * the next write transaction takes pages from the freelist. */
static int make_freelist(MDB_env *env, MDB_dbi dbi, const char *big)
{
    MDB_txn *txn;
    int rc = 0;
    for (int round = 0; !rc && round < 4; round++) {
        rc = mdb_txn_begin(env, NULL, 0, &txn);
        for (int i = 0; !rc && i < (round < 2 ? 20 : 1); i++) {
            char k[16];
            snprintf(k, sizeof k, round < 2 ? "pad%03d" : "tick", i);
            MDB_val kv = {strlen(k), k}, v = {9000, (void *)big};
            rc = round == 1 ? mdb_del(txn, dbi, &kv, NULL) : mdb_put(txn, dbi, &kv, &v, 0);
        }
        if (!rc) rc = mdb_txn_commit(txn);
        else mdb_txn_abort(txn);
    }
    return rc;
}

/* LMDB itself leaves a file shorter than its last page: a transaction that
 * takes pages from the freelist, then a new overflow run at the end that it
 * frees again, writes that run nowhere. Such a shard is sound and opens. */
static void test_free_tail(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/freetail.shard", dir);
    sd_error err;
    sd_shard *s;
    sd_shard_opts o = {SD_SHARD_CREATE, 0, 0}, ro = {SD_SHARD_RDONLY, 0, 0};
    if (!CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK)) return;
    CHECK(write_range(s, 0, 30, 10));
    CHECK(sd_shard_close(s, &err) == SD_OK);
    static char big[400000];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi meta;
    int rc = mdb_env_create(&env);
    if (!rc) rc = mdb_env_set_maxdbs(env, 8);
    if (!rc) rc = mdb_env_open(env, path, MDB_NOSUBDIR, 0644);
    if (!rc) rc = mdb_txn_begin(env, NULL, 0, &txn);
    if (!rc) rc = mdb_dbi_open(txn, "meta", 0, &meta);
    if (!rc) rc = mdb_txn_commit(txn);
    if (!rc) rc = make_freelist(env, meta, big);
    if (!rc) rc = mdb_txn_begin(env, NULL, 0, &txn);
    for (int i = 0; !rc && i < 20; i++) {
        char k[16];
        snprintf(k, sizeof k, "fill%02d", i);
        MDB_val kv = {strlen(k), k}, v = {100, big};
        rc = mdb_put(txn, meta, &kv, &v, 0);
    }
    MDB_val bk = {3, "big"}, bv = {sizeof big, big};
    if (!rc) rc = mdb_put(txn, meta, &bk, &bv, 0);
    if (!rc) rc = mdb_del(txn, meta, &bk, NULL);
    if (!rc) rc = mdb_txn_commit(txn);
    mdb_env_close(env);
    lmdb_pages lp;
    struct stat sb;
    if (!CHECK(rc == 0 && lmdb_pages_read(path, &lp) == 0 && stat(path, &sb) == 0)) return;
    CHECK((size_t)sb.st_size < (lp.last + 1) * lp.psize); /* the premise: LMDB left it short */
    free(lp.is_free);
    int opened = 0, refused = 0;
    cut_sweep(path, 8, &opened, &refused);
    CHECK(opened > 0 && refused > 0);
    if (!CHECK(sd_shard_open(&s, path, &ro, &err) == SD_OK)) return;
    sd_shard_txn *t;
    uint64_t n = 0;
    CHECK(sd_shard_read_begin(s, &t, &err) == SD_OK && sd_shard_count(t, SD_SHARD_DB_LATENTS, &n, &err) == SD_OK);
    CHECK(n == 30);
    sd_shard_read_end(t);
    sd_shard_close(s, &err);
    if (!CHECK(sd_shard_open(&s, path, &o, &err) == SD_OK)) return;
    CHECK(write_range(s, 30, 40, 10));
    CHECK(sd_shard_close(s, &err) == SD_OK);
}

/* The empty_text meta's form of a text key: round trip, and anything but
 * 32 hex digits refused. */
static void test_text_key_hex(void)
{
    uint8_t k[16], back[16];
    char hex[33];
    for (int i = 0; i < 16; i++) k[i] = (uint8_t)(i * 17 + 3);
    sd_shard_text_key_hex(k, hex);
    CHECK(strcmp(hex, "031425364758697a8b9cadbecfe0f102") == 0);
    CHECK(sd_shard_text_key_parse(hex, back) && !memcmp(k, back, 16));
    CHECK(sd_shard_text_key_parse("031425364758697A8B9CADBECFE0F102", back) && !memcmp(k, back, 16));
    CHECK(!sd_shard_text_key_parse("031425364758697a 8b9cadbecfe0f10", back)); /* a space */
    CHECK(!sd_shard_text_key_parse("031425364758697a8b9cadbecfe0f10", back));  /* 31 digits */
    CHECK(!sd_shard_text_key_parse("031425364758697a8b9cadbecfe0f1g2", back));
}

/* A file that is not a shard (a JSONL stream given by mistake, an empty
 * file) is refused by name before LMDB opens it, as reader, writer and
 * creator alike, and no PATH-lock is left beside it. */
static void test_not_a_shard(void)
{
    char path[256], lock[300], empty[256];
    snprintf(path, sizeof path, "%s/meta.jsonl", dir);
    snprintf(lock, sizeof lock, "%s-lock", path);
    snprintf(empty, sizeof empty, "%s/empty.shard", dir);
    FILE *f = fopen(path, "w");
    if (!CHECK(f != NULL)) return;
    for (int i = 0; i < 200; i++) fprintf(f, "{\"key\": \"img%03d\", \"caption\": \"a photo\"}\n", i);
    fclose(f);
    f = fopen(empty, "w");
    if (!CHECK(f != NULL)) return;
    fclose(f);
    sd_shard_opts modes[3] = {{SD_SHARD_RDONLY, 0, 0}, {0, 0, 0}, {SD_SHARD_CREATE, 0, 0}};
    sd_shard *s;
    sd_error err;
    for (int m = 0; m < 3; m++) {
        CHECK(sd_shard_open(&s, path, &modes[m], &err) == SD_EFORMAT && strstr(err.msg, "meta.jsonl: not an LMDB shard"));
        CHECK(access(lock, F_OK) != 0);
    }
    CHECK(sd_shard_open(&s, empty, &modes[0], &err) == SD_EFORMAT && strstr(err.msg, "empty.shard: empty file, not a shard"));
    /* a FIFO (sd-latents -o by mistake) is no shard either, for any mode */
    char fifo[256], fifo_lock[300];
    snprintf(fifo, sizeof fifo, "%s/a.fifo", dir);
    snprintf(fifo_lock, sizeof fifo_lock, "%s-lock", fifo);
    if (CHECK(mkfifo(fifo, 0644) == 0))
        for (int m = 0; m < 3; m++) {
            CHECK(sd_shard_open(&s, fifo, &modes[m], &err) == SD_EFORMAT && strstr(err.msg, "not a regular file"));
            CHECK(access(fifo_lock, F_OK) != 0);
        }
    /* an empty file to create into (mkstemp's) becomes a shard */
    if (CHECK(sd_shard_open(&s, empty, &modes[2], &err) == SD_OK)) CHECK(sd_shard_close(s, &err) == SD_OK);
    if (CHECK(sd_shard_open(&s, empty, &modes[0], &err) == SD_OK)) sd_shard_close(s, &err);
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    test_not_a_shard();
    test_text_key_hex();
    test_codec_roundtrip();
    test_codec_damage();
    test_codec_mask();
    test_store();
    test_reindex_broken();
    test_full();
    test_concurrent_reader();
    test_leftover_holder();
    test_truncated();
    test_free_tail();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cleanup failed\n");
    return check_done("test_shard");
}
