/* Test helper for the shard fault and corruption tests (driven by
 * e2e_shard.py and e2e_pack.py):
 *   write SHARD N [BATCH] [flags]  write records rec000000..N-1 with resume
 *                                  (names already present are skipped),
 *                                  committing every BATCH; flags: nosync,
 *                                  nogrow, map=BYTES, slow (sleep per batch),
 *                                  keyseed=K (other record keys for the same
 *                                  names), dupnames (no resume: store a name
 *                                  again under this run's key), notext (no
 *                                  text embeddings, no references)
 *   emptytext SHARD ENCODER        store the empty caption's embedding
 *                                  unreferenced and name it in meta empty_text,
 *                                  with text_encoder ENCODER (as sd-latents
 *                                  --text does); prints its hex key
 *   meta SHARD KEY VALUE           set one meta entry
 *   mask SHARD NAME VALUE          rewrite NAME's record with a loss mask of
 *                                  the latent size, every value VALUE
 *   misname SHARD NAME TARGET      point the names entry NAME at the record
 *                                  the name TARGET leads to, bypassing the API
 *   newver SHARD NAME [damaged|inplace]  store a copy of NAME's record under the key
 *                                  "v2-NAME" with format version 3 (newer than any
 *                                  this sdtk reads) and its header
 *                                  checksum made for it (a record a newer sdtk
 *                                  wrote), or with damaged, the checksum left as
 *                                  it was (a damaged version field), or with
 *                                  inplace, as NAME's own record (its indexes
 *                                  left leading to it); prints "latents hexkey"
 *   corrupt SHARD COUNT SEED [text|indexed] damage COUNT distinct records
 *                                  through LMDB (bit flips in header or payload,
 *                                  truncation, extension; with "text" only
 *                                  payload bit flips of text embeddings; with
 *                                  "indexed" only latents the names index leads
 *                                  to); prints "db hexkey"
 *                                  per record and "ref hexkey" for each latent
 *                                  record that references a damaged text
 *   unindex SHARD DB COUNT         delete COUNT entries of the bindex or names
 *                                  database (spread over it), bypassing the
 *                                  API; prints "latents hexkey" of each
 *                                  record that lost its entry
 *   locate SHARD                   print "offset length hexkey" of each live
 *                                  latent value in the file
 * Record i has bucket (64 + 64*(i%3)) x 64, original size (bucket_w*2 + 30)
 * x 128 and the centre crop sdtk cuts for it, [7, 0, bucket_w + 7, 64].
 * Exit status 0 on success, 3 with a message on stderr on failure. */
#include <lmdb.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hash.h"
#include "shard.h"

/* 16-byte content key of a name (two seeded XXH3 halves; seed 0 is the
 * default, another seed gives other keys for the same names). */
static void key16(const char *s, uint64_t seed, uint8_t out[16])
{
    uint64_t a = sd_hash64(s, strlen(s), 2 * seed + 1), b = sd_hash64(s, strlen(s), 2 * seed + 2);
    memcpy(out, &a, 8);
    memcpy(out + 8, &b, 8);
}

static void fill16(uint16_t *v, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) v[i] = (uint16_t)(0x3c00 ^ ((seed * 31 + i * 7) & 0x3ff)); /* finite fp16 */
}

/* The text-embedding record of caption c (tiny SDXL-shaped tensors). */
static sd_status put_text(sd_shard *s, int c, uint8_t key[16], sd_buf *b, sd_error *err)
{
    char cap[32];
    snprintf(cap, sizeof cap, "caption%d", c);
    key16(cap, 0, key);
    int found;
    sd_status st = sd_shard_text_exists(s, key, &found, err);
    if (st || found) return st;
    static uint16_t h1[4 * 8], h2[4 * 12], pool[12];
    fill16(h1, 32, (uint32_t)c);
    fill16(h2, 48, (uint32_t)c + 1);
    fill16(pool, 12, (uint32_t)c + 2);
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_TEXT;
    r.ntensors = 3;
    r.t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN1, 2, {4, 8, 0, 0}, 0, 0, h1};
    r.t[1] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN2, 2, {4, 12, 0, 0}, 0, 0, h2};
    r.t[2] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_POOLED, 1, {12, 0, 0, 0}, 0, 0, pool};
    if ((st = sd_shard_rec_build(&r, b, err))) return st;
    return sd_shard_put_text(s, key, b->data, b->len, err);
}

