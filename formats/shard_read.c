/* The shard store's read side: read transactions (a snapshot per thread),
 * zero-copy gets, counts, the bucket index and cursors. */
#include <stdlib.h>

#include "shard_int.h"

/* ---- read transactions ---------------------------------------------------- */

/* A snapshot for one thread. */
sd_status sd_shard_read_begin(sd_shard *s, sd_shard_txn **out, sd_error *err)
{
    *out = NULL;
    sd_status refused = sd_shard_refuse_damaged(s, err);
    if (refused) return refused;
    sd_shard_txn *t = calloc(1, sizeof *t);
    if (!t) return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->s = s;
    int rc = sd_shard_txn_begin_ro(s, &t->txn);
    if (rc) {
        free(t);
        return sd_shard_mdb_err(err, rc, "begin read", s);
    }
    *out = t;
    return SD_OK;
}

/* End the snapshot and free the handle; NULL is allowed, for cleanup paths. */
void sd_shard_read_end(sd_shard_txn *t)
{
    if (!t) return;
    if (t->txn) mdb_txn_abort(t->txn);
    free(t);
}

/* Release the snapshot between uses (sd-verify after each chunk) so that LMDB
 * need not keep its pages; sd_shard_read_renew takes a fresh one on the same handle. */
void sd_shard_read_reset(sd_shard_txn *t)
{
    mdb_txn_reset(t->txn);
}

/* Fresh snapshot after a reset; a grown map needs a new transaction. */
sd_status sd_shard_read_renew(sd_shard_txn *t, sd_error *err)
{
    int rc = mdb_txn_renew(t->txn);
    if (rc == MDB_MAP_RESIZED) {
        mdb_txn_abort(t->txn);
        t->txn = NULL;
        rc = sd_shard_txn_begin_ro(t->s, &t->txn);
    }
    return rc ? sd_shard_mdb_err(err, rc, "renew read", t->s) : SD_OK;
}

/* Zero-copy lookup in one database. */
static sd_status get_in(sd_shard_txn *t, int db, const void *key, size_t klen, const void **val, size_t *vlen,
                        sd_error *err)
{
    MDB_val k = {klen, (void *)key}, v;
    *val = NULL;
    *vlen = 0;
    if (klen == 0 || klen > SD_SHARD_MAX_KEY) return sd_err_set(err, SD_EINVAL, "key length %zu not in 1..511", klen);
    if (!t->s->dbi_ok[db]) return sd_err_set(err, SD_ENOTFOUND, "not found");
    int rc = mdb_get(t->txn, t->s->dbi[db], &k, &v);
    if (rc == MDB_NOTFOUND) return sd_err_set(err, SD_ENOTFOUND, "not found");
    if (rc) return sd_shard_mdb_err(err, rc, "get", t->s);
    *val = v.mv_data;
    *vlen = v.mv_size;
    return SD_OK;
}

/* A latent record by its key, zero-copy from the map. */
sd_status sd_shard_get(sd_shard_txn *t, const void *key, size_t klen, const void **val, size_t *vlen, sd_error *err)
{
    return get_in(t, SD_SHARD_DB_LATENTS, key, klen, val, vlen, err);
}

/* A text embedding by its 16-byte content hash (what a latent record's text_ref holds). */
sd_status sd_shard_get_text(sd_shard_txn *t, const uint8_t hash[16], const void **val, size_t *vlen, sd_error *err)
{
    return get_in(t, SD_SHARD_DB_TEXT, hash, SD_SHARD_TEXT_KEY, val, vlen, err);
}

/* A record's caption variants; the value is checked to be whole 16-byte
 * keys, at least two and at most SD_SHARD_MAX_VARIANTS (what the writer
 * puts), so a reader may index it without more checks. */
sd_status sd_shard_get_variants(sd_shard_txn *t, const void *key, size_t klen, const uint8_t **refs, size_t *n,
                                sd_error *err)
{
    const void *v;
    size_t vl;
    *refs = NULL;
    *n = 0;
    sd_status st = get_in(t, SD_SHARD_DB_VARIANTS, key, klen, &v, &vl, err);
    if (st) return st;
    if (vl % SD_SHARD_TEXT_KEY || vl < 2 * SD_SHARD_TEXT_KEY || vl > SD_SHARD_MAX_VARIANTS * SD_SHARD_TEXT_KEY)
        return sd_err_set(err, SD_EFORMAT, "variants entry of %zu bytes (not 2..%d keys of %d bytes)", vl,
                          SD_SHARD_MAX_VARIANTS, SD_SHARD_TEXT_KEY);
    *refs = v;
    *n = vl / SD_SHARD_TEXT_KEY;
    return SD_OK;
}

