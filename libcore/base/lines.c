#include "lines.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Open path ("-" = stdin) for block reading; block is the read size. */
sd_status sd_lines_open(sd_lines *l, const char *path, size_t block, sd_error *err)
{
    memset(l, 0, sizeof *l);
    l->name = path;
    l->next_line = 1;
    if (strcmp(path, "-") == 0) {
        l->fd = STDIN_FILENO;
        l->name = "<stdin>";
    } else {
        l->fd = open(path, O_RDONLY);
        if (l->fd < 0) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    }
    l->cap = block < 4096 ? 4096 : block;
    l->buf = malloc(l->cap + 1);
    if (!l->buf) {
        sd_lines_close(l);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    return SD_OK;
}

/* Count newlines in [p, p+n). */
static long count_lines(const char *p, size_t n)
{
    long c = 0;
    const char *end = p + n;
    while ((p = memchr(p, '\n', (size_t)(end - p)))) {
        c++;
        p++;
    }
    return c;
}

/* Hand out the next block of whole lines (ending in '\n', except possibly the
 * file's last line), the first without a leading UTF-8 byte order mark. The block may be modified and stays valid until the next
 * call. *len == 0 means end of input. */
sd_status sd_lines_next(sd_lines *l, char **start, size_t *len, long *first_line, sd_error *err)
{
    /* move the incomplete tail of the last block to the front */
    if (l->keep) memmove(l->buf, l->buf + l->len - l->keep, l->keep);
    l->len = l->keep;
    l->keep = 0;
    for (;;) {
        while (!l->eof && l->len < l->cap) {
            ssize_t r = read(l->fd, l->buf + l->len, l->cap - l->len);
            if (r < 0) {
                if (errno == EINTR) continue;
                return sd_err_set(err, SD_EIO, "%s: read: %s", l->name, strerror(errno));
            }
            if (r == 0) l->eof = 1;
            l->len += (size_t)r;
        }
        if (l->eof) break;
        char *nl = memrchr(l->buf, '\n', l->len);
        if (nl) {
            l->keep = l->len - (size_t)(nl + 1 - l->buf);
            break;
        }
        /* one line longer than the buffer: grow it */
        size_t ncap = l->cap * 2;
        char *nb = realloc(l->buf, ncap + 1);
        if (!nb) return sd_err_set(err, SD_ENOMEM, "%s: line too long for memory", l->name);
        l->buf = nb;
        l->cap = ncap;
    }
    size_t n = l->len - l->keep;
    if (!l->keep) l->buf[n] = 0; /* terminate when nothing follows */
    *start = l->buf;
    *len = n;
    *first_line = l->next_line;
    l->next_line += count_lines(l->buf, n);
    if (!l->started) { /* a UTF-8 byte order mark (Windows editors write one) is not part of line 1 */
        size_t b = sd_bom_len(l->buf, n);
        *start += b;
        *len -= b;
        l->started = 1;
    }
    return SD_OK;
}

/* Close the file (not stdin) and free the buffer. */
void sd_lines_close(sd_lines *l)
{
    if (l->fd > 2) close(l->fd);
    l->fd = -1;
    free(l->buf);
    l->buf = NULL;
}

/* Split a block into lines in place: each '\n' (and a '\r' before it) becomes
 * NUL. Stores up to max line starts/lengths; *used is the bytes consumed, so
 * the caller can continue with the rest. Returns the number of lines. */
size_t sd_split_lines(char *block, size_t len, char **lines, size_t *lens, size_t max, size_t *used)
{
    size_t k = 0;
    char *p = block, *end = block + len;
    while (p < end && k < max) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        size_t n = (size_t)(le - p);
        if (nl) *nl = 0;
        if (n && p[n - 1] == '\r') p[--n] = 0;
        lines[k] = p;
        lens[k] = n;
        k++;
        p = nl ? nl + 1 : end;
    }
    *used = (size_t)(p - block);
    return k;
}
