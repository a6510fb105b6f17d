/* CLIP tokenizer: every golden caption against transformers' ids (plain,
 * padded with EOS, padded with 0), kohya chunking recomputed here from the
 * plain ids, and the load errors. Usage: test_clip_tok DIR (vocab.json,
 * merges.txt, corpus.jsonl unpacked by test_clip_tok.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "arena.h"
#include "buf.h"
#include "check.h"
#include "clip_tok.h"
#include "json.h"
#include "slurp.h"
#include "utf8.h"

/* Compare an id list with a JSON array of numbers. */
static int same_ids(const int32_t *ids, size_t n, const sd_json *arr)
{
    if (!arr || arr->type != SD_JSON_ARRAY || arr->len != n) return 0;
    size_t i = 0;
    for (const sd_json *v = arr->child; v; v = v->next, i++)
        if (v->num != ids[i]) return 0;
    return 1;
}

/* kohya's chunking written the plain way, independent of the library. */
static size_t kohya_expected(const int32_t *ids, size_t n, int32_t eos, int32_t pad, int max_tokens, int32_t *out)
{
    size_t max_len = (size_t)max_tokens + 2, k = 0;
    int32_t full[227];
    size_t body = n - 2 > max_len - 2 ? max_len - 2 : n - 2;
    full[0] = ids[0];
    for (size_t i = 0; i < body; i++) full[1 + i] = ids[1 + i];
    full[body + 1] = eos;
    for (size_t i = body + 2; i < max_len; i++) full[i] = pad;
    for (size_t i = 1; i < max_len - 75; i += 75, k++) {
        int32_t *c = out + 77 * k;
        c[0] = full[0];
        for (size_t j = 0; j < 75; j++) c[1 + j] = full[i + j];
        c[76] = full[max_len - 1];
        if (pad != eos && c[75] != eos && c[75] != pad) c[76] = eos;
        if (pad != eos && c[1] == pad) c[1] = eos;
    }
    return k;
}

/* Run the golden corpus; returns captions checked. */
static size_t run_corpus(const sd_clip_tok *t, const sd_clip_tok *t0, sd_clip_work *w, const char *path)
{
    sd_buf text, copy;
    sd_error err;
    sd_buf_init(&text);
    sd_buf_init(&copy);
    if (!CHECK(sd_read_file(path, &text, &err) == SD_OK)) return 0;
    sd_arena a;
    sd_arena_init(&a, 1 << 16);
    sd_clip_ids ids = {0}, ids0 = {0};
    size_t count = 0, bad = 0, flagged_replace = 0;
    char *p = text.data, *end = text.data + text.len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        sd_json *rec;
        sd_arena_reset(&a);
        if (len && CHECK(sd_json_parse(&a, p, len, &rec, &err) == SD_OK)) {
            const sd_json *tx = sd_json_get(rec, "text"), *hx = sd_json_get(rec, "hex");
            sd_buf_clear(&copy);
            if (tx) sd_buf_put(&copy, tx->str, tx->len);
            else
                for (uint32_t i = 0; hx && i + 1 < hx->len; i += 2) {
                    unsigned v;
                    sscanf(hx->str + i, "%2x", &v);
                    sd_buf_putc(&copy, (char)v);
                }
            sd_status st = sd_clip_encode(t, w, copy.data ? copy.data : "", copy.len, &ids, &err);
            int32_t pe[77], p0[77], ch[3 * 77], ex[3 * 77];
            int ok = st == SD_OK && same_ids(ids.ids, ids.n, sd_json_get(rec, "ids"));
            if (ok) {
                sd_clip_pad_ids(ids.ids, ids.n, 49407, 77, pe);
                ok = same_ids(pe, 77, sd_json_get(rec, "pad_eos"));
                /* SDXL tokenizer_2 as from_pretrained loads it: pad "!" (id 0), an added token */
                ok = ok && sd_clip_encode(t0, w, copy.data ? copy.data : "", copy.len, &ids0, &err) == SD_OK;
                if (ok) sd_clip_pad_ids(ids0.ids, ids0.n, sd_clip_tok_pad(t0), 77, p0);
                ok = ok && same_ids(p0, 77, sd_json_get(rec, "pad0"));
                for (int mt = 75; mt <= 225 && ok; mt += 75)
                    for (int pad = 0; pad < 2 && ok; pad++) {
                        int32_t pid = pad ? 49407 : 0;
                        size_t k = sd_clip_kohya_chunks(ids.ids, ids.n, 49407, pid, mt, ch);
                        size_t ke = kohya_expected(ids.ids, ids.n, 49407, pid, mt, ex);
                        ok = k == (size_t)mt / 75 && k == ke && memcmp(ch, ex, k * 77 * sizeof *ch) == 0;
                    }
            }
            if (hx && ids.replaced) flagged_replace++;
            if (!ok && bad++ < 10) {
                fprintf(stderr, "mismatch: line %zu\n  got:", count + 1);
                for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
                fprintf(stderr, "\n");
            }
            check_at(ok, "caption ids match transformers", __FILE__, __LINE__);
            count++;
        }
        p += len + 1;
    }
    printf("corpus: %zu captions, %zu differ, %zu invalid-UTF-8 captions reported\n", count, bad, flagged_replace);
    CHECK(count >= 2000);
    CHECK(flagged_replace == 10);
    sd_clip_ids_free(&ids);
    sd_clip_ids_free(&ids0);
    sd_arena_free(&a);
    sd_buf_free(&text);
    sd_buf_free(&copy);
    return count;
}

