#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

enum { MAX_DEPTH = 128 };

typedef struct {
    sd_arena *a;
    char *p, *end, *start;
    sd_error *err;
    int py;        /* accept Python's NaN, Infinity, -Infinity (sd_json_parse_py) */
    int nonfinite; /* how many of them were read */
} parser;

/* Report a parse error with its byte offset. */
static sd_status fail(parser *ps, const char *what)
{
    return sd_err_set(ps->err, SD_EPARSE, "%s at byte %zu", what, (size_t)(ps->p - ps->start));
}

/* Skip JSON whitespace. */
static inline void skip_ws(parser *ps)
{
    /* compact JSON has no whitespace: one compare decides the common case */
    while (ps->p < ps->end && (unsigned char)*ps->p <= ' ' &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Value of one hex digit, -1 if not hex. */
static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Read 4 hex digits of a \u escape. */
static int read_hex4(parser *ps, const char *s, unsigned *out)
{
    if (ps->end - s < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(s[i]);
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

/* Bytes that end the fast scan of a string: '"', '\\', control characters
 * and anything non-ASCII, flagged in the high bit of each byte of the result
 * (a flag can also appear above a true one, which only costs a slower step). */
static uint64_t string_stop_mask(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = v ^ (ones * '"'), b = v ^ (ones * '\\');
    return (((q - ones) & ~q) | ((b - ones) & ~b) | ((v - ones * 0x20) & ~v) | v) & high;
}

/* Parse a string starting at the opening quote; the unescaped bytes are
 * written back over the input and NUL-terminated where the quote was. ASCII
 * runs are skipped 8 bytes at a time; UTF-8 is validated only for strings
 * that hold non-ASCII bytes. */
static sd_status parse_string(parser *ps, char **out, uint32_t *out_len)
{
    char *s = ++ps->p; /* past the quote */
    char *r = s;
    int nonascii = 0;
    for (;;) {
        while (ps->end - r >= 8) {
            uint64_t v;
            memcpy(&v, r, 8);
            uint64_t m = string_stop_mask(v);
            if (m) { /* the lowest flag is always a real stop byte */
                r += __builtin_ctzll(m) >> 3;
                break;
            }
            r += 8;
        }
        if (r >= ps->end) break;
        unsigned char c = (unsigned char)*r;
        if (c == '"' || c == '\\' || c < 0x20) break;
        nonascii |= c >= 0x80;
        r++;
    }
    char *w = r;
    while (r < ps->end) {
        char c = *r;
        if (c == '"') {
            size_t n = (size_t)(w - s);
            if (nonascii && sd_utf8_check(s, n) != n) {
                ps->p = s + sd_utf8_check(s, n);
                return fail(ps, "invalid UTF-8 in string");
            }
            *w = 0;
            ps->p = r + 1;
            *out = s;
            *out_len = (uint32_t)n;
            return SD_OK;
        }
        if ((unsigned char)c < 0x20) {
            ps->p = r;
            return fail(ps, "control character in string");
        }
        if (c != '\\') {
            nonascii |= (unsigned char)c >= 0x80;
            *w++ = *r++;
            continue;
        }
        if (r + 1 >= ps->end) break;
        char e = r[1];
        r += 2;
        switch (e) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (read_hex4(ps, r, &cp)) {
                ps->p = r;
                return fail(ps, "bad \\u escape");
            }
            r += 4;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                unsigned lo;
                if (ps->end - r < 6 || r[0] != '\\' || r[1] != 'u' || read_hex4(ps, r + 2, &lo) || lo < 0xdc00 ||
                    lo > 0xdfff) {
                    ps->p = r;
                    return fail(ps, "unpaired surrogate");
                }
                r += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                ps->p = r;
                return fail(ps, "unpaired surrogate");
            }
            char enc[4];
            int n = sd_utf8_encode(cp, enc);
            memcpy(w, enc, (size_t)n); /* never longer than the escape it replaces */
            w += n;
            break;
        }
        default:
            ps->p = r - 1;
            return fail(ps, "bad escape");
        }
    }
    ps->p = ps->end;
    return fail(ps, "unterminated string");
}

/* Python's json.dumps writes a non-finite float as NaN, Infinity or
 * -Infinity (allow_nan, its default) and json.loads reads them back: in a
 * Python parse, such a word at q (after any '-') becomes a number whose text
 * is the word. 1 when one was read. */
static int python_word(parser *ps, sd_json *v, char *s, char *q, int neg)
{
    size_t left = (size_t)(ps->end - q);
    int inf = left >= 8 && memcmp(q, "Infinity", 8) == 0;
    int nan = !neg && left >= 3 && memcmp(q, "NaN", 3) == 0;
    if (!ps->py || (!inf && !nan)) return 0;
    q += inf ? 8 : 3;
    v->type = SD_JSON_NUMBER;
    v->str = s;
    v->len = (uint32_t)(q - s);
    v->num = nan ? NAN : neg ? -INFINITY : INFINITY;
    ps->p = q;
    ps->nonfinite++;
    return 1;
}

/* Parse a number per the JSON grammar; integers avoid strtod. */
static sd_status parse_number(parser *ps, sd_json *v)
{
    char *s = ps->p, *q = s;
    int neg = 0;
    if (q < ps->end && *q == '-') {
        neg = 1;
        q++;
    }
    if (python_word(ps, v, s, q, neg)) return SD_OK;
    if (q >= ps->end || *q < '0' || *q > '9') return fail(ps, "bad number");
    uint64_t iv = 0;
    int digits = 0;
    if (*q == '0') {
        q++;
        digits = 1;
    } else {
        while (q < ps->end && *q >= '0' && *q <= '9') {
            iv = iv * 10 + (uint64_t)(*q - '0');
            q++;
            digits++;
        }
    }
    int is_int = 1;
    if (q < ps->end && *q == '.') {
        is_int = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->p = q;
            return fail(ps, "bad number");
        }
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        is_int = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->p = q;
            return fail(ps, "bad number");
        }
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    v->type = SD_JSON_NUMBER;
    v->str = s;
    v->len = (uint32_t)(q - s);
    if (is_int && digits <= 18) {
        v->num = neg ? -(double)iv : (double)iv;
    } else {
        char tmp[64];
        size_t n = (size_t)(q - s);
        if (n < sizeof tmp) {
            memcpy(tmp, s, n);
            tmp[n] = 0;
            v->num = strtod(tmp, NULL);
        } else {
            char *heap = malloc(n + 1);
            if (!heap) return sd_err_set(ps->err, SD_ENOMEM, "out of memory");
            memcpy(heap, s, n);
            heap[n] = 0;
            v->num = strtod(heap, NULL);
            free(heap);
        }
    }
    ps->p = q;
    return SD_OK;
}

