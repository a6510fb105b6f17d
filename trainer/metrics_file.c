/* sd-train's JSONL metrics file: opened for appending; on a resume the
 * lines a killed run wrote after the checkpoint's step are moved aside
 * first, so each step appears once in the file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "log.h"
#include "outfile.h"
#include "slurp.h"
#include "train.h"

/* The step a metrics line names ({"step": N, ...}), or -1 when the line
 * has none (a line cut by a kill or a full disk). */
static long line_step(const char *s, size_t n)
{
    static const char key[] = "{\"step\": ";
    size_t k = sizeof key - 1;
    if (n <= k || memcmp(s, key, k)) return -1;
    long v = 0;
    size_t i = k;
    for (; i < n && s[i] >= '0' && s[i] <= '9' && v < 1000000000000L; i++) v = v * 10 + (s[i] - '0');
    if (i == k || i == n || (s[i] != ',' && s[i] != '}')) return -1;
    return v;
}

/* Append the moved lines to PATH.superseded and fsync it before the
 * metrics file loses them: a kill in between leaves them in both. */
static sd_status append_superseded(const char *path, const char *data, size_t len, sd_error *err)
{
    char side[4096];
    if ((size_t)snprintf(side, sizeof side, "%s.superseded", path) >= sizeof side)
        return sd_err_set(err, SD_EINVAL, "metrics path too long: %s", path);
    int fd = open(side, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return sd_err_set(err, SD_EIO, "%s: cannot open: %s", side, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return sd_err_set(err, SD_EIO, "%s: write failed: %s", side, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return sd_err_set(err, SD_EIO, "%s: fsync failed: %s", side, strerror(e));
    }
    close(fd);
    return SD_OK;
}

/* A resumed run logs the steps after its checkpoint again: the earlier
 * run's lines for them (and any line cut short) are moved to
 * PATH.superseded, the rest rewritten atomically, so the file holds each
 * step once, the resumed run's values last. Nothing is deleted. step -1:
 * a new run, which logs every step again (another run's file given to it,
 * a --fresh start, a --config round trip): every line is moved. */
static sd_status drop_after(const char *path, long step, sd_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return SD_OK; /* not there yet, or a device / FIFO */
    sd_buf text = {0};
    sd_status rc = sd_read_file(path, &text, err);
    if (rc) return rc;
    sd_buf keep = {0}, moved = {0};
    long nmoved = 0;
    const char *s = (const char *)text.data;
    for (size_t i = 0; i < text.len && !rc;) {
        const char *nl = memchr(s + i, '\n', text.len - i);
        size_t n = nl ? (size_t)(nl - (s + i)) : text.len - i;
        long at = line_step(s + i, n);
        sd_buf *to = at >= 0 && at <= step ? &keep : &moved;
        if (to == &moved) nmoved++;
        sd_buf_put(to, s + i, n);
        sd_buf_putc(to, '\n');
        if (to->oom) rc = sd_err_set(err, SD_ENOMEM, "%s: out of memory", path);
        i += n + 1;
    }
    if (!rc && nmoved) rc = append_superseded(path, (const char *)moved.data, moved.len, err);
    if (!rc && nmoved) rc = sd_write_file_atomic(path, keep.data, keep.len, err);
    if (!rc && nmoved && step >= 0)
        sd_log(SD_LOG_WARN, "%s: %ld line%s after step %ld (from the run before this resume) moved to %s.superseded",
               path, nmoved, nmoved == 1 ? "" : "s", step, path);
    else if (!rc && nmoved)
        sd_log(SD_LOG_WARN, "%s: %ld line%s of an earlier run (this one is new, from step 0) moved to %s.superseded",
               path, nmoved, nmoved == 1 ? "" : "s", path);
    sd_buf_free(&text);
    sd_buf_free(&keep);
    sd_buf_free(&moved);
    return rc;
}

/* Open the metrics file for appending, the lines after step keep_through
 * moved aside first (drop_after; -1 for a new run: all of them). */
sd_status sd_metrics_open(const char *path, long keep_through, FILE **out, sd_error *err)
{
    *out = NULL;
    sd_status rc = drop_after(path, keep_through, err);
    if (rc) return rc;
    *out = fopen(path, "a");
    if (!*out) return sd_err_set(err, SD_EIO, "%s: cannot open the metrics file: %s", path, strerror(errno));
    return SD_OK;
}