/* The record key a record name (sd-meta's key) maps to, for finding a record by name. */
sd_status sd_shard_get_name(sd_shard_txn *t, const char *name, size_t nlen, const void **key, size_t *klen, sd_error *err)
{
    return get_in(t, SD_SHARD_DB_NAMES, name, nlen, key, klen, err);
}

/* An exact (bucket, key) lookup among the bucket's duplicates. */
sd_status sd_shard_index_has(sd_shard_txn *t, uint32_t w, uint32_t h, const void *key, size_t klen, int *found,
                             sd_error *err)
{
    uint8_t bk[8];
    sd_shard_bucket_key(w, h, bk);
    MDB_cursor *c;
    *found = 0;
    int rc = mdb_cursor_open(t->txn, t->s->dbi[SD_SHARD_DB_BINDEX], &c);
    if (rc) return sd_shard_mdb_err(err, rc, "cursor", t->s);
    MDB_val k = {8, bk}, v = {klen, (void *)key};
    rc = mdb_cursor_get(c, &k, &v, MDB_GET_BOTH);
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND) return sd_shard_mdb_err(err, rc, "index lookup", t->s);
    *found = rc == 0;
    return SD_OK;
}

/* Entries of one database, from LMDB's page statistics (O(1)). */
sd_status sd_shard_count(sd_shard_txn *t, sd_shard_db db, uint64_t *n, sd_error *err)
{
    MDB_stat st;
    *n = 0;
    if ((int)db < 0 || (int)db >= NDBS) return sd_err_set(err, SD_EINVAL, "bad database %d", (int)db);
    if (!t->s->dbi_ok[db]) return SD_OK; /* an optional database this shard lacks: empty */
    int rc = mdb_stat(t->txn, t->s->dbi[db], &st);
    if (rc) return sd_shard_mdb_err(err, rc, "stat", t->s);
    *n = st.ms_entries;
    return SD_OK;
}

/* Every bucket with its count: what a trainer reads at startup. */
sd_status sd_shard_buckets(sd_shard_txn *t, sd_shard_bucket **out, size_t *n, sd_error *err)
{
    *out = NULL;
    *n = 0;
    uint64_t cnt = 0;
    sd_status st = sd_shard_count(t, SD_SHARD_DB_BUCKETS, &cnt, err);
    if (st) return st;
    sd_shard_bucket *b = malloc((cnt ? cnt : 1) * sizeof *b);
    if (!b) return sd_err_set(err, SD_ENOMEM, "out of memory");
    MDB_cursor *c;
    int rc = mdb_cursor_open(t->txn, t->s->dbi[SD_SHARD_DB_BUCKETS], &c);
    if (rc) {
        free(b);
        return sd_shard_mdb_err(err, rc, "cursor", t->s);
    }
    MDB_val k, v;
    size_t i = 0;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc && i < cnt; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 8 || v.mv_size != 8) continue;
        sd_shard_bucket_unkey(k.mv_data, &b[i].w, &b[i].h);
        const uint8_t *p = v.mv_data;
        b[i].count = 0;
        for (int j = 7; j >= 0; j--) b[i].count = b[i].count << 8 | p[j];
        i++;
    }
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND) {
        free(b);
        return sd_shard_mdb_err(err, rc, "reading buckets", t->s);
    }
    *out = b;
    *n = i;
    return SD_OK;
}

/* ---- cursors --------------------------------------------------------------- */

struct sd_shard_cursor {
    sd_shard_txn *t;
    MDB_cursor *c;
    int db;
    int state; /* 0 = before first, 1 = positioned (next moves on), 2 = positioned, yield current, 3 = end */
    int bucket;
    uint8_t bkey[8];
};

/* What both kinds of cursor share: the handle and an LMDB cursor on database db. */
static sd_status cursor_new(sd_shard_txn *t, int db, sd_shard_cursor **out, sd_error *err)
{
    *out = NULL;
    sd_shard_cursor *c = calloc(1, sizeof *c);
    if (!c) return sd_err_set(err, SD_ENOMEM, "out of memory");
    c->t = t;
    c->db = db;
    if (!t->s->dbi_ok[db]) { /* an optional database this shard lacks: a cursor at its end */
        c->state = 3;
        *out = c;
        return SD_OK;
    }
    int rc = mdb_cursor_open(t->txn, t->s->dbi[db], &c->c);
    if (rc) {
        free(c);
        return sd_shard_mdb_err(err, rc, "cursor", t->s);
    }
    *out = c;
    return SD_OK;
}

