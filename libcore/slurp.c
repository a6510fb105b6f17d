#include "slurp.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* Append the whole of path ("-" = stdin) to out, NUL-terminated; the error
 * names the file. */
sd_status sd_read_file(const char *path, sd_buf *out, sd_error *err)
{
    int fd = strcmp(path, "-") == 0 ? STDIN_FILENO : open(path, O_RDONLY);
    if (fd < 0) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    char chunk[1 << 16];
    ssize_t r;
    for (;;) {
        r = read(fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        sd_buf_put(out, chunk, (size_t)r);
    }
    int saved = errno;
    if (fd != STDIN_FILENO) close(fd);
    if (r < 0) return sd_err_set(err, SD_EIO, "%s: read: %s", path, strerror(saved));
    if (out->oom) return sd_err_set(err, SD_ENOMEM, "%s: file too large for memory", path);
    sd_buf_cstr(out);
    return SD_OK;
}

/* Read and parse a whole JSON file, after a leading UTF-8 byte order mark
 * (Windows editors write one; JSON itself refuses it). text receives the
 * file and must outlive the tree (strings point into it); errors name the
 * file. */
sd_status sd_parse_json_file(const char *path, sd_buf *text, sd_arena *a, sd_json **root, sd_error *err)
{
    sd_status st = sd_read_file(path, text, err);
    if (st) return st;
    char *t = text->data ? text->data : (char *)"";
    size_t bom = sd_bom_len(t, text->len);
    st = sd_json_parse(a, t + bom, text->len - bom, root, err);
    if (st) {
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        sd_err_set(err, st, "%s: %s", path, msg);
    }
    return st;
}
