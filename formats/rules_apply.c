/* Applying compiled rules to one record, in the documented order:
 * filters (rating, abs_min_score, where, size, blacklist) -> score bonuses
 * and min_score -> tag rewrites -> caption template -> tag shuffle -> split. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "hash.h"
#include "rules.h"

/* A tag in matching form (see sd_tag_match_form) with its map hash, made once
 * per tag and record and used for every tag map. */
typedef struct {
    const char *s;
    uint32_t len;
    uint64_t h;
} normtag;

/* Fill nt from tag t (nt->s = NULL when the tag is removed or too long). */
static void normalize_tag(const sd_tag *t, sd_arena *a, normtag *nt)
{
    nt->s = NULL;
    if (!t->s) return;
    char *d = sd_arena_alloc(a, (size_t)t->len + 1);
    if (!d) return;
    size_t n = sd_tag_match_form(t->s, t->len, d, (size_t)t->len + 1);
    nt->s = d;
    nt->len = (uint32_t)n;
    nt->h = sd_strmap_hash(d, n);
}

/* Look a normalised tag up in a tag map. */
static const sd_strmap_slot *nt_lookup(const sd_strmap *m, const normtag *nt)
{
    return nt->s && m->n ? sd_strmap_get_h(m, nt->s, nt->len, nt->h) : NULL;
}

/* A record key as a number ("1001" for a post id); -2 when it is not plain
 * decimal text (strtod alone would take "0x10", "inf" or "nan"). */
static int key_num(const char *key, double *out)
{
    if (!*key || strspn(key, "0123456789+-.eE") != strlen(key)) return -2;
    char *end;
    *out = strtod(key, &end);
    return *end ? -2 : 0;
}

/* Numeric value of a where-field: record fields first, then the source's
 * (dotted paths allowed). 0 if found, -1 if missing or null, -2 if the field
 * holds something else (a boolean, an object, non-numeric text). A Python
 * NaN or Infinity is a number and compares as Python compares it (NaN:
 * every comparison false but !=). */
static int field_num(const sd_record *rec, const char *f, double *out)
{
    if (strcmp(f, "key") == 0) return rec->key ? key_num(rec->key, out) : -1;
    if (strcmp(f, "score") == 0) {
        if (!rec->has_score) return -1;
        *out = rec->score;
        return 0;
    }
    if (strcmp(f, "width") == 0 && rec->width) return *out = rec->width, 0;
    if (strcmp(f, "height") == 0 && rec->height) return *out = rec->height, 0;
    const sd_json *v = sd_json_path(rec->fields, f, strlen(f));
    if (!v || v->type == SD_JSON_NULL) return -1;
    if (v->type == SD_JSON_NUMBER) return *out = v->num, 0;
    return sd_json_num(v, out) ? -2 : 0;
}

/* Text value of a where-field: 0 if found, -1 if missing or null, -2 if the
 * field is not text. */
static int field_str(const sd_record *rec, const char *f, const char **out)
{
    if (strcmp(f, "rating") == 0) return (*out = rec->rating) ? 0 : -1;
    if (strcmp(f, "key") == 0) return (*out = rec->key) ? 0 : -1;
    const sd_json *v = sd_json_path(rec->fields, f, strlen(f));
    if (!v || v->type == SD_JSON_NULL) return -1;
    if (v->type != SD_JSON_STRING) return -2;
    *out = v->str;
    return 0;
}

/* A true/false/null condition compares the source field as JSON: equal only
 * to the same literal (a string "false" is not false). 1 pass, 0 fail, -1
 * field missing. */
static int literal_eval(const sd_where *w, const sd_record *rec)
{
    const sd_json *v = sd_json_path(rec->fields, w->field, strlen(w->field));
    if (!v) return -1;
    int eq = v->type == w->literal;
    return w->op == SD_CMP_EQ ? eq : !eq;
}

/* Evaluate one condition: 1 pass, 0 fail, -1 field missing, -2 field of
 * another type than the value compared with. */
