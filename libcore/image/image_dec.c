/* Direct decoders for the three formats that make up nearly all training
 * data, each feeding the area resizer row by row so no full-size RGB image
 * is ever built:
 * - JPEG through libjpeg-turbo, decoded at the smallest DCT scale (1/8, 1/4,
 *   1/2) still at least the resize size on both sides;
 * - PNG (8-bit grey, grey + alpha, RGB, RGBA, not interlaced) inflated in one
 *   call by libdeflate, rows unfiltered here (two Paeth rows at once where
 *   the CPU has AVX2);
 * - WebP through libwebp, scaled on decode straight to the resize size (its
 *   rescaler is an area average too), on the calling thread.
 * Anything else (other formats, EXIF rotation, CMYK, palettes, 16-bit,
 * transparency keys, animation, upscales, alpha under a profile that is not
 * sRGB) and any complaint by a decoder,
 * warnings included, is declined: libvips then decodes the file and decides
 * what is an error, so broken files behave exactly as before. */
#include "image_int.h"
#include "image_jpeg.h"

#include <jerror.h> /* the JWRN_* warning codes */

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libdeflate.h>
#include <webp/decode.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* ---- JPEG ---- */

/* The warnings libjpeg gives for damaged entropy-coded data: the image
 * decodes anyway, with grey or smeared blocks (libvips passes it on with a
 * warning, PIL silently), which would go into the latents as a good
 * sample. */
int sd_jpeg_warning_is_corrupt(int msg_code)
{
    return msg_code == JWRN_HUFF_BAD_CODE || msg_code == JWRN_MUST_RESYNC || msg_code == JWRN_HIT_MARKER ||
           msg_code == JWRN_BOGUS_PROGRESSION || msg_code == JWRN_NOT_SEQUENTIAL || msg_code == JWRN_JPEG_EOF;
}

/* libjpeg's fatal errors must not return: jump back to the decoder, its
 * text kept. */
static void jpeg_on_error(j_common_ptr c)
{
    sd_jpeg_fail *f = (sd_jpeg_fail *)c->err;
    c->err->format_message(c, f->msg);
    longjmp(f->jump, 1);
}

/* Warnings end the fast path as well: damaged data is refused by the
 * caller, anything else (extra bytes before a marker) goes to libvips with
 * fail_on=truncated. Trace messages are ignored. */
static void jpeg_on_message(j_common_ptr c, int level)
{
    if (level >= 0) return;
    sd_jpeg_fail *f = (sd_jpeg_fail *)c->err;
    f->corrupt = sd_jpeg_warning_is_corrupt(c->err->msg_code);
    if (!f->corrupt && f->only_damage) return;
    c->err->format_message(c, f->msg);
    longjmp(f->jump, 1);
}

/* The error manager both JPEG readers use (image_jpeg.h). */
void sd_jpeg_fail_init(struct jpeg_decompress_struct *c, sd_jpeg_fail *f)
{
    c->err = jpeg_std_error(&f->pub);
    f->pub.error_exit = jpeg_on_error;
    f->pub.emit_message = jpeg_on_message;
    f->corrupt = 0;
    f->only_damage = 0;
    f->msg[0] = 0;
}

/* The DCT scale: the largest 1/d (d = 8, 4, 2, 1) whose output, rounded up
 * as libjpeg does, still covers the resize size on both sides (shared with
 * bench_decode, whose decoder floor must decode at the same scale). */
int sd_jpeg_denom(unsigned w, unsigned h, const sd_image_plan *p)
{
    for (unsigned d = 8; d > 1; d /= 2)
        if ((w + d - 1) / d >= (unsigned)p->resize_w && (h + d - 1) / d >= (unsigned)p->resize_h) return (int)d;
    return 1;
}

/* Decode + shrink a baseline or progressive 8-bit YCbCr/RGB/grey JPEG with
 * no EXIF rotation; the ICC profile of a colour image goes to the caller. */
