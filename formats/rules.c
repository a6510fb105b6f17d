#include "rules.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hash.h"
#include "slurp.h"

/* The largest integer every JSON number up to it holds exactly (2^53): the
 * bound for integer keys stored in a long or a 64-bit seed. */
static const double max_exact_int = 9007199254740992.0;

static const int default_order[] = {SD_TAG_CHARACTER, SD_TAG_COPYRIGHT, SD_TAG_ARTIST, SD_TAG_SPECIES,
                                    SD_TAG_GENERAL,   SD_TAG_LORE,      SD_TAG_META};

/* Defaults: keep everything, kohya's underscore rule on, caption "{caption}, {tags}". */
void sd_rules_init(sd_rules *r)
{
    memset(r, 0, sizeof *r);
    sd_strmap_init(&r->blacklist);
    sd_strmap_init(&r->ratings);
    sd_strmap_init(&r->bonus);
    sd_strmap_init(&r->replace_tags);
    sd_strmap_init(&r->non_caption);
    sd_strmap_init(&r->rating_words);
    r->underscores = 1;
    r->variants.k = 1;
    r->ntag_order = (int)(sizeof default_order / sizeof *default_order);
    memcpy(r->tag_order, default_order, sizeof default_order);
    r->score_tag_prefix = strdup("scr");
    r->artist_prefix = strdup("");
    r->template_ = strdup("{caption}, {score_tag}, {tags}");
    r->separator = strdup(", ");
}

/* Free a map whose string values were strdup'ed by us. */
static void free_map_with_values(sd_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key) free((char *)m->slots[i].sval);
    sd_strmap_free(m);
}

/* Release everything the rules own. */
void sd_rules_free(sd_rules *r)
{
    sd_strmap_free(&r->blacklist);
    sd_strmap_free(&r->ratings);
    sd_strmap_free(&r->bonus);
    free_map_with_values(&r->replace_tags);
    sd_strmap_free(&r->non_caption);
    free_map_with_values(&r->rating_words);
    for (int i = 0; i < r->nwhere; i++) {
        free(r->where[i].field);
        free(r->where[i].str);
        free(r->where[i].reason_fail);
        free(r->where[i].reason_missing);
        free(r->where[i].reason_type);
    }
    free(r->where);
    for (int i = 0; i < r->nsubst; i++) {
        free(r->subst[i].from);
        free(r->subst[i].to);
    }
    free(r->subst);
    free(r->score_tags);
    free(r->score_tag_prefix);
    free(r->artist_prefix);
    free(r->template_);
    free(r->separator);
    memset(r, 0, sizeof *r);
}

/* The form tags are compared in: ASCII lower-case, '_' as ' ', so "Long_Hair"
 * in a rules file matches "long hair" in a caption file. Returns the length,
 * or cap when the tag does not fit (then it matches nothing). */
size_t sd_tag_normalize(const char *s, size_t n, char *out, size_t cap)
{
    if (n >= cap) return cap;
    const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull, low7 = 0x7f7f7f7f7f7f7f7full;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { /* 8 bytes at a time, exact for any byte values */
        uint64_t v;
        memcpy(&v, s + i, 8);
        uint64_t v7 = v & low7;
        uint64_t upper = (v7 + (0x80 - 'A') * ones) & ~(v7 + (0x80 - 'Z' - 1) * ones) & ~v & high;
        uint64_t x = v ^ ('_' * ones);
        uint64_t under = ~(((x & low7) + low7) | x) & high;
        v += upper >> 2;                    /* 'A'..'Z' + 0x20 */
        v -= (under >> 7) * ('_' - ' ');    /* '_' -> ' ' */
        memcpy(out + i, &v, 8);
    }
    for (; i < n; i++) {
        char c = s[i];
        out[i] = c == '_' ? ' ' : (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    out[n] = 0;
    return n;
}

/* The form tags are matched in: sd_tag_normalize's, without the '\' of an
 * escaped parenthesis, so "cat \(animal\)" (as A1111 taggers write it, or
 * as --escape-parens leaves it) matches "cat (animal)" in the rules. Returns
 * the length, or cap when the tag does not fit (then it matches nothing). */
size_t sd_tag_match_form(const char *s, size_t n, char *out, size_t cap)
{
    if (n >= cap) return cap;
    if (!memchr(s, '\\', n)) return sd_tag_normalize(s, n, out, cap);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '\\' && i + 1 < n && (s[i + 1] == '(' || s[i + 1] == ')'))) out[k++] = s[i];
    return sd_tag_normalize(out, k, out, cap); /* in place: each byte is read before it is written */
}

