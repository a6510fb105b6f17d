#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "err.h"

#ifndef SDTK_VERSION
#define SDTK_VERSION "dev"
#endif

/* The toolkit version every tool prints for --version. */
const char *sd_version(void)
{
    return SDTK_VERSION;
}

/* Append s to a list (the strings are borrowed, not copied); 0 on success. */
int sd_strlist_push(sd_strlist *l, const char *s)
{
    const char **v = realloc(l->v, (size_t)(l->n + 1) * sizeof *v);
    if (!v) return -1;
    v[l->n++] = s;
    l->v = v;
    return 0;
}

/* Free the list's array (not the borrowed strings). */
void sd_strlist_free(sd_strlist *l)
{
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* Print the full help text to stdout. */
static void print_help(const sd_cli *cli)
{
    printf("Usage: %s %s\n\n%s\n\nOptions:\n", cli->prog, cli->usage, cli->summary);
    for (const sd_opt *o = cli->opts; o && o->name; o++) {
        char left[64];
        const char *mv = o->kind == SD_OPT_FLAG ? "" : (o->metavar ? o->metavar : "VALUE");
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, *mv ? " " : "", mv);
        else
            snprintf(left, sizeof left, "    --%s%s%s", o->name, *mv ? " " : "", mv);
        printf("  %-30s %s\n", left, o->help);
    }
    printf("  %-30s %s\n", "-h, --help", "show this help and exit");
    printf("  %-30s %s\n", "    --version", "show the sdtk version and exit");
    printf("\nExit codes: %s\n",
           cli->exit_codes ? cli->exit_codes : "0 ok, 1 records skipped under --strict, 2 usage error, 3 fatal error.");
    if (cli->epilog) printf("\n%s\n", cli->epilog);
}

/* Complain about the command line and point at --help. */
void sd_cli_usage_error(const sd_cli *cli, const char *fmt, ...)
{
    fprintf(stderr, "%s: ", cli->prog);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help' for more information.\n", cli->prog);
}

/* Store one option value; 0 on success. */
static int store(const sd_cli *cli, const sd_opt *o, const char *val)
{
    char *end;
    switch (o->kind) {
    case SD_OPT_FLAG: *(int *)o->dest = 1; return 0;
    case SD_OPT_STR: *(const char **)o->dest = val; return 0;
    case SD_OPT_LIST: return sd_strlist_push((sd_strlist *)o->dest, val);
    case SD_OPT_INT: {
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end) {
            sd_cli_usage_error(cli, "--%s needs an integer, got '%s'", o->name, val);
            return -1;
        }
        *(long *)o->dest = v;
        return 0;
    }
    case SD_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end) {
            sd_cli_usage_error(cli, "--%s needs a number, got '%s'", o->name, val);
            return -1;
        }
        *(double *)o->dest = v;
        return 0;
    }
    }
    return -1;
}

/* Parse argv. Options and positionals may mix; "--" ends options. Returns -1
 * to go on, or an exit code (0 after --help/--version, 2 on a usage error). */
int sd_cli_parse(const sd_cli *cli, int argc, char **argv, sd_strlist *positional)
{
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (sd_strlist_push(positional, a)) return SD_EXIT_FATAL;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(cli);
            return SD_EXIT_OK;
        }
        if (strcmp(a, "--version") == 0) {
            printf("%s (sdtk) %s\n", cli->prog, sd_version());
            return SD_EXIT_OK;
        }
        const sd_opt *o = NULL;
        const char *inline_val = NULL;
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t nl = eq ? (size_t)(eq - name) : strlen(name);
            for (const sd_opt *c = cli->opts; c && c->name; c++)
                if (strlen(c->name) == nl && strncmp(c->name, name, nl) == 0) o = c;
            if (eq) inline_val = eq + 1;
        } else {
            for (const sd_opt *c = cli->opts; c && c->name; c++)
                if (c->short_name == a[1]) o = c;
            if (o && a[2]) { /* -j2 is -j 2; a flag takes no attached value */
                if (o->kind == SD_OPT_FLAG) o = NULL;
                else inline_val = a + 2;
            }
        }
        if (!o) {
            sd_cli_usage_error(cli, "unknown option '%s'", a);
            return SD_EXIT_USAGE;
        }
        if (o->kind == SD_OPT_FLAG) {
            if (inline_val) {
                sd_cli_usage_error(cli, "--%s takes no value", o->name);
                return SD_EXIT_USAGE;
            }
            *(int *)o->dest = 1;
            continue;
        }
        const char *val = inline_val;
        if (!val) {
            if (i + 1 >= argc) {
                sd_cli_usage_error(cli, "option '%s' needs a value", a);
                return SD_EXIT_USAGE;
            }
            val = argv[++i];
        }
        if (store(cli, o, val)) return SD_EXIT_USAGE;
    }
    return -1;
}

/* One conversion of --gpu-memory-limit for every tool. */
int sd_cli_gib_bytes(double gib, size_t *bytes)
{
    if (!(gib >= 0 && gib <= (double)(1 << 20))) return -1;
    *bytes = (size_t)(gib * (double)(1 << 30));
    if (gib > 0 && !*bytes) *bytes = 1;
    return 0;
}

/* One spelling of mixed precision for every tool (accelerate's and
 * kohya's --mixed_precision values). */
int sd_cli_parse_mixed(const char *s, int *dtype)
{
    if (strcmp(s, "no") == 0 || strcmp(s, "fp32") == 0) return *dtype = 0, 0;
    if (strcmp(s, "bf16") == 0) return *dtype = SD_DT_BF16, 0;
    if (strcmp(s, "fp16") == 0) return *dtype = SD_DT_F16, 0;
    return -1;
}

/* One spelling of devices for every tool: cpu, cuda, cuda:K. */
int sd_cli_parse_device(const char *s, int *device)
{
    if (strcmp(s, "cpu") == 0) return *device = -1, 0;
    if (strcmp(s, "cuda") == 0) return *device = 0, 0;
    if (strncmp(s, "cuda:", 5) != 0) return -1;
    char *end;
    long k = strtol(s + 5, &end, 10);
    if (end == s + 5 || *end || k < 0 || k > 1023) return -1;
    *device = (int)k;
    return 0;
}
