/* The pipeline's two resizers. Shrinks: an area resize (the weights of
 * OpenCV's INTER_AREA, which kohya uses when both sides shrink), streaming:
 * source rows arrive top to bottom, each is folded
 * into the accumulator of the output row it belongs to (vertical pass over
 * the row's needed span; a row shared by two output rows finishes the first
 * and starts the second in one sweep), and a finished output row is filtered
 * horizontally straight into the crop box. Fixed point: weights in 1/16384,
 * the vertical result kept with 7 fraction bits, one rounding at the end.
 * RGBA rows keep four lanes per pixel all the way (the fourth unused) so the
 * vector loops never have to repack them. The loops come in SSE2 (or plain
 * C) and AVX2, chosen per image by what the CPU has; all arithmetic is exact
 * integer sums, so both give the same bytes. Enlargements (a side grows):
 * PIL's LANCZOS resize, byte for byte (sd_lanczos_rgb8, at the end). */
#include "image_int.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SD_AREA_AVX2 1
#else
#define SD_AREA_AVX2 0
#endif

enum { WBITS = 14, WONE = 1 << WBITS, VBITS = 7, PAD = 16 };

/* Which source pixels one output pixel covers and with what weight. */
typedef struct {
    int first;    /* first source index (absolute on this axis) */
    int n;        /* how many */
    uint16_t *w;  /* n weights summing to WONE */
} span;

/* Two neighbouring crop columns for the AVX2 horizontal pass, one in each
 * 128-bit half: where their first source pixels' lanes start in the
 * vertical sum, and how many steps of two taps the longer of the two needs
 * (the shorter one's extra weights are 0). */
typedef struct {
    size_t at[2];
    int steps;
} hpair;

struct sd_area {
    int cw, ch, flip;
    int chan, lanes;      /* source bytes per pixel; lanes per pixel in the sums (3, or 4 for RGBA) */
    int avx2;             /* the AVX2 loops (the CPU has them) */
    unsigned char *out;
    int xs0, xn;          /* source columns the crop needs: [xs0, xs0 + xn) */
    span *xs, *ys;        /* per crop column / crop row */
    uint16_t *wpool;
    hpair *hp;            /* AVX2: (cw + 1) / 2 column pairs ... */
    uint32_t *hw;         /* ... and per pair and step, each column's two weights in 16 bits each */
    int y, o;             /* next source row, next output row (within the crop) */
    uint32_t *acc;        /* vertical sums of crop row o */
    uint16_t *vrow;       /* a finished vertical sum, VBITS fraction bits */
    unsigned char *rgb;   /* a source row's needed span, alpha flattened, grey expanded */
};

/* Spans for outputs c0 .. c0 + n - 1 of an axis shrinking `src` pixels to
 * `dst`: output i covers [i * src / dst, (i + 1) * src / dst), computed in
 * exact integers (units of 1 / dst source pixel); weights are the overlaps
 * rounded to 1/16384 with the rounding residue given to the largest, so
 * flat areas stay exactly flat. */
static void make_spans(span *s, uint16_t **pool, int src, int dst, int c0, int n)
{
    for (int k = 0; k < n; k++) {
        int64_t i = c0 + k, lo = i * src, hi = (i + 1) * src;
        int j0 = (int)(lo / dst), j1 = (int)((hi + dst - 1) / dst) - 1;
        if (j1 > src - 1) j1 = src - 1;
        s[k].first = j0;
        s[k].n = j1 - j0 + 1;
        s[k].w = *pool;
        *pool += s[k].n;
        int sum = 0, big = 0;
        for (int j = j0; j <= j1; j++) {
            int64_t a = (int64_t)j * dst > lo ? (int64_t)j * dst : lo;
            int64_t b = (int64_t)(j + 1) * dst < hi ? (int64_t)(j + 1) * dst : hi;
            int q = (int)(((b - a) * WONE + src / 2) / src);
            s[k].w[j - j0] = (uint16_t)q;
            sum += q;
            if (q > s[k].w[big]) big = j - j0;
        }
        s[k].w[big] = (uint16_t)(s[k].w[big] + (WONE - sum));
    }
}

/* Most taps any output of an axis can have: ceil(src / dst) + 1. */
static int max_taps(int src, int dst) { return (src + dst - 1) / dst + 1; }

/* Set by tests (image_dump --portable) before any load: every image on the
 * portable loops, as on a CPU without AVX2, to compare the two. */
