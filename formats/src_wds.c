/* WebDataset tar shards, read in place with libarchive (nothing extracted).
 * A sample is a run of consecutive members sharing a key (the path up to the
 * first dot of the basename). Image members are not copied: the record names
 * the shard, the member and, for uncompressed tars, the byte offset and size
 * of its data, so later tools pread it directly. */
#include <archive.h>
#include <archive_entry.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sources.h"

enum { MAX_TEXT_MEMBER = 4 << 20, PROBE = 16 };

typedef struct {
    char key[1024];
    int have;
    char *image_member;  /* run arena */
    int64_t size;
    int64_t header_pos;  /* where this member's header started */
    unsigned char probe[PROBE];
    size_t probe_len;
    int64_t offset;      /* resolved data offset, -1 unknown */
    char *txt, *json, *cls;
    size_t json_len;
    const char *problem;       /* a member that spoils the sample (empty image, NUL bytes), or NULL */
    char problem_member[1024]; /* that member's name */
} sample;

/* Expand the first {a,b} or {000..123} group of a pattern, recursively. */
static int expand(const char *pat, char ***out, int *n, int *cap)
{
    const char *open = strchr(pat, '{');
    const char *close = open ? strchr(open, '}') : NULL;
    if (!open || !close) {
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 16;
            char **nv = realloc(*out, (size_t)*cap * sizeof *nv);
            if (!nv) return -1;
            *out = nv;
        }
        (*out)[(*n)++] = strdup(pat);
        return 0;
    }
    size_t pre = (size_t)(open - pat);
    const char *body = open + 1;
    size_t bl = (size_t)(close - body);
    const char *dots = memmem(body, bl, "..", 2);
    char buf[4096];
    if (dots) {
        char *e1, *e2;
        long a = strtol(body, &e1, 10), b = strtol(dots + 2, &e2, 10);
        if (e1 != dots || e2 != close || b < a || b - a > 10000000) return -1;
        int width = (int)(dots - body);
        for (long i = a; i <= b; i++) {
            snprintf(buf, sizeof buf, "%.*s%0*ld%s", (int)pre, pat, width, i, close + 1);
            if (expand(buf, out, n, cap)) return -1;
        }
        return 0;
    }
    const char *p = body;
    while (p <= close) {
        const char *c = memchr(p, ',', (size_t)(close - p));
        const char *e = c ? c : close;
        snprintf(buf, sizeof buf, "%.*s%.*s%s", (int)pre, pat, (int)(e - p), p, close + 1);
        if (expand(buf, out, n, cap)) return -1;
        p = e + 1;
    }
    return 0;
}

/* Expand brace notation into a list of paths (caller frees). 0 on success. */
int sd_expand_braces(const char *pattern, char ***out, int *n)
{
    int cap = 0;
    *out = NULL;
    *n = 0;
    return expand(pattern, out, n, &cap);
}

/* Read a small member's data as a NUL-terminated string in the batch arena. */
static char *read_member_text(struct archive *ar, sd_arena *a, int64_t size, size_t *len)
{
    if (size < 0 || size > MAX_TEXT_MEMBER) return NULL;
    char *buf = sd_arena_alloc(a, (size_t)size + 1);
    if (!buf) return NULL;
    size_t got = 0;
    while (got < (size_t)size) {
        la_ssize_t r = archive_read_data(ar, buf + got, (size_t)size - got);
        if (r <= 0) return NULL;
        got += (size_t)r;
    }
    buf[got] = 0;
    *len = got;
    return buf;
}

/* A member name we refuse: absolute, or with a ".." component. */
static int unsafe_name(const char *name)
{
    if (name[0] == '/') return 1;
    for (const char *p = name; *p; p++)
        if (p[0] == '.' && p[1] == '.' && (p == name || p[-1] == '/') && (p[2] == 0 || p[2] == '/')) return 1;
    return 0;
}

/* Forget a sample's members, so the next sample starts empty (a caption
 * of a sample skipped for want of an image must not pass to the next one). */
static void sample_clear(sample *s)
{
    free(s->txt);
    free(s->json);
    free(s->cls);
    s->txt = s->json = s->cls = NULL;
    s->image_member = NULL;
    s->problem = NULL;
}

