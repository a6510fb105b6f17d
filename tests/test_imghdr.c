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

/* An APP1 Exif segment with IFD0 holding an orientation tag (and one other
 * tag before it), in big- or little-endian TIFF order. */
static void exif(bytes *b, int little, unsigned orientation)
{
    put8(b, 0xFF);
    put8(b, 0xE1);
    put16be(b, 2 + 6 + 8 + 2 + 24 + 4);
    put(b, "Exif\0\0", 6);
    void (*p16)(bytes *, unsigned) = little ? put16le : put16be;
    put(b, little ? "II" : "MM", 2);
    p16(b, 42);
    if (little) put32le(b, 8);
    else { put16be(b, 0); put16be(b, 8); }
    p16(b, 2); /* two entries */
    p16(b, 0x010F); p16(b, 2); p16(b, 0); p16(b, 4); p16(b, 0); p16(b, 0); /* Make, ASCII, ignored */
    p16(b, 0x0112); p16(b, 3); p16(b, 0); p16(b, 1); p16(b, orientation); p16(b, 0);
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

    b->n = 0;
    put(b, "GIF89a", 6); put16le(b, 320); put16le(b, 200);
    CHECK(parse(b, &in) == SD_OK && in.format == SD_IMG_GIF && in.width == 320 && in.height == 200);
    b->n = 0;
    put(b, "GIF87a", 6); put16le(b, 0); put16le(b, 200);
    CHECK(parse(b, &in) == SD_ERANGE);

    b->n = 0; /* BITMAPINFOHEADER, top-down (negative height) */
    put(b, "BM", 2); put32le(b, 0); put32le(b, 0); put32le(b, 54); put32le(b, 40); put32le(b, 640); put32le(b, (uint32_t)-480);
    CHECK(parse(b, &in) == SD_OK && in.format == SD_IMG_BMP && in.width == 640 && in.height == 480);

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

static sd_status via_file(const bytes *b, uint64_t off, uint64_t size, sd_imginfo *in, sd_error *err);

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
 * also past the first read and as a decompression bomb. */
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
        CHECK(parse(b, &in) == SD_OK && in.orientation == 6 && in.width == 3840 && in.disp_w == 2160 &&
              in.disp_h == 3840);
        CHECK(via_file(b, 0, UINT64_MAX, &in, &err) == SD_OK && in.orientation == 6 && in.disp_w == 2160);
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
        put8(b, 0x21); put8(b, 0xFE);
        for (int i = 0; i < 100; i++) {
            put8(b, 255);
            memset(b->d + b->n, 'c', 255);
            b->n += 255;
        }
        put8(b, 0);
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
    free(b);
    return check_done("test_imghdr");
}
