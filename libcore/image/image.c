#include "image.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vips/vips.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "image_int.h"
#include "imghdr.h"
#include "log.h"
#include "slurp.h"

/* The last libvips warning given on this thread, for a failure that left
 * libvips' error buffer empty: libpng's complaint about a PNG's header
 * arrives only as a warning (Pillow's broken.png read "unknown libvips
 * error"). GLib calls the handler on the thread that warns, and a header is
 * read on the image's own thread, so no image takes another's warning;
 * load_rgb8 empties it as each image starts. Per thread by necessity: the
 * handler is process-wide and gets no context. */
static _Thread_local char thread_warning[160];

/* libvips' own warnings ("profile incompatible with image", a truncated
 * PNG's "not enough data") arrive through GLib, without the file, before
 * sdtk's own message that names it (a failed image) or for an image that
 * was decoded all the same: shown with -v, as libvips' detail, not as
 * unnamed lines in every run's output; the thread's last one is kept for
 * vips_fail. */
static void vips_warning(const gchar *domain, GLogLevelFlags level, const gchar *message, gpointer unused)
{
    (void)level;
    (void)unused;
    snprintf(thread_warning, sizeof thread_warning, "%s", message ? message : "");
    for (char *c = thread_warning; *c; c++) /* one line: libjpeg's end in a newline */
        if (*c == '\n' || *c == '\r' || *c == '\t') *c = ' ';
    for (size_t n = strlen(thread_warning); n && thread_warning[n - 1] == ' ';) thread_warning[--n] = 0;
    sd_log(SD_LOG_DEBUG, "%s: %s", domain ? domain : "libvips", message);
}

/* libvips is process-wide state: set it up once, from one thread, so that
 * each image then runs on the thread that loads it (sdtk parallelises across
 * images, so libvips' own worker threads would only oversubscribe the
 * cores), nothing is cached between unrelated images, and loaders libvips
 * marks untrusted (ImageMagick, MATLAB, ...) never see hostile input. */
sd_status sd_image_init(sd_error *err)
{
    if (VIPS_INIT("sdtk")) {
        char *m = vips_error_buffer_copy();
        sd_err_set(err, SD_EUNSUPPORTED, "libvips init failed: %s", m);
        g_free(m);
        return SD_EUNSUPPORTED;
    }
    g_log_set_handler("VIPS", G_LOG_LEVEL_WARNING | G_LOG_LEVEL_MESSAGE, vips_warning, NULL);
    vips_concurrency_set(1);
    vips_cache_set_max(0);
    vips_block_untrusted_set(TRUE);
    return SD_OK;
}

/* libvips and the PNG decoder keep per-thread buffers that leak unless the
 * thread says it is done. */
void sd_image_thread_done(void)
{
    sd_fast_thread_done();
    vips_thread_shutdown();
}

/* Release libvips' global state and the main thread's buffers at the end of
 * the process (leak checkers). */
void sd_image_shutdown(void)
{
    sd_fast_thread_done();
    vips_shutdown();
}

/* A plan must cut a non-empty box inside the resized image. */
sd_status sd_image_plan_check(const sd_image_plan *p, sd_error *err)
{
    if (p->resize_w < 1 || p->resize_h < 1 || p->resize_w > SD_IMGHDR_MAX_SIDE || p->resize_h > SD_IMGHDR_MAX_SIDE)
        return sd_err_set(err, SD_ERANGE, "resize %dx%d out of range (each side 1..%d)", p->resize_w, p->resize_h,
                          SD_IMGHDR_MAX_SIDE);
    if (p->crop_l < 0 || p->crop_t < 0 || p->crop_r > p->resize_w || p->crop_b > p->resize_h || p->crop_l >= p->crop_r ||
        p->crop_t >= p->crop_b)
        return sd_err_set(err, SD_ERANGE, "crop [%d,%d,%d,%d] not inside the %dx%d resized image", p->crop_l, p->crop_t,
                          p->crop_r, p->crop_b, p->resize_w, p->resize_h);
    return SD_OK;
}

/* Name the source in messages the way a user finds it: the file, or the
 * shard and member. */
static void src_name(const sd_image_src *src, char *out, size_t n)
{
    if (src->member) snprintf(out, n, "%s[%s]", src->path, src->member);
    else snprintf(out, n, "%s", src->path);
}

/* The encoded bytes, read with pread so a tar member is read in place and one
 * shard fd could serve many threads, into the thread's file buffer. */
