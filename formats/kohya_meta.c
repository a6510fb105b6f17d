/* meta_lat.json / meta_cap_dd.json: the fine-tune metadata sd-scripts keys
 * by image stem, or by image path with --full_path (then the same stem can
 * appear in several directories, so a record is matched by its path). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kohya_cache.h"
#include "slurp.h"

/* 1 for a path separator in a key (sd-scripts on Windows writes '\'). */
static int is_sep(char c)
{
    return c == '/' || c == '\\';
}

/* Length of a key without its image extension: full-path keys name the
 * image file, stem keys have none (a stem may hold dots: "img.v2"). */
static size_t strip_image_ext(const char *k, size_t n)
{
    static const char *const exts[] = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".avif", ".jxl"};
    for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
        size_t e = strlen(exts[i]);
        if (n > e && !is_sep(k[n - e - 1]) && strncasecmp(k + n - e, exts[i], e) == 0) return n - e;
    }
    return n;
}

/* The last path component of s[0, *end) that is not empty or ".": sets
 * [*b, *end) to it and returns 1, or 0 when none is left. */
static int prev_component(const char *s, size_t *b, size_t *end)
{
    size_t e = *end;
    for (;;) {
        while (e > 0 && is_sep(s[e - 1])) e--;
        if (e == 0) return 0;
        size_t a = e;
        while (a > 0 && !is_sep(s[a - 1])) a--;
        if (!(e - a == 1 && s[a] == '.')) {
            *b = a;
            *end = e;
            return 1;
        }
        e = a;
    }
}

/* How many trailing components a name and a key stem share, 0 when they
 * disagree before one of them runs out (another directory). */
static int suffix_depth(const char *name, size_t nlen, const char *key, size_t klen)
{
    size_t ne = nlen, ke = klen, nb, kb;
    int depth = 0;
    while (prev_component(name, &nb, &ne) && prev_component(key, &kb, &ke)) {
        if (ne - nb != ke - kb || memcmp(name + nb, key + kb, ne - nb)) return 0;
        depth++;
        ne = nb;
        ke = kb;
    }
    return depth;
}

/* Fill one entry from its JSON object; non-objects are entries with nothing. */
static void read_entry(const sd_json *v, sd_kohya_meta_entry *e)
{
    memset(e, 0, sizeof *e);
    e->key = v->key;
    if (v->type != SD_JSON_OBJECT) return;
    const sd_json *c = sd_json_get(v, "caption"), *t = sd_json_get(v, "tags"), *r = sd_json_get(v, "train_resolution");
    if (c && c->type == SD_JSON_STRING) e->caption = c->str;
    if (t && t->type == SD_JSON_STRING) e->tags = t->str;
    if (r && r->type == SD_JSON_ARRAY && r->len == 2 && r->child->type == SD_JSON_NUMBER &&
        r->child->next->type == SD_JSON_NUMBER && r->child->num >= 1 && r->child->num <= 1e6 &&
        r->child->next->num >= 1 && r->child->next->num <= 1e6) {
        e->train_w = (uint32_t)r->child->num;
        e->train_h = (uint32_t)r->child->next->num;
    }
}

/* Index entry i by its exact key and by its base stem (a chain per stem). */
static sd_status index_entry(sd_kohya_meta *m, size_t i, const char *key, size_t klen, sd_error *err)
{
    size_t end = strip_image_ext(key, klen), b = 0;
    if (!prev_component(key, &b, &end)) b = end = 0;
    sd_strmap_slot *s = sd_strmap_put(&m->by_key, key, klen), *t = sd_strmap_put(&m->by_base, key + b, end - b);
    if (!s || !t) return sd_err_set(err, SD_ENOMEM, "out of memory");
    s->nval = (double)(i + 1);
    m->next_same_base[i] = (size_t)t->nval;
    t->nval = (double)(i + 1);
    return SD_OK;
}

/* An empty index; sd_kohya_meta_free releases it whatever follows. */
static void meta_init(sd_kohya_meta *m)
{
    memset(m, 0, sizeof *m);
    sd_buf_init(&m->text);
    sd_arena_init(&m->arena, 1 << 16);
    sd_strmap_init(&m->by_key);
    sd_strmap_init(&m->by_base);
}

