/* sd-verify: check every record of one or more shards (header, checksum,
 * shape vs bucket, NaN/Inf, text references, bucket index, names, two
 * records of one name, the empty caption's embedding, and optionally a
 * manifest), report problems by kind, and with --repair delete the bad
 * records so the next writer run recomputes exactly those, then rebuild the
 * indexes (index problems alone never cost a record; a record of a newer
 * format version is never deleted). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "cli.h"
#include "err.h"
#include "json.h"
#include "lines.h"
#include "log.h"
#include "outfile.h"
#include "pool.h"
#include "progress.h"
#include "shard.h"
#include "tally.h"

enum { STRIDE = 256, MAX_ROUNDS = 3, DB_PAGES = -2 /* problem.db of damaged_page */ };

typedef struct {
    const char *manifest, *report;
    long threads, examples;
    int repair, quiet, verbose;
} options;

/* One problem found: what, which record, and whether deleting it repairs it. */
typedef struct {
    const char *reason;
    int db; /* SD_SHARD_DB_LATENTS, _TEXT: --repair deletes the record (unless report_only);
             * SD_SHARD_DB_META: a meta entry (report only); -1: an index, name or manifest
             * problem (the reindex fixes the indexes, the record stays); DB_PAGES: damaged
             * pages (the salvage replaces the file) */
    uint8_t *key;
    size_t klen;
    char *name;
    char detail[200];
} problem;

typedef struct {
    problem *v;
    size_t n, cap;
} problem_list;

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

/* Per-shard results. */
typedef struct {
    const char *path;
    int opened;
    char open_error[256];
    uint64_t latents, texts, bytes;
    double seconds;
    sd_tally tally;
    problem_list probs;
    uint64_t repaired_latents, repaired_texts;
    int reindexed;
    uint64_t after_repair; /* problems left after --repair */
    int salvaged;          /* damaged pages: --repair replaced the file with the intact entries */
    sd_shard_salvage_counts salvage;
    sd_buf examples;       /* JSON array items: the first few problems of each kind */
} shard_result;

/* Append a problem; a failed allocation drops it but keeps the count right
 * through the tally. */
static void add_problem(problem_list *l, const char *reason, int db, const void *key, size_t klen, const char *name,
                        size_t nlen, const char *fmt, const char *detail)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        problem *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return;
        l->v = nv;
        l->cap = nc;
    }
    problem *p = &l->v[l->n++];
    memset(p, 0, sizeof *p);
    p->reason = reason;
    p->db = db;
    if (klen && (p->key = malloc(klen))) {
        memcpy(p->key, key, klen);
        p->klen = klen;
    }
    if (name && (p->name = malloc(nlen + 1))) {
        memcpy(p->name, name, nlen);
        p->name[nlen] = 0;
    }
    snprintf(p->detail, sizeof p->detail, fmt, detail);
}

static void free_problems(problem_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].key);
        free(l->v[i].name);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Printable key: hex for binary keys, the text itself when printable. */
static void key_str(const uint8_t *k, size_t n, char *out, size_t cap)
{
    int text = n > 0;
    for (size_t i = 0; i < n; i++)
        if (k[i] < 0x20 || k[i] > 0x7e || k[i] == '"' || k[i] == '\\') text = 0;
    size_t o = 0;
    if (text) {
        for (size_t i = 0; i < n && o + 1 < cap; i++) out[o++] = (char)k[i];
    } else {
        for (size_t i = 0; i < n && o + 2 < cap; i++) o += (size_t)snprintf(out + o, cap - o, "%02x", k[i]);
    }
    out[o < cap ? o : cap - 1] = 0;
}

/* Any NaN or Inf among n values of dtype at p (exponent bits all ones). */
static int has_nonfinite(const void *p, size_t bytes, int dtype)
{
    const uint8_t *b = p;
    unsigned bad = 0;
    if (dtype == SD_DT_F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            uint32_t x;
            memcpy(&x, b + i, 4);
            bad |= (x & 0x7f800000u) == 0x7f800000u;
        }
    } else {
        uint16_t m = dtype == SD_DT_F16 ? 0x7c00 : 0x7f80;
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            uint16_t x;
            memcpy(&x, b + i, 2);
            bad |= (x & m) == m;
        }
    }
    return bad != 0;
}

/* Latent shape must be C x bucket_h/8 x bucket_w/8 with C = 4 or 16. */
static int shape_ok(const sd_shard_rec *r)
{
    const sd_shard_tensor *t = &r->t[0];
    return t->ndim == 3 && (t->shape[0] == 4 || t->shape[0] == 16) && r->bucket_w % 8 == 0 && r->bucket_h % 8 == 0 &&
           t->shape[1] == r->bucket_h / 8 && t->shape[2] == r->bucket_w / 8;
}

