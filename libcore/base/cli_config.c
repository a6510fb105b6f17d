/* A tool's options from a JSON file and KEY=VALUE overrides (sd-train
 * --config FILE --set optimizer.lr=1e-5): both become ordinary option words
 * around the command line's own, so one parser checks every value and the
 * precedence is plain: the file, then the command line, then --set. And the
 * reverse: every option's value as one JSON object, the effective
 * configuration a run records and --config reads back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json.h"
#include "slurp.h"

/* The option a config key names: its last dotted component, '_' read as
 * '-' ("optimizer.weight_decay" is --weight-decay); NULL when none. */
static const sd_opt *resolve(const sd_cli *cli, const char *key, size_t len)
{
    const char *last = key;
    for (size_t i = 0; i < len; i++)
        if (key[i] == '.') last = key + i + 1;
    size_t n = len - (size_t)(last - key);
    char name[64];
    if (n == 0 || n >= sizeof name) return NULL;
    for (size_t i = 0; i < n; i++) name[i] = last[i] == '_' ? '-' : last[i];
    name[n] = 0;
    if (strcmp(name, "config") == 0 || strcmp(name, "set") == 0) return NULL;
    for (const sd_opt *o = cli->opts; o && o->name; o++)
        if (strcmp(o->name, name) == 0) return o;
    return NULL;
}

/* Room for one more word. */
static int push_word(sd_cli_args *a, char *w)
{
    if (a->argc + 2 > a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        char **v = realloc(a->argv, (size_t)cap * sizeof *v);
        if (!v) return -1;
        a->argv = v;
        a->cap = cap;
    }
    a->argv[a->argc++] = w;
    a->argv[a->argc] = NULL;
    return 0;
}

/* Whether word w is an option that takes the next word as its value, as
 * sd_cli_parse reads it: --name (no '=value') or -c alone, for an option
 * that is not a flag. */
static int takes_value(const sd_cli *cli, const char *w)
{
    const sd_opt *o = NULL;
    if (w[0] != '-' || w[1] == 0) return 0; /* a positional or "-" */
    if (w[1] == '-') {
        if (strchr(w, '=')) return 0;
        for (const sd_opt *c = cli->opts; c && c->name; c++)
            if (strcmp(c->name, w + 2) == 0) o = c;
    } else if (w[2] == 0) {
        for (const sd_opt *c = cli->opts; c && c->name; c++)
            if (c->short_name == w[1]) o = c;
    }
    return o && o->kind != SD_OPT_FLAG;
}

/* A false flag: every earlier --name (or -c) word in option position
 * dropped, so a later source can turn off what an earlier one set; a word
 * that is another option's value (-o --flip) or follows "--" stays. */
static void drop_flag(const sd_cli *cli, sd_cli_args *a, const sd_opt *o)
{
    int k = 1, value_next = 0, only_pos = 0;
    for (int i = 1; i < a->argc; i++) {
        const char *w = a->argv[i];
        int option = !value_next && !only_pos;
        int hit = option && ((w[0] == '-' && w[1] == '-' && strcmp(w + 2, o->name) == 0) ||
                             (o->short_name && w[0] == '-' && w[1] == o->short_name && w[2] == 0));
        value_next = option && takes_value(cli, w);
        if (option && strcmp(w, "--") == 0) only_pos = 1;
        if (!hit) a->argv[k++] = a->argv[i];
    }
    a->argc = k;
    a->argv[k] = NULL;
}

/* "--name" and, unless a flag, the value, as words. */
static int push_opt(sd_cli_args *a, const sd_opt *o, const char *val, size_t len)
{
    char *flag = sd_arena_alloc(&a->arena, strlen(o->name) + 3);
    if (!flag) return -1;
    sprintf(flag, "--%s", o->name);
    if (push_word(a, flag)) return -1;
    if (o->kind == SD_OPT_FLAG) return 0;
    char *v = sd_arena_strndup(&a->arena, val, len);
    return v ? push_word(a, v) : -1;
}

/* One config member (objects flattened to dotted keys); 0, or an exit code
 * after the message. */
