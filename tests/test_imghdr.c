/* Header-only image sizes on byte strings built here, byte by byte from the
 * format specifications, plus files read through the fd path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "imghdr.h"

typedef struct {
    unsigned char d[4 * 1024 * 1024];
    size_t n;
} bytes;

static void put(bytes *b, const void *p, size_t n)
{
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void put8(bytes *b, unsigned v) { b->d[b->n++] = (unsigned char)v; }
static void put16be(bytes *b, unsigned v) { put8(b, v >> 8); put8(b, v & 255); }
static void put16le(bytes *b, unsigned v) { put8(b, v & 255); put8(b, v >> 8); }
static void put32le(bytes *b, uint32_t v) { put16le(b, v & 0xFFFF); put16le(b, v >> 16); }
static void put32be(bytes *b, uint32_t v) { put16be(b, v >> 16); put16be(b, v & 0xFFFF); }

/* An APP1 Exif segment with IFD0 holding an orientation tag (and one other
 * tag before it), in big- or little-endian TIFF order. */
static void exif(bytes *b, int little, unsigned orientation)
{
    put8(b, 0xFF);
    put8(b, 0xE1);
    put16be(b, 2 + 6 + 8 + 2 + 24 + 4);
    put(b, "Exif\0\0", 6);
    void (*p16)(bytes *, unsigned) = little ? put16le : put16be;
    void (*p32)(bytes *, uint32_t) = little ? put32le : put32be;
    put(b, little ? "II" : "MM", 2);
    p16(b, 42);
    p32(b, 8);
    p16(b, 2); /* two entries */
    p16(b, 0x010F); p16(b, 2); p32(b, 4); p16(b, 0); p16(b, 0); /* Make, ASCII, ignored */
    p16(b, 0x0112); p16(b, 3); p32(b, 1); p16(b, orientation); p16(b, 0);
    put16be(b, 0); put16be(b, 0); /* next IFD */
}

/* A JPEG: SOI, JFIF APP0, optional Exif, a DHT (0xC4: not a frame header),
 * fill bytes, then SOFn with w x h, then SOS. */
static void jpeg(bytes *b, unsigned sof, unsigned w, unsigned h, int exif_order, unsigned orientation)
{
    b->n = 0;
    put8(b, 0xFF); put8(b, 0xD8);
    put8(b, 0xFF); put8(b, 0xE0); put16be(b, 16); put(b, "JFIF\0\1\1\0\0\1\0\1\0\0", 14);
    if (exif_order) exif(b, exif_order == 1, orientation);
    put8(b, 0xFF); put8(b, 0xC4); put16be(b, 6); put16be(b, 0x0102); put16be(b, 0x0304);
    put8(b, 0xFF); put8(b, 0xFF); put8(b, 0xFF); /* fill */
    put8(b, sof); put16be(b, 17); put8(b, 8); put16be(b, h); put16be(b, w); put8(b, 3);
    for (int i = 0; i < 9; i++) put8(b, 0x11);
    put8(b, 0xFF); put8(b, 0xDA); put16be(b, 8); put(b, "\3\1\0\2\0\0", 6);
}

static sd_status parse(const bytes *b, sd_imginfo *info)
{
    sd_error err;
    return sd_imghdr_parse(b->d, b->n, info, &err);
}

