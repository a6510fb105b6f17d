/* 8-bit AdamW as bitsandbytes' AdamW8bit computes it on the CPU: both
 * moments stored as one byte per value, an index into its dynamic
 * quantization map (create_dynamic_map: signed for m, unsigned for v), in
 * blocks of 256 values that each keep their absolute maximum in fp32. A
 * step dequantizes a block, updates it in fp32 in the order of
 * bitsandbytes' CPU kernel (_optimizer_update_8bit_blockwise_cpu: the
 * moments, the weight decay, then the step) and quantizes it again through
 * the 65536-entry nearest-code table its native CPU quantizer uses.
 * Tensors below 4096 values keep fp32 moments and take its 32-bit Adam
 * path, as bitsandbytes' min_8bit_size does. The arithmetic follows torch's
 * vectorised CPU kernels (add with alpha fused, addcmul and addcdiv not). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"

/* torch.linspace(0.1, 1, steps) in fp32 at index i: its CPU kernel fills
 * the first half from the start and the second half from the end. */
static float linspace_at(int steps, int i)
{
    float start = 0.1f, end = 1.0f, step = (end - start) / (float)(steps - 1);
    return i < steps / 2 ? start + step * (float)i : end - step * (float)(steps - i - 1);
}

/* Ascending order of floats for qsort. */
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* bitsandbytes' create_dynamic_map(signed, 7, 8): for each exponent
 * e = 0..6, the midpoints of linspace(0.1, 1, k) scaled by 10^(e - 6)
 * (k = 2^e + 1 signed, 2^(e+1) + 1 unsigned; negated copies when signed),
 * then 0 and 1, sorted: 256 values. */
void sd_q8_dynamic_map(int is_signed, float code[SD_Q8_CODES])
{
    int n = 0;
    for (int e = 0; e < 7; e++) {
        int k = (is_signed ? 1 << e : 1 << (e + 1)) + 1;
        float scale = (float)pow(10.0, (double)(e - 6)); /* a Python float times an fp32 tensor: fp32 */
        for (int j = 0; j + 1 < k; j++) {
            float mean = (linspace_at(k, j) + linspace_at(k, j + 1)) / 2.0f;
            code[n++] = scale * mean;
            if (is_signed) code[n++] = -scale * mean;
        }
    }
    code[n++] = 0.0f;
    code[n++] = 1.0f;
    while (n < SD_Q8_CODES) code[n++] = 0.0f;
    qsort(code, SD_Q8_CODES, sizeof(float), cmp_float);
}

/* The native quantizer's table: for 65536 evenly spaced values in
 * [-1, 1], the index of the nearest code (the first whose midpoint with
 * the next is not below the value). */
void sd_q8_lut(const float code[SD_Q8_CODES], uint8_t lut[SD_Q8_LUT])
{
    float mid[SD_Q8_CODES - 1];
    for (int i = 0; i + 1 < SD_Q8_CODES; i++) mid[i] = 0.5f * (code[i] + code[i + 1]);
    int c = 0;
    for (int i = 0; i < SD_Q8_LUT; i++) {
        float v = -1.0f + (2.0f * (float)i) / (float)(SD_Q8_LUT - 1);
        while (c < SD_Q8_CODES - 1 && mid[c] < v) c++;
        lut[i] = (uint8_t)c;
    }
}

/* The table index of a value already divided by its block's absmax. */
static uint8_t q8_code(const uint8_t *lut, float x)
{
    x = x < -1.0f ? -1.0f : x > 1.0f ? 1.0f : x;
    float t = (x + 1.0f) * 0.5f;
    t = t * (float)(SD_Q8_LUT - 1);
    return lut[(uint16_t)(t + 0.5f)];
}

/* n values into codes with one absmax (a block): all zero codes for an
 * all-zero block, as the native quantizer leaves it. */
void sd_q8_quantize_block(const uint8_t *lut, size_t n, const float *x, uint8_t *q, float *absmax)
{
    float am = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        am = a > am ? a : am;
    }
    *absmax = am;
    if (am == 0.0f) {
        memset(q, 0, n);
        return;
    }
    float inv = 1.0f / am;
    for (size_t i = 0; i < n; i++) q[i] = q8_code(lut, x[i] * inv);
}

