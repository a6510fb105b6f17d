/* The shard writer: batches of operations in one LMDB write transaction,
 * the bucket and name indexes kept in step with every put and delete, and
 * map growth (abort, double the map, replay the batch from its log). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shard_int.h"

enum { OP_PUT = 1, OP_PUT_TEXT, OP_DEL, OP_DEL_TEXT, OP_META, OP_REINDEX, OP_PUT_VARIANTS, OP_DEL_VARIANTS };

/* One logged operation: fixed head, then key and value bytes, 8-aligned. */
typedef struct {
    uint32_t op, klen, vlen, pad;
} op_head;

/* The batch log's entries are padded to 8 bytes: run_op writes them so, replay steps over them. */
static size_t align8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* ---- index maintenance (inside the write transaction) ----------------------- */

/* Add delta to bucket bk's record count; a count of zero removes the entry. */
static int count_add(sd_shard *s, MDB_txn *txn, uint8_t bk[8], int delta)
{
    MDB_val k = {8, bk}, v;
    uint64_t n = 0;
    int rc = mdb_get(txn, s->dbi[SD_SHARD_DB_BUCKETS], &k, &v);
    if (rc && rc != MDB_NOTFOUND) return rc;
    if (!rc && v.mv_size == 8)
        for (int j = 7; j >= 0; j--) n = n << 8 | ((const uint8_t *)v.mv_data)[j];
    n = delta < 0 && n == 0 ? 0 : n + (uint64_t)(int64_t)delta;
    if (n == 0) return rc == MDB_NOTFOUND ? 0 : mdb_del(txn, s->dbi[SD_SHARD_DB_BUCKETS], &k, NULL);
    uint8_t le[8];
    for (int j = 0; j < 8; j++) le[j] = (uint8_t)(n >> (8 * j));
    MDB_val nv = {8, le};
    return mdb_put(txn, s->dbi[SD_SHARD_DB_BUCKETS], &k, &nv, 0);
}

/* Index a parsed record under key: bindex entry, bucket count, name. */
static int index_add(sd_shard *s, MDB_txn *txn, const void *key, size_t klen, const sd_shard_rec *r, unsigned nameflags)
{
    uint8_t bk[8];
    sd_shard_bucket_key(r->bucket_w, r->bucket_h, bk);
    MDB_val k = {8, bk}, d = {klen, (void *)key};
    int rc = mdb_put(txn, s->dbi[SD_SHARD_DB_BINDEX], &k, &d, MDB_NODUPDATA);
    if (rc == 0) rc = count_add(s, txn, bk, 1);
    else if (rc == MDB_KEYEXIST) rc = 0;
    if (rc || r->name_len == 0) return rc;
    MDB_val nk = {r->name_len, (void *)r->name}, nv = {klen, (void *)key};
    rc = mdb_put(txn, s->dbi[SD_SHARD_DB_NAMES], &nk, &nv, nameflags);
    return rc == MDB_KEYEXIST ? 0 : rc;
}

/* Remove key's index entries when its value cannot be parsed: scan bindex
 * and names for the key (O(records); only for corrupt records). */
