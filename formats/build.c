/* Worker side of every source: turn one sd_input into an sd_record, or give
 * the reason it has to be skipped. Runs in parallel, so it touches nothing
 * but its input, the shared read-only options and its own arena. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "imghdr.h"
#include "source.h"
#include "slurp.h"
#include "utf8.h"

static const char *const danbooru_consumed[] = {
    "id", "md5", "file_ext", "rating", "score", "image_width", "image_height", "tag_string",
    "tag_string_general", "tag_string_artist", "tag_string_copyright", "tag_string_character", "tag_string_meta",
    "tag_count", "tag_count_general", "tag_count_artist", "tag_count_copyright", "tag_count_character",
    "tag_count_meta", "tags", "width", "height", NULL};
static const char *const e621_consumed[] = {"id", "tags", "rating", "score", "file", NULL};
static const char *const metafile_consumed[] = {"tags", "score", "path", "caption", "width", "height", NULL};
static const char *const wds_consumed[] = {"caption", "width", "height", NULL}; /* img2dataset's "key" stays in extra */

/* Reset an input to a kind and its origin for messages. */
void sd_input_init(sd_input *in, sd_input_kind kind, const char *origin, long line)
{
    memset(in, 0, sizeof *in);
    in->kind = (uint8_t)kind;
    in->origin = origin;
    in->line = line;
    in->offset = in->size = -1;
}

/* The image extensions sdtk reads from folders and tars (kohya's list). */
int sd_is_image_name(const char *name, size_t len)
{
    static const char *const exts[] = {".jpg", ".jpeg", ".png", ".webp", ".bmp"};
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++) {
        size_t el = strlen(exts[i]);
        if (len > el && strncasecmp(name + len - el, exts[i], el) == 0) return 1;
    }
    return 0;
}

/* Append v in decimal, zero-padded to width digits (as printf's %0*lld). */
static void put_padded(sd_buf *out, long long v, int width)
{
    char tmp[48];
    int i = (int)sizeof tmp;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    int digits = (int)sizeof tmp - i;
    int pad = width - digits - (v < 0);
    if (v < 0) sd_buf_putc(out, '-');
    for (; pad > 0 && pad < 40; pad--) sd_buf_putc(out, '0');
    sd_buf_put(out, tmp + i, (size_t)digits);
}

/* Expand an image-path pattern over a post: {field}, {a.b}, {field%N},
 * {field:04d} and {field%N:04d}. 0 on success; -1 with *missing naming the
 * field (arena-free static or pattern text) when a field is absent. */
int sd_pattern_format(const char *pat, const sd_json *obj, sd_buf *out, const char **missing)
{
    const char *p = pat;
    while (*p) {
        const char *open = strchr(p, '{');
        if (!open) {
            sd_buf_puts(out, p);
            break;
        }
        sd_buf_put(out, p, (size_t)(open - p));
        const char *close = strchr(open, '}');
        if (!close) {
            *missing = "unterminated '{' in pattern";
            return -1;
        }
        const char *name = open + 1;
        size_t nl = 0;
        while (name + nl < close && name[nl] != '%' && name[nl] != ':') nl++;
        long mod = 0, width = 0;
        const char *q = name + nl;
        if (q < close && *q == '%') mod = strtol(q + 1, (char **)&q, 10);
        if (q < close && *q == ':') {
            q++;
            if (*q == '0') q++;
            width = strtol(q, (char **)&q, 10);
        }
        const sd_json *v = sd_json_path(obj, name, nl);
        if (!v && nl == 3 && strncmp(name, "ext", 3) == 0) v = sd_json_get(obj, "file_ext");
        if (!v && nl == 3 && strncmp(name, "ext", 3) == 0) v = sd_json_path(obj, "file.ext", 8);
        if (!v && nl == 3 && strncmp(name, "md5", 3) == 0) v = sd_json_path(obj, "file.md5", 8);
        if (!v || v->type == SD_JSON_NULL || v->type == SD_JSON_TRUE || v->type == SD_JSON_FALSE ||
            v->type == SD_JSON_OBJECT || v->type == SD_JSON_ARRAY) { /* no text to put in a path */
            *missing = name;
            return -1;
        }
        if (v->type == SD_JSON_NUMBER || mod || width) {
            double d; /* NaN, inf or beyond long long cannot be formatted as an integer */
            if (sd_json_num(v, &d) || !(d > -9e18 && d < 9e18)) {
                *missing = name;
                return -1;
            }
            long long iv = (long long)d;
            if (mod > 0) iv %= mod;
            put_padded(out, iv, (int)width);
        } else {
            sd_buf_put(out, v->str, v->len);
        }
        p = close + 1;
    }
    return 0;
}

