#include "clip_clean.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "utf8.h"

/* Append one code point, growing the array; nonzero when out of memory. */
int sd_u32vec_push(sd_u32vec *a, uint32_t c)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        uint32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return 1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = c;
    return 0;
}

/* Release an array's memory. */
void sd_u32vec_free(sd_u32vec *a)
{
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* Decode UTF-8 as Python's bytes.decode("utf-8", errors="replace") does: each
 * maximal invalid subpart becomes one U+FFFD. Returns how many were replaced
 * (out is cleared first); *oom set on allocation failure. */
size_t sd_clip_decode_utf8(const char *s, size_t n, sd_u32vec *out, int *oom)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, bad = 0;
    out->n = 0;
    *oom = 0;
    while (i < n) {
        unsigned c = p[i], need = 0, lo = 0x80, hi = 0xbf;
        uint32_t cp = c;
        if (c < 0x80) {
            *oom |= sd_u32vec_push(out, c);
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) need = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) need = 2, cp = c & 0x0f, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        else if (c >= 0xf0 && c <= 0xf4) need = 3, cp = c & 0x07, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        size_t j = i + 1;
        unsigned k = 0;
        for (; k < need && j < n; k++, j++) {
            unsigned b = p[j];
            if (b < (k ? 0x80u : lo) || b > (k ? 0xbfu : hi)) break;
            cp = cp << 6 | (b & 0x3f);
        }
        if (need && k == need) {
            *oom |= sd_u32vec_push(out, cp);
        } else {
            *oom |= sd_u32vec_push(out, 0xfffd);
            bad++;
        }
        i = j;
    }
    return bad;
}

/* Windows-1252 for 0x80..0x9f, the bytes Python's html.unescape and ftfy's
 * fix_c1_controls ("sloppy" codec: undefined bytes map to themselves). */
static const uint16_t cp1252[32] = {
    0x20ac, 0x0081, 0x201a, 0x0192, 0x201e, 0x2026, 0x2020, 0x2021, 0x02c6, 0x2030, 0x0160,
    0x2039, 0x0152, 0x008d, 0x017d, 0x008f, 0x0090, 0x2018, 0x2019, 0x201c, 0x201d, 0x2022,
    0x2013, 0x2014, 0x02dc, 0x2122, 0x0161, 0x203a, 0x0153, 0x009d, 0x017e, 0x0178};

/* Python html.unescape of one numeric reference: the code points it yields
 * (0 or 1) into *cp; returns how many. */
static int numeric_ref(unsigned long long num, uint32_t *cp)
{
    if (num == 0) return *cp = 0xfffd, 1;
    if (num == 0x0d) return *cp = 0x0d, 1;
    if (num >= 0x80 && num <= 0x9f) return *cp = cp1252[num - 0x80], 1;
    if ((num >= 0xd800 && num <= 0xdfff) || num > 0x10ffff) return *cp = 0xfffd, 1;
    if ((num >= 1 && num <= 8) || num == 0x0b || (num >= 0x0e && num <= 0x1f) || (num >= 0x7f && num <= 0x9f) ||
        (num >= 0xfdd0 && num <= 0xfdef) || (num & 0xfffe) == 0xfffe)
        return 0;
    return *cp = (uint32_t)num, 1;
}