/* Write a file, for the error cases. */
static void put_file(const char *dir, const char *name, const char *data)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) fputs(data, f), fclose(f);
}

/* A minimal CLIP-shaped vocabulary: the 256 byte symbols in
 * bytes_to_unicode order (ids 0..255), the same with </w> (256..511), the
 * specials (512, 513), then extra members. */
static void vocab_text(sd_buf *b, const char *extra)
{
    unsigned cps[256], k = 0, m = 0;
    for (unsigned x = 0; x < 256; x++)
        if ((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae) cps[k++] = x;
    for (unsigned x = 0; x < 256; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae)) cps[k++] = 256 + m++;
    sd_buf_puts(b, "{");
    for (unsigned i = 0; i < 512; i++) {
        char s[16];
        int n = sd_utf8_encode(cps[i % 256], s);
        if (i >= 256) memcpy(s + n, "</w>", 4), n += 4;
        sd_buf_json_str(b, s, (size_t)n);
        sd_buf_printf(b, ":%u,", i);
    }
    sd_buf_printf(b, "\"<|startoftext|>\":512,\"<|endoftext|>\":513%s}", extra);
}

/* That vocabulary as dir/vocab.json. */
static void put_vocab(const char *dir, const char *extra)
{
    sd_buf b;
    sd_buf_init(&b);
    vocab_text(&b, extra);
    put_file(dir, "vocab.json", sd_buf_cstr(&b));
    sd_buf_free(&b);
}

/* dir/tokenizer.json as transformers 5 saves it: model type, the
 * vocabulary above plus extra, merges (a JSON list) and added tokens. */
static void put_tokenizer_json(const char *dir, const char *type, const char *extra, const char *merges,
                               const char *added)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_buf_printf(&b, "{\"version\": \"1.0\", \"added_tokens\": %s, \"model\": {\"type\": \"%s\", "
                  "\"end_of_word_suffix\": \"</w>\", \"vocab\": ", added, type);
    vocab_text(&b, extra);
    sd_buf_printf(&b, ", \"merges\": %s}}", merges);
    put_file(dir, "tokenizer.json", sd_buf_cstr(&b));
    sd_buf_free(&b);
}

/* A folder with tokenizer.json and tokenizer_config.json only (what
 * transformers 5 saves) gives the ids and the identity of the same tables
 * in vocab.json + merges.txt, whichever form its merges take; a model that
 * is not BPE, a merge outside the vocabulary and an added token that is not
 * in it are refused with the file named. */