static void test_jpeg(bytes *b)
{
    sd_imginfo in;
    jpeg(b, 0xC0, 4000, 3000, 0, 1);
    CHECK(parse(b, &in) == SD_OK && in.format == SD_IMG_JPEG && in.width == 4000 && in.height == 3000);
    CHECK(in.orientation == 1 && in.disp_w == 4000);
    jpeg(b, 0xC2, 640, 480, 0, 1); /* progressive */
    CHECK(parse(b, &in) == SD_OK && in.width == 640 && in.height == 480);
    /* Exif orientation 6 (rotate 90): display size swaps, in both byte orders */
    jpeg(b, 0xC0, 4000, 3000, 2, 6);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 6 && in.width == 4000 && in.disp_w == 3000 && in.disp_h == 4000);
    jpeg(b, 0xC1, 4000, 3000, 1, 8);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 8 && in.disp_w == 3000);
    jpeg(b, 0xC0, 4000, 3000, 1, 3); /* 180 degrees: no swap */
    CHECK(parse(b, &in) == SD_OK && in.orientation == 3 && in.disp_w == 4000);
    jpeg(b, 0xC0, 4000, 3000, 1, 99); /* nonsense orientation is ignored */
    CHECK(parse(b, &in) == SD_OK && in.orientation == 1);
    /* truncated anywhere before the frame header's size */
    jpeg(b, 0xC0, 4000, 3000, 2, 6);
    size_t full = b->n;
    int all_trunc = 1;
    for (size_t cut = 0; cut + 23 < full; cut++) { /* 23: past the size bytes of SOF + SOS */
        b->n = cut;
        sd_status st = parse(b, &in);
        if (st != SD_ETRUNC) {
            all_trunc = 0;
            fprintf(stderr, "  cut at %zu: status %d\n", cut, st);
            break;
        }
    }
    CHECK(all_trunc);
    /* scan before frame, EOI before frame, DNL height, zero width, huge */
    b->n = 0;
    put8(b, 0xFF); put8(b, 0xD8); put8(b, 0xFF); put8(b, 0xDA); put16be(b, 8);
    CHECK(parse(b, &in) == SD_EFORMAT);
    b->n = 0;
    put8(b, 0xFF); put8(b, 0xD8); put8(b, 0xFF); put8(b, 0xD9);
    CHECK(parse(b, &in) == SD_EFORMAT);
    jpeg(b, 0xC0, 640, 0, 0, 1);
    CHECK(parse(b, &in) == SD_EUNSUPPORTED);
    jpeg(b, 0xC0, 0, 480, 0, 1);
    CHECK(parse(b, &in) == SD_ERANGE);
    jpeg(b, 0xC0, 65535, 65535, 0, 1); /* 4.3 Gpx: a decompression bomb */
    CHECK(parse(b, &in) == SD_ERANGE);
    jpeg(b, 0xC0, 13000, 13000, 0, 1); /* 169 Mpx: under PIL's limit */
    CHECK(parse(b, &in) == SD_OK);
    /* bad segment length */
    b->n = 0;
    put8(b, 0xFF); put8(b, 0xD8); put8(b, 0xFF); put8(b, 0xE0); put16be(b, 1);
    CHECK(parse(b, &in) == SD_EFORMAT);
}

static void test_png(bytes *b)
{
    /* the well-known 1x1 RGBA PNG: its IHDR CRC is 0x1F15C489 */
    static const unsigned char one[] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10, 0, 0, 0, 13, 'I', 'H', 'D', 'R', 0, 0, 0, 1,
                                        0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1F, 0x15, 0xC4, 0x89, 0, 0, 0, 0};
    sd_imginfo in;
    b->n = 0;
    put(b, one, sizeof one);
    CHECK(parse(b, &in) == SD_OK && in.format == SD_IMG_PNG && in.width == 1 && in.height == 1);
    b->d[19] = 2; /* width 2 with the old CRC */
    CHECK(parse(b, &in) == SD_EFORMAT);
    b->d[19] = 1;
    b->d[12] = 'X'; /* not IHDR */
    CHECK(parse(b, &in) == SD_EFORMAT);
    b->d[12] = 'I';
    for (size_t cut = 0; cut < 33; cut++) {
        b->n = cut;
        if (!CHECK(parse(b, &in) == SD_ETRUNC)) break;
    }
}

static sd_status via_file(const bytes *b, uint64_t off, uint64_t size, sd_imginfo *in, sd_error *err);

/* A GIF: the logical screen (no colour table), then, with `frame`, one
 * w x h image at (x, y) holding a tiny LZW stream, then the trailer. */
static void gif(bytes *b, unsigned sw, unsigned sh, int frame, unsigned x, unsigned y, unsigned w, unsigned h)
{
    b->n = 0;
    put(b, "GIF89a", 6); put16le(b, sw); put16le(b, sh); put8(b, 0); put8(b, 0); put8(b, 0);
    if (frame) {
        put8(b, 0x2C); put16le(b, x); put16le(b, y); put16le(b, w); put16le(b, h); put8(b, 0);
        put8(b, 2); put8(b, 2); put8(b, 0x4C); put8(b, 0x01); put8(b, 0);
    }
    put8(b, 0x3B);
}

/* A GIF comment extension of 100 full sub-blocks (25 kB): it puts what
 * follows past the parser's first read. */
static void gif_long_comment(bytes *b)
{
    put8(b, 0x21); put8(b, 0xFE);
    for (int i = 0; i < 100; i++) {
        put8(b, 255);
        memset(b->d + b->n, 'c', 255);
        b->n += 255;
    }
    put8(b, 0);
}