static sd_status read_bytes(const sd_image_src *src, const char *name, unsigned char **out, size_t *len, sd_error *err)
{
    int fd;
    off_t fsize = 0;
    sd_error oe = {0};
    sd_status ost = sd_open_regular(src->path, &fd, &fsize, &oe);
    if (ost) return sd_err_set(err, ost, "%s: %s", name, oe.msg);
    uint64_t size = src->size;
    if (size == SD_IMAGE_WHOLE_FILE) size = (uint64_t)fsize > src->offset ? (uint64_t)fsize - src->offset : 0;
    sd_status st = SD_OK;
    if (size == 0) st = sd_err_set(err, SD_ETRUNC, "%s: empty image (0 bytes)", name);
    else if (size > SD_IMAGE_MAX_BYTES)
        st = sd_err_set(err, SD_ERANGE, "%s: %llu bytes, over the %llu-byte limit", name, (unsigned long long)size,
                        (unsigned long long)SD_IMAGE_MAX_BYTES);
    unsigned char *buf = st ? NULL : sd_scratch(SD_SCRATCH_FILE, (size_t)size);
    if (!st && !buf) st = sd_err_set(err, SD_ENOMEM, "%s: no memory for %llu bytes", name, (unsigned long long)size);
    size_t have = 0;
    while (!st && have < size) {
        ssize_t r = pread(fd, buf + have, (size_t)size - have, (off_t)(src->offset + have));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = sd_err_set(err, SD_EIO, "%s: read: %s", name, strerror(errno));
        else if (r == 0) st = sd_err_set(err, SD_ETRUNC, "%s: file ends after %zu of %llu bytes", name, have, (unsigned long long)size);
        else have += (size_t)r;
    }
    close(fd);
    if (st) return st;
    *out = buf;
    *len = (size_t)size;
    return SD_OK;
}

/* A tar header's number field: octal digits (NUL/space padded) or GNU's
 * base-256 form (high bit of the first byte); -1 when malformed. */
static int64_t tar_num(const unsigned char *f, size_t n)
{
    int64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] != 0x80) return -1; /* negative, or too large for us */
        for (size_t i = 1; i < n; i++) {
            if (v > (INT64_MAX >> 8)) return -1;
            v = (v << 8) | f[i];
        }
        return v;
    }
    size_t i = 0;
    while (i < n && f[i] == ' ') i++;
    size_t digits = 0;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
        if (v > (INT64_MAX >> 3)) return -1;
        v = (v << 3) | (f[i] - '0');
    }
    for (; i < n; i++)
        if (f[i] != 0 && f[i] != ' ') return -1;
    return digits ? v : -1;
}

/* Whether a 512-byte block is a tar header: its checksum (the sum of its
 * bytes with the checksum field read as spaces; some old writers summed
 * signed chars, which libarchive accepts too) matches. */
static int tar_header_ok(const unsigned char *h)
{
    int64_t want = tar_num(h + 148, 8), sum = 0, ssum = 0;
    for (int i = 0; i < 512; i++) {
        int b = i >= 148 && i < 156 ? ' ' : h[i];
        sum += b;
        ssum += (signed char)b;
    }
    return want >= 0 && (want == sum || want == ssum);
}

/* The name a ustar header holds: prefix "/" name with the POSIX magic
 * (GNU headers use the prefix bytes for other fields), else name. */
static void tar_name(const unsigned char *h, char *out, size_t cap)
{
    int posix = memcmp(h + 257, "ustar", 6) == 0; /* "ustar\0"; GNU writes "ustar  \0" */
    size_t pl = posix ? strnlen((const char *)h + 345, 155) : 0;
    size_t nl = strnlen((const char *)h, 100);
    snprintf(out, cap, "%.*s%s%.*s", (int)pl, (const char *)h + 345, pl ? "/" : "", (int)nl, (const char *)h);
}

/* The path a pax extended header's records give ("LEN path=VALUE\n"
 * each), into out; 0 when found. */
static int pax_path(const unsigned char *d, size_t n, char *out, size_t cap)
{
    size_t i = 0;
    while (i < n) {
        size_t len = 0, j = i;
        while (j < n && d[j] >= '0' && d[j] <= '9' && len <= n) len = len * 10 + (size_t)(d[j++] - '0');
        if (j == i || j >= n || d[j] != ' ' || len < 2 || len > n - i || d[i + len - 1] != '\n') return -1;
        const unsigned char *kv = d + j + 1, *end = d + i + len - 1;
        if ((size_t)(end - kv) >= 5 && memcmp(kv, "path=", 5) == 0) {
            size_t vl = (size_t)(end - kv) - 5;
            if (vl >= cap) return -1;
            memcpy(out, kv + 5, vl);
            out[vl] = 0;
            return 0;
        }
        i += len;
    }
    return -1;
}

/* The long name that an extension member right before the header at hpos
 * gives (GNU ././@LongLink 'L' data, a pax 'x' header's path=): one read
 * of the blocks before it, large enough for a record of `want_len` bytes
 * plus pax's other records (bsdtar stores extended attributes there, some
 * kilobytes: 64 KiB is allowed); 0 and the name in out when there is one. */
static int tar_long_name(int fd, uint64_t hpos, size_t want_len, char *out, size_t cap)
{
    uint64_t span = 512 + ((want_len + 65536 + 511) / 512) * 512;
    if (span > hpos) span = hpos;
    unsigned char *w = malloc(span);
    if (!w) return -1;
    int rc = -1;
    if (pread(fd, w, span, (off_t)(hpos - span)) == (ssize_t)span) {
        for (uint64_t back = 1024; back <= span && rc; back += 512) { /* the extension's header, nearest first */
            const unsigned char *h = w + span - back;
            int64_t sz = tar_num(h + 124, 12);
            if ((h[156] != 'L' && h[156] != 'x') || !tar_header_ok(h) || sz < 0 ||
                512 + ((uint64_t)sz + 511) / 512 * 512 != back)
                continue;
            const unsigned char *d = h + 512;
            if (h[156] == 'x') rc = pax_path(d, (size_t)sz, out, cap);
            else {
                size_t n = strnlen((const char *)d, (size_t)sz);
                if (n < cap) {
                    memcpy(out, d, n);
                    out[n] = 0;
                    rc = 0;
                }
            }
            break;
        }
    }
    free(w);
    return rc;
}

