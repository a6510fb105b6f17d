/* Growable byte buffer, the one way sdtk builds strings and output records,
 * with JSON writing helpers (escaping, numbers). */
#ifndef SDTK_BUF_H
#define SDTK_BUF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len, cap;
    int oom; /* set once an allocation failed; further appends are dropped */
} sd_buf;

void sd_buf_init(sd_buf *b);
void sd_buf_free(sd_buf *b);
void sd_buf_clear(sd_buf *b);
int sd_buf_grow(sd_buf *b, size_t extra);

/* Make room for extra more bytes plus a NUL; 0 on success. Inline because
 * every byte of every output record goes through here. */
static inline int sd_buf_reserve(sd_buf *b, size_t extra)
{
    return b->len + extra + 1 <= b->cap ? 0 : sd_buf_grow(b, extra);
}

/* Append n raw bytes. */
static inline void sd_buf_put(sd_buf *b, const void *p, size_t n)
{
    if (sd_buf_reserve(b, n)) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

/* Append one byte. */
static inline void sd_buf_putc(sd_buf *b, char c)
{
    if (sd_buf_reserve(b, 1)) return;
    b->data[b->len++] = c;
}

/* Append a NUL-terminated string (inline: a literal's length is a constant). */
static inline void sd_buf_puts(sd_buf *b, const char *s)
{
    sd_buf_put(b, s, strlen(s));
}

void sd_buf_printf(sd_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sd_buf_cstr(sd_buf *b);

void sd_buf_json_str(sd_buf *b, const char *s, size_t n);
void sd_buf_json_cstr(sd_buf *b, const char *s);
void sd_buf_json_int(sd_buf *b, int64_t v);
void sd_buf_json_num(sd_buf *b, double v);
void sd_buf_json_key(sd_buf *b, int *first, const char *key);

#endif
