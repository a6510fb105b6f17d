#include "slurp.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
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

/* What kind of file a stat says, for "not a regular file" messages. */
static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

/* Images and shards are read by offset and size: anything but a regular
 * file would block (a FIFO, even in open()), never end (/dev/zero) or not
 * read at all (a directory). O_NONBLOCK lets the open of a FIFO return so
 * that fstat can say what it is; it changes nothing for a regular file. */
sd_status sd_open_regular(const char *path, int *fd, off_t *size, sd_error *err)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) {
        int e = errno;
        return sd_err_set(err, e == ENOENT || e == ENOTDIR ? SD_ENOTFOUND : SD_EIO, "%s", strerror(e));
    }
    struct stat sb;
    sd_status st = SD_OK;
    if (fstat(*fd, &sb) != 0) st = sd_err_set(err, SD_EIO, "stat: %s", strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = sd_err_set(err, SD_EIO, "not a regular file (%s)", file_kind(sb.st_mode));
    else if (size) *size = sb.st_size;
    if (st) {
        close(*fd);
        *fd = -1;
    }
    return st;
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
