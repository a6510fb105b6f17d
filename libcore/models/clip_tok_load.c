#include "clip_tok_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "slurp.h"
#include "utf8.h"

/* The byte -> code point table of CLIP's bytes_to_unicode: printable Latin-1
 * bytes stand for themselves, the rest go to U+0100 upwards. */
static uint32_t byte_to_unicode(unsigned b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) n++;
    return 256 + n;
}

/* Id of a token, or -1. */
int32_t sd_clip_tok_lookup(const sd_clip_tok *t, const char *s, size_t n)
{
    const sd_strmap_slot *sl = sd_strmap_get(&t->vocab, s, n);
    return sl ? (int32_t)sl->nval : -1;
}

/* Public form of the lookup for NUL-terminated tokens. */
int32_t sd_clip_tok_id(const sd_clip_tok *t, const char *token)
{
    return sd_clip_tok_lookup(t, token, strlen(token));
}

/* vocab.json: one object of token -> non-negative integer id. */
static sd_status load_vocab(sd_clip_tok *t, const char *path, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 20);
    sd_status st = sd_parse_json_file(path, &text, &a, &root, err);
    if (st == SD_OK && root->type != SD_JSON_OBJECT)
        st = sd_err_set(err, SD_EFORMAT, "%s: not a JSON object of token -> id", path);
    for (sd_json *m = st ? NULL : root->child; m; m = m->next) {
        if (m->type != SD_JSON_NUMBER || m->num < 0 || m->num > 1e8 || m->num != (double)(int32_t)m->num) {
            st = sd_err_set(err, SD_EFORMAT, "%s: token \"%.40s\" has no valid integer id", path, m->key);
            break;
        }
        sd_strmap_slot *sl = sd_strmap_put(&t->vocab, m->key, m->key_len);
        if (!sl) {
            st = sd_err_set(err, SD_ENOMEM, "out of memory loading %s", path);
            break;
        }
        sl->nval = m->num;
        t->digest = sd_hash64(m->key, m->key_len, t->digest ^ (uint64_t)m->num); /* in file order */
    }
    if (st == SD_OK && t->vocab.n == 0) st = sd_err_set(err, SD_EFORMAT, "%s: empty vocabulary", path);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return st;
}

/* Find the ids bytes_to_unicode gives each byte, bare and with </w>, and the
 * special tokens; a vocabulary without them cannot be CLIP's. */
static sd_status find_base_ids(sd_clip_tok *t, const char *path, sd_error *err)
{
    for (unsigned b = 0; b < 256; b++) {
        char s[16];
        int n = sd_utf8_encode(byte_to_unicode(b), s);
        memcpy(s + n, "</w>", 4);
        t->byte_id[b] = sd_clip_tok_lookup(t, s, (size_t)n);
        t->byte_eow_id[b] = sd_clip_tok_lookup(t, s, (size_t)n + 4);
        if (t->byte_id[b] < 0 || t->byte_eow_id[b] < 0)
            return sd_err_set(err, SD_EFORMAT, "%s: byte token for 0x%02x (\"%.*s\" or with </w>) missing: not a CLIP vocabulary",
                              path, b, n, s);
    }
    t->bos = sd_clip_tok_id(t, "<|startoftext|>");
    t->eos = sd_clip_tok_id(t, "<|endoftext|>");
    if (t->bos < 0 || t->eos < 0)
        return sd_err_set(err, SD_EFORMAT, "%s: <|startoftext|> or <|endoftext|> missing", path);
    t->pad = t->eos;
    return SD_OK;
}

/* Add one merge rank to the pair table (a later duplicate wins, as in
 * transformers' dict(zip(merges, ranks))). */
static int pair_put(sd_clip_tok *t, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = sd_clip_pair_slot(key, t->pair_mask);
    while (t->pairs[i].rank >= 0 && t->pairs[i].key != key) i = (i + 1) & t->pair_mask;
    t->pairs[i].key = key;
    t->pairs[i].rank = rank;
    t->pairs[i].merged = merged;
    return 0;
}

/* merges.txt as transformers reads it: text stripped, split on '\n', lines
 * 1 .. 48894 (the first is the version header); each must be two tokens of
 * the vocabulary whose concatenation is in the vocabulary too. */