static int unindex_scan(sd_shard *s, MDB_txn *txn, const void *key, size_t klen)
{
    sd_buf found;
    sd_buf_init(&found);
    for (int pass = 0; pass < 2; pass++) {
        int db = pass == 0 ? SD_SHARD_DB_BINDEX : SD_SHARD_DB_NAMES;
        MDB_cursor *c;
        int rc = mdb_cursor_open(txn, s->dbi[db], &c);
        if (rc) {
            sd_buf_free(&found);
            return rc;
        }
        sd_buf_clear(&found);
        MDB_val k, v;
        for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
            if (v.mv_size == klen && memcmp(v.mv_data, key, klen) == 0) {
                uint32_t n = (uint32_t)k.mv_size;
                sd_buf_put(&found, &n, 4);
                sd_buf_put(&found, k.mv_data, n);
            }
        mdb_cursor_close(c);
        if (found.oom) rc = ENOMEM;
        if (rc != MDB_NOTFOUND) {
            sd_buf_free(&found);
            return rc;
        }
        rc = 0;
        for (size_t p = 0; !rc && p < found.len;) {
            uint32_t n;
            memcpy(&n, found.data + p, 4);
            MDB_val dk = {n, found.data + p + 4}, dv = {klen, (void *)key};
            rc = mdb_del(txn, s->dbi[db], &dk, pass == 0 ? &dv : NULL);
            if (!rc && pass == 0) rc = count_add(s, txn, (uint8_t *)dk.mv_data, -1);
            if (rc == MDB_NOTFOUND) rc = 0;
            p += 4 + n;
        }
        if (rc) {
            sd_buf_free(&found);
            return rc;
        }
    }
    sd_buf_free(&found);
    return 0;
}

/* Remove the index entries of the record stored under key (value old). */
static int unindex(sd_shard *s, MDB_txn *txn, const void *key, size_t klen, const MDB_val *old)
{
    sd_shard_rec r;
    sd_error e;
    if (sd_shard_rec_parse(old->mv_data, old->mv_size, &r, &e)) return unindex_scan(s, txn, key, klen);
    uint8_t bk[8];
    sd_shard_bucket_key(r.bucket_w, r.bucket_h, bk);
    MDB_val k = {8, bk}, d = {klen, (void *)key};
    int rc = mdb_del(txn, s->dbi[SD_SHARD_DB_BINDEX], &k, &d);
    if (rc == 0) rc = count_add(s, txn, bk, -1);
    else if (rc == MDB_NOTFOUND) rc = 0;
    if (rc || r.name_len == 0) return rc;
    MDB_val nk = {r.name_len, (void *)r.name}, nv;
    rc = mdb_get(txn, s->dbi[SD_SHARD_DB_NAMES], &nk, &nv);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (nv.mv_size == klen && memcmp(nv.mv_data, key, klen) == 0) rc = mdb_del(txn, s->dbi[SD_SHARD_DB_NAMES], &nk, NULL);
    return rc;
}

/* ---- operations --------------------------------------------------------------- */

static int op_put(sd_shard *s, MDB_txn *txn, const void *key, size_t klen, const void *val, size_t vlen)
{
    sd_shard_rec r;
    sd_error e;
    if (sd_shard_rec_parse(val, vlen, &r, &e)) return MDB_BAD_VALSIZE; /* validated before logging */
    MDB_val k = {klen, (void *)key}, old, v = {vlen, (void *)val};
    int rc = mdb_get(txn, s->dbi[SD_SHARD_DB_LATENTS], &k, &old);
    if (rc == 0) rc = unindex(s, txn, key, klen, &old);
    else if (rc == MDB_NOTFOUND) rc = 0;
    if (!rc) rc = mdb_put(txn, s->dbi[SD_SHARD_DB_LATENTS], &k, &v, 0);
    if (!rc) rc = index_add(s, txn, key, klen, &r, 0);
    return rc;
}

/* Delete a latent record and its index entries (unindex finds them also for a corrupt value). */
static int op_del(sd_shard *s, MDB_txn *txn, const void *key, size_t klen)
{
    MDB_val k = {klen, (void *)key}, old;
    int rc = mdb_get(txn, s->dbi[SD_SHARD_DB_LATENTS], &k, &old);
    if (rc) return rc;
    rc = unindex(s, txn, key, klen, &old);
    if (!rc) rc = mdb_del(txn, s->dbi[SD_SHARD_DB_LATENTS], &k, NULL);
    if (!rc) { /* its caption variants go with it */
        rc = mdb_del(txn, s->dbi[SD_SHARD_DB_VARIANTS], &k, NULL);
        if (rc == MDB_NOTFOUND) rc = 0;
    }
    return rc;
}

/* Drop names whose record is gone, unreadable or of another name; names
 * of the remaining records are re-added by the caller's pass over them. */
