#include "clip_tok_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* The vocabulary from a JSON object of token -> non-negative integer id
 * (vocab.json, or tokenizer.json's model.vocab). The digest adds one hash
 * per entry, so it does not depend on the order a writer put them in
 * (transformers 4 sorts vocab.json by token, the hub's files and
 * tokenizer.json go by id). */
static sd_status vocab_from_json(sd_clip_tok *t, const sd_json *obj, const char *path, sd_error *err)
{
    if (!obj || obj->type != SD_JSON_OBJECT)
        return sd_err_set(err, SD_EFORMAT, "%s: not a JSON object of token -> id", path);
    for (const sd_json *m = obj->child; m; m = m->next) {
        if (m->type != SD_JSON_NUMBER || m->num < 0 || m->num > 1e8 || m->num != (double)(int32_t)m->num)
            return sd_err_set(err, SD_EFORMAT, "%s: token \"%.40s\" has no valid integer id", path, m->key);
        sd_strmap_slot *sl = sd_strmap_put(&t->vocab, m->key, m->key_len);
        if (!sl) return sd_err_set(err, SD_ENOMEM, "out of memory loading %s", path);
        sl->nval = m->num;
        t->vocab_digest += sd_hash64(m->key, m->key_len, (uint64_t)m->num);
    }
    if (t->vocab.n == 0) return sd_err_set(err, SD_EFORMAT, "%s: empty vocabulary", path);
    return SD_OK;
}

/* vocab.json: one object of token -> id. */
static sd_status load_vocab(sd_clip_tok *t, const char *path, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 20);
    sd_status st = sd_parse_json_file(path, &text, &a, &root, err);
    if (st == SD_OK) st = vocab_from_json(t, root, path, err);
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

/* An empty pair table sized for the most merges transformers reads. */
static sd_status pairs_alloc(sd_clip_tok *t, sd_error *err)
{
    size_t cap = 1;
    while (cap < 2 * SD_CLIP_MAX_MERGES) cap <<= 1;
    t->pairs = malloc(cap * sizeof *t->pairs);
    if (!t->pairs) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < cap; i++) t->pairs[i].rank = -1;
    t->pair_mask = cap - 1;
    return SD_OK;
}

/* The next merge rank: the two tokens and their concatenation must be in
 * the vocabulary. The digest chains the pairs' ids in rank order, which
 * merges.txt and tokenizer.json (strings or pairs) give alike. `where`
 * names the merge in an error ("FILE:LINE" or "FILE: merge N"). */
static sd_status merge_add(sd_clip_tok *t, const char *a, size_t al, const char *b, size_t bl, const char *where,
                           sd_error *err)
{
    char cat[1024];
    int32_t ia = sd_clip_tok_lookup(t, a, al), ib = sd_clip_tok_lookup(t, b, bl), m = -1;
    if (al + bl < sizeof cat) {
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        m = sd_clip_tok_lookup(t, cat, al + bl);
    }
    if (ia < 0 || ib < 0 || m < 0)
        return sd_err_set(err, SD_EFORMAT, "%s: merge \"%.*s %.*s\": %s not in the vocabulary (vocabulary and merges "
                          "do not belong together)", where, (int)(al > 60 ? 60 : al), a, (int)(bl > 60 ? 60 : bl), b,
                          ia < 0 || ib < 0 ? "a part" : "the merged token");
    pair_put(t, ia, ib, t->nmerges++, m);
    uint32_t ids[2] = {(uint32_t)ia, (uint32_t)ib};
    t->merges_digest = sd_hash64(ids, sizeof ids, t->merges_digest);
    return SD_OK;
}

/* merges.txt as transformers reads it: text stripped, split on '\n', lines
 * 1 .. 48894 (the first is the version header); each must be two tokens of
 * the vocabulary whose concatenation is in the vocabulary too. */
static sd_status load_merges(sd_clip_tok *t, const char *path, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_status st = sd_read_file(path, &text, err);
    if (!st) st = pairs_alloc(t, err);
    if (st) return sd_buf_free(&text), st;
    char *s = text.data ? text.data : (char *)"";
    size_t n = text.len;
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= 9 && s[n - 1] <= 13))) n--;
    while (n && (*s == ' ' || (*s >= 9 && *s <= 13))) s++, n--;
    size_t pos = 0;
    long line = 0;
    while (pos <= n && t->nmerges < SD_CLIP_MAX_MERGES && st == SD_OK) {
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
            char where[4200];
            snprintf(where, sizeof where, "%s:%ld", path, line);
            if (nf != 2) st = sd_err_set(err, SD_EPARSE, "%s: expected two tokens, found %zu", where, nf);
            else st = merge_add(t, f[0], fl[0], f[1], fl[1], where, err);
        }
        pos = end + 1;
    }
    if (st == SD_OK && line < 2) st = sd_err_set(err, SD_EFORMAT, "%s: no merges after the header line", path);
    sd_buf_free(&text);
    return st;
}

/* tokenizer.json's model.merges, the first 48894 as transformers 4 reads
 * merges.txt: each entry "a b" (tokenizers before 0.20) or ["a", "b"]. */
