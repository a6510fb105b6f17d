#include "clip_tok_int.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "clip_clean.h"
#include "utf8.h"

enum { CACHE_MAX = 1 << 16 }; /* words kept in a worker's BPE cache before it is emptied */

struct sd_clip_work {
    sd_u32vec text, seg, fixed, clean, tmp, tmp2;
    int32_t *sym, *sym2;
    size_t sym_cap;
    char *piece;
    size_t piece_cap;
    sd_strmap cache;   /* piece bytes -> offset into cache_ids (count first) */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
};

/* A worker's scratch state; NULL when out of memory. */
sd_clip_work *sd_clip_work_new(void)
{
    sd_clip_work *w = calloc(1, sizeof *w);
    if (w) sd_strmap_init(&w->cache);
    return w;
}

/* Release a worker's state. */
void sd_clip_work_free(sd_clip_work *w)
{
    if (!w) return;
    sd_u32vec *v[] = {&w->text, &w->seg, &w->fixed, &w->clean, &w->tmp, &w->tmp2};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) sd_u32vec_free(v[i]);
    free(w->sym);
    free(w->sym2);
    free(w->piece);
    sd_strmap_free(&w->cache);
    free(w->cache_ids);
    free(w);
}

/* Release an id list. */
void sd_clip_ids_free(sd_clip_ids *ids)
{
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

/* Append one id; nonzero when out of memory. */
static int ids_push(sd_clip_ids *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 128;
        int32_t *v = realloc(o->ids, cap * sizeof *v);
        if (!v) return 1;
        o->ids = v;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

/* Rank and result of merging a pair of ids; rank -1 when no merge exists. */
static int32_t pair_rank(const sd_clip_tok *t, int32_t a, int32_t b, int32_t *merged)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = sd_clip_pair_slot(key, t->pair_mask);; i = (i + 1) & t->pair_mask) {
        if (t->pairs[i].rank < 0) return -1;
        if (t->pairs[i].key == key) return *merged = t->pairs[i].merged, t->pairs[i].rank;
    }
}

/* Byte-level BPE of one word as transformers' CLIPTokenizer.bpe does it, on
 * ids: start from one symbol per byte (the last with </w>), then merge the
 * lowest-ranked adjacent pair everywhere, left to right, until none is left. */
static int bpe_word(const sd_clip_tok *t, sd_clip_work *w, const unsigned char *p, size_t n, sd_clip_ids *out)
{
    if (n > w->sym_cap) {
        size_t cap = n * 2;
        int32_t *a = realloc(w->sym, cap * sizeof *a), *b = a ? realloc(w->sym2, cap * sizeof *b) : NULL;
        if (a) w->sym = a;
        if (!b) return 1;
        w->sym2 = b;
        w->sym_cap = cap;
    }
    int32_t *s = w->sym;
    for (size_t i = 0; i + 1 < n; i++) s[i] = t->byte_id[p[i]];
    s[n - 1] = t->byte_eow_id[p[n - 1]];
    while (n > 1) {
        int32_t best = -1, first = 0, second = 0, merged = 0, m;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t r = pair_rank(t, s[i], s[i + 1], &m);
            if (r >= 0 && (best < 0 || r < best)) best = r, first = s[i], second = s[i + 1], merged = m;
        }
        if (best < 0) break;
        size_t k = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && s[i] == first && s[i + 1] == second) s[k++] = merged, i += 2;
            else s[k++] = s[i++];
        }
        n = k;
    }
    for (size_t i = 0; i < n; i++)
        if (ids_push(out, s[i])) return 1;
    return 0;
}

/* BPE through the worker's cache: a word seen before costs one lookup. */
static int bpe_cached(const sd_clip_tok *t, sd_clip_work *w, const char *p, size_t n, sd_clip_ids *out)
{
    uint64_t h = sd_strmap_hash(p, n);
    const sd_strmap_slot *sl = sd_strmap_get_h(&w->cache, p, n, h);
    if (sl) {
        const int32_t *c = w->cache_ids + (size_t)sl->nval;
        for (int32_t i = 1; i <= c[0]; i++)
            if (ids_push(out, c[i])) return 1;
        return 0;
    }
    size_t start = out->n;
    if (bpe_word(t, w, (const unsigned char *)p, n, out)) return 1;
    size_t k = out->n - start;
    if (w->cache.n >= CACHE_MAX) {
        sd_strmap_free(&w->cache);
        sd_strmap_init(&w->cache);
        w->cache_n = 0;
    }
    if (w->cache_n + k + 1 > w->cache_cap) {
        size_t cap = (w->cache_n + k + 1) * 2;
        int32_t *v = realloc(w->cache_ids, cap * sizeof *v);
        if (!v) return 0; /* the cache is an optimisation: skip it */
        w->cache_ids = v;
        w->cache_cap = cap;
    }
    sd_strmap_slot *ns = sd_strmap_put(&w->cache, p, n);
    if (!ns) return 0;
    ns->nval = (double)w->cache_n;
    w->cache_ids[w->cache_n++] = (int32_t)k;
    memcpy(w->cache_ids + w->cache_n, out->ids + start, k * sizeof *out->ids);
    w->cache_n += k;
    return 0;
}

