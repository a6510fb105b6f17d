/* sd_gemm_rows: packing, blocking and edge tiles around the micro-kernels
 * (gemm_rows_kern.h), the portable kernel and the unpacked reference. See
 * gemm_rows.h for the one rule all of them keep: an output element is the
 * fused multiply-add chain over k in order, starting from its bias. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "act_store.h"
#include "dtype.h"
#include "f16.h"
#include "gemm_rows.h"
#include "gemm_rows_kern.h"

enum { MR = SD_GEMM_ROWS_MR, NR = SD_GEMM_ROWS_NR, KC = SD_GEMM_ROWS_KC, NC = SD_GEMM_ROWS_NC };

/* Whether this build and CPU run isa's kernel: AVX2 with FMA and F16C
 * (every AVX2 CPU has both; F16C widens fp16 weights); AVX-512 needs
 * AVX-512F on top (it packs and widens with the AVX2 code). The CPU model
 * is the compiler runtime's, read here, never cached by sdtk. */
int sd_gemm_rows_isa_usable(sd_gemm_rows_isa isa)
{
    if (isa == SD_GEMM_ROWS_PORTABLE) return 1;
#if defined(__x86_64__) || defined(__i386__)
    int avx2 = sd_gemm_rows_have_avx2() && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               sd_cpu_has_f16c();
    if (isa == SD_GEMM_ROWS_AVX2) return avx2;
    if (isa == SD_GEMM_ROWS_AVX512) return avx2 && sd_gemm_rows_have_avx512() && __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

/* The widest usable kernel. */
sd_gemm_rows_isa sd_gemm_rows_best_isa(void)
{
    if (sd_gemm_rows_isa_usable(SD_GEMM_ROWS_AVX512)) return SD_GEMM_ROWS_AVX512;
    if (sd_gemm_rows_isa_usable(SD_GEMM_ROWS_AVX2)) return SD_GEMM_ROWS_AVX2;
    return SD_GEMM_ROWS_PORTABLE;
}

/* A fixed name per kernel. */
const char *sd_gemm_rows_isa_name(sd_gemm_rows_isa isa)
{
    return isa == SD_GEMM_ROWS_AVX512 ? "avx512f" : isa == SD_GEMM_ROWS_AVX2 ? "avx2+fma" : "portable";
}

/* One packed block of w (NC columns by KC steps), then room for one
 * panel's rows widened from 16-bit weights (NR rows by KC steps). */
size_t sd_gemm_rows_scratch_floats(void)
{
    return (size_t)NC * KC + (size_t)NR * KC;
}

/* The portable micro-kernel: per row, 16 lanes each advanced by one fmaf
 * per k step, in the order the AVX2 kernel's lanes take. */
void sd_gemm_rows_kern_c(int kc, const float *const *a, const float *bp, const float *init, float *c, size_t ldc)
{
    for (int r = 0; r < MR; r++) {
        float acc[NR];
        memcpy(acc, init ? init : c + (size_t)r * ldc, sizeof acc);
        const float *ar = a[r], *b = bp;
        for (int p = 0; p < kc; p++, b += NR)
            for (int j = 0; j < NR; j++) acc[j] = fmaf(ar[p], b[j], acc[j]);
        memcpy(c + (size_t)r * ldc, acc, sizeof acc);
    }
}

/* w[n, k0 .. k0 + kc) transposed into panels: panel q holds, for each of
 * the kc steps, the 16 weights of columns 16q .. 16q + 15 (zeros past n).
 * A copy, so every way of doing it gives the same panels: the AVX2 one
 * moves 8 x 8 blocks, this one the rest. */
static void pack_block(sd_gemm_rows_isa isa, float *dst, const float *w, size_t ldw, int n, int k0, int kc)
{
    for (int c0 = 0; c0 < n; c0 += NR, dst += (size_t)kc * NR) {
        int nc = n - c0 < NR ? n - c0 : NR, done = 0;
        if (isa != SD_GEMM_ROWS_PORTABLE && nc == NR) {
            const float *src = w + (size_t)c0 * ldw + (size_t)k0;
            int next = n - c0 - NR < NR ? n - c0 - NR : NR;
            done = sd_gemm_rows_pack_avx2(dst, src, ldw, kc, next > 0 ? src + NR * ldw : NULL, next > 0 ? next : 0);
        }
        for (int j = 0; j < nc; j++) {
            const float *src = w + (size_t)(c0 + j) * ldw + (size_t)k0;
            for (int p = done; p < kc; p++) dst[(size_t)p * NR + (size_t)j] = src[p];
        }
        for (int j = nc; j < NR; j++)
            for (int p = 0; p < kc; p++) dst[(size_t)p * NR + (size_t)j] = 0.0f;
    }
}

/* Rows [0, rows) of a 16-bit w (fp16 or bf16), steps [k0, k0 + kc), as
 * floats into dst (rows kc apart): both widenings are exact. */
static void widen_rows(sd_gemm_rows_isa isa, float *dst, const uint16_t *w, size_t ldw, int rows, int k0, int kc,
                       int dtype)
{
    for (int j = 0; j < rows; j++) {
        const uint16_t *src = w + (size_t)j * ldw + (size_t)k0;
        float *d = dst + (size_t)j * (size_t)kc;
        if (isa != SD_GEMM_ROWS_PORTABLE && dtype == SD_DT_BF16) sd_gemm_rows_widen_bf16_avx2(d, src, kc);
        else if (isa != SD_GEMM_ROWS_PORTABLE) sd_gemm_rows_widen_f16_avx2(d, src, kc);
        else if (dtype == SD_DT_BF16)
            for (int p = 0; p < kc; p++) d[p] = sd_bf16_to_f32(src[p]);
        else
            for (int p = 0; p < kc; p++) d[p] = sd_f16_to_f32(src[p]);
    }
}

/* pack_block for 16-bit w: each panel's rows widened into tmp first, then
 * packed from there as float rows, so the panels hold the exact floats. */
static void pack_block_half(sd_gemm_rows_isa isa, float *dst, const uint16_t *w, size_t ldw, int n, int k0, int kc,
                            int dtype, float *tmp)
{
    for (int c0 = 0; c0 < n; c0 += NR, dst += (size_t)kc * NR) {
        int nc = n - c0 < NR ? n - c0 : NR;
        widen_rows(isa, tmp, w + (size_t)c0 * ldw, ldw, nc, k0, kc, dtype);
        pack_block(isa, dst, tmp, (size_t)kc, nc, 0, kc);
    }
}

/* The same panels from w stored [k, n] (w_kn): step p of panel q is the
 * 16 consecutive floats of w's row k0 + p from column 16q, a plain copy. */
static void pack_block_kn(float *dst, const float *w, size_t ldw, int n, int k0, int kc)
{
    for (int c0 = 0; c0 < n; c0 += NR, dst += (size_t)kc * NR) {
        int nc = n - c0 < NR ? n - c0 : NR;
        for (int p = 0; p < kc; p++) {
            float *d = dst + (size_t)p * NR;
            memcpy(d, w + (size_t)(k0 + p) * ldw + (size_t)c0, (size_t)nc * sizeof(float));
            for (int j = nc; j < NR; j++) d[j] = 0.0f;
        }
    }
}

/* One 6 x 16 micro-tile through the chosen kernel (the AVX2 one for
 * AVX-512 too: the same bits, and 12 independent chains where a 6 x 16
 * zmm tile would have only 6). */
static void run_kernel(sd_gemm_rows_isa isa, int kc, const float *const *a, const float *bp, const float *init,
                       float *c, size_t ldc)
{
    if (isa != SD_GEMM_ROWS_PORTABLE) sd_gemm_rows_kern_avx2(kc, a, bp, init, c, ldc);
    else sd_gemm_rows_kern_c(kc, a, bp, init, c, ldc);
}

/* A tile with fewer than 6 rows or 16 columns: the kernel runs on a copy
 * (its start values: the first nc of init in every row, or c's; missing
 * rows repeat the last real one, missing columns see zero weights) and
 * only the real part goes back. Lanes never mix, so the real elements get
 * exactly the bits a full tile would give them. */
static void run_edge(sd_gemm_rows_isa isa, int kc, const float *const *a, const float *bp, const float *init,
                     float *c, size_t ldc, int mr, int nc)
{
    float t[MR * NR] = {0};
    for (int r = 0; r < mr; r++) memcpy(t + r * NR, init ? init : c + (size_t)r * ldc, (size_t)nc * sizeof(float));
    run_kernel(isa, kc, a, bp, NULL, t, NR);
    for (int r = 0; r < mr; r++) memcpy(c + (size_t)r * ldc, t + r * NR, (size_t)nc * sizeof(float));
}

/* Asks for cache lines [first, first + count) of the next row block's
 * slice of x (rows of kc floats, up to 6 rows, `left` of them real) while
 * the current block runs, a share per panel: the first panel of a block
 * would otherwise wait on L3 for all 6 rows. Timing only. */
static void prefetch_next(const float *xn, size_t ldx, int left, int kc, int first, int count)
{
    int rows = left < MR ? left : MR, lines = (kc + 15) / 16;
    for (int l = first; l < first + count && l < rows * lines; l++) {
        int at = (l % lines) * 16; /* the line's first float, kept inside the row's slice */
        __builtin_prefetch(xn + (size_t)(l / lines) * ldx + (size_t)(at < kc ? at : kc - 1));
    }
}

/* Asks for the y tile the next kernel call starts from (rows of cols <= 16
 * floats, one or two lines each): y is too big for L2 when m is large, and the
 * kernel's first loads would wait on it. Timing only. */
static void prefetch_tile(const float *c, size_t ldc, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        __builtin_prefetch(c + (size_t)r * ldc, 1);
        __builtin_prefetch(c + (size_t)r * ldc + cols - 1, 1);
    }
}