static int portable_only;

/* Tests only: 1 turns the AVX2 loops off (before any load), 0 back on. */
void sd_image_portable_only(int on) { portable_only = on; }

/* Whether the image loops may use AVX2: this CPU (and build) has it and no
 * test turned it off. */
int sd_image_avx2(void)
{
#if SD_AREA_AVX2
    return !portable_only && __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* Column c's weights for taps 2t and 2t + 1 as two 16-bit halves (0 past
 * its last tap). */
static uint32_t tap_pair(const span *s, int t)
{
    uint32_t lo = 2 * t < s->n ? s->w[2 * t] : 0, hi = 2 * t + 1 < s->n ? s->w[2 * t + 1] : 0;
    return lo | hi << 16;
}

/* The AVX2 horizontal pass's column pairs and weights; returns how many
 * 16-bit values of the vertical sum it may read (each step loads 8 from a
 * column's next pair of pixels), or 0 when out of memory. An odd last
 * column is paired with a copy of itself with zero weights. */
static size_t make_pairs(sd_area *a)
{
    int np = (a->cw + 1) / 2;
    size_t nw = 0, reach = 0;
    a->hp = malloc((size_t)np * sizeof *a->hp);
    if (!a->hp) return 0;
    for (int i = 0; i < np; i++) {
        const span *s0 = &a->xs[2 * i], *s1 = 2 * i + 1 < a->cw ? s0 + 1 : s0;
        int n = s1 != s0 && s1->n > s0->n ? s1->n : s0->n;
        hpair *hp = &a->hp[i];
        *hp = (hpair){{(size_t)s0->first * a->lanes, (size_t)s1->first * a->lanes}, (n + 1) / 2};
        nw += 2 * (size_t)hp->steps;
        for (int k = 0; k < 2; k++) {
            size_t end = hp->at[k] + 2 * (size_t)(hp->steps - 1) * a->lanes + 8;
            if (end > reach) reach = end;
        }
    }
    uint32_t *w = a->hw = malloc(nw * sizeof *a->hw);
    if (!w) return 0;
    for (int i = 0; i < np; i++) {
        const span *s0 = &a->xs[2 * i], *s1 = 2 * i + 1 < a->cw ? s0 + 1 : NULL;
        for (int t = 0; t < a->hp[i].steps; t++) {
            *w++ = tap_pair(s0, t);
            *w++ = s1 ? tap_pair(s1, t) : 0;
        }
    }
    return reach;
}

/* Set up the weights and buffers for one image; NULL when out of memory or
 * when the plan would need an upscale. Buffers get PAD spare zero bytes so
 * the SSE2 loops may read a little past a row (the vertical sum as far as
 * the AVX2 horizontal pass reads). */
sd_area *sd_area_new(int sw, int sh, int channels, const sd_image_plan *p, unsigned char *out)
{
    if (sw < p->resize_w || sh < p->resize_h || channels < 1 || channels > 4) return NULL;
    sd_area *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->cw = sd_image_out_w(p);
    a->ch = sd_image_out_h(p);
    a->flip = p->flip;
    a->chan = channels;
    a->lanes = channels == 4 ? 4 : 3;
    a->out = out;
    size_t pool = (size_t)a->cw * max_taps(sw, p->resize_w) + (size_t)a->ch * max_taps(sh, p->resize_h);
    a->xs = malloc((size_t)a->cw * sizeof *a->xs);
    a->ys = malloc((size_t)a->ch * sizeof *a->ys);
    a->wpool = malloc(pool * sizeof *a->wpool);
    if (!a->xs || !a->ys || !a->wpool) {
        sd_area_free(a);
        return NULL;
    }
    uint16_t *w = a->wpool;
    make_spans(a->xs, &w, sw, p->resize_w, p->crop_l, a->cw);
    make_spans(a->ys, &w, sh, p->resize_h, p->crop_t, a->ch);
    a->xs0 = a->xs[0].first;
    a->xn = a->xs[a->cw - 1].first + a->xs[a->cw - 1].n - a->xs0;
    for (int c = 0; c < a->cw; c++) a->xs[c].first -= a->xs0;
    size_t n = (size_t)a->xn * a->lanes + PAD, vn = n;
    a->avx2 = sd_image_avx2();
    if (a->avx2) {
        size_t reach = make_pairs(a);
        if (!reach) {
            sd_area_free(a);
            return NULL;
        }
        if (reach > vn) vn = reach;
    }
    a->acc = calloc(n, sizeof(uint32_t));
    a->vrow = calloc(vn, sizeof *a->vrow);
    a->rgb = calloc(n, 1);
    if (!a->acc || !a->vrow || !a->rgb) {
        sd_area_free(a);
        return NULL;
    }
    return a;
}

