/* kohya fine-tune metadata: meta_cap.json / meta_cap_dd.json / meta_lat.json,
 * a dictionary image key -> {caption, tags, train_resolution}. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slurp.h"
#include "sources.h"


/* A caption or tags string in run memory, without a leading U+FEFF:
 * sd-scripts' merge scripts read tag and caption files as utf-8, not
 * utf-8-sig, so a Windows editor's BOM arrives inside the first tag, where
 * --blacklist and the rules would miss it (the folder source drops it). */
static char *without_bom(sd_meta_run *m, const sd_json *v)
{
    size_t b = sd_bom_len(v->str, v->len);
    return sd_arena_strndup(&m->arena, v->str + b, v->len - b);
}

/* Read the dictionary and add one input per entry. Images are looked up as
 * KEY (if it has an image extension) or KEY.{png,jpg,jpeg,webp,bmp} under
 * image_root (default: the json file's directory). */
sd_status sd_read_kohya(sd_meta_run *m, const char *path, const char *image_root, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    const char *origin = sd_meta_keep(m, path);
    char *dcopy = strdup(path);
    const char *root = image_root ? sd_meta_keep(m, image_root) : sd_meta_keep(m, dirname(dcopy));
    free(dcopy);
    sd_arena a;
    sd_arena_init(&a, 1 << 20);
    sd_json *doc;
    sd_status st = sd_parse_json_file(path, &text, &a, &doc, err);
    if (!st && doc->type != SD_JSON_OBJECT)
        st = sd_err_set(err, SD_EFORMAT, "%s: expected a kohya metadata object {key: {caption, tags}}", path);
    if (!st) {
        long idx = 0;
        for (const sd_json *e = doc->child; e; e = e->next) {
            idx++;
            if (e->type != SD_JSON_OBJECT) {
                sd_meta_skip_input(m, "kohya entry is not an object", "%s: entry %ld '%s'", path, idx, e->key);
                continue;
            }
            const sd_json *cap = sd_json_get(e, "caption"), *tags = sd_json_get(e, "tags");
            if ((cap && cap->type != SD_JSON_STRING) || (tags && tags->type != SD_JSON_STRING)) {
                sd_meta_skip_input(m, "kohya caption/tags not a string", "%s: entry %ld '%s'", path, idx, e->key);
                continue;
            }
            sd_input *in = sd_meta_add(m, SD_IN_GIVEN, origin, 0);
            in->origin = sd_meta_entry_origin(m, origin, idx, e->key, e->key_len);
            in->key = sd_arena_strndup(&m->arena, e->key, e->key_len);
            in->root = root;
            if (cap) in->caption = without_bom(m, cap);
            if (tags) in->tags_text = without_bom(m, tags);
        }
    }
    sd_arena_free(&a);
    sd_buf_free(&text);
    return st;
}