/* Check that a tar member read at its recorded offset is still that member
 * (see image.h): the header block right before the data must be a regular
 * file's, of the recorded size, named as the record says (directly, or
 * through the long-name extension before it). */
sd_status sd_image_check_member(const sd_image_src *src, sd_error *err)
{
    char name[200];
    src_name(src, name, sizeof name);
    if (!src->member) return SD_OK;
    if (src->size == SD_IMAGE_WHOLE_FILE || src->offset < 512 || src->offset % 512)
        return sd_err_set(err, SD_EFORMAT, "%s: offset %llu is not a tar member's data offset", name,
                          (unsigned long long)src->offset);
    int fd;
    sd_error oe = {0};
    sd_status ost = sd_open_regular(src->path, &fd, NULL, &oe);
    if (ost) return sd_err_set(err, ost, "%s: %s", name, oe.msg);
    unsigned char h[512];
    uint64_t hpos = src->offset - 512;
    ssize_t got = pread(fd, h, sizeof h, (off_t)hpos);
    sd_status st = SD_OK;
    char found[4096] = "";
    int64_t sz = -1;
    if (got < 0) st = sd_err_set(err, SD_EIO, "%s: read: %s", name, strerror(errno));
    else if (got != (ssize_t)sizeof h || !tar_header_ok(h))
        st = sd_err_set(err, SD_EFORMAT, "%s: no tar header before offset %llu", name, (unsigned long long)src->offset);
    else {
        sz = tar_num(h + 124, 12);
        tar_name(h, found, sizeof found);
        if (strcmp(found, src->member) != 0) /* a long name: the extension before the header has it */
            tar_long_name(fd, hpos, strlen(src->member), found, sizeof found);
        if ((h[156] != '0' && h[156] != 0 && h[156] != '7') || sz < 0 || (uint64_t)sz != src->size ||
            strcmp(found, src->member) != 0)
            st = sd_err_set(err, SD_EFORMAT, "%s: the tar header before offset %llu is '%.80s' of %lld bytes, not "
                            "this member of %llu bytes", name, (unsigned long long)src->offset, found, (long long)sz,
                            (unsigned long long)src->size);
    }
    close(fd);
    return st;
}

/* One line of libvips' error text as the message says it: a loader refused
 * as untrusted ("magickload_buffer: operation is blocked", what libvips
 * says for any file it cannot sniff, a truncated one too) in words. */
static void reason_line(const char *line, char *out, size_t cap)
{
    const char *tail = "_buffer: operation is blocked";
    size_t n = strlen(line), tl = strlen(tail);
    if (n > tl && strcmp(line + n - tl, tail) == 0 && !memchr(line, ' ', n - tl))
        snprintf(out, cap, "only libvips' %.*s would read it, a loader sdtk blocks as untrusted (a format sdtk does "
                 "not read, or a damaged file)", (int)(n - tl), line);
    else snprintf(out, cap, "%s", line);
}

/* What libvips said about a failure, as one line: the newest lines of its
 * error text (at most 3, each once; older lines there are other images'
 * recovered warnings or errors) and the thread's last warning (often the
 * detail: libpng's), else that it gave no reason. Modifies m. */
static void vips_reason(char *m, char *out, size_t cap)
{
    enum { KEEP = 3 };
    const char *keep[KEEP];
    int n = 0;
    char *save = NULL;
    for (char *l = strtok_r(m, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        while (*l == ' ') l++;
        size_t len = strlen(l);
        while (len && l[len - 1] == ' ') l[--len] = 0;
        int seen = 0;
        for (int i = 0; i < n; i++) seen |= strcmp(keep[i], l) == 0;
        if (!len || seen) continue;
        if (n == KEEP) { /* the oldest goes */
            memmove(keep, keep + 1, (KEEP - 1) * sizeof *keep);
            n--;
        }
        keep[n++] = l;
    }
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at + 1 < cap; i++) {
        char line[300];
        reason_line(keep[i], line, sizeof line);
        int w = snprintf(out + at, cap - at, "%s%s", i ? "; " : "", line);
        at += w > 0 ? (size_t)w : 0;
    }
    if (thread_warning[0] && at + 1 < cap && !strstr(out, thread_warning))
        snprintf(out + at, cap - at, "%s%s (libvips' warning)", n ? "; " : "", thread_warning);
    else if (!n) snprintf(out, cap, "libvips gave no reason");
}

/* libvips' message for a failure (vips_reason). Its error buffer is shared
 * by all threads: under concurrency the text may name another thread's image
 * as well, or have been emptied by another image's start (load_rgb8). */