enum { CL_SPACE, CL_LETTER, CL_NUMBER, CL_OTHER, CL_NONE };

/* The class the pre-split pattern sees: \s, \p{L}, \p{N}, or the rest.
 * U+0345 case-folds to a Greek letter, so under IGNORECASE it is excluded
 * from [^\s\p{L}\p{N}] without being a letter: no alternative matches it. */
static int char_class(uint32_t c)
{
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CL_LETTER;
        if (c >= '0' && c <= '9') return CL_NUMBER;
        return sd_clip_is_space(c) ? CL_SPACE : CL_OTHER;
    }
    if (sd_clip_is_space(c)) return CL_SPACE;
    if (c == 0x345) return CL_NONE;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    if (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) return CL_LETTER;
    if (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO) return CL_NUMBER;
    return CL_OTHER;
}

/* Length of a special-token match of the pattern at s (IGNORECASE lets 'ſ'
 * stand for 's'); *exact set when it is the token itself. */
static size_t special_at(const uint32_t *s, size_t n, int *exact)
{
    static const char *names[2] = {"<|startoftext|>", "<|endoftext|>"};
    for (int k = 0; k < 2; k++) {
        size_t len = strlen(names[k]), i = 0;
        int same = 1;
        for (; i < len && i < n; i++) {
            uint32_t c = s[i];
            if (c == 0x17f && names[k][i] == 's') same = 0;
            else if (c != (unsigned char)names[k][i]) break;
        }
        if (i == len) return *exact = same, len;
    }
    return 0;
}

/* Length of the pattern's match at s[0] (0: nothing matches; skip it). */
static size_t match_at(const uint32_t *s, size_t n, int *special)
{
    *special = 0;
    if (s[0] == '<') {
        size_t m = special_at(s, n, special);
        if (m) return m;
    }
    if (s[0] == '\'' && n > 1) {
        uint32_t c = s[1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd' || c == 0x17f) return 2;
        if (n > 2 && ((c == 'r' && s[2] == 'e') || (c == 'v' && s[2] == 'e') || (c == 'l' && s[2] == 'l'))) return 3;
    }
    int cl = char_class(s[0]);
    size_t i = 1;
    if (cl == CL_LETTER || cl == CL_OTHER)
        while (i < n && char_class(s[i]) == cl) i++;
    return cl == CL_SPACE || cl == CL_NONE ? 0 : i;
}

/* Pre-split a cleaned segment and BPE every piece. */
static int split_and_bpe(const sd_clip_tok *t, sd_clip_work *w, const uint32_t *s, size_t n, sd_clip_ids *out)
{
    for (size_t i = 0; i < n;) {
        int special;
        size_t m = match_at(s + i, n - i, &special);
        if (!m) {
            i++;
            continue;
        }
        if (special) {
            if (ids_push(out, s[i + 2] == 's' ? t->bos : t->eos)) return 1; /* "<|s..." or "<|e..." */
        } else {
            if (w->piece_cap < m * 4) {
                char *p = realloc(w->piece, m * 4);
                if (!p) return 1;
                w->piece = p;
                w->piece_cap = m * 4;
            }
            size_t len = 0;
            for (size_t k = 0; k < m; k++) len += (size_t)sd_utf8_encode(s[i + k], w->piece + len);
            if (bpe_cached(t, w, w->piece, len, out)) return 1;
        }
        i += m;
    }
    return 0;
}

/* Clean one segment between special tokens and tokenize it. */
static int encode_segment(const sd_clip_tok *t, sd_clip_work *w, const uint32_t *s, size_t n, sd_clip_ids *out)
{
    w->fixed.n = 0;
    w->clean.n = 0;
    if (sd_clip_fix_text(s, n, &w->fixed, &w->tmp, &w->tmp2)) return 1;
    if (sd_clip_ws_lower(w->fixed.v, w->fixed.n, &w->clean)) return 1;
    return split_and_bpe(t, w, w->clean.v, w->clean.n, out);
}

/* Whether the raw text holds a special token at s (transformers splits the
 * text on its added tokens before anything else). */
static int32_t added_token_at(const sd_clip_tok *t, const uint32_t *s, size_t n, size_t *len)
{
    static const char *names[2] = {"<|startoftext|>", "<|endoftext|>"};
    for (int k = 0; k < 2; k++) {
        size_t l = strlen(names[k]), i = 0;
        while (i < l && i < n && s[i] == (unsigned char)names[k][i]) i++;
        if (i == l) return *len = l, k ? t->eos : t->bos;
    }
    if (t->pad_text[0]) {
        /* the pad token's text, code point by code point */
        size_t i = 0, pos = 0, pl = strlen(t->pad_text);
        while (pos < pl && i < n) {
            utf8proc_int32_t cp;
            utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)t->pad_text + pos, (utf8proc_ssize_t)(pl - pos), &cp);
            if (r <= 0 || s[i] != (uint32_t)cp) break;
            pos += (size_t)r, i++;
        }
        if (pos == pl) return *len = i, t->pad;
    }
    return -1;
}

