/* meta_lat.json / meta_cap_dd.json: the fine-tune metadata sd-scripts keys
 * by image stem (or full image path with --full_path). */
#include <stdlib.h>
#include <string.h>

#include "kohya_cache.h"
#include "slurp.h"

/* Stem of a full-path key: base name without directory and extension. */
static void key_stem(const char *k, size_t n, size_t *b, size_t *e)
{
    size_t s = n;
    while (s > 0 && k[s - 1] != '/' && k[s - 1] != '\\') s--;
    size_t d = n;
    while (d > s && k[d - 1] != '.') d--;
    *b = s;
    *e = d > s + 1 ? d - 1 : n;
}

/* Fill one entry from its JSON object; non-objects are entries with nothing. */
static void read_entry(const sd_json *v, sd_kohya_meta_entry *e)
{
    memset(e, 0, sizeof *e);
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

/* Load a kohya metadata JSON object and index it by key and by stem. */
sd_status sd_kohya_meta_load(sd_kohya_meta *m, const char *path, sd_error *err)
{
    memset(m, 0, sizeof *m);
    sd_buf_init(&m->text);
    sd_arena_init(&m->arena, 1 << 16);
    sd_strmap_init(&m->by_key);
    sd_strmap_init(&m->by_stem);
    sd_json *root;
    sd_status st = sd_parse_json_file(path, &m->text, &m->arena, &root, err);
    if (st) return st;
    if (root->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "%s: not a JSON object", path);
    m->e = calloc(root->len ? root->len : 1, sizeof *m->e);
    if (!m->e) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (const sd_json *v = root->child; v; v = v->next) {
        read_entry(v, &m->e[m->n]);
        sd_strmap_slot *s = sd_strmap_put(&m->by_key, v->key, v->key_len);
        size_t b, e;
        key_stem(v->key, v->key_len, &b, &e);
        sd_strmap_slot *t = sd_strmap_put(&m->by_stem, v->key + b, e - b);
        if (!s || !t) return sd_err_set(err, SD_ENOMEM, "out of memory");
        s->nval = (double)(m->n + 1);
        if (!t->nval) t->nval = (double)(m->n + 1); /* first wins for clashing stems */
        m->n++;
    }
    return SD_OK;
}

/* The entry for a record name (image stem, maybe with directories): exact
 * key first, then the name's stem against the keys' stems. */
const sd_kohya_meta_entry *sd_kohya_meta_find(const sd_kohya_meta *m, const char *name)
{
    size_t n = strlen(name);
    const sd_strmap_slot *s = sd_strmap_get(&m->by_key, name, n);
    if (!s) {
        size_t b = n;
        while (b > 0 && name[b - 1] != '/') b--;
        s = sd_strmap_get(&m->by_stem, name + b, n - b);
    }
    return s && s->nval >= 1 ? &m->e[(size_t)s->nval - 1] : NULL;
}

/* Free the text, the parse and the indexes. */
void sd_kohya_meta_free(sd_kohya_meta *m)
{
    sd_strmap_free(&m->by_key);
    sd_strmap_free(&m->by_stem);
    free(m->e);
    sd_arena_free(&m->arena);
    sd_buf_free(&m->text);
    m->e = NULL;
    m->n = 0;
}