static int add_member(const sd_cli *cli, sd_cli_args *a, const char *path, const sd_json *v, const char *file)
{
    if (path[0] == '_' || strstr(path, "._")) return 0; /* "_comment", "_shards": notes, not options */
    if (v->type == SD_JSON_OBJECT) {
        for (const sd_json *m = v->child; m; m = m->next) {
            size_t pl = strlen(path) + m->key_len + 2;
            char *p = sd_arena_alloc(&a->arena, pl);
            if (!p) return SD_EXIT_FATAL;
            snprintf(p, pl, "%s%s%s", path, path[0] ? "." : "", m->key);
            int rc = add_member(cli, a, p, m, file);
            if (rc) return rc;
        }
        return 0;
    }
    const sd_opt *o = resolve(cli, path, strlen(path));
    if (!o) {
        sd_cli_usage_error(cli, "%s: '%s' names no option", file, path);
        return SD_EXIT_USAGE;
    }
    int bad = 0, rc = 0;
    switch (v->type) {
    case SD_JSON_NULL: break;
    case SD_JSON_FALSE:
        bad = o->kind != SD_OPT_FLAG;
        if (!bad) drop_flag(cli, a, o);
        break;
    case SD_JSON_TRUE:
        if (o->kind == SD_OPT_FLAG) rc = push_opt(a, o, NULL, 0);
        else bad = 1;
        break;
    case SD_JSON_NUMBER:
    case SD_JSON_STRING:
        if (o->kind == SD_OPT_FLAG) bad = 1;
        else rc = push_opt(a, o, v->str, v->len);
        break;
    case SD_JSON_ARRAY:
        if (o->kind != SD_OPT_LIST) bad = 1;
        for (const sd_json *e = v->child; e && !bad && !rc; e = e->next)
            if (e->type == SD_JSON_STRING || e->type == SD_JSON_NUMBER) rc = push_opt(a, o, e->str, e->len);
            else bad = 1;
        break;
    case SD_JSON_OBJECT: break;
    }
    if (rc) return SD_EXIT_FATAL;
    if (bad) {
        sd_cli_usage_error(cli, "%s: '%s' (--%s) cannot take that value", file, path, o->name);
        return SD_EXIT_USAGE;
    }
    return 0;
}

/* Expand one config text; it is taken over (kept with the words, which
 * point into it, or freed on failure). */
static int add_text(const sd_cli *cli, sd_cli_args *a, sd_buf *text, const char *name)
{
    sd_error err = {0};
    sd_json *root = NULL;
    int rc = 0;
    if (sd_json_parse(&a->arena, text->data, text->len, &root, &err)) {
        sd_cli_usage_error(cli, "--config %s: %s", name, err.msg);
        rc = SD_EXIT_USAGE;
    } else if (root->type != SD_JSON_OBJECT) {
        sd_cli_usage_error(cli, "--config %s: expected a JSON object of options", name);
        rc = SD_EXIT_USAGE;
    } else {
        rc = add_member(cli, a, "", root, name);
    }
    if (!rc && sd_strlist_push(&a->keep, text->data)) rc = SD_EXIT_FATAL;
    if (rc) sd_buf_free(text);
    return rc;
}

/* Read and expand one config file. */
static int add_file(const sd_cli *cli, sd_cli_args *a, const char *file)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_error err = {0};
    if (sd_read_file(file, &text, &err)) {
        sd_buf_free(&text);
        sd_cli_usage_error(cli, "--config %s: %s", file, err.msg);
        return SD_EXIT_USAGE;
    }
    return add_text(cli, a, &text, file);
}

/* A config given as bytes (the fuzz target's entry): as one more file. */
int sd_cli_expand_config_text(const sd_cli *cli, sd_cli_args *a, const char *data, size_t len)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_buf_put(&text, data, len);
    if (text.oom || !text.data) {
        sd_buf_free(&text);
        return SD_EXIT_FATAL;
    }
    return add_text(cli, a, &text, "(config text)");
}

/* One --set KEY=VALUE. */
static int add_set(const sd_cli *cli, sd_cli_args *a, const char *kv)
{
    const char *eq = strchr(kv, '=');
    const sd_opt *o = eq ? resolve(cli, kv, (size_t)(eq - kv)) : NULL;
    if (!o) {
        sd_cli_usage_error(cli, "--set %s: expected KEY=VALUE with KEY an option (e.g. optimizer.lr=1e-5)", kv);
        return SD_EXIT_USAGE;
    }
    const char *v = eq + 1;
    if (o->kind == SD_OPT_FLAG) {
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0) return push_opt(a, o, NULL, 0) ? SD_EXIT_FATAL : 0;
        if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0) {
            drop_flag(cli, a, o);
            return 0;
        }
        sd_cli_usage_error(cli, "--set %s: --%s is a flag: true or false", kv, o->name);
        return SD_EXIT_USAGE;
    }
    return push_opt(a, o, v, strlen(v)) ? SD_EXIT_FATAL : 0;
}

