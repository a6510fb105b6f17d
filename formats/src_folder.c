/* Folder sources: a flat (recursive) folder of images with .txt/.caption
 * beside them, an images/ + captions/ pair of trees, and a tree of metadata
 * .json files. Directories are read in sorted order so output is stable, and
 * each directory is entered once (symlink loops are reported, not followed). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "sources.h"

typedef struct {
    dev_t dev;
    ino_t ino;
} dir_id;

typedef struct {
    sd_meta_run *m;
    const char *root;      /* the dataset root given by the user */
    const char *cap_root;  /* tree mode: the captions/ directory */
    int mode;              /* 0 flat, 1 tree, 2 metatree */
    dir_id *seen;
    size_t nseen, capseen;
    uint64_t found; /* images (or metadata files) seen, usable or not */
} walker;

/* strcmp for qsort over char* arrays. */
static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Was this directory entered before? Marks it as entered if not. */
static int seen_before(walker *w, const struct stat *st)
{
    for (size_t i = 0; i < w->nseen; i++)
        if (w->seen[i].dev == st->st_dev && w->seen[i].ino == st->st_ino) return 1;
    if (w->nseen == w->capseen) {
        size_t cap = w->capseen ? w->capseen * 2 : 64;
        dir_id *n = realloc(w->seen, cap * sizeof *n);
        if (!n) return 0;
        w->seen = n;
        w->capseen = cap;
    }
    w->seen[w->nseen].dev = st->st_dev;
    w->seen[w->nseen].ino = st->st_ino;
    w->nseen++;
    return 0;
}

/* Sorted names of a directory (without . and ..); NULL on error. */
static char **list_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int n = 0, cap = 64;
    char **v = malloc((size_t)cap * sizeof *v);
    struct dirent *e;
    while (v && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (n == cap) {
            cap *= 2;
            char **nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (v) qsort(v, (size_t)n, sizeof *v, cmp_names);
    *count = n;
    return v;
}

/* Is name in the sorted list? */
static int has_name(char **names, int n, const char *name)
{
    return bsearch(&name, names, (size_t)n, sizeof *names, cmp_names) != NULL;
}

/* "dir/name" in run-lifetime or batch memory (one slash, also when dir is "/"). */
static char *path_join(sd_arena *a, const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    char *p = sd_arena_alloc(a, dl + nl + 2);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (!dl || dir[dl - 1] != '/') p[dl++] = '/';
    memcpy(p + dl, name, nl + 1);
    return p;
}

/* The root as given without its trailing slashes ("/" stays "/"), in run
 * memory, so records name "dir/x.png", never "dir//x.png". */
static const char *clean_root(sd_meta_run *m, const char *root)
{
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/') n--;
    return sd_arena_strndup(&m->run_arena, root, n);
}

/* Is there a file STEM.EXT with an image extension (no further dot) in the
 * sorted listing? The names starting "STEM." are adjacent there. */
static int has_image_for(char **names, int n, const char *stem, size_t sl)
{
    char prefix[1024];
    if (sl + 2 > sizeof prefix) return 1; /* too long to judge: not reported */
    memcpy(prefix, stem, sl);
    prefix[sl] = '.';
    prefix[sl + 1] = 0;
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (strcmp(names[mid], prefix) < 0) lo = mid + 1;
        else hi = mid;
    }
    for (int i = lo; i < n && strncmp(names[i], prefix, sl + 1) == 0; i++)
        if (!strchr(names[i] + sl + 1, '.') && sd_is_image_name(names[i], strlen(names[i]))) return 1;
    return 0;
}

/* Flat mode: a .txt or .caption file whose image is missing or has an
 * extension sdtk does not read (.gif, .jfif) is counted and, with
 * --verbose, named: not an error, but no longer silent. */
static void note_orphan_caption(walker *w, const char *path, const char *name, char **names, int n)
{
    size_t nl = strlen(name), el = nl > 4 && strcmp(name + nl - 4, ".txt") == 0 ? 4
                                : nl > 8 && strcmp(name + nl - 8, ".caption") == 0 ? 8 : 0;
    if (el && !has_image_for(names, n, name, nl - el))
        sd_meta_note_ignored(w->m, "caption without a usable image", path);
}

