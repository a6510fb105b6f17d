#include "imghdr.h"
#include "imghdr_int.h"
#include "slurp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Short names for messages and reports. */
const char *sd_img_format_name(sd_img_format f)
{
    switch (f) {
    case SD_IMG_JPEG: return "jpeg";
    case SD_IMG_PNG: return "png";
    case SD_IMG_WEBP: return "webp";
    case SD_IMG_GIF: return "gif";
    case SD_IMG_BMP: return "bmp";
    default: return "unknown";
    }
}

/* The one wording of a refused format's reason: sd-bucket's and sd-latents'
 * header check and sd-meta's check of the file name say the same. */
const char *sd_img_refusal(sd_img_format f)
{
    return f == SD_IMG_BMP ? "BMP: libvips reads it only through ImageMagick, which sdtk blocks as untrusted; convert "
                             "it to PNG"
                           : NULL;
}

/* Field reads in both byte orders: PNG's and JPEG's fields are big-endian, GIF's and WebP's
 * little-endian (WebP's canvas size in 24 bits). */
static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t le16(const unsigned char *p) { return (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le24(const unsigned char *p) { return (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le32(const unsigned char *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }

/* Dimensions every tool accepts: 1..65535 per side and at most PIL's
 * decompression-bomb pixel count, so a forged header cannot make a later
 * decoder allocate gigabytes. */
sd_status sd_imghdr_check_dims(uint64_t w, uint64_t h, sd_error *err)
{
    if (w == 0 || h == 0) return sd_err_set(err, SD_ERANGE, "zero image dimension %llux%llu", (unsigned long long)w, (unsigned long long)h);
    if (w > SD_IMGHDR_MAX_SIDE || h > SD_IMGHDR_MAX_SIDE)
        return sd_err_set(err, SD_ERANGE, "image dimensions %llux%llu exceed %d per side", (unsigned long long)w,
                          (unsigned long long)h, SD_IMGHDR_MAX_SIDE);
    if (w * h > SD_IMGHDR_MAX_PIXELS)
        return sd_err_set(err, SD_ERANGE, "image %llux%llu has %llu pixels, over the %llu limit (decompression bomb?)",
                          (unsigned long long)w, (unsigned long long)h, (unsigned long long)(w * h), SD_IMGHDR_MAX_PIXELS);
    return SD_OK;
}

/* Fill in the result once the raw size is known. */
static sd_status finish(sd_imginfo *out, sd_img_format f, uint64_t w, uint64_t h, int orientation, sd_error *err)
{
    sd_status st = sd_imghdr_check_dims(w, h, err);
    if (st) return st;
    out->format = f;
    out->width = (uint32_t)w;
    out->height = (uint32_t)h;
    out->orientation = orientation;
    int swap = orientation >= 5 && orientation <= 8;
    out->disp_w = swap ? out->height : out->width;
    out->disp_h = swap ? out->width : out->height;
    return SD_OK;
}

/* Is marker m a start-of-frame (SOF0..SOF15 minus DHT, JPG and DAC)? */
static int is_sof(unsigned m)
{
    return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

/* Where a JPEG marker walk stands, so it can continue in a later window of
 * the file: Photoshop files carry megabytes of XMP before the frame header,
 * and skipping those segments by seeking reads only their 4-byte headers. */
typedef struct {
    uint64_t pos;    /* absolute offset of the next byte to look at */
    size_t need;     /* bytes from pos the next window must hold (0: any) */
    int orientation;
    int seen_exif;   /* the first APP1 starting "Exif": the one libvips reads */
    int have_sof;    /* the frame header's size, once seen */
    uint32_t sof_w, sof_h;
} jpeg_walk;

/* The walk from just after SOI. */
static jpeg_walk jpeg_walk_start(void) { return (jpeg_walk){.pos = 2, .orientation = 1}; }

/* The answer once the frame header and the Exif (if any) are known. */
static sd_status jpeg_done(const jpeg_walk *w, sd_imginfo *out, sd_error *err)
{
    return finish(out, SD_IMG_JPEG, w->sof_w, w->sof_h, w->orientation, err);
}

/* Walk marker segments in the window p[0..n) holding file bytes from base,
 * up to the frame header, and on to the first scan when no Exif came
 * before the frame (libjpeg reads every marker up to the scan, and libvips
 * takes an Exif APP1 that follows the frame header). SD_ETRUNC means the
 * window ended first; w says where to go on. */
static sd_status parse_jpeg_at(const unsigned char *p, size_t n, uint64_t base, jpeg_walk *w, sd_imginfo *out,
                               sd_error *err)
{
    w->need = 0;
    for (;;) {
        uint64_t seg = w->pos; /* where this marker starts: resume here */
        if (seg < base) return sd_err_set(err, SD_EFORMAT, "jpeg: walk went backwards");
        if (seg - base >= n) return sd_err_set(err, SD_ETRUNC, "jpeg: truncated before the frame header");
        size_t pos = (size_t)(seg - base);
        /* junk between segments is skipped the way PIL and libjpeg do */
        while (pos < n && p[pos] != 0xFF) pos++;
        while (pos < n && p[pos] == 0xFF) pos++; /* fill bytes */
        if (pos >= n) {
            w->pos = base + (p[pos - 1] == 0xFF ? pos - 1 : pos); /* pos > seg - base here */
            return sd_err_set(err, SD_ETRUNC, "jpeg: truncated before the frame header");
        }
        unsigned m = p[pos++];
        w->pos = base + pos;
        if (m == 0x00) continue; /* a stuffed 0xFF00, not a marker */
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;
        if (m == 0xDA && w->have_sof) return jpeg_done(w, out, err);
        if (m == 0xD8) return sd_err_set(err, SD_EFORMAT, "jpeg: second start-of-image marker before the frame header");
        if (m == 0xD9) return sd_err_set(err, SD_EFORMAT, "jpeg: end of image before any frame header");
        if (m == 0xDA) return sd_err_set(err, SD_EFORMAT, "jpeg: scan data before any frame header");
        if (pos + 2 > n) {
            w->pos = base + pos - 2;
            return sd_err_set(err, SD_ETRUNC, "jpeg: truncated in a marker segment");
        }
        size_t len = be16(p + pos);
        if (len < 2) return sd_err_set(err, SD_EFORMAT, "jpeg: bad segment length %zu for marker 0x%02X", len, m);
        if (is_sof(m)) {
            if (w->have_sof) return sd_err_set(err, SD_EFORMAT, "jpeg: second frame header");
            if (len < 8) return sd_err_set(err, SD_EFORMAT, "jpeg: frame header too short (%zu bytes)", len);
            if (pos + 8 > n) {
                w->pos = base + pos - 2;
                w->need = 10;
                return sd_err_set(err, SD_ETRUNC, "jpeg: truncated in the frame header");
            }
            uint32_t h = be16(p + pos + 3), wd = be16(p + pos + 5);
            if (h == 0) return sd_err_set(err, SD_EUNSUPPORTED, "jpeg: height given later by a DNL marker");
            w->have_sof = 1;
            w->sof_w = wd;
            w->sof_h = h;
            if (w->seen_exif) return jpeg_done(w, out, err);
        }
        if (m == 0xE1 && !w->seen_exif && len > 6) { /* libvips: a payload over 4 bytes starting "Exif" */
            if (pos + len > n) {
                w->pos = base + pos - 2;
                w->need = len + 2;
                return sd_err_set(err, SD_ETRUNC, "jpeg: truncated in the APP1 segment");
            }
            if (memcmp(p + pos + 2, "Exif", 4) == 0) {
                w->seen_exif = 1;
                w->orientation = sd_exif_blob_orientation(p + pos + 2, len - 2);
            }
        }
        w->pos = base + pos + len;
    }
}

/* A walk's status as the answer: once the frame header is known, the file
 * ending (`ended`) or breaking before the first scan leaves its size and
 * the Exif seen so far (the decoder reports a broken file). */
static sd_status jpeg_result(const jpeg_walk *w, sd_status st, int ended, sd_imginfo *out, sd_error *err)
{
    if (st == SD_OK || !w->have_sof || (st == SD_ETRUNC && !ended)) return st;
    return jpeg_done(w, out, err);
}

/* PNG: the IHDR chunk must come first, be 13 bytes and carry a valid CRC. */
static sd_status parse_png(const unsigned char *p, size_t n, sd_imginfo *out, sd_error *err)
{
    if (n < 33) return sd_err_set(err, SD_ETRUNC, "png: truncated before the end of IHDR");
    if (be32(p + 8) != 13 || memcmp(p + 12, "IHDR", 4) != 0) return sd_err_set(err, SD_EFORMAT, "png: first chunk is not a 13-byte IHDR");
    if (sd_png_crc32(p + 12, 17) != be32(p + 29)) return sd_err_set(err, SD_EFORMAT, "png: IHDR checksum mismatch");
    uint32_t w = be32(p + 16), h = be32(p + 20);
    if (w > 0x7FFFFFFFu || h > 0x7FFFFFFFu) return sd_err_set(err, SD_EFORMAT, "png: dimension over 2^31-1");
    return finish(out, SD_IMG_PNG, w, h, 1, err);
}

/* WebP: the first chunk after RIFF/WEBP says lossy (VP8), lossless (VP8L) or
 * extended (VP8X, with the canvas size). */
static sd_status parse_webp(const unsigned char *p, size_t n, sd_imginfo *out, sd_error *err)
{
    if (n < 20) return sd_err_set(err, SD_ETRUNC, "webp: truncated before the first chunk");
    const unsigned char *c = p + 12;
    if (memcmp(c, "VP8 ", 4) == 0) {
        if (n < 30) return sd_err_set(err, SD_ETRUNC, "webp: truncated in the VP8 frame header");
        if (p[20] & 1) return sd_err_set(err, SD_EFORMAT, "webp: VP8 frame is not a key frame");
        if (p[23] != 0x9D || p[24] != 0x01 || p[25] != 0x2A) return sd_err_set(err, SD_EFORMAT, "webp: bad VP8 start code");
        return finish(out, SD_IMG_WEBP, le16(p + 26) & 0x3FFF, le16(p + 28) & 0x3FFF, 1, err);
    }
    if (memcmp(c, "VP8L", 4) == 0) {
        if (n < 25) return sd_err_set(err, SD_ETRUNC, "webp: truncated in the VP8L header");
        if (p[20] != 0x2F) return sd_err_set(err, SD_EFORMAT, "webp: bad VP8L signature");
        uint32_t b = le32(p + 21);
        if (b >> 29) return sd_err_set(err, SD_EFORMAT, "webp: unknown VP8L version %u", b >> 29);
        return finish(out, SD_IMG_WEBP, (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1, 1, err);
    }
    if (memcmp(c, "VP8X", 4) == 0) {
        if (n < 30) return sd_err_set(err, SD_ETRUNC, "webp: truncated in the VP8X header");
        return finish(out, SD_IMG_WEBP, (uint64_t)le24(p + 24) + 1, (uint64_t)le24(p + 27) + 1, 1, err);
    }
    return sd_err_set(err, SD_EUNSUPPORTED, "webp: unknown first chunk '%.4s'", (const char *)c);
}

/* Does libnsgif (libvips 8.14's GIF loader) ignore this logical screen? It
 * takes the common monitor sizes some encoders wrote, a zero side and a
 * side over 2048 for broken, and sizes the image from the first frame. */
static int gif_screen_ignored(uint32_t w, uint32_t h)
{
    static const uint16_t monitors[6][2] = {{640, 480},   {640, 512},   {800, 600},
                                            {1024, 768},  {1280, 1024}, {1600, 1200}};
    if (w == 0 || h == 0 || w > 2048 || h > 2048) return 1;
    for (int i = 0; i < 6; i++)
        if (w == monitors[i][0] && h == monitors[i][1]) return 1;
    return 0;
}

/* libnsgif's canvas: the logical screen (1x1 when it ignores it), grown to
 * the first frame's right and bottom edges. A window that ends before the
 * frame gives the canvas so far and sets *more; running this again on that
 * result gives the same answer, since 1x1 is a screen libnsgif keeps. */
static sd_status gif_canvas(const sd_hdr_src *s, sd_imginfo *out, int *more, sd_error *err)
{
    uint64_t w = out->width, h = out->height;
    if (gif_screen_ignored(out->width, out->height)) w = h = 1;
    uint32_t r = 0, b = 0;
    int st = sd_gif_first_frame(s, &r, &b);
    if (st == SD_GIF_END) return sd_err_set(err, SD_ETRUNC, "gif: the file ends before its first image");
    if (st == SD_GIF_NONE)
        return sd_err_set(err, SD_EFORMAT, "gif: no image (a trailer or a byte that starts no block comes first)");
    if (st == SD_WALK_MORE) *more = 1;
    else {
        w = r > w ? r : w;
        h = b > h ? b : h;
    }
    return finish(out, SD_IMG_GIF, w, h, 1, err);
}

/* What lies past a PNG's, WebP's or GIF's size field (imghdr_walk.c): the
 * EXIF orientation, the GIF canvas. *more is set when the walk ran out of
 * the bytes s holds; the result is then provisional. */
static sd_status walk_rest(const sd_hdr_src *s, sd_imginfo *out, int *more, sd_error *err)
{
    int o;
    if (out->format == SD_IMG_GIF) return gif_canvas(s, out, more, err);
    if (out->format == SD_IMG_PNG) o = sd_png_orientation(s);
    else if (out->format == SD_IMG_WEBP) o = sd_webp_orientation(s);
    else return SD_OK;
    if (o == SD_WALK_MORE) {
        *more = 1;
        o = 1;
    }
    return finish(out, out->format, out->width, out->height, o, err);
}

static sd_status parse_size(const unsigned char *p, size_t n, int whole, sd_imginfo *out, sd_error *err);

/* sd_imghdr_parse's work on a window of the file (`whole`: all of it);
 * *more as in walk_rest. */
static sd_status parse_window(const unsigned char *p, size_t n, int whole, sd_imginfo *out, int *more, sd_error *err);

/* Identify the format by its magic bytes and read the size of the image
 * p[0..n) holds. SD_ETRUNC means the bytes ran out before the answer. */
sd_status sd_imghdr_parse(const unsigned char *p, size_t n, sd_imginfo *out, sd_error *err)
{
    int more = 0;
    return parse_window(p, n, 1, out, &more, err);
}

/* Declared above for sd_imghdr_parse: the size fields first, then walk_rest for what lies past them. */
static sd_status parse_window(const unsigned char *p, size_t n, int whole, sd_imginfo *out, int *more, sd_error *err)
{
    sd_status st = parse_size(p, n, whole, out, err);
    if (st) return st;
    sd_hdr_src s = {p, n, -1, 0, 0, whole};
    return walk_rest(&s, out, more, err);
}

/* The format by its magic bytes, and the size its header gives (a GIF's
 * logical screen as it is: gif_canvas decides). */
static sd_status parse_size(const unsigned char *p, size_t n, int whole, sd_imginfo *out, sd_error *err)
{
    memset(out, 0, sizeof *out);
    if (n == 0) return sd_err_set(err, SD_ETRUNC, "empty file");
    if (n < 2) return sd_err_set(err, SD_ETRUNC, "file too short for any image header (%zu bytes)", n);
    if (p[0] == 0xFF && p[1] == 0xD8) {
        jpeg_walk w = jpeg_walk_start();
        sd_status st = parse_jpeg_at(p, n, 0, &w, out, err);
        return jpeg_result(&w, st, whole, out, err);
    }
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (p[0] == 0x89 && n < 8) return sd_err_set(err, SD_ETRUNC, "file too short for a PNG signature");
    if (n >= 8 && memcmp(p, png_sig, 8) == 0) return parse_png(p, n, out, err);
    if (n >= 4 && memcmp(p, "RIFF", 4) == 0) {
        if (n < 12) return sd_err_set(err, SD_ETRUNC, "file too short for a RIFF header");
        if (memcmp(p + 8, "WEBP", 4) != 0) return sd_err_set(err, SD_EUNSUPPORTED, "RIFF file that is not WebP");
        return parse_webp(p, n, out, err);
    }
    if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0)) {
        if (n < 10) return sd_err_set(err, SD_ETRUNC, "gif: truncated in the screen descriptor");
        out->format = SD_IMG_GIF;
        out->width = le16(p + 6);
        out->height = le16(p + 8);
        return SD_OK;
    }
    if (p[0] == 'B' && p[1] == 'M') return sd_err_set(err, SD_EUNSUPPORTED, "%s", sd_img_refusal(SD_IMG_BMP));
    return sd_err_set(err, SD_EUNSUPPORTED, "not a recognised image (JPEG, PNG, WebP, GIF)");
}

/* pread all of [off, off+n) unless the file ends; returns bytes read or -1. */
static ssize_t pread_full(int fd, unsigned char *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Read the size of the image stored at [offset, offset+size) of fd (a whole
 * file, or a member inside an uncompressed tar). size UINT64_MAX means "to
 * the end of the file". One 16 KiB read answers almost every file; a JPEG
 * whose frame header lies further on is walked segment by segment with
 * small reads, never reading the segments it skips. */
sd_status sd_imghdr_read_fd(int fd, uint64_t offset, uint64_t size, sd_imginfo *out, sd_error *err)
{
    if (size == UINT64_MAX) {
        struct stat st;
        if (fstat(fd, &st) != 0) return sd_err_set(err, SD_EIO, "stat: %s", strerror(errno));
        size = (uint64_t)st.st_size > offset ? (uint64_t)st.st_size - offset : 0;
    }
    if (size == 0) return sd_err_set(err, SD_ETRUNC, "empty file (0 bytes)");
    enum { FIRST = 16 * 1024, WINDOW = 4096, MAX_WINDOWS = 20000 };
    unsigned char first[FIRST];
    size_t want = size < FIRST ? (size_t)size : FIRST;
    ssize_t r = pread_full(fd, first, want, offset);
    if (r < 0) return sd_err_set(err, SD_EIO, "read: %s", strerror(errno));
    size_t have = (size_t)r;
    int more = 0, whole = have < want || have == size;
    sd_status st = parse_window(first, have, whole, out, &more, err);
    if (st == SD_OK && more) { /* an EXIF chunk or the first GIF frame lies past the first read */
        sd_hdr_src s = {NULL, 0, fd, offset, size, 1};
        more = 0;
        return walk_rest(&s, out, &more, err);
    }
    if (st != SD_ETRUNC || whole || first[0] != 0xFF || first[1] != 0xD8) return st;

    /* JPEG continuing past the first read: re-walk it from the start of the
     * file (cheap: it is in memory) to learn where to go on */
    jpeg_walk w = jpeg_walk_start();
    st = parse_jpeg_at(first, have, 0, &w, out, err);
    unsigned char *win = NULL;
    size_t cap = 0;
    int k = 0;
    for (; st == SD_ETRUNC && k < MAX_WINDOWS; k++) {
        if (w.pos >= size) break; /* walked off the end: truncated */
        size_t len = w.need > WINDOW ? w.need : WINDOW;
        if (w.pos + len > size) len = (size_t)(size - w.pos);
        if (len > cap) {
            unsigned char *nw = realloc(win, len);
            if (!nw) {
                free(win);
                return sd_err_set(err, SD_ENOMEM, "out of memory");
            }
            win = nw;
            cap = len;
        }
        uint64_t at = w.pos;
        r = pread_full(fd, win, len, offset + at);
        if (r < 0) {
            free(win);
            return sd_err_set(err, SD_EIO, "read: %s", strerror(errno));
        }
        st = parse_jpeg_at(win, (size_t)r, at, &w, out, err);
        if (st != SD_ETRUNC) break;
        if ((size_t)r < len) break; /* the file is shorter than it was */
        if (w.pos == at) {
            /* no progress: only a larger window can help */
            size_t next = w.need > WINDOW ? w.need : WINDOW;
            if (at + next > size) next = (size_t)(size - at);
            if (next <= (size_t)r) break;
        }
    }
    free(win);
    if (st == SD_ETRUNC && k == MAX_WINDOWS && !w.have_sof)
        return sd_err_set(err, SD_EUNSUPPORTED, "jpeg: over %d reads without reaching the frame header", MAX_WINDOWS);
    return jpeg_result(&w, st, 1, out, err);
}

/* Open path and read its image size. */
sd_status sd_imghdr_read_file(const char *path, sd_imginfo *out, sd_error *err)
{
    int fd;
    sd_status st = sd_open_regular(path, &fd, NULL, err);
    if (st) return st;
    st = sd_imghdr_read_fd(fd, 0, UINT64_MAX, out, err);
    close(fd);
    return st;
}