static void test_webp_gif_bmp(bytes *b)
{
    sd_imginfo in;
    /* lossy: frame tag (key frame), start code, 14-bit sizes */
    b->n = 0;
    put(b, "RIFF", 4); put32le(b, 100); put(b, "WEBPVP8 ", 8); put32le(b, 80);
    put8(b, 0x30); put8(b, 0x01); put8(b, 0x00); put8(b, 0x9D); put8(b, 0x01); put8(b, 0x2A);
    put16le(b, 4096); put16le(b, 2304 | 0x4000); /* scale bits must be masked off */
    CHECK(parse(b, &in) == SD_OK && in.format == SD_IMG_WEBP && in.width == 4096 && in.height == 2304);
    b->d[20] = 0x31; /* interframe */
    CHECK(parse(b, &in) == SD_EFORMAT);
    b->n = 29;
    CHECK(parse(b, &in) == SD_ETRUNC);
    /* lossless: 14-bit width-1 and height-1 after the 0x2F signature */
    b->n = 0;
    put(b, "RIFF", 4); put32le(b, 100); put(b, "WEBPVP8L", 8); put32le(b, 80); put8(b, 0x2F);
    put32le(b, (uint32_t)(800 - 1) | (uint32_t)(600 - 1) << 14);
    CHECK(parse(b, &in) == SD_OK && in.width == 800 && in.height == 600);
    /* extended: 24-bit canvas sizes; 100000x100000 must be refused */
    b->n = 0;
    put(b, "RIFF", 4); put32le(b, 100); put(b, "WEBPVP8X", 8); put32le(b, 10); put32le(b, 0);
    put16le(b, (1920 - 1) & 0xFFFF); put8(b, 0); put16le(b, 1080 - 1); put8(b, 0);
    CHECK(parse(b, &in) == SD_OK && in.width == 1920 && in.height == 1080);
    b->n = 24;
    put16le(b, (100000 - 1) & 0xFFFF); put8(b, (100000 - 1) >> 16); put16le(b, (100000 - 1) & 0xFFFF); put8(b, (100000 - 1) >> 16);
    sd_error err;
    CHECK(sd_imghdr_parse(b->d, b->n, &in, &err) == SD_ERANGE && strstr(err.msg, "100000x100000"));
    b->n = 0;
    put(b, "RIFF", 4); put32le(b, 100); put(b, "WAVEfmt ", 8);
    CHECK(parse(b, &in) == SD_EUNSUPPORTED);

    gif(b, 320, 200, 1, 0, 0, 100, 50);
    CHECK(parse(b, &in) == SD_OK && in.format == SD_IMG_GIF && in.width == 320 && in.height == 200);
    b->d[4] = '7'; /* GIF87a */
    CHECK(parse(b, &in) == SD_OK && in.width == 320 && in.height == 200);

    /* BMP: libvips 8.14 reads it only through ImageMagick (magickload),
     * which sdtk blocks, so it is refused here rather than in sd-latents */
    b->n = 0; /* BITMAPINFOHEADER, top-down (negative height) */
    put(b, "BM", 2); put32le(b, 0); put32le(b, 0); put32le(b, 54); put32le(b, 40); put32le(b, 640); put32le(b, (uint32_t)-480);
    sd_error berr;
    CHECK(sd_imghdr_parse(b->d, b->n, &in, &berr) == SD_EUNSUPPORTED &&
          strstr(berr.msg, "BMP: libvips reads it only through ImageMagick") && strstr(berr.msg, "convert it to PNG"));
    CHECK(via_file(b, 0, UINT64_MAX, &in, &berr) == SD_EUNSUPPORTED && strncmp(berr.msg, "BMP: ", 5) == 0);

    /* not images */
    static const char *junk[] = {"hello world, not an image", "{\"json\":1}", "\x89PNX\r\n\x1a\n0000000000000000000000000"};
    for (size_t i = 0; i < 3; i++) {
        b->n = 0;
        put(b, junk[i], strlen(junk[i]));
        CHECK(parse(b, &in) == SD_EUNSUPPORTED);
    }
    b->n = 0;
    CHECK(parse(b, &in) == SD_ETRUNC);
}

/* A little-endian TIFF block whose IFD0 holds orientation o. */
static void tiff_orient(bytes *b, unsigned o)
{
    put(b, "II", 2); put16le(b, 42); put32le(b, 8);
    put16le(b, 1);
    put16le(b, 0x0112); put16le(b, 3); put32le(b, 1); put16le(b, o); put16le(b, 0);
    put32le(b, 0);
}