sd_fast sd_fast_jpeg(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                     unsigned char *out, unsigned char **icc, size_t *icc_len, char *why)
{
    if (info->format != SD_IMG_JPEG || info->orientation != 1) return SD_FAST_DECLINE;
    if (info->width < (uint32_t)plan->resize_w || info->height < (uint32_t)plan->resize_h) return SD_FAST_DECLINE;
    struct jpeg_decompress_struct c;
    sd_jpeg_fail fail;
    sd_area *volatile area = NULL;
    unsigned char *volatile rows = NULL;
    JOCTET *volatile prof = NULL;
    sd_jpeg_fail_init(&c, &fail);
    if (setjmp(fail.jump)) {
        jpeg_destroy_decompress(&c);
        sd_area_free(area);
        free(rows);
        free(prof);
        if (!fail.corrupt) return SD_FAST_DECLINE;
        snprintf(why, SD_FAST_WHY_MAX, "%s", fail.msg);
        return SD_FAST_CORRUPT;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, buf, (unsigned long)len);
    jpeg_save_markers(&c, JPEG_APP0 + 2, 0xFFFF);
    jpeg_read_header(&c, TRUE);
    int chan;
    if (c.num_components == 3 && (c.jpeg_color_space == JCS_YCbCr || c.jpeg_color_space == JCS_RGB)) {
        c.out_color_space = JCS_RGB;
        chan = 3;
    } else if (c.num_components == 1 && c.jpeg_color_space == JCS_GRAYSCALE) {
        c.out_color_space = JCS_GRAYSCALE;
        chan = 1;
    } else {
        longjmp(fail.jump, 1); /* CMYK, YCCK, odd component counts */
    }
    if (chan == 3) {
        JOCTET *p = NULL;
        unsigned int n = 0;
        if (jpeg_read_icc_profile(&c, &p, &n)) {
            prof = p;
            *icc_len = n;
        }
    }
    c.scale_num = 1;
    c.scale_denom = (unsigned)sd_jpeg_denom(c.image_width, c.image_height, plan);
    jpeg_start_decompress(&c);
    if (c.output_components != chan) longjmp(fail.jump, 1);
    area = sd_area_new((int)c.output_width, (int)c.output_height, chan, plan, out);
    size_t stride = (size_t)c.output_width * chan;
    int nrows = c.rec_outbuf_height > 0 && c.rec_outbuf_height <= 16 ? c.rec_outbuf_height : 1;
    rows = malloc(stride * nrows + 16);
    if (!area || !rows) longjmp(fail.jump, 1);
    /* every row is decoded, even past the crop, so truncation is always seen */
    while (c.output_scanline < c.output_height) {
        JSAMPROW rp[16];
        for (int i = 0; i < nrows; i++) rp[i] = rows + stride * i;
        JDIMENSION got = jpeg_read_scanlines(&c, rp, (JDIMENSION)nrows);
        for (JDIMENSION i = 0; i < got; i++) sd_area_push(area, rows + stride * i);
    }
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    sd_area_free(area);
    free(rows);
    *icc = prof;
    return SD_FAST_DONE;
}

/* The scanlines libjpeg hands out per call (its rec_outbuf_height, 1..16). */
static int drain_rows(const struct jpeg_decompress_struct *c)
{
    return c->rec_outbuf_height > 0 && c->rec_outbuf_height <= 16 ? c->rec_outbuf_height : 1;
}

/* See image_jpeg.h. */
size_t sd_jpeg_drain_bytes(const struct jpeg_decompress_struct *c)
{
    return (size_t)c->output_width * (size_t)c->output_components * (size_t)drain_rows(c) + 16;
}

/* See image_jpeg.h. */
void sd_jpeg_drain(struct jpeg_decompress_struct *c, unsigned char *rows)
{
    size_t stride = (size_t)c->output_width * (size_t)c->output_components;
    int nrows = drain_rows(c);
    while (c->output_scanline < c->output_height) {
        JSAMPROW rp[16];
        for (int i = 0; i < nrows; i++) rp[i] = rows + stride * (size_t)i;
        jpeg_read_scanlines(c, rp, (JDIMENSION)nrows);
    }
}

/* For a JPEG the direct decoder declined (EXIF rotation, CMYK, an upscale,
 * a harmless warning): libvips would decode damaged scan data grey or
 * smeared and pass it on, so every scan is entropy-decoded here first, at
 * the 1/8 DCT scale (the Huffman work of a full decode, little else).
 * SD_FAST_CORRUPT with libjpeg's message when the data is damaged;
 * SD_FAST_DECLINE otherwise, fatal errors included (libvips reports those). */
