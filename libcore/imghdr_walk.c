/* Past the size field: the EXIF orientation of PNG and WebP files (libvips
 * rotates them upright, so the planner must see their display size, as it
 * does for JPEG) and the first frame of a GIF (libvips grows the image to
 * a frame that overhangs the logical screen, so the pixel limit must count
 * the frame). Chunk and block walks over a byte source; see imghdr_int.h. */
#include "imghdr_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t le16(const unsigned char *p) { return (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le32(const unsigned char *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }

/* Most chunks or blocks walked, and most EXIF bytes read, before giving up
 * (orientation 1): a hostile file cannot make the walk long. */
enum { MAX_STEPS = 1 << 16, MAX_EXIF = 1 << 16 };

/* Copy up to len bytes from position pos; returns how many there were. */
static size_t src_read(const sd_hdr_src *s, uint64_t pos, unsigned char *dst, size_t len)
{
    if (s->fd < 0) {
        if (pos >= s->n) return 0;
        size_t k = s->n - (size_t)pos < len ? s->n - (size_t)pos : len;
        memcpy(dst, s->mem + pos, k);
        return k;
    }
    if (pos >= s->size) return 0;
    if (s->size - pos < len) len = (size_t)(s->size - pos);
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(s->fd, dst + got, len - got, (off_t)(s->off + pos + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

/* A short read is "more needed" in a window in memory, the end in a file. */
static int ran_out(const sd_hdr_src *s) { return s->fd < 0 ? SD_WALK_MORE : 1; }

/* Orientation (tag 0x0112) from the IFD0 of an Exif TIFF block; 1 when it is
 * absent or the block is damaged (a bad Exif is no reason to drop a photo). */
int sd_exif_orientation(const unsigned char *t, size_t n)
{
    if (n < 8) return 1;
    int le;
    if (t[0] == 'I' && t[1] == 'I') le = 1;
    else if (t[0] == 'M' && t[1] == 'M') le = 0;
    else return 1;
    uint32_t magic = le ? le16(t + 2) : be16(t + 2);
    if (magic != 42) return 1;
    uint32_t ifd = le ? le32(t + 4) : be32(t + 4);
    if ((uint64_t)ifd + 2 > n) return 1;
    uint32_t count = le ? le16(t + ifd) : be16(t + ifd);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t e = (uint64_t)ifd + 2 + 12ULL * i;
        if (e + 12 > n) break;
        uint32_t tag = le ? le16(t + e) : be16(t + e);
        if (tag != 0x0112) continue;
        uint32_t type = le ? le16(t + e + 2) : be16(t + e + 2);
        if (type != 3) return 1; /* SHORT */
        uint32_t v = le ? le16(t + e + 8) : be16(t + e + 8);
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}

/* The orientation of the EXIF payload at [pos, pos + n): TIFF data, with or
 * without the "Exif\0\0" prefix some writers keep. */
static int exif_at(const sd_hdr_src *s, uint64_t pos, uint32_t n)
{
    size_t want = n < MAX_EXIF ? n : MAX_EXIF;
    unsigned char *b = malloc(want ? want : 1);
    if (!b) return 1;
    size_t got = src_read(s, pos, b, want);
    int o;
    if (got < want && s->fd < 0) o = SD_WALK_MORE;
    else if (got >= 6 && memcmp(b, "Exif\0\0", 6) == 0) o = sd_exif_orientation(b + 6, got - 6);
    else o = sd_exif_orientation(b, got);
    free(b);
    return o;
}

/* PNG: chunks after IHDR up to the first IDAT; libpng and PIL read eXIf there. */
int sd_png_orientation(const sd_hdr_src *s)
{
    uint64_t pos = 33;
    for (int k = 0; k < MAX_STEPS; k++) {
        unsigned char h[8];
        if (src_read(s, pos, h, 8) < 8) return ran_out(s);
        uint32_t n = be32(h);
        if (n > 0x7FFFFFFFu || memcmp(h + 4, "IDAT", 4) == 0 || memcmp(h + 4, "IEND", 4) == 0) return 1;
        if (memcmp(h + 4, "eXIf", 4) == 0) return exif_at(s, pos + 8, n);
        pos += 12 + (uint64_t)n;
    }
    return 1;
}

/* WebP: only the extended format (VP8X) has an EXIF chunk, flagged in its
 * header and stored after the image data, so the walk skips from chunk
 * header to chunk header. */
int sd_webp_orientation(const sd_hdr_src *s)
{
    unsigned char h[21];
    if (src_read(s, 0, h, 21) < 21) return ran_out(s);
    if (memcmp(h + 12, "VP8X", 4) != 0 || !(h[20] & 0x08)) return 1;
    uint64_t end = 8 + (uint64_t)le32(h + 4), pos = 12;
    for (int k = 0; k < MAX_STEPS && pos + 8 <= end; k++) {
        unsigned char c[8];
        if (src_read(s, pos, c, 8) < 8) return ran_out(s);
        uint32_t n = le32(c + 4);
        if (memcmp(c, "EXIF", 4) == 0) return exif_at(s, pos + 8, n);
        pos += 8 + (uint64_t)n + (n & 1);
    }
    return 1;
}

/* GIF: skip the global colour table and the extension blocks (each a label
 * and sub-blocks of up to 255 bytes) to the first image descriptor. */
int sd_gif_first_frame(const sd_hdr_src *s, uint32_t *right, uint32_t *bottom)
{
    unsigned char b[10];
    if (src_read(s, 10, b, 1) < 1) return ran_out(s);
    uint64_t pos = 13 + (b[0] & 0x80 ? 3ULL << ((b[0] & 7) + 1) : 0);
    for (int k = 0; k < MAX_STEPS; k++) {
        if (src_read(s, pos, b, 1) < 1) return ran_out(s);
        if (b[0] == 0x2C) {
            if (src_read(s, pos + 1, b, 8) < 8) return ran_out(s);
            *right = le16(b) + le16(b + 4);
            *bottom = le16(b + 2) + le16(b + 6);
            return 0;
        }
        if (b[0] != 0x21) return 1; /* the trailer, or not a block: no frame */
        pos += 2; /* introducer and label */
        for (;; k++) {
            if (k >= MAX_STEPS) return 1;
            if (src_read(s, pos, b, 1) < 1) return ran_out(s);
            pos += 1 + (uint64_t)b[0];
            if (b[0] == 0) break;
        }
    }
    return 1;
}
