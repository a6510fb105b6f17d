/* The metadata record: one image with its caption, categorised tags, score,
 * rating and source fields. Readers fill it, the rules rewrite it, and it is
 * written as one JSONL line (schema in docs/FORMATS.md). Strings live in the
 * arena of the batch being processed. */
#ifndef SDTK_RECORD_H
#define SDTK_RECORD_H

#include <stdint.h>

#include "arena.h"
#include "buf.h"
#include "json.h"

enum { SD_RECORD_SCHEMA = 1 };

typedef enum {
    SD_TAG_GENERAL,
    SD_TAG_ARTIST,
    SD_TAG_COPYRIGHT,
    SD_TAG_CHARACTER,
    SD_TAG_SPECIES,
    SD_TAG_META,
    SD_TAG_LORE,
    SD_TAG_INVALID,
    SD_TAG_NCAT
} sd_tag_cat;

typedef struct {
    const char *s;
    uint32_t len;
    uint8_t cat;
} sd_tag;

typedef struct {
    const char *key;
    const char *image;  /* image file, or the tar holding it */
    const char *member; /* tar member name, NULL for plain files */
    int image_off_key;  /* the image is not KEY.EXT below its source's folder (a booru
                           --image-pattern such as {id%1000:04d}/{id}.png), so the key
                           alone does not find it */
    int64_t offset;     /* byte offset of member data in an uncompressed tar, -1 unknown */
    int64_t size;       /* member data size, -1 unknown */
    int width, height;  /* 0 when unknown */
    const char *caption; /* natural-language caption from the source, NULL if none */
    sd_tag *tags;
    int ntags, tags_cap;
    int has_score;
    double score;
    const char *rating; /* normalised word (general, sensitive, ...) or NULL */
    const sd_json *fields; /* the source's own object, for `where` rules and pass-through */
    const char *fields_text; /* unmodified copy of the text `fields` was parsed from, or NULL */
    const char *const *consumed; /* field names of `fields` already represented; not passed through */
    const char *caption_lines; /* the caption before its lines were joined, when it had several; else NULL */
    /* set by the rules */
    const char *out_caption;
    int is_val;
    const char **variants; /* --caption-variants K > 1: the distinct captions, variants[0] == out_caption */
    int nvariants;         /* 0 without --caption-variants */
    int unclosed_brace;    /* a caption held a '{' without '}' (kept as a literal) */
    int wildcard_literal;  /* without variants (K = 1): the caption holds a wildcard {a|b}, kept as written */
} sd_record;

const char *sd_tag_cat_name(sd_tag_cat c);
int sd_tag_cat_parse(const char *name);
void sd_record_init(sd_record *r);
int sd_record_add_tag(sd_record *r, sd_arena *a, const char *s, size_t len, sd_tag_cat cat);
int sd_record_add_tag_list(sd_record *r, sd_arena *a, const char *text, size_t len, char sep, sd_tag_cat cat);
void sd_record_write_json(sd_buf *b, const sd_record *r, int with_extra);
const char *sd_record_kohya_key(const sd_record *r);
void sd_record_write_kohya(sd_buf *b, const sd_record *r, const char *key); /* key: sd_record_kohya_key */

#endif