/* Key of a file: its path relative to the root, without the extension. */
static char *make_key(sd_arena *a, const char *rel, const char *name)
{
    const char *dot = strrchr(name, '.');
    size_t stem = dot ? (size_t)(dot - name) : strlen(name);
    size_t rl = strlen(rel);
    char *k = sd_arena_alloc(a, rl + stem + 2);
    if (!k) return NULL;
    size_t o = 0;
    if (rl) {
        memcpy(k, rel, rl);
        k[rl] = '/';
        o = rl + 1;
    }
    memcpy(k + o, name, stem);
    k[o + stem] = 0;
    return k;
}

/* Add one image found in dir (flat or tree mode); one with no caption file
 * is skipped here, the message naming where the captions were looked for. */
static void add_image(walker *w, const char *dir, const char *rel, const char *name, char **names, int n)
{
    sd_meta_run *m = w->m;
    const char *dot = strrchr(name, '.');
    size_t stem = (size_t)(dot - name);
    const char *found[2] = {NULL, NULL}; /* .txt, .caption */
    const char *exts[2] = {".txt", ".caption"};
    char *stem_path = NULL; /* tree mode: captions/REL/STEM */
    if (w->mode == 0) {
        for (int k = 0; k < 2; k++) {
            char cand[1024];
            snprintf(cand, sizeof cand, "%.*s%s", (int)stem, name, exts[k]);
            if (has_name(names, n, cand)) found[k] = path_join(&m->arena, dir, cand);
        }
    } else {
        stem_path = sd_arena_alloc(&m->arena, strlen(w->cap_root) + strlen(rel) + stem + 4);
        if (!stem_path) return;
        sprintf(stem_path, "%s/%s%s%.*s", w->cap_root, rel, *rel ? "/" : "", (int)stem, name);
        for (int k = 0; k < 2; k++) {
            char *p = sd_arena_alloc(&m->arena, strlen(stem_path) + 16);
            if (!p) continue;
            sprintf(p, "%s%s", stem_path, exts[k]);
            if (access(p, F_OK) == 0) found[k] = p;
        }
    }
    char *image = path_join(&m->arena, dir, name);
    if (!found[0] && !found[1]) {
        if (stem_path) sd_meta_skip_input(m, "missing caption", "%s (no %s.txt or .caption)", image, stem_path);
        else sd_meta_skip_input(m, "missing caption", "%s (no .txt or .caption beside it)", image);
        return;
    }
    sd_input *in = sd_meta_add(m, SD_IN_FILES, NULL, 0);
    in->image = image;
    in->origin = in->image;
    in->key = make_key(&m->arena, rel, name);
    in->txt_path = found[0];
    in->cap_path = found[1];
}

/* Report an entry that cannot be used, its path escaped (see sd_name_escape)
 * so that the message names the exact bytes and stays UTF-8. why may be NULL. */
static void skip_path(sd_meta_run *m, const char *reason, const char *path, const char *why)
{
    char esc[320];
    sd_name_escape(path, esc, sizeof esc);
    if (why) sd_meta_skip_input(m, reason, "%s (%s)", esc, why);
    else sd_meta_skip_input(m, reason, "%s", esc);
}

/* An entry whose stat failed: a broken symlink, or (other than a file gone
 * since the listing) an error that would otherwise lose the entry silently. */
static void stat_failed(sd_meta_run *m, const char *path, int err)
{
    struct stat ls;
    if (lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode)) skip_path(m, "broken symlink", path, NULL);
    else if (err != ENOENT) skip_path(m, "unreadable directory entry", path, strerror(err));
}

