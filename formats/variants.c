/* Caption variants: see variants.h. Every random choice comes from one
 * generator per (key, seed, attempt), so a record's variants do not depend
 * on thread, batch or the records around it. */
#include "variants.h"

#include <string.h>

#include "hash.h"

/* One attempt's generator: a 64-bit state stepped by sd_mix64. */
typedef struct {
    uint64_t s;
} vrng;

/* The next 64 random bits. */
static uint64_t vnext(vrng *r)
{
    r->s = sd_mix64(r->s + 0x9e3779b97f4a7c15ull);
    return r->s;
}

/* A uniform integer in [0, n) (n >= 1; the modulo bias of 64 bits is nil here). */
static size_t vpick(vrng *r, size_t n)
{
    return (size_t)(vnext(r) % (uint64_t)n);
}

/* Replace each wildcard {a|b|c} of s with one choice (the first when r is
 * NULL), {{ and }} with literal braces, as sd-scripts does; a '{' without
 * a '}' after it stays as it is and sets *unclosed. */
static void expand_wildcards(const char *s, vrng *r, sd_buf *out, int *unclosed)
{
    sd_buf_clear(out);
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        if ((s[i] == '{' && i + 1 < n && s[i + 1] == '{') || (s[i] == '}' && i + 1 < n && s[i + 1] == '}')) {
            sd_buf_putc(out, s[i]);
            i += 2;
            continue;
        }
        const char *close = s[i] == '{' ? memchr(s + i + 1, '}', n - i - 1) : NULL;
        if (s[i] != '{' || !close || close == s + i + 1) {
            if (s[i] == '{' && !close) *unclosed = 1;
            sd_buf_putc(out, s[i++]);
            continue;
        }
        const char *b = s + i + 1, *e = close;
        size_t nopt = 1;
        for (const char *p = b; p < e; p++) nopt += *p == '|';
        size_t want = r ? vpick(r, nopt) : 0;
        for (size_t k = 0; k < want; k++) b = memchr(b, '|', (size_t)(e - b)) + 1;
        const char *bar = memchr(b, '|', (size_t)(e - b));
        sd_buf_put(out, b, (size_t)((bar ? bar : e) - b));
        i = (size_t)(close - s) + 1;
    }
}

/* See variants.h: the scan of expand_wildcards, looking for a '|' inside a
 * closed {...}. */
int sd_caption_has_wildcard(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++) {
        if ((s[i] == '{' || s[i] == '}') && i + 1 < n && s[i + 1] == s[i]) {
            i++; /* {{ or }}: a literal brace */
            continue;
        }
        const char *close = s[i] == '{' ? memchr(s + i + 1, '}', n - i - 1) : NULL;
        if (!close) continue;
        if (memchr(s + i + 1, '|', (size_t)(close - s) - i - 1)) return 1;
        i = (size_t)(close - s);
    }
    return 0;
}

/* Split text on ',' into trimmed non-empty tokens, then keep the first
 * keep_tokens, shuffle the rest (o->shuffle) and drop each of the rest at
 * o->tag_dropout; the result joined with ", " into out. */
static int tokens_op(const sd_variant_opts *o, const sd_buf *text, vrng *r, sd_arena *a, sd_buf *out)
{
    size_t cap = 1;
    for (size_t i = 0; i < text->len; i++) cap += text->data[i] == ',';
    const char **ts = sd_arena_alloc(a, cap * sizeof *ts);
    size_t *tl = sd_arena_alloc(a, cap * sizeof *tl);
    if (!ts || !tl) return -1;
    size_t n = 0;
    for (size_t i = 0; i < text->len;) {
        const char *s = text->data + i;
        const char *c = memchr(s, ',', text->len - i);
        size_t l = c ? (size_t)(c - s) : text->len - i;
        i += l + 1;
        while (l && (*s == ' ' || *s == '\t')) s++, l--;
        while (l && (s[l - 1] == ' ' || s[l - 1] == '\t')) l--;
        if (!l) continue;
        ts[n] = s;
        tl[n++] = l;
    }
    size_t lo = o->keep_tokens > 0 ? (size_t)o->keep_tokens : 0;
    if (lo > n) lo = n;
    if (o->shuffle)
        for (size_t k = n; k > lo + 1; k--) { /* Fisher-Yates over [lo, n) */
            size_t j = lo + vpick(r, k - lo), last = k - 1;
            const char *t = ts[last];
            size_t u = tl[last];
            ts[last] = ts[j], tl[last] = tl[j];
            ts[j] = t, tl[j] = u;
        }
    sd_buf_clear(out);
    int any = 0;
    for (size_t k = 0; k < n; k++) {
        if (k >= lo && o->tag_dropout > 0 && sd_hash_unit(vnext(r)) < o->tag_dropout) continue;
        if (any) sd_buf_put(out, ", ", 2);
        sd_buf_put(out, ts[k], tl[k]);
        any = 1;
    }
    return 0;
}

/* See variants.h. Attempt i < nb is base i in canonical form; later
 * attempts draw a base, wildcard choices, a shuffle and drops. Stops after
 * k distinct captions or 8 k attempts (a record with little to vary has
 * fewer variants). */
int sd_caption_variants(const sd_variant_opts *o, const char *key, const char *const *bases, int nb, sd_arena *a,
                        sd_buf scratch[2], const char **out, int *unclosed)
{
    int got = 0, k = o->k < 1 ? 1 : o->k > SD_VARIANTS_MAX ? SD_VARIANTS_MAX : o->k;
    int varies = o->shuffle || o->tag_dropout > 0;
    uint64_t h = sd_hash64(key, strlen(key), o->seed ^ 0x76617269616e7473ull);
    for (int i = 0; got < k && i < 8 * k && nb > 0; i++) {
        vrng r = {sd_mix64(h ^ (uint64_t)i * 0xd1b54a32d192ed03ull)};
        int canonical = i < nb;
        const char *base = bases[canonical ? i : (int)vpick(&r, (size_t)nb)];
        expand_wildcards(base, canonical ? NULL : &r, &scratch[0], unclosed);
        sd_buf *cap = &scratch[0];
        if (!canonical && varies) {
            if (tokens_op(o, &scratch[0], &r, a, &scratch[1])) return -1;
            cap = &scratch[1];
        }
        if (!cap->len) continue;
        int dup = 0;
        for (int j = 0; j < got && !dup; j++) dup = strlen(out[j]) == cap->len && !memcmp(out[j], cap->data, cap->len);
        if (dup) continue;
        if (!(out[got] = sd_arena_strndup(a, cap->data, cap->len))) return -1;
        got++;
    }
    return got;
}
