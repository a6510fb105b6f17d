/* Replay driver for builds without libFuzzer: feeds every file named on the
 * command line (directories are read one level deep) to the target's
 * LLVMFuzzerTestOneInput, so the seed corpus and crash reproducers run as an
 * ordinary test. Exits non-zero if a path cannot be read or nothing ran. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Read one file whole and run it; 0 on success. */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    unsigned char *data = malloc(cap);
    size_t r;
    while (data && (r = fread(data + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            unsigned char *nd = realloc(data, cap * 2);
            if (!nd) free(data);
            data = nd;
            cap *= 2;
        }
    }
    fclose(f);
    if (!data) return -1;
    LLVMFuzzerTestOneInput(data, len);
    free(data);
    return 0;
}

/* Compare names for a stable replay order. */
static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run every regular file in a directory, in name order; returns the count or -1. */
static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path)) count = -1;
            else if (count >= 0) count++;
        }
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    int total = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: not found\n", argv[i]);
            bad = 1;
        } else if (S_ISDIR(st.st_mode)) {
            int k = run_dir(argv[i]);
            if (k < 0) bad = 1;
            else total += k;
        } else if (run_file(argv[i])) {
            bad = 1;
        } else {
            total++;
        }
    }
    printf("replayed %d inputs\n", total);
    return bad || total == 0;
}