/* Match a literal word such as "true". */
static int match_word(parser *ps, const char *w, size_t n)
{
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0) return 0;
    ps->p += n;
    return 1;
}

static sd_status parse_value(parser *ps, sd_json *v, int depth);

/* Parse the members of an object or the elements of an array. */
static sd_status parse_container(parser *ps, sd_json *v, int depth, int is_obj)
{
    char close = is_obj ? '}' : ']';
    v->type = is_obj ? SD_JSON_OBJECT : SD_JSON_ARRAY;
    v->child = NULL;
    v->len = 0;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return SD_OK;
    }
    sd_json *tail = NULL;
    for (;;) {
        sd_json *c = sd_arena_alloc(ps->a, sizeof *c);
        if (!c) return sd_err_set(ps->err, SD_ENOMEM, "out of memory");
        c->key = NULL;
        c->key_len = 0;
        c->next = NULL;
        if (is_obj) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected member name");
            c->key_off = (uint32_t)(ps->p - ps->start);
            char *k;
            uint32_t kl;
            sd_status st = parse_string(ps, &k, &kl);
            if (st) return st;
            c->key = k;
            c->key_len = kl;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':'");
            ps->p++;
        }
        sd_status st = parse_value(ps, c, depth + 1);
        if (st) return st;
        if (tail) tail->next = c;
        else v->child = c;
        tail = c;
        v->len++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return SD_OK;
        }
        return fail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

