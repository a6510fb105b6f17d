/* sd-verify: every check of one stored record (header, checksum, NaN/Inf,
 * shape vs bucket, a loss mask's values, text reference, its bucket index
 * entry and its name). */
#include <stdio.h>
#include <string.h>

#include "verify.h"

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

/* The first latent tensor (a loss mask has its own shape): the parser has
 * checked that every other one has its shape and dtype. */
static const sd_shard_tensor *first_latent(const sd_shard_rec *r)
{
    for (int i = 0; i < r->ntensors; i++)
        if (r->t[i].role != SD_ROLE_MASK) return &r->t[i];
    return &r->t[0];
}

/* Latent shape must be C x bucket_h/8 x bucket_w/8 with C = 4 or 16. */
static int shape_ok(const sd_shard_rec *r)
{
    const sd_shard_tensor *t = first_latent(r);
    return t->ndim == 3 && (t->shape[0] == 4 || t->shape[0] == 16) && r->bucket_w % 8 == 0 && r->bucket_h % 8 == 0 &&
           t->shape[1] == r->bucket_h / 8 && t->shape[2] == r->bucket_w / 8;
}

/* How many values of a loss mask (fp32, shape checked by the parser, finite
 * by the NaN check) lie outside 0..1: a weight there would flip or inflate
 * the loss. */
static size_t mask_outside(const sd_shard_tensor *m)
{
    size_t n = 0;
    const uint8_t *b = m->data;
    for (size_t i = 0; i + 4 <= m->length; i += 4) {
        float x;
        memcpy(&x, b + i, 4);
        n += !(x >= 0.0f && x <= 1.0f);
    }
    return n;
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
        verify_add_problem(l, "name_missing", -1, key, klen, name, nlen, "%s", "record name not in the names index");
    else if (st == SD_OK && (nkl != klen || memcmp(nk, key, klen))) {
        if (record_named(t, nk, nkl, name, nlen))
            verify_add_problem(l, "duplicate_name", SD_SHARD_DB_LATENTS, key, klen, name, nlen, "%s",
                               "a second record of this name; the names index leads to the other one");
        else /* the indexed copy is damaged or gone: the reindex points the name here */
            verify_add_problem(l, "name_misindexed", -1, key, klen, name, nlen, "%s",
                               "the names index leads to a damaged or other record; this sound one takes the name");
    }
}

/* Every check of one record; problems go to l. */
void verify_check_record(sd_shard_txn *t, int db, const void *key, size_t klen, const void *val, size_t vlen,
                         problem_list *l)
{
    sd_shard_rec r;
    sd_error e;
    sd_status st = sd_shard_rec_parse(val, vlen, &r, &e);
    if (st) {
        /* a damaged version field is a bad header (the parser tells it from a newer record) */
        const char *why = st == SD_ETRUNC ? "truncated" : st == SD_EUNSUPPORTED ? "newer_version" : "bad_header";
        verify_add_problem(l, why, db, key, klen, NULL, 0, "%s", e.msg);
        return;
    }
    const char *name = r.name;
    size_t nlen = r.name_len;
    int want = db == SD_SHARD_DB_TEXT ? SD_REC_TEXT : SD_REC_LATENT;
    if (r.kind != want) {
        verify_add_problem(l, "wrong_kind", db, key, klen, name, nlen, "record kind %s",
                           r.kind == SD_REC_TEXT ? "text" : "latent");
        return;
    }
    if (db == SD_SHARD_DB_TEXT && klen != SD_SHARD_TEXT_KEY) {
        verify_add_problem(l, "bad_key", db, key, klen, name, nlen, "%s", "text key is not 16 bytes");
        return;
    }
    if (sd_shard_rec_check_payload(&r, &e)) {
        verify_add_problem(l, "bad_checksum", db, key, klen, name, nlen, "%s", e.msg);
        return;
    }
    for (int i = 0; i < r.ntensors; i++)
        if (has_nonfinite(r.t[i].data, r.t[i].length, r.t[i].dtype)) {
            verify_add_problem(l, "nan_inf", db, key, klen, name, nlen, "%s", "tensor holds NaN or Inf");
            return;
        }
    if (db == SD_SHARD_DB_TEXT) return;
    if (!shape_ok(&r)) {
        char d[96];
        const sd_shard_tensor *lt = first_latent(&r);
        snprintf(d, sizeof d, "shape %ux%ux%u vs bucket %ux%u", lt->shape[0], lt->shape[1], lt->shape[2], r.bucket_w,
                 r.bucket_h);
        verify_add_problem(l, "shape_mismatch", db, key, klen, name, nlen, "%s", d);
        return;
    }
    const sd_shard_tensor *mask = sd_shard_rec_tensor(&r, SD_ROLE_MASK);
    size_t outside = mask ? mask_outside(mask) : 0;
    if (outside) {
        char d[96];
        snprintf(d, sizeof d, "loss mask: %zu of %u values outside 0..1", outside, mask->length / 4);
        verify_add_problem(l, "bad_mask", db, key, klen, name, nlen, "%s", d);
        return;
    }
    static const uint8_t zero[16];
    const void *tv;
    size_t tl;
    if (memcmp(r.text_ref, zero, 16) && sd_shard_get_text(t, r.text_ref, &tv, &tl, &e)) {
        verify_add_problem(l, "text_ref_missing", db, key, klen, name, nlen, "%s",
                           "referenced text embedding not in shard");
        return;
    }
    /* the record is sound from here on: what is left are index problems,
     * which the reindex of --repair fixes without touching the record */
    int found = 0;
    if (sd_shard_index_has(t, r.bucket_w, r.bucket_h, key, klen, &found, &e) == SD_OK && !found)
        verify_add_problem(l, "index_missing", -1, key, klen, name, nlen, "%s", "record not in its bucket index");
    check_name(t, key, klen, name, nlen, l);
}
