/* The linear forward's own sgemm (libcore/engine/gemm_rows.h): a row's result must
 * not depend on anything but the row. Bitwise (memcmp): the AVX-512
 * kernel, the AVX2 kernel, the portable kernel and the unpacked reference
 * agree on every shape (m, n, k not multiples of the 6 x 16 and 6 x 32
 * tiles or of the 512-step k block, odd and even panel counts per column
 * block, k = 1, n = 1, m = 1, row strides wider than the rows); a kernel
 * this CPU lacks is skipped with a message; rows computed
 * alone (m = 1), in a block at an offset, or inside m = 77 * 8 are equal;
 * sd_linear_fwd on 1, 2 and 3 threads equals the reference. Against a
 * double-precision product the error stays within a bound of k float
 * roundings of the absolute terms. sd_gemm_rows_ex's [k, n] weights and
 * accumulation give the chains they promise, on every kernel. */
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "dtype.h"
#include "f16.h"
#include "gemm.h"
#include "gemm_rows.h"
#include "ops_cpu.h"

/* Uniform values in [-1, 1) from a fixed LCG, so failures reproduce. */
static void fill(float *p, size_t n, unsigned *s)
{
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = (float)(*s >> 8) / 8388608.0f - 1.0f;
    }
}

/* Operands of one shape with row strides ldx >= k and ldy >= n (the gaps
 * hold values that must not be read, and a sentinel that must not be
 * written). */
typedef struct {
    int m, n, k;
    size_t ldx, ldy;
    float *x, *w, *b, *y;
} operands;

/* Allocate and fill one shape; 0 when out of memory. */
static int make(operands *o, int m, int n, int k, int pad, unsigned seed)
{
    o->m = m;
    o->n = n;
    o->k = k;
    o->ldx = (size_t)k + (size_t)pad;
    o->ldy = (size_t)n + (size_t)pad;
    o->x = malloc((size_t)m * o->ldx * sizeof(float));
    o->w = malloc((size_t)n * (size_t)k * sizeof(float));
    o->b = malloc((size_t)n * sizeof(float));
    o->y = malloc((size_t)m * o->ldy * sizeof(float));
    if (!o->x || !o->w || !o->b || !o->y) return 0;
    fill(o->x, (size_t)m * o->ldx, &seed);
    fill(o->w, (size_t)n * (size_t)k, &seed);
    fill(o->b, (size_t)n, &seed);
    return 1;
}

/* Release one shape's buffers. */
static void drop(operands *o)
{
    free(o->x);
    free(o->w);
    free(o->b);
    free(o->y);
}

/* y through sd_gemm_rows with isa into a fresh buffer filled with the
 * sentinel 7; NULL when out of memory. */
static float *run(const operands *o, sd_gemm_rows_isa isa, int bias)
{
    size_t ny = (size_t)o->m * o->ldy;
    float *y = malloc(ny * sizeof(float)), *scr = sd_scratch_alloc(1, sd_gemm_rows_scratch_floats());
    if (y && scr) {
        for (size_t i = 0; i < ny; i++) y[i] = 7.0f;
        sd_gemm_rows(isa, o->m, o->n, o->k, o->x, o->ldx, o->w, (size_t)o->k, bias ? o->b : NULL, y, o->ldy, scr);
    }
    free(scr);
    return y;
}

/* Largest |y - exact| / (sum |x w| + |b|) over the shape, with exact the
 * double-precision product. */
static double rel_err(const operands *o, const float *y)
{
    double worst = 0.0;
    for (int i = 0; i < o->m; i++)
        for (int j = 0; j < o->n; j++) {
            double acc = o->b[j], mag = fabs(o->b[j]);
            for (int p = 0; p < o->k; p++) {
                double t = (double)o->x[(size_t)i * o->ldx + (size_t)p] *
                           (double)o->w[(size_t)j * (size_t)o->k + (size_t)p];
                acc += t;
                mag += fabs(t);
            }
            double e = fabs((double)y[(size_t)i * o->ldy + (size_t)j] - acc) / (mag > 0 ? mag : 1.0);
            if (!(e <= worst)) worst = e;
        }
    return worst;
}