/* Parse any value into v (whose key/next the caller has set). */
static sd_status parse_value(parser *ps, sd_json *v, int depth)
{
    if (depth > MAX_DEPTH) return fail(ps, "nesting too deep");
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    v->child = NULL;
    v->str = NULL;
    v->num = 0;
    v->len = 0;
    const char *start = ps->p;
    sd_status st;
    switch (*ps->p) {
    case '{': st = parse_container(ps, v, depth, 1); break;
    case '[': st = parse_container(ps, v, depth, 0); break;
    case '"': v->type = SD_JSON_STRING; st = parse_string(ps, &v->str, &v->len); break;
    case 't': v->type = SD_JSON_TRUE; st = match_word(ps, "true", 4) ? SD_OK : fail(ps, "bad literal"); break;
    case 'f': v->type = SD_JSON_FALSE; st = match_word(ps, "false", 5) ? SD_OK : fail(ps, "bad literal"); break;
    case 'n': v->type = SD_JSON_NULL; st = match_word(ps, "null", 4) ? SD_OK : fail(ps, "bad literal"); break;
    default: st = parse_number(ps, v); break;
    }
    v->raw_off = (uint32_t)(start - ps->start);
    v->raw_len = (uint32_t)(ps->p - start);
    return st;
}

/* Parse one document with the parser's settings; see sd_json_parse. */
static sd_status parse_document(parser *ps, sd_json **out)
{
    sd_json *root = sd_arena_alloc(ps->a, sizeof *root);
    if (!root) return sd_err_set(ps->err, SD_ENOMEM, "out of memory");
    root->key = NULL;
    root->key_len = 0;
    root->next = NULL;
    sd_status st = parse_value(ps, root, 0);
    if (st) return st;
    skip_ws(ps);
    if (ps->p != ps->end) return fail(ps, "trailing characters after value");
    *out = root;
    return SD_OK;
}

/* Parse text[0,len) as one JSON document. The buffer is modified (strings are
 * unescaped in place) and must stay alive as long as the returned tree. */
sd_status sd_json_parse(sd_arena *a, char *text, size_t len, sd_json **out, sd_error *err)
{
    parser ps = {a, text, text + len, text, err, 0, 0};
    return parse_document(&ps, out);
}

/* As sd_json_parse, also reading what Python's json module writes and reads
 * beyond RFC 8259: NaN, Infinity and -Infinity. Metadata made by Python
 * tools (webdataset, img2dataset, scrapers) holds them; *nonfinite counts
 * them (the caller then re-serialises with sd_json_write, which writes them
 * as null, so its own output stays strict JSON). */
sd_status sd_json_parse_py(sd_arena *a, char *text, size_t len, sd_json **out, int *nonfinite, sd_error *err)
{
    parser ps = {a, text, text + len, text, err, 1, 0};
    sd_status st = parse_document(&ps, out);
    *nonfinite = ps.nonfinite;
    return st;
}

/* Find a member by name (first match); NULL if obj is not an object or lacks it. */
sd_json *sd_json_get(const sd_json *obj, const char *key)
{
    if (!obj || obj->type != SD_JSON_OBJECT) return NULL;
    size_t kl = strlen(key);
    for (sd_json *c = obj->child; c; c = c->next)
        if (c->key_len == kl && memcmp(c->key, key, kl) == 0) return c;
    return NULL;
}

/* Follow a dotted path such as "file.md5" through nested objects; path need
 * not be NUL-terminated. NULL when any step is missing. */