/* Insert a tag into a normalised map. */
static sd_strmap_slot *tag_put(sd_strmap *m, const char *s, size_t n)
{
    char tmp[512];
    size_t k = sd_tag_match_form(s, n, tmp, sizeof tmp);
    return k == sizeof tmp ? NULL : sd_strmap_put(m, tmp, k);
}

/* Add a comma-separated tag list (flags like --blacklist) to a set. */
sd_status sd_rules_add_tags(sd_strmap *set, const char *list, sd_error *err)
{
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && (*p == ' ')) p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if (n && !tag_put(set, p, n)) return sd_err_set(err, SD_EINVAL, "tag too long or out of memory: %.*s", (int)n, p);
        if (!e) break;
        p = e + 1;
    }
    return SD_OK;
}

/* The value side of a condition (takes vs): quoted text; an unquoted true,
 * false or null, compared as JSON so boolean fields such as Danbooru's
 * is_deleted can be tested; a number; else unquoted text. */
static void where_value(sd_where *w, char *vs, size_t vl)
{
    static const struct {
        const char *s;
        sd_json_type t;
    } lits[] = {{"true", SD_JSON_TRUE}, {"false", SD_JSON_FALSE}, {"null", SD_JSON_NULL}};
    if (vl >= 2 && (vs[0] == '"' || vs[0] == '\'') && vs[vl - 1] == vs[0]) {
        memmove(vs, vs + 1, vl - 2);
        vs[vl - 2] = 0;
        w->str = vs;
        return;
    }
    for (size_t i = 0; i < sizeof lits / sizeof *lits; i++)
        if (strcmp(vs, lits[i].s) == 0) {
            w->is_literal = 1;
            w->literal = lits[i].t;
            free(vs);
            return;
        }
    char *end;
    errno = 0;
    double d = strtod(vs, &end);
    if (!errno && end != vs && *end == 0) {
        w->is_num = 1;
        w->num = d;
        free(vs);
        return;
    }
    w->str = vs;
}

/* The tally reasons of a condition, made once so workers only point at them. */
static void where_reasons(sd_where *w, const char *expr)
{
    size_t rl = strlen(expr) + 32;
    w->reason_fail = malloc(rl);
    w->reason_missing = malloc(rl);
    w->reason_type = malloc(rl);
    snprintf(w->reason_fail, rl, "where %s", expr);
    snprintf(w->reason_missing, rl, "where %s: field missing", expr);
    snprintf(w->reason_type, rl, "where %s: %s", expr, w->is_num ? "not a number" : "not text");
}

/* Parse "field<=0.5", "rating==general", "aesthetic>6", "is_deleted==false"
 * into a condition. Orderings of text or of true/false/null mean nothing and
 * are refused here rather than failing every record. */
