/* Naming and guessing source kinds, so `sd-meta PATH` usually needs no flag,
 * and the checks on names and text every reader shares (UTF-8, BOM). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sources.h"
#include "utf8.h"

static const char *const names[] = {"auto", "folder", "tree", "metatree", "booru", "kohya", "wds"};

/* Kind by name ("folder", "wds", ...); -1 if unknown. */
sd_source_kind sd_source_parse(const char *name)
{
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(names[i], name) == 0) return (sd_source_kind)i;
    return (sd_source_kind)-1;
}

/* Name of a kind, for messages. */
const char *sd_source_name(sd_source_kind k)
{
    return (size_t)k < sizeof names / sizeof *names ? names[k] : "?";
}

/* Does dir/name exist as a directory? */
static int is_subdir(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* JSON whitespace is skipped before and between the tokens the sniff looks at. */
static const char *skip_blank(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* The byte after a JSON string that starts at p (its opening quote), or NULL
 * when it does not end inside [p, end): a ':' or '"' inside the key (a
 * Windows path "C:\\data\\x.png", an escaped quote) is part of the string. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '"') return p + 1;
        if (*p == '\\' && ++p == end) break;
    }
    return NULL;
}

/* Does a document start like kohya's dictionary, '{' "key" ':' '{'?
 * Arrays, post objects (first value a number or string) and JSON lines are
 * booru dumps. */
static int kohya_shaped(const char *p, const char *end)
{
    p = skip_blank(p, end);
    if (p == end || *p != '{') return 0;
    p = skip_blank(p + 1, end);
    if (p == end || *p != '"' || !(p = skip_string(p, end))) return 0;
    p = skip_blank(p, end);
    if (p == end || *p != ':') return 0;
    p = skip_blank(p + 1, end);
    return p < end && *p == '{';
}

/* Sniff the start of a regular .json file for the kohya shape (after a
 * UTF-8 BOM, which Windows editors write). Only regular files are opened
 * here: a FIFO or pipe would lose what this read took. */
static int looks_kohya(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n <= 0) return 0;
    size_t skip = sd_bom_len(buf, (size_t)n);
    return kohya_shaped(buf + skip, buf + n);
}

/* Guess the kind of a source path from what is there. */
sd_source_kind sd_source_detect(const char *path)
{
    if (strcmp(path, "-") == 0) return SD_SRC_BOORU;
    size_t n = strlen(path);
    if (strchr(path, '{') && strstr(path, ".tar")) return SD_SRC_WDS;
    if ((n > 4 && strcmp(path + n - 4, ".tar") == 0) || (n > 7 && strcmp(path + n - 7, ".tar.gz") == 0))
        return SD_SRC_WDS;
    struct stat st;
    if (stat(path, &st) != 0) return SD_SRC_AUTO;
    if (S_ISDIR(st.st_mode)) {
        if (is_subdir(path, "images") && is_subdir(path, "captions")) return SD_SRC_TREE;
        return SD_SRC_FOLDER;
    }
    if (S_ISREG(st.st_mode) && n > 5 && strcmp(path + n - 5, ".json") == 0 && looks_kohya(path)) return SD_SRC_KOHYA;
    return SD_SRC_BOORU;
}

