/* sd-meta: read dataset sources, apply the rules, write one JSONL record per
 * image (or a kohya meta_cap_dd.json). See `sd-meta --help`. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "outfile.h"
#include "rules.h"
#include "slurp.h"
#include "sources.h"
#include "utf8.h"

static const char summary[] =
    "Read dataset sources and write one JSON record per image to stdout (or -o FILE,\n"
    "written atomically): key, image location, size when known, caption, categorised\n"
    "tags, score, rating, train/val split and the source's other fields under \"extra\".\n"
    "Sources (detected, or forced with --source): a folder of images with .txt (tags)\n"
    "and/or .caption files; a folder with images/ and captions/ trees; a tree of\n"
    "metadata .json files (--source metatree); Danbooru/e621 dumps as JSONL or a JSON\n"
    "array (a file, a pipe or '-' = stdin); kohya meta_cap(_dd).json (from a pipe:\n"
    "--source kohya); WebDataset tars (brace notation such as 'data/{00000..00123}.tar'\n"
    "is expanded).";

static const char epilog[] =
    "Rules are applied in this order: rating, abs_min_score, where, min size, blacklist,\n"
    "tag bonuses and min_score, tag rewrites, caption template, tag shuffle, split.\n"
    "Flags add to (or override) the rules file; a flag given as 0 overrides it too.\n"
    "Full reference: docs/FORMATS.md.\n\n"
    "Examples:\n"
    "  sd-meta photos/ > meta.jsonl\n"
    "  sd-meta --rules rules.json --image-pattern '{id%1000:04d}/{id}.{file_ext}' \\\n"
    "          --image-root /data/danbooru posts.jsonl -o meta.jsonl\n"
    "  sd-meta --where 'pwatermark<=0.5' --where 'aesthetic>6' 'laion/{00000..00099}.tar'\n"
    "  sd-meta --caption-variants 8 --variant-shuffle --keep-tokens 1 --tag-dropout 0.1 photos/ -o meta.jsonl\n"
    "      (up to 8 distinct captions per record in \"captions\": each line of a .caption (a .txt stays one\n"
    "      tag list, its lines separating tags), wildcards {a|b|c}, tokens after the first shuffled, each\n"
    "      dropped at 10%; \"caption\" is the first, canonical one)";

typedef struct {
    const char *out, *format, *rules, *source, *flavor;
    const char *template_, *tag_order, *artist_prefix;
    const char *image_pattern, *image_root, *cls_map;
    sd_strlist blacklist, ratings, where;
    double min_score, abs_min_score, shuffle_p, val_fraction, tag_dropout;
    long min_side, min_pixels, keep_tokens, seed, val_every, threads, variants, variant_seed;
    int variant_shuffle;
    int escape_parens, keep_underscores, no_check, no_extra, strict, quiet, verbose;
    int has_min_score, has_abs_min_score, has_shuffle_p, has_val_fraction, allow_empty;
} options;

/* A double flag's value before parsing: its flag was not given. Integer
 * flags use LONG_MIN the same way, so an explicit 0 can override a rules
 * file. */
static const double DOUBLE_NOT_GIVEN = -1e300;

/* Whether a class-map key is a class number as labels are looked up: plain
 * decimal, no sign but '-', no leading zero ("3", "-2", "0", not "03"). */
static int plain_class_key(const char *k)
{
    const char *d = *k == '-' ? k + 1 : k;
    return *d && strspn(d, "0123456789") == strlen(d) && (d[0] != '0' || d[1] == 0) && strcmp(k, "-0") != 0;
}

/* Load the cls -> prompt map for WebDataset class labels. Labels are read
 * as integers (" 03", 3.0 are class 3) and looked up by plain decimal, so a
 * key written otherwise ("03") could never match: refused, naming it. */
static sd_status load_cls_map(const char *path, sd_arena *a, sd_json **out, char **text, sd_error *err)
{
    sd_buf b;
    sd_buf_init(&b);
    sd_status st = sd_parse_json_file(path, &b, a, out, err);
    *text = b.data;
    if (!st && (*out)->type != SD_JSON_OBJECT) st = sd_err_set(err, SD_EFORMAT, "%s: expected {\"cls\": \"prompt\"}", path);
    for (const sd_json *c = st ? NULL : (*out)->child; c && !st; c = c->next)
        if (!plain_class_key(c->key))
            st = sd_err_set(err, SD_EFORMAT, "%s: key '%.40s' is not a class number in plain decimal (e.g. 3, not 03)",
                            path, c->key);
    return st;
}

