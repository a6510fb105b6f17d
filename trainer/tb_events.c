/* TensorBoard event files (tb_events.h): the protobuf encoding of Event,
 * Summary, Summary.Value and Summary.Image written by hand (four messages,
 * nine fields), the TFRecord framing and its CRC-32C. */
#include "tb_events.h"

#include <errno.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "buf.h"
#include "outfile.h"

/* The CRC-32C of every byte value, for a byte at a time. */
static void crc_table(uint32_t t[256])
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        t[b] = c;
    }
}

/* CRC-32C, reflected polynomial 0x82F63B78, a byte at a time through a
 * table made on the stack (1 KiB, cheap next to an image's PNG bytes; no
 * hidden global state). */
uint32_t sd_crc32c(const void *data, size_t n)
{
    uint32_t t[256];
    crc_table(t);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* TFRecord's masked CRC: rotated right by 15, plus a constant. */
static uint32_t masked_crc(const void *data, size_t n)
{
    uint32_t c = sd_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* A protobuf message under construction: a growing buffer (an image's
 * PNG bytes make a message of any size); a failed growth sets oom. */
typedef sd_buf pb;

/* Base-128 varint. */
static void pb_varint(pb *m, uint64_t v)
{
    while (v >= 0x80) {
        sd_buf_putc(m, (char)(v | 0x80));
        v >>= 7;
    }
    sd_buf_putc(m, (char)v);
}

/* Little-endian bytes of a fixed-size field. */
static void pb_fixed(pb *m, const void *v, size_t k)
{
    sd_buf_put(m, v, k); /* x86 and the usual ARM ABIs are little-endian */
}

/* A length-delimited field (string or message). */
static void pb_bytes(pb *m, int field, const void *v, size_t k)
{
    pb_varint(m, (uint64_t)field << 3 | 2);
    pb_varint(m, k);
    sd_buf_put(m, v, k);
}

/* Event{wall_time = 1 (double), step = 2 (int64), then `field` bytes}. */
static void event(pb *e, int64_t step, int field, const void *v, size_t k)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    double wall = (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
    sd_buf_clear(e);
    pb_varint(e, 1 << 3 | 1);
    pb_fixed(e, &wall, 8);
    pb_varint(e, 2 << 3 | 0);
    pb_varint(e, (uint64_t)step);
    pb_bytes(e, field, v, k);
}

/* One TFRecord frame, flushed; the message is freed. */
static sd_status frame(sd_tb *tb, pb *e, sd_error *err)
{
    sd_status st = SD_OK;
    if (e->oom) {
        st = sd_err_set(err, SD_ENOMEM, "%s: out of memory for an event", tb->path);
    } else {
        uint64_t len = e->len;
        uint32_t lc = masked_crc(&len, 8), dc = masked_crc(e->data, e->len);
        if (fwrite(&len, 8, 1, tb->f) != 1 || fwrite(&lc, 4, 1, tb->f) != 1 ||
            fwrite(e->data, 1, e->len, tb->f) != e->len || fwrite(&dc, 4, 1, tb->f) != 1 || fflush(tb->f) != 0)
            st = sd_err_set(err, SD_EIO, "%s: write failed: %s", tb->path, strerror(errno));
    }
    sd_buf_free(e);
    return st;
}

/* Free the parts of a message; always returns st. */
static sd_status pb_done(sd_status st, pb *a, pb *b)
{
    sd_buf_free(a);
    if (b) sd_buf_free(b);
    return st;
}

/* SessionLog{status = START} at start_step: TensorBoard's reader, on
 * meeting it, drops the events it has read with a step >= start_step, so
 * the steps a resumed run redoes (a killed run's, in an earlier file) are
 * shown once, the resumed run's values. */
static sd_status session_start(sd_tb *tb, int64_t start_step, sd_error *err)
{
    pb log, e;
    sd_buf_init(&log);
    sd_buf_init(&e);
    pb_varint(&log, 1 << 3 | 0); /* SessionLog.status = 1 */
    pb_varint(&log, 1);          /* START */
    event(&e, start_step, 7, log.data, log.len); /* Event.session_log = 7 */
    return pb_done(frame(tb, &e, err), &log, NULL);
}

/* See tb_events.h. The name follows TensorBoard's pattern (events.out.tfevents.TIME.HOST), which
 * its reader looks for in dir; opened for append. */
sd_status sd_tb_open(sd_tb *tb, const char *dir, int64_t start_step, sd_error *err)
{
    memset(tb, 0, sizeof *tb);
    sd_status mk = sd_make_dirs(dir, err);
    if (mk) return mk;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    if ((size_t)snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s", dir, (long)tv.tv_sec, host) >=
        sizeof tb->path)
        return sd_err_set(err, SD_EINVAL, "%s: path too long", dir);
    tb->f = fopen(tb->path, "ab");
    if (!tb->f) return sd_err_set(err, SD_EIO, "%s: %s", tb->path, strerror(errno));
    pb e;
    sd_buf_init(&e);
    static const char version[] = "brain.Event:2";
    event(&e, 0, 3, version, sizeof version - 1); /* Event.file_version = 3 */
    sd_status rc = frame(tb, &e, err);
    if (!rc) rc = session_start(tb, start_step, err);
    if (rc) sd_tb_close(tb);
    return rc;
}

/* See tb_events.h. A closed writer (a failed open, or after close) writes nothing. */
sd_status sd_tb_scalar(sd_tb *tb, const char *tag, int64_t step, double value, sd_error *err)
{
    if (!tb->f) return SD_OK;
    pb val, sum, e;
    sd_buf_init(&val);
    sd_buf_init(&sum);
    sd_buf_init(&e);
    size_t tl = strlen(tag);
    if (tl > 200) tl = 200;
    pb_bytes(&val, 1, tag, tl); /* Value.tag = 1 */
    float f = (float)value;
    pb_varint(&val, 2 << 3 | 5); /* Value.simple_value = 2, fixed32 */
    pb_fixed(&val, &f, 4);
    pb_bytes(&sum, 1, val.data, val.len);   /* Summary.value = 1 */
    event(&e, step, 5, sum.data, sum.len); /* Event.summary = 5 */
    return pb_done(frame(tb, &e, err), &val, &sum);
}

/* See tb_events.h. Summary.Image{height = 1, width = 2, colorspace = 3
 * (int32), encoded_image_string = 4 (bytes)} in Value.image = 4, as
 * tf.summary.image and torch's add_image write it. */
sd_status sd_tb_image(sd_tb *tb, const char *tag, int64_t step, int height, int width, int colorspace,
                      const void *png, size_t png_len, sd_error *err)
{
    if (!tb->f) return SD_OK;
    pb img, val, sum, e;
    sd_buf_init(&img);
    sd_buf_init(&val);
    sd_buf_init(&sum);
    sd_buf_init(&e);
    pb_varint(&img, 1 << 3 | 0);
    pb_varint(&img, (uint64_t)height);
    pb_varint(&img, 2 << 3 | 0);
    pb_varint(&img, (uint64_t)width);
    pb_varint(&img, 3 << 3 | 0);
    pb_varint(&img, (uint64_t)colorspace);
    pb_bytes(&img, 4, png, png_len);
    size_t tl = strlen(tag);
    if (tl > 200) tl = 200;
    pb_bytes(&val, 1, tag, tl);            /* Value.tag = 1 */
    pb_bytes(&val, 4, img.data, img.len);  /* Value.image = 4 */
    sd_buf_free(&img);
    pb_bytes(&sum, 1, val.data, val.len);  /* Summary.value = 1 */
    event(&e, step, 5, sum.data, sum.len); /* Event.summary = 5 */
    if (img.oom || val.oom || sum.oom) e.oom = 1;
    return pb_done(frame(tb, &e, err), &val, &sum);
}

/* Safe twice and after a failed open: sd_tb_open's error path and the trainer's close both call it. */
void sd_tb_close(sd_tb *tb)
{
    if (tb->f) fclose(tb->f);
    tb->f = NULL;
}