static sd_status vips_fail(sd_error *err, sd_status code, const char *name, const char *what)
{
    char *m = vips_error_buffer_copy();
    char why[512];
    vips_reason(m, why, sizeof why);
    g_free(m);
    sd_err_set(err, code, "%s: %s: %s", name, what, why);
    return code;
}

/* Refuse decompression bombs from the header alone: the in-memory header
 * parser for the common formats, libvips' lazy header read for the rest (it
 * decodes no pixels until asked) and for GIF too, whose canvas libvips may
 * grow to fit any frame. `info` keeps what the parser found (format
 * SD_IMG_UNKNOWN when it was libvips). */
static sd_status check_pixels(const unsigned char *buf, size_t len, uint64_t limit, const char *name, sd_imginfo *info,
                              sd_error *err)
{
    sd_error herr = {0};
    uint64_t w = 0, h = 0;
    sd_status st = sd_imghdr_parse(buf, len, info, &herr);
    if (st == SD_ERANGE) return sd_err_set(err, SD_ERANGE, "%s: %s", name, herr.msg);
    if (st == SD_OK) {
        w = info->width;
        h = info->height;
    } else memset(info, 0, sizeof *info);
    if (st != SD_OK || info->format == SD_IMG_GIF) {
        VipsImage *im = vips_image_new_from_buffer(buf, len, "", NULL);
        if (!im) { /* a format imghdr knows (damaged, or BMP): its words too */
            char what[1100] = "not a readable image"; /* room for the header parser's message */
            if (st != SD_EUNSUPPORTED || strncmp(herr.msg, "not a recognised image", 22) != 0)
                snprintf(what, sizeof what, "not a readable image (%s)", herr.msg);
            return vips_fail(err, SD_EFORMAT, name, what);
        }
        uint64_t vw = (uint64_t)vips_image_get_width(im), vh = (uint64_t)vips_image_get_height(im);
        g_object_unref(im);
        w = vw > w ? vw : w;
        h = vh > h ? vh : h;
    }
    if (w * h > limit)
        return sd_err_set(err, SD_ERANGE, "%s: image %llux%llu has %llu pixels, over the %llu limit (decompression bomb?)",
                          name, (unsigned long long)w, (unsigned long long)h, (unsigned long long)(w * h),
                          (unsigned long long)limit);
    return SD_OK;
}

/* An RGB image with an embedded profile (Adobe RGB, Display P3, ...) is
 * moved to sRGB (relative colorimetric, or the intent the profile has:
 * sd_icc_intent); thumbnail does this only for CMYK
 * unless given an export profile, and with one it also re-maps untagged
 * images through its perceptual intent (pure red comes out 248,26,16). A
 * profile lcms cannot read leaves the pixels as they are, as PIL would, and
 * so does one that is sRGB already (sd_icc_is_srgb: the identity up to the
 * profiles' rounding; libvips' two transforms through Lab would only add
 * their own). */
static VipsImage *icc_to_srgb(VipsImage *in)
{
    VipsImage *t = NULL;
    if (in->Bands < 3 || in->Type == VIPS_INTERPRETATION_CMYK || !vips_image_get_typeof(in, VIPS_META_ICC_NAME)) return in;
    const void *icc = NULL;
    size_t n = 0;
    if (vips_image_get_blob(in, VIPS_META_ICC_NAME, &icc, &n) || sd_icc_is_srgb(icc, n)) return in; /* sRGB already */
    int intent = sd_icc_intent(icc, n);
    if (intent < 0) return in; /* unreadable */
    if (vips_icc_transform(in, &t, "srgb", "embedded", TRUE, "intent", intent, NULL)) {
        vips_error_clear();
        return in;
    }
    g_object_unref(in);
    return t;
}

/* After vips_thumbnail the image is upright and resized but may still be grey,
 * 16-bit, carry alpha or an RGB profile: to sRGB, flatten onto white at the
 * format's own white, then 3-band 8-bit sRGB. Takes over `in`. */
static VipsImage *to_srgb8(VipsImage *in)
{
    VipsImage *t = NULL;
    in = icc_to_srgb(in);
    if (vips_image_hasalpha(in)) {
        int wide = in->Type == VIPS_INTERPRETATION_RGB16 || in->Type == VIPS_INTERPRETATION_GREY16;
        double white = wide ? 65535.0 : 255.0;
        VipsArrayDouble *bg = vips_array_double_newv(1, white);
        int rc = vips_flatten(in, &t, "background", bg, "max_alpha", white, NULL);
        vips_area_unref(VIPS_AREA(bg));
        g_object_unref(in);
        if (rc) return NULL;
        in = t;
    }
    if (in->Type != VIPS_INTERPRETATION_sRGB || in->Bands != 3) {
        int rc = vips_colourspace(in, &t, VIPS_INTERPRETATION_sRGB, NULL);
        g_object_unref(in);
        if (rc) return NULL;
        in = t;
    }
    if (in->BandFmt != VIPS_FORMAT_UCHAR) {
        int rc = vips_cast_uchar(in, &t, NULL);
        g_object_unref(in);
        if (rc) return NULL;
        in = t;
    }
    return in;
}