static int where_eval(const sd_where *w, const sd_record *rec)
{
    if (w->is_literal) return literal_eval(w, rec);
    if (w->is_num) {
        double v;
        int got = field_num(rec, w->field, &v);
        if (got) return got;
        switch (w->op) {
        case SD_CMP_LT: return v < w->num;
        case SD_CMP_LE: return v <= w->num;
        case SD_CMP_GT: return v > w->num;
        case SD_CMP_GE: return v >= w->num;
        case SD_CMP_EQ: return v == w->num;
        case SD_CMP_NE: return v != w->num;
        }
        return 0;
    }
    const char *s;
    int got = field_str(rec, w->field, &s);
    if (got) return got;
    int eq = strcmp(s, w->str) == 0;
    return w->op == SD_CMP_EQ ? eq : !eq;
}

/* Filters that look at the record as read. 0 keep, -1 drop with *reason. */
static int apply_filters(const sd_rules *r, sd_record *rec, const normtag *nt, const char **reason)
{
    if (r->ratings.n && (!rec->rating || !sd_strmap_get(&r->ratings, rec->rating, strlen(rec->rating)))) {
        *reason = rec->rating ? "rating not allowed" : "no rating";
        return -1;
    }
    if (r->has_abs_min_score) {
        if (!rec->has_score) return *reason = "no score", -1;
        if (rec->score < r->abs_min_score) return *reason = "score below abs_min_score", -1;
    }
    for (int i = 0; i < r->nwhere; i++) {
        int v = where_eval(&r->where[i], rec);
        if (v == -2) return *reason = r->where[i].reason_type, -1;
        if (v < 0) return *reason = r->where[i].reason_missing, -1;
        if (v == 0) return *reason = r->where[i].reason_fail, -1;
    }
    if (rec->width && rec->height) {
        if (r->min_side && (rec->width < r->min_side || rec->height < r->min_side))
            return *reason = "below min_side", -1;
        if (r->min_pixels && (long)rec->width * rec->height < r->min_pixels) return *reason = "below min_pixels", -1;
    }
    if (r->blacklist.n)
        for (int i = 0; i < rec->ntags; i++)
            if (nt_lookup(&r->blacklist, &nt[i])) return *reason = "blacklisted tag", -1;
    if (r->bonus.n || r->has_min_score) {
        double bonus = 0;
        for (int i = 0; i < rec->ntags && r->bonus.n; i++) {
            const sd_strmap_slot *s = nt_lookup(&r->bonus, &nt[i]);
            if (s) bonus += s->nval;
        }
        if (rec->has_score) rec->score += bonus;
        if (r->has_min_score) {
            if (!rec->has_score) return *reason = "no score", -1;
            if (rec->score < r->min_score) return *reason = "score below min_score", -1;
        }
    }
    return 0;
}

/* First occurrence of needle in hay (short strings: memchr on the first
 * byte, then compare; cheaper than memmem's setup for tag-sized text). */
static const char *find_sub(const char *hay, size_t hn, const char *needle, size_t nn)
{
    if (nn == 0 || hn < nn) return NULL;
    const char *end = hay + hn - nn + 1;
    for (const char *p = hay; p < end; p++) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p) return NULL;
        if (memcmp(p, needle, nn) == 0) return p;
    }
    return NULL;
}

/* Replace every occurrence of one substring in buf. */
static void subst_all(sd_buf *buf, sd_buf *tmp, const sd_subst *s)
{
    if (!find_sub(buf->data, buf->len, s->from, s->from_len)) return;
    sd_buf_clear(tmp);
    size_t i = 0;
    while (i < buf->len) {
        const char *hit = find_sub(buf->data + i, buf->len - i, s->from, s->from_len);
        if (!hit) break;
        sd_buf_put(tmp, buf->data + i, (size_t)(hit - (buf->data + i)));
        sd_buf_put(tmp, s->to, s->to_len);
        i = (size_t)(hit - buf->data) + s->from_len;
    }
    sd_buf_put(tmp, buf->data + i, buf->len - i);
    sd_buf_clear(buf);
    sd_buf_put(buf, tmp->data, tmp->len);
}