/* Record i: bucket (64 + 64*(i%3)) x 64, fp16 sample, flipped for odd i,
 * keyed by its name hashed with keyseed; with dupnames a name already
 * present is stored again. */
static sd_status put_latent(sd_shard *s, int i, uint64_t keyseed, int dupnames, int notext, sd_buf *b,
                            sd_error *err)
{
    char name[32];
    snprintf(name, sizeof name, "rec%06d", i);
    int found = 0;
    sd_status st = dupnames ? SD_OK : sd_shard_name_exists(s, name, strlen(name), &found, err);
    if (st || found) return st;
    uint8_t tkey[16] = {0}, key[16];
    if (!notext && (st = put_text(s, i % 5, tkey, b, err))) return st;
    static uint16_t lat[2][4 * 8 * 24];
    sd_shard_rec r;
    memset(&r, 0, sizeof r);
    r.kind = SD_REC_LATENT;
    r.flags = i % 2 ? SD_REC_F_FLIPPED : 0;
    r.bucket_w = 64 + 64 * (uint32_t)(i % 3);
    r.bucket_h = 64;
    r.orig_w = r.bucket_w * 2 + 30; /* resized to bucket_w + 15 x 64, then cut in the centre */
    r.orig_h = 128;
    r.crop[0] = 7;
    r.crop[2] = r.bucket_w + 7;
    r.crop[3] = 64;
    memcpy(r.text_ref, tkey, 16);
    r.name = name;
    r.name_len = strlen(name);
    r.ntensors = 1 + i % 2;
    for (int t = 0; t < r.ntensors; t++) {
        r.t[t] = (sd_shard_tensor){SD_DT_F16, (uint8_t)(t ? SD_ROLE_SAMPLE_FLIP : SD_ROLE_SAMPLE), 3,
                                   {4, 8, r.bucket_w / 8, 0}, 0, 0, lat[t]};
        fill16(lat[t], 4 * 8 * r.bucket_w / 8, (uint32_t)(i * 2 + t));
    }
    if ((st = sd_shard_rec_build(&r, b, err))) return st;
    key16(name, keyseed, key);
    return sd_shard_put(s, key, 16, b->data, b->len, err);
}

static int cmd_write(int argc, char **argv)
{
    int n = atoi(argv[3]), batch = argc > 4 ? atoi(argv[4]) : 16, slow = 0, dupnames = 0, notext = 0;
    uint64_t keyseed = 0;
    sd_shard_opts o = {SD_SHARD_CREATE, 0, 0};
    for (int a = 5; a < argc; a++) {
        if (!strcmp(argv[a], "nosync")) o.flags |= SD_SHARD_NOSYNC;
        else if (!strcmp(argv[a], "nogrow")) o.flags |= SD_SHARD_NOGROW;
        else if (!strcmp(argv[a], "slow")) slow = 1;
        else if (!strcmp(argv[a], "dupnames")) dupnames = 1;
        else if (!strcmp(argv[a], "notext")) notext = 1;
        else if (!strncmp(argv[a], "map=", 4)) o.map_size = (size_t)atol(argv[a] + 4);
        else if (!strncmp(argv[a], "keyseed=", 8)) keyseed = (uint64_t)atol(argv[a] + 8);
    }
    sd_error err;
    sd_shard *s;
    sd_status st = sd_shard_open(&s, argv[2], &o, &err);
    sd_buf b;
    sd_buf_init(&b);
    for (int i = 0; !st && i < n; i += batch) {
        st = sd_shard_begin(s, &err);
        for (int j = i; !st && j < n && j < i + batch; j++) st = put_latent(s, j, keyseed, dupnames, notext, &b, &err);
        if (!st) st = sd_shard_commit(s, &err);
        if (slow) usleep(1000);
    }
    sd_buf_free(&b);
    if (st) {
        fprintf(stderr, "shard_writer: %s\n", err.msg);
        if (s) sd_shard_close(s, &err);
        return 3;
    }
    return sd_shard_close(s, &err) ? 3 : 0;
}