/* The end of a positive decimal number at p (a modulus), or NULL. */
static const char *positive_number(const char *p)
{
    const char *q = p;
    int nonzero = 0;
    for (; *q >= '0' && *q <= '9'; q++) nonzero |= *q != '0';
    return nonzero ? q : NULL;
}

/* The end of a width spec at p ("04d", "4", "d" or nothing; at most 40
 * digits wide, the padding sd_pattern_format writes), or NULL. */
static const char *width_spec(const char *p)
{
    const char *q = p;
    long w = 0;
    for (; *q >= '0' && *q <= '9'; q++)
        if ((w = w * 10 + (*q - '0')) > 40) return NULL;
    return *q == 'd' ? q + 1 : q;
}

/* What is wrong with an image pattern, or NULL. A malformed one would skip
 * every record with the same garbled message, so sd-meta checks its syntax
 * once at startup: {NAME}, {NAME%N}, {NAME:04d}, {NAME%N:04d} with N > 0,
 * as sd_pattern_format above reads them. */
const char *sd_pattern_check(const char *pat)
{
    for (const char *p = strchr(pat, '{'); p; p = strchr(p, '{')) {
        const char *close = strchr(p, '}');
        if (!close) return "'{' without a closing '}'";
        const char *q = p + 1 + strcspn(p + 1, "{}%:");
        if (q == p + 1) return "a field has no name";
        if (*q == '%' && !(q = positive_number(q + 1))) return "'%' needs a positive whole number";
        if (*q == ':' && !(q = width_spec(q + 1))) return "':' needs a width of at most 40, as in ':04d'";
        if (q != close) return "unexpected text inside a field";
        p = close + 1;
    }
    return NULL;
}

enum { MAX_TEXT_FILE = 64 << 20 };

/* Read a small text file whole, without a leading UTF-8 byte order mark
 * (Windows editors write one; it is not part of the first tag or of the
 * JSON). Opened by sd_open_regular, so a FIFO or device named like a
 * caption cannot hang the run. NULL with why (for the message) set on
 * failure. */
