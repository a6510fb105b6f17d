/* What a source reader hands to the pipeline: one input per candidate image,
 * cheap to make in the reading thread. Workers turn inputs into records
 * (parsing JSON, reading caption files), so the expensive part runs in parallel. */
#ifndef SDTK_SOURCE_H
#define SDTK_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "json.h"
#include "record.h"

typedef enum {
    SD_IN_BOORU,    /* text: one post object (Danbooru or e621, detected per record) */
    SD_IN_METAFILE, /* text: a metadata-tree .json file {tags, score, path} */
    SD_IN_FILES,    /* image plus .txt/.caption files to read */
    SD_IN_GIVEN     /* key, caption and tags already known (kohya json, tar sample) */
} sd_input_kind;

typedef struct {
    uint8_t kind;
    const char *origin; /* file named in messages */
    long line;          /* line in origin, 0 if none */
    uint64_t ordinal;   /* input index over the whole run (for --val-every) */
    char *text;         /* JSON text to parse in place */
    size_t len;
    const char *root;   /* directory that relative image paths are resolved against */
    const char *key;
    const char *image;
    const char *member;
    int64_t offset, size;
    const char *txt_path, *cap_path;
    const char *caption, *tags_text; /* NUL-terminated */
    const char *cls_text;            /* webdataset: a .cls member's text, for --cls-map */
    int width, height;
} sd_input;

/* How inputs become records; shared read-only by all workers. */
typedef struct {
    const char *image_pattern; /* booru: e.g. "{id%1000:04d}/{id}.{file_ext}" */
    const char *image_root;    /* booru: directory the pattern is relative to */
    int check_images;          /* stat each image and skip missing ones */
    const sd_json *cls_map;    /* webdataset: cls -> prompt */
    int force_e621;            /* 1 e621, 0 danbooru, -1 detect */
} sd_build_opts;

void sd_input_init(sd_input *in, sd_input_kind kind, const char *origin, long line);
int sd_input_build(const sd_input *in, const sd_build_opts *o, sd_arena *a, sd_record *r, const char **reason,
                   char *detail, size_t detail_len);
int sd_pattern_format(const char *pat, const sd_json *obj, sd_buf *out, const char **missing);
const char *sd_pattern_check(const char *pat);
int sd_is_image_name(const char *name, size_t len);

#endif