/* CRC-32 of PNG chunks, bit by bit. */
static uint32_t crc32_png(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

/* A PNG chunk: length, type, data, CRC. */
static void png_chunk(bytes *b, const char *type, const unsigned char *data, size_t n)
{
    put16be(b, (unsigned)(n >> 16)); put16be(b, (unsigned)(n & 0xFFFF));
    size_t at = b->n;
    put(b, type, 4);
    if (n) put(b, data, n);
    uint32_t c = crc32_png(b->d + at, n + 4);
    put16be(b, c >> 16); put16be(b, c & 0xFFFF);
}

/* EXIF orientation in PNG (eXIf before IDAT) and extended WebP (the EXIF
 * chunk after the image data, found past the first read too), and the
 * first GIF frame where it overhangs the screen (the decoder's canvas),
 * also past the first read and as a decompression bomb. libpng drops an
 * eXIf that starts with the "Exif\0\0" prefix (it wants "II" or "MM"),
 * libwebp's EXIF chunk may carry it. */
static void test_walks(bytes *b)
{
    sd_imginfo in;
    sd_error err;
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
    unsigned char ihdr[13] = {0, 0, 0x0F, 0, 0, 0, 0x08, 0x70, 8, 2, 0, 0, 0}; /* 3840 x 2160 RGB */
    bytes *t = malloc(sizeof *t);
    if (!t) return;
    for (int prefix = 0; prefix < 2; prefix++) {
        b->n = 0;
        put(b, sig, 8);
        png_chunk(b, "IHDR", ihdr, 13);
        png_chunk(b, "tEXt", (const unsigned char *)"Comment\0hello", 13);
        t->n = 0;
        if (prefix) put(t, "Exif\0\0", 6);
        tiff_orient(t, 6);
        png_chunk(b, "eXIf", t->d, t->n);
        png_chunk(b, "IDAT", (const unsigned char *)"\0", 1);
        int o = prefix ? 1 : 6;
        CHECK(parse(b, &in) == SD_OK && in.orientation == o && in.width == 3840 && in.disp_w == (prefix ? 3840 : 2160));
        CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == o);
    }
    /* eXIf after IDAT is not read (libpng and PIL would not either) */
    b->n = 0;
    put(b, sig, 8);
    png_chunk(b, "IHDR", ihdr, 13);
    png_chunk(b, "IDAT", (const unsigned char *)"\0", 1);
    png_chunk(b, "eXIf", t->d, t->n);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 1 && in.disp_w == 3840);
    /* WebP: VP8X, a 60 kB VP8 chunk, then EXIF with orientation 8 */
    for (int prefix = 0; prefix < 2; prefix++) {
        b->n = 0;
        put(b, "RIFF", 4); put32le(b, 0); put(b, "WEBPVP8X", 8); put32le(b, 10); put32le(b, 0x08);
        put16le(b, 1920 - 1); put8(b, 0); put16le(b, 1080 - 1); put8(b, 0);
        put(b, "VP8 ", 4); put32le(b, 60001);
        memset(b->d + b->n, 0, 60002); /* odd size: one pad byte */
        b->n += 60002;
        put(b, "EXIF", 4);
        t->n = 0;
        if (prefix) put(t, "Exif\0\0", 6);
        tiff_orient(t, 8);
        put32le(b, (uint32_t)t->n);
        put(b, t->d, t->n);
        uint32_t riff = (uint32_t)(b->n - 8);
        memcpy(b->d + 4, &riff, 4); /* little-endian host */
        CHECK(parse(b, &in) == SD_OK && in.orientation == 8 && in.disp_w == 1080 && in.disp_h == 1920);
        CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 8 && in.disp_w == 1080);
        b->n -= 20; /* cut in the EXIF payload, before its orientation entry: the size alone */
        CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 1 && in.disp_w == 1920);
    }
    /* GIF: a 256-colour table, 25 kB of comment, then a 400 x 300 frame at (10, 20) on a 320 x 200 screen */
    for (int bomb = 0; bomb < 2; bomb++) {
        b->n = 0;
        put(b, "GIF89a", 6); put16le(b, 320); put16le(b, 200); put8(b, 0xF7); put8(b, 0); put8(b, 0);
        memset(b->d + b->n, 7, 768);
        b->n += 768;
        gif_long_comment(b);
        put8(b, 0x2C); put16le(b, 10); put16le(b, 20); put16le(b, bomb ? 30000 : 400); put16le(b, bomb ? 30000 : 300);
        put8(b, 0); put8(b, 2); put8(b, 0); put8(b, 0x3B);
        if (!bomb) {
            CHECK(parse(b, &in) == SD_OK && in.width == 410 && in.height == 320);
            CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.width == 410 && in.height == 320);
        } else {
            CHECK(parse(b, &in) == SD_ERANGE);
            CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_ERANGE && strstr(err.msg, "30010x30020"));
        }
    }
    /* a frame inside the screen leaves the screen size */
    b->n = 0;
    put(b, "GIF87a", 6); put16le(b, 320); put16le(b, 200); put8(b, 0); put8(b, 0); put8(b, 0);
    put8(b, 0x2C); put16le(b, 0); put16le(b, 0); put16le(b, 100); put16le(b, 50); put8(b, 0);
    CHECK(parse(b, &in) == SD_OK && in.width == 320 && in.height == 200);
    free(t);
}