static char *read_text_file(sd_arena *a, const char *path, size_t *len, char *why, size_t why_len)
{
    int fd;
    off_t fsize = 0;
    sd_error e = {0};
    if (sd_open_regular(path, &fd, &fsize, &e)) {
        snprintf(why, why_len, "%.250s", e.msg); /* an open error: short */
        return NULL;
    }
    if (fsize > MAX_TEXT_FILE) {
        snprintf(why, why_len, "too large (%lld bytes, limit %d)", (long long)fsize, MAX_TEXT_FILE);
        close(fd);
        return NULL;
    }
    char *buf = sd_arena_alloc(a, (size_t)fsize + 1);
    size_t got = 0;
    while (buf && got < (size_t)fsize) {
        ssize_t r = read(fd, buf + got, (size_t)fsize - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(why, why_len, "%s", strerror(errno));
            close(fd);
            return NULL;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    buf[got] = 0;
    size_t bom = sd_bom_len(buf, got);
    *len = got - bom;
    return buf + bom;
}

/* Trim surrounding whitespace in place (returns the new start). */
static char *trim(char *s, size_t *len)
{
    size_t b = 0, e = *len;
    while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) b++;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r')) e--;
    s[e] = 0;
    *len = e - b;
    return s + b;
}

/* Read a .txt/.caption file: UTF-8 checked, surrounding blanks trimmed.
 * NULL with *reason and detail set when it cannot be used. */
static char *read_caption_file(sd_arena *a, const char *path, size_t *n, const char **reason, char *detail,
                               size_t detail_len)
{
    char why[256]; /* an sd_error message fits */
    char *t = read_text_file(a, path, n, why, sizeof why);
    if (!t) {
        *reason = "unreadable caption file";
        snprintf(detail, detail_len, "%s: %s", path, why);
        return NULL;
    }
    if (memchr(t, 0, *n)) { /* would cut the caption short; a UTF-16 file without its BOM looks like this */
        *reason = "caption contains NUL bytes (UTF-16?)";
        snprintf(detail, detail_len, "%s", path);
        return NULL;
    }
    if (sd_utf8_check(t, *n) != *n) {
        *reason = "caption not UTF-8";
        snprintf(detail, detail_len, "%s", path);
        return NULL;
    }
    return trim(t, n);
}

/* A caption written over several lines is one caption: each line break
 * (with the spaces around it) becomes one space. */
static void join_lines(char *t, size_t *n)
{
    size_t w = 0;
    for (size_t i = 0; i < *n; i++) {
        if (t[i] != '\n' && t[i] != '\r') {
            t[w++] = t[i];
            continue;
        }
        while (w > 0 && (t[w - 1] == ' ' || t[w - 1] == '\t')) w--;
        while (i + 1 < *n && (t[i + 1] == '\n' || t[i + 1] == '\r' || t[i + 1] == ' ' || t[i + 1] == '\t')) i++;
        if (w > 0) t[w++] = ' ';
    }
    t[w] = 0;
    *n = w;
}

/* One rule for the captions of every source (a .caption file, a tar's
 * .txt member, a JSON caption field, kohya metadata): blanks around the
 * caption trimmed and its line breaks (LF, CRLF, CR) joined as by
 * join_lines, so the same text gives the same caption, and the same
 * text-embedding key, wherever it was read. Copies only a caption that
 * changes. */
static void settle_caption(sd_arena *a, sd_record *r)
{
    const char *c = r->caption;
    if (!c || !*c) return;
    size_t n = strlen(c);
    int blank_ends = strchr(" \t\n\r", c[0]) || strchr(" \t\n\r", c[n - 1]);
    if (!blank_ends && !strpbrk(c, "\n\r")) return;
    char *t = sd_arena_strndup(a, c, n);
    if (!t) return;
    t = trim(t, &n);
    if (strpbrk(t, "\n\r")) r->caption_lines = sd_arena_strndup(a, t, n); /* each line a caption variant */
    join_lines(t, &n);
    r->caption = t;
}

/* A webdataset class label (a JSON number or string, or a .cls member's
 * text) through --cls-map: the label must be an integer, written any way
 * that means one (" 03\n", 3.0, 3e0 all are class 3), and the map must name
 * it by its plain decimal text; otherwise the record is skipped with the
 * reason. */
static int cls_caption(const sd_json *map, const char *txt, size_t len, const char **caption, const char **reason,
                       char *detail, size_t detail_len)
{
    while (len && (*txt == ' ' || *txt == '\t' || *txt == '\n' || *txt == '\r')) txt++, len--;
    while (len && (txt[len - 1] == ' ' || txt[len - 1] == '\t' || txt[len - 1] == '\n' || txt[len - 1] == '\r'))
        len--;
    char k[64];
    int ok = txt && len && len < sizeof k && strspn(txt, "0123456789+-.eE") >= len;
    double d = 0;
    if (ok) {
        memcpy(k, txt, len);
        k[len] = 0;
        char *end;
        d = strtod(k, &end);
        ok = end == k + len && d == floor(d) && fabs(d) <= 9007199254740992.0;
    }
    if (!ok) {
        *reason = "bad cls";
        snprintf(detail, detail_len, "class label '%.*s' is not an integer", (int)(len < 40 ? len : 40), txt ? txt : "");
        return -1;
    }
    snprintf(k, sizeof k, "%lld", (long long)d + 0); /* -0 is class 0 */
    *caption = sd_json_str(sd_json_get(map, k));
    if (!*caption) {
        *reason = "cls not in the class map";
        snprintf(detail, detail_len, "class %s", k);
        return -1;
    }
    return 0;
}

/* Turn a tags value into record tags: an array of strings, or one string
 * split on commas when it has any, else on spaces (booru style). */
static void add_tags_value(sd_record *r, sd_arena *a, const sd_json *v, sd_tag_cat cat)
{
    if (!v) return;
    if (v->type == SD_JSON_STRING) {
        char sep = memchr(v->str, ',', v->len) ? ',' : ' ';
        sd_record_add_tag_list(r, a, v->str, v->len, sep, cat);
    } else if (v->type == SD_JSON_ARRAY) {
        for (const sd_json *t = v->child; t; t = t->next)
            if (t->type == SD_JSON_STRING && t->len) sd_record_add_tag(r, a, t->str, t->len, cat);
    }
}

/* A number field as int, 0 when absent or not a positive number. */
static int int_field(const sd_json *v)
{
    double d;
    if (sd_json_num(v, &d) || d < 1 || d > 1e9) return 0;
    return (int)d;
}

/* A post's id or md5 as its key: a string as it is, a number as its
 * integer text (1001.0 and 1e3 are the posts 1001 and 1000, so their
 * duplicates are caught). NULL when absent or empty; NULL with *bad set
 * when the value cannot be a key (a fractional or huge number, NUL bytes). */
static const char *key_text(sd_arena *a, const sd_json *v, const char **bad)
{
    if (!v) return NULL;
    if (v->type == SD_JSON_STRING) {
        if (memchr(v->str, 0, v->len)) *bad = "post id contains NUL bytes";
        return v->len && !*bad ? v->str : NULL;
    }
    if (v->type != SD_JSON_NUMBER) return NULL;
    size_t sign = v->len && v->str[0] == '-';
    if (v->len > sign && strspn(v->str + sign, "0123456789") == v->len - sign) /* exact, however long */
        return sd_arena_strndup(a, v->str, v->len);
    double d;
    if (sd_json_whole(v, -9007199254740992.0, 9007199254740992.0, &d)) {
        *bad = "post id not an integer";
        return NULL;
    }
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)d + 0);
    return sd_arena_strndup(a, text, strlen(text));
}

