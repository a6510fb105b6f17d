#include "utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Return n if s[0..n) is valid UTF-8 (no overlongs, surrogates or values past
 * U+10FFFF), else the offset of the first bad byte. ASCII runs go 8 at a time. */
size_t sd_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (i + need >= n) return i;
        for (size_t k = 1; k <= need; k++) {
            unsigned cc = p[i + k];
            if ((cc & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (cc & 0x3f);
        }
        if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += need + 1;
    }
    return n;
}

/* Encode a code point as UTF-8; returns the byte count (0 if invalid). */
int sd_utf8_encode(unsigned cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        if (cp >= 0xd800 && cp <= 0xdfff) return 0;
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    if (cp <= 0x10ffff) {
        out[0] = (char)(0xf0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[3] = (char)(0x80 | (cp & 0x3f));
        return 4;
    }
    return 0;
}

/* Length of a UTF-8 byte order mark (EF BB BF) at the start of text, 0 if
 * none: editors on Windows write one, and it is not part of the first tag,
 * caption or JSON value. */
size_t sd_bom_len(const char *s, size_t n)
{
    return n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
}

/* Is a file, directory or member name valid UTF-8? Records name images and
 * members in JSON, which must be UTF-8, so a reader skips an entry that is not. */
int sd_name_is_utf8(const char *s)
{
    size_t n = strlen(s);
    return sd_utf8_check(s, n) == n;
}

/* A name for messages: valid UTF-8 copied, every other byte and every
 * control byte (newline, ESC, DEL) as \xHH, so a message names the exact
 * bytes, stays UTF-8 and stays on one line. A name too long for out
 * (cap >= 8) is cut at a character boundary. Returns out. */
const char *sd_name_escape(const char *s, char *out, size_t cap)
{
    size_t n = strlen(s), o = 0, i = 0;
    while (i < n) {
        size_t ok = sd_utf8_check(s + i, n - i);
        for (size_t k = 0; k < ok; k++)
            if ((unsigned char)s[i + k] < 0x20 || s[i + k] == 0x7f) {
                ok = k;
                break;
            }
        if (o + ok + 5 > cap) { /* no room for the run, an escape and the NUL */
            size_t take = o + 5 <= cap ? cap - 5 - o : 0;
            while (take && ((unsigned char)s[i + take] & 0xc0) == 0x80) take--;
            memcpy(out + o, s + i, take);
            o += take;
            break;
        }
        memcpy(out + o, s + i, ok);
        o += ok;
        i += ok;
        if (i < n) {
            snprintf(out + o, 5, "\\x%02x", (unsigned char)s[i]);
            o += 4;
            i++;
        }
    }
    out[o] = 0;
    return out;
}
