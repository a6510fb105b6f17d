/* Walking a shard's records by name for the exporters: each name with its
 * parsed, checksum-verified record and (when referenced) text embedding;
 * records the names index misses are found by walking the records too. */
#include <stdlib.h>
#include <string.h>

#include "keyset.h"
#include "log.h"
#include "pack_walk.h"

/* 1 when a record name is safe as a relative file path: no absolute path,
 * no empty, "." or ".." component, no control characters. */
int pack_name_safe(const char *name, size_t n)
{
    if (!n || name[0] == '/') return 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && (unsigned char)name[i] < 0x20) return 0;
        if (i == n || name[i] == '/') {
            size_t len = i - start;
            if (!len || (len == 1 && name[start] == '.') || (len == 2 && name[start] == '.' && name[start + 1] == '.'))
                return 0;
            start = i + 1;
        }
    }
    return 1;
}

/* State of one walk: the shard, the callback, the tally, and the keys of
 * corrupt records already reported through a name (so the second pass does
 * not count them again). */
typedef struct {
    const char *path;
    sd_shard_txn *t;
    sd_tally *tally;
    sd_progress *prog;
    pack_walk_fn fn;
    void *ctx;
    sd_keyset corrupt;
    uint64_t done, unnamed;
} walk;

/* Remember a corrupt record's key; 1 when it was reported before. */
static int seen_corrupt(walk *w, const void *key, size_t klen)
{
    return sd_keyset_insert(&w->corrupt, sd_key128_of(key, klen)) == 0;
}

/* Check one record (value rv under key) and hand it to fn under name:
 * unsafe names, corrupt records and missing or corrupt text embeddings are
 * skips tallied with the shard path and the name. */
static sd_status visit(walk *w, const char *name, size_t nlen, const void *key, size_t klen, const void *rv, size_t rl,
                       sd_error *err)
{
    pack_item it;
    memset(&it, 0, sizeof it);
    it.name = name;
    sd_error e;
    if (strlen(name) != nlen || !pack_name_safe(name, nlen)) {
        sd_skip(w->tally, "unsafe record name for a file path", "%s: record '%s'", w->path, name);
        return SD_OK;
    }
    if (pack_rec_check(rv, rl, SD_REC_LATENT, "not a latent record", &it.rec, &e)) {
        if (!seen_corrupt(w, key, klen))
            sd_skip(w->tally, "corrupt record", "%s: record '%s' (%s)", w->path, name, e.msg);
        return SD_OK;
    }
    if (pack_has_text_ref(it.rec.text_ref)) {
        const void *tv;
        size_t tl;
        if (sd_shard_get_text(w->t, it.rec.text_ref, &tv, &tl, &e) ||
            pack_rec_check(tv, tl, SD_REC_TEXT, "not a text embedding", &it.text, &e)) {
            sd_skip(w->tally, "text embedding missing or corrupt", "%s: record '%s' (%s)", w->path, name, e.msg);
            return SD_OK;
        }
        it.has_text = 1;
    }
    return w->fn(w->ctx, &it, err);
}

/* 1 when a parsed record's header carries this name. */
static int rec_named(const sd_shard_rec *r, const char *name, size_t nlen)
{
    return r->name_len == nlen && memcmp(r->name, name, nlen) == 0;
}

/* 1 when the record under key is a sound latent record (header, payload
 * checksum) carrying name: the copy of that name pass 1 exported. */
static int sound_and_named(sd_shard_txn *t, const void *key, size_t klen, const char *name, size_t nlen)
{
    const void *v;
    size_t vl;
    sd_shard_rec r;
    sd_error e;
    return sd_shard_get(t, key, klen, &v, &vl, &e) == SD_OK &&
           pack_rec_check(v, vl, SD_REC_LATENT, "not a latent record", &r, &e) == 0 && rec_named(&r, name, nlen);
}

/* Pass 1: every entry of the names index, in name order; an entry leading
 * to a record of another name (a damaged index) is skipped, so no file
 * holds another record's data under this name. */
static sd_status walk_names(walk *w, sd_error *err)
{
    sd_shard_cursor *c;
    sd_status st = sd_shard_cursor_open(w->t, SD_SHARD_DB_NAMES, &c, err);
    const void *k, *v, *rv;
    size_t kl, vl, rl;
    char *name = NULL;
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_progress_update(w->prog, ++w->done, w->tally->total);
        char *nn = realloc(name, kl + 1);
        if (!nn) {
            st = sd_err_set(err, SD_ENOMEM, "out of memory");
            break;
        }
        name = nn;
        memcpy(name, k, kl);
        name[kl] = 0;
        sd_error e;
        if (sd_shard_get(w->t, v, vl, &rv, &rl, &e)) {
            sd_skip(w->tally, "name without record", "%s: record '%s' (%s)", w->path, name, e.msg);
            continue;
        }
        sd_shard_rec r;
        if (sd_shard_rec_parse(rv, rl, &r, &e) == SD_OK && !rec_named(&r, name, kl)) {
            char hex[80];
            pack_hex(v, vl, hex, sizeof hex);
            int n = (int)(r.name_len < 200 ? r.name_len : 200);
            sd_skip(w->tally, "name leads to another record",
                    "%s: name '%s' leads to record %s, named '%.*s' (run sd-verify --repair on the shard)", w->path,
                    name, hex, n, r.name);
            continue;
        }
        st = visit(w, name, kl, v, vl, rv, rl, err);
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    free(name);
    sd_shard_cursor_close(c);
    return st;
}