/* Replace *im with op's output, or drop it on failure. */
static int step(VipsImage **im, VipsImage *out, int rc)
{
    g_object_unref(*im);
    *im = rc ? NULL : out;
    return rc;
}

/* The size libvips will decode the image at, upright (width and height
 * swapped for an EXIF rotation by 90 degrees, as vips_thumbnail will turn
 * it): the header parser's displayed size where it read the file (check_pixels
 * did already), else libvips' lazy header read (no pixels; GIF too, whose
 * canvas libvips may grow); 0 when it cannot read it. */
static int upright_size(unsigned char *buf, size_t len, const sd_imginfo *info, int *w, int *h)
{
    if (info->format != SD_IMG_UNKNOWN && info->format != SD_IMG_GIF) {
        *w = (int)info->disp_w;
        *h = (int)info->disp_h;
        return 1;
    }
    VipsImage *im = vips_image_new_from_buffer(buf, len, "", NULL);
    if (!im) return 0;
    int swap = vips_image_get_orientation_swap(im);
    *w = swap ? im->Ysize : im->Xsize;
    *h = swap ? im->Xsize : im->Ysize;
    g_object_unref(im);
    return 1;
}

/* Samples whose 8-bit meaning libvips knows: 8 and 16 bits, floats in a
 * colour space that defines their range (scRGB, 0..1 linear: a float RGB
 * TIFF; XYZ, Lab), Lab's signed 16 bits, coded (LabQ, Radiance) pixels.
 * Anything else (32-bit integers, float grey, doubles, signed samples) has
 * no range: libvips' cast and PIL's convert would clip it to 0..255, white
 * for most of a 32-bit picture, so it is refused (SD_EUNSUPPORTED) saying
 * so. */
static sd_status check_samples(const VipsImage *im, const char *name, sd_error *err)
{
    VipsBandFormat f = im->BandFmt;
    VipsInterpretation t = im->Type;
    if (im->Coding != VIPS_CODING_NONE || f == VIPS_FORMAT_UCHAR || f == VIPS_FORMAT_USHORT) return SD_OK;
    if ((f == VIPS_FORMAT_FLOAT || f == VIPS_FORMAT_DOUBLE) &&
        (t == VIPS_INTERPRETATION_scRGB || t == VIPS_INTERPRETATION_XYZ || t == VIPS_INTERPRETATION_LAB))
        return SD_OK;
    if (f == VIPS_FORMAT_SHORT && t == VIPS_INTERPRETATION_LABS) return SD_OK;
    const char *kind = f == VIPS_FORMAT_UINT     ? "32-bit unsigned integer"
                       : f == VIPS_FORMAT_INT    ? "32-bit signed integer"
                       : f == VIPS_FORMAT_FLOAT  ? "32-bit float"
                       : f == VIPS_FORMAT_DOUBLE ? "64-bit float"
                       : f == VIPS_FORMAT_CHAR   ? "signed 8-bit"
                       : f == VIPS_FORMAT_SHORT  ? "signed 16-bit"
                                                 : "complex";
    return sd_err_set(err, SD_EUNSUPPORTED, "%s: %s samples (%s, %d band%s) have no defined range to take to 8 "
                      "bits (libvips and PIL would clip them to 0..255); convert the image to unsigned 8 or 16 bits "
                      "per sample", name, kind, vips_enum_nick(VIPS_TYPE_INTERPRETATION, t), im->Bands,
                      im->Bands == 1 ? "" : "s");
}

/* vips_thumbnail to exactly the record's size (VIPS_SIZE_FORCE may stretch
 * by the bucketer's rounding, as kohya's cv2/PIL resize to resized_size
 * does), auto-rotated, failing on truncated data rather than filling it grey
 * (libvips 8.14's thumbnail_buffer ignores its own fail_on; the loader
 * option string works). A JPEG or a format imghdr does not know (TIFF, ...)
 * may be CMYK or have samples of no defined range: their header, read by
 * libvips without decoding, says; those samples are refused (*st set), and
 * CMYK goes to sRGB first (sd_cmyk_to_srgb: untagged CMYK as PIL maps it,
 * where thumbnail's own conversion lifts black), then is thumbnailed
 * without shrink-on-load. NULL on failure. */
static VipsImage *thumbnail(unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                            const char *name, sd_status *st, sd_error *err)
{
    VipsImage *im = NULL, *src = NULL;
    if (info->format == SD_IMG_JPEG || info->format == SD_IMG_UNKNOWN) {
        src = vips_image_new_from_buffer(buf, len, "fail_on=truncated", NULL);
        if (!src) return NULL;
        if ((*st = check_samples(src, name, err)) || src->Type != VIPS_INTERPRETATION_CMYK) {
            g_object_unref(src);
            src = NULL;
        }
    }
    if (*st) return NULL;
    if (src) {
        VipsImage *rgb = sd_cmyk_to_srgb(src);
        int rc = !rgb || vips_thumbnail_image(rgb, &im, plan->resize_w, "height", plan->resize_h, "size",
                                              VIPS_SIZE_FORCE, NULL);
        if (rgb) g_object_unref(rgb);
        return rc ? NULL : im;
    }
    if (vips_thumbnail_buffer(buf, len, &im, plan->resize_w, "height", plan->resize_h, "size", VIPS_SIZE_FORCE,
                              "option_string", "fail_on=truncated", NULL))
        return NULL;
    return im;
}