/* The kernels this CPU runs beside the portable one (AVX2, AVX-512). */
static const sd_gemm_rows_isa simd_isas[] = {SD_GEMM_ROWS_AVX2, SD_GEMM_ROWS_AVX512};
enum { N_SIMD = sizeof simd_isas / sizeof simd_isas[0] };

/* Every kernel and the reference give the same bits, the sentinel in the
 * row gaps survives, and the error is within k roundings. */
static void check_shape(int m, int n, int k, int pad)
{
    operands o;
    if (!CHECK(make(&o, m, n, k, pad, (unsigned)(m * 131 + n * 31 + k)))) {
        drop(&o);
        return;
    }
    size_t ny = (size_t)m * o.ldy;
    for (int bias = 0; bias <= 1; bias++) {
        float *ref = malloc(ny * sizeof(float)), *port = run(&o, SD_GEMM_ROWS_PORTABLE, bias);
        if (CHECK(ref && port)) {
            for (size_t i = 0; i < ny; i++) ref[i] = 7.0f;
            sd_gemm_rows_ref(m, n, k, o.x, o.ldx, o.w, (size_t)k, SD_DT_F32, bias ? o.b : NULL, ref, o.ldy);
            if (!CHECK(memcmp(ref, port, ny * sizeof(float)) == 0))
                fprintf(stderr, "  m %d n %d k %d pad %d bias %d: portable kernel differs\n", m, n, k, pad, bias);
        }
        for (int v = 0; v < N_SIMD && ref && port; v++) {
            if (!sd_gemm_rows_isa_usable(simd_isas[v])) continue;
            float *y = run(&o, simd_isas[v], bias);
            if (!CHECK(y)) continue;
            if (!CHECK(memcmp(ref, y, ny * sizeof(float)) == 0))
                fprintf(stderr, "  m %d n %d k %d pad %d bias %d: %s kernel differs\n", m, n, k, pad, bias,
                        sd_gemm_rows_isa_name(simd_isas[v]));
            int kept = 1;
            for (int i = 0; i < m; i++)
                for (size_t j = (size_t)n; j < o.ldy; j++) kept &= y[(size_t)i * o.ldy + j] == 7.0f;
            CHECK(kept);
            if (bias) {
                double e = rel_err(&o, y);
                if (!CHECK(e <= 1.2e-7 * (k + 1))) fprintf(stderr, "  m %d n %d k %d: error %.3g\n", m, n, k, e);
            }
            free(y);
        }
        free(ref);
        free(port);
    }
    drop(&o);
}

/* Rows of one big product computed alone (m = 1, each at its own
 * address), in blocks of 5 starting at odd offsets, and all at once with
 * m = 77 * 8: bitwise equal, on the best kernel and the portable one. */
static void check_rows_alone(sd_gemm_rows_isa isa, int n, int k)
{
    operands o;
    int m = 77 * 8;
    if (!CHECK(make(&o, m, n, k, 0, 99u))) {
        drop(&o);
        return;
    }
    float *all = run(&o, isa, 1), *part = malloc((size_t)5 * (size_t)n * sizeof(float));
    float *scr = sd_scratch_alloc(1, sd_gemm_rows_scratch_floats());
    int alone = 1, blocks = 1;
    if (CHECK(all && part && scr)) {
        for (int i = 0; i < m; i += 37) { /* a row alone, in a buffer of its own */
            sd_gemm_rows(isa, 1, n, k, o.x + (size_t)i * o.ldx, o.ldx, o.w, (size_t)k, o.b, part, (size_t)n, scr);
            alone &= memcmp(part, all + (size_t)i * o.ldy, (size_t)n * sizeof(float)) == 0;
        }
        for (int i = 3; i + 5 <= m; i += 101) { /* rows i..i+4: a block straddling tile edges */
            sd_gemm_rows(isa, 5, n, k, o.x + (size_t)i * o.ldx, o.ldx, o.w, (size_t)k, o.b, part, (size_t)n, scr);
            blocks &= memcmp(part, all + (size_t)i * o.ldy, (size_t)5 * (size_t)n * sizeof(float)) == 0;
        }
    }
    CHECK(alone);
    CHECK(blocks);
    printf("rows of m = %d, n %d, k %d (%s kernel) vs alone and in blocks of 5: %s\n", m, n, k,
           sd_gemm_rows_isa_name(isa), alone && blocks ? "bit-identical" : "DIFFERENT");
    free(all);
    free(part);
    free(scr);
    drop(&o);
}