sd_fast sd_jpeg_scan_check(const unsigned char *buf, size_t len, char *why)
{
    struct jpeg_decompress_struct c;
    sd_jpeg_fail fail;
    unsigned char *volatile rows = NULL;
    sd_jpeg_fail_init(&c, &fail);
    fail.only_damage = 1;
    if (setjmp(fail.jump)) {
        jpeg_destroy_decompress(&c);
        free(rows);
        if (!fail.corrupt) return SD_FAST_DECLINE;
        snprintf(why, SD_FAST_WHY_MAX, "%s", fail.msg);
        return SD_FAST_CORRUPT;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, buf, (unsigned long)len);
    jpeg_read_header(&c, TRUE);
    c.scale_num = 1;
    c.scale_denom = 8;
    c.dct_method = JDCT_IFAST;
    c.do_fancy_upsampling = FALSE;
    jpeg_start_decompress(&c);
    rows = malloc(sd_jpeg_drain_bytes(&c));
    if (!rows) longjmp(fail.jump, 1);
    sd_jpeg_drain(&c, rows);
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    free(rows);
    return SD_FAST_DECLINE;
}

/* ---- PNG ---- */

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* Largest inflated PNG taken here (512 MiB); bigger ones stream through libvips. */
#define PNG_MAX_RAW (512ULL << 20)
/* Largest ICC profile inflated (libpng's default chunk limit is 8 MB). */
#define PNG_MAX_ICC (8u << 20)

/* Per-thread buffers, reused from image to image: a fresh allocation of tens
 * of megabytes is a fresh mmap, and on this kind of VM its page faults cost
 * about as much as decoding into it (a 15-megapixel RGBA PNG inflates to
 * 60 MB). A buffer grows to at least twice its size, so a run of growing
 * images settles after a few; one over its slot's limit is given back after
 * the image. sd_fast_thread_done() releases them. */
static _Thread_local unsigned char *scratch[SD_SCRATCH_SLOTS];
static _Thread_local size_t scratch_cap[SD_SCRATCH_SLOTS];
static const size_t scratch_keep[SD_SCRATCH_SLOTS] = {32u << 20, 128u << 20, 32u << 20};

/* The slot's buffer, at least n bytes (NULL when out of memory). */
unsigned char *sd_scratch(int slot, size_t n)
{
    if (n <= scratch_cap[slot]) return scratch[slot];
    size_t want = 2 * scratch_cap[slot] > n && 2 * scratch_cap[slot] <= scratch_keep[slot] ? 2 * scratch_cap[slot] : n;
    free(scratch[slot]);
    scratch[slot] = malloc(want);
    scratch_cap[slot] = scratch[slot] ? want : 0;
    return scratch[slot];
}

/* Buffers over their slot's limit are given back after each image. */
void sd_scratch_trim(void)
{
    for (int i = 0; i < SD_SCRATCH_SLOTS; i++)
        if (scratch_cap[i] > scratch_keep[i]) {
            free(scratch[i]);
            scratch[i] = NULL;
            scratch_cap[i] = 0;
        }
}

/* The thread is done with images: free all its buffers. */
void sd_fast_thread_done(void)
{
    for (int i = 0; i < SD_SCRATCH_SLOTS; i++) {
        free(scratch[i]);
        scratch[i] = NULL;
        scratch_cap[i] = 0;
    }
}

/* Paeth's predictor: whichever of left, up, up-left is nearest to left + up - up-left. */
static inline unsigned paeth(unsigned a, unsigned b, unsigned c)
{
    int pa = abs((int)b - (int)c), pb = abs((int)a - (int)c), pc = abs((int)a + (int)b - 2 * (int)c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

#if defined(__SSE2__)
/* One 3- or 4-byte pixel into 16-bit lanes (4 bytes read: rows are padded). */
static inline __m128i px_load(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)v), _mm_setzero_si128());
}

/* Store a pixel held in 16-bit lanes as 4 bytes: for 3-byte pixels the
 * extra byte lands where the next pixel (or the row's padding) goes. */
static inline void px_store(unsigned char *p, __m128i x)
{
    uint32_t v = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(x, x));
    memcpy(p, &v, 4);
}

/* |x| of signed 16-bit lanes (SSE2 has no pabsw). */
static inline __m128i abs16(__m128i x) { return _mm_max_epi16(x, _mm_sub_epi16(_mm_setzero_si128(), x)); }

/* The filters that depend on the pixel to the left (Sub, Average, Paeth)
 * for 3- and 4-byte pixels: one pixel a step, its channels in parallel. */