static void hex(const void *k, size_t n)
{
    for (size_t i = 0; i < n; i++) printf("%02x", ((const uint8_t *)k)[i]);
}

/* Raw LMDB access, bypassing the shard API's validation. */
static int raw_open(const char *path, unsigned flags, MDB_env **env, MDB_txn **txn, MDB_dbi *lat, MDB_dbi *text)
{
    if (mdb_env_create(env) || mdb_env_set_maxdbs(*env, 8) ||
        mdb_env_open(*env, path, MDB_NOSUBDIR | MDB_NOTLS | flags, 0644) ||
        mdb_txn_begin(*env, NULL, flags & MDB_RDONLY, txn) || mdb_dbi_open(*txn, "latents", 0, lat) ||
        mdb_dbi_open(*txn, "text", 0, text))
        return -1;
    return 0;
}

static uint64_t rng_state;
static uint64_t rnd(uint64_t n)
{
    rng_state = sd_mix64(rng_state + 0x9E3779B97F4A7C15ull);
    return n ? rng_state % n : 0;
}

/* Print "ref hexkey" for every latent record whose header references the
 * text key tkey (bytes 64..79 of the value). */
static void print_refs(MDB_txn *txn, MDB_dbi lat, const uint8_t tkey[16])
{
    MDB_cursor *c;
    MDB_val k, v;
    mdb_cursor_open(txn, lat, &c);
    while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0)
        if (v.mv_size >= 80 && memcmp((const uint8_t *)v.mv_data + 64, tkey, 16) == 0) {
            printf("ref ");
            hex(k.mv_data, k.mv_size);
            printf("\n");
        }
    mdb_cursor_close(c);
}

