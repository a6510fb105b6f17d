/* sd-verify: the checks of a whole shard beside its records: the bucket
 * and names indexes, the empty_text meta entry and a --manifest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "json.h"
#include "lines.h"
#include "verify.h"

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
    verify_key_str((const uint8_t *)r.name, r.name_len, q, sizeof q);
    snprintf(out, cap, r.name_len ? "'%s'" : "%s", r.name_len ? q : "(no name)");
    return 1;
}

/* The index side: every bindex entry points to a record of that bucket,
 * bucket counts match bindex, every name points to a record of that name. */
sd_status verify_check_indexes(sd_shard *s, problem_list *out, sd_error *err)
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
        else verify_add_problem(out, "bucket_count", -1, k, kl, NULL, 0, "%s", "bucket in bindex but not in buckets");
        sd_shard_rec r;
        sd_error e;
        if (sd_shard_get(t, v, vl, &rv, &rl, &e) == SD_ENOTFOUND)
            verify_add_problem(out, "index_dangling", -1, v, vl, NULL, 0, "%s", "bucket index names a missing record");
        else if (sd_shard_rec_parse(rv, rl, &r, &e) == SD_OK && (r.bucket_w != w || r.bucket_h != h))
            verify_add_problem(out, "index_wrong_bucket", -1, v, vl, r.name, r.name_len, "%s",
                               "record indexed under another bucket");
    }
    sd_shard_cursor_close(c);
    for (size_t i = 0; i < nb; i++)
        if (seen[i] != bk[i].count) {
            char d[96];
            snprintf(d, sizeof d, "bucket %ux%u: count %llu, index holds %llu", bk[i].w, bk[i].h,
                     (unsigned long long)bk[i].count, (unsigned long long)seen[i]);
            verify_add_problem(out, "bucket_count", -1, NULL, 0, NULL, 0, "%s", d);
        }
    free(seen);
    if (st != SD_ENOTFOUND) goto done;
    if ((st = sd_shard_cursor_open(t, SD_SHARD_DB_NAMES, &c, err))) goto done;
    while ((st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_error e;
        char other[200];
        sd_status g = sd_shard_get(t, v, vl, &rv, &rl, &e);
        if (g == SD_ENOTFOUND)
            verify_add_problem(out, "name_dangling", -1, v, vl, k, kl, "%s", "name points to a missing record");
        else if (g == SD_OK && other_name(rv, rl, k, kl, other, sizeof other))
            verify_add_problem(out, "name_wrong_record", -1, v, vl, k, kl, "name points to a record named %s", other);
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
        verify_key_str(key, 16, k, sizeof k);
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
sd_status verify_check_empty_text(sd_shard *s, problem_list *out, sd_error *err)
{
    static const char meta_key[] = SD_SHARD_META_EMPTY_TEXT;
    char *v = NULL, d[200];
    int missing = 0;
    sd_status st = sd_shard_meta_get(s, meta_key, &v, err);
    if (st == SD_ENOTFOUND) return SD_OK;
    if (!st) st = empty_text_gone(s, v, d, sizeof d, &missing, err);
    free(v);
    if (!st && missing)
        verify_add_problem(out, "empty_text_missing", SD_SHARD_DB_META, meta_key, sizeof meta_key - 1, NULL, 0, "%s",
                           d);
    return st;
}

/* Every `key` of the manifest must be a record name in the shard. */
sd_status verify_check_manifest(sd_shard *s, const char *path, problem_list *out, sd_error *err)
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
                    verify_add_problem(out, "manifest_bad_line", -1, NULL, 0, NULL, 0, "%s: no usable \"key\"", where);
                    continue;
                }
                const void *rk, *rv;
                size_t rkl, rl;
                char other[200], d[320];
                sd_status g = sd_shard_get_name(t, key->str, key->len, &rk, &rkl, &e);
                if (g == SD_ENOTFOUND)
                    verify_add_problem(out, "manifest_missing", -1, NULL, 0, key->str, key->len, "%s: not in shard",
                                       where);
                else if (g == SD_OK && sd_shard_get(t, rk, rkl, &rv, &rl, &e) == SD_OK &&
                         other_name(rv, rl, key->str, key->len, other, sizeof other)) {
                    snprintf(d, sizeof d, "%s: the names index leads to a record named %s", where, other);
                    verify_add_problem(out, "manifest_wrong_record", -1, rk, rkl, key->str, key->len, "%s", d);
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