static void unfilter_px(unsigned char *dst, const unsigned char *src, const unsigned char *prev, size_t n, size_t bpp, int type)
{
    const __m128i lo = _mm_set1_epi16(0xFF);
    __m128i a = _mm_setzero_si128(), c = _mm_setzero_si128();
    size_t i;
    switch (type) {
    case 1:
        for (i = 0; i < n; i += bpp) {
            a = _mm_and_si128(_mm_add_epi16(px_load(src + i), a), lo);
            px_store(dst + i, a);
        }
        break;
    case 3:
        for (i = 0; i < n; i += bpp) {
            __m128i pred = _mm_srli_epi16(_mm_add_epi16(a, px_load(prev + i)), 1);
            a = _mm_and_si128(_mm_add_epi16(px_load(src + i), pred), lo);
            px_store(dst + i, a);
        }
        break;
    default:
        for (i = 0; i < n; i += bpp) {
            __m128i b = px_load(prev + i);
            __m128i pa = _mm_sub_epi16(b, c), pb = _mm_sub_epi16(a, c);
            __m128i pc = abs16(_mm_add_epi16(pa, pb));
            pa = abs16(pa);
            pb = abs16(pb);
            __m128i m = _mm_min_epi16(pc, _mm_min_epi16(pa, pb));
            __m128i ma = _mm_cmpeq_epi16(pa, m), mb = _mm_andnot_si128(ma, _mm_cmpeq_epi16(pb, m));
            __m128i mc = _mm_andnot_si128(_mm_or_si128(ma, mb), _mm_set1_epi16(-1));
            __m128i pred = _mm_or_si128(_mm_or_si128(_mm_and_si128(a, ma), _mm_and_si128(b, mb)), _mm_and_si128(c, mc));
            a = _mm_and_si128(_mm_add_epi16(px_load(src + i), pred), lo);
            px_store(dst + i, a);
            c = b;
        }
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/* Paeth's predictor in 16-bit lanes with SSSE3's abs and SSE4.1's blend, so
 * that the chain through a (the pixel to the left, just computed) is short:
 * pa = |b - c| does not need a; pb <= pc picks b or c, then pa <= both
 * picks a (ties as in paeth()). */
__attribute__((target("avx2"))) static inline __m128i paeth_lanes(__m128i a, __m128i b, __m128i c)
{
    __m128i d = _mm_sub_epi16(b, c), e = _mm_sub_epi16(a, c);
    __m128i pa = _mm_abs_epi16(d), pb = _mm_abs_epi16(e), pc = _mm_abs_epi16(_mm_add_epi16(d, e));
    __m128i bc = _mm_blendv_epi8(b, c, _mm_cmpgt_epi16(pb, pc));
    return _mm_blendv_epi8(a, bc, _mm_cmpgt_epi16(pa, _mm_min_epi16(pb, pc)));
}

/* Row A's filtered pixel at sa and row B's at sb (4 bytes each) side by
 * side in 16-bit lanes: A in the low half, B in the high. */
__attribute__((target("avx2"))) static inline __m128i two_px(const unsigned char *sa, const unsigned char *sb)
{
    uint32_t u, v;
    memcpy(&u, sa, 4);
    memcpy(&v, sb, 4);
    __m128i x = _mm_unpacklo_epi32(_mm_cvtsi32_si128((int)u), _mm_cvtsi32_si128((int)v));
    return _mm_unpacklo_epi8(x, _mm_setzero_si128());
}

/* Two Paeth rows at once, 3- or 4-byte pixels: row A (over the unfiltered
 * row prev) into da and the row B below it into db, B one pixel behind A so
 * that what B needs of A (above, above-left) is already in registers. Both
 * pixels sit in one register, so the two rows' serial chains (Paeth's is
 * the longest of the filters) run in the same instructions. Every row is
 * followed by at least 4 bytes that may be read or written. */
__attribute__((target("avx2"))) static void paeth2_avx2(unsigned char *da, unsigned char *db, const unsigned char *sa,
                                                        const unsigned char *sb, const unsigned char *prev, size_t n,
                                                        size_t bpp)
{
    const __m128i lo = _mm_set1_epi16(0xFF);
    /* A's first pixel: no left, so the prediction is the pixel above */
    __m128i a = _mm_and_si128(_mm_add_epi16(px_load(sa), px_load(prev)), lo);
    px_store(da, a);
    __m128i b = _mm_unpacklo_epi64(px_load(prev + bpp), a), c = px_load(prev);
    for (size_t x = bpp;; x += bpp) {
        /* A's pixel x (garbage once x == n) and B's pixel x - bpp */
        a = _mm_and_si128(_mm_add_epi16(two_px(sa + x, sb + x - bpp), paeth_lanes(a, b, c)), lo);
        __m128i bytes = _mm_packus_epi16(a, a);
        uint32_t pa = (uint32_t)_mm_cvtsi128_si32(bytes), pb = (uint32_t)_mm_cvtsi128_si32(_mm_srli_epi64(bytes, 32));
        memcpy(db + x - bpp, &pb, 4);
        if (x == n) break;
        memcpy(da + x, &pa, 4);
        c = b;
        b = _mm_unpacklo_epi64(px_load(prev + x + bpp), a);
    }
}

/* Whether rows y and y + 1 go through paeth2_avx2: both Paeth, 3- or
 * 4-byte pixels, the CPU has AVX2. */
static int paeth_pair(const unsigned char *raw, size_t rowb, uint32_t y, uint32_t h, int chan, int avx2)
{
    return avx2 && chan >= 3 && y + 1 < h && raw[(size_t)y * (rowb + 1)] == 4 && raw[(size_t)(y + 1) * (rowb + 1)] == 4;
}
#else
/* Not an x86-64 GCC-compatible build: one row at a time. */
static int paeth_pair(const unsigned char *raw, size_t rowb, uint32_t y, uint32_t h, int chan, int avx2)
{
    (void)raw, (void)rowb, (void)y, (void)h, (void)chan, (void)avx2;
    return 0;
}

/* Unreachable (paeth_pair is 0); kept so the caller stays plain C. */
static void paeth2_avx2(unsigned char *da, unsigned char *db, const unsigned char *sa, const unsigned char *sb,
                        const unsigned char *prev, size_t n, size_t bpp)
{
    (void)da, (void)db, (void)sa, (void)sb, (void)prev, (void)n, (void)bpp;
}
#endif

/* Undo one row's filter: src is the filtered row, prev the unfiltered row
 * above (zeros for the first), dst a spare row; all three are followed by
 * at least 4 bytes the SSE2 path may read or write. Returns the unfiltered
 * row (src itself for filter None), NULL for an unknown filter type. */
static const unsigned char *unfilter(unsigned char *dst, const unsigned char *src, const unsigned char *prev, size_t n,
                                     int bpp, int type)
{
    size_t i = 0, b = (size_t)bpp;
    switch (type) {
    case 0:
        return src;
    case 2:
#if defined(__SSE2__)
        for (; i + 16 <= n; i += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)(src + i)), y = _mm_loadu_si128((const __m128i *)(prev + i));
            _mm_storeu_si128((__m128i *)(dst + i), _mm_add_epi8(x, y));
        }
#endif
        for (; i < n; i++) dst[i] = (unsigned char)(src[i] + prev[i]);
        return dst;
    case 1:
    case 3:
    case 4:
#if defined(__SSE2__)
        if (bpp >= 3) {
            unfilter_px(dst, src, prev, n, b, type);
            return dst;
        }
#endif
        for (i = 0; i < b; i++) dst[i] = (unsigned char)(src[i] + (type == 1 ? 0 : type == 3 ? prev[i] >> 1 : prev[i]));
        for (; i < n; i++) {
            unsigned left = dst[i - b];
            unsigned pred = type == 1 ? left : type == 3 ? (left + prev[i]) >> 1 : paeth(left, prev[i], prev[i - b]);
            dst[i] = (unsigned char)(src[i] + pred);
        }
        return dst;
    }
    return NULL;
}