static sd_status merges_from_json(sd_clip_tok *t, const sd_json *list, const char *path, sd_error *err)
{
    if (!list || list->type != SD_JSON_ARRAY || list->len == 0)
        return sd_err_set(err, SD_EFORMAT, "%s: model.merges is not a list of merges", path);
    sd_status st = pairs_alloc(t, err);
    long i = 0;
    for (const sd_json *e = list->child; e && !st && t->nmerges < SD_CLIP_MAX_MERGES; e = e->next, i++) {
        char where[4200];
        snprintf(where, sizeof where, "%s: model.merges[%ld]", path, i);
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (e->type == SD_JSON_STRING) {
            const char *sp = memchr(e->str, ' ', e->len);
            if (sp && sp > e->str && !memchr(sp + 1, ' ', e->len - (size_t)(sp - e->str) - 1) &&
                sp + 1 < e->str + e->len)
                a = e->str, al = (size_t)(sp - e->str), b = sp + 1, bl = e->len - al - 1;
        } else if (e->type == SD_JSON_ARRAY && e->len == 2 && e->child->type == SD_JSON_STRING &&
                   e->child->next->type == SD_JSON_STRING) {
            a = e->child->str, al = e->child->len, b = e->child->next->str, bl = e->child->next->len;
        }
        if (!a) st = sd_err_set(err, SD_EPARSE, "%s: not two tokens (\"a b\" or [\"a\", \"b\"])", where);
        else st = merge_add(t, a, al, b, bl, where, err);
    }
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
 * added_tokens.json ({"<tok>": id}), tokenizer_config.json's
 * added_tokens_decoder ({"id": {"content": "<tok>"}}) or tokenizer.json's
 * added_tokens ([{"id": id, "content": "<tok>"}]). NULL when none. */
static const char *first_unknown(const sd_clip_tok *t, const sd_json *list, int decoder)
{
    int listy = list && (list->type == SD_JSON_OBJECT || list->type == SD_JSON_ARRAY);
    for (const sd_json *m = listy ? list->child : NULL; m; m = m->next) {
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

/* Whether path exists with S_IFMT type `type` (S_IFREG, S_IFDIR). */
static int path_is(const char *path, unsigned type)
{
    struct stat sb;
    return stat(path, &sb) == 0 && (sb.st_mode & S_IFMT) == type;
}

/* tokenizer.json, what transformers 5 saves alone (with
 * tokenizer_config.json): a BPE model whose vocab and merges are the
 * tables vocab.json and merges.txt hold, and added tokens, which must be in
 * the vocabulary as for the other layout. */
static sd_status load_tokenizer_json(sd_clip_tok *t, const char *path, sd_error *err)
{
    sd_buf text;
    sd_arena a;
    sd_json *root;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 22);
    sd_status st = sd_parse_json_file(path, &text, &a, &root, err);
    const sd_json *model = st ? NULL : sd_json_get(root, "model");
    const char *type = model ? sd_json_str(sd_json_get(model, "type")) : NULL;
    const char *eow = model ? sd_json_str(sd_json_get(model, "end_of_word_suffix")) : NULL;
    if (!st && (!model || model->type != SD_JSON_OBJECT))
        st = sd_err_set(err, SD_EFORMAT, "%s: no \"model\" object: not a tokenizers file", path);
    else if (!st && (!type || strcmp(type, "BPE") != 0))
        st = sd_err_set(err, SD_EUNSUPPORTED, "%s: model type %s (CLIP's tokenizer is BPE)", path, type ? type : "missing");
    else if (!st && eow && strcmp(eow, "</w>") != 0)
        st = sd_err_set(err, SD_EUNSUPPORTED, "%s: end_of_word_suffix \"%.20s\" (CLIP's is \"</w>\")", path, eow);
    if (!st) st = vocab_from_json(t, sd_json_get(model, "vocab"), path, err);
    if (!st) st = find_base_ids(t, path, err);
    if (!st) st = merges_from_json(t, sd_json_get(model, "merges"), path, err);
    const char *tok = st ? NULL : first_unknown(t, sd_json_get(root, "added_tokens"), 1);
    if (tok)
        st = sd_err_set(err, SD_EUNSUPPORTED, "%s: added token \"%.40s\" is not in the vocabulary (textual inversion "
                        "tokens are not supported)", path, tok);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return st;
}

/* The tables from dir/vocab.json and dir/merges.txt (transformers 4 and
 * the hub's folders), else from dir/tokenizer.json (a folder transformers 5
 * saved); the pad token from the tokenizer configs when present. */
sd_status sd_clip_tok_load(const char *dir, sd_clip_tok **out, sd_error *err)
{
    *out = NULL;
    sd_clip_tok *t = calloc(1, sizeof *t);
    if (!t) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_strmap_init(&t->vocab);
    char vp[4096], mp[4096], tj[4096];
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    sd_status st;
    if (!path_is(vp, S_IFREG) && path_is(tj, S_IFREG)) {
        st = load_tokenizer_json(t, tj, err);
    } else if (!path_is(vp, S_IFREG) && path_is(dir, S_IFDIR)) {
        st = sd_err_set(err, SD_EIO, "%s: no tokenizer in it (neither vocab.json + merges.txt nor tokenizer.json)", dir);
    } else {
        st = load_vocab(t, vp, err);
        if (!st) st = find_base_ids(t, vp, err);
        if (!st) st = load_merges(t, mp, err);
    }
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

/* What decides the ids: the vocabulary and merges (digests of their
 * content, the same whichever files or order they came in) and the
 * padding; caches key text embeddings by it. */
uint64_t sd_clip_tok_identity(const sd_clip_tok *t)
{
    uint64_t tables[3] = {t->vocab_digest, t->merges_digest, (uint64_t)(uint32_t)t->pad};
    return sd_hash64(t->pad_text, strlen(t->pad_text), sd_hash64(tables, sizeof tables, 0));
}