static int cmd_corrupt(int argc, char **argv)
{
    int count = atoi(argv[3]), text_only = argc > 5 && !strcmp(argv[5], "text");
    int indexed = argc > 5 && !strcmp(argv[5], "indexed"); /* only latents the names index leads to */
    rng_state = (uint64_t)atol(argv[4]);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi[2];
    if (raw_open(argv[2], 0, &env, &txn, &dbi[0], &dbi[1])) {
        fprintf(stderr, "shard_writer: cannot open %s\n", argv[2]);
        return 3;
    }
    /* all keys of both databases; mostly latents */
    size_t nk[2] = {0, 0};
    uint8_t *keys[2] = {NULL, NULL};
    MDB_dbi names;
    if (indexed && mdb_dbi_open(txn, "names", 0, &names)) return 3;
    for (int d = 0; d < 2; d++) {
        MDB_cursor *c;
        MDB_val k, v;
        int by_name = indexed && d == 0;
        mdb_cursor_open(txn, by_name ? names : dbi[d], &c);
        while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0) {
            keys[d] = realloc(keys[d], (nk[d] + 1) * 16);
            memcpy(keys[d] + 16 * nk[d]++, by_name ? v.mv_data : k.mv_data, 16);
        }
        mdb_cursor_close(c);
    }
    uint8_t *texts = malloc(16 * (size_t)(count > 0 ? count : 1));
    int ntexts = 0;
    for (int done = 0; done < count && nk[text_only];) {
        int d = text_only ? 1 : !indexed && nk[1] > 1 && rnd(10) == 0 ? 1 : 0;
        size_t pick = (size_t)rnd(nk[d]);
        uint8_t key[16];
        memcpy(key, keys[d] + 16 * pick, 16);
        memmove(keys[d] + 16 * pick, keys[d] + 16 * (pick + 1), 16 * (nk[d] - pick - 1)); /* each record once */
        nk[d]--;
        MDB_val k = {16, key}, v;
        if (mdb_get(txn, dbi[d], &k, &v)) continue;
        size_t len = v.mv_size, newlen = len;
        uint8_t *buf = malloc(len + 64);
        memcpy(buf, v.mv_data, len);
        int how = text_only ? 1 : (int)rnd(4);
        if (how == 0) buf[rnd(256 + 16)] ^= (uint8_t)(1u << rnd(8)); /* header or name */
        else if (how == 1) {
            size_t at = 256 + 16 + rnd(len - 256 - 16); /* payload (names here are < 16 bytes) */
            buf[at] ^= (uint8_t)(1u << rnd(8));
        } else if (how == 2) newlen = (size_t)rnd(len); /* truncation */
        else {
            newlen = len + 1 + (size_t)rnd(63); /* extension */
            for (size_t i = len; i < newlen; i++) buf[i] = (uint8_t)rnd(256);
        }
        MDB_val nv = {newlen ? newlen : 1, buf};
        if (mdb_put(txn, dbi[d], &k, &nv, 0)) {
            fprintf(stderr, "shard_writer: put failed\n");
            return 3;
        }
        free(buf);
        printf("%s ", d ? "text" : "latents");
        hex(key, 16);
        printf("\n");
        if (d) memcpy(texts + 16 * ntexts++, key, 16);
        done++;
    }
    for (int i = 0; i < ntexts; i++) print_refs(txn, dbi[0], texts + 16 * i);
    free(texts);
    int rc = mdb_txn_commit(txn);
    mdb_env_close(env);
    free(keys[0]);
    free(keys[1]);
    return rc ? 3 : 0;
}

/* Delete count entries of bindex or names, spread over the database,
 * without touching the records or the bucket counts: a damaged index. */
static int cmd_unindex(char **argv)
{
    int bindex = !strcmp(argv[3], "bindex"), count = atoi(argv[4]);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi lat, text, db;
    MDB_stat ms;
    if (raw_open(argv[2], 0, &env, &txn, &lat, &text) ||
        mdb_dbi_open(txn, bindex ? "bindex" : "names", bindex ? MDB_DUPSORT : 0, &db) || mdb_stat(txn, db, &ms)) {
        fprintf(stderr, "shard_writer: cannot open %s\n", argv[2]);
        return 3;
    }
    size_t every = count > 0 && ms.ms_entries > (size_t)count ? ms.ms_entries / (size_t)count : 1, i = 0;
    /* pick first, delete after: a cursor walk that deletes is easy to get wrong */
    uint8_t (*pick)[2][SD_SHARD_MAX_KEY + 1] = calloc((size_t)(count > 0 ? count : 1), sizeof *pick);
    size_t (*len)[2] = calloc((size_t)(count > 0 ? count : 1), sizeof *len);
    int n = 0, rc = 0;
    MDB_cursor *c;
    MDB_val k, v;
    mdb_cursor_open(txn, db, &c);
    while (n < count && mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0)
        if (i++ % every == 0 && k.mv_size <= SD_SHARD_MAX_KEY && v.mv_size <= SD_SHARD_MAX_KEY) {
            memcpy(pick[n][0], k.mv_data, len[n][0] = k.mv_size);
            memcpy(pick[n][1], v.mv_data, len[n][1] = v.mv_size);
            n++;
        }
    mdb_cursor_close(c);
    for (int j = 0; !rc && j < n; j++) {
        MDB_val dk = {len[j][0], pick[j][0]}, dv = {len[j][1], pick[j][1]};
        rc = mdb_del(txn, db, &dk, bindex ? &dv : NULL);
        printf("latents ");
        hex(pick[j][1], len[j][1]);
        printf("\n");
    }
    free(pick);
    free(len);
    if (!rc) rc = mdb_txn_commit(txn);
    mdb_env_close(env);
    return rc || n < count ? 3 : 0;
}

