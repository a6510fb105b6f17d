/* Past the size field: the EXIF orientation of PNG and WebP files (libvips
 * rotates them upright, so the planner must see their display size, as it
 * does for JPEG; all three read the way libvips 8.14 reads them, through
 * libpng and libexif 0.6.24, or the planned shape would stretch the image)
 * and the first frame of a GIF (libvips sizes the image from it). Chunk and
 * block walks over a byte source; see imghdr_int.h. */
#include "imghdr_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Field reads in both byte orders: PNG's chunks are big-endian, WebP's and GIF's little-endian,
 * an EXIF block's either. */
static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
static uint32_t le16(const unsigned char *p) { return (uint32_t)p[1] << 8 | p[0]; }
static uint32_t le32(const unsigned char *p) { return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]; }

/* Most chunks or blocks walked, and most EXIF bytes read, before giving up
 * (orientation 1): a hostile file cannot make the walk long. libexif reads
 * at most 0xFFF8 bytes of TIFF data (0xFFFE with its 6-byte header), and
 * libvips refuses an EXIF block over 1 MiB. */
enum { MAX_STEPS = 1 << 16, MAX_EXIF = 1 << 16, EXIF_TIFF_MAX = 0xFFF8, VIPS_EXIF_MAX = 1 << 20 };

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

/* Does a short read only mean the window in memory ended (more may help)? */
static int window_ends(const sd_hdr_src *s) { return s->fd < 0 && !s->whole; }

/* A short read is "more needed" in a window in memory, the end in a file. */
static int ran_out(const sd_hdr_src *s) { return window_ends(s) ? SD_WALK_MORE : 1; }

/* CRC-32 of PNG chunks, bitwise: it covers an IHDR or an eXIf chunk. */
uint32_t sd_png_crc32(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

/* A TIFF block as libexif reads it: its bytes and byte order. */
typedef struct {
    const unsigned char *t;
    size_t n;
    int le;
} tiff_block;

/* A TIFF field in the block's own byte order (EXIF's "II" or "MM"). */
static uint32_t tiff16(const tiff_block *b, uint64_t at) { return b->le ? le16(b->t + at) : be16(b->t + at); }
static uint32_t tiff32(const tiff_block *b, uint64_t at) { return b->le ? le32(b->t + at) : be32(b->t + at); }

/* Bytes per value of a TIFF type (BYTE .. DOUBLE); 0 for one libexif does
 * not know, whose entries it drops. */
static unsigned tiff_type_size(uint32_t type)
{
    static const unsigned char size[13] = {0, 1, 1, 2, 4, 8, 1, 1, 2, 4, 8, 4, 8};
    return type < 13 ? size[type] : 0;
}

/* Where the values of the IFD entry at e lie, as libexif loads an entry
 * (inline when they fit in 4 bytes, else at the offset it gives): 0 when
 * libexif drops the entry (unknown type, no values, data past the end). */
static int tiff_entry_data(const tiff_block *b, uint64_t e, uint64_t *at)
{
    uint64_t size = (uint64_t)tiff_type_size(tiff16(b, e + 2)) * tiff32(b, e + 4);
    if (size == 0) return 0;
    uint64_t off = size > 4 ? tiff32(b, e + 8) : e + 8;
    if (off >= b->n || size > b->n - off) return 0;
    *at = off;
    return 1;
}

/* Is v an orientation? libvips keeps 1..8 and makes anything else 1. */
static int orientation_or_1(uint64_t v) { return v >= 1 && v <= 8 ? (int)v : 1; }

/* libvips reads an ASCII orientation with glibc's atoi: strtol's long
 * (LP64, saturated), then its low 32 bits as the int. s[0..n) holds the
 * string (libvips copies at most 254 bytes; a NUL ends it). */
static int ascii_orientation(const unsigned char *s, size_t n)
{
    const uint64_t lim = (uint64_t)1 << 63;
    size_t i = 0;
    while (i < n && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
    int neg = i < n && s[i] == '-';
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    uint64_t v = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        v = v > (lim - d) / 10 ? lim : v * 10 + d;
    }
    uint64_t l = neg ? 0 - v : (v >= lim ? lim - 1 : v);
    return orientation_or_1((uint32_t)l);
}

/* The orientation libvips makes of the entry at e, values at `at`:
 * exif_entry_fix turns BYTE, SBYTE, SSHORT, LONG and SLONG into SHORT
 * (a byte as it is, the low 16 bits of the rest); vips__exif_parse prints
 * the values when there are fewer than 10 (a RATIONAL's numerator first)
 * or the ASCII string, and reads the text back with atoi. */
static int entry_orientation(const tiff_block *b, uint64_t e, uint64_t at)
{
    uint32_t type = tiff16(b, e + 2), count = tiff32(b, e + 4);
    if (type == 2) return ascii_orientation(b->t + at, count < 254 ? count : 254);
    if (count >= 10) return 1;
    switch (type) {
    case 1: case 6: return orientation_or_1(b->t[at]);
    case 3: case 8: return orientation_or_1(tiff16(b, at));
    case 4: case 9: return orientation_or_1(tiff32(b, at) & 0xFFFF);
    case 5: case 10: return orientation_or_1(tiff32(b, at));
    default: return 1;
    }
}

/* libexif stops loading an IFD at a pointer (Exif, GPS, Interoperability
 * IFD, thumbnail offset or length) whose value lies past the block. */
static int stops_ifd(const tiff_block *b, uint64_t e)
{
    uint32_t tag = tiff16(b, e);
    int pointer = tag == 0x8769 || tag == 0x8825 || tag == 0xA005 || tag == 0x0201 || tag == 0x0202;
    return pointer && tiff32(b, e + 8) >= b->n;
}

/* IFD0's orientation as libexif loads it (entries that fit, the first
 * orientation entry it keeps wins) and libvips reads it; 1 when it is
 * absent or the block is damaged (a bad Exif is no reason to drop a photo). */
int sd_exif_orientation(const unsigned char *t, size_t n)
{
    tiff_block b = {t, n < EXIF_TIFF_MAX ? n : EXIF_TIFF_MAX, 0};
    if (b.n < 8) return 1;
    if (t[0] == 'I' && t[1] == 'I') b.le = 1;
    else if (t[0] != 'M' || t[1] != 'M') return 1;
    if (tiff16(&b, 2) != 42) return 1;
    uint64_t ifd = tiff32(&b, 4);
    if (ifd + 2 > b.n) return 1;
    uint64_t first = ifd + 2, count = tiff16(&b, ifd);
    if (first + 12 * count > b.n) count = (b.n - first) / 12;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t e = first + 12 * i, at;
        if (stops_ifd(&b, e)) return 1;
        if (tiff16(&b, e) == 0x0112 && tiff_entry_data(&b, e, &at)) return entry_orientation(&b, e, at);
    }
    return 1;
}