sd_status sd_rules_add_where(sd_rules *r, const char *expr, sd_error *err)
{
    static const struct {
        const char *s;
        sd_cmp_op op;
    } ops[] = {{"<=", SD_CMP_LE}, {">=", SD_CMP_GE}, {"==", SD_CMP_EQ}, {"!=", SD_CMP_NE},
               {"<", SD_CMP_LT},  {">", SD_CMP_GT},  {"=", SD_CMP_EQ}};
    const char *best = NULL;
    size_t oplen = 0;
    sd_cmp_op op = SD_CMP_EQ;
    for (const char *p = expr; *p && !best; p++)
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
            if (strncmp(p, ops[i].s, strlen(ops[i].s)) == 0) {
                best = p;
                oplen = strlen(ops[i].s);
                op = ops[i].op;
                break;
            }
    if (!best) return sd_err_set(err, SD_EINVAL, "condition '%s' has no comparison (< <= > >= == !=)", expr);
    const char *f = expr, *fe = best;
    while (f < fe && *f == ' ') f++;
    while (fe > f && fe[-1] == ' ') fe--;
    const char *v = best + oplen;
    while (*v == ' ') v++;
    size_t vl = strlen(v);
    while (vl && v[vl - 1] == ' ') vl--;
    if (fe == f || vl == 0) return sd_err_set(err, SD_EINVAL, "condition '%s' needs a field and a value", expr);
    sd_where *nw = realloc(r->where, (size_t)(r->nwhere + 1) * sizeof *nw);
    if (!nw) return sd_err_set(err, SD_ENOMEM, "out of memory");
    r->where = nw;
    sd_where *w = &r->where[r->nwhere];
    memset(w, 0, sizeof *w);
    w->field = strndup(f, (size_t)(fe - f));
    w->op = op;
    char *vs = strndup(v, vl);
    if (!w->field || !vs) {
        free(w->field);
        free(vs);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    where_value(w, vs, vl);
    if (!w->is_num && op != SD_CMP_EQ && op != SD_CMP_NE) {
        free(w->field);
        free(w->str);
        return sd_err_set(err, SD_EINVAL, "condition '%s': only == and != compare %s", expr,
                          w->is_literal ? "true, false and null" : "text");
    }
    where_reasons(w, expr);
    r->nwhere++;
    return SD_OK;
}

/* Set the caption's category order from "character,copyright,artist,general". */
sd_status sd_rules_set_tag_order(sd_rules *r, const char *list, sd_error *err)
{
    r->ntag_order = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char name[32];
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        int c = sd_tag_cat_parse(name);
        if (c < 0) return sd_err_set(err, SD_EINVAL, "unknown tag category '%s'", name);
        if (r->ntag_order < SD_TAG_NCAT) r->tag_order[r->ntag_order++] = c;
        if (!e) break;
        p = e + 1;
    }
    return SD_OK;
}

/* Replace *dst with a copy of a JSON string member, if present. */
static sd_status take_str(const sd_json *root, const char *name, char **dst, sd_error *err)
{
    const sd_json *v = sd_json_get(root, name);
    if (!v) return SD_OK;
    if (v->type != SD_JSON_STRING) return sd_err_set(err, SD_EFORMAT, "rules: '%s' must be a string", name);
    free(*dst);
    *dst = strdup(v->str);
    return *dst ? SD_OK : sd_err_set(err, SD_ENOMEM, "rules: out of memory");
}

/* Fill a tag set from a JSON array of strings. */
static sd_status take_tag_set(const sd_json *root, const char *name, sd_strmap *set, sd_error *err)
{
    const sd_json *v = sd_json_get(root, name);
    if (!v) return SD_OK;
    if (v->type != SD_JSON_ARRAY) return sd_err_set(err, SD_EFORMAT, "rules: '%s' must be an array of strings", name);
    for (const sd_json *t = v->child; t; t = t->next) {
        if (t->type != SD_JSON_STRING) return sd_err_set(err, SD_EFORMAT, "rules: '%s' must hold strings", name);
        if (!tag_put(set, t->str, t->len)) return sd_err_set(err, SD_EINVAL, "rules: tag too long in '%s'", name);
    }
    return SD_OK;
}

/* Read a number member; 1 if present. After an earlier error (*st set)
 * nothing is read, so the first message stands. */
static int take_num(const sd_json *root, const char *name, double *out, sd_error *err, sd_status *st)
{
    const sd_json *v = *st ? NULL : sd_json_get(root, name);
    if (!v) return 0;
    if (v->type != SD_JSON_NUMBER) {
        *st = sd_err_set(err, SD_EFORMAT, "rules: '%s' must be a number", name);
        return 0;
    }
    *out = v->num;
    return 1;
}

/* Read an integer member in [lo, hi]; 1 if present. A fraction or a value
 * out of range is an error naming the key: casting it would wrap, or (a
 * negative keep_tokens) index outside the caption's tokens. */
static int take_int(const sd_json *root, const char *name, double lo, double hi, double *out, sd_error *err,
                    sd_status *st)
{
    double d;
    if (!take_num(root, name, &d, err, st)) return 0;
    if (!(d >= lo && d <= hi) || d != floor(d)) {
        const sd_json *v = sd_json_get(root, name); /* a number's str is its source text, len bytes */
        *st = sd_err_set(err, SD_ERANGE, "rules: '%s' must be an integer from %.0f to %.0f, got %.*s", name, lo, hi,
                         (int)v->len, v->str);
        return 0;
    }
    *out = d;
    return 1;
}

