/* An in-situ JSON parser: strings are unescaped inside the caller's buffer
 * and nodes come from an arena, so parsing a metadata line allocates almost
 * nothing. Used on every record stream; strict RFC 8259 plus UTF-8 checks. */
#ifndef SDTK_JSON_H
#define SDTK_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "buf.h"
#include "err.h"

typedef enum {
    SD_JSON_NULL,
    SD_JSON_FALSE,
    SD_JSON_TRUE,
    SD_JSON_NUMBER,
    SD_JSON_STRING,
    SD_JSON_ARRAY,
    SD_JSON_OBJECT
} sd_json_type;

typedef struct sd_json sd_json;
struct sd_json {
    sd_json_type type;
    uint32_t len;     /* string bytes, number text bytes, or child count */
    const char *key;  /* member name when inside an object (NUL-terminated) */
    uint32_t key_len;
    double num;       /* numbers */
    char *str;        /* strings (NUL-terminated, may hold \0); numbers: raw text */
    sd_json *child;   /* first element/member of arrays and objects */
    sd_json *next;    /* next sibling */
    uint32_t key_off; /* members: where the quoted name starts in the parsed buffer */
    uint32_t raw_off; /* where the value's source text starts in the parsed buffer */
    uint32_t raw_len; /* and its length: a copy of the buffer taken before parsing
                         gives the value's exact JSON text (sd_json_write_member_raw) */
};

sd_status sd_json_parse(sd_arena *a, char *text, size_t len, sd_json **out, sd_error *err);
/* Also Python's NaN, Infinity, -Infinity (numbers whose text is that word,
 * num NaN or +-inf; *nonfinite counts them); see json.c. */
sd_status sd_json_parse_py(sd_arena *a, char *text, size_t len, sd_json **out, int *nonfinite, sd_error *err);
sd_json *sd_json_get(const sd_json *obj, const char *key);
sd_json *sd_json_path(const sd_json *obj, const char *path, size_t len);
const char *sd_json_str(const sd_json *v);
int sd_json_num(const sd_json *v, double *out);
/* A whole number in [lo, hi] (sd_json_num's inputs): 0 and *out set, else -1.
 * The range is checked before any conversion, so a huge value is refused
 * rather than cast (a double out of an integer type's range is UB). */
int sd_json_whole(const sd_json *v, double lo, double hi, double *out);
void sd_json_write(sd_buf *b, const sd_json *v);
void sd_json_write_member_raw(sd_buf *b, const sd_json *m, const char *pristine);

#endif