/* libnsgif (libvips 8.14) ignores a logical screen of a common monitor
 * size, with a zero side or a side over 2048, and sizes the image from the
 * first frame alone; any other screen stands, grown by a first frame that
 * overhangs it. A GIF with no frame is one libvips cannot load. */
static void test_gif_screens(bytes *b)
{
    static const unsigned ignored[][2] = {{640, 480},  {640, 512}, {800, 600}, {1024, 768}, {1280, 1024}, {1600, 1200},
                                          {0, 100},    {100, 0},   {0, 0},     {2049, 100}, {100, 2049},  {3000, 3000}};
    static const unsigned kept[][2] = {{480, 640}, {2048, 2048}, {700, 500}, {640, 481}, {1, 1}, {100, 100}};
    sd_imginfo in;
    sd_error err;
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        gif(b, ignored[i][0], ignored[i][1], 1, 10, 20, 300, 200);
        if (!CHECK(parse(b, &in) == SD_OK && in.width == 310 && in.height == 220))
            fprintf(stderr, "  screen %ux%u gave %ux%u\n", ignored[i][0], ignored[i][1], in.width, in.height);
    }
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        unsigned sw = kept[i][0], sh = kept[i][1];
        gif(b, sw, sh, 1, 0, 0, 300, 200);
        if (!CHECK(parse(b, &in) == SD_OK && in.width == (sw > 300 ? sw : 300) && in.height == (sh > 200 ? sh : 200)))
            fprintf(stderr, "  screen %ux%u gave %ux%u\n", sw, sh, in.width, in.height);
    }
    gif(b, 640, 480, 1, 0, 0, 0, 0); /* an empty frame on an ignored screen: libnsgif's 1x1 start */
    CHECK(parse(b, &in) == SD_OK && in.width == 1 && in.height == 1);
    /* the frame past the first read, behind 25 kB of comment */
    b->n = 0;
    put(b, "GIF89a", 6); put16le(b, 800); put16le(b, 600); put8(b, 0); put8(b, 0); put8(b, 0);
    gif_long_comment(b);
    put8(b, 0x2C); put16le(b, 0); put16le(b, 0); put16le(b, 400); put16le(b, 300); put8(b, 0); put8(b, 2); put8(b, 0);
    put8(b, 0x3B);
    CHECK(parse(b, &in) == SD_OK && in.width == 400 && in.height == 300);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.width == 400 && in.height == 300);
    /* no frame: the trailer first (libvips: no frames), or the file ends */
    gif(b, 320, 200, 0, 0, 0, 0, 0);
    CHECK(parse(b, &in) == SD_EFORMAT);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_EFORMAT && strstr(err.msg, "gif: no image"));
    b->n--;
    CHECK(parse(b, &in) == SD_ETRUNC);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_ETRUNC && strstr(err.msg, "ends before its first image"));
}

/* One IFD0 entry: tag, type, count and the 4-byte value field (little-endian). */
typedef struct {
    unsigned tag, type;
    uint32_t count, value;
} ifd_entry;

/* A little-endian TIFF block whose IFD0 holds the entries, then `extra`
 * (values stored out of line start at offset 14 + 12 n). */
static void tiff_entries(bytes *t, const ifd_entry *e, int n, const void *extra, size_t extra_n)
{
    t->n = 0;
    put(t, "II", 2); put16le(t, 42); put32le(t, 8); put16le(t, (unsigned)n);
    for (int i = 0; i < n; i++) {
        put16le(t, e[i].tag); put16le(t, e[i].type); put32le(t, e[i].count); put32le(t, e[i].value);
    }
    put32le(t, 0);
    if (extra_n) put(t, extra, extra_n);
}

/* An APP1 segment: "Exif\0\0" (when `prefix`) and the TIFF block t. */
static void app1(bytes *b, int prefix, const bytes *t)
{
    put8(b, 0xFF); put8(b, 0xE1); put16be(b, (unsigned)(2 + (prefix ? 6 : 0) + t->n));
    if (prefix) put(b, "Exif\0\0", 6);
    put(b, t->d, t->n);
}

/* A 1000 x 500 baseline JPEG: SOI, JFIF, `before`, SOF0, `after`, SOS
 * (before and after: raw segment bytes, or NULL). */