/* Free the weights and buffers (NULL is fine). */
void sd_area_free(sd_area *a)
{
    if (!a) return;
    free(a->xs);
    free(a->ys);
    free(a->wpool);
    free(a->hp);
    free(a->hw);
    free(a->acc);
    free(a->vrow);
    free(a->rgb);
    free(a);
}

/* x * a / 255 rounded, for x, a in 0..255. */
static inline unsigned mul255(unsigned x, unsigned a)
{
    unsigned t = x * a + 128;
    return (t + (t >> 8)) >> 8;
}

/* RGBA onto white in place of four lanes: c' = 255 - (255 - c) * a / 255,
 * which is libvips' flatten (c * a + 255 * (255 - a)) / 255 rearranged; the
 * fourth lane is left meaningless. */
static void flatten4(unsigned char *restrict d, const unsigned char *restrict s, size_t npx)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128(), c255 = _mm_set1_epi16(255), c128 = _mm_set1_epi16(128);
    for (; i + 4 <= npx; i += 4) {
        __m128i x = _mm_loadu_si128((const __m128i *)(s + 4 * i));
        __m128i h[2] = {_mm_unpacklo_epi8(x, zero), _mm_unpackhi_epi8(x, zero)};
        for (int k = 0; k < 2; k++) {
            __m128i al = _mm_shufflehi_epi16(_mm_shufflelo_epi16(h[k], 0xFF), 0xFF);
            __m128i t = _mm_add_epi16(_mm_mullo_epi16(_mm_sub_epi16(c255, h[k]), al), c128);
            t = _mm_srli_epi16(_mm_add_epi16(t, _mm_srli_epi16(t, 8)), 8);
            h[k] = _mm_sub_epi16(c255, t);
        }
        _mm_storeu_si128((__m128i *)(d + 4 * i), _mm_packus_epi16(h[0], h[1]));
    }
#endif
    for (; i < npx; i++) {
        unsigned al = s[4 * i + 3];
        for (int c = 0; c < 3; c++) d[4 * i + c] = (unsigned char)(255 - mul255(255u - s[4 * i + c], al));
    }
}

/* acc += w * px over a row span: the hot loop of the vertical pass (SSE2:
 * 16 values a step, 16 x 16 -> 32-bit products from mullo/mulhi). */
static void accumulate(uint32_t *restrict acc, const unsigned char *restrict px, uint32_t w, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128(), wv = _mm_set1_epi16((short)w);
    for (; i + 16 <= n; i += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(px + i));
        __m128i lo = _mm_unpacklo_epi8(x, zero), hi = _mm_unpackhi_epi8(x, zero);
        __m128i lol = _mm_mullo_epi16(lo, wv), loh = _mm_mulhi_epu16(lo, wv);
        __m128i hil = _mm_mullo_epi16(hi, wv), hih = _mm_mulhi_epu16(hi, wv);
        __m128i *a = (__m128i *)(acc + i);
        _mm_storeu_si128(a, _mm_add_epi32(_mm_loadu_si128(a), _mm_unpacklo_epi16(lol, loh)));
        _mm_storeu_si128(a + 1, _mm_add_epi32(_mm_loadu_si128(a + 1), _mm_unpackhi_epi16(lol, loh)));
        _mm_storeu_si128(a + 2, _mm_add_epi32(_mm_loadu_si128(a + 2), _mm_unpacklo_epi16(hil, hih)));
        _mm_storeu_si128(a + 3, _mm_add_epi32(_mm_loadu_si128(a + 3), _mm_unpackhi_epi16(hil, hih)));
    }
#endif
    for (; i < n; i++) acc[i] += w * px[i];
}

/* The last source row of a crop row: v = (acc + w * px) rounded to VBITS
 * fraction bits (at most 32640, so a signed 16-bit pack cannot saturate),
 * and acc restarted as wn * px for the next crop row (wn = 0 when the row
 * is not shared with it). */
