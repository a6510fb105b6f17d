/* PNG files written here with libdeflate and our own chunk writer, so the
 * bytes depend only on the pixels and the text (same pixels, same file,
 * whatever libvips version is installed), and a text chunk is exactly the
 * tEXt / iTXt chunk PIL writes (A1111's `parameters`). sd-sample's and
 * sd-train's sample images. */
#include "png_write.h"

#include <libdeflate.h>
#include <stdlib.h>
#include <string.h>

/* Append a 32-bit big-endian number. */
static void put_be32(sd_buf *b, uint32_t v)
{
    unsigned char c[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    sd_buf_put(b, c, 4);
}

/* One chunk: length, type, data, CRC of type and data. */
static void put_chunk(sd_buf *b, const char *type, const void *data, size_t len)
{
    put_be32(b, (uint32_t)len);
    size_t at = b->len;
    sd_buf_put(b, type, 4);
    if (len) sd_buf_put(b, data, len);
    if (b->oom) return;
    put_be32(b, (uint32_t)libdeflate_crc32(0, b->data + at, len + 4));
}

/* text as Latin-1 into out when every character fits (PIL's tEXt case);
 * 0 on success, -1 when it needs iTXt (or is not UTF-8). */
static int to_latin1(const char *text, sd_buf *out)
{
    const unsigned char *p = (const unsigned char *)text;
    while (*p) {
        if (*p < 0x80) {
            sd_buf_putc(out, (char)*p++);
        } else if ((p[0] == 0xC2 || p[0] == 0xC3) && (p[1] & 0xC0) == 0x80) {
            sd_buf_putc(out, (char)(((p[0] & 0x1F) << 6) | (p[1] & 0x3F)));
            p += 2;
        } else {
            return -1;
        }
    }
    return 0;
}

/* The text chunk: tEXt (key, NUL, Latin-1 text) or iTXt (key, NUL,
 * uncompressed, no language or translated key, UTF-8 text). */
static void put_text_chunk(sd_buf *png, const char *key, const char *text)
{
    sd_buf c;
    sd_buf_init(&c);
    sd_buf_puts(&c, key);
    sd_buf_putc(&c, 0);
    size_t head = c.len;
    if (!to_latin1(text, &c)) {
        put_chunk(png, "tEXt", c.data, c.len);
    } else {
        c.len = head;
        sd_buf_put(&c, "\0\0\0\0", 4); /* flag, method, language "", translated key "" */
        sd_buf_puts(&c, text);
        put_chunk(png, "iTXt", c.data, c.len);
    }
    if (c.oom) png->oom = 1;
    sd_buf_free(&c);
}

/* Rows with PNG's Sub filter (each byte minus the one 3 to its left):
 * cheap and much smaller than none on smooth images. */
static void filter_rows(const uint8_t *rgb, int w, int h, uint8_t *raw)
{
    size_t stride = (size_t)w * 3;
    for (int y = 0; y < h; y++) {
        const uint8_t *s = rgb + (size_t)y * stride;
        uint8_t *d = raw + (size_t)y * (stride + 1);
        d[0] = 1;
        for (size_t x = 0; x < stride; x++) d[1 + x] = (uint8_t)(s[x] - (x >= 3 ? s[x - 3] : 0));
    }
}

/* Encode an 8-bit RGB PNG with one text chunk (see png_write.h). */
sd_status sd_png_encode(const uint8_t *rgb, int w, int h, const char *key, const char *text, sd_buf *out,
                            sd_error *err)
{
    if (w < 1 || h < 1) return sd_err_set(err, SD_EINVAL, "PNG of %dx%d pixels", w, h);
    size_t rawlen = ((size_t)w * 3 + 1) * (size_t)h;
    uint8_t *raw = malloc(rawlen);
    struct libdeflate_compressor *c = libdeflate_alloc_compressor(6);
    size_t bound = c ? libdeflate_zlib_compress_bound(c, rawlen) : 0;
    uint8_t *z = bound ? malloc(bound) : NULL;
    sd_status st = SD_OK;
    if (!raw || !c || !z) {
        st = sd_err_set(err, SD_ENOMEM, "out of memory for a %dx%d PNG", w, h);
    } else {
        filter_rows(rgb, w, h, raw);
        size_t zl = libdeflate_zlib_compress(c, raw, rawlen, z, bound);
        static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
        unsigned char ihdr[13] = {0};
        for (int i = 0; i < 4; i++) {
            ihdr[i] = (unsigned char)((uint32_t)w >> (24 - 8 * i));
            ihdr[4 + i] = (unsigned char)((uint32_t)h >> (24 - 8 * i));
        }
        ihdr[8] = 8; /* bit depth */
        ihdr[9] = 2; /* truecolour */
        sd_buf_clear(out);
        sd_buf_put(out, sig, sizeof sig);
        put_chunk(out, "IHDR", ihdr, sizeof ihdr);
        if (key && text) put_text_chunk(out, key, text);
        put_chunk(out, "IDAT", z, zl);
        put_chunk(out, "IEND", NULL, 0);
        if (!zl || out->oom) st = sd_err_set(err, SD_ENOMEM, "out of memory for a %dx%d PNG", w, h);
    }
    libdeflate_free_compressor(c);
    free(z);
    free(raw);
    return st;
}