/* ftfy's entity pattern matches [0-9A-Za-z] only: ASCII, whatever a code point's Unicode class. */
static int is_alnum_ascii(uint32_t c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* ftfy's unescape_html at position i (in[i] == '&'): on a match of
 * &#?[0-9A-Za-z]{1,24}; push the replacement and return the match length,
 * else 0. A match that ftfy leaves alone is pushed unchanged. */
static size_t unescape_at(const uint32_t *in, size_t n, size_t i, sd_u32vec *out, int *oom)
{
    size_t j = i + 1, k = 0;
    int hash = j < n && in[j] == '#';
    if (hash) j++;
    while (j + k < n && is_alnum_ascii(in[j + k]) && k <= 24) k++;
    if (k < 1 || k > 24 || j + k >= n || in[j + k] != ';') return 0;
    size_t len = j + k + 1 - i;
    char name[32];
    for (size_t t = 0; t < len; t++) name[t] = (char)in[i + t];
    const char *val = hash ? NULL : sd_clip_html_entity(name, len);
    if (val) {
        size_t vl = strlen(val);
        for (utf8proc_ssize_t off = 0; off < (utf8proc_ssize_t)vl;) {
            utf8proc_int32_t cp;
            off += utf8proc_iterate((const utf8proc_uint8_t *)val + off, (utf8proc_ssize_t)vl - off, &cp);
            *oom |= sd_u32vec_push(out, (uint32_t)cp);
        }
        return len;
    }
    if (hash) {
        /* html.unescape decodes &#DIGITS; and &#xHEX; whole; anything else
         * leaves a ';' behind, and ftfy then keeps the original text. */
        const uint32_t *d = in + j;
        size_t nd = k, base = 10;
        if (d[0] == 'x' || d[0] == 'X') d++, nd--, base = 16;
        unsigned long long num = 0;
        int ok = nd > 0;
        for (size_t t = 0; t < nd && ok; t++) {
            uint32_t c = d[t];
            int v = c >= '0' && c <= '9' ? (int)(c - '0')
                  : base == 16 && c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
                  : base == 16 && c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
            if (v < 0) ok = 0;
            else if (num < 0x1000000) num = num * base + (unsigned)v;
        }
        uint32_t cp;
        if (ok && !(numeric_ref(num, &cp) == 1 && cp == ';')) {
            if (numeric_ref(num, &cp)) *oom |= sd_u32vec_push(out, cp);
            return len;
        }
    }
    for (size_t t = 0; t < len; t++) *oom |= sd_u32vec_push(out, in[i + t]);
    return len;
}

/* ftfy's per-character fixes in its order: fix_c1_controls,
 * fix_latin_ligatures, fix_character_width, uncurl_quotes. */
static void map_char(uint32_t c, sd_u32vec *out, int *oom)
{
    static const struct {
        uint16_t from;
        uint16_t to[3];
    } lig[] = {{0x132, {'I', 'J'}},    {0x133, {'i', 'j'}},        {0x149, {0x2bc, 'n'}},  {0x1f1, {'D', 'Z'}},
               {0x1f2, {'D', 'z'}},    {0x1f3, {'d', 'z'}},        {0x1c4, {'D', 0x17d}},  {0x1c5, {'D', 0x17e}},
               {0x1c6, {'d', 0x17e}},  {0x1c7, {'L', 'J'}},        {0x1c8, {'L', 'j'}},    {0x1c9, {'l', 'j'}},
               {0x1ca, {'N', 'J'}},    {0x1cb, {'N', 'j'}},        {0x1cc, {'n', 'j'}},    {0xfb00, {'f', 'f'}},
               {0xfb01, {'f', 'i'}},   {0xfb02, {'f', 'l'}},       {0xfb03, {'f', 'f', 'i'}}, {0xfb04, {'f', 'f', 'l'}},
               {0xfb05, {0x17f, 't'}}, {0xfb06, {'s', 't'}}};
    uint32_t buf[8];
    utf8proc_ssize_t nb = 1;
    if (c >= 0x80 && c <= 0x9f) c = cp1252[c - 0x80];
    buf[0] = c;
    for (size_t i = 0; i < sizeof lig / sizeof lig[0]; i++)
        if (lig[i].from == c) {
            nb = 0;
            for (int t = 0; t < 3 && lig[i].to[t]; t++) buf[nb++] = lig[i].to[t];
        }
    if (c == 0x3000) buf[0] = ' ';
    else if (c >= 0xff01 && c < 0xfff0) {
        utf8proc_int32_t d[8];
        int last = 0;
        utf8proc_ssize_t nd = utf8proc_decompose_char((utf8proc_int32_t)c, d, 8, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &last);
        if (nd > 0 && nd <= 8) {
            /* NFKC of one character: compatibility decomposition, then compose */
            nd = utf8proc_normalize_utf32(d, nd, UTF8PROC_COMPOSE);
            if (nd > 0) {
                nb = nd;
                for (utf8proc_ssize_t t = 0; t < nd; t++) buf[t] = (uint32_t)d[t];
            }
        }
    }
    for (utf8proc_ssize_t t = 0; t < nb; t++) {
        uint32_t x = buf[t];
        if (x == 0x2bc || (x >= 0x2018 && x <= 0x201b)) x = '\'';
        else if (x >= 0x201c && x <= 0x201f) x = '"';
        *oom |= sd_u32vec_push(out, x);
    }
}

/* A decimal digit of any script (Unicode category Nd), what Python's
 * re \d matches in ftfy's terminal-escape pattern. */
static int is_decimal_digit(uint32_t c)
{
    if (c >= '0' && c <= '9') return 1;
    return c > 0x7f && c <= 0x10ffff && utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND;
}

/* ftfy's remove_control_chars set. */
static int is_ftfy_control(uint32_t c)
{
    return c <= 0x08 || c == 0x0b || (c >= 0x0e && c <= 0x1f) || c == 0x7f || (c >= 0x206a && c <= 0x206f) ||
           c == 0xfeff || (c >= 0xfff9 && c <= 0xfffc);
}

/* Canonical composition (NFC) through utf8proc; a run of code points below
 * U+0300 is already NFC and skipped. */
static int nfc(sd_u32vec *a)
{
    size_t i = 0;
    while (i < a->n && a->v[i] < 0x300) i++;
    if (i == a->n) return 0;
    size_t cap = a->n * 4 + 16;
    utf8proc_int32_t *d = malloc(cap * sizeof *d);
    if (!d) return 1;
    size_t nd = 0;
    for (size_t t = 0; t < a->n; t++) {
        int last = 0;
        utf8proc_ssize_t r;
        while ((r = utf8proc_decompose_char((utf8proc_int32_t)a->v[t], d + nd, (utf8proc_ssize_t)(cap - nd),
                                            UTF8PROC_DECOMPOSE, &last)) > (utf8proc_ssize_t)(cap - nd)) {
            utf8proc_int32_t *g = realloc(d, (cap *= 2) * sizeof *d);
            if (!g) return free(d), 1;
            d = g;
        }
        if (r < 0) return free(d), 1;
        nd += (size_t)r;
    }
    /* canonical ordering of combining marks (stable insertion sort by class) */
    for (size_t t = 1; t < nd; t++) {
        const utf8proc_property_t *pt = utf8proc_get_property(d[t]);
        if (!pt->combining_class) continue;
        size_t u = t;
        while (u > 0) {
            int cc = utf8proc_get_property(d[u - 1])->combining_class;
            if (cc <= pt->combining_class) break;
            utf8proc_int32_t x = d[u];
            d[u] = d[u - 1];
            d[u - 1] = x;
            u--;
        }
    }
    /* STABLE makes utf8proc honour the composition exclusions (U+2ADC and
     * the musical symbols stay decomposed), as its own NFC and Python do */
    utf8proc_ssize_t r = utf8proc_normalize_utf32(d, (utf8proc_ssize_t)nd, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
    if (r < 0) return free(d), 1;
    a->n = 0;
    int oom = 0;
    for (utf8proc_ssize_t t = 0; t < r; t++) oom |= sd_u32vec_push(a, (uint32_t)d[t]);
    free(d);
    return oom;
}

/* One round of ftfy.fix_and_explain's loop (fix_encoding left out): input
 * in, result in out. */
static int fix_round(const uint32_t *in, size_t n, int html, sd_u32vec *out, sd_u32vec *tmp)
{
    int oom = 0;
    tmp->n = 0;
    for (size_t i = 0; i < n;) {
        size_t m = html && in[i] == '&' ? unescape_at(in, n, i, tmp, &oom) : 0;
        if (m) i += m;
        else oom |= sd_u32vec_push(tmp, in[i++]);
    }
    out->n = 0;
    sd_u32vec *mid = out;
    for (size_t i = 0; i < tmp->n; i++) map_char(tmp->v[i], mid, &oom);
    /* fix_line_breaks, remove_terminal_escapes, remove_control_chars */
    size_t w = 0;
    uint32_t *v = mid->v;
    for (size_t i = 0; i < mid->n; i++) {
        uint32_t c = v[i];
        if (c == '\r' && i + 1 < mid->n && v[i + 1] == '\n') continue;
        if (c == '\r' || c == 0x2028 || c == 0x2029 || c == 0x85) c = '\n';
        if (c == 0x1b && i + 1 < mid->n && v[i + 1] == '[') {
            size_t j = i + 2;
            while (j < mid->n && (is_decimal_digit(v[j]) || v[j] == ';')) j++;
            if (j < mid->n && ((v[j] | 0x20) >= 'a' && (v[j] | 0x20) <= 'z')) {
                i = j;
                continue;
            }
        }
        if (is_ftfy_control(c)) continue;
        v[w++] = c;
    }
    mid->n = w;
    return oom || nfc(mid);
}

/* ftfy.fix_and_explain on one line: rounds until nothing changes. */
static int fix_line(const uint32_t *in, size_t n, int html, sd_u32vec *out, sd_u32vec *tmp, sd_u32vec *cur)
{
    cur->n = 0;
    for (size_t i = 0; i < n; i++)
        if (sd_u32vec_push(cur, in[i])) return 1;
    for (;;) {
        if (fix_round(cur->v, cur->n, html, out, tmp)) return 1;
        if (out->n == cur->n && (!out->n || memcmp(out->v, cur->v, out->n * sizeof *out->v) == 0)) return 0;
        sd_u32vec t = *cur;
        *cur = *out;
        *out = t;
    }
}

/* ftfy.fix_text with default settings except fix_encoding: line by line,
 * HTML unescaping switched off from the first line holding '<' on. Result
 * appended to out. Plain printable ASCII without '&' is returned as is. */
int sd_clip_fix_text(const uint32_t *in, size_t n, sd_u32vec *out, sd_u32vec *tmp, sd_u32vec *tmp2)
{
    int plain = 1;
    for (size_t i = 0; i < n && plain; i++) plain = in[i] >= 0x20 && in[i] < 0x7f && in[i] != '&';
    if (plain) {
        for (size_t i = 0; i < n; i++)
            if (sd_u32vec_push(out, in[i])) return 1;
        return 0;
    }
    int html = 1;
    sd_u32vec line = {0};
    for (size_t pos = 0; pos < n;) {
        size_t end = pos;
        while (end < n && in[end] != '\n') end++;
        if (end < n) end++;
        for (size_t i = pos; i < end && html; i++)
            if (in[i] == '<') html = 0;
        if (fix_line(in + pos, end - pos, html, &line, tmp, tmp2)) return sd_u32vec_free(&line), 1;
        for (size_t i = 0; i < line.n; i++)
            if (sd_u32vec_push(out, line.v[i])) return sd_u32vec_free(&line), 1;
        pos = end;
    }
    sd_u32vec_free(&line);
    return 0;
}

/* The code points the `regex` module's \s matches (Python str.strip also
 * takes U+001C..U+001F, which ftfy has removed by then). */
int sd_clip_is_space(uint32_t c)
{
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Python's "cased" property, from utf8proc's categories and case maps. */
static int is_cased(uint32_t c)
{
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           utf8proc_tolower((utf8proc_int32_t)c) != (utf8proc_int32_t)c ||
           utf8proc_toupper((utf8proc_int32_t)c) != (utf8proc_int32_t)c;
}

/* Python's "case-ignorable" property: marks, format characters, modifier
 * letters and symbols, and the word-internal punctuation of UAX #29. */
static int is_case_ignorable(uint32_t c)
{
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_SK:
        return 1;
    default:
        break;
    }
    return c == '\'' || c == '.' || c == ':' || c == 0xb7 || c == 0x387 || c == 0x55f || c == 0x5f4 ||
           c == 0x2018 || c == 0x2019 || c == 0x2024 || c == 0x2027 || c == 0xfe13 || c == 0xfe52 || c == 0xfe55 ||
           c == 0xff07 || c == 0xff0e || c == 0xff1a;
}

/* CPython's Final_Sigma rule for U+03A3 at index i. */
static uint32_t lower_sigma(const uint32_t *s, size_t n, size_t i)
{
    size_t j = i;
    while (j > 0 && is_case_ignorable(s[j - 1])) j--;
    if (j == 0 || !is_cased(s[j - 1])) return 0x3c3;
    j = i + 1;
    while (j < n && is_case_ignorable(s[j])) j++;
    return j < n && is_cased(s[j]) ? 0x3c3 : 0x3c2;
}

/* transformers' whitespace_clean (\s+ -> ' ', strip) then str.lower(),
 * appended to out. */
int sd_clip_ws_lower(const uint32_t *in, size_t n, sd_u32vec *out)
{
    int oom = 0, pend = 0;
    size_t start = out->n;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = in[i];
        if (sd_clip_is_space(c)) {
            pend = out->n > start;
            continue;
        }
        if (pend) oom |= sd_u32vec_push(out, ' ');
        pend = 0;
        if (c < 0x80) oom |= sd_u32vec_push(out, c >= 'A' && c <= 'Z' ? c + 32 : c);
        else if (c == 0x130) oom |= sd_u32vec_push(out, 'i') | sd_u32vec_push(out, 0x307);
        else if (c == 0x3a3) oom |= sd_u32vec_push(out, lower_sigma(in, n, i));
        else oom |= sd_u32vec_push(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
    }
    return oom;
}