/* Rewrite one tag in place: whole-tag map, underscores, substrings, parens.
 * A tag mapped to "" is removed (s = NULL). Returns 1 when the whole-tag map
 * or a substring changed it (its match form must then be made again);
 * underscores and escaped parentheses leave the match form as it was, so
 * non_caption_tags sees "cat (animal)" however it is written out. */
static int rewrite_tag(const sd_rules *r, sd_tag *t, const normtag *nt, sd_arena *a, sd_buf *scratch)
{
    const char *s = t->s;
    size_t n = t->len;
    const sd_strmap_slot *rep = nt_lookup(&r->replace_tags, nt);
    if (rep) {
        if (!rep->sval[0]) {
            t->s = NULL;
            return 1;
        }
        s = rep->sval;
        n = strlen(s);
    }
    /* the tag is copied into work only once something changes it */
    sd_buf *work = &scratch[0], *tmp = &scratch[1];
    int in_work = 0, changed = rep != NULL;
    if (r->underscores && n > 3 && memchr(s, '_', n)) { /* changes no normalised form */
        sd_buf_clear(work);
        sd_buf_put(work, s, n);
        in_work = 1;
        for (size_t i = 0; i < work->len; i++)
            if (work->data[i] == '_') work->data[i] = ' ';
    }
    for (int i = 0; i < r->nsubst; i++) {
        const char *cur = in_work ? work->data : s;
        size_t cl = in_work ? work->len : n;
        if (!find_sub(cur, cl, r->subst[i].from, r->subst[i].from_len)) continue;
        if (!in_work) {
            sd_buf_clear(work);
            sd_buf_put(work, s, n);
            in_work = 1;
        }
        subst_all(work, tmp, &r->subst[i]);
        changed = 1;
    }
    if (r->escape_parens) {
        const char *cur = in_work ? work->data : s;
        size_t cl = in_work ? work->len : n;
        if (memchr(cur, '(', cl) || memchr(cur, ')', cl)) {
            sd_buf_clear(tmp);
            for (size_t i = 0; i < cl; i++) {
                char c = cur[i];
                if ((c == '(' || c == ')') && !(i && cur[i - 1] == '\\')) sd_buf_putc(tmp, '\\');
                sd_buf_putc(tmp, c);
            }
            sd_buf_clear(work);
            sd_buf_put(work, tmp->data, tmp->len);
            in_work = 1;
        }
    }
    if (!in_work) { /* unchanged, or replaced by a rules-owned string */
        t->s = s;
        t->len = (uint32_t)n;
        return changed;
    }
    t->len = (uint32_t)work->len;
    t->s = t->len ? sd_arena_strndup(a, work->data, work->len) : NULL;
    return changed;
}

/* Join the caption tags of one category (or all, cat < 0, in tag_order). */
static void join_tags(const sd_rules *r, const sd_record *rec, const normtag *nt, int cat, sd_buf *out)
{
    size_t sl = strlen(r->separator);
    int first = 1;
    for (int k = 0; k < r->ntag_order; k++) {
        int c = r->tag_order[k];
        if (cat >= 0 && c != cat) continue;
        for (int i = 0; i < rec->ntags; i++) {
            const sd_tag *t = &rec->tags[i];
            if (t->cat != c || !t->s) continue;
            if (r->non_caption.n && nt_lookup(&r->non_caption, &nt[i])) continue;
            if (!first) sd_buf_put(out, r->separator, sl);
            first = 0;
            if (c == SD_TAG_ARTIST) sd_buf_puts(out, r->artist_prefix);
            sd_buf_put(out, t->s, t->len);
        }
    }
}