/* An integer flag must lie in [lo, hi]: a negative count or seed used to be
 * ignored without a word (or to wrap when cast), hiding the typo. LONG_MIN
 * is "not given". */
static sd_status check_int(const char *name, long v, long lo, long hi, sd_error *err)
{
    if (v == LONG_MIN || (v >= lo && v <= hi)) return SD_OK;
    return sd_err_set(err, SD_ERANGE, "--%s must be an integer from %ld to %ld, got %ld", name, lo, hi, v);
}

/* Range-check every integer flag that becomes a rule, before any is used. */
static sd_status check_int_options(const options *o, sd_error *err)
{
    sd_status st;
    if ((st = check_int("min-side", o->min_side, 0, INT_MAX, err))) return st;
    if ((st = check_int("min-pixels", o->min_pixels, 0, LONG_MAX, err))) return st;
    if ((st = check_int("keep-tokens", o->keep_tokens, 0, INT_MAX, err))) return st;
    if ((st = check_int("seed", o->seed, 0, LONG_MAX, err))) return st;
    if ((st = check_int("threads", o->threads, 0, 1024, err))) return st; /* 0: all cores, as in the other tools */
    if ((st = check_int("caption-variants", o->variants, 1, SD_VARIANTS_MAX, err))) return st;
    if ((st = check_int("variant-seed", o->variant_seed, 0, LONG_MAX, err))) return st;
    return check_int("val-every", o->val_every, 0, LONG_MAX, err);
}

/* A probability flag must lie in [0,1] (NaN included in the refusal): a
 * negative one used to be taken for "not given" and ignored. */
static sd_status check_fraction(const char *name, int given, double v, sd_error *err)
{
    if (!given || (v >= 0 && v <= 1)) return SD_OK;
    return sd_err_set(err, SD_ERANGE, "--%s must be in [0,1], got %g", name, v);
}

/* Turn flags into rules on top of the rules file. */
static sd_status rules_from_options(sd_rules *r, const options *o, sd_error *err)
{
    sd_status st;
    if ((st = check_int_options(o, err))) return st;
    if ((st = check_fraction("shuffle-tags", o->has_shuffle_p, o->shuffle_p, err))) return st;
    if ((st = check_fraction("val-fraction", o->has_val_fraction, o->val_fraction, err))) return st;
    if ((st = check_fraction("tag-dropout", o->tag_dropout != DOUBLE_NOT_GIVEN, o->tag_dropout, err))) return st;
    if (o->rules && (st = sd_rules_load_file(r, o->rules, err))) return st;
    for (int i = 0; i < o->blacklist.n; i++)
        if ((st = sd_rules_add_tags(&r->blacklist, o->blacklist.v[i], err))) return st;
    for (int i = 0; i < o->ratings.n; i++)
        if ((st = sd_rules_add_tags(&r->ratings, o->ratings.v[i], err))) return st;
    for (int i = 0; i < o->where.n; i++)
        if ((st = sd_rules_add_where(r, o->where.v[i], err))) return st;
    if (o->has_min_score) {
        r->has_min_score = 1;
        r->min_score = o->min_score;
    }
    if (o->has_abs_min_score) {
        r->has_abs_min_score = 1;
        r->abs_min_score = o->abs_min_score;
    }
    if (o->min_side != LONG_MIN) r->min_side = (int)o->min_side;
    if (o->min_pixels != LONG_MIN) r->min_pixels = o->min_pixels;
    if (o->template_) free(r->template_), r->template_ = strdup(o->template_);
    if (o->artist_prefix) free(r->artist_prefix), r->artist_prefix = strdup(o->artist_prefix);
    if (o->tag_order && (st = sd_rules_set_tag_order(r, o->tag_order, err))) return st;
    if (o->escape_parens) r->escape_parens = 1;
    if (o->keep_underscores) r->underscores = 0;
    if (o->has_shuffle_p) r->shuffle_tag_p = o->shuffle_p;
    if (o->keep_tokens != LONG_MIN) r->keep_tokens = (int)o->keep_tokens;
    if (o->seed != LONG_MIN) r->seed = (unsigned long long)o->seed;
    if (o->val_every != LONG_MIN) r->val_every = o->val_every;
    if (o->has_val_fraction) r->val_fraction = o->val_fraction;
    if (o->variants != LONG_MIN) r->variants.k = (int)o->variants;
    r->variants.shuffle = o->variant_shuffle;
    r->variants.keep_tokens = r->keep_tokens;
    r->variants.tag_dropout = o->tag_dropout != DOUBLE_NOT_GIVEN ? o->tag_dropout : 0;
    r->variants.seed = o->variant_seed != LONG_MIN ? (uint64_t)o->variant_seed : 0;
    if (r->variants.k == 1 && (o->variant_shuffle || o->tag_dropout != DOUBLE_NOT_GIVEN || o->variant_seed != LONG_MIN))
        return sd_err_set(err, SD_EINVAL, "--variant-shuffle, --tag-dropout and --variant-seed need --caption-variants K > 1");
    return sd_rules_check_template(r->template_, err);
}