static int cmd_locate(char **argv)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi lat, text;
    if (raw_open(argv[2], MDB_RDONLY, &env, &txn, &lat, &text)) {
        fprintf(stderr, "shard_writer: cannot open %s\n", argv[2]);
        return 3;
    }
    /* LMDB does not say where it mapped the file: /proc/self/maps does */
    char real[4096], line[4600];
    const char *base = NULL;
    if (!realpath(argv[2], real)) return 3;
    FILE *m = fopen("/proc/self/maps", "r");
    while (m && fgets(line, sizeof line, m)) {
        line[strcspn(line, "\n")] = 0;
        size_t ll = strlen(line), rl = strlen(real);
        unsigned long lo, off;
        if (ll > rl && strcmp(line + ll - rl, real) == 0 && sscanf(line, "%lx-%*x %*s %lx", &lo, &off) == 2 && off == 0) {
            base = (const char *)lo;
            break;
        }
    }
    if (m) fclose(m);
    if (!base) {
        fprintf(stderr, "shard_writer: mapping of %s not found\n", real);
        return 3;
    }
    MDB_cursor *c;
    MDB_val k, v;
    mdb_cursor_open(txn, lat, &c);
    while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0) {
        printf("%ld %zu ", (long)((const char *)v.mv_data - base), v.mv_size);
        hex(k.mv_data, k.mv_size);
        printf("\n");
    }
    mdb_cursor_close(c);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return 0;
}

/* The empty caption's embedding, unreferenced, named by meta empty_text. */
static int cmd_emptytext(char **argv)
{
    sd_error err;
    sd_shard *s;
    sd_buf b;
    sd_buf_init(&b);
    uint8_t key[16];
    char hex[33];
    sd_status st = sd_shard_open(&s, argv[2], NULL, &err);
    if (st) {
        fprintf(stderr, "shard_writer: %s\n", err.msg);
        return 3;
    }
    st = put_text(s, -1, key, &b, &err); /* "caption-1": a caption no record has */
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    if (!st) st = sd_shard_meta_set(s, "empty_text", hex, &err);
    if (!st) st = sd_shard_meta_set(s, "text_encoder", argv[3], &err);
    sd_buf_free(&b);
    if (st) fprintf(stderr, "shard_writer: %s\n", err.msg);
    if (!st) printf("%s\n", hex);
    return sd_shard_close(s, &err) || st ? 3 : 0;
}

static int cmd_meta(char **argv)
{
    sd_error err;
    sd_shard *s = NULL;
    sd_status st = sd_shard_open(&s, argv[2], NULL, &err);
    if (!st) st = sd_shard_meta_set(s, argv[3], argv[4], &err);
    if (st) fprintf(stderr, "shard_writer: %s\n", err.msg);
    return (s && sd_shard_close(s, &err)) || st ? 3 : 0;
}

/* A record with no name (the format allows it; it gets no names entry):
 * NAME's record copied under the key of sixteen 'U's with the name left
 * out, in its own commit, then one more commit of the same record named
 * "after-unnamed" under sixteen 'V's, so that the unnamed record is in the
 * snapshot before the newest too and the two latents roots differ. */