static sd_status load_merges(sd_clip_tok *t, const char *path, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_status st = sd_read_file(path, &text, err);
    if (st) return sd_buf_free(&text), st;
    char *s = text.data ? text.data : (char *)"";
    size_t n = text.len;
    t->digest = sd_hash64(s, n, t->digest);
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13))) n--;
    while (n && (*s == ' ' || (*s >= 9 && *s <= 13))) s++, n--;
    size_t cap = 1;
    while (cap < 2 * SD_CLIP_MAX_MERGES) cap <<= 1;
    t->pairs = malloc(cap * sizeof *t->pairs);
    if (!t->pairs) return sd_buf_free(&text), sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < cap; i++) t->pairs[i].rank = -1;
    t->pair_mask = cap - 1;
    size_t pos = 0;
    long line = 0;
    int32_t rank = 0;
    char cat[1024];
    while (pos <= n && rank < SD_CLIP_MAX_MERGES && st == SD_OK) {
        size_t end = pos;
        while (end < n && s[end] != '\n') end++;
        line++;
        if (line > 1) {
            const char *f[3];
            size_t fl[3], nf = 0;
            for (size_t i = pos; i < end;) {
                while (i < end && (s[i] == ' ' || (s[i] >= 9 && s[i] <= 13))) i++;
                if (i == end) break;
                size_t j = i;
                while (j < end && !(s[j] == ' ' || (s[j] >= 9 && s[j] <= 13))) j++;
                if (nf < 3) f[nf] = s + i, fl[nf] = j - i;
                nf++;
                i = j;
            }
            if (nf != 2) {
                st = sd_err_set(err, SD_EPARSE, "%s:%ld: expected two tokens, found %zu", path, line, nf);
                break;
            }
            int32_t a = sd_clip_tok_lookup(t, f[0], fl[0]), b = sd_clip_tok_lookup(t, f[1], fl[1]);
            int32_t m = -1;
            if (fl[0] + fl[1] < sizeof cat) {
                memcpy(cat, f[0], fl[0]);
                memcpy(cat + fl[0], f[1], fl[1]);
                m = sd_clip_tok_lookup(t, cat, fl[0] + fl[1]);
            }
            if (a < 0 || b < 0 || m < 0) {
                st = sd_err_set(err, SD_EFORMAT,
                                "%s:%ld: merge \"%.*s %.*s\": %s not in vocab.json (vocab and merges do not belong together)",
                                path, line, (int)(fl[0] > 60 ? 60 : fl[0]), f[0], (int)(fl[1] > 60 ? 60 : fl[1]), f[1],
                                a < 0 || b < 0 ? "a part" : "the merged token");
                break;
            }
            pair_put(t, a, b, rank++, m);
        }
        pos = end + 1;
    }
    if (st == SD_OK && line < 2) st = sd_err_set(err, SD_EFORMAT, "%s: no merges after the header line", path);
    t->nmerges = rank;
    sd_buf_free(&text);
    return st;
}

/* Parse the JSON file dir/name into *root (text and a hold it: the caller
 * frees both); 0 when it is missing or not JSON. */
static int parse_beside(const char *dir, const char *name, sd_buf *text, sd_arena *a, sd_json **root)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    sd_error e;
    sd_buf_init(text);
    sd_arena_init(a, 1 << 14);
    return sd_parse_json_file(path, text, a, root, &e) == SD_OK;
}

/* The pad token transformers would load: special_tokens_map.json wins over
 * tokenizer_config.json (SD2 and SDXL tokenizer_2 say "!", id 0), else EOS. */
static void load_pad(sd_clip_tok *t, const char *dir)
{
    const char *files[2] = {"special_tokens_map.json", "tokenizer_config.json"};
    for (int k = 0; k < 2; k++) {
        sd_buf text;
        sd_arena a;
        sd_json *root;
        sd_error e;
        int found = 0;
        if (parse_beside(dir, files[k], &text, &a, &root)) {
            sd_json *p = sd_json_get(root, "pad_token");
            if (p && p->type == SD_JSON_OBJECT) p = sd_json_get(p, "content");
            const char *s = p ? sd_json_str(p) : NULL;
            found = s && sd_clip_tok_set_pad_token(t, s, &e) == SD_OK;
        }
        sd_arena_free(&a);
        sd_buf_free(&text);
        if (found) return;
    }
}

/* The first token of an added-tokens list that is not in the vocabulary:
 * added_tokens.json ({"<tok>": id}) or tokenizer_config.json's
 * added_tokens_decoder ({"id": {"content": "<tok>"}}). NULL when none. */
static const char *first_unknown(const sd_clip_tok *t, const sd_json *list, int decoder)
{
    for (const sd_json *m = list && list->type == SD_JSON_OBJECT ? list->child : NULL; m; m = m->next) {
        const char *tok = decoder ? sd_json_str(sd_json_get(m, "content")) : m->key;
        if (tok && sd_clip_tok_id(t, tok) < 0) return tok;
    }
    return NULL;
}