static void finish_row(uint16_t *restrict v, uint32_t *restrict acc, const unsigned char *restrict px, uint32_t w,
                       uint32_t wn, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128(), half = _mm_set1_epi32(1 << (VBITS - 1));
    const __m128i wv = _mm_set1_epi16((short)w), wnv = _mm_set1_epi16((short)wn);
    for (; i + 8 <= n; i += 8) {
        __m128i x = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(px + i)), zero);
        __m128i pl = _mm_mullo_epi16(x, wv), ph = _mm_mulhi_epu16(x, wv);
        __m128i ql = _mm_mullo_epi16(x, wnv), qh = _mm_mulhi_epu16(x, wnv);
        __m128i *a = (__m128i *)(acc + i);
        __m128i t0 = _mm_add_epi32(_mm_add_epi32(_mm_loadu_si128(a), _mm_unpacklo_epi16(pl, ph)), half);
        __m128i t1 = _mm_add_epi32(_mm_add_epi32(_mm_loadu_si128(a + 1), _mm_unpackhi_epi16(pl, ph)), half);
        _mm_storeu_si128((__m128i *)(v + i), _mm_packs_epi32(_mm_srli_epi32(t0, VBITS), _mm_srli_epi32(t1, VBITS)));
        _mm_storeu_si128(a, _mm_unpacklo_epi16(ql, qh));
        _mm_storeu_si128(a + 1, _mm_unpackhi_epi16(ql, qh));
    }
#endif
    for (; i < n; i++) {
        v[i] = (uint16_t)((acc[i] + w * px[i] + (1u << (VBITS - 1))) >> VBITS);
        acc[i] = wn * px[i];
    }
}

/* The horizontal pass of one crop row: each output pixel is the weighted sum
 * of its span's pixels (SSE2: a pixel's lanes at once through madd, whose
 * signed 16-bit operands hold v <= 32640 and w <= 16384). */
static void horizontal(const sd_area *a, const uint16_t *v, unsigned char *o)
{
    const int lanes = a->lanes;
    for (int c = 0; c < a->cw; c++) {
        const span *s = &a->xs[c];
        const uint16_t *p = v + (size_t)s->first * lanes;
        unsigned char *d = o + (size_t)(a->flip ? a->cw - 1 - c : c) * 3;
#if defined(__SSE2__)
        __m128i sum = _mm_set1_epi32(1 << (WBITS + VBITS - 1));
        for (int k = 0; k < s->n; k++) {
            __m128i px = _mm_unpacklo_epi16(_mm_loadl_epi64((const __m128i *)(p + (size_t)k * lanes)), _mm_setzero_si128());
            sum = _mm_add_epi32(sum, _mm_madd_epi16(px, _mm_set1_epi32(s->w[k])));
        }
        sum = _mm_srli_epi32(sum, WBITS + VBITS);
        sum = _mm_packs_epi32(sum, sum);
        uint32_t px3 = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(sum, sum));
        memcpy(d, &px3, 3);
#else
        uint32_t r = 1u << (WBITS + VBITS - 1), g = r, b = r;
        for (int k = 0; k < s->n; k++) {
            uint32_t w = s->w[k];
            r += w * p[k * lanes];
            g += w * p[k * lanes + 1];
            b += w * p[k * lanes + 2];
        }
        d[0] = (unsigned char)(r >> (WBITS + VBITS));
        d[1] = (unsigned char)(g >> (WBITS + VBITS));
        d[2] = (unsigned char)(b >> (WBITS + VBITS));
#endif
    }
}

#if SD_AREA_AVX2
/* flatten4 eight pixels a step: the same 16-bit operations in 256-bit
 * registers (unpack and pack both work within 128-bit halves, so the
 * pixels come back in order). */
__attribute__((target("avx2"))) static void flatten4_avx2(unsigned char *restrict d, const unsigned char *restrict s,
                                                          size_t npx)
{
    size_t i = 0;
    const __m256i zero = _mm256_setzero_si256(), c255 = _mm256_set1_epi16(255), c128 = _mm256_set1_epi16(128);
    for (; i + 8 <= npx; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(s + 4 * i));
        __m256i h[2] = {_mm256_unpacklo_epi8(x, zero), _mm256_unpackhi_epi8(x, zero)};
        for (int k = 0; k < 2; k++) {
            __m256i al = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(h[k], 0xFF), 0xFF);
            __m256i t = _mm256_add_epi16(_mm256_mullo_epi16(_mm256_sub_epi16(c255, h[k]), al), c128);
            t = _mm256_srli_epi16(_mm256_add_epi16(t, _mm256_srli_epi16(t, 8)), 8);
            h[k] = _mm256_sub_epi16(c255, t);
        }
        _mm256_storeu_si256((__m256i *)(d + 4 * i), _mm256_packus_epi16(h[0], h[1]));
    }
    flatten4(d + 4 * i, s + 4 * i, npx - i);
}