static int cmd_unnamed(char **argv)
{
    sd_error err;
    sd_shard *s = NULL;
    sd_shard_txn *t = NULL;
    const void *k, *v;
    size_t kl, vl;
    sd_shard_rec r;
    sd_buf b[2];
    sd_buf_init(&b[0]);
    sd_buf_init(&b[1]);
    sd_status st = sd_shard_open(&s, argv[2], NULL, &err);
    if (!st) st = sd_shard_read_begin(s, &t, &err);
    if (!st) st = sd_shard_get_name(t, argv[3], strlen(argv[3]), &k, &kl, &err);
    if (!st) st = sd_shard_get(t, k, kl, &v, &vl, &err);
    if (!st) st = sd_shard_rec_parse(v, vl, &r, &err);
    if (!st) { /* both built while the read transaction keeps the record's bytes */
        r.name_len = 0;
        st = sd_shard_rec_build(&r, &b[0], &err);
        r.name = "after-unnamed";
        r.name_len = strlen(r.name);
        if (!st) st = sd_shard_rec_build(&r, &b[1], &err);
    }
    if (t) sd_shard_read_end(t);
    for (int i = 0; i < 2 && !st; i++) {
        uint8_t key[16];
        memset(key, i ? 'V' : 'U', sizeof key);
        st = sd_shard_begin(s, &err);
        if (!st) st = sd_shard_put(s, key, sizeof key, b[i].data, b[i].len, &err);
        if (!st) st = sd_shard_commit(s, &err);
    }
    sd_buf_free(&b[0]);
    sd_buf_free(&b[1]);
    if (st) fprintf(stderr, "shard_writer: %s\n", err.msg);
    return (s && sd_shard_close(s, &err)) || st ? 3 : 0;
}

/* NAME's record rewritten in place with a loss mask at the latent size,
 * every value VALUE (a value outside 0..1 is what sd-verify reports as
 * bad_mask). */
static int cmd_mask(char **argv)
{
    sd_error err;
    sd_shard *s = NULL;
    sd_shard_txn *t = NULL;
    const void *k, *v;
    size_t kl, vl;
    uint8_t key[SD_SHARD_MAX_KEY];
    sd_shard_rec r;
    sd_buf b;
    sd_buf_init(&b);
    static float mask[256 * 256];
    sd_status st = sd_shard_open(&s, argv[2], NULL, &err);
    if (!st) st = sd_shard_read_begin(s, &t, &err);
    if (!st) st = sd_shard_get_name(t, argv[3], strlen(argv[3]), &k, &kl, &err);
    if (!st) {
        memcpy(key, k, kl);
        st = sd_shard_get(t, k, kl, &v, &vl, &err);
    }
    if (!st) st = sd_shard_rec_parse(v, vl, &r, &err);
    if (!st && (r.bucket_w / 8) * (r.bucket_h / 8) > 256 * 256) st = sd_err_set(&err, SD_ERANGE, "bucket too large");
    if (!st) {
        for (size_t i = 0; i < (size_t)(r.bucket_w / 8) * (r.bucket_h / 8); i++) mask[i] = (float)atof(argv[4]);
        r.t[r.ntensors++] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_MASK, 2, {r.bucket_h / 8, r.bucket_w / 8, 0, 0}, 0, 0,
                                              mask};
        r.flags |= SD_REC_F_MASK;
        st = sd_shard_rec_build(&r, &b, &err);
    }
    if (t) sd_shard_read_end(t);
    if (!st) st = sd_shard_begin(s, &err);
    if (!st) st = sd_shard_put(s, key, kl, b.data, b.len, &err);
    if (!st) st = sd_shard_commit(s, &err);
    sd_buf_free(&b);
    if (st) fprintf(stderr, "shard_writer: %s\n", err.msg);
    return (s && sd_shard_close(s, &err)) || st ? 3 : 0;
}

/* names[NAME] = names[TARGET], through LMDB: a names entry leading to a
 * record of another name. */