static int drop_dangling_names(sd_shard *s, MDB_txn *txn)
{
    sd_buf gone;
    sd_buf_init(&gone);
    MDB_cursor *c;
    int rc = mdb_cursor_open(txn, s->dbi[SD_SHARD_DB_NAMES], &c);
    if (rc) return rc;
    MDB_val k, v, rv;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        int g = mdb_get(txn, s->dbi[SD_SHARD_DB_LATENTS], &v, &rv);
        if (g && g != MDB_NOTFOUND) {
            rc = g;
            break;
        }
        sd_shard_rec r;
        sd_error e;
        sd_status ps = g == MDB_NOTFOUND ? SD_ENOTFOUND : sd_shard_rec_parse(rv.mv_data, rv.mv_size, &r, &e);
        if (ps == SD_EUNSUPPORTED) continue; /* a newer format's record: its name cannot be checked, it stays */
        if (ps != SD_OK || r.name_len != k.mv_size || memcmp(r.name, k.mv_data, k.mv_size) != 0) {
            uint32_t n = (uint32_t)k.mv_size;
            sd_buf_put(&gone, &n, 4);
            sd_buf_put(&gone, k.mv_data, n);
        }
    }
    mdb_cursor_close(c);
    if (rc == MDB_NOTFOUND) rc = gone.oom ? ENOMEM : 0;
    for (size_t p = 0; !rc && p < gone.len;) {
        uint32_t n;
        memcpy(&n, gone.data + p, 4);
        MDB_val dk = {n, gone.data + p + 4};
        rc = mdb_del(txn, s->dbi[SD_SHARD_DB_NAMES], &dk, NULL);
        p += 4 + n;
    }
    sd_buf_free(&gone);
    return rc;
}

/* The bindex entries (8-byte bucket, u32 key length, key) of records of a
 * newer format version: this code cannot read their bucket from them, so
 * a reindex puts these entries back as they were instead of losing the
 * records from every index (sd-verify reports such records, never
 * repairs them). */
static int save_newer(sd_shard *s, MDB_txn *txn, sd_buf *out)
{
    MDB_cursor *c;
    int rc = mdb_cursor_open(txn, s->dbi[SD_SHARD_DB_BINDEX], &c);
    if (rc) return rc;
    MDB_val k, v, rv;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        sd_shard_rec r;
        sd_error e;
        if (k.mv_size != 8 || mdb_get(txn, s->dbi[SD_SHARD_DB_LATENTS], &v, &rv) != 0 ||
            sd_shard_rec_parse(rv.mv_data, rv.mv_size, &r, &e) != SD_EUNSUPPORTED)
            continue;
        uint32_t n = (uint32_t)v.mv_size;
        sd_buf_put(out, k.mv_data, 8);
        sd_buf_put(out, &n, 4);
        sd_buf_put(out, v.mv_data, n);
    }
    mdb_cursor_close(c);
    if (rc == MDB_NOTFOUND) rc = out->oom ? ENOMEM : 0;
    return rc;
}

/* Put save_newer's entries back, each counted in its bucket. */
static int restore_newer(sd_shard *s, MDB_txn *txn, const sd_buf *saved)
{
    int rc = 0;
    for (size_t p = 0; !rc && p < saved->len;) {
        uint32_t n;
        memcpy(&n, saved->data + p + 8, 4);
        MDB_val k = {8, saved->data + p}, d = {n, saved->data + p + 12};
        rc = mdb_put(txn, s->dbi[SD_SHARD_DB_BINDEX], &k, &d, MDB_NODUPDATA);
        if (rc == 0) rc = count_add(s, txn, (uint8_t *)k.mv_data, 1);
        else if (rc == MDB_KEYEXIST) rc = 0;
        p += 12 + n;
    }
    return rc;
}