/* A cursor over one whole database, refused for a number that is not one of the shard's. */
sd_status sd_shard_cursor_open(sd_shard_txn *t, sd_shard_db db, sd_shard_cursor **out, sd_error *err)
{
    if ((int)db < 0 || (int)db >= NDBS) return sd_err_set(err, SD_EINVAL, "bad database %d", (int)db);
    return cursor_new(t, db, out, err);
}

/* A cursor over one bucket's records through bindex's duplicates: how the trainer's data
 * index lists each bucket's records. */
sd_status sd_shard_cursor_bucket(sd_shard_txn *t, uint32_t w, uint32_t h, sd_shard_cursor **out, sd_error *err)
{
    sd_status st = cursor_new(t, SD_SHARD_DB_BINDEX, out, err);
    if (st) return st;
    (*out)->bucket = 1;
    sd_shard_bucket_key(w, h, (*out)->bkey);
    return SD_OK;
}

/* Position at the first key >= key; next() yields it. */
sd_status sd_shard_cursor_seek(sd_shard_cursor *c, const void *key, size_t klen, sd_error *err)
{
    if (c->bucket) return sd_err_set(err, SD_EINVAL, "seek on a bucket cursor");
    MDB_val k = {klen, (void *)key}, v;
    int rc = mdb_cursor_get(c->c, &k, &v, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND) {
        c->state = 3;
        return SD_OK;
    }
    if (rc) return sd_shard_mdb_err(err, rc, "seek", c->t->s);
    c->state = 2;
    return SD_OK;
}

/* Step a bucket cursor over its duplicates and look the record up. */
static sd_status bucket_next(sd_shard_cursor *c, const void **key, size_t *klen, const void **val, size_t *vlen,
                             sd_error *err)
{
    MDB_val k = {8, c->bkey}, v;
    int rc = c->state == 0 ? mdb_cursor_get(c->c, &k, &v, MDB_SET_KEY) : mdb_cursor_get(c->c, &k, &v, MDB_NEXT_DUP);
    if (!rc && c->state == 0) rc = mdb_cursor_get(c->c, &k, &v, MDB_FIRST_DUP);
    c->state = 1;
    if (rc == MDB_NOTFOUND) {
        c->state = 3;
        return sd_err_set(err, SD_ENOTFOUND, "end");
    }
    if (rc) return sd_shard_mdb_err(err, rc, "bucket cursor", c->t->s);
    *key = v.mv_data;
    *klen = v.mv_size;
    MDB_val rk = v, rv;
    rc = mdb_get(c->t->txn, c->t->s->dbi[SD_SHARD_DB_LATENTS], &rk, &rv);
    if (rc == MDB_NOTFOUND) {
        *val = NULL;
        *vlen = 0;
        return SD_OK;
    }
    if (rc) return sd_shard_mdb_err(err, rc, "get", c->t->s);
    *val = rv.mv_data;
    *vlen = rv.mv_size;
    return SD_OK;
}

/* Both kinds' step: a bucket cursor looks its record up, a plain one yields the entry
 * (after a seek, the entry sought first). */
sd_status sd_shard_cursor_next(sd_shard_cursor *c, const void **key, size_t *klen, const void **val, size_t *vlen,
                               sd_error *err)
{
    if (c->state == 3) return sd_err_set(err, SD_ENOTFOUND, "end");
    if (c->bucket) return bucket_next(c, key, klen, val, vlen, err);
    MDB_val k, v;
    MDB_cursor_op op = c->state == 0 ? MDB_FIRST : c->state == 2 ? MDB_GET_CURRENT : MDB_NEXT;
    int rc = mdb_cursor_get(c->c, &k, &v, op);
    c->state = 1;
    if (rc == MDB_NOTFOUND) {
        c->state = 3;
        return sd_err_set(err, SD_ENOTFOUND, "end");
    }
    if (rc) return sd_shard_mdb_err(err, rc, "cursor", c->t->s);
    *key = k.mv_data;
    *klen = k.mv_size;
    *val = v.mv_data;
    *vlen = v.mv_size;
    return SD_OK;
}

/* Close the LMDB cursor and free the handle; NULL is allowed, for cleanup paths. */
void sd_shard_cursor_close(sd_shard_cursor *c)
{
    if (!c) return;
    if (c->c) mdb_cursor_close(c->c);
    free(c);
}