/* The option word at i is --NAME (or --NAME=VALUE); its value, and how
 * many words it took, or NULL. */
static const char *take(int argc, char **argv, int i, const char *name, int *used)
{
    size_t n = strlen(name);
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0) return NULL;
    if (a[2 + n] == '=') {
        *used = 1;
        return a + 3 + n;
    }
    if (a[2 + n] != 0) return NULL;
    *used = 2;
    return i + 1 < argc ? argv[i + 1] : "";
}

/* See cli.h: the files' options first, then the command line's own, then --set, so later ones win. */
int sd_cli_expand(const sd_cli *cli, int argc, char **argv, sd_cli_args *out)
{
    memset(out, 0, sizeof *out);
    sd_arena_init(&out->arena, 4096);
    if (push_word(out, argv[0])) return SD_EXIT_FATAL;
    int rc = 0;
    /* the files first, wherever --config stands */
    for (int i = 1; i < argc && !rc; i++) {
        int used = 0;
        if (strcmp(argv[i], "--") == 0) break;
        const char *f = take(argc, argv, i, "config", &used);
        if (f && !*f) {
            sd_cli_usage_error(cli, "--config needs a file");
            rc = SD_EXIT_USAGE;
        } else if (f) {
            rc = add_file(cli, out, f);
        }
        if (used) i += used - 1;
    }
    /* then the command line's own options (its words after "--" wait) */
    int dashdash = argc;
    for (int i = 1; i < argc && !rc; i++) {
        int used = 0;
        if (strcmp(argv[i], "--") == 0) {
            dashdash = i;
            break;
        }
        if (take(argc, argv, i, "config", &used) || take(argc, argv, i, "set", &used)) {
            i += used - 1;
            continue;
        }
        if (push_word(out, argv[i])) rc = SD_EXIT_FATAL;
    }
    /* --set last among the options: it overrides both */
    for (int i = 1; i < dashdash && !rc; i++) {
        int used = 0;
        const char *kv = take(argc, argv, i, "set", &used);
        if (kv) rc = add_set(cli, out, kv);
        if (used) i += used - 1;
    }
    /* and "--" with what follows it, untouched */
    for (int i = dashdash; i < argc && !rc; i++)
        if (push_word(out, argv[i])) rc = SD_EXIT_FATAL;
    if (rc) {
        sd_cli_args_free(out);
        return rc;
    }
    return -1;
}

/* Free the expanded words and the files' text they point into, once no option value is used. */
void sd_cli_args_free(sd_cli_args *a)
{
    for (int i = 0; i < a->keep.n; i++) free((void *)a->keep.v[i]);
    sd_strlist_free(&a->keep);
    free(a->argv);
    sd_arena_free(&a->arena);
    memset(a, 0, sizeof *a);
}

/* Option names as keys, current values as values; --config reads it back.
 * skip: option names left out (run control such as resume or fresh, which
 * must not come back with the file), NULL-terminated, or NULL. */
void sd_cli_values_json(const sd_cli *cli, const char *const *skip, sd_buf *b)
{
    int first = 1;
    sd_buf_puts(b, "{");
    for (const sd_opt *o = cli->opts; o && o->name; o++) {
        if (strcmp(o->name, "config") == 0 || strcmp(o->name, "set") == 0) continue;
        int skipped = 0;
        for (const char *const *k = skip; k && *k && !skipped; k++) skipped = strcmp(*k, o->name) == 0;
        if (skipped) continue;
        if (o->kind == SD_OPT_STR && !*(const char **)o->dest) continue;
        sd_buf_json_key(b, &first, o->name);
        switch (o->kind) {
        case SD_OPT_FLAG: sd_buf_puts(b, *(int *)o->dest ? "true" : "false"); break;
        case SD_OPT_INT: sd_buf_json_int(b, *(long *)o->dest); break;
        case SD_OPT_DOUBLE: sd_buf_json_num(b, *(double *)o->dest); break;
        case SD_OPT_STR: sd_buf_json_cstr(b, *(const char **)o->dest); break;
        case SD_OPT_LIST: {
            const sd_strlist *l = o->dest;
            sd_buf_puts(b, "[");
            for (int i = 0; i < l->n; i++) {
                if (i) sd_buf_puts(b, ", ");
                sd_buf_json_cstr(b, l->v[i]);
            }
            sd_buf_puts(b, "]");
            break;
        }
        }
    }
    sd_buf_puts(b, "}");
}