/* Rebuild buckets and bindex from the records; fix names. */
static int op_reindex(sd_shard *s, MDB_txn *txn)
{
    sd_buf newer;
    sd_buf_init(&newer);
    int rc = save_newer(s, txn, &newer);
    if (!rc) rc = mdb_drop(txn, s->dbi[SD_SHARD_DB_BINDEX], 0);
    if (!rc) rc = mdb_drop(txn, s->dbi[SD_SHARD_DB_BUCKETS], 0);
    if (!rc) rc = drop_dangling_names(s, txn);
    if (!rc) rc = restore_newer(s, txn, &newer);
    sd_buf_free(&newer);
    if (rc) return rc;
    MDB_cursor *c;
    rc = mdb_cursor_open(txn, s->dbi[SD_SHARD_DB_LATENTS], &c);
    if (rc) return rc;
    MDB_val k, v;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        sd_shard_rec r;
        sd_error e;
        if (sd_shard_rec_parse(v.mv_data, v.mv_size, &r, &e)) continue;
        rc = index_add(s, txn, k.mv_data, k.mv_size, &r, MDB_NOOVERWRITE);
        if (rc) break;
    }
    mdb_cursor_close(c);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Apply one logged operation to the write transaction. */
static int apply(sd_shard *s, const op_head *h, const void *key, const void *val)
{
    MDB_txn *txn = s->wtxn;
    MDB_val k = {h->klen, (void *)key}, v = {h->vlen, (void *)val};
    int rc;
    switch (h->op) {
    case OP_PUT: return op_put(s, txn, key, h->klen, val, h->vlen);
    case OP_PUT_TEXT: return mdb_put(txn, s->dbi[SD_SHARD_DB_TEXT], &k, &v, 0);
    case OP_DEL: rc = op_del(s, txn, key, h->klen); return rc == MDB_NOTFOUND ? 0 : rc;
    case OP_DEL_TEXT: rc = mdb_del(txn, s->dbi[SD_SHARD_DB_TEXT], &k, NULL); return rc == MDB_NOTFOUND ? 0 : rc;
    case OP_META: return mdb_put(txn, s->dbi[SD_SHARD_DB_META], &k, &v, 0);
    case OP_REINDEX: return op_reindex(s, txn);
    case OP_PUT_VARIANTS: return mdb_put(txn, s->dbi[SD_SHARD_DB_VARIANTS], &k, &v, 0);
    case OP_DEL_VARIANTS:
        rc = mdb_del(txn, s->dbi[SD_SHARD_DB_VARIANTS], &k, NULL);
        return rc == MDB_NOTFOUND ? 0 : rc;
    default: return EINVAL;
    }
}

/* Apply the whole log again after the map grew. */
static int replay(sd_shard *s)
{
    for (size_t p = 0; p < s->log.len;) {
        op_head h;
        memcpy(&h, s->log.data + p, sizeof h);
        const char *key = s->log.data + p + sizeof h;
        int rc = apply(s, &h, key, key + h.klen);
        if (rc) return rc;
        p += align8(sizeof h + h.klen + h.vlen);
    }
    return 0;
}

/* End the batch, keeping nothing. */
static void drop_batch(sd_shard *s)
{
    if (s->wtxn) mdb_txn_abort(s->wtxn);
    s->wtxn = NULL;
    sd_buf_clear(&s->log);
    s->nops = 0;
}

/* MDB_MAP_FULL: abort, double the map, replay; repeat until it fits or the
 * limit is reached (then the batch is dropped). */