/* The ICC profile of an iCCP chunk (name, NUL, method 0, zlib data),
 * inflated into a buffer grown until it fits; NULL when damaged. */
static unsigned char *png_icc(struct libdeflate_decompressor *d, const unsigned char *p, size_t n, size_t *len)
{
    const unsigned char *nul = memchr(p, 0, n < 81 ? n : 81);
    if (!nul || (size_t)(nul - p) + 2 > n || nul[1] != 0) return NULL;
    const unsigned char *z = nul + 2;
    size_t zn = n - (size_t)(z - p);
    for (size_t cap = 1 << 16; cap <= PNG_MAX_ICC; cap *= 4) {
        unsigned char *o = malloc(cap);
        if (!o) return NULL;
        size_t got = 0;
        enum libdeflate_result r = libdeflate_zlib_decompress(d, z, zn, o, cap, &got);
        if (r == LIBDEFLATE_SUCCESS && got > 0) {
            *len = got;
            return o;
        }
        free(o);
        if (r != LIBDEFLATE_INSUFFICIENT_SPACE) return NULL;
    }
    return NULL;
}

/* Decode + shrink an 8-bit, non-interlaced grey/RGB PNG with or without
 * alpha, whose chunks all check out (CRCs of the ones used, IDATs in one
 * run, IEND present). */
