#include "record.h"

#include <string.h>

static const char *const cat_names[SD_TAG_NCAT] = {"general", "artist", "copyright", "character",
                                                   "species", "meta",   "lore",      "invalid"};

/* The JSON name of a tag category. */
const char *sd_tag_cat_name(sd_tag_cat c)
{
    return c < SD_TAG_NCAT ? cat_names[c] : "general";
}

/* Category by name, -1 if unknown. */
int sd_tag_cat_parse(const char *name)
{
    for (int i = 0; i < SD_TAG_NCAT; i++)
        if (strcmp(cat_names[i], name) == 0) return i;
    return -1;
}

/* An empty record: nothing known yet. */
void sd_record_init(sd_record *r)
{
    memset(r, 0, sizeof *r);
    r->offset = -1;
    r->size = -1;
}

/* Append one tag (the bytes are referenced, not copied); 0 on success. */
int sd_record_add_tag(sd_record *r, sd_arena *a, const char *s, size_t len, sd_tag_cat cat)
{
    if (r->ntags == r->tags_cap) {
        int cap = r->tags_cap ? r->tags_cap * 2 : 32;
        sd_tag *t = sd_arena_alloc(a, (size_t)cap * sizeof *t);
        if (!t) return -1;
        if (r->ntags) memcpy(t, r->tags, (size_t)r->ntags * sizeof *t);
        r->tags = t;
        r->tags_cap = cap;
    }
    r->tags[r->ntags].s = s;
    r->tags[r->ntags].len = (uint32_t)len;
    r->tags[r->ntags].cat = (uint8_t)cat;
    r->ntags++;
    return 0;
}

/* Where the comma-separated item starting at i ends: the next ',' (or line
 * break when lines), not counting those inside a wildcard {a, b|c} closed
 * on the same line: sd-scripts expands wildcards before it splits tags, so
 * cutting one would leave broken pieces ("{a", "b|c}"). */
static size_t comma_item_end(const char *text, size_t len, size_t i, int lines)
{
    size_t j = i;
    while (j < len && text[j] != ',' && !(lines && text[j] == '\n')) {
        if (text[j] == '{') {
            size_t k = j + 1;
            while (k < len && text[k] != '}' && text[k] != '\n') k++;
            if (k < len && text[k] == '}') j = k; /* a closed group: one item */
        }
        j++;
    }
    return j;
}

/* Split text on sep (space for booru tag strings, ',' for caption files),
 * trimming blanks and dropping empty items, and add each as a tag; a
 * wildcard {a, b|c} stays one tag. */
