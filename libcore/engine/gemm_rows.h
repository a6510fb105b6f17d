/* The engine's own sgemm for the linear forward, y = b + x w^T (torch's
 * weight layout [n, k]), single-threaded per call. Unlike a BLAS sgemm its
 * result is a function of the row alone: every output element is one
 * sequential chain of fused multiply-adds, acc = b[j] (or 0), then
 * acc = fmaf(x[i][p], w[j][p], acc) for p = 0, 1, ..., k-1 in that order,
 * whatever the row count m, the row's position, the caller's split into
 * blocks, and whichever kernel (AVX2+FMA micro-kernel, its edge tiles, the
 * portable C fallback, the unpacked reference) computes it. A row's result
 * is therefore bit-identical when it is computed alone or inside a batch,
 * which is what lets the CLIP text encoder run several captions through one
 * GEMM without a caption's embedding depending on its neighbours.
 *
 * Structure (gemm_rows.c): w is packed per call (or once for many calls:
 * sd_gemm_rows_pack / sd_gemm_rows_packed), in blocks of up to
 * SD_GEMM_ROWS_NC columns by SD_GEMM_ROWS_KC steps of k, into panels of 16
 * output columns; a 6 x 16
 * micro-kernel (gemm_rows_avx2.c: 12 ymm accumulators) runs each row block
 * over each panel (on AVX-512 CPUs a 6 x 32 one, gemm_rows_avx512.c: 12 zmm
 * accumulators, over each pair of adjacent panels), keeping the tile of y in registers across the k block
 * and in y between blocks (a float store and reload changes nothing). */
#ifndef SDTK_GEMM_ROWS_H
#define SDTK_GEMM_ROWS_H

#include <stddef.h>

enum {
    SD_GEMM_ROWS_MR = 6,  /* rows of a micro-tile */
    SD_GEMM_ROWS_NR = 16, /* columns of a micro-tile and of a packed panel */
    SD_GEMM_ROWS_KC = 512, /* k values per packed block */
    SD_GEMM_ROWS_NC = 192  /* output columns per packed block (with KC: 384 KB, in L2) */
};

/* Which micro-kernel runs the tiles; every choice gives the same bits. */
typedef enum { SD_GEMM_ROWS_PORTABLE = 0, SD_GEMM_ROWS_AVX2 = 1, SD_GEMM_ROWS_AVX512 = 2 } sd_gemm_rows_isa;

/* The fastest kernel this CPU runs (AVX-512F as well: SD_GEMM_ROWS_AVX512;
 * AVX2 and FMA: SD_GEMM_ROWS_AVX2). Asks the compiler runtime's CPU model
 * (filled once at program start by libgcc/compiler-rt, not by sdtk), so
 * it is cheap enough to call once per op. */
sd_gemm_rows_isa sd_gemm_rows_best_isa(void);

/* Whether this build and CPU run isa's kernel (the portable one always). */
int sd_gemm_rows_isa_usable(sd_gemm_rows_isa isa);

/* The kernel's name for logs and benchmarks: "portable", "avx2+fma",
 * "avx512f". */
const char *sd_gemm_rows_isa_name(sd_gemm_rows_isa isa);

/* Floats of scratch sd_gemm_rows needs (one packed block of w, 384 KB, and
 * a panel's rows widened from 16-bit weights, 32 KB). */
size_t sd_gemm_rows_scratch_floats(void);

/* y[m, n] (row stride ldy) = bias[n] + x[m, k] (row stride ldx)
 * w[n, k]^T (row stride ldw); bias may be NULL (zeros). scratch holds
 * sd_gemm_rows_scratch_floats() floats, 32-byte aligned. m, n, k > 0. */
void sd_gemm_rows(sd_gemm_rows_isa isa, int m, int n, int k, const float *x, size_t ldx, const float *w, size_t ldw,
                  const float *bias, float *y, size_t ldy, float *scratch);

/* How sd_gemm_rows_ex reads w and where each chain starts. */
typedef struct {
    int w_kn;       /* w is [k, n] (row stride ldw): y = x w, e.g. attention's P v */
    int w_dtype;    /* 0 or SD_DT_F32: w holds floats; SD_DT_F16 / SD_DT_BF16: 16-bit
                       values ([n, k] only), widened to float exactly while packing,
                       so y equals the float weights' y bit for bit */
    int accumulate; /* chains start from y's contents (y += x w^T), bias ignored */
    /* called once on each block of y whose chains are complete (rows x
     * cols at y, stride ldy), right after its last k step, while the block
     * is in cache: e.g. an activation in place. NULL: none. */
    void (*finish)(const void *ctx, float *y, size_t ldy, int rows, int cols);
    const void *finish_ctx;
} sd_gemm_rows_mode;

/* sd_gemm_rows with w in either layout and optionally adding into y; the
 * same rule: element (i, j) is one fused multiply-add chain over p in
 * order, x[i][p] times w's (j, p) element, from bias[j], 0 or y[i][j]. */
void sd_gemm_rows_ex(sd_gemm_rows_isa isa, int m, int n, int k, const float *x, size_t ldx, const void *w, size_t ldw,
                     sd_gemm_rows_mode mode, const float *bias, float *y, size_t ldy, float *scratch);

/* Packing w once for many calls (weights constant across calls, e.g.
 * conv_wino's transformed filters): the panels every block of
 * sd_gemm_rows_ex would pack, stored one block after another. Floats they
 * take for w [n, k] (n rounded up to 16 times k), where w's element
 * (j, p) lies in them (padding lanes past n must hold zeros), and the
 * packing of a float w [n, k] (row stride ldw). */
size_t sd_gemm_rows_packed_floats(int n, int k);
size_t sd_gemm_rows_packed_index(int n, int k, int j, int p);
void sd_gemm_rows_pack(sd_gemm_rows_isa isa, int n, int k, const float *w, size_t ldw, float *packed);

/* sd_gemm_rows with w given as those packed panels: no packing and no
 * scratch, and the same bits as sd_gemm_rows on the unpacked w. */
void sd_gemm_rows_packed(sd_gemm_rows_isa isa, int m, int n, int k, const float *x, size_t ldx, const float *packed,
                         const float *bias, float *y, size_t ldy);

/* The same result by direct loops over w ([n, k], floats or the 16-bit
 * values of w_dtype as in sd_gemm_rows_mode), no packing and no scratch:
 * the fallback when scratch cannot be allocated and the oracle of the
 * bitwise tests. */
void sd_gemm_rows_ref(int m, int n, int k, const float *x, size_t ldx, const void *w, size_t ldw, int w_dtype,
                      const float *bias, float *y, size_t ldy);

#endif