/* The step that cuts len into the fewest blocks of at most cap, as even as
 * a multiple of unit allows (320 -> 160 + 160, not 256 + 64: a thin last
 * block wastes a pass over x). */
static int even_block(int len, int cap, int unit)
{
    int blocks = (len + cap - 1) / cap, step = (len + blocks - 1) / blocks;
    step = (step + unit - 1) / unit * unit;
    return step > cap ? cap : step;
}

/* The linear's case: w [n, k], chains from the bias. */
void sd_gemm_rows(sd_gemm_rows_isa isa, int m, int n, int k, const float *x, size_t ldx, const float *w, size_t ldw,
                  const float *bias, float *y, size_t ldy, float *scratch)
{
    sd_gemm_rows_ex(isa, m, n, k, x, ldx, w, ldw, (sd_gemm_rows_mode){0}, bias, y, ldy, scratch);
}

/* Every 6-row block of x (its 6 x kc slice in L1; copying it to a
 * contiguous buffer measured slower) over the packed panels bp of one
 * block: columns [j0, j0 + nb), steps [k0, k0 + kc) of k. The first k
 * block starts each tile from the bias (or, when accumulating, from y), so
 * y is never written before its first real value; after the last k block
 * each row block's strip goes through mode.finish. */
static void run_block(sd_gemm_rows_isa isa, int m, int k, const float *x, size_t ldx, const float *bp0, int j0,
                      int nb, int k0, int kc, sd_gemm_rows_mode mode, const float *bias, float *y, size_t ldy)
{
    static const float zeros[3 * NR]; /* the start of every chain without a bias (read-only) */
    int panels = (nb + NR - 1) / NR, per = (MR * ((kc + 15) / 16) + panels - 1) / panels;
    for (int i0 = 0; i0 < m; i0 += MR) {
        int mr = m - i0 < MR ? m - i0 : MR;
        const float *a[MR];
        for (int r = 0; r < MR; r++) a[r] = x + (size_t)(i0 + (r < mr ? r : mr - 1)) * ldx + (size_t)k0;
        const float *bp = bp0;
        float *c = y + (size_t)i0 * ldy + (size_t)j0;
        for (int q = 0, c0 = 0; c0 < nb; q++, c0 += NR, bp += (size_t)kc * NR) {
            int nc = nb - c0 < NR ? nb - c0 : NR;
            /* AVX-512: panels per tile, 2 (32 columns) or 3 when 33..48 columns are left (so n = 40
             * is one 6 x 48 tile, not a 6 x 32 and an 8-column edge); 0: a 6 x 16 tile */
            int np = isa != SD_GEMM_ROWS_AVX512 || mr < MR || nb - c0 <= NR ? 0 : nb - c0 > 2 * NR && nb - c0 <= 3 * NR ? 3 : 2;
            int span = np ? np * NR : NR; /* columns the tile covers */
            int left = m - i0 - MR;       /* rows after this block */
            if (left > 0)
                prefetch_next(x + (size_t)(i0 + MR) * ldx + (size_t)k0, ldx, left, kc, q * per, per * (span / NR));
            int c1 = c0 + span; /* the next tile's first column */
            if (c1 < nb) prefetch_tile(c + c1, ldy, mr, nb - c1 < NR ? nb - c1 : NR);
            else if (left > 0) prefetch_tile(c + (size_t)MR * ldy, ldy, left < MR ? left : MR, nb < NR ? nb : NR);
            const float *init = k0 || mode.accumulate ? NULL : bias ? bias + j0 + c0 : zeros;
            if (np) {
                int last = nb - c0 - (np - 1) * NR < NR ? nb - c0 - (np - 1) * NR : NR;
                sd_gemm_rows_kern_avx512(np, kc, a, bp, last, init, c + c0, ldy);
                q += np - 1;
                c0 += (np - 1) * NR;
                bp += (size_t)(np - 1) * (size_t)kc * NR;
            } else if (mr == MR && nc == NR) run_kernel(isa, kc, a, bp, init, c + c0, ldy);
            else run_edge(isa, kc, a, bp, init, c + c0, ldy, mr, nc);
        }
        if (mode.finish && k0 + kc == k) mode.finish(mode.finish_ctx, c, ldy, mr, nb);
    }
}

