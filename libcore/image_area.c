/* Area resize (the weights of OpenCV's INTER_AREA, which kohya uses when both
 * sides shrink), streaming: source rows arrive top to bottom, each is folded
 * into at most two output-row accumulators (vertical pass over the row's
 * needed span), and a finished output row is filtered horizontally straight
 * into the crop box. Fixed point: weights in 1/16384, the vertical result
 * kept with 7 fraction bits, one rounding at the end. RGBA rows keep four
 * lanes per pixel all the way (the fourth unused) so SSE2 never has to
 * repack them. */
#include "image_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { WBITS = 14, WONE = 1 << WBITS, VBITS = 7, PAD = 16 };

/* Which source pixels one output pixel covers and with what weight. */
typedef struct {
    int first;    /* first source index (absolute on this axis) */
    int n;        /* how many */
    uint16_t *w;  /* n weights summing to WONE */
} span;

struct sd_area {
    int cw, ch, flip;
    int chan, lanes;      /* source bytes per pixel; lanes per pixel in the sums (3, or 4 for RGBA) */
    unsigned char *out;
    int xs0, xn;          /* source columns the crop needs: [xs0, xs0 + xn) */
    span *xs, *ys;        /* per crop column / crop row */
    uint16_t *wpool;
    int y, o;             /* next source row, next output row (within the crop) */
    uint32_t *acc[2];     /* vertical sums for crop rows o and o + 1 (by parity) */
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

/* Set up the weights and buffers for one image; NULL when out of memory or
 * when the plan would need an upscale. Buffers get PAD spare zero bytes so
 * the SSE2 loops may read a little past a row. */
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
    size_t n = (size_t)a->xn * a->lanes + PAD;
    a->acc[0] = calloc(n, sizeof(uint32_t));
    a->acc[1] = calloc(n, sizeof(uint32_t));
    a->vrow = calloc(n, sizeof *a->vrow);
    a->rgb = calloc(n, 1);
    if (!a->acc[0] || !a->acc[1] || !a->vrow || !a->rgb) {
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
    free(a->acc[0]);
    free(a->acc[1]);
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
        flatten4(d, s, (size_t)n);
        break;
    case 1:
        for (int i = 0; i < n; i++) d[3 * i] = d[3 * i + 1] = d[3 * i + 2] = s[i];
        break;
    default:
        for (int i = 0; i < n; i++) d[3 * i] = d[3 * i + 1] = d[3 * i + 2] = (unsigned char)(255 - mul255(255u - s[2 * i], s[2 * i + 1]));
    }
    return d;
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

/* v = acc rounded to VBITS fraction bits (at most 32640, so a signed
 * 16-bit pack cannot saturate), acc cleared for its next use. */
static void round_clear(uint16_t *restrict v, uint32_t *restrict acc, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i half = _mm_set1_epi32(1 << (VBITS - 1)), zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i *a = (__m128i *)(acc + i);
        __m128i x0 = _mm_srli_epi32(_mm_add_epi32(_mm_loadu_si128(a), half), VBITS);
        __m128i x1 = _mm_srli_epi32(_mm_add_epi32(_mm_loadu_si128(a + 1), half), VBITS);
        _mm_storeu_si128((__m128i *)(v + i), _mm_packs_epi32(x0, x1));
        _mm_storeu_si128(a, zero);
        _mm_storeu_si128(a + 1, zero);
    }
#endif
    for (; i < n; i++) {
        v[i] = (uint16_t)((acc[i] + (1u << (VBITS - 1))) >> VBITS);
        acc[i] = 0;
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

/* Fold the next source row into the (at most two) crop rows it overlaps and
 * finish the one it completes. */
int sd_area_push(sd_area *a, const unsigned char *row)
{
    int y = a->y++;
    if (a->o >= a->ch) return 1;
    if (y < a->ys[a->o].first) return 0;
    const unsigned char *px = to_lanes(a, row);
    size_t n = (size_t)a->xn * a->lanes;
    for (int k = a->o; k < a->o + 2 && k < a->ch; k++) {
        const span *s = &a->ys[k];
        if (y >= s->first && y < s->first + s->n) accumulate(a->acc[k & 1], px, s->w[y - s->first], n);
    }
    const span *s = &a->ys[a->o];
    if (y == s->first + s->n - 1) {
        round_clear(a->vrow, a->acc[a->o & 1], n);
        horizontal(a, a->vrow, a->out + (size_t)a->o * a->cw * 3);
        a->o++;
    }
    return a->o >= a->ch;
}