/* A post's key: its id, else its md5 (e621: file.md5). -1 with *reason and
 * the detail when the value given cannot be a key. */
static int post_key(sd_record *r, sd_arena *a, const sd_json *post, int e621, const char **reason, char *detail,
                    size_t detail_len)
{
    const char *bad = NULL;
    const sd_json *id = sd_json_get(post, "id");
    r->key = key_text(a, id, &bad);
    if (!r->key && !bad) r->key = key_text(a, e621 ? sd_json_path(post, "file.md5", 8) : sd_json_get(post, "md5"), &bad);
    if (!bad) return 0;
    *reason = bad;
    if (id && id->type == SD_JSON_NUMBER) snprintf(detail, detail_len, "id %.*s", (int)(id->len < 40 ? id->len : 40), id->str);
    return -1;
}

/* Tags are length-counted, so one holding a NUL byte (a JSON "\u0000")
 * would pass into the record's tags while the caption, built as C text,
 * stops at it: the record is refused instead. The first such tag, or NULL. */
static const sd_tag *tag_with_nul(const sd_record *r)
{
    for (int i = 0; i < r->ntags; i++)
        if (r->tags[i].s && memchr(r->tags[i].s, 0, r->tags[i].len)) return &r->tags[i];
    return NULL;
}

/* A caption field of a JSON record: its text, or NULL when absent; -1 when
 * it holds a NUL byte (the caption would stop there). */
static int caption_field(const sd_json *v, const char **out)
{
    if (v && v->type == SD_JSON_STRING && memchr(v->str, 0, v->len)) return -1;
    *out = sd_json_str(v);
    return 0;
}

/* Danbooru2021-style tags (gwern's dumps): an array of {"name", "category"}
 * objects, category 0 general, 1 artist, 3 copyright, 4 character, 5 meta,
 * as a number or its text; any other category counts as general. */