/* sd_gemm_rows_ex's modes (attention's products): w stored [k, n] gives
 * the bits of w [n, k], and accumulating starts every chain from y's old
 * value (checked against direct fmaf chains), on both kernels, ragged
 * tiles and blocks, with and without a bias (ignored when accumulating). */
static void check_modes(int m, int n, int k)
{
    operands o;
    size_t ldt = (size_t)n + 3, ny = (size_t)m * (size_t)n;
    float *wt = malloc((size_t)k * ldt * sizeof(float)), *y0 = malloc(ny * sizeof(float));
    float *want = malloc(ny * sizeof(float)), *y = malloc(ny * sizeof(float));
    float *scr = sd_scratch_alloc(1, sd_gemm_rows_scratch_floats());
    unsigned seed = 17u;
    if (!CHECK(make(&o, m, n, k, 0, 41u) && wt && y0 && want && y && scr)) goto done;
    for (int p = 0; p < k; p++)
        for (size_t j = 0; j < ldt; j++) wt[(size_t)p * ldt + j] = j < (size_t)n ? o.w[j * (size_t)k + (size_t)p] : NAN;
    fill(y0, ny, &seed);
    for (int acc = 0; acc <= 1; acc++) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float a = acc ? y0[(size_t)i * n + j] : o.b[j];
                for (int p = 0; p < k; p++) a = fmaf(o.x[(size_t)i * o.ldx + p], o.w[(size_t)j * k + p], a);
                want[(size_t)i * n + j] = a;
            }
        for (int isa = 0; isa <= N_SIMD; isa++) {
            sd_gemm_rows_isa use = isa ? simd_isas[isa - 1] : SD_GEMM_ROWS_PORTABLE;
            if (!sd_gemm_rows_isa_usable(use)) continue;
            for (int kn = 0; kn <= 1; kn++) {
                memcpy(y, y0, ny * sizeof(float));
                sd_gemm_rows_mode mode = {.w_kn = kn, .accumulate = acc};
                sd_gemm_rows_ex(use, m, n, k, o.x, o.ldx, kn ? wt : o.w, kn ? ldt : (size_t)k, mode, o.b, y, (size_t)n,
                                scr);
                if (!CHECK(memcmp(y, want, ny * sizeof(float)) == 0))
                    fprintf(stderr, "  modes m %d n %d k %d: accumulate %d, w [k, n] %d, isa %d differ\n", m, n, k,
                            acc, kn, (int)use);
            }
        }
    }
done:
    free(wt);
    free(y0);
    free(want);
    free(y);
    free(scr);
    drop(&o);
}

/* 16-bit weights (fp16, bf16): y equals, bit for bit, y from float weights
 * holding the same values (the widening is exact), on both kernels, with
 * a row stride past k, ragged tiles and several k and column blocks; fp16
 * values include subnormals, bf16 ones the full exponent range. */