/* 1 when the record stored under key is a sound latent record (header,
 * payload checksum) with the given name in its header: only then may a
 * second copy of the name be deleted, or a damaged indexed copy would take
 * the intact one with it. */
static int record_named(sd_shard_txn *t, const void *key, size_t klen, const char *name, size_t nlen)
{
    const void *v;
    size_t vl;
    sd_shard_rec r;
    sd_error e;
    return sd_shard_get(t, key, klen, &v, &vl, &e) == SD_OK && sd_shard_rec_parse(v, vl, &r, &e) == SD_OK &&
           sd_shard_rec_check_payload(&r, &e) == SD_OK && r.kind == SD_REC_LATENT && r.name_len == nlen &&
           memcmp(r.name, name, nlen) == 0;
}

/* The names index must lead to a sound latent record's own name: a missing
 * entry is an index problem (the reindex adds it); an entry leading to
 * another record with the same name means the image is stored twice, and
 * this copy, which no name finds, is the one --repair deletes. */
static void check_name(sd_shard_txn *t, const void *key, size_t klen, const char *name, size_t nlen, problem_list *l)
{
    const void *nk;
    size_t nkl;
    sd_error e;
    if (!nlen) return;
    sd_status st = sd_shard_get_name(t, name, nlen, &nk, &nkl, &e);
    if (st == SD_ENOTFOUND)
        add_problem(l, "name_missing", -1, key, klen, name, nlen, "%s", "record name not in the names index");
    else if (st == SD_OK && (nkl != klen || memcmp(nk, key, klen))) {
        if (record_named(t, nk, nkl, name, nlen))
            add_problem(l, "duplicate_name", SD_SHARD_DB_LATENTS, key, klen, name, nlen, "%s",
                        "a second record of this name; the names index leads to the other one");
        else /* the indexed copy is damaged or gone: the reindex points the name here */
            add_problem(l, "name_misindexed", -1, key, klen, name, nlen, "%s",
                        "the names index leads to a damaged or other record; this sound one takes the name");
    }
}