/* Read a boolean member into *out if present. */
static sd_status take_bool(const sd_json *root, const char *name, int *out, sd_error *err)
{
    const sd_json *v = sd_json_get(root, name);
    if (!v) return SD_OK;
    if (v->type != SD_JSON_TRUE && v->type != SD_JSON_FALSE)
        return sd_err_set(err, SD_EFORMAT, "rules: '%s' must be true or false", name);
    *out = v->type == SD_JSON_TRUE;
    return SD_OK;
}

/* Compare thresholds for qsort, largest first. */
static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Apply a parsed rules document (see docs/FORMATS.md for every key). Unknown
 * keys are an error, so a typo never silently disables a filter. */
sd_status sd_rules_load_json(sd_rules *r, const sd_json *root, sd_error *err)
{
    static const char *const known[] = {
        "blacklist_tags", "ratings", "abs_min_score", "min_score", "tag_bonus_scores", "where", "min_side",
        "min_pixels", "underscores", "escape_parens", "replace_tags", "replace_substrings", "non_caption_tags",
        "score_tags", "score_tag_prefix", "tag_order", "rating_words", "artist_prefix", "caption_template",
        "tag_separator", "shuffle_tag_p", "keep_tokens", "seed", "val_every", "val_fraction", NULL};
    if (root->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "rules: top level must be an object");
    for (const sd_json *c = root->child; c; c = c->next) {
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++) ok = strcmp(*k, c->key) == 0;
        if (!ok) return sd_err_set(err, SD_EFORMAT, "rules: unknown key '%s'", c->key);
    }
    sd_status st = SD_OK;
    if ((st = take_tag_set(root, "blacklist_tags", &r->blacklist, err))) return st;
    if ((st = take_tag_set(root, "ratings", &r->ratings, err))) return st;
    if ((st = take_tag_set(root, "non_caption_tags", &r->non_caption, err))) return st;
    r->has_abs_min_score |= take_num(root, "abs_min_score", &r->abs_min_score, err, &st);
    r->has_min_score |= take_num(root, "min_score", &r->min_score, err, &st);
    double d;
    if (take_int(root, "min_side", 0, INT_MAX, &d, err, &st)) r->min_side = (int)d;
    if (take_int(root, "min_pixels", 0, max_exact_int, &d, err, &st)) r->min_pixels = (long)d;
    if (take_num(root, "shuffle_tag_p", &d, err, &st)) r->shuffle_tag_p = d;
    if (take_int(root, "keep_tokens", 0, INT_MAX, &d, err, &st)) r->keep_tokens = (int)d;
    if (take_int(root, "seed", 0, max_exact_int, &d, err, &st)) r->seed = (unsigned long long)d;
    if (take_int(root, "val_every", 0, max_exact_int, &d, err, &st)) r->val_every = (long)d;
    if (take_num(root, "val_fraction", &d, err, &st)) r->val_fraction = d;
    if (st) return st;
    if ((st = take_bool(root, "underscores", &r->underscores, err))) return st;
    if ((st = take_bool(root, "escape_parens", &r->escape_parens, err))) return st;
    if ((st = take_str(root, "score_tag_prefix", &r->score_tag_prefix, err))) return st;
    if ((st = take_str(root, "artist_prefix", &r->artist_prefix, err))) return st;
    if ((st = take_str(root, "caption_template", &r->template_, err))) return st;
    if (r->template_ && !r->template_[0])
        return sd_err_set(err, SD_EINVAL, "rules: 'caption_template' is empty (every caption would be empty)");
    if ((st = take_str(root, "tag_separator", &r->separator, err))) return st;

    const sd_json *v;
    if ((v = sd_json_get(root, "tag_bonus_scores"))) {
        if (v->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "rules: 'tag_bonus_scores' must map tag -> number");
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c->type != SD_JSON_NUMBER) return sd_err_set(err, SD_EFORMAT, "rules: bonus for '%s' is not a number", c->key);
            sd_strmap_slot *s = tag_put(&r->bonus, c->key, c->key_len);
            if (!s) return sd_err_set(err, SD_EINVAL, "rules: bad tag '%s'", c->key);
            s->nval = c->num;
        }
    }
    if ((v = sd_json_get(root, "where"))) {
        if (v->type != SD_JSON_ARRAY) return sd_err_set(err, SD_EFORMAT, "rules: 'where' must be an array of strings");
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c->type != SD_JSON_STRING) return sd_err_set(err, SD_EFORMAT, "rules: 'where' must hold strings");
            if ((st = sd_rules_add_where(r, c->str, err))) return st;
        }
    }
    if ((v = sd_json_get(root, "replace_tags"))) {
        if (v->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "rules: 'replace_tags' must map tag -> tag");
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c->type != SD_JSON_STRING) return sd_err_set(err, SD_EFORMAT, "rules: replacement of '%s' is not a string", c->key);
            sd_strmap_slot *s = tag_put(&r->replace_tags, c->key, c->key_len);
            if (!s) return sd_err_set(err, SD_EINVAL, "rules: bad tag '%s'", c->key);
            free((char *)s->sval);
            s->sval = strdup(c->str);
        }
    }
    if ((v = sd_json_get(root, "rating_words"))) {
        if (v->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "rules: 'rating_words' must map rating -> word");
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c->type != SD_JSON_STRING) return sd_err_set(err, SD_EFORMAT, "rules: word for '%s' is not a string", c->key);
            sd_strmap_slot *s = sd_strmap_put(&r->rating_words, c->key, c->key_len);
            if (!s) return sd_err_set(err, SD_ENOMEM, "out of memory");
            free((char *)s->sval);
            s->sval = strdup(c->str);
        }
    }
    if ((v = sd_json_get(root, "replace_substrings"))) {
        if (v->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "rules: 'replace_substrings' must map text -> text");
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c->type != SD_JSON_STRING || c->key_len == 0)
                return sd_err_set(err, SD_EFORMAT, "rules: bad substring replacement '%s'", c->key);
            sd_subst *ns = realloc(r->subst, (size_t)(r->nsubst + 1) * sizeof *ns);
            if (!ns) return sd_err_set(err, SD_ENOMEM, "out of memory");
            r->subst = ns;
            ns[r->nsubst].from = strdup(c->key);
            ns[r->nsubst].to = strdup(c->str);
            ns[r->nsubst].from_len = c->key_len;
            ns[r->nsubst].to_len = c->len;
            r->nsubst++;
        }
    }
    if ((v = sd_json_get(root, "score_tags"))) {
        if (v->type != SD_JSON_ARRAY) return sd_err_set(err, SD_EFORMAT, "rules: 'score_tags' must be an array of numbers");
        free(r->score_tags);
        r->score_tags = malloc((v->len ? v->len : 1) * sizeof *r->score_tags);
        r->nscore_tags = 0;
        for (const sd_json *c = v->child; c; c = c->next) {
            if (c->type != SD_JSON_NUMBER) return sd_err_set(err, SD_EFORMAT, "rules: 'score_tags' must hold numbers");
            r->score_tags[r->nscore_tags++] = c->num;
        }
        qsort(r->score_tags, (size_t)r->nscore_tags, sizeof *r->score_tags, cmp_desc);
    }
    if ((v = sd_json_get(root, "tag_order"))) {
        if (v->type != SD_JSON_ARRAY) return sd_err_set(err, SD_EFORMAT, "rules: 'tag_order' must be an array of categories");
        r->ntag_order = 0;
        for (const sd_json *c = v->child; c; c = c->next) {
            int cat = c->type == SD_JSON_STRING ? sd_tag_cat_parse(c->str) : -1;
            if (cat < 0) return sd_err_set(err, SD_EFORMAT, "rules: unknown tag category in 'tag_order'");
            if (r->ntag_order < SD_TAG_NCAT) r->tag_order[r->ntag_order++] = cat;
        }
    }
    if (r->shuffle_tag_p < 0 || r->shuffle_tag_p > 1) return sd_err_set(err, SD_ERANGE, "rules: shuffle_tag_p must be in [0,1]");
    if (r->val_fraction < 0 || r->val_fraction > 1) return sd_err_set(err, SD_ERANGE, "rules: val_fraction must be in [0,1]");
    return SD_OK;
}

/* Load a rules file (JSON). */
sd_status sd_rules_load_file(sd_rules *r, const char *path, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_arena a;
    sd_arena_init(&a, 1 << 16);
    sd_json *root;
    sd_status s = sd_parse_json_file(path, &text, &a, &root, err);
    if (!s && (s = sd_rules_load_json(r, root, err))) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        sd_err_set(err, s, "%s: %s", path, m);
    }
    sd_arena_free(&a);
    sd_buf_free(&text);
    return s;
}