static void tokenizer_json_cases(const char *tmp)
{
    char dir[512], ref[512];
    snprintf(dir, sizeof dir, "%s/tjsmall", tmp);
    snprintf(ref, sizeof ref, "%s/tjref", tmp);
    mkdir(dir, 0755);
    mkdir(ref, 0755);
    sd_clip_tok *t = NULL, *r = NULL;
    sd_error err;
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EIO && strstr(err.msg, "tokenizer.json") &&
          strstr(err.msg, "vocab.json"));
    put_vocab(ref, ",\"ab\":600,\"ab</w>\":601");
    put_file(ref, "merges.txt", "#version: 0.2\na b</w>\na b\n");
    put_file(ref, "tokenizer_config.json", "{\"pad_token\": \"!\"}");
    put_file(dir, "tokenizer_config.json", "{\"pad_token\": \"!\"}");
    const char *specials = "[{\"id\": 512, \"content\": \"<|startoftext|>\"}, {\"id\": 0, \"content\": \"!\"}]";
    const char *forms[2] = {"[[\"a\", \"b</w>\"], [\"a\", \"b\"]]", "[\"a b</w>\", \"a b\"]"};
    if (!CHECK(sd_clip_tok_load(ref, &r, &err) == SD_OK)) return;
    sd_clip_work *w = sd_clip_work_new();
    sd_clip_ids a = {0}, b = {0};
    for (int f = 0; f < 2; f++) {
        put_tokenizer_json(dir, "BPE", ",\"ab\":600,\"ab</w>\":601", forms[f], specials);
        if (!CHECK(sd_clip_tok_load(dir, &t, &err) == SD_OK)) {
            fprintf(stderr, "  %s\n", err.msg);
            continue;
        }
        CHECK(sd_clip_tok_identity(t) == sd_clip_tok_identity(r) && sd_clip_tok_pad(t) == 0);
        CHECK(sd_clip_encode(t, w, "ab ab! ba", 9, &a, &err) == SD_OK);
        CHECK(sd_clip_encode(r, w, "ab ab! ba", 9, &b, &err) == SD_OK);
        CHECK(a.n == b.n && a.n == 7 && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0 && a.ids[1] == 601);
        sd_clip_tok_free(t);
    }
    sd_clip_ids_free(&a);
    sd_clip_ids_free(&b);
    sd_clip_work_free(w);
    sd_clip_tok_free(r);
    put_tokenizer_json(dir, "WordPiece", "", "[]", "[]");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EUNSUPPORTED && strstr(err.msg, "tokenizer.json: model type WordPiece"));
    put_tokenizer_json(dir, "BPE", ",\"ab\":600", "[[\"a\", \"b\"], [\"b\", \"a\"]]", "[]");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EFORMAT && strstr(err.msg, "model.merges[1]") &&
          strstr(err.msg, "do not belong together"));
    put_tokenizer_json(dir, "BPE", "", "[\"a b c\"]", "[]");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EPARSE && strstr(err.msg, "model.merges[0]: not two tokens"));
    put_tokenizer_json(dir, "BPE", ",\"ab\":600", "[[\"a\", \"b\"]]", "[{\"id\": 49408, \"content\": \"<cat-toy>\"}]");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EUNSUPPORTED && strstr(err.msg, "tokenizer.json: added token \"<cat-toy>\""));
}