/* Recursive walk of dir (rel is its path below the root). */
static void walk(walker *w, const char *dir, const char *rel, int depth)
{
    sd_meta_run *m = w->m;
    struct stat st;
    if (stat(dir, &st) != 0) {
        sd_meta_skip_input(m, "unreadable directory", "%s (%s)", dir, strerror(errno));
        return;
    }
    if (seen_before(w, &st)) {
        sd_meta_skip_input(m, "directory visited twice (symlink loop)", "%s", dir);
        return;
    }
    if (depth > 64) {
        sd_meta_skip_input(m, "directory nesting too deep", "%s", dir);
        return;
    }
    int n = 0;
    char **names = list_dir(dir, &n);
    if (!names) {
        sd_meta_skip_input(m, "unreadable directory", "%s (%s)", dir, strerror(errno));
        return;
    }
    if (n && access(dir, X_OK) != 0) { /* listed but not searchable (mode r--): no entry can be opened */
        char why[128];
        snprintf(why, sizeof why, "cannot search it: %s", strerror(errno));
        skip_path(m, "unreadable directory", dir, why);
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        return;
    }
    for (int i = 0; i < n; i++) {
        const char *name = names[i];
        if (name[0] == '.') continue; /* hidden files and our own temp files */
        char *path = path_join(&m->run_arena, dir, name);
        struct stat es;
        if (!path) continue;
        if (stat(path, &es) != 0) {
            stat_failed(m, path, errno);
            continue;
        }
        if (S_ISDIR(es.st_mode)) {
            size_t rl = strlen(rel);
            char *sub = sd_arena_alloc(&m->run_arena, rl + strlen(name) + 2);
            if (!sub) continue;
            sprintf(sub, "%s%s%s", rel, rl ? "/" : "", name);
            walk(w, path, sub, depth + 1);
            continue;
        }
        if (!S_ISREG(es.st_mode)) continue;
        size_t nl = strlen(name);
        if (w->mode == 2) {
            if (nl > 5 && strcmp(name + nl - 5, ".json") == 0) {
                w->found++;
                sd_input *in = sd_meta_add(m, SD_IN_METAFILE, path, 0);
                in->txt_path = path;
                in->root = w->root;
            }
        } else if (sd_is_image_name(name, nl)) {
            /* NAME_mask.png beside an image NAME.ext is that image's loss mask
             * (sd-latents --masks files), not a picture to train on: ignored
             * (counted, named with --verbose), never a skipped record */
            if (nl > 9 && strcmp(name + nl - 9, "_mask.png") == 0 && has_image_for(names, n, name, nl - 9)) {
                sd_meta_note_ignored(m, "loss mask beside its image", path);
                continue;
            }
            w->found++;
            /* the key is the path cut at '/' and '.', so it is UTF-8 when the path is */
            if (!sd_name_is_utf8(path)) {
                skip_path(m, "file name not UTF-8", path, NULL);
                continue;
            }
            if (es.st_size == 0) {
                sd_meta_skip_input(m, "empty image file", "%s", path);
                continue;
            }
            add_image(w, dir, rel, name, names, n);
        } else if (w->mode == 0) {
            note_orphan_caption(w, path, name, names, n);
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Say loudly that a folder held nothing to read (a wrong directory, a
 * mount that is not there), its name escaped for the message. */
static void warn_nothing_found(const char *root, const char *what)
{
    char esc[320];
    sd_log(SD_LOG_WARN, "no %s found in %s", what, sd_name_escape(root, esc, sizeof esc));
}

/* Read a flat folder (tree = 0) or an images/ + captions/ pair (tree = 1). */
sd_status sd_read_folder(sd_meta_run *m, const char *root, int tree, sd_error *err)
{
    root = clean_root(m, root);
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) return sd_err_set(err, SD_EIO, "%s: not a directory", root);
    if (access(root, R_OK | X_OK) != 0) return sd_err_set(err, SD_EIO, "%s: cannot list: %s", root, strerror(errno));
    walker w = {m, root, NULL, tree ? 1 : 0, NULL, 0, 0, 0};
    if (tree) {
        char *img = path_join(&m->run_arena, root, "images");
        if (stat(img, &st) != 0 || !S_ISDIR(st.st_mode))
            return sd_err_set(err, SD_EIO, "%s: no images/ directory (an images/ + captions/ tree needs one)", root);
        w.cap_root = path_join(&m->run_arena, root, "captions");
        walk(&w, img, "", 0);
    } else {
        walk(&w, root, "", 0);
    }
    free(w.seen);
    if (!w.found) warn_nothing_found(root, "images");
    return SD_OK;
}

/* Read a tree of metadata .json files; image paths are relative to root. */
sd_status sd_read_metatree(sd_meta_run *m, const char *root, sd_error *err)
{
    root = clean_root(m, root);
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) return sd_err_set(err, SD_EIO, "%s: not a directory", root);
    if (access(root, R_OK | X_OK) != 0) return sd_err_set(err, SD_EIO, "%s: cannot list: %s", root, strerror(errno));
    if (!sd_name_is_utf8(root)) { /* every record's image path starts with it */
        char esc[200];
        return sd_err_set(err, SD_EINVAL, "%s: directory name is not UTF-8 (records name their images by it)",
                          sd_name_escape(root, esc, sizeof esc));
    }
    walker w = {m, root, NULL, 2, NULL, 0, 0, 0};
    walk(&w, root, "", 0);
    free(w.seen);
    if (!w.found) warn_nothing_found(root, "metadata .json files");
    return SD_OK;
}