/* Eight bytes widened to 32-bit lanes times w (madd of (byte, 0) pairs
 * with (w, 0) pairs: exact, as w <= 16384). */
__attribute__((target("avx2"))) static inline __m256i mul8(const unsigned char *px, __m256i wv)
{
    return _mm256_madd_epi16(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)px)), wv);
}

/* accumulate, 16 values a step. */
__attribute__((target("avx2"))) static void accumulate_avx2(uint32_t *restrict acc, const unsigned char *restrict px,
                                                            uint32_t w, size_t n)
{
    size_t i = 0;
    const __m256i wv = _mm256_set1_epi32((int)w);
    for (; i + 16 <= n; i += 16) {
        __m256i *a = (__m256i *)(acc + i);
        _mm256_storeu_si256(a, _mm256_add_epi32(_mm256_loadu_si256(a), mul8(px + i, wv)));
        _mm256_storeu_si256(a + 1, _mm256_add_epi32(_mm256_loadu_si256(a + 1), mul8(px + i + 8, wv)));
    }
    for (; i < n; i++) acc[i] += w * px[i];
}

/* finish_row, 16 values a step (packs works within 128-bit halves, so the
 * 64-bit quarters are put back in order after it). */
__attribute__((target("avx2"))) static void finish_row_avx2(uint16_t *restrict v, uint32_t *restrict acc,
                                                            const unsigned char *restrict px, uint32_t w, uint32_t wn,
                                                            size_t n)
{
    size_t i = 0;
    const __m256i wv = _mm256_set1_epi32((int)w), wnv = _mm256_set1_epi32((int)wn);
    const __m256i half = _mm256_set1_epi32(1 << (VBITS - 1));
    for (; i + 16 <= n; i += 16) {
        __m256i *a = (__m256i *)(acc + i);
        __m256i t0 = _mm256_add_epi32(_mm256_add_epi32(_mm256_loadu_si256(a), mul8(px + i, wv)), half);
        __m256i t1 = _mm256_add_epi32(_mm256_add_epi32(_mm256_loadu_si256(a + 1), mul8(px + i + 8, wv)), half);
        __m256i r = _mm256_packs_epi32(_mm256_srli_epi32(t0, VBITS), _mm256_srli_epi32(t1, VBITS));
        _mm256_storeu_si256((__m256i *)(v + i), _mm256_permute4x64_epi64(r, 0xD8));
        _mm256_storeu_si256(a, mul8(px + i, wnv));
        _mm256_storeu_si256(a + 1, mul8(px + i + 8, wnv));
    }
    finish_row(v + i, acc + i, px + i, w, wn, n - i);
}

/* One RGB pixel (the low 3 bytes of px, red first: x86 is little-endian)
 * in a 2-byte and a 1-byte store. */
static inline void put3(unsigned char *d, uint64_t px)
{
    uint16_t lo = (uint16_t)px;
    memcpy(d, &lo, 2);
    d[2] = (unsigned char)(px >> 16);
}

/* Two RGB pixels (the low 6 bytes of px) in a 4-byte and a 2-byte store. */
static inline void put6(unsigned char *d, uint64_t px)
{
    uint32_t lo = (uint32_t)px;
    uint16_t hi = (uint16_t)(px >> 32);
    memcpy(d, &lo, 4);
    memcpy(d + 4, &hi, 2);
}

/* The horizontal pass two crop columns at a time, one per 128-bit half, two
 * taps a step: each half loads 8 values from its column's next pair of
 * pixels, puts each lane of the two side by side (r0 r1 g0 g1 b0 b1, a
 * fourth pair zero) and one madd adds both taps' products. The sums are
 * those of the SSE2 loop, in another order: exact integers. */