/* Decode + resize with shrink-on-load (thumbnail), to 8-bit sRGB. When a
 * side grows, thumbnail decodes at the image's own upright size instead
 * (*grow = 1) and the caller enlarges it as PIL does: libvips' upsizing is
 * bicubic and shifted by half an output pixel. NULL on failure; *st set
 * when the failure has its own message. */
static VipsImage *decode_resized(unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                                 const char *name, int *grow, sd_status *st, sd_error *err)
{
    sd_image_plan at = *plan; /* thumbnail's target: the plan's resize, or the image's own size */
    int w, h;
    *grow = 0;
    if (!upright_size(buf, len, info, &w, &h)) return NULL;
    if (at.resize_w > w || at.resize_h > h) {
        at.resize_w = w;
        at.resize_h = h;
        *grow = 1;
    }
    const int tw = at.resize_w, th = at.resize_h;
    VipsImage *im = thumbnail(buf, len, info, &at, name, st, err);
    if (!im) return NULL;
    im = to_srgb8(im);
    if (!im) return NULL;
    if (im->Xsize != tw || im->Ysize != th) {
        /* thumbnail rounds to the nearest pixel; should it miss by one,
         * stretch the last step so the crop box means what the record says */
        VipsImage *t = NULL;
        double hs = (double)tw / im->Xsize, vs = (double)th / im->Ysize;
        if (step(&im, t, vips_resize(im, &t, hs, "vscale", vs, NULL))) return NULL;
    }
    return im;
}

/* An enlargement: the image decoded at its own size, evaluated into memory,
 * then PIL's LANCZOS resize of the plan's crop box (sd_lanczos_rgb8) into
 * `out`. Takes over `im`. */
static sd_status enlarge(VipsImage *im, const sd_image_plan *plan, unsigned char *out, const char *name, sd_error *err)
{
    size_t n = 0;
    int w = im->Xsize, h = im->Ysize;
    unsigned char *px = vips_image_write_to_memory(im, &n);
    g_object_unref(im);
    sd_status st = SD_OK;
    if (!px) st = vips_fail(err, SD_EFORMAT, name, "decode failed");
    else if (n != (size_t)w * h * 3) st = sd_err_set(err, SD_EFORMAT, "%s: decoded %zu bytes, want %dx%dx3", name, n, w, h);
    else if (sd_lanczos_rgb8(px, w, h, (size_t)w * 3, plan, out))
        st = sd_err_set(err, SD_ENOMEM, "%s: no memory to enlarge %dx%d to %dx%d", name, w, h, plan->resize_w,
                        plan->resize_h);
    g_free(px);
    return st;
}

/* The profile a direct decoder found, applied to its finished RGB8 output
 * the way the libvips path applies it (icc_to_srgb: relative colorimetric
 * to sRGB, an unreadable or sRGB profile leaves the pixels); a per-pixel
 * map, so doing it after the resize, crop and flip changes nothing. */
static sd_status apply_icc(unsigned char *out, int w, int h, const unsigned char *icc, size_t n, const char *name,
                           sd_error *err)
{
    size_t bytes = (size_t)w * h * 3;
    VipsImage *im = vips_image_new_from_memory(out, bytes, w, h, 3, VIPS_FORMAT_UCHAR);
    if (!im) return vips_fail(err, SD_EFORMAT, name, "colour conversion failed");
    im->Type = VIPS_INTERPRETATION_sRGB;
    vips_image_set_blob_copy(im, VIPS_META_ICC_NAME, icc, n);
    VipsImage *t = icc_to_srgb(im);
    sd_status st = SD_OK;
    if (t != im) {
        size_t got = 0;
        void *px = vips_image_write_to_memory(t, &got);
        if (!px || got != bytes) st = vips_fail(err, SD_EFORMAT, name, "colour conversion failed");
        else memcpy(out, px, bytes);
        g_free(px);
    }
    g_object_unref(t);
    return st;
}

/* The direct decoders (image_dec.c) for JPEG, PNG and WebP when the file and
 * plan suit them: SD_FAST_DECLINE sends the image down the libvips path. */
static sd_fast try_fast(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                        unsigned char *out, const char *name, sd_status *st, sd_error *err)
{
    unsigned char *icc = NULL;
    size_t icc_len = 0;
    char why[SD_FAST_WHY_MAX] = "";
    sd_fast r = SD_FAST_DECLINE;
    switch (info->format) {
    case SD_IMG_JPEG: r = sd_fast_jpeg(buf, len, info, plan, out, &icc, &icc_len, why); break;
    case SD_IMG_PNG: r = sd_fast_png(buf, len, info, plan, out, &icc, &icc_len); break;
    case SD_IMG_WEBP: r = sd_fast_webp(buf, len, info, plan, out, &icc, &icc_len); break;
    default: break;
    }
    if (r == SD_FAST_DECLINE && info->format == SD_IMG_JPEG) r = sd_jpeg_scan_check(buf, len, why);
    if (r == SD_FAST_DONE && icc) *st = apply_icc(out, sd_image_out_w(plan), sd_image_out_h(plan), icc, icc_len, name, err);
    if (r == SD_FAST_CORRUPT) *st = sd_err_set(err, SD_EFORMAT, "%s: corrupt JPEG data (libjpeg: %s)", name, why);
    free(icc);
    return r;
}