static sd_status grow_replay(sd_shard *s, sd_error *err)
{
    for (;;) {
        if (s->wtxn) mdb_txn_abort(s->wtxn);
        s->wtxn = NULL;
        size_t want = s->map_size * 2;
        if ((s->flags & SD_SHARD_NOGROW) || want > s->max_map) {
            size_t kib = s->map_size >> 10;
            drop_batch(s);
            return sd_err_set(err, SD_ERANGE, "%s: shard is full (map size %zu KiB%s); the batch was not stored", s->path,
                              kib, s->flags & SD_SHARD_NOGROW ? ", growth disabled" : ", growth limit reached");
        }
        int rc = mdb_env_set_mapsize(s->env, want);
        if (rc) {
            drop_batch(s);
            return sd_shard_mdb_err(err, rc, "growing the map", s);
        }
        s->map_size = want;
        rc = mdb_txn_begin(s->env, NULL, 0, &s->wtxn);
        if (rc) {
            s->wtxn = NULL;
            drop_batch(s);
            return sd_shard_mdb_err(err, rc, "begin", s);
        }
        rc = replay(s);
        if (rc == 0) return SD_OK;
        if (rc != MDB_MAP_FULL) {
            drop_batch(s);
            return sd_shard_mdb_err(err, rc, "replaying the batch", s);
        }
    }
}

/* Open the write transaction and empty the log the batch is kept in for a replay. */
sd_status sd_shard_begin(sd_shard *s, sd_error *err)
{
    if (s->flags & SD_SHARD_RDONLY) return sd_err_set(err, SD_EINVAL, "%s: opened read-only", s->path);
    if (s->wtxn) return sd_err_set(err, SD_EINVAL, "%s: a batch is already open", s->path);
    sd_status refused = sd_shard_refuse_damaged(s, err);
    if (refused) return refused;
    sd_buf_clear(&s->log);
    s->nops = 0;
    int rc = mdb_txn_begin(s->env, NULL, 0, &s->wtxn);
    if (rc) {
        s->wtxn = NULL;
        return sd_shard_mdb_err(err, rc, "begin", s);
    }
    return SD_OK;
}

/* Commit; a full map at commit time grows and replays like a full put. */
sd_status sd_shard_commit(sd_shard *s, sd_error *err)
{
    if (!s->wtxn) return sd_err_set(err, SD_EINVAL, "%s: no batch is open", s->path);
    for (;;) {
        int rc = mdb_txn_commit(s->wtxn);
        s->wtxn = NULL;
        if (rc == 0) break;
        if (rc != MDB_MAP_FULL) {
            drop_batch(s);
            return sd_shard_mdb_err(err, rc, "commit failed (disk full, file size limit or I/O error?); the batch was not stored", s);
        }
        sd_status st = grow_replay(s, err);
        if (st) return st;
    }
    drop_batch(s);
    return SD_OK;
}

/* Give the batch up: the transaction aborted, its log forgotten. */
void sd_shard_abort(sd_shard *s)
{
    drop_batch(s);
}

/* The log's size, by which sd-pack sizes its batches (it commits once one holds BATCH_BYTES). */
size_t sd_shard_batch_bytes(const sd_shard *s)
{
    return s->log.len;
}

/* Log and apply one operation, in the open batch or as a batch of its own. */
static sd_status run_op(sd_shard *s, int op, const void *key, size_t klen, const void *val, size_t vlen, sd_error *err)
{
    int own = s->wtxn == NULL;
    if (own) {
        sd_status st = sd_shard_begin(s, err);
        if (st) return st;
    }
    op_head h = {(uint32_t)op, (uint32_t)klen, (uint32_t)vlen, 0};
    size_t at = s->log.len, n = align8(sizeof h + klen + vlen);
    if (sd_buf_reserve(&s->log, n)) {
        drop_batch(s);
        return sd_err_set(err, SD_ENOMEM, "out of memory (batch log)");
    }
    memset(s->log.data + at, 0, n);
    memcpy(s->log.data + at, &h, sizeof h);
    if (klen) memcpy(s->log.data + at + sizeof h, key, klen);
    if (vlen) memcpy(s->log.data + at + sizeof h + klen, val, vlen);
    s->log.len += n;
    s->nops++;
    const char *lk = s->log.data + at + sizeof h;
    int rc = apply(s, &h, lk, lk + klen);
    if (rc == MDB_MAP_FULL) {
        sd_status st = grow_replay(s, err);
        if (st) return st;
    } else if (rc) {
        drop_batch(s);
        if (rc == MDB_TXN_FULL)
            return sd_err_set(err, SD_ERANGE, "%s: batch too large for one transaction; commit smaller batches", s->path);
        return sd_shard_mdb_err(err, rc, "write", s);
    }
    return own ? sd_shard_commit(s, err) : SD_OK;
}