/* Expand one template variable into out; 0 if the name is known. */
static int expand_var(const sd_rules *r, const sd_record *rec, const normtag *nt, const char *name, size_t n,
                      sd_buf *out)
{
    if (n == 7 && memcmp(name, "caption", 7) == 0) {
        if (rec->caption) sd_buf_puts(out, rec->caption);
        return 0;
    }
    if (n == 4 && memcmp(name, "tags", 4) == 0) {
        join_tags(r, rec, nt, -1, out);
        return 0;
    }
    if (n == 6 && memcmp(name, "rating", 6) == 0) {
        if (rec->rating) {
            const sd_strmap_slot *w = sd_strmap_get(&r->rating_words, rec->rating, strlen(rec->rating));
            sd_buf_puts(out, w ? w->sval : rec->rating);
        }
        return 0;
    }
    if (n == 9 && memcmp(name, "score_tag", 9) == 0) {
        if (rec->has_score)
            for (int i = 0; i < r->nscore_tags; i++)
                if (rec->score >= r->score_tags[i]) {
                    sd_buf_puts(out, r->score_tag_prefix);
                    sd_buf_json_num(out, r->score_tags[i]);
                    break;
                }
        return 0;
    }
    char tmp[32];
    if (n < sizeof tmp) {
        memcpy(tmp, name, n);
        tmp[n] = 0;
        int c = sd_tag_cat_parse(tmp);
        if (c >= 0) {
            join_tags(r, rec, nt, c, out);
            return 0;
        }
    }
    return -1;
}

/* Is name (n bytes) a template variable expand_var knows? */
static int is_template_var(const char *name, size_t n)
{
    static const char *const fixed[] = {"caption", "tags", "rating", "score_tag"};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        if (strlen(fixed[i]) == n && memcmp(name, fixed[i], n) == 0) return 1;
    for (int c = 0; c < SD_TAG_NCAT; c++) {
        const char *cat = sd_tag_cat_name((sd_tag_cat)c);
        if (strlen(cat) == n && memcmp(name, cat, n) == 0) return 1;
    }
    return 0;
}

/* Refuse a caption template with an unknown {name}, an unclosed '{' or a
 * lone '}' when the rules are read: a typo such as {tag} would otherwise
 * be written literally into every caption. {{ and }} are literal braces. */
sd_status sd_rules_check_template(const char *t, sd_error *err)
{
    char known[256] = "{caption}, {tags}, {rating}, {score_tag}";
    for (int c = 0; c < SD_TAG_NCAT; c++) {
        size_t k = strlen(known);
        snprintf(known + k, sizeof known - k, ", {%s}", sd_tag_cat_name((sd_tag_cat)c));
    }
    for (const char *p = t; *p; p++) {
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            p++;
            continue;
        }
        if (*p == '}')
            return sd_err_set(err, SD_EINVAL, "caption template '%s': '}' without '{' (write }} for a literal brace)", t);
        if (*p != '{') continue;
        size_t n = strcspn(p + 1, "{}");
        if (p[1 + n] != '}')
            return sd_err_set(err, SD_EINVAL, "caption template '%s': '{' without '}' (write {{ for a literal brace)", t);
        if (!is_template_var(p + 1, n))
            return sd_err_set(err, SD_EINVAL, "caption template '%s': unknown variable {%.*s} (known: %s; {{ and }} "
                              "are literal braces)", t, (int)n, p + 1, known);
        p += n + 1;
    }
    return SD_OK;
}

/* Expand a caption template (checked by sd_rules_check_template) into cap:
 * {name} a variable, {{ and }} literal braces, the rest as it is. */
static void expand_template(const sd_rules *r, const sd_record *rec, const normtag *nt, sd_buf *cap)
{
    const char *t = r->template_;
    while (*t) {
        if ((t[0] == '{' && t[1] == '{') || (t[0] == '}' && t[1] == '}')) {
            sd_buf_putc(cap, t[0]);
            t += 2;
            continue;
        }
        const char *close = t[0] == '{' ? strchr(t, '}') : NULL;
        if (close) {
            expand_var(r, rec, nt, t + 1, (size_t)(close - t - 1), cap);
            t = close + 1;
            continue;
        }
        size_t n = strcspn(t + 1, "{}") + 1; /* a lone brace (never in a checked template) goes out as it is */
        sd_buf_put(cap, t, n);
        t += n;
    }
}

/* Drop comma-separated items that came out empty (a missing caption or
 * score tag) and trim the ends; non-empty items keep their exact text. */