/* With keep_aspect the resize must keep the image's shape: a record planned for another
 * aspect ratio (a stale or wrong width/height in the metadata) would stretch
 * the picture, so it is refused (SD_EINVAL) naming both sizes. Allowed: the
 * bucketer's rounding, up to 2 pixels on each side of the resize. Formats
 * the header reader does not know are not checked. */
static sd_status check_aspect(const sd_imginfo *info, const sd_image_plan *plan, const char *name, sd_error *err)
{
    if (info->format == SD_IMG_UNKNOWN || !info->disp_w || !info->disp_h) return SD_OK;
    int64_t W = info->disp_w, H = info->disp_h, rw = plan->resize_w, rh = plan->resize_h;
    int64_t skew = rw * H - rh * W;
    if (skew < 0) skew = -skew;
    if (skew <= 2 * (W + H)) return SD_OK;
    /* the remedy before the sizes, so a long name cannot truncate it away: sd-bucket takes a record's
     * width/height as given, so running it again alone changes nothing */
    return sd_err_set(err, SD_EINVAL, "%s: wrong width/height in the record (rerun sd-bucket with --read-sizes): the "
                      "image is %lldx%lld, the record resizes it to %lldx%lld, another aspect ratio", name,
                      (long long)W, (long long)H, (long long)rw, (long long)rh);
}

/* The whole pipeline to uint8 HWC: bytes in memory, bomb check, then a
 * direct decoder where one fits, else one lazy libvips chain (thumbnail,
 * colour, crop, flip) evaluated at the end; an enlargement is decoded at
 * the image's size and resized as PIL's LANCZOS (enlarge). */
static sd_status load_rgb8(const sd_image_src *src, const sd_image_plan *plan, unsigned char *out, sd_error *err)
{
    char name[200];
    src_name(src, name, sizeof name);
    /* libvips' recovered warnings of earlier images (libjpeg's "extraneous
     * bytes before marker") stay in its error buffer, which only a failure's
     * copy empties: they became the next failure's whole message (cut at 256
     * bytes) and could fill the buffer so that a failure's own words were
     * dropped. Emptied as each image starts. */
    thread_warning[0] = 0;
    if (vips_error_buffer()[0]) vips_error_clear();
    sd_error perr = {0};
    sd_status st = sd_image_plan_check(plan, &perr);
    if (st) return sd_err_set(err, st, "%s: %s", name, perr.msg);
    unsigned char *buf = NULL;
    size_t len = 0;
    if ((st = read_bytes(src, name, &buf, &len, err))) return st;
    sd_imginfo info;
    st = check_pixels(buf, len, plan->max_pixels ? plan->max_pixels : SD_IMAGE_MAX_PIXELS, name, &info, err);
    if (!st && plan->keep_aspect) st = check_aspect(&info, plan, name, err);
    if (!st && try_fast(buf, len, &info, plan, out, name, &st, err) == SD_FAST_DONE) return st;
    int grow = 0;
    VipsImage *im = st ? NULL : decode_resized(buf, len, &info, plan, name, &grow, &st, err);
    if (!st && !im) st = vips_fail(err, SD_EFORMAT, name, "decode failed");
    if (!st && grow) return enlarge(im, plan, out, name, err);
    int cw = sd_image_out_w(plan), ch = sd_image_out_h(plan);
    VipsImage *t = NULL;
    if (!st && (cw != plan->resize_w || ch != plan->resize_h) &&
        step(&im, t, vips_extract_area(im, &t, plan->crop_l, plan->crop_t, cw, ch, NULL)))
        st = vips_fail(err, SD_EFORMAT, name, "crop failed");
    if (!st && plan->flip && step(&im, t, vips_flip(im, &t, VIPS_DIRECTION_HORIZONTAL, NULL)))
        st = vips_fail(err, SD_EFORMAT, name, "flip failed");
    if (!st) {
        /* evaluate: libvips runs the whole lazy chain here, strip by strip */
        size_t n = 0;
        void *px = vips_image_write_to_memory(im, &n);
        if (!px) st = vips_fail(err, SD_EFORMAT, name, "decode failed");
        else if (n != (size_t)cw * ch * 3) st = sd_err_set(err, SD_EFORMAT, "%s: decoded %zu bytes, want %dx%dx3", name, n, cw, ch);
        else memcpy(out, px, n);
        g_free(px);
    }
    if (im) g_object_unref(im);
    return st;
}