/* Every check of one record; problems go to l. */
static void check_record(sd_shard_txn *t, int db, const void *key, size_t klen, const void *val, size_t vlen,
                         problem_list *l)
{
    sd_shard_rec r;
    sd_error e;
    sd_status st = sd_shard_rec_parse(val, vlen, &r, &e);
    if (st) {
        /* a damaged version field is a bad header (the parser tells it from a newer record) */
        const char *why = st == SD_ETRUNC ? "truncated" : st == SD_EUNSUPPORTED ? "newer_version" : "bad_header";
        add_problem(l, why, db, key, klen, NULL, 0, "%s", e.msg);
        return;
    }
    const char *name = r.name;
    size_t nlen = r.name_len;
    int want = db == SD_SHARD_DB_TEXT ? SD_REC_TEXT : SD_REC_LATENT;
    if (r.kind != want) {
        add_problem(l, "wrong_kind", db, key, klen, name, nlen, "record kind %s", r.kind == SD_REC_TEXT ? "text" : "latent");
        return;
    }
    if (db == SD_SHARD_DB_TEXT && klen != SD_SHARD_TEXT_KEY) {
        add_problem(l, "bad_key", db, key, klen, name, nlen, "%s", "text key is not 16 bytes");
        return;
    }
    if (sd_shard_rec_check_payload(&r, &e)) {
        add_problem(l, "bad_checksum", db, key, klen, name, nlen, "%s", e.msg);
        return;
    }
    for (int i = 0; i < r.ntensors; i++)
        if (has_nonfinite(r.t[i].data, r.t[i].length, r.t[i].dtype)) {
            add_problem(l, "nan_inf", db, key, klen, name, nlen, "%s", "tensor holds NaN or Inf");
            return;
        }
    if (db == SD_SHARD_DB_TEXT) return;
    if (!shape_ok(&r)) {
        char d[96];
        snprintf(d, sizeof d, "shape %ux%ux%u vs bucket %ux%u", r.t[0].shape[0], r.t[0].shape[1], r.t[0].shape[2],
                 r.bucket_w, r.bucket_h);
        add_problem(l, "shape_mismatch", db, key, klen, name, nlen, "%s", d);
        return;
    }
    static const uint8_t zero[16];
    const void *tv;
    size_t tl;
    if (memcmp(r.text_ref, zero, 16) && sd_shard_get_text(t, r.text_ref, &tv, &tl, &e)) {
        add_problem(l, "text_ref_missing", db, key, klen, name, nlen, "%s", "referenced text embedding not in shard");
        return;
    }
    /* the record is sound from here on: what is left are index problems,
     * which the reindex of --repair fixes without touching the record */
    int found = 0;
    if (sd_shard_index_has(t, r.bucket_w, r.bucket_h, key, klen, &found, &e) == SD_OK && !found)
        add_problem(l, "index_missing", -1, key, klen, name, nlen, "%s", "record not in its bucket index");
    check_name(t, key, klen, name, nlen, l);
}

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
            check_record(t, sc->db, k, kl, v, vl, &sc->per_chunk[c]);
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
static sd_status scan_db(sd_shard *s, int db, sd_pool *pool, sd_progress *prog, uint64_t prog_base, problem_list *out,
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

/* 1 when the stored record val (header readable) carries another name than
 * name, quoted into out: a names entry leading there would hand another
 * image's data out under this name. An unreadable record is reported by the
 * record scan, not here. */
static int other_name(const void *val, size_t vlen, const void *name, size_t nlen, char *out, size_t cap)
{
    sd_shard_rec r;
    sd_error e;
    if (sd_shard_rec_parse(val, vlen, &r, &e) != SD_OK) return 0;
    if (r.name_len == nlen && memcmp(r.name, name, nlen) == 0) return 0;
    char q[160];
    key_str((const uint8_t *)r.name, r.name_len, q, sizeof q);
    snprintf(out, cap, r.name_len ? "'%s'" : "%s", r.name_len ? q : "(no name)");
    return 1;
}

/* The index side: every bindex entry points to a record of that bucket,
 * bucket counts match bindex, every name points to a record of that name. */
static sd_status check_indexes(sd_shard *s, problem_list *out, sd_error *err)
{
    sd_shard_txn *t;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    sd_shard_bucket *bk = NULL;
    size_t nb = 0;
    if ((st = sd_shard_buckets(t, &bk, &nb, err))) goto done;
    uint64_t *seen = calloc(nb ? nb : 1, sizeof *seen);
    if (!seen) {
        st = sd_err_set(err, SD_ENOMEM, "out of memory");
        goto done;
    }
    sd_shard_cursor *c;
    if ((st = sd_shard_cursor_open(t, SD_SHARD_DB_BINDEX, &c, err))) {
        free(seen);
        goto done;
    }
    const void *k, *v, *rv;
    size_t kl, vl, rl;
    while ((st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        uint32_t w = 0, h = 0;
        if (kl == 8) sd_shard_bucket_unkey(k, &w, &h);
        size_t i = 0;
        while (i < nb && !(bk[i].w == w && bk[i].h == h)) i++;
        if (i < nb) seen[i]++;
        else add_problem(out, "bucket_count", -1, k, kl, NULL, 0, "%s", "bucket in bindex but not in buckets");
        sd_shard_rec r;
        sd_error e;
        if (sd_shard_get(t, v, vl, &rv, &rl, &e) == SD_ENOTFOUND)
            add_problem(out, "index_dangling", -1, v, vl, NULL, 0, "%s", "bucket index names a missing record");
        else if (sd_shard_rec_parse(rv, rl, &r, &e) == SD_OK && (r.bucket_w != w || r.bucket_h != h))
            add_problem(out, "index_wrong_bucket", -1, v, vl, r.name, r.name_len, "%s", "record indexed under another bucket");
    }
    sd_shard_cursor_close(c);
    for (size_t i = 0; i < nb; i++)
        if (seen[i] != bk[i].count) {
            char d[96];
            snprintf(d, sizeof d, "bucket %ux%u: count %llu, index holds %llu", bk[i].w, bk[i].h,
                     (unsigned long long)bk[i].count, (unsigned long long)seen[i]);
            add_problem(out, "bucket_count", -1, NULL, 0, NULL, 0, "%s", d);
        }
    free(seen);
    if (st != SD_ENOTFOUND) goto done;
    if ((st = sd_shard_cursor_open(t, SD_SHARD_DB_NAMES, &c, err))) goto done;
    while ((st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_error e;
        char other[200];
        sd_status g = sd_shard_get(t, v, vl, &rv, &rl, &e);
        if (g == SD_ENOTFOUND)
            add_problem(out, "name_dangling", -1, v, vl, k, kl, "%s", "name points to a missing record");
        else if (g == SD_OK && other_name(rv, rl, k, kl, other, sizeof other))
            add_problem(out, "name_wrong_record", -1, v, vl, k, kl, "name points to a record named %s", other);
    }
    sd_shard_cursor_close(c);
done:
    free(bk);
    sd_shard_read_end(t);
    return st == SD_ENOTFOUND ? SD_OK : st;
}

/* Whether the empty_text meta value v names no text embedding the shard
 * holds (*missing, with the reason in d): malformed, or not stored. */
static sd_status empty_text_gone(sd_shard *s, const char *v, char *d, size_t cap, int *missing, sd_error *err)
{
    uint8_t key[16];
    *missing = 1;
    if (!sd_shard_text_key_parse(v, key)) {
        snprintf(d, cap, "'%.64s' is not a 32-hex-digit text key", v);
        return SD_OK;
    }
    sd_shard_txn *t;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    const void *tv;
    size_t tl;
    st = sd_shard_get_text(t, key, &tv, &tl, err);
    sd_shard_read_end(t);
    if (st == SD_ENOTFOUND) {
        char k[40];
        key_str(key, 16, k, sizeof k);
        snprintf(d, cap, "names text embedding %s, which is not in the shard (conditioning dropout needs it)", k);
        return SD_OK;
    }
    *missing = 0;
    return st;
}

/* The empty_text meta must name a text embedding the shard holds: sd-latents
 * stores the empty caption's embedding unreferenced, and sd-train's
 * conditioning dropout skips every sample it picks when it is gone. No
 * record to delete or index to rebuild: --repair leaves it (report only). */
static sd_status check_empty_text(sd_shard *s, problem_list *out, sd_error *err)
{
    static const char meta_key[] = SD_SHARD_META_EMPTY_TEXT;
    char *v = NULL, d[200];
    int missing = 0;
    sd_status st = sd_shard_meta_get(s, meta_key, &v, err);
    if (st == SD_ENOTFOUND) return SD_OK;
    if (!st) st = empty_text_gone(s, v, d, sizeof d, &missing, err);
    free(v);
    if (!st && missing)
        add_problem(out, "empty_text_missing", SD_SHARD_DB_META, meta_key, sizeof meta_key - 1, NULL, 0, "%s", d);
    return st;
}

/* Every `key` of the manifest must be a record name in the shard. */
static sd_status check_manifest(sd_shard *s, const char *path, problem_list *out, sd_error *err)
{
    sd_lines lr;
    sd_status st = sd_lines_open(&lr, path, 4 << 20, err);
    if (st) return st;
    sd_shard_txn *t;
    if ((st = sd_shard_read_begin(s, &t, err))) {
        sd_lines_close(&lr);
        return st;
    }
    sd_arena a;
    sd_arena_init(&a, 1 << 16);
    enum { MAXL = 4096 };
    char **lines = malloc(MAXL * sizeof *lines);
    size_t *lens = malloc(MAXL * sizeof *lens);
    if (!lines || !lens) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    while (!st) {
        char *block;
        size_t len, pos = 0;
        long first;
        if ((st = sd_lines_next(&lr, &block, &len, &first, err)) || len == 0) break;
        while (!st && pos < len) {
            size_t used, n = sd_split_lines(block + pos, len - pos, lines, lens, MAXL, &used);
            for (size_t i = 0; i < n; i++) {
                if (lens[i] == 0) continue;
                sd_json *root;
                sd_error e;
                char where[64];
                snprintf(where, sizeof where, "manifest line %ld", first + (long)i);
                sd_arena_reset(&a);
                const sd_json *key = NULL;
                if (sd_json_parse(&a, lines[i], lens[i], &root, &e) == SD_OK) key = sd_json_get(root, "key");
                if (!key || key->type != SD_JSON_STRING || key->len == 0 || key->len > SD_SHARD_MAX_KEY) {
                    add_problem(out, "manifest_bad_line", -1, NULL, 0, NULL, 0, "%s: no usable \"key\"", where);
                    continue;
                }
                const void *rk, *rv;
                size_t rkl, rl;
                char other[200], d[320];
                sd_status g = sd_shard_get_name(t, key->str, key->len, &rk, &rkl, &e);
                if (g == SD_ENOTFOUND)
                    add_problem(out, "manifest_missing", -1, NULL, 0, key->str, key->len, "%s: not in shard", where);
                else if (g == SD_OK && sd_shard_get(t, rk, rkl, &rv, &rl, &e) == SD_OK &&
                         other_name(rv, rl, key->str, key->len, other, sizeof other)) {
                    snprintf(d, sizeof d, "%s: the names index leads to a record named %s", where, other);
                    add_problem(out, "manifest_wrong_record", -1, rk, rkl, key->str, key->len, "%s", d);
                }
            }
            first += (long)n;
            pos += used;
        }
    }
    free(lines);
    free(lens);
    sd_arena_free(&a);
    sd_shard_read_end(t);
    sd_lines_close(&lr);
    return st;
}

/* One full verification pass over an open shard. */
static sd_status verify_pass(sd_shard *s, const options *o, sd_pool *pool, int show, shard_result *res, sd_error *err)
{
    double t0 = sd_now();
    free_problems(&res->probs);
    sd_shard_txn *t;
    uint64_t nl = 0, nt = 0;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    sd_shard_count(t, SD_SHARD_DB_LATENTS, &nl, err);
    sd_shard_count(t, SD_SHARD_DB_TEXT, &nt, err);
    sd_shard_read_end(t);
    sd_progress prog;
    sd_progress_init(&prog, "sd-verify", "records", nl + nt, show && !o->quiet);
    uint64_t b1 = 0, b2 = 0;
    st = scan_db(s, SD_SHARD_DB_LATENTS, pool, &prog, 0, &res->probs, &res->latents, &b1, err);
    if (!st) st = scan_db(s, SD_SHARD_DB_TEXT, pool, &prog, res->latents, &res->probs, &res->texts, &b2, err);
    res->bytes = b1 + b2;
    if (!st) st = check_indexes(s, &res->probs, err);
    if (!st) st = check_empty_text(s, &res->probs, err);
    if (!st && o->manifest) st = check_manifest(s, o->manifest, &res->probs, err);
    sd_progress_update(&prog, res->latents + res->texts, 0);
    sd_progress_finish(&prog);
    res->seconds = sd_now() - t0;
    return st;
}

/* Problems --repair leaves as they are: a record of a newer format version
 * (sound for the sdtk that wrote it: deleting it would lose its data) and an
 * empty_text naming a missing embedding (nothing to delete or rebuild). */
static int report_only(const problem *p)
{
    return strcmp(p->reason, "newer_version") == 0 || strcmp(p->reason, "empty_text_missing") == 0;
}

/* 1 when --repair can do something about one of the problems. */
static int any_repairable(const problem_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (!report_only(&l->v[i])) return 1;
    return 0;
}

/* Delete the bad records, rebuild the index; 0 problems means nothing to do. */
static sd_status repair(sd_shard *s, shard_result *res, sd_error *err)
{
    sd_status st = sd_shard_begin(s, err);
    if (st) return st;
    for (size_t i = 0; !st && i < res->probs.n; i++) {
        problem *p = &res->probs.v[i];
        if (report_only(p)) continue;
        if (p->db == SD_SHARD_DB_LATENTS && p->key) {
            st = sd_shard_del(s, p->key, p->klen, err);
            if (!st) res->repaired_latents++;
        } else if (p->db == SD_SHARD_DB_TEXT && p->key && p->klen == SD_SHARD_TEXT_KEY) {
            st = sd_shard_del_text(s, p->key, err);
            if (!st) res->repaired_texts++;
        }
        if (st == SD_ENOTFOUND) st = SD_OK;
    }
    if (!st) st = sd_shard_reindex(s, err);
    if (!st) st = sd_shard_commit(s, err);
    else sd_shard_abort(s);
    res->reindexed = !st;
    return st;
}

/* Where a problem is, for its message: "text key K name N", only the parts
 * it has (empty for a bucket count, say). */
static void problem_where(const problem *p, const char *k, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s", p->db == SD_SHARD_DB_TEXT ? "text" : p->db == SD_SHARD_DB_META ? "meta" : "");
    if (p->key && n >= 0 && (size_t)n < cap) n += snprintf(out + n, cap - (size_t)n, "%skey %s", n ? " " : "", k);
    if (p->name && p->name[0] && n >= 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, "%sname %s", n ? " " : "", p->name);
}

/* Count problems into the tally, printing the first few of each kind. */
static void tally_problems(shard_result *res)
{
    for (size_t i = 0; i < res->probs.n; i++) {
        problem *p = &res->probs.v[i];
        char k[80], where[400];
        key_str(p->key, p->klen, k, sizeof k);
        problem_where(p, k, where, sizeof where);
        sd_skip(&res->tally, p->reason, "%s: %s%s%s", res->path, where, where[0] ? ": " : "", p->detail);
        if (res->tally.show_limit >= 0 && sd_tally_count(&res->tally, p->reason) > (uint64_t)res->tally.show_limit)
            continue;
        sd_buf *b = &res->examples;
        int first = 1;
        sd_buf_puts(b, b->len ? ",{" : "{");
        sd_buf_json_key(b, &first, "kind");
        sd_buf_json_cstr(b, p->reason);
        sd_buf_json_key(b, &first, "db");
        sd_buf_json_cstr(b, p->db == SD_SHARD_DB_TEXT      ? "text"
                            : p->db == SD_SHARD_DB_LATENTS ? "latents"
                            : p->db == SD_SHARD_DB_META    ? "meta"
                            : p->db == DB_PAGES            ? "pages"
                                                           : "index");
        if (p->key) {
            sd_buf_json_key(b, &first, "key");
            sd_buf_json_cstr(b, k);
        }
        if (p->name && p->name[0]) {
            sd_buf_json_key(b, &first, "name");
            sd_buf_json_cstr(b, p->name);
        }
        sd_buf_json_key(b, &first, "detail");
        sd_buf_json_cstr(b, p->detail);
        sd_buf_puts(b, "}");
    }
}

/* The pages under the records (sd_shard_check_pages, deep): damage is one
 * problem naming the first damaged place; with --repair the file is
 * replaced by the entries of its intact pages (sd_shard_salvage), since
 * LMDB can neither read nor safely write it. */
static sd_status check_pages(sd_shard **s, const options *o, shard_result *res, problem *found, sd_error *err)
{
    sd_shard_pages pages;
    sd_status st = sd_shard_check_pages(*s, 1, NULL, NULL, &pages, err);
    if (st || !pages.damage) return st;
    memset(found, 0, sizeof *found);
    found->reason = "damaged_page";
    found->db = DB_PAGES;
    const char *plural = pages.damage == 1 ? "" : "s";
    snprintf(found->detail, sizeof found->detail, "%llu damaged place%s; first: %.140s",
             (unsigned long long)pages.damage, plural, pages.first);
    sd_log(o->repair ? SD_LOG_WARN : SD_LOG_ERROR, "%s: damaged pages: %s (%llu damaged place%s)%s%s", res->path,
           pages.first, (unsigned long long)pages.damage, plural,
           sd_shard_damaged(*s) ? ", so its records cannot be read" : "",
           o->repair ? "" : "; sd-verify --repair copies the records of its intact pages into a new file");
    if (!o->repair) return SD_OK;
    st = sd_shard_salvage(s, &res->salvage, err);
    if (st && *s) { /* refused, nothing changed: the problem stays, nothing else is repaired */
        sd_log(SD_LOG_ERROR, "%s", err->msg);
        return SD_OK;
    }
    if (st) return st;
    res->salvaged = 1;
    const sd_shard_salvage_counts *c = &res->salvage;
    char older[160] = "";
    if (c->older)
        snprintf(older, sizeof older, "; %llu of these entries %s", (unsigned long long)c->from_older,
                 c->older_only ? "from the snapshot before the newest alone (the newest one's directory is damaged)"
                               : "only in the snapshot before the newest");
    sd_log(SD_LOG_WARN, "%s: replaced by a new file holding the %llu latent records (of %llu its header counted), "
           "%llu text records and %llu meta entries of its intact pages (%llu entries dropped%s); the damaged file "
           "is kept as %s (remove it when done); rerun sd-latents to compute the missing records again", res->path,
           (unsigned long long)c->latents, (unsigned long long)pages.records, (unsigned long long)c->texts,
           (unsigned long long)c->meta, (unsigned long long)c->dropped, older, c->kept);
    return SD_OK;
}

/* Add the damaged-page problem to the shard's list (after a verify pass,
 * which starts the list afresh). */
static void add_found(shard_result *res, const problem *found)
{
    if (!found->reason) return;
    add_problem(&res->probs, found->reason, found->db, NULL, 0, NULL, 0, "%s", found->detail);
}

/* Open, verify, optionally repair (re-verifying until clean or MAX_ROUNDS). */
static void verify_shard(const char *path, const options *o, sd_pool *pool, shard_result *res)
{
    sd_error err;
    sd_shard *s;
    sd_shard_opts so = {(o->repair ? 0 : SD_SHARD_RDONLY) | SD_SHARD_KEEP_DAMAGED, 0, 0};
    res->path = path;
    sd_buf_init(&res->examples);
    sd_tally_init(&res->tally, o->verbose ? -1 : (int)o->examples);
    res->tally.verb = "problem";
    sd_status st = sd_shard_open(&s, path, &so, &err);
    if (st) {
        snprintf(res->open_error, sizeof res->open_error, "%s", err.msg);
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return;
    }
    res->opened = 1;
    problem found = {0};
    st = check_pages(&s, o, res, &found, &err);
    if (!st && !sd_shard_damaged(s)) st = verify_pass(s, o, pool, 1, res, &err);
    if (!st) add_found(res, &found);
    if (!st) tally_problems(res);
    if (!st && res->salvaged) res->probs.n--; /* repaired by the salvage: not for the rounds below */
    int writable = !found.reason || res->salvaged; /* never write into a file with damaged pages */
    for (int round = 0; !st && writable && o->repair && any_repairable(&res->probs) && round < MAX_ROUNDS; round++) {
        st = repair(s, res, &err);
        shard_result again;
        memset(&again, 0, sizeof again);
        if (!st) st = verify_pass(s, o, pool, 0, &again, &err);
        free_problems(&res->probs);
        res->probs = again.probs;
    }
    if (!st && o->repair) res->after_repair = res->probs.n;
    if (st) {
        snprintf(res->open_error, sizeof res->open_error, "%s", err.msg);
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        res->opened = 0;
    }
    sd_shard_close(s, &err);
}

/* The JSON report: per shard counts, problems by kind, examples. */
static void build_report(const shard_result *rs, int n, const options *o, sd_buf *b)
{
    sd_buf_puts(b, "{\"shards\":[");
    for (int i = 0; i < n; i++) {
        const shard_result *r = &rs[i];
        int first = 1;
        sd_buf_puts(b, i ? ",{" : "{");
        sd_buf_json_key(b, &first, "path");
        sd_buf_json_cstr(b, r->path);
        sd_buf_json_key(b, &first, "opened");
        sd_buf_puts(b, r->opened ? "true" : "false");
        if (r->open_error[0]) {
            sd_buf_json_key(b, &first, "error");
            sd_buf_json_cstr(b, r->open_error);
        }
        sd_buf_json_key(b, &first, "records");
        sd_buf_json_int(b, (int64_t)r->latents);
        sd_buf_json_key(b, &first, "text_records");
        sd_buf_json_int(b, (int64_t)r->texts);
        sd_buf_json_key(b, &first, "bytes");
        sd_buf_json_int(b, (int64_t)r->bytes);
        sd_buf_json_key(b, &first, "seconds");
        sd_buf_json_num(b, r->seconds);
        sd_buf_json_key(b, &first, "problems");
        sd_buf_json_int(b, (int64_t)r->tally.total);
        sd_buf_json_key(b, &first, "by_kind");
        sd_tally_json(&r->tally, b);
        sd_buf_json_key(b, &first, "examples");
        sd_buf_puts(b, "[");
        if (r->examples.len) sd_buf_put(b, r->examples.data, r->examples.len);
        sd_buf_puts(b, "]");
        if (o->repair) {
            sd_buf_json_key(b, &first, "repaired_records");
            sd_buf_json_int(b, (int64_t)r->repaired_latents);
            sd_buf_json_key(b, &first, "repaired_text_records");
            sd_buf_json_int(b, (int64_t)r->repaired_texts);
            sd_buf_json_key(b, &first, "problems_after_repair");
            sd_buf_json_int(b, (int64_t)r->after_repair);
            if (r->salvaged) {
                int f2 = 1;
                sd_buf_json_key(b, &first, "salvaged");
                sd_buf_puts(b, "{");
                sd_buf_json_key(b, &f2, "records");
                sd_buf_json_int(b, (int64_t)r->salvage.latents);
                sd_buf_json_key(b, &f2, "text_records");
                sd_buf_json_int(b, (int64_t)r->salvage.texts);
                sd_buf_json_key(b, &f2, "meta");
                sd_buf_json_int(b, (int64_t)r->salvage.meta);
                sd_buf_json_key(b, &f2, "dropped");
                sd_buf_json_int(b, (int64_t)r->salvage.dropped);
                sd_buf_json_key(b, &f2, "header_records");
                sd_buf_json_int(b, (int64_t)r->salvage.found.records);
                sd_buf_json_key(b, &f2, "older_snapshot");
                sd_buf_puts(b, r->salvage.older ? "true" : "false");
                sd_buf_json_key(b, &f2, "from_older_snapshot");
                sd_buf_json_int(b, (int64_t)r->salvage.from_older);
                sd_buf_json_key(b, &f2, "kept");
                sd_buf_json_cstr(b, r->salvage.kept);
                sd_buf_puts(b, "}");
            }
        }
        sd_buf_puts(b, "}");
    }
    sd_buf_puts(b, "]}\n");
}

int main(int argc, char **argv)
{
    options o = {0};
    o.examples = 10;
    const sd_opt opts[] = {
        {"manifest", 'm', SD_OPT_STR, &o.manifest, "FILE.jsonl", "also require every record name (`key`) of this manifest"},
        {"report", 0, SD_OPT_STR, &o.report, "FILE", "write a JSON report (atomically)"},
        {"repair", 0, SD_OPT_FLAG, &o.repair, NULL,
         "delete bad records and rebuild the indexes (needs write access); see below"},
        {"examples", 0, SD_OPT_INT, &o.examples, "N", "problems shown (and reported) per kind (default 10)"},
        {"threads", 'j', SD_OPT_INT, &o.threads, "N", "worker threads (default: all CPUs)"},
        {"quiet", 'q', SD_OPT_FLAG, &o.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.verbose, NULL, "show every problem"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-verify", "[OPTIONS] SHARD...",
                  "Check every record of each shard: header sanity, payload checksum (XXH3), latent shape vs "
                  "bucket, NaN/Inf, text-embedding references, the bucket index and the names index (and that "
                  "no two records carry one name, and that each name leads to a record of that name), that the "
                  "meta empty_text names a text embedding the shard holds, and with --manifest that every record "
                  "name of a JSONL manifest is present. Problems are counted by kind.",
                  opts,
                  "--repair deletes the records that are bad themselves (bad_header, truncated, bad_checksum, "
                  "nan_inf, shape_mismatch, wrong_kind, text_ref_missing: the record whose text embedding is gone, "
                  "duplicate_name: the copy the names index does not lead to), then rebuilds the bucket index and "
                  "the names index from the records. Index problems (index_missing, name_missing, name_misindexed, "
                  "index_dangling, index_wrong_bucket, name_dangling, name_wrong_record, bucket_count) are fixed by "
                  "that rebuild alone: their records are kept. Two kinds are reported only and never repaired "
                  "(they count as problems left after --repair): newer_version, a record of a newer format version "
                  "(sound for a newer sdtk, so never deleted), and empty_text_missing, a meta empty_text naming a "
                  "text embedding the shard lacks (sd-train's conditioning dropout needs it).\n\n"
                  "Before the records, every page of the file's B-trees is checked (bounds of page headers, nodes "
                  "and overflow runs, pages used twice or both used and free, entry counts): damage there is one "
                  "damaged_page problem, and a file whose pages LMDB cannot read safely is not read. --repair then "
                  "replaces the file with a new one holding every record, text embedding and meta entry of its "
                  "intact pages (the indexes rebuilt), keeping the damaged file as SHARD.damaged (remove it when "
                  "done); the records on damaged pages are missing from the new file, and a rerun of sd-latents "
                  "computes them again. It refuses, leaving the file as it is, when LMDB's directory of databases "
                  "is damaged or the file holds a newer format.\n\n"
                  "Examples:\n"
                  "  sd-verify cache/*.shard --report verify.json\n"
                  "  sd-verify cache/latents.shard --manifest meta.jsonl --repair   # then rerun sd-latents\n",
        "0 every record sound, 1 problems found (also when --repair fixed them), 2 usage error, 3 a "
        "shard cannot be opened or another fatal error."};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) return rc;
    sd_log_setup("sd-verify", o.quiet ? SD_LOG_WARN : o.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    const char *bad = pos.n == 0 ? "no shard given"
                      : o.threads < 0 || o.examples < 0 ? "--threads and --examples must not be negative"
                                                          : NULL;
    if (bad) {
        sd_cli_usage_error(&cli, "%s", bad);
        sd_strlist_free(&pos);
        return SD_EXIT_USAGE;
    }
    sd_pool *pool = sd_pool_create(o.threads > 0 ? (int)o.threads : sd_default_threads());
    shard_result *rs = calloc((size_t)pos.n, sizeof *rs);
    if (!pool || !rs) {
        sd_log(SD_LOG_ERROR, "out of memory");
        return SD_EXIT_FATAL;
    }
    int exit_code = SD_EXIT_OK;
    uint64_t total_problems = 0, total_bytes = 0;
    double t0 = sd_now();
    for (int i = 0; i < pos.n; i++) {
        verify_shard(pos.v[i], &o, pool, &rs[i]);
        if (!rs[i].opened) exit_code = SD_EXIT_FATAL;
        else {
            total_problems += rs[i].tally.total;
            total_bytes += rs[i].bytes;
            sd_tally_log(&rs[i].tally, "problems");
            sd_log(SD_LOG_INFO, "%s: %llu records, %llu text records, %.2f GB in %.2f s (%.2f GB/s): %llu problems%s",
                   rs[i].path, (unsigned long long)rs[i].latents, (unsigned long long)rs[i].texts, rs[i].bytes / 1e9,
                   rs[i].seconds, rs[i].seconds > 0 ? rs[i].bytes / 1e9 / rs[i].seconds : 0.0,
                   (unsigned long long)rs[i].tally.total,
                   o.repair && rs[i].tally.total && !rs[i].after_repair ? " (repaired)" : "");
            if (o.repair && rs[i].after_repair)
                sd_log(SD_LOG_ERROR, "%s: %llu problems remain after repair", rs[i].path,
                       (unsigned long long)rs[i].after_repair);
        }
    }
    if (exit_code == SD_EXIT_OK && total_problems) exit_code = SD_EXIT_SKIPPED;
    if (pos.n > 1)
        sd_log(SD_LOG_INFO, "%d shards, %.2f GB in %.2f s: %llu problems", pos.n, total_bytes / 1e9, sd_now() - t0,
               (unsigned long long)total_problems);
    if (o.report) {
        sd_buf b;
        sd_buf_init(&b);
        build_report(rs, pos.n, &o, &b);
        sd_error err;
        if (b.oom || sd_write_file_atomic(o.report, b.data, b.len, &err)) {
            sd_log(SD_LOG_ERROR, "%s: %s", o.report, b.oom ? "out of memory" : err.msg);
            exit_code = SD_EXIT_FATAL;
        }
        sd_buf_free(&b);
    }
    for (int i = 0; i < pos.n; i++) {
        free_problems(&rs[i].probs);
        sd_buf_free(&rs[i].examples);
    }
    free(rs);
    sd_pool_destroy(pool);
    sd_strlist_free(&pos);
    return exit_code;
}