/* Remember the first member that spoils the sample, reported when it is
 * emitted (so it counts once, under its own reason). */
static void sample_spoil(sample *s, const char *problem, const char *member)
{
    if (s->problem) return;
    s->problem = problem;
    snprintf(s->problem_member, sizeof s->problem_member, "%s", member);
}

/* Why a complete sample cannot become an input (reported by the caller),
 * or NULL when it can. */
static const char *sample_problem(const sample *s)
{
    /* the key goes into the JSON record; the member is the key plus an ASCII extension */
    if (!sd_name_is_utf8(s->key)) return "tar member name not UTF-8";
    if (s->problem) return s->problem;
    return s->image_member ? NULL : "tar sample without image";
}

/* Hand a complete sample to the run (or report why it cannot be one). */
static void emit(sd_meta_run *m, const char *origin, sample *s, int fd)
{
    if (!s->have) return;
    s->have = 0;
    const char *problem = sample_problem(s);
    if (problem) {
        char esc[256];
        const char *name = problem == s->problem ? s->problem_member : s->key;
        sd_meta_skip_input(m, problem, "%s[%s]", origin, sd_name_escape(name, esc, sizeof esc));
        sample_clear(s);
        return;
    }
    if (s->offset >= 0 && fd >= 0) { /* check the computed offset against bytes libarchive gave us */
        unsigned char chk[PROBE];
        if (pread(fd, chk, s->probe_len, s->offset) != (ssize_t)s->probe_len || memcmp(chk, s->probe, s->probe_len) != 0)
            s->offset = -1;
    } else {
        s->offset = -1;
    }
    sd_input *in = sd_meta_add(m, SD_IN_GIVEN, origin, 0);
    in->key = sd_arena_strndup(&m->arena, s->key, strlen(s->key));
    in->image = origin;
    in->member = s->image_member;
    in->offset = s->offset;
    in->size = s->size;
    in->caption = s->txt ? sd_arena_strndup(&m->arena, s->txt, strlen(s->txt)) : NULL;
    if (s->json) {
        in->text = sd_arena_strndup(&m->arena, s->json, s->json_len);
        in->len = s->json_len;
    }
    if (s->cls) in->cls_text = sd_arena_strndup(&m->arena, s->cls, strlen(s->cls)); /* mapped by the worker */
    sample_clear(s);
}

/* A text member's data as a malloc'ed string, without a leading UTF-8 BOM
 * (not part of the caption or JSON); NULL when out of memory. */
static char *copy_text(const char *t, size_t len, size_t *out_len)
{
    size_t b = sd_bom_len(t, len);
    char *copy = malloc(len - b + 1);
    if (!copy) return NULL;
    memcpy(copy, t + b, len - b + 1);
    *out_len = len - b;
    return copy;
}

/* libarchive's own words for its last error ("Unrecognized archive
 * format", "Damaged tar archive"); its errno alone would read as
 * strerror(EILSEQ), a message about multibyte characters. */
static const char *archive_reason(struct archive *ar)
{
    const char *why = archive_error_string(ar);
    if (why && *why) return why;
    int e = archive_errno(ar);
    return e > 0 ? strerror(e) : "unknown error";
}

/* Read one shard. A shard that cannot be opened (or whose path the records
 * could not name in UTF-8) is an error for the caller to judge; so is a
 * compressed one (*.tar.gz): libarchive would stream it, but the records
 * would name members with no byte offset, which every later stage needs. */