static void drop_empty_items(sd_buf *in, sd_buf *out)
{
    sd_buf_clear(out);
    if (in->len == 0) return; /* nothing to split (and no buffer yet) */
    size_t i = 0;
    int any = 0;
    while (i <= in->len) {
        const char *seg = in->data + i;
        const char *c = memchr(seg, ',', in->len - i);
        size_t n = c ? (size_t)(c - seg) : in->len - i;
        int blank = 1;
        for (size_t k = 0; k < n && blank; k++) blank = seg[k] == ' ' || seg[k] == '\t';
        if (!blank) {
            if (any) sd_buf_putc(out, ',');
            sd_buf_put(out, seg, n);
            any = 1;
        }
        i += n + 1;
    }
    size_t b = 0, e = out->len;
    while (b < e && (out->data[b] == ' ' || out->data[b] == '\t')) b++;
    while (e > b && (out->data[e - 1] == ' ' || out->data[e - 1] == '\t')) e--;
    if (b) memmove(out->data, out->data + b, e - b);
    out->len = e - b;
}

/* One comma-separated token of a caption being shuffled. */
typedef struct {
    const char *s;
    size_t len;
} token;

/* Split a caption into its non-empty comma-separated tokens (trimmed), in
 * an array from the worker arena sized for every comma: a long caption is
 * shuffled whole. NULL when out of memory. */
static token *split_tokens(const sd_buf *cap, sd_arena *a, size_t *n)
{
    size_t cap_n = 1;
    for (size_t i = 0; i < cap->len; i++) cap_n += cap->data[i] == ',';
    token *tok = sd_arena_alloc(a, cap_n * sizeof *tok);
    if (!tok) return NULL;
    *n = 0;
    size_t i = 0;
    while (i < cap->len) {
        const char *s = cap->data + i;
        const char *c = memchr(s, ',', cap->len - i);
        size_t l = c ? (size_t)(c - s) : cap->len - i;
        i += l + 1;
        while (l && *s == ' ') s++, l--;
        while (l && s[l - 1] == ' ') l--;
        if (!l) continue;
        tok[*n].s = s;
        tok[*n].len = l;
        (*n)++;
    }
    return tok;
}

/* Shuffle the caption's comma-separated tokens after the first keep_tokens,
 * with a generator seeded by (key, seed) so reruns give the same caption.
 * -1 when out of memory. */
static int shuffle_tokens(const sd_rules *r, const char *key, sd_buf *cap, sd_arena *a, sd_buf *out)
{
    size_t n = 0;
    token *tok = split_tokens(cap, a, &n);
    if (!tok) return -1;
    size_t lo = r->keep_tokens > 0 ? (size_t)r->keep_tokens : 0;
    uint64_t state = sd_hash64(key, strlen(key), r->seed ^ 0x73687566666c65ull);
    for (size_t k = n - 1; n && k > lo; k--) {
        state = sd_mix64(state);
        size_t j = lo + (size_t)(state % (uint64_t)(k - lo + 1));
        token t = tok[k];
        tok[k] = tok[j];
        tok[j] = t;
    }
    sd_buf_clear(out);
    for (size_t k = 0; k < n; k++) {
        if (k) sd_buf_put(out, ", ", 2);
        sd_buf_put(out, tok[k].s, tok[k].len);
    }
    return 0;
}

/* The record's caption variants (--caption-variants): its base captions are
 * the finished caption, or with a multi-line source caption the template
 * expanded once per non-blank line; variants[0] becomes the caption. -1
 * when out of memory. */
