/* One option parser for every tool: a table of options gives --help text,
 * --version, typed values and the shared exit codes. */
#ifndef SDTK_CLI_H
#define SDTK_CLI_H

#include "arena.h"
#include "buf.h"

typedef enum {
    SD_OPT_FLAG,   /* int, set to 1 */
    SD_OPT_INT,    /* long */
    SD_OPT_DOUBLE, /* double */
    SD_OPT_STR,    /* const char *, last one wins */
    SD_OPT_LIST    /* sd_strlist, every occurrence appended */
} sd_opt_kind;

typedef struct {
    const char **v;
    int n;
} sd_strlist;

typedef struct {
    const char *name; /* long name without dashes */
    char short_name;  /* 0 for none */
    sd_opt_kind kind;
    void *dest;
    const char *metavar;
    const char *help;
} sd_opt;

typedef struct {
    const char *prog;
    const char *usage;   /* e.g. "[OPTIONS] SOURCE..." */
    const char *summary; /* one paragraph */
    const sd_opt *opts;  /* terminated by an entry with name == NULL */
    const char *epilog;  /* examples, notes; may be NULL */
    const char *exit_codes; /* this tool's exit-code line; NULL: the common one (err.h) */
} sd_cli;

int sd_cli_parse(const sd_cli *cli, int argc, char **argv, sd_strlist *positional);
void sd_cli_usage_error(const sd_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sd_version(void);
void sd_strlist_free(sd_strlist *l);
/* A --device value: "cpu" gives -1, "cuda" 0, "cuda:K" K (0..1023);
 * returns -1 for anything else. */
int sd_cli_parse_device(const char *s, int *device);
/* A --gpu-memory-limit value in GiB as bytes (0 stays "no limit", a
 * positive value too small for a byte is 1 byte); returns -1 unless it is
 * 0 to 2^20 GiB. */
int sd_cli_gib_bytes(double gib, size_t *bytes);
/* A --mixed-precision value: "no" (or "fp32") gives 0, "bf16" SD_DT_BF16,
 * "fp16" SD_DT_F16 (dtype.h); returns -1 for anything else. */
int sd_cli_parse_mixed(const char *s, int *dtype);
int sd_strlist_push(sd_strlist *l, const char *s);

/* --config FILE (a JSON object of options: long names as keys, nested
 * objects read as dotted keys whose last part is the option, '_' as '-',
 * keys starting with '_' ignored) and --set KEY=VALUE, expanded into option
 * words (cli_config.c): argv0, the files' options, the command line's own
 * words, then the --set ones, so later ones win. The tool lists config and
 * set in its table for --help; sd_cli_parse then runs on out->argc/argv.
 * Returns -1 to go on, or an exit code after the message. Option values
 * point into out: free it after the last use of an option. */
typedef struct {
    int argc, cap;
    char **argv;
    sd_arena arena;
    sd_strlist keep; /* the files' text, which parsed strings point into */
} sd_cli_args;
int sd_cli_expand(const sd_cli *cli, int argc, char **argv, sd_cli_args *out);
void sd_cli_args_free(sd_cli_args *a);
/* One more config, given as bytes, appended to out's words (after a
 * successful sd_cli_expand): what the config fuzz target drives. Returns 0
 * or an exit code after the message. */
int sd_cli_expand_config_text(const sd_cli *cli, sd_cli_args *out, const char *data, size_t len);
/* Every option's current value as one JSON object: the effective
 * configuration, which --config reads back; the options named in skip
 * (NULL-terminated, or NULL) left out. A false flag in a file or --set
 * drops the flag's earlier words, so it turns off what came before. */
void sd_cli_values_json(const sd_cli *cli, const char *const *skip, sd_buf *b);

#endif