sd_fast sd_fast_png(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                    unsigned char *out, unsigned char **icc, size_t *icc_len)
{
    if (info->format != SD_IMG_PNG || len < 33) return SD_FAST_DECLINE;
    uint32_t w = info->width, h = info->height;
    if (w < (uint32_t)plan->resize_w || h < (uint32_t)plan->resize_h) return SD_FAST_DECLINE;
    int depth = buf[24], ctype = buf[25];
    if (depth != 8 || buf[26] != 0 || buf[27] != 0 || buf[28] != 0) return SD_FAST_DECLINE;
    int chan = ctype == 0 ? 1 : ctype == 2 ? 3 : ctype == 4 ? 2 : ctype == 6 ? 4 : 0;
    if (!chan) return SD_FAST_DECLINE;
    size_t rowb = (size_t)w * chan;
    uint64_t rawn = (uint64_t)h * (rowb + 1);
    if (rawn > PNG_MAX_RAW) return SD_FAST_DECLINE;

    /* walk the chunks: where the IDAT run is, how long, whether the file is sound */
    size_t pos = 33, zn = 0, idat_first = 0, idat_end = 0, icc_at = 0, icc_n = 0;
    int idats = 0, idat_done = 0, end = 0;
    while (!end) {
        if (len - pos < 12) return SD_FAST_DECLINE; /* truncated: libvips reports it */
        size_t n = be32(buf + pos);
        const unsigned char *t = buf + pos + 4;
        if (n > len - pos - 12) return SD_FAST_DECLINE;
        int is_idat = memcmp(t, "IDAT", 4) == 0;
        if (is_idat || memcmp(t, "iCCP", 4) == 0 || memcmp(t, "IEND", 4) == 0) {
            if (libdeflate_crc32(0, t, n + 4) != be32(t + 4 + n)) return SD_FAST_DECLINE;
        }
        if (is_idat) {
            if (idat_done) return SD_FAST_DECLINE; /* IDATs must be consecutive */
            if (!idats++) idat_first = pos;
            idat_end = pos + 12 + n;
            zn += n;
        } else {
            if (idats) idat_done = 1;
            if (memcmp(t, "IEND", 4) == 0) end = 1;
            else if (memcmp(t, "iCCP", 4) == 0) {
                if (idats) return SD_FAST_DECLINE;
                icc_at = pos + 8;
                icc_n = n;
            } else if (memcmp(t, "tRNS", 4) == 0 || memcmp(t, "eXIf", 4) == 0) return SD_FAST_DECLINE;
            else if (memcmp(t, "PLTE", 4) == 0) {
                if (chan < 3) return SD_FAST_DECLINE; /* a palette in a grey image: libpng's call */
            } else if (!(t[0] & 0x20)) return SD_FAST_DECLINE; /* unknown critical chunk */
        }
        pos += 12 + n;
    }
    if (!idats) return SD_FAST_DECLINE;

    sd_fast res = SD_FAST_DECLINE;
    struct libdeflate_decompressor *d = libdeflate_alloc_decompressor();
    unsigned char *raw = NULL, *rowbuf = NULL, *prof = NULL;
    sd_area *area = NULL;
    /* the inflated image (padded: the SSE2 unfilter reads whole 4-byte
     * pixels) and, after it, the IDAT payloads end to end when there are
     * several (one is inflated in place) */
    size_t rawcap = (size_t)rawn + 16;
    raw = sd_scratch(SD_SCRATCH_INFLATE, rawcap + (idats > 1 ? zn : 0));
    rowbuf = calloc(4 * (rowb + 16), 1); /* the zero row above the first, three output rows in turn */
    area = sd_area_new((int)w, (int)h, chan, plan, out);
    if (!d || !raw || !rowbuf || !area) goto done;
    const unsigned char *zs = buf + idat_first + 8;
    if (idats > 1) {
        unsigned char *z = raw + rawcap;
        size_t at = 0;
        for (size_t p = idat_first; p < idat_end;) {
            size_t n = be32(buf + p);
            memcpy(z + at, buf + p + 8, n);
            at += n;
            p += 12 + n;
        }
        zs = z;
    }
    if (icc_n && chan >= 3) {
        size_t n = 0;
        prof = png_icc(d, buf + icc_at, icc_n, &n);
        /* alpha under a profile that is not sRGB: libvips converts the colours
         * first and flattens onto white after, which the resizer cannot follow */
        if (prof && chan == 4 && !sd_icc_is_srgb(prof, n)) goto done;
        if (prof) *icc_len = n;
    }
    if (libdeflate_zlib_decompress(d, zs, zn, raw, (size_t)rawn, NULL) != LIBDEFLATE_SUCCESS) goto done;
    memset(raw + rawn, 0, 16);
    const unsigned char *prev = rowbuf;
    int avx2 = sd_image_avx2(), full = 0;
    uint32_t y = 0;
    while (y < h && !full) {
        const unsigned char *src = raw + (size_t)y * (rowb + 1);
        unsigned char *dst = rowbuf + (1 + y % 3) * (rowb + 16);
        if (paeth_pair(raw, rowb, y, h, chan, avx2)) {
            unsigned char *dst2 = rowbuf + (1 + (y + 1) % 3) * (rowb + 16);
            paeth2_avx2(dst, dst2, src + 1, src + rowb + 2, prev, rowb, (size_t)chan);
            full = sd_area_push(area, dst) || sd_area_push(area, dst2);
            prev = dst2;
            y += 2;
            continue;
        }
        if (!(prev = unfilter(dst, src + 1, prev, rowb, chan, src[0]))) goto done;
        full = sd_area_push(area, prev);
        y++;
    }
    /* rows below the crop need no unfiltering, but a bad filter byte there
     * is still libpng's error to report */
    for (; y < h; y++)
        if (raw[(size_t)y * (rowb + 1)] > 4) goto done;
    *icc = prof;
    prof = NULL;
    res = SD_FAST_DONE;
done:
    if (d) libdeflate_free_decompressor(d);
    sd_area_free(area);
    free(rowbuf);
    free(prof);
    return res;
}