__attribute__((target("avx2"))) static void horizontal_avx2(const sd_area *a, const uint16_t *v, unsigned char *o)
{
    const int lanes = a->lanes;
    const __m256i pairs3 = _mm256_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -1, -1, -1, -1, 0, 1, 6, 7, 2, 3, 8, 9,
                                            4, 5, 10, 11, -1, -1, -1, -1);
    const __m256i pairs4 = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, -1, -1, -1, -1, 0, 1, 8, 9, 2, 3,
                                            10, 11, 4, 5, 12, 13, -1, -1, -1, -1);
    const __m256i mix = lanes == 4 ? pairs4 : pairs3, spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const size_t step = 2 * (size_t)lanes;
    const int cw = a->cw, flip = a->flip; /* locals: the byte stores below could alias *a */
    const uint32_t *w = a->hw;
    for (int c = 0; c < cw; c += 2) {
        const hpair *hp = &a->hp[c / 2];
        const uint16_t *p0 = v + hp->at[0], *p1 = v + hp->at[1];
        __m256i sum = _mm256_set1_epi32(1 << (WBITS + VBITS - 1));
        for (int t = 0; t < hp->steps; t++, w += 2, p0 += step, p1 += step) {
            __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                                _mm_loadu_si128((const __m128i *)p1), 1);
            __m256i wv = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)w)), spread);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_shuffle_epi8(x, mix), wv));
        }
        sum = _mm256_srli_epi32(sum, WBITS + VBITS);
        sum = _mm256_packus_epi16(_mm256_packs_epi32(sum, sum), sum);
        uint64_t px0 = (uint32_t)_mm_cvtsi128_si32(_mm256_castsi256_si128(sum)) & 0xFFFFFF;
        uint64_t px1 = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(sum, 1)) & 0xFFFFFF;
        if (c + 1 == cw) put3(o + (size_t)(flip ? 0 : c) * 3, px0);
        else if (flip) put6(o + (size_t)(cw - 2 - c) * 3, px1 | px0 << 24);
        else put6(o + (size_t)c * 3, px0 | px1 << 24);
    }
}
#else
/* Not an x86-64 GCC-compatible build: sd_image_avx2 is 0, so the *_avx2
 * names below are never reached; they keep the dispatch plain C. */
static void flatten4_avx2(unsigned char *restrict d, const unsigned char *restrict s, size_t npx) { flatten4(d, s, npx); }

/* Unreachable here (see above). */
static void accumulate_avx2(uint32_t *restrict acc, const unsigned char *restrict px, uint32_t w, size_t n)
{
    accumulate(acc, px, w, n);
}

/* Unreachable here (see above). */
static void finish_row_avx2(uint16_t *restrict v, uint32_t *restrict acc, const unsigned char *restrict px, uint32_t w,
                            uint32_t wn, size_t n)
{
    finish_row(v, acc, px, w, wn, n);
}

/* Unreachable here (see above). */
static void horizontal_avx2(const sd_area *a, const uint16_t *v, unsigned char *o) { horizontal(a, v, o); }
#endif

/* The needed span of a source row in the resizer's lanes: RGB as it is,
 * RGBA flattened onto white, grey (with or without alpha) replicated. */
static const unsigned char *to_lanes(sd_area *a, const unsigned char *row)
{
    const unsigned char *s = row + (size_t)a->xs0 * a->chan;
    unsigned char *d = a->rgb;
    int n = a->xn;
    switch (a->chan) {
    case 3:
        return s;
    case 4:
        if (a->avx2) flatten4_avx2(d, s, (size_t)n);
        else flatten4(d, s, (size_t)n);
        break;
    case 1:
        for (int i = 0; i < n; i++) d[3 * i] = d[3 * i + 1] = d[3 * i + 2] = s[i];
        break;
    default:
        for (int i = 0; i < n; i++) d[3 * i] = d[3 * i + 1] = d[3 * i + 2] = (unsigned char)(255 - mul255(255u - s[2 * i], s[2 * i + 1]));
    }
    return d;
}

/* Fold the next source row into the crop row it belongs to; on that row's
 * last source row, finish it (the source row may also be the first of the
 * next crop row: it then starts that row's sums) and filter it into the
 * crop box. */