static void add_tag_objects(sd_record *r, sd_arena *a, const sd_json *arr)
{
    static const sd_tag_cat by_number[] = {SD_TAG_GENERAL,   SD_TAG_ARTIST,    SD_TAG_GENERAL,
                                           SD_TAG_COPYRIGHT, SD_TAG_CHARACTER, SD_TAG_META};
    for (const sd_json *t = arr->child; t; t = t->next) {
        const sd_json *name = t->type == SD_JSON_OBJECT ? sd_json_get(t, "name") : t;
        if (!name || name->type != SD_JSON_STRING || !name->len) continue;
        double c;
        int known = t->type == SD_JSON_OBJECT && !sd_json_whole(sd_json_get(t, "category"), 0, 5, &c);
        sd_record_add_tag(r, a, name->str, name->len, known ? by_number[(int)c] : SD_TAG_GENERAL);
    }
}

/* A post's rating: Danbooru's letter (g/s/q/e) or a word as Gelbooru writes
 * it (general, sensitive, questionable, explicit, safe); NULL otherwise. */
static const char *danbooru_rating(const char *rt)
{
    static const char *const words[] = {"general", "sensitive", "questionable", "explicit", "safe"};
    if (!rt || !rt[0]) return NULL;
    if (!rt[1]) {
        switch (rt[0]) {
        case 'g': return "general";
        case 's': return "sensitive";
        case 'q': return "questionable";
        case 'e': return "explicit";
        }
        return NULL;
    }
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (strcmp(rt, words[i]) == 0) return words[i];
    return NULL;
}

/* Danbooru post: space-separated tag strings per category, g/s/q/e ratings.
 * Two other layouts read here too: Danbooru2021 dumps (tags an array of
 * tag objects) and Gelbooru posts (tags one space-separated string, rating
 * a word, width/height). */
static void fill_danbooru(sd_record *r, sd_arena *a, const sd_json *o)
{
    static const struct {
        const char *field;
        sd_tag_cat cat;
    } cats[] = {{"tag_string_artist", SD_TAG_ARTIST},       {"tag_string_copyright", SD_TAG_COPYRIGHT},
                {"tag_string_character", SD_TAG_CHARACTER}, {"tag_string_general", SD_TAG_GENERAL},
                {"tag_string_meta", SD_TAG_META}};
    int any = 0;
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++) {
        const sd_json *v = sd_json_get(o, cats[i].field);
        if (v && v->type == SD_JSON_STRING) {
            sd_record_add_tag_list(r, a, v->str, v->len, ' ', cats[i].cat);
            any = 1;
        }
    }
    const sd_json *tags = sd_json_get(o, "tags");
    if (!any && sd_json_get(o, "tag_string")) add_tags_value(r, a, sd_json_get(o, "tag_string"), SD_TAG_GENERAL);
    else if (!any && tags && tags->type == SD_JSON_ARRAY) add_tag_objects(r, a, tags);
    else if (!any && tags && tags->type == SD_JSON_STRING)
        sd_record_add_tag_list(r, a, tags->str, tags->len, ' ', SD_TAG_GENERAL);
    r->rating = danbooru_rating(sd_json_str(sd_json_get(o, "rating")));
    double d;
    if (!sd_json_num(sd_json_get(o, "score"), &d)) {
        r->has_score = 1;
        r->score = d;
    }
    r->width = int_field(sd_json_get(o, "image_width"));
    r->height = int_field(sd_json_get(o, "image_height"));
    if (!r->width && !r->height) { /* Gelbooru's names */
        r->width = int_field(sd_json_get(o, "width"));
        r->height = int_field(sd_json_get(o, "height"));
    }
    r->consumed = danbooru_consumed;
}