static void check_half_weights(int m, int n, int k)
{
    operands o;
    size_t ldw = (size_t)k + 5, ny = (size_t)m * (size_t)n;
    uint16_t *h = malloc((size_t)n * ldw * sizeof(uint16_t));
    float *wf = malloc((size_t)n * (size_t)k * sizeof(float)), *want = malloc(ny * sizeof(float));
    float *y = malloc(ny * sizeof(float)), *scr = sd_scratch_alloc(1, sd_gemm_rows_scratch_floats());
    if (!CHECK(make(&o, m, n, k, 0, 43u) && h && wf && want && y && scr)) goto done;
    for (int dt = SD_DT_F16; dt <= SD_DT_BF16; dt++) {
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++) {
                float v = o.w[(size_t)j * k + p] * (p % 7 == 3 ? 1e-6f : p % 11 == 5 ? 300.0f : 1.0f);
                uint16_t b = dt == SD_DT_F16 ? sd_f32_to_f16(v) : sd_f32_to_bf16(v);
                h[(size_t)j * ldw + p] = b;
                wf[(size_t)j * k + p] = dt == SD_DT_F16 ? sd_f16_to_f32(b) : sd_bf16_to_f32(b);
            }
        for (int isa = 0; isa <= N_SIMD; isa++) {
            sd_gemm_rows_isa use = isa ? simd_isas[isa - 1] : SD_GEMM_ROWS_PORTABLE;
            if (!sd_gemm_rows_isa_usable(use)) continue;
            sd_gemm_rows(use, m, n, k, o.x, o.ldx, wf, (size_t)k, o.b, want, (size_t)n, scr);
            sd_gemm_rows_mode mode = {.w_dtype = dt};
            sd_gemm_rows_ex(use, m, n, k, o.x, o.ldx, h, ldw, mode, o.b, y, (size_t)n, scr);
            if (!CHECK(memcmp(y, want, ny * sizeof(float)) == 0))
                fprintf(stderr, "  half weights m %d n %d k %d: %s, isa %d differ\n", m, n, k, sd_dtype_name(dt),
                        (int)use);
        }
        sd_gemm_rows_ref(m, n, k, o.x, o.ldx, h, ldw, dt, o.b, y, (size_t)n); /* the unpacked fallback */
        if (!CHECK(memcmp(y, want, ny * sizeof(float)) == 0))
            fprintf(stderr, "  half weights m %d n %d k %d: %s reference differs\n", m, n, k, sd_dtype_name(dt));
    }
    printf("16-bit weights m %d n %d k %d: fp16 and bf16 equal to their float values\n", m, n, k);
done:
    free(h);
    free(wf);
    free(want);
    free(y);
    free(scr);
    drop(&o);
}

/* sd_linear_fwd (the CPU table's linear) on 1, 2, 3 threads equals the
 * reference bit for bit, with and without bias, and a row alone too. */
static void check_linear_op(int m, int n, int k)
{
    operands o;
    if (!CHECK(make(&o, m, n, k, 0, 5u))) {
        drop(&o);
        return;
    }
    size_t ny = (size_t)m * (size_t)n;
    float *ref = malloc(ny * sizeof(float)), *y = malloc(ny * sizeof(float));
    if (CHECK(ref && y)) {
        sd_linear_shape s = {.m = m, .k = k, .n = n};
        for (int bias = 0; bias <= 1; bias++) {
            sd_gemm_rows_ref(m, n, k, o.x, (size_t)k, o.w, (size_t)k, SD_DT_F32, bias ? o.b : NULL, ref, (size_t)n);
            for (int t = 1; t <= 3; t++) {
                sd_pool *pool = t > 1 ? sd_pool_create(t) : NULL;
                memset(y, 0, ny * sizeof(float));
                sd_linear_fwd(pool, &s, y, o.x, o.w, bias ? o.b : NULL);
                if (!CHECK(memcmp(y, ref, ny * sizeof(float)) == 0))
                    fprintf(stderr, "  linear m %d n %d k %d, %d threads, bias %d: differs\n", m, n, k, t, bias);
                if (pool) sd_pool_destroy(pool);
            }
            sd_linear_shape one = {.m = 1, .k = k, .n = n};
            sd_linear_fwd(NULL, &one, y, o.x + (size_t)(m - 1) * (size_t)k, o.w, bias ? o.b : NULL);
            CHECK(memcmp(y, ref + (size_t)(m - 1) * (size_t)n, (size_t)n * sizeof(float)) == 0);
        }
    }
    free(ref);
    free(y);
    drop(&o);
}

/* w packed once, by sd_gemm_rows_pack and element by element through
 * sd_gemm_rows_packed_index into zeros (the same panels), then
 * sd_gemm_rows_packed on each kernel: the reference's bits, the row gaps
 * of y untouched. */