/* Log an error whose text may name files: control bytes and invalid UTF-8
 * escaped as \xHH (sd_name_escape), so a name with a newline stays on one
 * line. */
static void log_error(const char *msg)
{
    char esc[2048];
    sd_log(SD_LOG_ERROR, "%s", sd_name_escape(msg, esc, sizeof esc));
}

/* Read one source path with the reader for its kind. */
static sd_status read_source(sd_meta_run *m, const char *path, sd_source_kind kind, const options *o, sd_error *err)
{
    if (kind == SD_SRC_AUTO) kind = sd_source_detect(path);
    sd_log(SD_LOG_DEBUG, "%s: reading as %s", path, sd_source_name(kind));
    switch (kind) {
    case SD_SRC_FOLDER: return sd_read_folder(m, path, 0, err);
    case SD_SRC_TREE: return sd_read_folder(m, path, 1, err);
    case SD_SRC_METATREE: return sd_read_metatree(m, path, err);
    case SD_SRC_KOHYA: return sd_read_kohya(m, path, o->image_root, err);
    case SD_SRC_WDS: return sd_read_wds(m, path, err);
    case SD_SRC_BOORU: return sd_read_booru(m, path, err);
    case SD_SRC_AUTO: break;
    }
    return sd_err_set(err, SD_ENOTFOUND, "%s: no such file or directory", path);
}