/* Room for n entries and their same-base chain. */
static sd_status meta_alloc(sd_kohya_meta *m, size_t n, sd_error *err)
{
    m->e = calloc(n ? n : 1, sizeof *m->e);
    m->next_same_base = calloc(n ? n : 1, sizeof *m->next_same_base);
    return m->e && m->next_same_base ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory");
}

/* Load a kohya metadata JSON object and index it by key and by base stem. */
sd_status sd_kohya_meta_load(sd_kohya_meta *m, const char *path, sd_error *err)
{
    meta_init(m);
    sd_json *root;
    sd_status st = sd_parse_json_file(path, &m->text, &m->arena, &root, err);
    if (st) return st;
    if (root->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "%s: not a JSON object", path);
    if ((st = meta_alloc(m, root->len, err))) return st;
    for (const sd_json *v = root->child; !st && v; v = v->next) {
        read_entry(v, &m->e[m->n]);
        st = index_entry(m, m->n, v->key, v->key_len, err);
        m->n++;
    }
    return st;
}

/* Index n keys alone (no captions; the strings stay the caller's and must
 * outlive m), to match names against them as against a metadata file's. */
sd_status sd_kohya_meta_index_keys(sd_kohya_meta *m, const char *const *keys, size_t n, sd_error *err)
{
    meta_init(m);
    sd_status st = meta_alloc(m, n, err);
    for (size_t i = 0; i < n && !st; i++) {
        m->e[i].key = keys[i];
        st = index_entry(m, i, keys[i], strlen(keys[i]), err);
        m->n++;
    }
    return st;
}

/* Keep the best candidate of the base-stem chain: deeper wins, a tie at
 * the best depth makes the result ambiguous. */
static void consider(sd_kohya_meta_match *out, const sd_kohya_meta_entry *e, int depth)
{
    if (depth == 0 || depth < out->depth) return;
    if (depth > out->depth) {
        out->depth = depth;
        out->entry = e;
        out->ambiguous = 0;
        out->cand[0] = e;
        out->cand[1] = NULL;
    } else if (!out->ambiguous) {
        out->ambiguous = 1;
        out->cand[1] = e;
    }
}

/* The entry for a record name (image stem with its directories under the
 * cache directory): an exact key first, else the key sharing the most
 * trailing components with the name (see sd_kohya_meta_match). */
void sd_kohya_meta_find(const sd_kohya_meta *m, const char *name, sd_kohya_meta_match *out)
{
    memset(out, 0, sizeof *out);
    size_t n = strlen(name), b = 0, end = n;
    const sd_strmap_slot *s = sd_strmap_get(&m->by_key, name, n);
    if (s && s->nval >= 1) {
        out->entry = out->cand[0] = &m->e[(size_t)s->nval - 1];
        for (size_t e = n; prev_component(name, &b, &e); e = b) out->depth++;
        return;
    }
    if (!prev_component(name, &b, &end)) return;
    const sd_strmap_slot *t = sd_strmap_get(&m->by_base, name + b, end - b);
    size_t chain = 0;
    for (size_t i = t ? (size_t)t->nval : 0; i; i = m->next_same_base[i - 1], chain++) {
        const sd_kohya_meta_entry *e = &m->e[i - 1];
        size_t klen = strlen(e->key);
        consider(out, e, suffix_depth(name, n, e->key, strip_image_ext(e->key, klen)));
    }
    if (out->depth == 1 && chain > 1 && !out->ambiguous) { /* the base name alone, and not unique */
        out->ambiguous = 1;
        for (size_t i = (size_t)t->nval; i && !out->cand[1]; i = m->next_same_base[i - 1])
            if (&m->e[i - 1] != out->cand[0]) out->cand[1] = &m->e[i - 1];
    }
    if (out->ambiguous) out->entry = NULL;
}

/* Free the text, the parse and the indexes. */
void sd_kohya_meta_free(sd_kohya_meta *m)
{
    sd_strmap_free(&m->by_key);
    sd_strmap_free(&m->by_base);
    free(m->e);
    free(m->next_same_base);
    sd_arena_free(&m->arena);
    sd_buf_free(&m->text);
    m->e = NULL;
    m->next_same_base = NULL;
    m->n = 0;
}