/* Missing files, malformed and mismatched vocab/merges, pad from config. */
static void error_cases(const char *tmp)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/err", tmp);
    mkdir(dir, 0755);
    sd_clip_tok *t;
    sd_error err;
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EIO && strstr(err.msg, "vocab.json"));
    CHECK(sd_clip_tok_load_model(tmp, 2, &t, &err) == SD_EIO && strstr(err.msg, "tokenizer_2/vocab.json"));
    put_file(dir, "vocab.json", "[1,2]");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EFORMAT);
    put_file(dir, "vocab.json", "{\"a\": 1.5}");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EFORMAT && strstr(err.msg, "integer"));
    put_file(dir, "vocab.json", "{\"a\": 1");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EPARSE);
    put_file(dir, "vocab.json", "{\"a\": 0}");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EFORMAT && strstr(err.msg, "not a CLIP vocabulary"));
    put_vocab(dir, ",\"ab\":600,\"ab</w>\":601");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EIO && strstr(err.msg, "merges.txt"));
    put_file(dir, "merges.txt", "#version: 0.2\na b c\n");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EPARSE && strstr(err.msg, ":2:"));
    put_file(dir, "merges.txt", "#version: 0.2\na b\nb c\n");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EFORMAT && strstr(err.msg, "do not belong together"));
    put_file(dir, "merges.txt", "#version: 0.2\na b</w>\na b\n");
    if (CHECK(sd_clip_tok_load(dir, &t, &err) == SD_OK)) {
        sd_clip_work *w = sd_clip_work_new();
        sd_clip_ids ids = {0};
        CHECK(sd_clip_tok_pad(t) == 513);
        CHECK(sd_clip_encode(t, w, "ab ab ba", 8, &ids, &err) == SD_OK);
        int32_t want[] = {512, 601, 601, 'b' - '!', 256 + 'a' - '!', 513};
        CHECK(ids.n == 6 && memcmp(ids.ids, want, sizeof want) == 0);
        CHECK(sd_clip_encode(t, w, "\xff" "a", 2, &ids, &err) == SD_OK && ids.replaced == 1);
        sd_clip_ids_free(&ids);
        sd_clip_work_free(w);
        sd_clip_tok_free(t);
    }
    put_file(dir, "special_tokens_map.json", "{\"pad_token\": {\"content\": \"!\"}}");
    put_file(dir, "tokenizer_config.json", "{\"pad_token\": \"<|endoftext|>\"}");
    if (CHECK(sd_clip_tok_load(dir, &t, &err) == SD_OK)) {
        CHECK(sd_clip_tok_pad(t) == 0);
        sd_clip_tok_free(t);
    }
    /* added tokens: the specials (in the vocabulary) are fine, a textual-inversion token is refused */
    put_file(dir, "tokenizer_config.json",
             "{\"added_tokens_decoder\": {\"512\": {\"content\": \"<|startoftext|>\"}, \"513\": {\"content\": \"<|endoftext|>\"}}}");
    if (CHECK(sd_clip_tok_load(dir, &t, &err) == SD_OK)) sd_clip_tok_free(t);
    put_file(dir, "added_tokens.json", "{\"<cat-toy>\": 514}");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EUNSUPPORTED && strstr(err.msg, "<cat-toy>") &&
          strstr(err.msg, "added_tokens.json"));
    put_file(dir, "added_tokens.json", "{}");
    put_file(dir, "tokenizer_config.json", "{\"added_tokens_decoder\": {\"514\": {\"content\": \"<cat-toy>\"}}}");
    CHECK(sd_clip_tok_load(dir, &t, &err) == SD_EUNSUPPORTED && strstr(err.msg, "tokenizer_config.json"));
}

/* Exact ids from transformers' CLIPTokenizer (with ftfy 6.3.1) where a
 * plain reading would differ: special tokens that appear only once the
 * text is cleaned (upper case, HTML entities; a start token is BOS, not
 * EOS), NFC's composition exclusions (U+2ADC and the musical symbols stay
 * decomposed), and a terminal escape whose parameters are non-ASCII
 * decimal digits (ftfy's \\d). */