/* Tokenize text: BOS + tokens + EOS, no truncation. Invalid UTF-8 is decoded
 * as Python's errors="replace" does (out->replaced counts it). */
sd_status sd_clip_encode(const sd_clip_tok *t, sd_clip_work *w, const char *text, size_t len, sd_clip_ids *out,
                         sd_error *err)
{
    int oom = 0;
    out->n = 0;
    out->replaced = sd_clip_decode_utf8(text, len, &w->text, &oom);
    oom |= ids_push(out, t->bos);
    const uint32_t *s = w->text.v;
    size_t n = w->text.n, seg = 0;
    for (size_t i = 0; i < n && !oom;) {
        size_t l;
        int32_t id = s[i] == '<' || t->pad_text[0] ? added_token_at(t, s + i, n - i, &l) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        oom |= encode_segment(t, w, s + seg, i - seg, out) || ids_push(out, id);
        i += l;
        seg = i;
    }
    if (!oom && n > seg) oom |= encode_segment(t, w, s + seg, n - seg, out); /* s is NULL for empty text */
    if (!oom) oom |= ids_push(out, t->eos);
    return oom ? sd_err_set(err, SD_ENOMEM, "out of memory tokenizing") : SD_OK;
}

/* transformers' padding="max_length", truncation=True for ids from
 * sd_clip_encode: BOS + first max_len-2 tokens + EOS, then pad. */
void sd_clip_pad_ids(const int32_t *ids, size_t n, int32_t pad, size_t max_len, int32_t *out)
{
    size_t body = n - 2 < max_len - 2 ? n - 2 : max_len - 2;
    out[0] = ids[0];
    memcpy(out + 1, ids + 1, body * sizeof *ids);
    out[body + 1] = ids[n - 1];
    for (size_t i = body + 2; i < max_len; i++) out[i] = pad;
}

/* kohya's TokenizeStrategy._get_input_ids for --max_token_length 75/150/225:
 * pad to max_tokens+2, then cut into 77-long chunks BOS + 75 + last id, and
 * when pad != eos mend the chunk ends as kohya does. Writes n*77 ids into out
 * (room for 3*77) and returns n (0 for an unsupported max_tokens). */
size_t sd_clip_kohya_chunks(const int32_t *ids, size_t n, int32_t eos, int32_t pad, int max_tokens, int32_t *out)
{
    if (max_tokens != 75 && max_tokens != 150 && max_tokens != 225) return 0;
    size_t max_len = (size_t)max_tokens + 2;
    int32_t full[227];
    sd_clip_pad_ids(ids, n, pad, max_len, full);
    if (max_len == SD_CLIP_CTX) return memcpy(out, full, sizeof(int32_t) * SD_CLIP_CTX), 1;
    size_t k = 0;
    for (size_t i = 1; i < max_len - 75; i += 75, k++) {
        int32_t *c = out + k * SD_CLIP_CTX;
        c[0] = full[0];
        memcpy(c + 1, full + i, 75 * sizeof *c);
        c[76] = full[max_len - 1];
        if (pad != eos) {
            if (c[75] != eos && c[75] != pad) c[76] = eos;
            if (c[1] == pad) c[1] = eos;
        }
    }
    return k;
}