static void jpeg_around_sof(bytes *b, const bytes *before, const bytes *after)
{
    b->n = 0;
    put8(b, 0xFF); put8(b, 0xD8);
    put8(b, 0xFF); put8(b, 0xE0); put16be(b, 16); put(b, "JFIF\0\1\1\0\0\1\0\1\0\0", 14);
    if (before) put(b, before->d, before->n);
    put8(b, 0xFF); put8(b, 0xC0); put16be(b, 17); put8(b, 8); put16be(b, 500); put16be(b, 1000); put8(b, 3);
    for (int i = 0; i < 9; i++) put8(b, 0x11);
    if (after) put(b, after->d, after->n);
    put8(b, 0xFF); put8(b, 0xDA); put16be(b, 8); put(b, "\3\1\0\2\0\0", 6);
}

/* The orientation sd_imghdr_parse finds in a JPEG whose Exif APP1 holds
 * these IFD0 entries and extra bytes. */
static int jpeg_orientation(bytes *b, bytes *t, bytes *seg, const ifd_entry *e, int n, const void *extra,
                            size_t extra_n)
{
    sd_imginfo in;
    tiff_entries(t, e, n, extra, extra_n);
    seg->n = 0;
    app1(seg, 1, t);
    jpeg_around_sof(b, seg, NULL);
    return parse(b, &in) == SD_OK ? in.orientation : -1;
}

/* The orientation libvips 8.14 applies (libexif 0.6.24 loads IFD0, libvips
 * reads its value), checked against libvips on each of these layouts:
 * libexif drops an entry with no values or values past the block, converts
 * BYTE, SBYTE, SSHORT, LONG and SLONG to SHORT, keeps the first entry of a
 * tag and stops at a pointer past the block; libvips reads fewer than 10
 * values (the first), a RATIONAL's numerator and an ASCII number. */
static void test_exif_entries(bytes *b)
{
    static const struct {
        ifd_entry e;
        int want;
    } one[] = {
        {{0x0112, 3, 1, 6}, 6},          {{0x0112, 3, 2, 6 | 3u << 16}, 6}, {{0x0112, 3, 0, 6}, 1},
        {{0x0112, 3, 0xFF0001, 6}, 1},   {{0x0112, 3, 1, 99}, 1},           {{0x0112, 3, 1, 0}, 1},
        {{0x0112, 1, 1, 6}, 6},          {{0x0112, 6, 1, 6}, 6},            {{0x0112, 8, 1, 6}, 6},
        {{0x0112, 4, 1, 0x10006}, 6},    {{0x0112, 9, 1, 6}, 6},            {{0x0112, 2, 2, '6'}, 6},
        {{0x0112, 7, 1, 6}, 1},          {{0x0112, 11, 1, 0x40C00000}, 1},  {{0x0112, 13, 1, 6}, 1},
        {{0x0112, 8, 1, 0xFFFF}, 1},     {{0x0112, 6, 1, 0x86}, 1},
    };
    bytes *t = malloc(sizeof *t), *seg = malloc(sizeof *seg);
    if (!t || !seg) {
        free(t);
        free(seg);
        return;
    }
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        int o = jpeg_orientation(b, t, seg, &one[i].e, 1, NULL, 0);
        if (!CHECK(o == one[i].want))
            fprintf(stderr, "  type %u count %u value 0x%x: orientation %d, want %d\n", one[i].e.type, one[i].e.count,
                    one[i].e.value, o, one[i].want);
    }
    /* out of line, at offset 26: 9 SHORTs (the first counts), 10 (none
     * does), a RATIONAL 6/1, ASCII numbers libvips atoi()s */
    unsigned char v[40];
    for (int i = 0; i < 10; i++) { v[2 * i] = 6; v[2 * i + 1] = 0; }
    ifd_entry e = {0x0112, 3, 9, 26};
    CHECK(jpeg_orientation(b, t, seg, &e, 1, v, 20) == 6);
    e.count = 10;
    CHECK(jpeg_orientation(b, t, seg, &e, 1, v, 20) == 1);
    e = (ifd_entry){0x0112, 5, 1, 26};
    CHECK(jpeg_orientation(b, t, seg, &e, 1, "\6\0\0\0\1\0\0\0", 8) == 6);
    e = (ifd_entry){0x0112, 2, 6, 26};
    CHECK(jpeg_orientation(b, t, seg, &e, 1, " +7 x", 6) == 7);
    e.count = 11; /* 2^32 + 6: atoi keeps the low 32 bits */
    CHECK(jpeg_orientation(b, t, seg, &e, 1, "4294967302", 11) == 6);
    e = (ifd_entry){0x0112, 3, 3, 2600}; /* values past the block */
    CHECK(jpeg_orientation(b, t, seg, &e, 1, v, 20) == 1);
    /* two entries: a dropped one lets the next count, a kept one wins */
    ifd_entry two[2] = {{0x0112, 3, 0, 3}, {0x0112, 3, 1, 6}};
    CHECK(jpeg_orientation(b, t, seg, two, 2, NULL, 0) == 6);
    two[0].count = 1;
    CHECK(jpeg_orientation(b, t, seg, two, 2, NULL, 0) == 3);
    /* an Exif IFD pointer past the block ends IFD0; one inside does not */
    two[0] = (ifd_entry){0x8769, 4, 1, 99999};
    CHECK(jpeg_orientation(b, t, seg, two, 2, NULL, 0) == 1);
    two[0].value = 8;
    CHECK(jpeg_orientation(b, t, seg, two, 2, NULL, 0) == 6);
    free(t);
    free(seg);
}