/* Pass 2: the records the names index does not reach under their own name
 * (entry missing or pointing elsewhere), found by walking the records
 * themselves, in key order. A record with its own name is visited under it,
 * unless the name leads to another sound record of that name (a second copy
 * of one image: skipped, the indexed one was exported); unreadable ones not
 * met in pass 1 are counted as corrupt. */
static sd_status walk_unnamed(walk *w, sd_error *err)
{
    sd_shard_cursor *c;
    sd_status st = sd_shard_cursor_open(w->t, SD_SHARD_DB_LATENTS, &c, err);
    const void *k, *v, *nk;
    size_t kl, vl, nkl;
    char hex[80], *name = NULL;
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_shard_rec r;
        sd_error e;
        pack_hex(k, kl, hex, sizeof hex);
        if (sd_shard_rec_parse(v, vl, &r, &e)) {
            if (!seen_corrupt(w, k, kl)) sd_skip(w->tally, "corrupt record", "%s: record %s (%s)", w->path, hex, e.msg);
            continue;
        }
        sd_status g = r.name_len ? sd_shard_get_name(w->t, r.name, r.name_len, &nk, &nkl, &e) : SD_ENOTFOUND;
        if (g == SD_OK && nkl == kl && memcmp(nk, k, kl) == 0) continue; /* pass 1 had it */
        if (g != SD_OK && g != SD_ENOTFOUND) {
            *err = e;
            st = g;
            break;
        }
        if (!r.name_len) {
            sd_skip(w->tally, "record without a name", "%s: record %s", w->path, hex);
            continue;
        }
        char *nn = realloc(name, r.name_len + 1);
        if (!nn) {
            st = sd_err_set(err, SD_ENOMEM, "out of memory");
            break;
        }
        name = nn;
        memcpy(name, r.name, r.name_len);
        name[r.name_len] = 0;
        if (g == SD_OK && sound_and_named(w->t, nk, nkl, r.name, r.name_len)) {
            sd_skip(w->tally, "duplicate name (the indexed record was exported)", "%s: record %s '%s'", w->path, hex,
                    name);
            continue;
        }
        w->unnamed++;
        sd_progress_update(w->prog, ++w->done, w->tally->total);
        st = visit(w, name, r.name_len, k, kl, v, vl, err);
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    free(name);
    sd_shard_cursor_close(c);
    return st;
}

/* Call fn for every record: first by the names index in name order, then
 * the records that index misses, by their own names (warned about: the
 * index needs sd-verify --repair). Broken records are skips (tallied with
 * the shard path and the record name); fn's non-OK status stops the walk. */
sd_status pack_walk(const char *path, sd_tally *tally, sd_progress *prog, pack_walk_fn fn, void *ctx, sd_error *err)
{
    walk w = {path, NULL, tally, prog, fn, ctx, {0}, 0, 0};
    sd_shard *s;
    sd_status st = pack_open_ro(&s, &w.t, path, err);
    if (st) return st;
    sd_keyset_init(&w.corrupt);
    uint64_t names = 0, records = 0;
    sd_shard_count(w.t, SD_SHARD_DB_NAMES, &names, err);
    sd_shard_count(w.t, SD_SHARD_DB_LATENTS, &records, err);
    prog->total = names > records ? names : records;
    st = walk_names(&w, err);
    if (!st) st = walk_unnamed(&w, err);
    if (!st && w.unnamed)
        sd_log(SD_LOG_WARN, "%s: %llu records are missing from the names index (or their name leads to another "
               "record); they were exported under their own names (run sd-verify --repair on the shard to fix its "
               "index)", path, (unsigned long long)w.unnamed);
    sd_keyset_free(&w.corrupt);
    pack_close_ro(s, w.t);
    return st;
}

/* A tensor's data as float32 in b (fp16/bf16 widened exactly). */
sd_status pack_tensor_f32(const sd_shard_tensor *t, sd_buf *b, sd_error *err)
{
    size_t n = t->length / sd_dtype_size(t->dtype);
    sd_buf_clear(b);
    if (sd_buf_reserve(b, n * 4 + 16)) return sd_err_set(err, SD_ENOMEM, "out of memory");
    b->len = n * 4;
    return sd_convert(SD_NPY_F32, b->data, (sd_npy_dtype)pack_npy_dtype(t->dtype), t->data, n, err);
}