/* The checks every write shares: a writable handle and a key LMDB takes (1..511 bytes). */
static sd_status check_writer(sd_shard *s, size_t klen, sd_error *err)
{
    if (s->flags & SD_SHARD_RDONLY) return sd_err_set(err, SD_EINVAL, "%s: opened read-only", s->path);
    if (klen == 0 || klen > SD_SHARD_MAX_KEY) return sd_err_set(err, SD_EINVAL, "key length %zu not in 1..511", klen);
    return SD_OK;
}

/* The record is validated here, before it is logged, so that a replay never meets a bad one. */
sd_status sd_shard_put(sd_shard *s, const void *key, size_t klen, const void *val, size_t vlen, sd_error *err)
{
    sd_status st = check_writer(s, klen, err);
    if (st) return st;
    sd_shard_rec r;
    if ((st = sd_shard_rec_parse(val, vlen, &r, err))) return st;
    if (r.kind != SD_REC_LATENT) return sd_err_set(err, SD_EINVAL, "sd_shard_put needs a latent record");
    return run_op(s, OP_PUT, key, klen, val, vlen, err);
}

/* As sd_shard_put, for a text-embedding record under its content hash. */
sd_status sd_shard_put_text(sd_shard *s, const uint8_t hash[16], const void *val, size_t vlen, sd_error *err)
{
    sd_status st = check_writer(s, SD_SHARD_TEXT_KEY, err);
    if (st) return st;
    sd_shard_rec r;
    if ((st = sd_shard_rec_parse(val, vlen, &r, err))) return st;
    if (r.kind != SD_REC_TEXT) return sd_err_set(err, SD_EINVAL, "sd_shard_put_text needs a text-embedding record");
    return run_op(s, OP_PUT_TEXT, hash, SD_SHARD_TEXT_KEY, val, vlen, err);
}

/* A record's caption variants (shard.h): whole keys, 2..64 of them, or
 * none (the entry deleted). The record itself need not be there yet: a
 * writer puts the variants beside the record in one batch. */
sd_status sd_shard_put_variants(sd_shard *s, const void *key, size_t klen, const uint8_t *refs, size_t n,
                                sd_error *err)
{
    sd_status st = check_writer(s, klen, err);
    if (st) return st;
    if (n > SD_SHARD_MAX_VARIANTS)
        return sd_err_set(err, SD_EINVAL, "%zu caption variants (at most %d)", n, SD_SHARD_MAX_VARIANTS);
    if (n <= 1) return run_op(s, OP_DEL_VARIANTS, key, klen, NULL, 0, err);
    return run_op(s, OP_PUT_VARIANTS, key, klen, refs, n * SD_SHARD_TEXT_KEY, err);
}

/* A key's value in the writer's view (the open batch, else the last
 * commit): *found, and with out a copy of the value appended to it (cleared
 * first). */
static sd_status lookup_in(sd_shard *s, int db, const void *key, size_t klen, sd_buf *out, int *found, sd_error *err)
{
    *found = 0;
    if (out) sd_buf_clear(out);
    if (klen == 0 || klen > SD_SHARD_MAX_KEY) return sd_err_set(err, SD_EINVAL, "key length %zu not in 1..511", klen);
    sd_status refused = sd_shard_refuse_damaged(s, err);
    if (refused) return refused;
    MDB_txn *txn = s->wtxn;
    int rc = txn ? 0 : sd_shard_txn_begin_ro(s, &txn);
    if (rc) return sd_shard_mdb_err(err, rc, "begin", s);
    MDB_val k = {klen, (void *)key}, v;
    rc = mdb_get(txn, s->dbi[db], &k, &v);
    if (rc == 0 && out) sd_buf_put(out, v.mv_data, v.mv_size);
    if (txn != s->wtxn) mdb_txn_abort(txn);
    if (rc && rc != MDB_NOTFOUND) return sd_shard_mdb_err(err, rc, "get", s);
    if (out && out->oom) return sd_err_set(err, SD_ENOMEM, "out of memory");
    *found = rc == 0;
    return SD_OK;
}