static sd_status read_shard(sd_meta_run *m, const char *path, sd_error *err)
{
    if (!sd_name_is_utf8(path)) {
        char esc[200];
        return sd_err_set(err, SD_EINVAL, "%s: shard path is not UTF-8 (records name it)",
                          sd_name_escape(path, esc, sizeof esc));
    }
    struct stat fst;
    if (stat(path, &fst) == 0 && S_ISREG(fst.st_mode) && fst.st_size == 0)
        return sd_err_set(err, SD_EFORMAT, "%s: cannot open: empty file (not a tar)", path);
    struct archive *ar = archive_read_new();
    archive_read_support_filter_all(ar);
    archive_read_support_format_tar(ar);
    if (archive_read_open_filename(ar, path, 1 << 16) != ARCHIVE_OK) {
        int e = archive_errno(ar); /* a system error in its usual words (EILSEQ: libarchive's "not this format") */
        sd_status st = sd_err_set(err, SD_EIO, "%s: cannot open: %s", path,
                                  e > 0 && e != EILSEQ ? strerror(e) : archive_reason(ar));
        archive_read_free(ar);
        return st;
    }
    if (archive_filter_count(ar) > 1) { /* filter 0 is the outermost: gzip, bzip2, xz, zstd */
        sd_status st = sd_err_set(err, SD_EUNSUPPORTED, "%s: compressed tar (%s): its images cannot be read in place "
                                  "(sd-bucket and sd-latents read each image at its byte offset in the shard); "
                                  "unpack it (e.g. gunzip) and give the .tar", path, archive_filter_name(ar, 0));
        archive_read_free(ar);
        return st;
    }
    const char *origin = sd_meta_keep(m, path);
    int fd = open(path, O_RDONLY);
    sample s;
    memset(&s, 0, sizeof s);
    s.offset = -1;
    sd_arena tmp;
    sd_arena_init(&tmp, 1 << 16);
    struct archive_entry *e;
    char last_member[1024] = "";
    int pending_image = 0; /* an image member whose offset waits for the next header */
    int in_damage = 0;     /* inside a run of damaged headers (reported once per run) */
    for (;;) {
        int r = archive_read_next_header(ar, &e);
        int64_t pos = archive_read_header_position(ar);
        if (pending_image && (r == ARCHIVE_OK || r == ARCHIVE_WARN || r == ARCHIVE_EOF) && archive_filter_count(ar) == 1) {
            /* data ends where the next header starts (the last member: one 512-byte header before
             * its data); emit() checks the result against bytes libarchive returned */
            int64_t off = r == ARCHIVE_EOF ? s.header_pos + 512 : pos - (s.size + 511) / 512 * 512;
            s.offset = off > s.header_pos ? off : -1;
        }
        pending_image = 0;
        if (r == ARCHIVE_EOF) break;
        if (r == ARCHIVE_RETRY) { /* a header failed its checksum: libarchive steps on a block at a time */
            if (!in_damage)
                sd_meta_skip_input(m, "damaged tar", "%s at byte %lld, after member '%s' (%s; the members there are "
                                   "lost)", origin, (long long)pos, last_member, archive_reason(ar));
            in_damage = 1;
            continue;
        }
        in_damage = 0;
        if (r == ARCHIVE_FATAL || r == ARCHIVE_FAILED) {
            sd_meta_skip_input(m, "truncated or corrupt tar", "%s after member '%s' (%s)", origin, last_member,
                               archive_error_string(ar));
            if (s.have) /* the sample in progress may be cut short: drop it */
                sd_meta_skip_input(m, "tar sample cut by truncation", "%s[%s]", origin, s.key);
            s.have = 0;
            break;
        }
        const char *name = archive_entry_pathname(e);
        if (!name) continue;
        snprintf(last_member, sizeof last_member, "%s", name);
        if (archive_entry_filetype(e) != AE_IFREG) continue;
        if (unsafe_name(name)) {
            sd_meta_skip_input(m, "unsafe tar member name", "%s[%s]", origin, name);
            continue;
        }
        const char *base = strrchr(name, '/');
        base = base ? base + 1 : name;
        if (strncmp(base, "__", 2) == 0) continue;
        const char *dot = strchr(base, '.');
        if (!dot) continue;
        size_t klen = (size_t)(dot - name);
        if (klen >= sizeof s.key) {
            sd_meta_skip_input(m, "tar member name too long", "%s[%s]", origin, name);
            continue;
        }
        if (s.have && (strlen(s.key) != klen || strncmp(s.key, name, klen) != 0)) emit(m, origin, &s, fd);
        if (!s.have) {
            memcpy(s.key, name, klen);
            s.key[klen] = 0;
            s.have = 1;
            s.offset = -1;
        }
        char ext[16];
        size_t el = 0;
        for (const char *p = dot + 1; *p && el < sizeof ext - 1; p++) ext[el++] = (char)tolower((unsigned char)*p);
        ext[el] = 0;
        int64_t size = archive_entry_size(e);
        size_t tl;
        if (!strcmp(ext, "bmp")) { /* an image no tool reads (sd_img_refusal): named as such, not "without image" */
            sample_spoil(&s, "not a supported image", name);
            continue;
        }
        if (!strcmp(ext, "jpg") || !strcmp(ext, "jpeg") || !strcmp(ext, "png") || !strcmp(ext, "webp")) {
            if (s.image_member) {
                sd_meta_skip_input(m, "tar sample with two images", "%s[%s]", origin, name);
                continue;
            }
            if (size == 0) { /* as the folder source: nothing to decode */
                sample_spoil(&s, "empty image file", name);
                continue;
            }
            la_ssize_t got = archive_read_data(ar, s.probe, PROBE);
            if (got < 0 || (size >= PROBE && got != PROBE) || archive_read_data_skip(ar) != ARCHIVE_OK) {
                sd_meta_skip_input(m, "truncated or corrupt tar", "%s[%s] (%s)", origin, name, archive_error_string(ar));
                s.have = 0;
                break;
            }
            s.probe_len = (size_t)got;
            s.image_member = (char *)sd_meta_keep(m, name);
            s.size = size;
            s.header_pos = pos;
            pending_image = 1;
        } else if (!strcmp(ext, "txt") || !strcmp(ext, "text") || !strcmp(ext, "json") || !strcmp(ext, "cls")) {
            sd_arena_reset(&tmp);
            char *t = read_member_text(ar, &tmp, size, &tl);
            if (!t) {
                sd_meta_skip_input(m, "unreadable tar member", "%s[%s] (%s)", origin, name,
                                   size > MAX_TEXT_MEMBER ? "too large" : archive_error_string(ar));
                continue;
            }
            char *copy = copy_text(t, tl, &tl);
            if (!copy) continue;
            if (memchr(copy, 0, tl) && ext[0] != 'j') { /* strlen would cut it short; JSON's parser reports its own */
                sample_spoil(&s, ext[0] == 'c' ? "class label contains NUL bytes" : "caption contains NUL bytes (UTF-16?)",
                             name);
                free(copy);
                continue;
            }
            if (ext[0] == 'j') {
                free(s.json);
                s.json = copy;
                s.json_len = tl;
            } else if (ext[0] == 'c') {
                free(s.cls);
                s.cls = copy;
            } else {
                free(s.txt);
                s.txt = copy;
                /* trim the caption text */
                size_t n = strlen(copy);
                while (n && (copy[n - 1] == '\n' || copy[n - 1] == '\r' || copy[n - 1] == ' ')) copy[--n] = 0;
            }
        }
    }
    emit(m, origin, &s, fd);
    sample_clear(&s);
    sd_arena_free(&tmp);
    if (fd >= 0) close(fd);
    archive_read_free(ar);
    return SD_OK;
}