sd_json *sd_json_path(const sd_json *obj, const char *path, size_t len)
{
    const sd_json *cur = obj;
    size_t i = 0;
    while (cur && i <= len) {
        size_t j = i;
        while (j < len && path[j] != '.') j++;
        if (cur->type != SD_JSON_OBJECT) return NULL;
        const sd_json *found = NULL;
        for (const sd_json *c = cur->child; c; c = c->next)
            if (c->key_len == j - i && memcmp(c->key, path + i, j - i) == 0) {
                found = c;
                break;
            }
        cur = found;
        if (j >= len) return (sd_json *)cur;
        i = j + 1;
    }
    return NULL;
}

/* The string value, or NULL when v is missing or not a string. */
const char *sd_json_str(const sd_json *v)
{
    return v && v->type == SD_JSON_STRING ? v->str : NULL;
}

/* Numeric value of v (numbers, and strings that hold a whole number, as some
 * dumps quote them); 0 on success. Only finite values: "nan", "inf" or
 * 1e999 are not numbers anything here can use, and NaN would slip past
 * range checks. */
int sd_json_num(const sd_json *v, double *out)
{
    if (!v) return -1;
    if (v->type == SD_JSON_NUMBER) {
        *out = v->num;
        return isfinite(v->num) ? 0 : -1;
    }
    if (v->type == SD_JSON_STRING && v->len > 0) {
        char *end;
        double d = strtod(v->str, &end);
        if (end == v->str + v->len && isfinite(d)) {
            *out = d;
            return 0;
        }
    }
    return -1;
}

/* Integers from JSON (sizes, counts, config values) are range-checked as
 * doubles first: casting one outside the target type is undefined. */
int sd_json_whole(const sd_json *v, double lo, double hi, double *out)
{
    double d;
    if (sd_json_num(v, &d) || !(d >= lo && d <= hi) || d != floor(d)) return -1;
    *out = d;
    return 0;
}

/* Write `"name":value` of an object member, from the pristine copy when
 * there is one (one memcpy), else re-serialised. */
void sd_json_write_member_raw(sd_buf *b, const sd_json *m, const char *pristine)
{
    if (pristine) {
        sd_buf_put(b, pristine + m->key_off, m->raw_off + m->raw_len - m->key_off);
        return;
    }
    sd_buf_json_str(b, m->key, m->key_len);
    sd_buf_putc(b, ':');
    sd_json_write(b, m);
}

/* Serialise a parsed value back to compact JSON (numbers keep their source
 * text, Python's NaN and Infinity become null). */
void sd_json_write(sd_buf *b, const sd_json *v)
{
    switch (v->type) {
    case SD_JSON_NULL: sd_buf_put(b, "null", 4); return;
    case SD_JSON_FALSE: sd_buf_put(b, "false", 5); return;
    case SD_JSON_TRUE: sd_buf_put(b, "true", 4); return;
    case SD_JSON_NUMBER: /* Python's NaN and Infinity are not JSON: null, as JavaScript writes them */
        if (v->str[0] == 'N' || v->str[0] == 'I' || (v->str[0] == '-' && v->str[1] == 'I')) sd_buf_put(b, "null", 4);
        else sd_buf_put(b, v->str, v->len);
        return;
    case SD_JSON_STRING: sd_buf_json_str(b, v->str, v->len); return;
    case SD_JSON_ARRAY:
    case SD_JSON_OBJECT: {
        int obj = v->type == SD_JSON_OBJECT;
        sd_buf_putc(b, obj ? '{' : '[');
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c != v->child) sd_buf_putc(b, ',');
            if (obj) {
                sd_buf_json_str(b, c->key, c->key_len);
                sd_buf_putc(b, ':');
            }
            sd_json_write(b, c);
        }
        sd_buf_putc(b, obj ? '}' : ']');
        return;
    }
    }
}
