/* sd-pack: move cached latents and text embeddings between shards and in
 * and out of other layouts. This file only dispatches to the subcommands
 * (tools/pack/pack_*.c), each with its own options and --help. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "err.h"
#include "pack/pack.h"

static const struct {
    const char *name;
    pack_cmd fn;
    const char *help;
} cmds[] = {
    {"info", pack_info, "metadata, record counts by kind and bucket, dtypes, bytes"},
    {"merge", pack_merge, "many shards into one (duplicate keys and names: first kept, texts deduplicated)"},
    {"split", pack_split, "one shard into N, balanced by bucket as sd-bucket --split"},
    {"compact", pack_compact, "copy a shard without free pages"},
    {"import-kohya", pack_import_kohya, "kohya latents/te_outputs npz directory -> shard (resumable)"},
    {"export-kohya", pack_export_kohya, "shard -> kohya npz layout (float32)"},
    {"export-tar", pack_export_tar, "shard -> tar files of .npy members (+ .json per record)"},
};

/* The top-level help: the subcommands. */
static void usage(FILE *f)
{
    fprintf(f, "Usage: sd-pack COMMAND [OPTIONS] ...\n\n"
               "Shard housekeeping and cache interop. 'sd-pack COMMAND --help' describes each command.\n\n"
               "Commands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) fprintf(f, "  %-14s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\nExit codes: 0 ok, 1 records skipped under --strict, 2 usage error, 3 fatal error (info has\n"
               "no --strict; each command's --help gives its own line).\n");
}

/* Dispatch to the subcommand the first word names; the top-level --help and --version. */
int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return SD_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return SD_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sd-pack (sdtk) %s\n", sd_version());
        return SD_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sd-pack: unknown command '%s'\nTry 'sd-pack --help' for more information.\n", argv[1]);
    return SD_EXIT_USAGE;
}
