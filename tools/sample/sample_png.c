/* sd-sample's output images: PNG written here with libdeflate (already a
 * dependency through libcore/image) and our own chunk writer, so the bytes
 * depend only on the pixels and the text (same seed, same file, whatever
 * libvips version is installed) and the `parameters` chunk is exactly the
 * tEXt / iTXt chunk PIL writes for A1111. Also A1111's infotext and the
 * contact sheet. */
#include <libdeflate.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sample.h"

/* A1111's quote(): values holding ',', ':' or a newline become JSON
 * strings (json.dumps with ensure_ascii off), others stay as they are. */
static void put_value(sd_buf *b, const char *v)
{
    if (strpbrk(v, ",:\n")) sd_buf_json_cstr(b, v);
    else sd_buf_puts(b, v);
}

/* The sampler as A1111 names it (and its schedule type, Karras). */
static const char *a1111_sampler(sd_sampler_kind k, const char **schedule)
{
    *schedule = NULL;
    switch (k) {
    case SD_SAMPLER_DDIM: return "DDIM";
    case SD_SAMPLER_EULER: return "Euler";
    case SD_SAMPLER_EULER_A: return "Euler a";
    case SD_SAMPLER_DPMPP_2M: return "DPM++ 2M";
    case SD_SAMPLER_DPMPP_2M_KARRAS: *schedule = "Karras"; return "DPM++ 2M";
    }
    return "?";
}

/* Whether c is whitespace as Python's str.strip() sees it (ASCII part). */
static int py_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A1111's create_infotext for one image: the prompt, "Negative prompt:"
 * when there is one, then "Key: value" pairs joined by ", ", the whole
 * stripped of surrounding whitespace. CFG scale is written as Python's
 * str of the number would be for a whole or short value (7, 7.5). */
void sample_infotext(const sample_job *j, int width, int height, const char *model_name, sd_buf *b)
{
    sd_buf t;
    sd_buf_init(&t);
    const char *sched;
    const char *sampler = a1111_sampler(j->sampler, &sched);
    sd_buf_puts(&t, j->prompt);
    if (j->negative[0]) sd_buf_printf(&t, "\nNegative prompt: %s", j->negative);
    sd_buf_printf(&t, "\nSteps: %d, Sampler: ", j->steps);
    put_value(&t, sampler);
    if (sched) sd_buf_printf(&t, ", Schedule type: %s", sched);
    sd_buf_printf(&t, ", CFG scale: %.15g, Seed: %llu, Size: %dx%d", j->cfg, (unsigned long long)j->seed, width, height);
    if (model_name && model_name[0]) {
        sd_buf_puts(&t, ", Model: ");
        put_value(&t, model_name);
    }
    sd_buf_printf(&t, ", Version: sdtk %s", sd_version());
    size_t s = 0, e = t.len;
    while (s < e && py_space(t.data[s])) s++;
    while (e > s && py_space(t.data[e - 1])) e--;
    sd_buf_put(b, t.data + s, e - s);
    sd_buf_free(&t);
}

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

/* Encode an 8-bit RGB PNG with one text chunk (see sample.h). */
sd_status sample_png_encode(const uint8_t *rgb, int w, int h, const char *key, const char *text, sd_buf *out,
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

/* A grid of the images (see sample.h). */
sd_status sample_contact_sheet(int n, uint8_t *const *rgb, const int *w, const int *h, uint8_t **sheet, int *sw,
                               int *sh, sd_error *err)
{
    int cols = 1, cw = 8, ch = 8;
    while (cols * cols < n) cols++;
    int rows = n > 0 ? (n + cols - 1) / cols : 1;
    for (int i = 0; i < n; i++) {
        if (w[i] > cw) cw = w[i];
        if (h[i] > ch) ch = h[i];
    }
    if ((double)cw * cols * ch * rows * 3 > 1.5e9)
        return sd_err_set(err, SD_ERANGE, "contact sheet of %d images of up to %dx%d is too large", n, cw, ch);
    *sw = cw * cols;
    *sh = ch * rows;
    size_t stride = (size_t)*sw * 3;
    *sheet = malloc(stride * (size_t)*sh);
    if (!*sheet) return sd_err_set(err, SD_ENOMEM, "out of memory for the contact sheet");
    memset(*sheet, 32, stride * (size_t)*sh);
    for (int i = 0; i < n; i++) {
        if (!rgb[i]) continue; /* a failed image stays dark */
        int x0 = (i % cols) * cw, y0 = (i / cols) * ch;
        for (int y = 0; y < h[i]; y++)
            memcpy(*sheet + (size_t)(y0 + y) * stride + (size_t)x0 * 3, rgb[i] + (size_t)y * (size_t)w[i] * 3,
                   (size_t)w[i] * 3);
    }
    return SD_OK;
}