/* One tensor of 8-bit state: dequantize, update and requantize each block
 * in turn (blocks are independent; the weights of a block only need its
 * own moments). */
static void adamw8_tensor(const sd_adamw8_args *a, const sd_q8_tables *t, size_t n, float *p, uint8_t *qm,
                          uint8_t *qv, float *am, float *av, const float *g)
{
    float m[SD_Q8_BLOCK], v[SD_Q8_BLOCK];
    for (size_t b = 0; b * SD_Q8_BLOCK < n; b++) {
        size_t lo = b * SD_Q8_BLOCK, len = n - lo < SD_Q8_BLOCK ? n - lo : SD_Q8_BLOCK;
        for (size_t i = 0; i < len; i++) {
            float gi = g[lo + i] * a->gscale;
            float mi = t->code_m[qm[lo + i]] * am[b], vi = t->code_v[qv[lo + i]] * av[b];
            m[i] = fmaf(gi, a->one_b1, mi * a->b1);              /* mul_(b1).add_(g, alpha=1-b1) */
            v[i] = vi * a->b2 + (a->one_b2 * gi) * gi;           /* mul_(b2).addcmul_(g, g, 1-b2) */
            float denom = sqrtf(v[i]) / a->bc2 + a->eps;         /* (sqrt(v) / c2).add_(eps) */
            float w = p[lo + i];
            if (a->decay_on) w = w * a->decay;                    /* mul_(1 - lr wd) */
            p[lo + i] = w + (a->neg_lr_c1 * m[i]) / denom;        /* addcdiv_(m, denom, -lr/c1) */
        }
        sd_q8_quantize_block(t->lut_m, len, m, qm + lo, am + b);
        sd_q8_quantize_block(t->lut_v, len, v, qv + lo, av + b);
    }
}

/* One tensor of fp32 state: bitsandbytes' 32-bit CPU Adam. */
static void adamw32_tensor(const sd_adamw8_args *a, size_t n, float *p, float *m, float *v, const float *g)
{
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * a->gscale;
        m[i] = fmaf(gi, a->one_b1, m[i] * a->b1);
        v[i] = v[i] * a->b2 + (a->one_b2 * gi) * gi;
        float u = m[i] / (sqrtf(v[i]) + a->eps_c2); /* state1 / (sqrt(state2) + eps * c2) */
        float w = p[i];
        if (a->decay_on) w = w * a->decay;
        p[i] = fmaf(u, a->step_size, w); /* add_(update, alpha=step_size) */
    }
}

/* Work of one 8-bit AdamW call: tensors split over the pool. */
typedef struct {
    const sd_adamw8_args *a;
    const sd_q8_tables *t;
    const sd_q8_tensor *ts;
    float *p;
    const float *g;
} adamw8_ctx;

/* A range of tensors, each whole on one worker (the same bits for any
 * thread count). */
static void adamw8_range(void *vctx, int worker, size_t begin, size_t end)
{
    const adamw8_ctx *c = vctx;
    (void)worker;
    for (size_t k = begin; k < end; k++) {
        const sd_q8_tensor *x = &c->ts[k];
        if (x->qm)
            adamw8_tensor(c->a, c->t, x->n, c->p + x->off, x->qm, x->qv, x->am, x->av, c->g + x->off);
        else
            adamw32_tensor(c->a, x->n, c->p + x->off, x->m32, x->v32, c->g + x->off);
    }
}

/* One AdamW8bit step over every tensor. */
void sd_adamw8_fwd(sd_pool *pool, const sd_adamw8_args *a, const sd_q8_tables *t, size_t ntensors,
                   const sd_q8_tensor *ts, float *p, const float *g)
{
    adamw8_ctx c = {.a = a, .t = t, .ts = ts, .p = p, .g = g};
    sd_pool_for(pool, ntensors, adamw8_range, &c);
}