static int make_variants(const sd_rules *r, sd_record *rec, const normtag *nt, sd_arena *a, sd_buf scratch[3])
{
    const char *one[1] = {rec->out_caption}, **bases = one;
    int nb = 1;
    if (rec->caption_lines) {
        const char *lines = rec->caption_lines, *joined = rec->caption;
        int cap = 1;
        for (const char *p = lines; *p; p++) cap += *p == '\n' || *p == '\r';
        bases = sd_arena_alloc(a, (size_t)cap * sizeof *bases);
        if (!bases) return -1;
        nb = 0;
        for (const char *p = lines; *p;) {
            size_t n = strcspn(p, "\r\n");
            size_t b = 0, e = n;
            while (b < e && (p[b] == ' ' || p[b] == '\t')) b++;
            while (e > b && (p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
            if (e > b) {
                if (!(rec->caption = sd_arena_strndup(a, p + b, e - b))) return -1;
                sd_buf_clear(&scratch[1]);
                expand_template(r, rec, nt, &scratch[1]);
                drop_empty_items(&scratch[1], &scratch[2]);
                if (scratch[2].len && !(bases[nb++] = sd_arena_strndup(a, scratch[2].data, scratch[2].len))) return -1;
            }
            p += n;
            while (*p == '\r' || *p == '\n') p++;
        }
        rec->caption = joined;
        if (!nb) bases = one, nb = 1;
    }
    const char **out = sd_arena_alloc(a, SD_VARIANTS_MAX * sizeof *out);
    if (!out) return -1;
    int n = sd_caption_variants(&r->variants, rec->key, bases, nb, a, &scratch[1], out, &rec->unclosed_brace);
    if (n < 0) return -1;
    if (n == 0) return 0; /* nothing left: the empty-caption check skips it */
    rec->variants = out;
    rec->nvariants = n;
    rec->out_caption = out[0];
    return 0;
}

/* Run every rule on rec. Returns 0 to keep it (with out_caption and is_val
 * set) or -1 with *reason. scratch: three reusable buffers of the worker. */
int sd_rules_apply(const sd_rules *r, sd_record *rec, uint64_t ordinal, sd_arena *a, sd_buf scratch[3],
                   const char **reason)
{
    normtag *nt = NULL;
    if (r->blacklist.n || r->bonus.n || r->replace_tags.n || r->non_caption.n) {
        nt = sd_arena_alloc(a, (size_t)(rec->ntags ? rec->ntags : 1) * sizeof *nt);
        if (!nt) return *reason = "out of memory", -1;
        for (int i = 0; i < rec->ntags; i++) normalize_tag(&rec->tags[i], a, &nt[i]);
    }
    if (apply_filters(r, rec, nt, reason)) return -1;
    for (int i = 0; i < rec->ntags; i++) {
        static const normtag none = {NULL, 0, 0};
        if (rewrite_tag(r, &rec->tags[i], nt ? &nt[i] : &none, a, scratch) && r->non_caption.n)
            normalize_tag(&rec->tags[i], a, &nt[i]);
    }

    sd_buf *cap = &scratch[1], *clean = &scratch[2];
    sd_buf_clear(cap);
    expand_template(r, rec, nt, cap);
    drop_empty_items(cap, clean);
    if (r->shuffle_tag_p > 0 &&
        sd_hash_unit(sd_hash64(rec->key, strlen(rec->key), r->seed ^ 0x70726f62ull)) < r->shuffle_tag_p) {
        if (shuffle_tokens(r, rec->key, clean, a, cap)) return *reason = "out of memory", -1;
        rec->out_caption = sd_arena_strndup(a, cap->data ? cap->data : "", cap->len);
    } else {
        rec->out_caption = sd_arena_strndup(a, clean->data ? clean->data : "", clean->len);
    }

    if (r->variants.k > 1 && make_variants(r, rec, nt, a, scratch)) return *reason = "out of memory", -1;
    /* {a|b} is only a choice with variants: without, it is trained as written, so it is noted */
    if (r->variants.k == 1) rec->wildcard_literal = sd_caption_has_wildcard(rec->out_caption);

    rec->is_val = 0;
    if (r->val_every > 0 && (ordinal + 1) % (uint64_t)r->val_every == 0) rec->is_val = 1;
    if (r->val_fraction > 0 &&
        sd_hash_unit(sd_hash64(rec->key, strlen(rec->key), r->seed ^ 0x76616c69ull)) < r->val_fraction)
        rec->is_val = 1;
    return 0;
}