static int cmd_misname(char **argv)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi lat, text, names;
    MDB_val tk = {strlen(argv[4]), argv[4]}, rk, nk = {strlen(argv[3]), argv[3]};
    if (raw_open(argv[2], 0, &env, &txn, &lat, &text) || mdb_dbi_open(txn, "names", 0, &names) ||
        mdb_get(txn, names, &tk, &rk)) {
        fprintf(stderr, "shard_writer: cannot open %s or find name %s\n", argv[2], argv[4]);
        return 3;
    }
    uint8_t key[SD_SHARD_MAX_KEY];
    size_t kl = rk.mv_size < sizeof key ? rk.mv_size : sizeof key;
    memcpy(key, rk.mv_data, kl);
    MDB_val nv = {kl, key};
    int rc = mdb_put(txn, names, &nk, &nv, 0);
    if (!rc) rc = mdb_txn_commit(txn);
    mdb_env_close(env);
    return rc ? 3 : 0;
}

/* A copy of NAME's record with format version 3 (one newer than this sdtk
 * reads) under "v2-NAME"; its header
 * checksum (docs/FORMATS.md: XXH3-64 of bytes 0..247, continued over the
 * name up to the payload offset at byte 80) made for the new version unless
 * damaged. */
static int cmd_newver(int argc, char **argv)
{
    int damaged = argc > 4 && !strcmp(argv[4], "damaged"), inplace = argc > 4 && !strcmp(argv[4], "inplace");
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi lat, text, names;
    MDB_val nk = {strlen(argv[3]), argv[3]}, rk, rv;
    if (raw_open(argv[2], 0, &env, &txn, &lat, &text) || mdb_dbi_open(txn, "names", 0, &names) ||
        mdb_get(txn, names, &nk, &rk) || mdb_get(txn, lat, &rk, &rv) || rv.mv_size < 256) {
        fprintf(stderr, "shard_writer: cannot open %s or find record %s\n", argv[2], argv[3]);
        return 3;
    }
    uint8_t *v = malloc(rv.mv_size);
    memcpy(v, rv.mv_data, rv.mv_size);
    v[4] = SD_REC_VERSION_MAX + 1;
    v[5] = 0;
    if (!damaged) {
        uint32_t poff = (uint32_t)v[80] | (uint32_t)v[81] << 8 | (uint32_t)v[82] << 16 | (uint32_t)v[83] << 24;
        uint64_t h = sd_hash64(v, 248, 0);
        h = sd_hash64(v + 256, poff - 256, h);
        for (int i = 0; i < 8; i++) v[248 + i] = (uint8_t)(h >> (8 * i));
    }
    char key[600];
    if (inplace) snprintf(key, sizeof key, "%.*s", (int)rk.mv_size, (const char *)rk.mv_data);
    else snprintf(key, sizeof key, "v2-%s", argv[3]);
    MDB_val k = {inplace ? rk.mv_size : strlen(key), key}, nv = {rv.mv_size, v};
    int rc = mdb_put(txn, lat, &k, &nv, 0);
    if (!rc) rc = mdb_txn_commit(txn);
    mdb_env_close(env);
    free(v);
    printf("latents ");
    hex(key, k.mv_size);
    printf("\n");
    return rc ? 3 : 0;
}