/* Existence in the writer's view: the open batch, else the last commit. */
static sd_status exists_in(sd_shard *s, int db, const void *key, size_t klen, int *found, sd_error *err)
{
    return lookup_in(s, db, key, klen, NULL, found, err);
}

/* A copy of a latent record's stored value, the open batch's puts
 * included, appended to out (cleared first); *found 0 when absent. For a
 * writer that must tell a record it wrote before (a resumed run) from
 * another one stored under the same name. */
sd_status sd_shard_peek(sd_shard *s, const void *key, size_t klen, sd_buf *out, int *found, sd_error *err)
{
    return lookup_in(s, SD_SHARD_DB_LATENTS, key, klen, out, found, err);
}

/* A missing record is reported (SD_ENOTFOUND) before anything is logged. */
sd_status sd_shard_del(sd_shard *s, const void *key, size_t klen, sd_error *err)
{
    sd_status st = check_writer(s, klen, err);
    int found;
    if (!st) st = exists_in(s, SD_SHARD_DB_LATENTS, key, klen, &found, err);
    if (st) return st;
    if (!found) return sd_err_set(err, SD_ENOTFOUND, "no such record");
    return run_op(s, OP_DEL, key, klen, NULL, 0, err);
}

/* As sd_shard_del, for a text-embedding record. */
sd_status sd_shard_del_text(sd_shard *s, const uint8_t hash[16], sd_error *err)
{
    sd_status st = check_writer(s, SD_SHARD_TEXT_KEY, err);
    int found;
    if (!st) st = exists_in(s, SD_SHARD_DB_TEXT, hash, SD_SHARD_TEXT_KEY, &found, err);
    if (st) return st;
    if (!found) return sd_err_set(err, SD_ENOTFOUND, "no such text record");
    return run_op(s, OP_DEL_TEXT, hash, SD_SHARD_TEXT_KEY, NULL, 0, err);
}

/* Meta entries go through the log like records, so that a replay after map growth keeps them. */
sd_status sd_shard_meta_set(sd_shard *s, const char *key, const char *value, sd_error *err)
{
    size_t klen = strlen(key);
    sd_status st = check_writer(s, klen, err);
    if (st) return st;
    return run_op(s, OP_META, key, klen, value, strlen(value), err);
}

/* sd-verify --repair's index rebuild, logged as one operation like the others. */
sd_status sd_shard_reindex(sd_shard *s, sd_error *err)
{
    if (s->flags & SD_SHARD_RDONLY) return sd_err_set(err, SD_EINVAL, "%s: opened read-only", s->path);
    return run_op(s, OP_REINDEX, NULL, 0, NULL, 0, err);
}

/* Whether a latent record is stored or put in the open batch: a resumed writer skips it. */
sd_status sd_shard_exists(sd_shard *s, const void *key, size_t klen, int *found, sd_error *err)
{
    return exists_in(s, SD_SHARD_DB_LATENTS, key, klen, found, err);
}

/* Whether a text embedding is there, so that a caption already encoded or copied is not done again. */
sd_status sd_shard_text_exists(sd_shard *s, const uint8_t hash[16], int *found, sd_error *err)
{
    return exists_in(s, SD_SHARD_DB_TEXT, hash, SD_SHARD_TEXT_KEY, found, err);
}

/* Whether a record name is taken, for sd-pack's copies and imports that go by name. */
sd_status sd_shard_name_exists(sd_shard *s, const char *name, size_t nlen, int *found, sd_error *err)
{
    return exists_in(s, SD_SHARD_DB_NAMES, name, nlen, found, err);
}