/* e621 post: tags{category: [..]}, score{total}, s/q/e ratings, file{...}. */
static void fill_e621(sd_record *r, sd_arena *a, const sd_json *o)
{
    static const struct {
        const char *field;
        sd_tag_cat cat;
    } cats[] = {{"artist", SD_TAG_ARTIST},   {"copyright", SD_TAG_COPYRIGHT}, {"character", SD_TAG_CHARACTER},
                {"species", SD_TAG_SPECIES}, {"general", SD_TAG_GENERAL},     {"lore", SD_TAG_LORE},
                {"meta", SD_TAG_META},       {"invalid", SD_TAG_INVALID}};
    const sd_json *tags = sd_json_get(o, "tags");
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++) add_tags_value(r, a, sd_json_get(tags, cats[i].field), cats[i].cat);
    const char *rt = sd_json_str(sd_json_get(o, "rating"));
    if (rt && rt[0] && !rt[1]) {
        switch (rt[0]) {
        case 's': r->rating = "safe"; break;
        case 'q': r->rating = "questionable"; break;
        case 'e': r->rating = "explicit"; break;
        }
    }
    const sd_json *sc = sd_json_get(o, "score");
    double d;
    if (sc && sc->type == SD_JSON_OBJECT) sc = sd_json_get(sc, "total");
    if (!sd_json_num(sc, &d)) {
        r->has_score = 1;
        r->score = d;
    }
    const sd_json *file = sd_json_get(o, "file");
    r->width = int_field(sd_json_get(file, "width"));
    r->height = int_field(sd_json_get(file, "height"));
    r->consumed = e621_consumed;
}

/* Is a post in e621's layout? Only e621 groups its tags in an object by
 * category; a tags array (Danbooru2021) or string (Gelbooru) is read as
 * Danbooru, as are posts with Danbooru's tag_string fields. */
static int is_e621_post(const sd_json *post)
{
    const sd_json *tags = sd_json_get(post, "tags");
    return sd_json_get(post, "tag_string_general") == NULL && sd_json_get(post, "tag_string") == NULL && tags &&
           tags->type == SD_JSON_OBJECT;
}

/* Is rel (a path below an image folder) the key plus an extension? */
static int path_is_key_ext(const char *rel, const char *key)
{
    size_t kl = strlen(key);
    return strncmp(rel, key, kl) == 0 && rel[kl] == '.' && !strchr(rel + kl, '/');
}

/* Join dir and name with one slash. */
static char *join_path(sd_arena *a, const char *dir, const char *name)
{
    if (!dir || !*dir || name[0] == '/') return sd_arena_strndup(a, name, strlen(name));
    size_t dl = strlen(dir), nl = strlen(name);
    char *p = sd_arena_alloc(a, dl + nl + 2);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    size_t o = dl;
    if (dl && dir[dl - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, nl + 1);
    return p;
}

/* Does a regular, readable file exist at path? */
static int image_ok(const char *path, const char **reason)
{
    if (access(path, R_OK) != 0) {
        *reason = errno == ENOENT ? "missing image" : "unreadable image";
        return 0;
    }
    return 1;
}

/* A BMP by its name (any case): sd-bucket and sd-latents refuse BMP
 * (sd_img_refusal), so sd-meta refuses it too, for the same reason, rather
 * than pass on a record the next tool drops. */
static int bmp_name(const char *name)
{
    size_t n = strlen(name);
    return n > 4 && strcasecmp(name + n - 4, ".bmp") == 0;
}

/* Copy a source string into the record after checking it is UTF-8. */
static int take_text(sd_arena *a, const char *s, size_t n, const char **out)
{
    if (sd_utf8_check(s, n) != n) return -1;
    *out = sd_arena_strndup(a, s, n);
    return *out ? 0 : -1;
}

/* sd-scripts' image for a kohya metadata key: the key itself when it names
 * an image file, else the key with each of its image extensions (lower and
 * upper case), the first in sorted order when several exist (its
 * glob_images sorts the matches). NULL when there is none. */
static char *kohya_image(sd_arena *a, const char *root, const char *key)
{
    if (sd_is_image_name(key, strlen(key))) {
        char *p = join_path(a, root, key);
        if (p && access(p, F_OK) == 0) return p;
    }
    static const char *const exts[] = {".png", ".jpg", ".jpeg", ".webp", ".bmp",
                                       ".PNG", ".JPG", ".JPEG", ".WEBP", ".BMP"};
    char *best = NULL;
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++) {
        char name[4096];
        if ((size_t)snprintf(name, sizeof name, "%s%s", key, exts[i]) >= sizeof name) return NULL;
        char *p = join_path(a, root, name);
        if (p && access(p, F_OK) == 0 && (!best || strcmp(p, best) < 0)) best = p;
    }
    return best;
}

/* Build a record from an input. Returns 0, or -1 with *reason (a literal for
 * the skip tally) and a detail message. */