/* ---- WebP ---- */

/* Decode a still WebP without ICC or EXIF chunks, scaled by libwebp straight
 * to the resize size, then crop (and flatten alpha) through the resizer. */
sd_fast sd_fast_webp(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                     unsigned char *out, unsigned char **icc, size_t *icc_len)
{
    (void)icc;
    (void)icc_len;
    if (info->format != SD_IMG_WEBP || len < 30) return SD_FAST_DECLINE;
    if (memcmp(buf + 12, "VP8X", 4) == 0 && (buf[20] & (0x20 | 0x08 | 0x02))) return SD_FAST_DECLINE; /* ICC, EXIF, animation */
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg) || WebPGetFeatures(buf, len, &cfg.input) != VP8_STATUS_OK) return SD_FAST_DECLINE;
    if (cfg.input.has_animation) return SD_FAST_DECLINE;
    int rw = plan->resize_w, rh = plan->resize_h;
    if (cfg.input.width < rw || cfg.input.height < rh) return SD_FAST_DECLINE;
    int chan = cfg.input.has_alpha ? 4 : 3;
    size_t stride = (size_t)rw * chan, size = stride * rh;
    unsigned char *px = malloc(size + 16);
    sd_area *area = sd_area_new(rw, rh, chan, plan, out);
    sd_fast res = SD_FAST_DECLINE;
    if (px && area) {
        cfg.options.use_threads = 0;
        if (cfg.input.width != rw || cfg.input.height != rh) {
            cfg.options.use_scaling = 1;
            cfg.options.scaled_width = rw;
            cfg.options.scaled_height = rh;
        }
        cfg.output.colorspace = chan == 4 ? MODE_RGBA : MODE_RGB;
        cfg.output.is_external_memory = 1;
        cfg.output.u.RGBA.rgba = px;
        cfg.output.u.RGBA.stride = (int)stride;
        cfg.output.u.RGBA.size = size;
        if (WebPDecode(buf, len, &cfg) == VP8_STATUS_OK) {
            for (int y = 0; y < rh; y++)
                if (sd_area_push(area, px + stride * y)) break;
            res = SD_FAST_DONE;
        }
        WebPFreeDecBuffer(&cfg.output);
    }
    sd_area_free(area);
    free(px);
    return res;
}