/* libvips takes a block starting "Exif" as it is (libexif then needs the
 * whole "Exif\0\0" header) and puts that header before any other. */
int sd_exif_blob_orientation(const unsigned char *b, size_t n)
{
    if (n < 4 || n > VIPS_EXIF_MAX) return 1;
    if (memcmp(b, "Exif", 4) != 0) return sd_exif_orientation(b, n);
    if (n < 6 || b[4] != 0 || b[5] != 0) return 1;
    return sd_exif_orientation(b + 6, n - 6);
}

/* The orientation of the EXIF block at [pos, pos + n) (a WebP chunk). */
static int exif_at(const sd_hdr_src *s, uint64_t pos, uint32_t n)
{
    if (n > VIPS_EXIF_MAX) return 1;
    size_t want = n < MAX_EXIF ? n : MAX_EXIF;
    unsigned char *b = malloc(want ? want : 1);
    if (!b) return 1;
    size_t got = src_read(s, pos, b, want);
    int o = got < want && window_ends(s) ? SD_WALK_MORE : sd_exif_blob_orientation(b, got);
    free(b);
    return o;
}

/* The PNG eXIf chunk of n bytes whose data starts at pos: libpng keeps it
 * (*kept) when its CRC is good, it has 2 bytes or more and starts "II" or
 * "MM"; a chunk it drops lets a later eXIf count. Returns the orientation
 * of a kept chunk (1 for a dropped one), or SD_WALK_MORE. A chunk over
 * 1 MiB counts as kept without its CRC read: libvips refuses it anyway. */
static int png_exif(const sd_hdr_src *s, uint64_t pos, uint32_t n, int *kept)
{
    *kept = 1;
    if (n > VIPS_EXIF_MAX) return 1;
    unsigned char *b = malloc((size_t)n + 8); /* type, data, CRC */
    if (!b) return 1;
    memcpy(b, "eXIf", 4);
    size_t got = src_read(s, pos, b + 4, (size_t)n + 4);
    int o = 1;
    if (got < (size_t)n + 4 && window_ends(s)) o = SD_WALK_MORE;
    else if (got < (size_t)n + 4 || n < 2 || b[4] != b[5] || (b[4] != 'I' && b[4] != 'M') ||
             sd_png_crc32(b, (size_t)n + 4) != be32(b + 4 + n))
        *kept = 0;
    else o = sd_exif_blob_orientation(b + 4, n);
    free(b);
    return o;
}

/* PNG: chunks after IHDR up to the first IDAT; libpng reads eXIf there. */
int sd_png_orientation(const sd_hdr_src *s)
{
    uint64_t pos = 33;
    for (int k = 0; k < MAX_STEPS; k++) {
        unsigned char h[8];
        if (src_read(s, pos, h, 8) < 8) return ran_out(s);
        uint32_t n = be32(h);
        if (n > 0x7FFFFFFFu || memcmp(h + 4, "IDAT", 4) == 0 || memcmp(h + 4, "IEND", 4) == 0) return 1;
        if (memcmp(h + 4, "eXIf", 4) == 0) {
            int kept, o = png_exif(s, pos + 8, n, &kept);
            if (kept || o == SD_WALK_MORE) return o;
        }
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
    int end = window_ends(s) ? SD_WALK_MORE : SD_GIF_END;
    if (src_read(s, 10, b, 1) < 1) return end;
    uint64_t pos = 13 + (b[0] & 0x80 ? 3ULL << ((b[0] & 7) + 1) : 0);
    for (int k = 0; k < MAX_STEPS; k++) {
        if (src_read(s, pos, b, 1) < 1) return end;
        if (b[0] == 0x2C) {
            if (src_read(s, pos + 1, b, 8) < 8) return end;
            *right = le16(b) + le16(b + 4);
            *bottom = le16(b + 2) + le16(b + 6);
            return 0;
        }
        if (b[0] != 0x21) return SD_GIF_NONE; /* the trailer, or not a block */
        pos += 2; /* introducer and label */
        for (;; k++) {
            if (k >= MAX_STEPS) return SD_GIF_NONE;
            if (src_read(s, pos, b, 1) < 1) return end;
            pos += 1 + (uint64_t)b[0];
            if (b[0] == 0) break;
        }
    }
    return SD_GIF_NONE;
}