/* libvips reads the first APP1 that starts "Exif" (payload over 4 bytes),
 * also one after the frame header (libjpeg reads markers up to the scan),
 * and never one after the scan starts; here also past the first read. */
static void test_jpeg_exif_place(bytes *b)
{
    sd_imginfo in;
    sd_error err;
    bytes *t = malloc(sizeof *t), *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    if (!t || !before || !after) {
        free(t);
        free(before);
        free(after);
        return;
    }
    ifd_entry e = {0x0112, 3, 1, 6};
    tiff_entries(t, &e, 1, NULL, 0);
    after->n = 0;
    app1(after, 1, t);
    jpeg_around_sof(b, NULL, after);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 6 && in.width == 1000 && in.disp_w == 500);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 6);
    e.value = 3; /* one before the frame wins */
    tiff_entries(t, &e, 1, NULL, 0);
    before->n = 0;
    app1(before, 1, t);
    jpeg_around_sof(b, before, after);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 3);
    /* a first "Exif" APP1 libexif cannot read (a bad header, too short)
     * hides a later good one */
    for (int k = 0; k < 2; k++) {
        before->n = 0;
        put8(before, 0xFF); put8(before, 0xE1);
        if (k == 0) { put16be(before, 2 + 14); put(before, "Exif\0XII*\0\10\0\0\0", 14); }
        else { put16be(before, 2 + 10); put(before, "Exif\0\0II*\0", 10); }
        put(before, after->d, after->n);
        jpeg_around_sof(b, before, NULL);
        CHECK(parse(b, &in) == SD_OK && in.orientation == 1);
    }
    before->n = 0; /* "Exif" alone (4 bytes) is not taken for Exif */
    put8(before, 0xFF); put8(before, 0xE1); put16be(before, 6); put(before, "Exif", 4);
    put(before, after->d, after->n);
    jpeg_around_sof(b, before, NULL);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 6);
    /* 20 kB of APP2 between the frame header and the Exif: past the first read */
    bytes *big = before;
    big->n = 0;
    put8(big, 0xFF); put8(big, 0xE2); put16be(big, 20002);
    memset(big->d + big->n, 0xAB, 20000);
    big->n += 20000;
    put(big, after->d, after->n);
    jpeg_around_sof(b, NULL, big);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 6 && in.disp_w == 500);
    b->n -= 10; /* the file cut in the scan header: the frame size and that Exif */
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 6 && in.width == 1000);
    /* after the scan starts: not read */
    jpeg_around_sof(b, NULL, NULL);
    put(b, after->d, after->n);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 1);
    free(t);
    free(before);
    free(after);
}

/* libpng keeps the first eXIf before IDAT whose CRC is good and that starts
 * "II" or "MM"; one it drops (with a warning) lets a later one count. */
static void test_png_exif_kept(bytes *b)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
    static const unsigned char ihdr[13] = {0, 0, 0x0F, 0, 0, 0, 0x08, 0x70, 8, 2, 0, 0, 0}; /* 3840 x 2160 */
    sd_imginfo in;
    sd_error err;
    bytes *t3 = malloc(sizeof *t3), *t6 = malloc(sizeof *t6);
    if (!t3 || !t6) {
        free(t3);
        free(t6);
        return;
    }
    t3->n = t6->n = 0;
    tiff_orient(t3, 3);
    tiff_orient(t6, 6);
    for (int bad = 0; bad < 3; bad++) { /* 0: good, 1: bad CRC, 2: byte order "IM" */
        b->n = 0;
        put(b, sig, 8);
        png_chunk(b, "IHDR", ihdr, 13);
        if (bad == 2) t3->d[1] = 'M';
        png_chunk(b, "eXIf", t3->d, t3->n);
        t3->d[1] = 'I';
        if (bad == 1) b->d[b->n - 1] ^= 1;
        png_chunk(b, "eXIf", t6->d, t6->n);
        png_chunk(b, "IDAT", (const unsigned char *)"\0", 1);
        int want = bad ? 6 : 3;
        CHECK(parse(b, &in) == SD_OK && in.orientation == want);
        CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == want);
    }
    /* one eXIf with a bad CRC, past the first read: dropped */
    b->n = 0;
    put(b, sig, 8);
    png_chunk(b, "IHDR", ihdr, 13);
    memset(t3->d, 'x', 20000);
    memcpy(t3->d, "Comment\0", 8);
    png_chunk(b, "tEXt", t3->d, 20000);
    png_chunk(b, "eXIf", t6->d, t6->n);
    png_chunk(b, "IDAT", (const unsigned char *)"\0", 1);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 6);
    b->d[b->n - 13 - 1] ^= 1; /* the eXIf CRC, before the 13-byte IDAT */
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 1);
    CHECK(parse(b, &in) == SD_OK && in.orientation == 1);
    free(t3);
    free(t6);
}