/* Everything after option parsing; every path frees what it made. */
static int run_meta(const options *o, const sd_strlist *pos, const sd_cli *cli)
{
    sd_log_setup("sd-meta", o->verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    if (pos->n == 0) {
        sd_cli_usage_error(cli, "no source given");
        return SD_EXIT_USAGE;
    }
    sd_source_kind kind = SD_SRC_AUTO;
    if (o->source && (int)(kind = sd_source_parse(o->source)) < 0) {
        sd_cli_usage_error(cli, "unknown --source '%s'", o->source);
        return SD_EXIT_USAGE;
    }
    sd_out_format fmt = SD_OUT_JSONL;
    if (o->format && strcmp(o->format, "kohya") == 0) fmt = SD_OUT_KOHYA;
    else if (o->format && strcmp(o->format, "jsonl") != 0) {
        sd_cli_usage_error(cli, "unknown --format '%s'", o->format);
        return SD_EXIT_USAGE;
    }
    int force_e621 = -1;
    if (o->flavor) {
        if (strcmp(o->flavor, "e621") == 0) force_e621 = 1;
        else if (strcmp(o->flavor, "danbooru") == 0) force_e621 = 0;
        else {
            sd_cli_usage_error(cli, "unknown --flavor '%s'", o->flavor);
            return SD_EXIT_USAGE;
        }
    }

    const char *bad = o->image_pattern ? sd_pattern_check(o->image_pattern) : NULL;
    if (bad) {
        sd_cli_usage_error(cli, "--image-pattern '%s': %s", o->image_pattern, bad);
        return SD_EXIT_USAGE;
    }

    sd_error err;
    sd_rules rules;
    sd_rules_init(&rules);
    if (rules_from_options(&rules, o, &err)) {
        log_error(err.msg);
        sd_rules_free(&rules);
        return SD_EXIT_USAGE;
    }
    if (fmt == SD_OUT_KOHYA && rules.variants.k > 1) {
        /* a kohya meta_cap_dd.json holds one caption per image: the variants would vanish */
        sd_cli_usage_error(cli, "--caption-variants %d with --format kohya: kohya metadata holds one caption per "
                           "image (write jsonl for variants)", rules.variants.k);
        sd_rules_free(&rules);
        return SD_EXIT_USAGE;
    }
    sd_arena cls_arena;
    sd_arena_init(&cls_arena, 1 << 16);
    sd_json *cls_map = NULL;
    char *cls_text = NULL;
    if (o->cls_map && load_cls_map(o->cls_map, &cls_arena, &cls_map, &cls_text, &err)) {
        log_error(err.msg);
        sd_rules_free(&rules);
        sd_arena_free(&cls_arena);
        free(cls_text);
        return SD_EXIT_USAGE;
    }
    /* images are checked wherever a record names one (booru posts only with --image-pattern) */
    sd_build_opts bopts = {o->image_pattern, o->image_root, !o->no_check, cls_map, force_e621};

    sd_outfile out;
    sd_outfile_warn_own_leftovers(o->out);
    if (sd_outfile_open(&out, o->out, &err)) {
        log_error(err.msg);
        sd_rules_free(&rules);
        sd_arena_free(&cls_arena);
        free(cls_text);
        return SD_EXIT_FATAL;
    }
    sd_pool *pool = sd_pool_create(o->threads > 0 ? (int)o->threads : sd_default_threads());
    sd_meta_run run;
    int status = SD_EXIT_OK;
    if (!pool || sd_meta_run_init(&run, &rules, &bopts, pool, out.f, fmt, o->verbose ? -1 : o->quiet ? 0 : 10, !o->quiet, &err)) {
        sd_log(SD_LOG_ERROR, "%s", pool ? err.msg : "cannot start threads");
        sd_outfile_abort(&out);
        if (pool) sd_meta_run_free(&run);
        sd_pool_destroy(pool);
        sd_rules_free(&rules);
        sd_arena_free(&cls_arena);
        free(cls_text);
        return SD_EXIT_FATAL;
    }
    run.with_extra = !o->no_extra;
    run.out_file = &out;
    for (int i = 0; i < pos->n && status == SD_EXIT_OK; i++) {
        if (read_source(&run, pos->v[i], kind, o, &err)) {
            log_error(err.msg);
            status = SD_EXIT_FATAL;
        }
    }
    if (status == SD_EXIT_OK && sd_meta_finish(&run, &err)) {
        log_error(err.msg);
        status = SD_EXIT_FATAL;
    }
    if (status == SD_EXIT_OK && run.read == 0 && !o->allow_empty) {
        /* an empty folder, a wrong path: an empty output must not replace a good one unnoticed */
        sd_log(SD_LOG_ERROR, "nothing found in the source%s; %s (--allow-empty writes an empty output)",
               pos->n > 1 ? "s" : "", o->out && strcmp(o->out, "-") != 0 ? "-o not written" : "nothing written");
        status = SD_EXIT_SKIPPED;
    } else if (status == SD_EXIT_OK && run.written == 0 && run.val_left_out == 0 && !o->allow_empty) {
        /* every record skipped (no captions, a wrong rule): as wrong as an empty source */
        sd_log(SD_LOG_ERROR, "every record was skipped (reasons below); %s (--allow-empty writes an empty output)",
               o->out && strcmp(o->out, "-") != 0 ? "-o not written" : "nothing written");
        status = SD_EXIT_SKIPPED;
    }
    int via_temp = out.tmp != NULL; /* a regular file: written whole or not at all */
    if (status == SD_EXIT_OK && sd_outfile_commit(&out, &err)) {
        log_error(err.msg);
        status = SD_EXIT_FATAL;
    } else if (status != SD_EXIT_OK) {
        sd_outfile_abort(&out);
    }
    if (status == SD_EXIT_OK || (!via_temp && !run.write_failed))
        sd_log(SD_LOG_INFO, "records read %llu, written %llu, skipped %llu", (unsigned long long)run.read,
               (unsigned long long)run.written, (unsigned long long)run.skips.total);
    else if (!via_temp) /* stdout or a device: what was flushed before the failure is out */
        sd_log(SD_LOG_INFO, "records read %llu, written %llu before the output failed (%llu lost), skipped %llu",
               (unsigned long long)run.read, (unsigned long long)run.written_out,
               (unsigned long long)(run.written - run.written_out), (unsigned long long)run.skips.total);
    else /* the temporary output was dropped: -o holds what it held before */
        sd_log(SD_LOG_INFO, "records read %llu, none written (%s left as it was), skipped %llu",
               (unsigned long long)run.read, o->out, (unsigned long long)run.skips.total);
    sd_tally_log(&run.skips, "skipped by reason");
    if (run.ignored.total) sd_tally_log(&run.ignored, "ignored (not errors; --verbose names them)");
    if (run.notes.total) sd_tally_log(&run.notes, "kept with a note, by reason");
    if (run.val_left_out)
        sd_log(SD_LOG_INFO, "%llu val records left out of the kohya metadata (it has no split: sd-scripts would "
               "train on them)", (unsigned long long)run.val_left_out);
    if (status == SD_EXIT_OK && o->strict && run.skips.total) status = SD_EXIT_SKIPPED;
    sd_meta_run_free(&run);
    sd_pool_destroy(pool);
    sd_rules_free(&rules);
    sd_arena_free(&cls_arena);
    free(cls_text);
    return status;
}

/* The option table and --help; run_meta does the work. */
int main(int argc, char **argv)
{
    options o = {0};
    o.shuffle_p = o.val_fraction = DOUBLE_NOT_GIVEN;
    o.keep_tokens = o.seed = o.threads = LONG_MIN; /* not given */
    o.min_side = o.min_pixels = o.val_every = o.variants = o.variant_seed = LONG_MIN;
    o.tag_dropout = DOUBLE_NOT_GIVEN;
    double min_score = -1e300, abs_min_score = -1e300;
    const sd_opt opts[] = {
        {"output", 'o', SD_OPT_STR, &o.out, "FILE", "write here (atomically) instead of stdout; a new file gets 0666 less the umask, a replaced one keeps its mode, a symlink's target is replaced"},
        {"format", 0, SD_OPT_STR, &o.format, "jsonl|kohya", "output format (default jsonl); kohya: one meta_cap_dd.json object, the finished caption in caption and tags empty (val records and images inside tars left out; --caption-variants K > 1 refused: one caption per image)"},
        {"source", 0, SD_OPT_STR, &o.source, "KIND", "folder|tree|metatree|booru|kohya|wds (default: detect)"},
        {"rules", 'r', SD_OPT_STR, &o.rules, "FILE", "JSON rules file (docs/FORMATS.md)"},
        {"blacklist", 0, SD_OPT_LIST, &o.blacklist, "TAGS", "drop records with any of these tags (comma list)"},
        {"ratings", 0, SD_OPT_LIST, &o.ratings, "LIST", "keep only these ratings (general,sensitive,...)"},
        {"min-score", 0, SD_OPT_DOUBLE, &min_score, "N", "drop records scoring below N after tag bonuses"},
        {"abs-min-score", 0, SD_OPT_DOUBLE, &abs_min_score, "N", "drop records scoring below N before bonuses"},
        {"where", 'w', SD_OPT_LIST, &o.where, "EXPR", "keep records where EXPR holds: 'aesthetic>6', 'is_deleted==false' (repeatable)"},
        {"min-side", 0, SD_OPT_INT, &o.min_side, "PX", "drop images whose shorter side is below PX (when known)"},
        {"min-pixels", 0, SD_OPT_INT, &o.min_pixels, "N", "drop images with fewer than N pixels (when known)"},
        {"template", 't', SD_OPT_STR, &o.template_, "TEXT", "caption template (default '{caption}, {score_tag}, {tags}'; {{ }} literal braces)"},
        {"tag-order", 0, SD_OPT_STR, &o.tag_order, "LIST", "tag categories in caption order"},
        {"artist-prefix", 0, SD_OPT_STR, &o.artist_prefix, "TEXT", "prefix for artist tags in the caption"},
        {"escape-parens", 0, SD_OPT_FLAG, &o.escape_parens, NULL, "write ( ) in tags as \\( \\)"},
        {"keep-underscores", 0, SD_OPT_FLAG, &o.keep_underscores, NULL, "do not turn _ into spaces in tags"},
        {"shuffle-tags", 0, SD_OPT_DOUBLE, &o.shuffle_p, "P", "shuffle caption tokens of a fraction P of records"},
        {"keep-tokens", 0, SD_OPT_INT, &o.keep_tokens, "N", "leading caption tokens never shuffled"},
        {"seed", 0, SD_OPT_INT, &o.seed, "N", "seed for shuffles and the hash split"},
        {"caption-variants", 0, SD_OPT_INT, &o.variants, "K", "write up to K (1..64) distinct captions per record in \"captions\" (default 1: none, \"caption\" only): each line of a multi-line caption (a .caption file, not a .txt: that stays tags), wildcards {a|b|c}, and with the options below shuffled and dropped tokens; \"caption\" holds the first (K = 1: a wildcard stays as written, each record with one noted)"},
        {"variant-shuffle", 0, SD_OPT_FLAG, &o.variant_shuffle, NULL, "variants: shuffle the tokens after --keep-tokens (kohya's shuffle_caption)"},
        {"tag-dropout", 0, SD_OPT_DOUBLE, &o.tag_dropout, "R", "variants: drop each token after --keep-tokens with probability R (kohya's caption_tag_dropout_rate; default 0)"},
        {"variant-seed", 0, SD_OPT_INT, &o.variant_seed, "N", "variants: seed of their draws (default 0); the same key and seed give the same variants"},
        {"val-every", 0, SD_OPT_INT, &o.val_every, "N", "every N-th input record goes to the val split"},
        {"val-fraction", 0, SD_OPT_DOUBLE, &o.val_fraction, "F", "a stable hash-chosen fraction F goes to val"},
        {"image-pattern", 0, SD_OPT_STR, &o.image_pattern, "PAT", "booru: image path from post fields, e.g. '{id}.webp'"},
        {"image-root", 0, SD_OPT_STR, &o.image_root, "DIR", "booru/kohya: directory image paths are relative to"},
        {"no-check-images", 0, SD_OPT_FLAG, &o.no_check, NULL, "do not check that image files exist"},
        {"flavor", 0, SD_OPT_STR, &o.flavor, "danbooru|e621", "booru record layout (default: detect per record)"},
        {"cls-map", 0, SD_OPT_STR, &o.cls_map, "FILE", "webdataset: JSON map from cls to caption"},
        {"no-extra", 0, SD_OPT_FLAG, &o.no_extra, NULL, "do not pass the source's other fields through"},
        {"threads", 'j', SD_OPT_INT, &o.threads, "N", "worker threads (default, or 0: all cores)"},
        {"strict", 0, SD_OPT_FLAG, &o.strict, NULL, "exit 1 if any record was skipped"},
        {"allow-empty", 0, SD_OPT_FLAG, &o.allow_empty, NULL, "when the sources hold nothing at all or every record is skipped, write the empty output and exit 0 (default: an error, -o left as it was, exit 1)"},
        {"quiet", 'q', SD_OPT_FLAG, &o.quiet, NULL, "only errors and the final summary"},
        {"verbose", 'v', SD_OPT_FLAG, &o.verbose, NULL, "report every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-meta", "[OPTIONS] SOURCE...", summary, opts, epilog, NULL};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc < 0) {
        o.has_min_score = min_score > -1e300;
        o.min_score = min_score;
        o.has_abs_min_score = abs_min_score > -1e300;
        o.abs_min_score = abs_min_score;
        o.has_shuffle_p = o.shuffle_p != DOUBLE_NOT_GIVEN;
        o.has_val_fraction = o.val_fraction != DOUBLE_NOT_GIVEN;
        rc = run_meta(&o, &pos, &cli);
    }
    sd_strlist_free(&pos);
    sd_strlist_free(&o.blacklist);
    sd_strlist_free(&o.ratings);
    sd_strlist_free(&o.where);
    return rc;
}