int sd_area_push(sd_area *a, const unsigned char *row)
{
    int y = a->y++;
    if (a->o >= a->ch) return 1;
    const span *s = &a->ys[a->o];
    if (y < s->first) return 0;
    const unsigned char *px = to_lanes(a, row);
    size_t n = (size_t)a->xn * a->lanes;
    uint32_t w = s->w[y - s->first];
    if (y < s->first + s->n - 1) {
        if (a->avx2) accumulate_avx2(a->acc, px, w, n);
        else accumulate(a->acc, px, w, n);
        return 0;
    }
    uint32_t wn = a->o + 1 < a->ch && s[1].first == y ? s[1].w[0] : 0;
    unsigned char *o = a->out + (size_t)a->o * a->cw * 3;
    if (a->avx2) {
        finish_row_avx2(a->vrow, a->acc, px, w, wn, n);
        horizontal_avx2(a, a->vrow, o);
    } else {
        finish_row(a->vrow, a->acc, px, w, wn, n);
        horizontal(a, a->vrow, o);
    }
    return ++a->o >= a->ch;
}


/* ---- Enlargements: PIL's Image.resize(size, Image.LANCZOS) ----
 * What kohya's pil_resize does whenever a side grows (sd-scripts takes
 * INTER_AREA only when both shrink), with Pillow's arithmetic
 * (libImaging/Resample.c, read for its semantics): output pixel i of an axis
 * is centred on source coordinate (i + 0.5) * in / out (pixel centres, no
 * half-pixel shift); the kernel is lanczos3, widened by the factor only on
 * an axis that shrinks; each output's weights are normalised to sum 1 in
 * double, then rounded to 22 fraction bits; the horizontal pass runs first
 * and its result is rounded and clipped to 8 bits, then the vertical pass;
 * an axis that keeps its size is not filtered at all. Only the crop box is
 * computed: each output pixel depends on its own taps alone, so the bytes
 * are those of the whole resize, cut. */

enum { LBITS = 22 }; /* Pillow's PRECISION_BITS */

/* The taps of one output pixel on one axis. */
typedef struct {
    int first, n; /* source pixels [first, first + n) */
    int32_t *w;   /* n weights in units of 2^-LBITS, summing to about 2^LBITS */
} ltaps;

/* sin(pi x) / (pi x), 1 at 0. */
static double sinc(double x)
{
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return sin(x) / x;
}

/* Lanczos-3: the sinc windowed by a sinc three times wider, zero outside
 * [-3, 3) (Pillow's half-open support). */
static double lanczos3(double x) { return x >= -3.0 && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0; }

/* Most taps an output of an axis resized from `in` to `out` can have
 * (Pillow's ksize: the support, widened when shrinking, both ways). */
static int lanczos_ksize(int in, int out)
{
    double scale = (double)in / out;
    return (int)ceil(3.0 * (scale < 1.0 ? 1.0 : scale)) * 2 + 1;
}

/* Taps of outputs c0 .. c0 + n - 1 of an axis resized from `in` to `out`
 * pixels, in Pillow's order of operations so that the rounded weights come
 * out the same: the window's ends rounded from centre -/+ support and
 * clamped to the image, the kernel sampled at each source pixel's centre,
 * normalised by their sum, each weight rounded half away from zero. `pool`
 * holds n * lanczos_ksize(in, out) weights, `d` that many doubles. */
static void lanczos_taps(ltaps *t, int32_t *pool, double *d, int in, int out, int c0, int n)
{
    double scale = (double)in / out, fscale = scale < 1.0 ? 1.0 : scale;
    double support = 3.0 * fscale, ss = 1.0 / fscale;
    size_t ksize = (size_t)lanczos_ksize(in, out);
    for (int j = 0; j < n; j++) {
        double center = (c0 + j + 0.5) * scale;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in) hi = in;
        ltaps *o = &t[j];
        o->first = lo;
        o->n = hi - lo;
        o->w = pool + (size_t)j * ksize;
        double sum = 0.0;
        for (int x = 0; x < o->n; x++) {
            d[x] = lanczos3((x + lo - center + 0.5) * ss);
            sum += d[x];
        }
        for (int x = 0; x < o->n; x++) {
            double v = sum != 0.0 ? d[x] / sum : d[x];
            o->w[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << LBITS) : 0.5 + v * (1 << LBITS));
        }
    }
}

/* A weighted sum (with its rounding half already in) to 8 bits: Pillow's
 * clip, which floors and saturates. */
static inline unsigned char clip8(int64_t v)
{
    if (v < 0) return 0;
    v >>= LBITS;
    return (unsigned char)(v > 255 ? 255 : v);
}

/* The horizontal pass of one source row: cw RGB pixels through their taps,
 * rounded and clipped to 8 bits as Pillow's first pass leaves them. */
