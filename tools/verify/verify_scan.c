/* sd-verify: the parallel scan of one database, in key ranges of STRIDE
 * records, each worker with its own read transaction. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"

enum { STRIDE = 256 };

/* Keys that start each chunk of STRIDE records of one database. */
typedef struct {
    uint8_t **key;
    size_t *klen;
    size_t n;
} bounds;

typedef struct {
    sd_shard *s;
    int db;
    bounds b;
    problem_list *per_chunk;
    sd_status *chunk_st;
    sd_error *chunk_err;
    _Atomic uint64_t records, bytes, done_all;
    sd_progress *prog;
    uint64_t prog_base;
} scan;

/* Worker: each chunk of its slice, in its own read transaction. */
static void scan_fn(void *ctx, int worker, size_t begin, size_t end)
{
    scan *sc = ctx;
    sd_shard_txn *t = NULL;
    sd_error err;
    for (size_t c = begin; c < end; c++) {
        sd_status st = t ? sd_shard_read_renew(t, &err) : sd_shard_read_begin(sc->s, &t, &err);
        sd_shard_cursor *cur = NULL;
        if (!st) st = sd_shard_cursor_open(t, sc->db, &cur, &err);
        if (!st) st = sd_shard_cursor_seek(cur, sc->b.key[c], sc->b.klen[c], &err);
        uint64_t nrec = 0, nbytes = 0;
        while (!st) {
            const void *k, *v;
            size_t kl, vl;
            st = sd_shard_cursor_next(cur, &k, &kl, &v, &vl, &err);
            if (st) break;
            if (c + 1 < sc->b.n && kl == sc->b.klen[c + 1] && memcmp(k, sc->b.key[c + 1], kl) == 0) break;
            verify_check_record(t, sc->db, k, kl, v, vl, &sc->per_chunk[c]);
            nrec++;
            nbytes += vl;
        }
        if (st == SD_ENOTFOUND) st = SD_OK;
        sd_shard_cursor_close(cur);
        if (t) sd_shard_read_reset(t);
        sc->chunk_st[c] = st;
        if (st) sc->chunk_err[c] = err;
        atomic_fetch_add(&sc->records, nrec);
        atomic_fetch_add(&sc->bytes, nbytes);
        uint64_t done = atomic_fetch_add(&sc->done_all, nrec) + nrec;
        if (worker == 0 && sc->prog) sd_progress_update(sc->prog, sc->prog_base + done, 0);
    }
    sd_shard_read_end(t);
}

/* Release the sampled keys (a zeroed bounds is fine). */
static void free_bounds(bounds *b)
{
    for (size_t i = 0; i < b->n; i++) free(b->key[i]);
    free(b->key);
    free(b->klen);
    memset(b, 0, sizeof *b);
}

/* First key of every STRIDE records: a key-only pass (values of big records
 * live on overflow pages that this does not touch). */
static sd_status make_bounds(sd_shard *s, int db, bounds *b, sd_error *err)
{
    memset(b, 0, sizeof *b);
    sd_shard_txn *t;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    sd_shard_cursor *c;
    if ((st = sd_shard_cursor_open(t, db, &c, err))) {
        sd_shard_read_end(t);
        return st;
    }
    size_t cap = 0;
    uint64_t i = 0;
    const void *k, *v;
    size_t kl, vl;
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        if (i++ % STRIDE) continue;
        if (b->n == cap) {
            cap = cap ? cap * 2 : 64;
            uint8_t **nk = realloc(b->key, cap * sizeof *nk);
            if (nk) b->key = nk;
            size_t *nl = realloc(b->klen, cap * sizeof *nl);
            if (nl) b->klen = nl;
            if (!nk || !nl) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        }
        if (!st && !(b->key[b->n] = malloc(kl))) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        if (!st) {
            memcpy(b->key[b->n], k, kl);
            b->klen[b->n++] = kl;
        }
    }
    sd_shard_cursor_close(c);
    sd_shard_read_end(t);
    if (st == SD_ENOTFOUND) return SD_OK;
    free_bounds(b); /* a cursor or memory failure part way: the caller gets nothing to free */
    return st;
}

/* Check every record of one database in parallel; problems in key order. */
sd_status verify_scan_db(sd_shard *s, int db, sd_pool *pool, sd_progress *prog, uint64_t prog_base, problem_list *out,
                         uint64_t *nrec, uint64_t *nbytes, sd_error *err)
{
    scan sc;
    memset(&sc, 0, sizeof sc);
    sc.s = s;
    sc.db = db;
    sc.prog = prog;
    sc.prog_base = prog_base;
    sd_status st = make_bounds(s, db, &sc.b, err);
    if (st) return st;
    size_t n = sc.b.n;
    sc.per_chunk = calloc(n ? n : 1, sizeof *sc.per_chunk);
    sc.chunk_st = calloc(n ? n : 1, sizeof *sc.chunk_st);
    sc.chunk_err = calloc(n ? n : 1, sizeof *sc.chunk_err);
    if (!sc.per_chunk || !sc.chunk_st || !sc.chunk_err) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    if (!st && n) sd_pool_for(pool, n, scan_fn, &sc);
    for (size_t c = 0; !st && c < n; c++)
        if (sc.chunk_st[c]) {
            *err = sc.chunk_err[c];
            st = sc.chunk_st[c];
        }
    for (size_t c = 0; sc.per_chunk && c < n; c++) {
        problem_list *l = &sc.per_chunk[c];
        for (size_t i = 0; i < l->n; i++) {
            if (out->n == out->cap) {
                size_t nc = out->cap ? out->cap * 2 : 64;
                problem *nv = realloc(out->v, nc * sizeof *nv);
                if (!nv) {
                    free(l->v[i].key);
                    free(l->v[i].name);
                    continue;
                }
                out->v = nv;
                out->cap = nc;
            }
            out->v[out->n++] = l->v[i];
        }
        free(l->v);
    }
    *nrec = sc.records;
    *nbytes = sc.bytes;
    free(sc.per_chunk);
    free(sc.chunk_st);
    free(sc.chunk_err);
    free_bounds(&sc.b);
    return st;
}