int sd_input_build(const sd_input *in, const sd_build_opts *o, sd_arena *a, sd_record *r, const char **reason,
                   char *detail, size_t detail_len)
{
    sd_record_init(r);
    detail[0] = 0;
    r->key = in->key;
    r->image = in->image;
    r->member = in->member;
    r->offset = in->offset;
    r->size = in->size;
    r->width = in->width;
    r->height = in->height;

    if (in->kind == SD_IN_BOORU || in->kind == SD_IN_METAFILE) {
        sd_json *root;
        sd_error err = {SD_OK, ""};
        char *text = in->text;
        size_t len = in->len;
        if (!text && in->txt_path) {
            char why[256]; /* an sd_error message fits */
            text = read_text_file(a, in->txt_path, &len, why, sizeof why);
            if (!text) {
                *reason = "unreadable metadata file";
                snprintf(detail, detail_len, "%s", why);
                return -1;
            }
        }
        const char *pristine = text ? sd_arena_strndup(a, text, len) : NULL;
        int nonfinite = 0;
        if (!text || sd_json_parse_py(a, text, len, &root, &nonfinite, &err)) {
            *reason = "malformed JSON";
            snprintf(detail, detail_len, "%s", err.msg);
            return -1;
        }
        if (root->type != SD_JSON_OBJECT) {
            *reason = "record is not a JSON object";
            return -1;
        }
        r->fields = root;
        r->fields_text = nonfinite ? NULL : pristine; /* NaN/Infinity: re-serialised, as null */
        if (in->kind == SD_IN_METAFILE) {
            add_tags_value(r, a, sd_json_get(root, "tags"), SD_TAG_GENERAL);
            double d;
            if (!sd_json_num(sd_json_get(root, "score"), &d)) {
                r->has_score = 1;
                r->score = d;
            }
            if (caption_field(sd_json_get(root, "caption"), &r->caption)) {
                *reason = "caption contains NUL bytes";
                return -1;
            }
            r->width = int_field(sd_json_get(root, "width"));
            r->height = int_field(sd_json_get(root, "height"));
            const char *path = sd_json_str(sd_json_get(root, "path"));
            if (!path || !*path) {
                *reason = "no image path in metadata";
                return -1;
            }
            r->image = join_path(a, in->root, path);
            const char *dot = strrchr(path, '.');
            r->key = dot && dot > strrchr(path, '/') ? sd_arena_strndup(a, path, (size_t)(dot - path)) : path;
            r->consumed = metafile_consumed;
        } else {
            int e621 = o->force_e621 >= 0 ? o->force_e621 : is_e621_post(root);
            if (e621) fill_e621(r, a, root);
            else fill_danbooru(r, a, root);
            if (post_key(r, a, root, e621, reason, detail, detail_len)) return -1;
            if (!r->key) {
                *reason = "post has no id or md5";
                return -1;
            }
            if (o->image_pattern) {
                sd_buf pb;
                sd_buf_init(&pb);
                const char *missing = NULL;
                if (sd_pattern_format(o->image_pattern, root, &pb, &missing)) {
                    sd_buf_free(&pb);
                    *reason = "image pattern field missing";
                    snprintf(detail, detail_len, "no value for {%.*s}", (int)strcspn(missing, "%:}"), missing);
                    return -1;
                }
                r->image = join_path(a, o->image_root, sd_buf_cstr(&pb));
                r->image_off_key = !path_is_key_ext(sd_buf_cstr(&pb), r->key);
                sd_buf_free(&pb);
            }
        }
    } else if (in->kind == SD_IN_FILES) {
        size_t n;
        int found = 0;
        if (in->txt_path) {
            char *t = read_caption_file(a, in->txt_path, &n, reason, detail, detail_len);
            if (!t) return -1;
            if (n) found = 1;
            sd_record_add_tag_list(r, a, t, n, ',', SD_TAG_GENERAL);
        }
        if (in->cap_path) {
            char *c = read_caption_file(a, in->cap_path, &n, reason, detail, detail_len);
            if (!c) return -1;
            if (strpbrk(c, "\n\r")) r->caption_lines = sd_arena_strndup(a, c, n); /* each line a caption variant */
            join_lines(c, &n);
            if (n) {
                found = 1;
                r->caption = c;
            }
        }
        if (!in->txt_path && !in->cap_path) {
            *reason = "missing caption";
            snprintf(detail, detail_len, "no .txt or .caption beside %s", in->image);
            return -1;
        }
        if (!found) {
            *reason = "empty caption";
            return -1;
        }
    } else { /* SD_IN_GIVEN */
        if (in->caption && take_text(a, in->caption, strlen(in->caption), &r->caption)) {
            *reason = "caption not UTF-8";
            return -1;
        }
        if (in->tags_text) {
            const char *t;
            if (take_text(a, in->tags_text, strlen(in->tags_text), &t)) {
                *reason = "caption not UTF-8";
                return -1;
            }
            sd_record_add_tag_list(r, a, t, strlen(t), ',', SD_TAG_GENERAL);
        }
        if (in->text) { /* a webdataset .json member: fields pass through */
            sd_json *root;
            sd_error err = {SD_OK, ""};
            int nonfinite; /* NaN/Infinity: kept as numbers for --where, written as null */
            if (sd_json_parse_py(a, in->text, in->len, &root, &nonfinite, &err) || root->type != SD_JSON_OBJECT) {
                *reason = "malformed JSON";
                snprintf(detail, detail_len, "%s", err.msg);
                return -1;
            }
            r->fields = root;
            r->consumed = wds_consumed;
            if (!r->caption && caption_field(sd_json_get(root, "caption"), &r->caption)) {
                *reason = "caption contains NUL bytes";
                return -1;
            }
            if (!r->width) r->width = int_field(sd_json_get(root, "width"));
            if (!r->height) r->height = int_field(sd_json_get(root, "height"));
            const sd_json *cls = sd_json_get(root, "cls");
            if (!r->caption && cls && o->cls_map) {
                const char *txt = cls->type == SD_JSON_NUMBER || cls->type == SD_JSON_STRING ? cls->str : NULL;
                if (cls_caption(o->cls_map, txt, txt ? cls->len : 0, &r->caption, reason, detail, detail_len))
                    return -1;
            }
        }
        if (in->cls_text && !r->caption && o->cls_map &&
            cls_caption(o->cls_map, in->cls_text, strlen(in->cls_text), &r->caption, reason, detail, detail_len))
            return -1;
        if (in->kind == SD_IN_GIVEN && in->member == NULL && !r->image && in->root) {
            r->image = kohya_image(a, in->root, in->key);
            if (!r->image && o->check_images) { /* --no-check-images: the record goes out without one */
                *reason = "missing image";
                snprintf(detail, detail_len, "no image file for key %s under %s", in->key, in->root);
                return -1;
            }
        }
        if (!r->caption && r->ntags == 0) {
            *reason = "missing caption";
            return -1;
        }
    }
    settle_caption(a, r);
    const sd_tag *nul = tag_with_nul(r);
    if (nul) {
        *reason = "tag contains NUL bytes";
        char esc[80];
        snprintf(esc, sizeof esc, "%.*s", (int)(nul->len < 60 ? nul->len : 60), nul->s);
        snprintf(detail, detail_len, "tag '%s\\u0000...'", esc);
        return -1;
    }
    if (!r->key || !*r->key) {
        *reason = "no key";
        return -1;
    }
    if (o->check_images && r->image && !r->member && !image_ok(r->image, reason)) {
        snprintf(detail, detail_len, "%s", r->image);
        return -1;
    }
    if (o->check_images && r->image && bmp_name(r->member ? r->member : r->image)) {
        *reason = "not a supported image"; /* sd-bucket's reason */
        if (!r->member && in->origin && strcmp(in->origin, r->image) == 0) /* the message names it already */
            snprintf(detail, detail_len, "%s", sd_img_refusal(SD_IMG_BMP));
        else
            snprintf(detail, detail_len, "%s%s%s%s: %s", r->image, r->member ? "[" : "", r->member ? r->member : "",
                     r->member ? "]" : "", sd_img_refusal(SD_IMG_BMP));
        return -1;
    }
    return 0;
}