/* The uint8 entry point: the pipeline, then oversized thread buffers given back. */
sd_status sd_image_load_rgb8(const sd_image_src *src, const sd_image_plan *plan, unsigned char *out, sd_error *err)
{
    sd_status st = load_rgb8(src, plan, out, err);
    sd_scratch_trim();
    return st;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Sixteen bytes to floats v / 127.5f - 1.0f: the operations the table's
 * entries are made with (IEEE divide and subtract), so the same values. */
__attribute__((target("avx2"))) static inline void put16(__m128i bytes, float *dst)
{
    const __m256 k = _mm256_set1_ps(127.5f), one = _mm256_set1_ps(1.0f);
    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    _mm256_storeu_ps(dst, _mm256_sub_ps(_mm256_div_ps(lo, k), one));
    _mm256_storeu_ps(dst + 8, _mm256_sub_ps(_mm256_div_ps(hi, k), one));
}

/* The pshufb mask that picks, from third k of 48 interleaved RGB bytes, the
 * bytes of channel c (pixel j's lies at 3j + c - 16k when in 0..15). */
__attribute__((target("avx2"))) static __m128i pick_mask(int c, int k)
{
    signed char m[16];
    for (int j = 0; j < 16; j++) {
        int at = 3 * j + c - 16 * k;
        m[j] = (signed char)(at >= 0 && at < 16 ? at : -1);
    }
    return _mm_loadu_si128((const __m128i *)m);
}

/* The planes 16 pixels a step with AVX2 (each channel's 16 bytes picked
 * from the three 16-byte thirds and merged); returns how many pixels it did
 * (the rest go through the table). */
__attribute__((target("avx2"))) static size_t chw_avx2(const unsigned char *hwc, size_t n, float *r, float *g, float *b)
{
    __m128i m[3][3];
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < 3; k++) m[c][k] = pick_mask(c, k);
    float *plane[3] = {r, g, b};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i *p = (const __m128i *)(hwc + 3 * i);
        __m128i x0 = _mm_loadu_si128(p), x1 = _mm_loadu_si128(p + 1), x2 = _mm_loadu_si128(p + 2);
        for (int c = 0; c < 3; c++) {
            __m128i v = _mm_or_si128(_mm_shuffle_epi8(x0, m[c][0]), _mm_shuffle_epi8(x1, m[c][1]));
            put16(_mm_or_si128(v, _mm_shuffle_epi8(x2, m[c][2])), plane[c] + i);
        }
    }
    return i;
}
#else
/* Not an x86-64 GCC-compatible build: all pixels go through the table. */
static size_t chw_avx2(const unsigned char *hwc, size_t n, float *r, float *g, float *b)
{
    (void)hwc, (void)n, (void)r, (void)g, (void)b;
    return 0;
}
#endif

/* kohya's ToTensor + Normalize(0.5, 0.5): x / 255 * 2 - 1, planar; a
 * 256-entry table instead of a divide per value, or the same divides 8
 * wide with AVX2 (the same floats either way). */
void sd_image_rgb8_to_chw(const unsigned char *hwc, int w, int h, float *chw)
{
    float lut[256];
    for (int v = 0; v < 256; v++) lut[v] = (float)v / 127.5f - 1.0f;
    size_t n = (size_t)w * h;
    float *r = chw, *g = chw + n, *b = chw + 2 * n;
    for (size_t i = sd_image_avx2() ? chw_avx2(hwc, n, r, g, b) : 0; i < n; i++) {
        r[i] = lut[hwc[3 * i]];
        g[i] = lut[hwc[3 * i + 1]];
        b[i] = lut[hwc[3 * i + 2]];
    }
}

/* The float variant: decode into the thread's HWC buffer, then spread to planes. */
sd_status sd_image_load_chw(const sd_image_src *src, const sd_image_plan *plan, float *out, sd_error *err)
{
    sd_status st = sd_image_plan_check(plan, err);
    if (st) return st;
    int w = sd_image_out_w(plan), h = sd_image_out_h(plan);
    unsigned char *hwc = sd_scratch(SD_SCRATCH_HWC, (size_t)w * h * 3);
    if (!hwc) return sd_err_set(err, SD_ENOMEM, "no memory for a %dx%d image", w, h);
    st = load_rgb8(src, plan, hwc, err);
    if (!st) sd_image_rgb8_to_chw(hwc, w, h, out);
    sd_scratch_trim();
    return st;
}

/* For image_band.c: the encoded bytes of src (thread buffer) and the
 * decompression-bomb check, the ones the picture's pipeline uses. */
sd_status sd_image_read_checked(const sd_image_src *src, const sd_image_plan *plan, const char *name,
                                unsigned char **buf, size_t *len, sd_error *err)
{
    thread_warning[0] = 0;
    if (vips_error_buffer()[0]) vips_error_clear();
    sd_imginfo info;
    sd_status st = read_bytes(src, name, buf, len, err);
    if (!st) st = check_pixels(*buf, *len, plan->max_pixels ? plan->max_pixels : SD_IMAGE_MAX_PIXELS, name, &info, err);
    return st;
}

/* For image_band.c: a libvips failure as an sd_status with its message. */
sd_status sd_image_vips_fail(sd_error *err, sd_status code, const char *name, const char *what)
{
    return vips_fail(err, code, name, what);
}