/* Write b to a temp file and read its size through the fd path. */
static sd_status via_file(const bytes *b, uint64_t off, uint64_t size, sd_imginfo *in, sd_error *err)
{
    char path[] = "/tmp/sdtk_imghdr_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return SD_EIO;
    unlink(path);
    if (write(fd, b->d, b->n) != (ssize_t)b->n) {
        close(fd);
        return SD_EIO;
    }
    sd_status st = sd_imghdr_read_fd(fd, off, size, in, err);
    close(fd);
    return st;
}

static void test_files(bytes *b)
{
    sd_imginfo in;
    sd_error err;
    /* APP segments of 300 KB before the frame: found by growing the read */
    b->n = 0;
    put8(b, 0xFF); put8(b, 0xD8);
    for (int i = 0; i < 5; i++) {
        put8(b, 0xFF); put8(b, 0xE2); put16be(b, 60000);
        memset(b->d + b->n, 0xAB, 59998);
        b->n += 59998;
    }
    put8(b, 0xFF); put8(b, 0xC0); put16be(b, 17); put8(b, 8); put16be(b, 1080); put16be(b, 1920); put8(b, 3);
    memset(b->d + b->n, 0, 100);
    b->n += 100;
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.width == 1920 && in.height == 1080);
    /* 1.2 MB of them (Photoshop XMP does this): walked by seeking, not read */
    b->n = 2;
    for (int i = 0; i < 20; i++) {
        put8(b, 0xFF); put8(b, 0xE2); put16be(b, 60000);
        memset(b->d + b->n, 0xAB, 59998);
        b->n += 59998;
    }
    put8(b, 0xFF); put8(b, 0xC0); put16be(b, 17); put8(b, 8); put16be(b, 1080); put16be(b, 1920); put8(b, 3);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.width == 1920);
    /* cut inside the frame header, and inside a skipped segment */
    size_t whole = b->n;
    b->n = whole - 3;
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_ETRUNC);
    b->n = 700001;
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_ETRUNC);
    /* an Exif APP1 beyond the first read still sets the orientation */
    b->n = 2;
    for (int i = 0; i < 3; i++) {
        put8(b, 0xFF); put8(b, 0xE2); put16be(b, 60000);
        memset(b->d + b->n, 0xAB, 59998);
        b->n += 59998;
    }
    exif(b, 1, 6);
    put8(b, 0xFF); put8(b, 0xC0); put16be(b, 17); put8(b, 8); put16be(b, 1080); put16be(b, 1920); put8(b, 3);
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 6 && in.disp_w == 1080);
    /* a file cut short of the frame header */
    b->n = 100000;
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_ETRUNC);
    /* a member at an offset inside a bigger file (tar-like), bounded by size */
    jpeg(b, 0xC0, 1000, 700, 2, 6);
    size_t jn = b->n;
    memmove(b->d + 1536, b->d, jn);
    memset(b->d, 'x', 1536);
    b->n = 1536 + jn + 512;
    memset(b->d + 1536 + jn, 0, 512);
    CHECK(via_file(b, 1536, jn, &in, &err) == SD_OK && in.width == 1000 && in.disp_w == 700);
    CHECK(via_file(b, 1536, 20, &in, &err) == SD_ETRUNC);
    CHECK(via_file(b, 0, jn, &in, &err) == SD_EUNSUPPORTED); /* wrong offset: 'xxx' */
    b->n = 0;
    CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_ETRUNC);
    CHECK(sd_imghdr_read_file("/nonexistent/sdtk.jpg", &in, &err) == SD_ENOTFOUND);
}

int main(void)
{
    bytes *b = malloc(sizeof *b);
    if (!b) return 1;
    test_jpeg(b);
    test_png(b);
    test_webp_gif_bmp(b);
    test_files(b);
    test_walks(b);
    test_gif_screens(b);
    test_exif_entries(b);
    test_jpeg_exif_place(b);
    test_png_exif_kept(b);
    free(b);
    return check_done("test_imghdr");
}