static void check_packed(int m, int n, int k, int pad)
{
    operands o;
    size_t np = sd_gemm_rows_packed_floats(n, k), ny;
    float *p1 = sd_scratch_alloc(1, np), *p2 = sd_scratch_alloc(1, np), *ref = NULL, *y = NULL;
    if (!CHECK(make(&o, m, n, k, pad, (unsigned)(m * 7 + n * 5 + k))) || !CHECK(p1 && p2)) goto out;
    ny = (size_t)m * o.ldy;
    ref = malloc(ny * sizeof(float));
    y = malloc(ny * sizeof(float));
    if (!CHECK(ref && y)) goto out;
    memset(p2, 0, np * sizeof(float));
    for (int j = 0; j < n; j++)
        for (int q = 0; q < k; q++) p2[sd_gemm_rows_packed_index(n, k, j, q)] = o.w[(size_t)j * (size_t)k + (size_t)q];
    for (size_t i = 0; i < ny; i++) ref[i] = 7.0f;
    sd_gemm_rows_ref(m, n, k, o.x, o.ldx, o.w, (size_t)k, SD_DT_F32, o.b, ref, o.ldy);
    static const sd_gemm_rows_isa all[] = {SD_GEMM_ROWS_PORTABLE, SD_GEMM_ROWS_AVX2, SD_GEMM_ROWS_AVX512};
    for (int v = 0; v < 3; v++) {
        if (!sd_gemm_rows_isa_usable(all[v])) continue;
        memset(p1, 0xff, np * sizeof(float));
        sd_gemm_rows_pack(all[v], n, k, o.w, (size_t)k, p1);
        if (!CHECK(memcmp(p1, p2, np * sizeof(float)) == 0))
            fprintf(stderr, "  m %d n %d k %d: %s packing differs from the index\n", m, n, k,
                    sd_gemm_rows_isa_name(all[v]));
        for (size_t i = 0; i < ny; i++) y[i] = 7.0f;
        sd_gemm_rows_packed(all[v], m, n, k, o.x, o.ldx, p2, o.b, y, o.ldy);
        if (!CHECK(memcmp(ref, y, ny * sizeof(float)) == 0))
            fprintf(stderr, "  m %d n %d k %d pad %d: %s packed product differs\n", m, n, k, pad,
                    sd_gemm_rows_isa_name(all[v]));
    }
out:
    free(ref);
    free(y);
    free(p1);
    free(p2);
    drop(&o);
}

int main(void)
{
    printf("best kernel: %s\n", sd_gemm_rows_isa_name(sd_gemm_rows_best_isa()));
    for (int v = 0; v < N_SIMD; v++)
        if (!sd_gemm_rows_isa_usable(simd_isas[v]))
            printf("SKIP: the %s kernel (this CPU or build lacks it); the others are checked\n",
                   sd_gemm_rows_isa_name(simd_isas[v]));
    /* m, n, k, row padding: single elements, exact and ragged tiles, k across the 512-step blocks, n across
     * the 192-column blocks; n = 48, 80, 144 (per column block) give odd panel counts, where the 6 x 32
     * tiles end in a 6 x 16 one */
    static const int shapes[][4] = {{1, 1, 1, 0},     {1, 16, 1, 0},    {6, 16, 8, 0},     {7, 1, 5, 3},
                                    {1, 17, 9, 0},    {5, 15, 1, 2},    {13, 33, 257, 1},  {12, 32, 256, 0},
                                    {77, 40, 300, 0}, {19, 257, 513, 5}, {7, 200, 1030, 0}, {6, 300, 31, 0},
                                    {11, 47, 7, 4},   {6, 32, 1, 0},    {12, 48, 40, 2},   {18, 80, 77, 0},
                                    {6, 31, 3, 0},    {25, 64, 600, 1}, {6, 400, 64, 0},   {13, 144, 520, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    for (int v = 0; v < N_SIMD; v++)
        if (sd_gemm_rows_isa_usable(simd_isas[v])) check_rows_alone(simd_isas[v], 400, 1100);
    check_rows_alone(SD_GEMM_ROWS_PORTABLE, 40, 1030);
    check_modes(13, 33, 257);
    check_modes(7, 200, 1030);
    check_modes(512, 40, 512);
    check_modes(77, 77, 64);
    check_modes(20, 80, 33);
    check_half_weights(13, 33, 257);
    check_half_weights(7, 200, 1030);
    check_half_weights(1, 16, 9);
    check_half_weights(6, 64, 24);
    check_linear_op(77, 100, 70);
    check_linear_op(616, 520, 600);
    check_linear_op(3, 1, 1);
    check_packed(13, 33, 257, 1);
    check_packed(19, 257, 513, 5);
    check_packed(7, 200, 1030, 0);
    check_packed(32, 640, 640, 0);
    check_packed(1, 4, 9, 2);
    return check_done("test_gemm_rows");
}