/* Per block of NC columns and KC steps of k, the block of w is packed once
 * (384 KB: stays in L2) and run_block runs every row block of x over it. */
void sd_gemm_rows_ex(sd_gemm_rows_isa isa, int m, int n, int k, const float *x, size_t ldx, const void *wv, size_t ldw,
                     sd_gemm_rows_mode mode, const float *bias, float *y, size_t ldy, float *scratch)
{
    const float *w = wv;
    int half = mode.w_dtype == SD_DT_F16 || mode.w_dtype == SD_DT_BF16;
    int nstep = even_block(n, NC, NR), kstep = even_block(k, KC, 8);
    for (int j0 = 0; j0 < n; j0 += nstep) {
        int nb = n - j0 < nstep ? n - j0 : nstep;
        for (int k0 = 0; k0 < k; k0 += kstep) {
            int kc = k - k0 < kstep ? k - k0 : kstep;
            if (half)
                pack_block_half(isa, scratch, (const uint16_t *)wv + (size_t)j0 * ldw, ldw, nb, k0, kc, mode.w_dtype,
                                scratch + (size_t)NC * KC);
            else if (mode.w_kn) pack_block_kn(scratch, w + j0, ldw, nb, k0, kc);
            else pack_block(isa, scratch, w + (size_t)j0 * ldw, ldw, nb, k0, kc);
            run_block(isa, m, k, x, ldx, scratch, j0, nb, k0, kc, mode, bias, y, ldy);
        }
    }
}

