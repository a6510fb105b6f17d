/* Fuzz target for sd-train-style config files (libcore/base/cli_config.c): any
 * bytes are either refused with a usage error or expanded into option
 * words that the option parser then accepts or refuses, and every word is
 * a string; nothing else may happen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "err.h"
#include "fuzz.h"

/* One options table of every kind, as a tool has. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = NULL, *cfg = NULL;
    long i = 0;
    double d = 0;
    int f = 0;
    sd_strlist list = {0}, sets = {0}, pos = {0};
    const sd_opt opts[] = {{"config", 0, SD_OPT_STR, &cfg, "FILE", "config"},
                           {"set", 0, SD_OPT_LIST, &sets, "K=V", "override"},
                           {"name", 'n', SD_OPT_STR, &s, "S", "a string"},
                           {"count", 'c', SD_OPT_INT, &i, "N", "an integer"},
                           {"rate", 0, SD_OPT_DOUBLE, &d, "X", "a number"},
                           {"flag", 'f', SD_OPT_FLAG, &f, NULL, "a flag"},
                           {"item", 0, SD_OPT_LIST, &list, "S", "a list"},
                           {NULL, 0, 0, NULL, NULL, NULL}};
    const sd_cli cli = {"fuzz", "[OPTIONS]", "fuzz", opts, NULL, NULL};
    char prog[] = "fuzz", *argv[] = {prog, NULL};
    sd_cli_args a;
    if (sd_cli_expand(&cli, 1, argv, &a) >= 0) abort(); /* nothing to refuse yet */
    /* stderr quiet: refusals print usage lines */
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    if (!stderr) stderr = saved;
    int rc = sd_cli_expand_config_text(&cli, &a, (const char *)data, size);
    if (rc == 0) {
        for (int k = 0; k < a.argc; k++)
            if (!a.argv[k]) abort();
        if (a.argv[a.argc]) abort();
        int pr = sd_cli_parse(&cli, a.argc, a.argv, &pos);
        if (pr != -1 && pr != SD_EXIT_USAGE) abort();
        sd_buf b;
        sd_buf_init(&b);
        sd_cli_values_json(&cli, NULL, &b);
        sd_buf_free(&b);
    }
    if (stderr != saved) fclose(stderr);
    stderr = saved;
    sd_cli_args_free(&a);
    sd_strlist_free(&list);
    sd_strlist_free(&sets);
    sd_strlist_free(&pos);
    return 0;
}
