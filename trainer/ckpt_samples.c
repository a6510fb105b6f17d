/* The sample folders sd-train removes (train_samples.c writes them):
 * checkpoint-N/samples/ and samples-ema/ go with their checkpoint, and
 * the folders of sample steps between checkpoints (out/samples/step-N,
 * out/samples-ema/step-N) go once --keep has pruned every checkpoint up
 * to their step. Only sample image names (and the temporary names a
 * killed write left) are removed, a folder only when nothing else is left
 * in it, and a link is never followed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"

/* See ckpt_int.h. */
int sd_train_is_temp_of(const char *name, const char *base)
{
    size_t bl = strlen(base);
    return strncmp(name, base, bl) == 0 && strncmp(name + bl, ".tmp.", 5) == 0 && strlen(name + bl + 5) == 6;
}

/* Whether name is a sample image's ("00012.png": digits, .png) or the
 * temporary name a killed write of one left. */
static int sample_file(const char *name)
{
    size_t d = strspn(name, "0123456789");
    if (!d || strncmp(name + d, ".png", 4) != 0) return 0;
    if (!name[d + 4]) return 1;
    char base[64];
    snprintf(base, sizeof base, "%.*s", (int)(d + 4), name);
    return d < 40 && sd_train_is_temp_of(name, base);
}

/* Whether path is a directory itself, not a link to one. */
static int is_real_dir(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* See ckpt_int.h. */
void sd_train_remove_samples(const char *dir, const char *sub)
{
    char d[PATH_CAP], p[PATH_CAP];
    if ((size_t)snprintf(d, sizeof d, "%s/%s", dir, sub) >= sizeof d || !is_real_dir(d)) return;
    DIR *dd = opendir(d);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (sample_file(e->d_name) && (size_t)snprintf(p, sizeof p, "%s/%s", d, e->d_name) < sizeof p) unlink(p);
    closedir(dd);
    rmdir(d);
}

/* The step of a "step-<digits>" name, -1 for anything else. */
static long step_of(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9') return -1;
    char *end;
    long s = strtol(name + 5, &end, 10);
    return *end ? -1 : s;
}

/* out/top/step-N for every N < before, as sd_train_remove_samples; top
 * itself when that leaves it empty. */
static void prune_steps(const char *out, const char *top, long before)
{
    char d[PATH_CAP];
    if ((size_t)snprintf(d, sizeof d, "%s/%s", out, top) >= sizeof d || !is_real_dir(d)) return;
    DIR *dd = opendir(d);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd))) {
        long s = step_of(e->d_name);
        if (s >= 0 && s < before) sd_train_remove_samples(d, e->d_name);
    }
    closedir(dd);
    rmdir(d);
}

/* See ckpt_int.h. */
void sd_train_prune_step_samples(const char *out, long before)
{
    prune_steps(out, "samples", before);
    prune_steps(out, "samples-ema", before);
}
