/* Booru dumps: JSONL (one post per line, read in large blocks and parsed by
 * the workers) or one JSON array of posts. The source is opened once: the
 * first non-blank byte, seen in the first block of the reader that then
 * parses the stream, tells the two apart, so pipes, FIFOs and stdin work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lines.h"
#include "sources.h"

enum { MAX_LINES = 8192 }; /* lines split out of a block per pass */

/* The key build.c gives a post (id, else md5, else e621's file.md5), as text
 * for messages; NULL when the element has none or is not an object. */
static const sd_json *post_key(const sd_json *post)
{
    if (post->type != SD_JSON_OBJECT) return NULL;
    const sd_json *k = sd_json_get(post, "id");
    if (!k) k = sd_json_get(post, "md5");
    if (!k) k = sd_json_path(post, "file.md5", 8);
    return k && (k->type == SD_JSON_NUMBER || k->type == SD_JSON_STRING) ? k : NULL;
}

/* Add each element of a parsed array of posts as an input of its own. */
static void add_elements(sd_meta_run *m, const sd_json *root, const char *origin)
{
    long idx = 0;
    sd_buf one;
    sd_buf_init(&one);
    for (const sd_json *c = root->child; c; c = c->next) {
        sd_buf_clear(&one);
        sd_json_write(&one, c);
        sd_input *in = sd_meta_add(m, SD_IN_BOORU, origin, 0);
        const sd_json *k = post_key(c);
        in->origin = sd_meta_entry_origin(m, origin, ++idx, k ? k->str : NULL, k ? k->len : 0);
        in->text = sd_arena_strndup(&m->arena, one.data ? one.data : "", one.len);
        in->len = one.len;
    }
    sd_buf_free(&one);
}

/* Append every remaining block of the stream to text, NUL-terminated. */
static sd_status read_rest(sd_lines *lr, sd_buf *text, sd_error *err)
{
    for (;;) {
        char *block;
        size_t len;
        long first;
        sd_status st = sd_lines_next(lr, &block, &len, &first, err);
        if (st) return st;
        if (len == 0) break;
        sd_buf_put(text, block, len);
    }
    if (text->oom) return sd_err_set(err, SD_ENOMEM, "%s: file too large for memory", lr->name);
    sd_buf_cstr(text);
    return SD_OK;
}

/* A JSON array document: the block already read plus the rest of the
 * stream, parsed whole; each element becomes an input. */
static sd_status read_array(sd_meta_run *m, sd_lines *lr, const char *block, size_t len, const char *origin,
                            sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    sd_buf_put(&text, block, len);
    sd_arena a;
    sd_arena_init(&a, 1 << 20);
    sd_json *root = NULL;
    sd_status st = read_rest(lr, &text, err);
    int nonfinite; /* Python's NaN/Infinity: each element is re-serialised, so they reach the worker as null */
    if (!st && (st = sd_json_parse_py(&a, text.data, text.len, &root, &nonfinite, err))) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "%s", err->msg);
        sd_err_set(err, st, "%s: %s", origin, msg);
    }
    if (!st && root->type != SD_JSON_ARRAY)
        st = sd_err_set(err, SD_EFORMAT, "%s: expected a JSON array of posts or JSON lines", origin);
    if (!st) add_elements(m, root, origin);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return st;
}

/* First byte of a block that is not JSON whitespace, or -1 when it is all
 * blank (blank lines may precede either form). */
static int first_nonblank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\n' && p[i] != '\r' && p[i] != '\t') return (unsigned char)p[i];
    return -1;
}

/* Add each non-empty line of a block as an input ("FILE:LINE" in messages);
 * the batch is flushed before the block is reused. */
static void add_lines(sd_meta_run *m, char *block, size_t len, long lineno, const char *origin, char **lines,
                      size_t *lens)
{
    size_t pos = 0;
    while (pos < len) {
        size_t used;
        size_t k = sd_split_lines(block + pos, len - pos, lines, lens, MAX_LINES, &used);
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

/* Read the opened stream block by block: JSON lines, unless its first
 * non-blank byte is '[' (then one JSON array of posts). A UTF-8 BOM at the
 * very start (Windows editors write one) never reaches here: sd_lines drops it. */
static sd_status read_stream(sd_meta_run *m, sd_lines *lr, const char *origin, sd_error *err)
{
    char **lines = malloc(MAX_LINES * sizeof *lines);
    size_t *lens = malloc(MAX_LINES * sizeof *lens);
    sd_status st = lines && lens ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory");
    int decided = 0;
    while (!st) {
        char *block;
        size_t len;
        long first;
        if ((st = sd_lines_next(lr, &block, &len, &first, err)) || len == 0) break;
        int c = decided ? 0 : first_nonblank(block, len);
        if (c == '[') {
            st = read_array(m, lr, block, len, origin, err);
            break;
        }
        decided = c >= 0;
        add_lines(m, block, len, first, origin, lines, lens);
    }
    free(lines);
    free(lens);
    return st;
}

/* Read a post dump ("-" = stdin): JSON lines (blank lines ignored) or a
 * JSON array. */
sd_status sd_read_booru(sd_meta_run *m, const char *path, sd_error *err)
{
    const char *origin = sd_meta_keep(m, strcmp(path, "-") == 0 ? "<stdin>" : path);
    sd_lines lr;
    sd_status st = sd_lines_open(&lr, path, 8 << 20, err);
    if (st) return st;
    struct stat fst;
    uint64_t base_total = m->progress.work_total, base_done = m->progress.work_done;
    if (fstat(lr.fd, &fst) == 0 && S_ISREG(fst.st_mode)) m->progress.work_total = base_total + (uint64_t)fst.st_size;
    st = read_stream(m, &lr, origin, err);
    sd_lines_close(&lr);
    m->progress.work_done = base_done + (m->progress.work_total - base_total);
    return st;
}