int sd_record_add_tag_list(sd_record *r, sd_arena *a, const char *text, size_t len, char sep, sd_tag_cat cat)
{
    size_t i = 0;
    /* booru tag strings are split on spaces; only when a tab or newline is
     * present must each byte be tested for all three */
    int ws_other = sep == ' ' && (memchr(text, '\n', len) || memchr(text, '\t', len));
    /* a comma list over several lines (a tag a line, or lines of tags): line breaks separate too */
    int lines = sep == ',' && memchr(text, '\n', len);
    while (i < len) {
        size_t j = i;
        if (ws_other) {
            while (j < len && text[j] != ' ' && text[j] != '\n' && text[j] != '\t') j++;
        } else if (sep == ',') {
            j = comma_item_end(text, len, i, lines);
        } else {
            const char *q = memchr(text + i, sep, len - i);
            j = q ? (size_t)(q - text) : len;
        }
        size_t b = i, e = j;
        while (b < e && (text[b] == ' ' || text[b] == '\t' || text[b] == '\n' || text[b] == '\r')) b++;
        while (e > b && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\n' || text[e - 1] == '\r')) e--;
        if (e > b && sd_record_add_tag(r, a, text + b, e - b, cat)) return -1;
        i = j + 1;
    }
    return 0;
}

/* Is name one of the fields the reader already turned into record members? */
static int is_consumed(const sd_record *r, const char *name)
{
    if (!r->consumed) return 0;
    for (const char *const *c = r->consumed; *c; c++)
        if ((*c)[0] == name[0] && strcmp(*c, name) == 0) return 1;
    return 0;
}

/* May a member's source text be copied as it is? Only when it holds no line
 * break: a pretty-printed source (a metadata .json written with indent)
 * spreads a member over several lines, and every record must stay one line. */
static int raw_fits_line(const sd_json *m, const char *pristine)
{
    const char *s = pristine + m->key_off;
    size_t n = (size_t)m->raw_off + m->raw_len - m->key_off;
    return !memchr(s, '\n', n) && !memchr(s, '\r', n);
}

/* Write the record as one JSONL line (schema v1, see docs/FORMATS.md). */
void sd_record_write_json(sd_buf *b, const sd_record *r, int with_extra)
{
    int first = 0; /* "v" always opens the object */
    sd_buf_puts(b, "{\"v\":");
    sd_buf_json_int(b, SD_RECORD_SCHEMA);
    sd_buf_puts(b, ",\"key\":");
    sd_buf_json_cstr(b, r->key);
    if (r->image) {
        sd_buf_puts(b, ",\"image\":");
        sd_buf_json_cstr(b, r->image);
    }
    if (r->member) {
        sd_buf_puts(b, ",\"member\":");
        sd_buf_json_cstr(b, r->member);
        if (r->offset >= 0) {
            sd_buf_puts(b, ",\"offset\":");
            sd_buf_json_int(b, r->offset);
        }
        if (r->size >= 0) {
            sd_buf_puts(b, ",\"size\":");
            sd_buf_json_int(b, r->size);
        }
    }
    if (r->width > 0 && r->height > 0) {
        sd_buf_puts(b, ",\"width\":");
        sd_buf_json_int(b, r->width);
        sd_buf_puts(b, ",\"height\":");
        sd_buf_json_int(b, r->height);
    }
    sd_buf_puts(b, ",\"caption\":");
    sd_buf_json_cstr(b, r->out_caption ? r->out_caption : (r->caption ? r->caption : ""));
    if (r->nvariants > 0) {
        sd_buf_puts(b, ",\"captions\":[");
        for (int i = 0; i < r->nvariants; i++) {
            if (i) sd_buf_putc(b, ',');
            sd_buf_json_cstr(b, r->variants[i]);
        }
        sd_buf_putc(b, ']');
    }
    if (r->ntags) {
        sd_buf_puts(b, ",\"tags\":{");
        int cfirst = 1;
        unsigned present = 0;
        for (int i = 0; i < r->ntags; i++)
            if (r->tags[i].s) present |= 1u << r->tags[i].cat;
        for (int c = 0; c < SD_TAG_NCAT; c++) {
            if (!(present & (1u << c))) continue;
            int any = 0;
            for (int i = 0; i < r->ntags; i++) {
                if (r->tags[i].cat != c || !r->tags[i].s) continue;
                if (!any) {
                    sd_buf_json_key(b, &cfirst, cat_names[c]);
                    sd_buf_putc(b, '[');
                } else {
                    sd_buf_putc(b, ',');
                }
                any = 1;
                sd_buf_json_str(b, r->tags[i].s, r->tags[i].len);
            }
            if (any) sd_buf_putc(b, ']');
        }
        sd_buf_putc(b, '}');
    }
    if (r->has_score) {
        sd_buf_puts(b, ",\"score\":");
        sd_buf_json_num(b, r->score);
    }
    if (r->rating) {
        sd_buf_puts(b, ",\"rating\":");
        sd_buf_json_cstr(b, r->rating);
    }
    sd_buf_puts(b, r->is_val ? ",\"split\":\"val\"" : ",\"split\":\"train\"");
    if (with_extra && r->fields && r->fields->type == SD_JSON_OBJECT) {
        int efirst = 1;
        for (const sd_json *c = r->fields->child; c; c = c->next) {
            if (is_consumed(r, c->key)) continue;
            if (efirst) {
                sd_buf_json_key(b, &first, "extra");
                sd_buf_putc(b, '{');
            } else {
                sd_buf_putc(b, ',');
            }
            efirst = 0;
            int raw = r->fields_text && raw_fits_line(c, r->fields_text);
            sd_json_write_member_raw(b, c, raw ? r->fields_text : NULL); /* else re-serialised, compact */
        }
        if (!efirst) sd_buf_putc(b, '}');
    }
    sd_buf_put(b, "}\n", 2);
}

/* Does path name an image as DIR/KEY.EXT (or KEY.EXT) for this key, with one
 * of the extensions sd-scripts' glob_images looks for? Then sd-scripts finds
 * it from the key alone, given DIR as the image folder. */
static int image_is_key_ext(const char *path, const char *key)
{
    static const char *const exts[] = {".png", ".jpg", ".jpeg", ".webp", ".bmp",
                                       ".PNG", ".JPG", ".JPEG", ".WEBP", ".BMP"};
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(slash ? slash : path, '.');
    if (!dot) return 0;
    int ext_ok = 0;
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++) ext_ok |= strcmp(dot, exts[i]) == 0;
    size_t stem = (size_t)(dot - path), kl = strlen(key);
    return ext_ok && kl <= stem && memcmp(path + stem - kl, key, kl) == 0 && (kl == stem || path[stem - kl - 1] == '/');
}

/* The key a record gets in kohya metadata. sd-scripts opens a key either as
 * a path or as IMAGE_DIR/KEY.EXT, so the record's key stays when its image
 * is KEY.EXT below the source's folder (or it names no image); otherwise (a
 * booru --image-pattern path such as 0001/1001.png for key 1001, an
 * extension glob_images does not try) the image path itself is the key, as
 * sd-scripts' merge scripts write keys with --full_path. */
const char *sd_record_kohya_key(const sd_record *r)
{
    if (!r->image) return r->key;
    return !r->image_off_key && image_is_key_ext(r->image, r->key) ? r->key : r->image;
}

/* Write the record as one member of a kohya meta_cap_dd.json dictionary,
 * `"key": {"caption", "tags"}`; the caller writes separators and braces.
 * sd-scripts trains on caption + ", " + tags when tags is not empty, and the
 * finished caption (rules and template applied) already holds every tag it
 * keeps, so it goes in whole with empty tags: kohya then trains on exactly
 * this caption, without repeated or excluded tags. */
void sd_record_write_kohya(sd_buf *b, const sd_record *r, const char *key)
{
    sd_buf_json_cstr(b, key);
    sd_buf_puts(b, ": {\"caption\": ");
    sd_buf_json_cstr(b, r->out_caption ? r->out_caption : (r->caption ? r->caption : ""));
    sd_buf_puts(b, ", \"tags\": \"\"}");
}