/* Tokens added after training (textual inversion embeddings) are split out
 * of the text before BPE by transformers and get ids past the vocabulary;
 * this tokenizer does not do that, so such a folder is refused rather than
 * encoded into other ids without a word. */
static sd_status check_added(const sd_clip_tok *t, const char *dir, sd_error *err)
{
    static const char *const files[2] = {"added_tokens.json", "tokenizer_config.json"};
    sd_status st = SD_OK;
    for (int k = 0; k < 2 && !st; k++) {
        sd_buf text;
        sd_arena a;
        sd_json *root;
        if (parse_beside(dir, files[k], &text, &a, &root)) {
            const char *tok = first_unknown(t, k ? sd_json_get(root, "added_tokens_decoder") : root, k);
            if (tok)
                st = sd_err_set(err, SD_EUNSUPPORTED, "%s/%s: added token \"%.40s\" is not in vocab.json (textual "
                                "inversion tokens are not supported)", dir, files[k], tok);
        }
        sd_arena_free(&a);
        sd_buf_free(&text);
    }
    return st;
}

/* Pad with this token as transformers' from_pretrained does when a config
 * names it: besides padding, the token becomes an added token, so the text
 * is split on it ("!" in SDXL tokenizer_2 then encodes as id 0, not 256). */
sd_status sd_clip_tok_set_pad_token(sd_clip_tok *t, const char *token, sd_error *err)
{
    int32_t id = sd_clip_tok_id(t, token);
    if (id < 0) return sd_err_set(err, SD_ENOTFOUND, "pad token \"%.40s\" is not in the vocabulary", token);
    if (strlen(token) >= sizeof t->pad_text) return sd_err_set(err, SD_ERANGE, "pad token too long");
    t->pad = id;
    int special = strcmp(token, "<|endoftext|>") == 0 || strcmp(token, "<|startoftext|>") == 0;
    strcpy(t->pad_text, special ? "" : token);
    return SD_OK;
}

/* Pad with this id and nothing else, as kohya's `pad_token_id = 0` does
 * (the text is not split on the token). */
void sd_clip_tok_set_pad_id(sd_clip_tok *t, int32_t id)
{
    t->pad = id;
}

/* Load dir/vocab.json and dir/merges.txt (and the pad token from the
 * tokenizer configs when present). */
sd_status sd_clip_tok_load(const char *dir, sd_clip_tok **out, sd_error *err)
{
    *out = NULL;
    sd_clip_tok *t = calloc(1, sizeof *t);
    if (!t) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_strmap_init(&t->vocab);
    char vp[4096], mp[4096];
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    sd_status st = load_vocab(t, vp, err);
    if (!st) st = find_base_ids(t, vp, err);
    if (!st) st = load_merges(t, mp, err);
    if (!st) st = check_added(t, dir, err);
    if (st) return sd_clip_tok_free(t), st;
    load_pad(t, dir);
    *out = t;
    return SD_OK;
}

/* A diffusers model folder: which = 1 reads tokenizer/, 2 tokenizer_2/. */
sd_status sd_clip_tok_load_model(const char *model_dir, int which, sd_clip_tok **out, sd_error *err)
{
    char dir[4096];
    if (which != 1 && which != 2) return sd_err_set(err, SD_EINVAL, "tokenizer index must be 1 or 2");
    snprintf(dir, sizeof dir, "%s/%s", model_dir, which == 1 ? "tokenizer" : "tokenizer_2");
    return sd_clip_tok_load(dir, out, err);
}

/* Release a tokenizer. */
void sd_clip_tok_free(sd_clip_tok *t)
{
    if (!t) return;
    sd_strmap_free(&t->vocab);
    free(t->pairs);
    free(t);
}

/* The special token ids the vocabulary gave, for callers that frame and pad the id sequences. */
int32_t sd_clip_tok_bos(const sd_clip_tok *t) { return t->bos; }
int32_t sd_clip_tok_eos(const sd_clip_tok *t) { return t->eos; }
int32_t sd_clip_tok_pad(const sd_clip_tok *t) { return t->pad; }

/* What decides the ids: the vocabulary and merges (a digest of both, taken
 * as they were read) and the padding; caches key text embeddings by it. */
uint64_t sd_clip_tok_identity(const sd_clip_tok *t)
{
    uint64_t h = sd_hash64(t->pad_text, strlen(t->pad_text), t->digest ^ (uint64_t)(uint32_t)t->pad);
    return h;
}