static void lanczos_row(unsigned char *restrict d, const unsigned char *restrict s, const ltaps *t, int cw)
{
    for (int c = 0; c < cw; c++) {
        const unsigned char *p = s + (size_t)t[c].first * 3;
        const int32_t *w = t[c].w;
        int64_t r = 1 << (LBITS - 1), g = r, b = r;
        for (int k = 0; k < t[c].n; k++) {
            r += (int64_t)p[3 * k] * w[k];
            g += (int64_t)p[3 * k + 1] * w[k];
            b += (int64_t)p[3 * k + 2] * w[k];
        }
        d[3 * c] = clip8(r);
        d[3 * c + 1] = clip8(g);
        d[3 * c + 2] = clip8(b);
    }
}

/* The vertical pass of one output row: n values (cw pixels' lanes) summed
 * over the rows of its taps, row k at base + (first + k - y0) * stride; a
 * plain loop over contiguous values per tap, which the compiler vectorises. */
static void lanczos_col(unsigned char *restrict d, int64_t *restrict acc, const unsigned char *base, size_t stride,
                        int y0, const ltaps *t, size_t n)
{
    for (size_t i = 0; i < n; i++) acc[i] = 1 << (LBITS - 1);
    for (int k = 0; k < t->n; k++) {
        const unsigned char *row = base + (size_t)(t->first + k - y0) * stride;
        int64_t w = t->w[k];
        for (size_t i = 0; i < n; i++) acc[i] += row[i] * w;
    }
    for (size_t i = 0; i < n; i++) d[i] = clip8(acc[i]);
}

/* Mirror a row of cw RGB pixels in place (the plan's flip). */
static void mirror_rgb(unsigned char *row, int cw)
{
    for (int a = 0, b = cw - 1; a < b; a++, b--)
        for (int c = 0; c < 3; c++) {
            unsigned char t = row[3 * a + c];
            row[3 * a + c] = row[3 * b + c];
            row[3 * b + c] = t;
        }
}

/* See image_int.h. */
int sd_lanczos_rgb8(const unsigned char *src, int sw, int sh, size_t stride, const sd_image_plan *p, unsigned char *out)
{
    const int cw = sd_image_out_w(p), ch = sd_image_out_h(p);
    const int hz = sw != p->resize_w, vt = sh != p->resize_h; /* Pillow filters only an axis whose size changes */
    const size_t kh = hz ? (size_t)lanczos_ksize(sw, p->resize_w) : 0, kv = vt ? (size_t)lanczos_ksize(sh, p->resize_h) : 0;
    const size_t n = (size_t)cw * 3;
    ltaps *th = malloc((size_t)cw * sizeof *th), *tv = malloc((size_t)ch * sizeof *tv);
    int32_t *wh = malloc(((size_t)cw * kh + 1) * sizeof *wh), *wv = malloc(((size_t)ch * kv + 1) * sizeof *wv);
    double *d = malloc(((kh > kv ? kh : kv) + 1) * sizeof *d);
    int64_t *acc = malloc(n * sizeof *acc);
    unsigned char *tmp = NULL;
    int rc = -1;
    if (!th || !tv || !wh || !wv || !d || !acc) goto done;
    if (vt) lanczos_taps(tv, wv, d, sh, p->resize_h, p->crop_t, ch);
    /* the source rows the vertical pass reads (all of the crop's when there is none) */
    int y0 = vt ? tv[0].first : p->crop_t, y1 = vt ? tv[ch - 1].first + tv[ch - 1].n : p->crop_b;
    const unsigned char *base = src + (size_t)y0 * stride + (size_t)p->crop_l * 3;
    size_t bstride = stride;
    if (hz) {
        lanczos_taps(th, wh, d, sw, p->resize_w, p->crop_l, cw);
        tmp = malloc((size_t)(y1 - y0) * n);
        if (!tmp) goto done;
        for (int y = y0; y < y1; y++) lanczos_row(tmp + (size_t)(y - y0) * n, src + (size_t)y * stride, th, cw);
        base = tmp;
        bstride = n;
    }
    for (int r = 0; r < ch; r++) {
        unsigned char *o = out + (size_t)r * n;
        if (vt) lanczos_col(o, acc, base, bstride, y0, &tv[r], n);
        else memcpy(o, base + (size_t)r * bstride, n);
        if (p->flip) mirror_rgb(o, cw);
    }
    rc = 0;
done:
    free(th);
    free(tv);
    free(wh);
    free(wv);
    free(d);
    free(acc);
    free(tmp);
    return rc;
}
