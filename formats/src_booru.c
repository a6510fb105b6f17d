/* Booru dumps: JSONL (one post per line, read in large blocks and parsed by
 * the workers) or one JSON array of posts. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lines.h"
#include "slurp.h"
#include "sources.h"

/* Read a whole JSON array document and add each element as an input. */
static sd_status read_array(sd_meta_run *m, const char *path, const char *origin, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_arena a;
    sd_arena_init(&a, 1 << 20);
    sd_json *root;
    sd_status st = sd_parse_json_file(path, &text, &a, &root, err);
    if (!st && root->type != SD_JSON_ARRAY)
        st = sd_err_set(err, SD_EFORMAT, "%s: expected a JSON array of posts or JSON lines", path);
    if (!st) {
        long idx = 0;
        sd_buf one;
        sd_buf_init(&one);
        for (const sd_json *c = root->child; c; c = c->next, idx++) {
            sd_buf_clear(&one);
            sd_json_write(&one, c);
            sd_input *in = sd_meta_add(m, SD_IN_BOORU, origin, 0);
            in->text = sd_arena_strndup(&m->arena, one.data ? one.data : "", one.len);
            in->len = one.len;
            in->line = idx + 1; /* element number for messages */
        }
        sd_buf_free(&one);
    }
    sd_arena_free(&a);
    sd_buf_free(&text);
    return st;
}

/* First non-blank byte of a file, to tell a JSON array from JSON lines. */
static int first_byte(const char *path)
{
    if (strcmp(path, "-") == 0) return -1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    for (ssize_t i = 0; i < n; i++)
        if (buf[i] != ' ' && buf[i] != '\n' && buf[i] != '\r' && buf[i] != '\t') return (unsigned char)buf[i];
    return -1;
}

/* Read a post dump: JSON lines (blank lines ignored) or a JSON array. */
sd_status sd_read_booru(sd_meta_run *m, const char *path, sd_error *err)
{
    const char *origin = sd_meta_keep(m, strcmp(path, "-") == 0 ? "<stdin>" : path);
    if (first_byte(path) == '[') return read_array(m, path, origin, err);
    sd_lines lr;
    sd_status st = sd_lines_open(&lr, path, 8 << 20, err);
    if (st) return st;
    struct stat fst;
    uint64_t base_total = m->progress.work_total, base_done = m->progress.work_done;
    if (fstat(lr.fd, &fst) == 0 && S_ISREG(fst.st_mode)) m->progress.work_total = base_total + (uint64_t)fst.st_size;
    enum { MAXL = 8192 };
    char **lines = malloc(MAXL * sizeof *lines);
    size_t *lens = malloc(MAXL * sizeof *lens);
    if (!lines || !lens) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    for (;;) {
        char *block;
        size_t len;
        long first;
        if (st || (st = sd_lines_next(&lr, &block, &len, &first, err)) || len == 0) break;
        size_t pos = 0;
        long lineno = first;
        while (pos < len) {
            size_t used;
            size_t k = sd_split_lines(block + pos, len - pos, lines, lens, MAXL, &used);
            for (size_t i = 0; i < k; i++, lineno++) {
                if (lens[i] == 0) continue;
                sd_input *in = sd_meta_add(m, SD_IN_BOORU, origin, lineno);
                in->text = lines[i];
                in->len = lens[i];
            }
            pos += used;
        }
        m->progress.work_done += len;
        sd_meta_flush(m); /* the inputs point into the block, which is reused */
    }
    free(lines);
    free(lens);
    sd_lines_close(&lr);
    m->progress.work_done = base_done + (m->progress.work_total - base_total);
    return st;
}