/* Seed corpus for the record-parser fuzz target: one record per layout. */
static int cmd_corpus(char **argv)
{
    static uint16_t a[4 * 4 * 6], b2[4 * 4 * 6], c[4 * 4 * 6], d[4 * 4 * 6];
    static float f[4 * 2 * 2];
    fill16(a, 96, 1);
    fill16(b2, 96, 2);
    fill16(c, 96, 3);
    fill16(d, 96, 4);
    static float m[4 * 6];
    for (int i = 0; i < 24; i++) m[i] = (float)i / 23.0f;
    sd_shard_rec r[5];
    memset(r, 0, sizeof r);
    r[0].kind = SD_REC_LATENT;
    r[0].bucket_w = 48, r[0].bucket_h = 32, r[0].name = "a.png", r[0].name_len = 5, r[0].ntensors = 1;
    r[0].t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_SAMPLE, 3, {4, 4, 6, 0}, 0, 0, a};
    r[1] = r[0];
    r[1].flags = SD_REC_F_FLIPPED | SD_REC_F_MEANSTD | SD_REC_F_CROP_FLOAT, r[1].ntensors = 4, r[1].crop[1] = 0.5;
    r[1].text_ref[3] = 7;
    for (int i = 0; i < 4; i++)
        r[1].t[i] = (sd_shard_tensor){SD_DT_BF16, (uint8_t)(SD_ROLE_MEAN + i), 3, {4, 4, 6, 0}, 0, 0, i ? (i == 1 ? b2 : i == 2 ? c : d) : a};
    r[2].kind = SD_REC_LATENT, r[2].ntensors = 1, r[2].bucket_w = r[2].bucket_h = 16;
    r[2].t[0] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_SAMPLE, 3, {4, 2, 2, 0}, 0, 0, f};
    r[3].kind = SD_REC_TEXT, r[3].ntensors = 3;
    r[3].t[0] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN1, 2, {4, 8, 0, 0}, 0, 0, a};
    r[3].t[1] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_HIDDEN2, 2, {4, 12, 0, 0}, 0, 0, b2};
    r[3].t[2] = (sd_shard_tensor){SD_DT_F16, SD_ROLE_POOLED, 1, {12, 0, 0, 0}, 0, 0, c};
    r[4] = r[1]; /* version 2: with a loss mask at the latent size */
    r[4].flags |= SD_REC_F_MASK, r[4].ntensors = 5;
    r[4].t[4] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_MASK, 2, {4, 6, 0, 0}, 0, 0, m};
    static const char *names[5] = {"latent_f16", "latent_bf16_meanstd_flip", "latent_f32", "text_sdxl",
                                   "latent_meanstd_flip_mask"};
    sd_buf b;
    sd_buf_init(&b);
    sd_error err;
    for (int i = 0; i < 5; i++) {
        if (sd_shard_rec_build(&r[i], &b, &err)) {
            fprintf(stderr, "shard_writer: %s\n", err.msg);
            return 3;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.rec", argv[2], names[i]);
        FILE *fo = fopen(path, "wb");
        if (!fo || fwrite(b.data, 1, b.len, fo) != b.len || fclose(fo)) return 3;
    }
    sd_buf_free(&b);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "corpus")) return cmd_corpus(argv);
    if (argc >= 4 && !strcmp(argv[1], "write")) return cmd_write(argc, argv);
    if (argc >= 5 && !strcmp(argv[1], "corrupt")) return cmd_corrupt(argc, argv);
    if (argc >= 5 && !strcmp(argv[1], "unindex")) return cmd_unindex(argv);
    if (argc >= 3 && !strcmp(argv[1], "locate")) return cmd_locate(argv);
    if (argc >= 4 && !strcmp(argv[1], "emptytext")) return cmd_emptytext(argv);
    if (argc >= 5 && !strcmp(argv[1], "meta")) return cmd_meta(argv);
    if (argc >= 5 && !strcmp(argv[1], "mask")) return cmd_mask(argv);
    if (argc >= 5 && !strcmp(argv[1], "misname")) return cmd_misname(argv);
    if (argc >= 4 && !strcmp(argv[1], "newver")) return cmd_newver(argc, argv);
    if (argc >= 4 && !strcmp(argv[1], "unnamed")) return cmd_unnamed(argv);
    fprintf(stderr, "usage: shard_writer write SHARD N [BATCH] "
                    "[nosync|nogrow|slow|map=BYTES|keyseed=K|dupnames|notext]...\n"
                    "       shard_writer corrupt SHARD COUNT SEED [text|indexed]\n"
                    "       shard_writer unindex SHARD bindex|names COUNT\n       shard_writer locate SHARD\n"
                    "       shard_writer emptytext SHARD ENCODER\n       shard_writer meta SHARD KEY VALUE\n"
                    "       shard_writer misname SHARD NAME TARGET\n       shard_writer newver SHARD NAME [damaged]\n"
                    "       shard_writer unnamed SHARD NAME\n");
    return 2;
}
