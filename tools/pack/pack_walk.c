/* Walking a shard's records by name for the exporters: each name with its
 * parsed, checksum-verified record and (when referenced) text embedding. */
#include <stdlib.h>
#include <string.h>

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

/* Call fn for every record in name order. Broken records are skips
 * (tallied with the shard path and the record name); fn's non-OK status
 * stops the walk. */
sd_status pack_walk(const char *path, sd_tally *tally, sd_progress *prog, pack_walk_fn fn, void *ctx, sd_error *err)
{
    sd_shard *s;
    sd_shard_txn *t;
    sd_status st = pack_open_ro(&s, &t, path, err);
    if (st) return st;
    uint64_t total = 0, done = 0;
    sd_shard_count(t, SD_SHARD_DB_NAMES, &total, err);
    prog->total = total;
    sd_shard_cursor *c;
    st = sd_shard_cursor_open(t, SD_SHARD_DB_NAMES, &c, err);
    const void *k, *v;
    size_t kl, vl;
    char *name = NULL;
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_progress_update(prog, ++done, tally->total);
        char *nn = realloc(name, kl + 1);
        if (!nn) {
            st = sd_err_set(err, SD_ENOMEM, "out of memory");
            break;
        }
        name = nn;
        memcpy(name, k, kl);
        name[kl] = 0;
        pack_item it;
        memset(&it, 0, sizeof it);
        it.name = name;
        const void *rv;
        size_t rl;
        sd_error e;
        if (strlen(name) != kl || !pack_name_safe(name, kl)) {
            sd_skip(tally, "unsafe record name for a file path", "%s: record '%s'", path, name);
            continue;
        }
        if (sd_shard_get(t, v, vl, &rv, &rl, &e)) {
            sd_skip(tally, "name without record", "%s: record '%s' (%s)", path, name, e.msg);
            continue;
        }
        if (sd_shard_rec_parse(rv, rl, &it.rec, &e) || sd_shard_rec_check_payload(&it.rec, &e) ||
            it.rec.kind != SD_REC_LATENT) {
            sd_skip(tally, "corrupt record", "%s: record '%s' (%s)", path, name, e.msg);
            continue;
        }
        if (pack_has_text_ref(it.rec.text_ref)) {
            const void *tv;
            size_t tl;
            if (sd_shard_get_text(t, it.rec.text_ref, &tv, &tl, &e) || sd_shard_rec_parse(tv, tl, &it.text, &e) ||
                sd_shard_rec_check_payload(&it.text, &e) || it.text.kind != SD_REC_TEXT) {
                sd_skip(tally, "text embedding missing or corrupt", "%s: record '%s' (%s)", path, name, e.msg);
                continue;
            }
            it.has_text = 1;
        }
        st = fn(ctx, &it, err);
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    free(name);
    sd_shard_cursor_close(c);
    pack_close_ro(s, t);
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