static void exact_ids(const sd_clip_tok *t, sd_clip_work *w)
{
    static const struct {
        const char *text;
        int32_t ids[9];
        size_t n;
    } cases[] = {
        {"<|STARTOFTEXT|> a cat", {49406, 49406, 320, 2368, 49407}, 5},
        {"&lt;|startoftext|&gt; a cat", {49406, 49406, 320, 2368, 49407}, 5},
        {"a <|startoftext|> b", {49406, 320, 49406, 321, 49407}, 5},
        {"<|ENDOFTEXT|> a", {49406, 49407, 320, 49407}, 4},
        {"\u2adc", {49406, 158, 104, 251, 136, 372, 49407}, 7},
        {"\u2add\u0338", {49406, 158, 104, 251, 136, 372, 49407}, 7},
        {"x\u2adcy", {49406, 343, 158, 104, 251, 136, 372, 344, 49407}, 9},
        {"\U0001D15E", {49406, 6874, 227, 245, 6874, 227, 354, 49407}, 8},
        {"a\x1b[\u0663mb", {49406, 3937, 49407}, 3},
    };
    sd_clip_ids ids = {0};
    sd_error err;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (!CHECK(sd_clip_encode(t, w, cases[c].text, strlen(cases[c].text), &ids, &err) == SD_OK)) continue;
        int same = ids.n == cases[c].n;
        for (size_t i = 0; same && i < ids.n; i++) same = ids.ids[i] == cases[c].ids[i];
        if (!CHECK(same)) {
            fprintf(stderr, "  case %zu:", c);
            for (size_t i = 0; i < ids.n; i++) fprintf(stderr, " %d", ids.ids[i]);
            fprintf(stderr, "\n");
        }
    }
    sd_clip_ids_free(&ids);
}

/* The full CLIP tables as tokenizer.json (dir_json, written by
 * test_clip_tok.sh from the golden vocab.json and merges.txt, the vocabulary
 * in another order) give the corpus's ids and the identity of vocab.json +
 * merges.txt (dir). */
static void same_as_tokenizer_json(const char *dir, const char *dir_json)
{
    sd_clip_tok *t = NULL, *t0 = NULL, *ref = NULL;
    sd_error err;
    char path[512];
    snprintf(path, sizeof path, "%s/corpus.jsonl", dir);
    if (!CHECK(sd_clip_tok_load(dir_json, &t, &err) == SD_OK)) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    if (CHECK(sd_clip_tok_load(dir, &ref, &err) == SD_OK)) {
        CHECK(sd_clip_tok_identity(t) == sd_clip_tok_identity(ref));
        sd_clip_tok_free(ref);
    }
    sd_clip_work *w = sd_clip_work_new();
    if (CHECK(sd_clip_tok_load(dir_json, &t0, &err) == SD_OK) &&
        CHECK(sd_clip_tok_set_pad_token(t0, "!", &err) == SD_OK && sd_clip_tok_pad(t0) == 0))
        run_corpus(t, t0, w, path);
    exact_ids(t, w);
    sd_clip_tok_free(t0);
    sd_clip_work_free(w);
    sd_clip_tok_free(t);
}

int main(int argc, char **argv)
{
    if (argc < 2) return fprintf(stderr, "usage: test_clip_tok DIR [DIR_WITH_TOKENIZER_JSON]\n"), 2;
    sd_clip_tok *t;
    sd_error err;
    if (CHECK(sd_clip_tok_load(argv[1], &t, &err) == SD_OK)) {
        sd_clip_work *w = sd_clip_work_new();
        CHECK(sd_clip_tok_bos(t) == 49406 && sd_clip_tok_eos(t) == 49407 && sd_clip_tok_pad(t) == 49407);
        char path[512];
        snprintf(path, sizeof path, "%s/corpus.jsonl", argv[1]);
        sd_clip_tok *t0 = NULL;
        if (CHECK(sd_clip_tok_load(argv[1], &t0, &err) == SD_OK) &&
            CHECK(sd_clip_tok_set_pad_token(t0, "!", &err) == SD_OK && sd_clip_tok_pad(t0) == 0))
            run_corpus(t, t0, w, path);
        exact_ids(t, w);
        sd_clip_tok_free(t0);
        sd_clip_work_free(w);
        sd_clip_tok_free(t);
    } else {
        fprintf(stderr, "%s\n", err.msg);
    }
    if (argc > 2) same_as_tokenizer_json(argv[1], argv[2]);
    error_cases(argv[1]);
    tokenizer_json_cases(argv[1]);
    return check_done("clip_tok");
}