/* n rounded up to whole panels. */
static size_t panel_cols(int n)
{
    return (size_t)(n + NR - 1) / NR * NR;
}

/* Every block's panels one after another, in the order sd_gemm_rows_ex
 * packs them (column blocks, and within each its k blocks): the blocks
 * before column j0 are whole (nstep is a multiple of 16), so they take
 * j0 * k floats. */
size_t sd_gemm_rows_packed_floats(int n, int k)
{
    return panel_cols(n) * (size_t)k;
}

/* Where w's element (j, p) lies in that layout: its block's start, its
 * panel's, its step's, its lane. */
size_t sd_gemm_rows_packed_index(int n, int k, int j, int p)
{
    int nstep = even_block(n, NC, NR), kstep = even_block(k, KC, 8);
    int j0 = j / nstep * nstep, k0 = p / kstep * kstep;
    int nb = n - j0 < nstep ? n - j0 : nstep, kc = k - k0 < kstep ? k - k0 : kstep;
    return (size_t)j0 * (size_t)k + panel_cols(nb) * (size_t)k0 + (size_t)((j - j0) / NR) * (size_t)kc * NR +
           (size_t)(p - k0) * NR + (size_t)((j - j0) % NR);
}

/* Each block packed by the same pack_block sd_gemm_rows_ex calls, into its
 * place in the layout. */