/* Read a shard path, which may use brace notation for many shards. A path
 * that names one shard must open; of a pattern's shards, missing ones are
 * skipped and counted, but a pattern none of whose shards could be read (a
 * typo, the wrong directory) is an error, so it cannot replace an output
 * with an empty one. */
sd_status sd_read_wds(sd_meta_run *m, const char *path, sd_error *err)
{
    char **paths;
    int n;
    if (sd_expand_braces(path, &paths, &n)) return sd_err_set(err, SD_EINVAL, "%s: bad brace pattern", path);
    sd_status st = SD_OK;
    int nread = 0;
    sd_error first = {SD_OK, ""};
    for (int i = 0; i < n; i++) {
        sd_error e1;
        if (read_shard(m, paths[i], &e1) == SD_OK) nread++;
        else if (n == 1) st = sd_err_set(err, e1.code, "%s", e1.msg);
        else {
            if (!first.code) first = e1;
            sd_meta_skip_input(m, e1.code == SD_EUNSUPPORTED ? "compressed tar shard" : "unreadable tar shard", "%s",
                               e1.msg);
        }
        free(paths[i]);
    }
    free(paths);
    if (n > 1 && nread == 0)
        st = sd_err_set(err, first.code, "%s: none of its %d shards could be read (first: %s)", path, n, first.msg);
    return st;
}
