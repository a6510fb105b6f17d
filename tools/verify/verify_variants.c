/* sd-verify: the caption variants of records (the shard's "variants"
 * database: record key -> its captions' text keys, the first the record's
 * text_ref). A variant whose embedding is gone, an entry of no record or
 * one that does not start with its record's reference are problems; the
 * repair keeps what is sound (the record itself is never deleted for it:
 * it still trains on the variants left, or on its caption). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verify.h"

/* Why entry (key, refs) is unsound, or NULL; *missing counts its
 * references to embeddings the shard lacks. */
static const char *entry_problem(sd_shard_txn *t, const void *key, size_t klen, const void *val, size_t vlen,
                                 size_t *missing, char *detail, size_t cap)
{
    const void *rv, *tv;
    size_t rl, tl;
    sd_shard_rec r;
    sd_error e;
    *missing = 0;
    if (sd_shard_get(t, key, klen, &rv, &rl, &e) || sd_shard_rec_parse(rv, rl, &r, &e) || r.kind != SD_REC_LATENT) {
        snprintf(detail, cap, "caption variants of no readable latent record");
        return "variants_orphan";
    }
    if (vlen % SD_SHARD_TEXT_KEY || vlen < 2 * SD_SHARD_TEXT_KEY || vlen > SD_SHARD_MAX_VARIANTS * SD_SHARD_TEXT_KEY) {
        snprintf(detail, cap, "variants entry of %zu bytes (not 2..%d text keys)", vlen, SD_SHARD_MAX_VARIANTS);
        return "bad_variants";
    }
    if (memcmp(val, r.text_ref, SD_SHARD_TEXT_KEY)) {
        snprintf(detail, cap, "the first variant is not the record's text reference");
        return "bad_variants";
    }
    for (size_t i = 0; i < vlen / SD_SHARD_TEXT_KEY; i++)
        *missing += sd_shard_get_text(t, (const uint8_t *)val + i * SD_SHARD_TEXT_KEY, &tv, &tl, &e) != SD_OK;
    if (!*missing) return NULL;
    snprintf(detail, cap, "%zu of its %zu caption variants' embeddings not in the shard", *missing,
             vlen / SD_SHARD_TEXT_KEY);
    return "variant_missing";
}

/* See verify.h. */
sd_status verify_check_variants(sd_shard *s, problem_list *out, sd_error *err)
{
    sd_shard_txn *t;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    sd_shard_cursor *c;
    if ((st = sd_shard_cursor_open(t, SD_SHARD_DB_VARIANTS, &c, err))) goto done;
    const void *k, *v;
    size_t kl, vl;
    sd_error e;
    while (sd_shard_cursor_next(c, &k, &kl, &v, &vl, &e) == SD_OK) {
        char detail[160];
        size_t missing;
        const char *why = entry_problem(t, k, kl, v, vl, &missing, detail, sizeof detail);
        const void *rv;
        size_t rl;
        sd_shard_rec r;
        int named = sd_shard_get(t, k, kl, &rv, &rl, &e) == SD_OK && sd_shard_rec_parse(rv, rl, &r, &e) == SD_OK;
        if (why)
            verify_add_problem(out, why, SD_SHARD_DB_VARIANTS, k, kl, named ? r.name : NULL, named ? r.name_len : 0,
                               "%s", detail);
    }
    sd_shard_cursor_close(c);
done:
    sd_shard_read_end(t);
    return st;
}

/* One entry kept for the repair: its key and its sound references. */
typedef struct {
    uint8_t key[SD_SHARD_MAX_KEY];
    size_t klen, n;
    uint8_t refs[SD_SHARD_MAX_VARIANTS * SD_SHARD_TEXT_KEY];
} fix;

/* See verify.h: every entry read in one snapshot, then in one batch each
 * unsound one rewritten with its references whose embedding the shard
 * holds (the first must stay the record's text_ref), or deleted when that
 * leaves fewer than two, it is malformed or its record is gone. */
sd_status verify_fix_variants(sd_shard *s, uint64_t *fixed, sd_error *err)
{
    *fixed = 0;
    sd_shard_txn *t;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    fix *fx = NULL;
    size_t n = 0, cap = 0;
    sd_shard_cursor *c = NULL;
    if (!(st = sd_shard_cursor_open(t, SD_SHARD_DB_VARIANTS, &c, err))) {
        const void *k, *v;
        size_t kl, vl, missing;
        sd_error e;
        char detail[160];
        while (!st && sd_shard_cursor_next(c, &k, &kl, &v, &vl, &e) == SD_OK) {
            const char *why = entry_problem(t, k, kl, v, vl, &missing, detail, sizeof detail);
            if (!why) continue;
            if (n == cap) {
                fix *g = realloc(fx, (cap = cap ? 2 * cap : 16) * sizeof *fx);
                if (!g) {
                    st = sd_err_set(err, SD_ENOMEM, "out of memory");
                    break;
                }
                fx = g;
            }
            fix *f = &fx[n++];
            memcpy(f->key, k, kl);
            f->klen = kl;
            f->n = 0;
            if (strcmp(why, "variant_missing") != 0) continue; /* deleted */
            const void *tv;
            size_t tl;
            for (size_t i = 0; i < vl / SD_SHARD_TEXT_KEY; i++) {
                const uint8_t *ref = (const uint8_t *)v + i * SD_SHARD_TEXT_KEY;
                if (sd_shard_get_text(t, ref, &tv, &tl, &e) == SD_OK) memcpy(f->refs + SD_SHARD_TEXT_KEY * f->n++, ref, 16);
                else if (i == 0) { /* the record's own reference is gone: text_ref_missing deletes the record */
                    f->n = 0;
                    break;
                }
            }
        }
        sd_shard_cursor_close(c);
    }
    sd_shard_read_end(t);
    if (!st && n) {
        st = sd_shard_begin(s, err);
        for (size_t i = 0; i < n && !st; i++) st = sd_shard_put_variants(s, fx[i].key, fx[i].klen, fx[i].refs, fx[i].n, err);
        if (!st) st = sd_shard_commit(s, err);
        else sd_shard_abort(s);
        if (!st) *fixed = n;
    }
    free(fx);
    return st;
}