void sd_gemm_rows_pack(sd_gemm_rows_isa isa, int n, int k, const float *w, size_t ldw, float *packed)
{
    int nstep = even_block(n, NC, NR), kstep = even_block(k, KC, 8);
    for (int j0 = 0; j0 < n; j0 += nstep) {
        int nb = n - j0 < nstep ? n - j0 : nstep;
        for (int k0 = 0; k0 < k; k0 += kstep)
            pack_block(isa, packed + sd_gemm_rows_packed_index(n, k, j0, k0), w + (size_t)j0 * ldw, ldw, nb, k0,
                       k - k0 < kstep ? k - k0 : kstep);
    }
}

/* sd_gemm_rows_ex's loops with the blocks read from packed. */
void sd_gemm_rows_packed(sd_gemm_rows_isa isa, int m, int n, int k, const float *x, size_t ldx, const float *packed,
                         const float *bias, float *y, size_t ldy)
{
    int nstep = even_block(n, NC, NR), kstep = even_block(k, KC, 8);
    for (int j0 = 0; j0 < n; j0 += nstep) {
        int nb = n - j0 < nstep ? n - j0 : nstep;
        for (int k0 = 0; k0 < k; k0 += kstep)
            run_block(isa, m, k, x, ldx, packed + sd_gemm_rows_packed_index(n, k, j0, k0), j0, nb, k0,
                      k - k0 < kstep ? k - k0 : kstep, (sd_gemm_rows_mode){0}, bias, y, ldy);
    }
}

/* Element i of w as a float: floats as they are, 16-bit values widened
 * exactly. */
static float weight_at(const void *w, int w_dtype, size_t i)
{
    if (w_dtype == SD_DT_F16) return sd_f16_to_f32(((const uint16_t *)w)[i]);
    if (w_dtype == SD_DT_BF16) return sd_bf16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

/* Each element's chain straight from x and w. */
void sd_gemm_rows_ref(int m, int n, int k, const float *x, size_t ldx, const void *w, size_t ldw, int w_dtype,
                      const float *bias, float *y, size_t ldy)
{
    for (int i = 0; i < m; i++) {
        const float *xr = x + (size_t)i * ldx;
        for (int j = 0; j < n; j++) {
            float acc = bias ? bias[j] : 0.0f;
            for (int p = 0; p < k; p++) acc = fmaf(xr[p], weight_at(w, w_dtype, (size_t)j * ldw + (size_t)p), acc);
            y[(size_t)i * ldy + (size_t)j] = acc;
        }
    }
}
