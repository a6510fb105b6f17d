/* sd-meta's rules: which records to drop, how tags are rewritten and how the
 * caption is built. Loaded from a JSON rules file and/or flags, compiled once,
 * then applied by every worker (read-only). Order of application is fixed and
 * documented in docs/FORMATS.md ("Rules"). */
#ifndef SDTK_RULES_H
#define SDTK_RULES_H

#include "buf.h"
#include "err.h"
#include "record.h"
#include "variants.h"
#include "strmap.h"

typedef enum { SD_CMP_LT, SD_CMP_LE, SD_CMP_GT, SD_CMP_GE, SD_CMP_EQ, SD_CMP_NE } sd_cmp_op;

typedef struct {
    char *field;
    sd_cmp_op op;
    int is_num;
    double num;
    char *str;
    int is_literal;       /* unquoted true, false or null: compared as JSON (== and != only) */
    sd_json_type literal; /* SD_JSON_TRUE, SD_JSON_FALSE or SD_JSON_NULL */
    char *reason_fail;    /* tally reasons, e.g. "where pwatermark<=0.5" */
    char *reason_missing; /* e.g. "where pwatermark<=0.5: field missing" */
    char *reason_type;    /* e.g. "where pwatermark<=0.5: not a number" */
} sd_where;

typedef struct {
    char *from, *to;
    size_t from_len, to_len;
} sd_subst;

typedef struct {
    /* filters */
    sd_strmap blacklist;
    sd_strmap ratings; /* allowed normalised ratings; empty = all */
    int has_abs_min_score, has_min_score;
    double abs_min_score, min_score;
    sd_strmap bonus; /* tag -> score bonus */
    sd_where *where;
    int nwhere;
    int min_side;    /* both sides >= this when the size is known */
    long min_pixels; /* width*height >= this when the size is known */
    /* rewrites */
    int underscores; /* kohya: '_' -> ' ' in tags longer than 3 chars */
    int escape_parens;
    sd_strmap replace_tags; /* whole tag -> replacement ("" drops it) */
    sd_subst *subst;
    int nsubst;
    sd_strmap non_caption;
    double *score_tags; /* descending thresholds */
    int nscore_tags;
    char *score_tag_prefix;
    int tag_order[SD_TAG_NCAT];
    int ntag_order;
    sd_strmap rating_words;
    char *artist_prefix;
    char *template_;
    char *separator;
    /* caption augmentation and split */
    double shuffle_tag_p;
    int keep_tokens;
    unsigned long long seed;
    long val_every;
    double val_fraction;
    sd_variant_opts variants; /* --caption-variants and its options; k = 1: none */
} sd_rules;

void sd_rules_init(sd_rules *r);
void sd_rules_free(sd_rules *r);
sd_status sd_rules_load_file(sd_rules *r, const char *path, sd_error *err);
sd_status sd_rules_load_json(sd_rules *r, const sd_json *root, sd_error *err);
sd_status sd_rules_add_where(sd_rules *r, const char *expr, sd_error *err);
sd_status sd_rules_add_tags(sd_strmap *set, const char *list, sd_error *err);
sd_status sd_rules_set_tag_order(sd_rules *r, const char *list, sd_error *err);
sd_status sd_rules_check_template(const char *t, sd_error *err);
int sd_rules_apply(const sd_rules *r, sd_record *rec, uint64_t ordinal, sd_arena *a, sd_buf scratch[3],
                   const char **reason);
size_t sd_tag_normalize(const char *s, size_t n, char *out, size_t cap);
size_t sd_tag_match_form(const char *s, size_t n, char *out, size_t cap);

#endif
