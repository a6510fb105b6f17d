#include "buf.h"

#include "dtoa.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Empty buffer; no allocation until the first append. */
void sd_buf_init(sd_buf *b)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

/* Release the storage. */
void sd_buf_free(sd_buf *b)
{
    free(b->data);
    sd_buf_init(b);
}

/* Forget the contents, keep the storage. */
void sd_buf_clear(sd_buf *b)
{
    b->len = 0;
}

/* The slow path of sd_buf_reserve: grow the storage; 0 on success. */
int sd_buf_grow(sd_buf *b, size_t extra)
{
    if (b->oom) return -1;
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->oom = 1;
        return -1;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

/* Append formatted text. */
void sd_buf_printf(sd_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sd_buf_put(b, tmp, (size_t)n);
        return;
    }
    if (sd_buf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* The contents as a C string (always NUL-terminated, "" when empty). */
const char *sd_buf_cstr(sd_buf *b)
{
    if (sd_buf_reserve(b, 0)) return "";
    b->data[b->len] = 0;
    return b->data;
}

/* Bytes that need escaping in JSON output ('"', '\\', controls), flagged in
 * the high bit of each byte; non-ASCII bytes are never flagged. */
static uint64_t escape_mask(uint64_t v)
{
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
    uint64_t q = v ^ (ones * '"'), b = v ^ (ones * '\\');
    return (((q - ones) & ~q) | ((b - ones) & ~b) | ((v - ones * 0x20) & ~v)) & ~v & high;
}

/* Append s as a quoted JSON string. Bytes >= 0x80 are copied as they are, so
 * the input must already be valid UTF-8 (the readers check that). Runs without
 * escapes are found 8 bytes at a time and copied whole. */
void sd_buf_json_str(sd_buf *b, const char *s, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    if (sd_buf_reserve(b, n + 2)) return;
    b->data[b->len++] = '"';
    size_t i = 0, run = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            uint64_t m = escape_mask(v);
            if (!m) {
                i += 8;
                continue;
            }
            i += (size_t)(__builtin_ctzll(m) >> 3); /* the lowest flag is a real one */
        }
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            i++;
            continue;
        }
        sd_buf_put(b, s + run, i - run);
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t el = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hx[c >> 4];
            esc[5] = hx[c & 15];
            el = 6;
        }
        sd_buf_put(b, esc, el);
        run = ++i;
    }
    if (run == 0 && !b->oom) { /* nothing escaped: the room is already reserved */
        memcpy(b->data + b->len, s, n);
        b->len += n;
    } else {
        sd_buf_put(b, s + run, n - run);
    }
    sd_buf_putc(b, '"');
}

/* Append a NUL-terminated string as a JSON string. */
void sd_buf_json_cstr(sd_buf *b, const char *s)
{
    sd_buf_json_str(b, s, strlen(s));
}

/* Append an integer without going through printf (hot path of every writer). */
void sd_buf_json_int(sd_buf *b, int64_t v)
{
    char tmp[24];
    int i = 24;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) tmp[--i] = '-';
    sd_buf_put(b, tmp + i, (size_t)(24 - i));
}

/* Append a number: integers exactly, others with the shortest round-trip
 * form; NaN/Inf are not JSON and are written as null. */
void sd_buf_json_num(sd_buf *b, double v)
{
    if (!isfinite(v)) {
        sd_buf_puts(b, "null");
        return;
    }
    if (v == floor(v) && fabs(v) < 9e15) {
        sd_buf_json_int(b, (int64_t)v);
        return;
    }
    char tmp[64];
    int n = sd_dtoa_shortest(v, tmp, sizeof tmp);
    if (n > 0) sd_buf_put(b, tmp, (size_t)n);
}

/* Append `"key":` preceded by a comma unless it is the object's first member. */
void sd_buf_json_key(sd_buf *b, int *first, const char *key)
{
    if (!*first) sd_buf_putc(b, ',');
    *first = 0;
    sd_buf_json_cstr(b, key);
    sd_buf_putc(b, ':');
}
