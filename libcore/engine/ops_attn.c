/* Scaled dot-product attention forward and backward, blockwise (the
 * flash-attention recipe): forward walks key tiles per query tile with an
 * online softmax and keeps only the log-sum-exp of each row; backward
 * recomputes the probabilities tile by tile from it. Scores live in one
 * query-tile x key-tile block per worker, so memory is O(T*d) even for the
 * VAE's 16k-token attention. The block products run on the row-exact GEMM
 * (gemm_rows.h: faster than OpenBLAS at these 40..512-wide shapes, no
 * separate pass to clear or scale its output), but for the fused
 * backward's two products with a transposed block, which stay on sgemm.
 * Tile sizes depend on the shape only and every unit (a query tile for y
 * and dq, a key tile for dk and dv, or a whole head) is owned by one
 * worker, so results are bit-identical for any thread count. The
 * row-by-row loops at the end are the reference and the fallback when
 * scratch cannot be allocated. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "gemm_rows.h"
#include "ops_ref.h"
#include "vexp.h"
#include "vexp_avx2.h"
#include "vexp_avx512.h"

/* Positive dims and a positive, finite scale. */
sd_status sd_attn_check(const sd_attn_shape *s, sd_error *err)
{
    if (s->b <= 0 || s->heads <= 0 || s->tq <= 0 || s->tk <= 0 || s->d <= 0)
        return sd_err_set(err, SD_EINVAL, "attention: non-positive dimension");
    if (!(s->scale > 0.0f) || isinf(s->scale)) return sd_err_set(err, SD_EINVAL, "attention: bad scale");
    return SD_OK;
}

enum {
    QTILE = 512, /* query rows per tile, at most */
    KTILE = 512, /* key rows per tile, at most */
    MIN_UNITS = 8
};

typedef struct {
    const sd_attn_shape *s;
    int qt, kt, nqt, nkt; /* tile sizes, tiles per (batch, head) */
    int vx;               /* softmax passes: 0 portable, 1 AVX2 exponentials, 2 AVX-512 (same bits) */
    sd_gemm_rows_isa isa; /* the row-exact GEMM's kernel */
    float *scratch;       /* per worker: the GEMM's packing block, then the score blocks */
    size_t sstride;
    float *drow; /* D_i = dy_i . y_i for every query row (backward) */
    int ld;      /* forward only: 0 head-major, else token-major with q/k/v rows ld floats apart */
    float *y, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dy, *cy, *clse;
} gattn;

/* Tile size for a sequence of len rows: at most cap, small enough for
 * MIN_UNITS tiles; a function of the shape only. */
static int tile_of(int len, int cap)
{
    int t = (len + MIN_UNITS - 1) / MIN_UNITS;
    return t > cap ? cap : t < 1 ? 1 : t;
}

/* Tile sizes and counts for shape s. Query tiles are the forward's units,
 * so MIN_UNITS of them per head; key tiles are units only in the split
 * backward (key_units set), elsewhere they are as long as KTILE allows (a
 * cross-attention's 77 keys one tile, not 8 of 10). */
static void gattn_plan(gattn *g, const sd_attn_shape *s, int key_units)
{
    g->s = s;
    g->vx = sd_vexp_avx512_usable() ? 2 : sd_vexp_avx2_usable() ? 1 : 0;
    g->isa = sd_gemm_rows_best_isa();
    g->qt = tile_of(s->tq, QTILE);
    g->kt = key_units ? tile_of(s->tk, KTILE) : s->tk < KTILE ? s->tk : KTILE;
    g->nqt = (s->tq + g->qt - 1) / g->qt;
    g->nkt = (s->tk + g->kt - 1) / g->kt;
}

/* Floats of a worker's scratch: the GEMM's packing block, then `blocks`
 * score blocks of qt x kt, then `rows` floats per query row. */
static size_t worker_floats(const gattn *g, int blocks, int rows)
{
    return sd_gemm_rows_scratch_floats() + (size_t)blocks * (size_t)g->qt * (size_t)g->kt +
           (size_t)rows * (size_t)g->qt;
}

/* Worker w's packing block; its score blocks follow it. */
static float *worker_pack(const gattn *g, int worker)
{
    return g->scratch + (size_t)worker * g->sstride;
}

/* out[i][j] = a_i . b_j (rows of a and b lda and ldb floats apart), not
 * yet scaled. */
static void dots_ld(const gattn *g, float *pack, const float *a, size_t lda, int na, const float *b, size_t ldb,
                    int nb, float *out)
{
    sd_gemm_rows(g->isa, na, nb, g->s->d, a, lda, b, ldb, NULL, out, (size_t)nb, pack);
}

/* scores() with rows of a and b lda and ldb floats apart. */
static void scores_ld(const gattn *g, float *pack, const float *a, size_t lda, int na, const float *b, size_t ldb,
                      int nb, float *out)
{
    float sc = g->s->scale;
    dots_ld(g, pack, a, lda, na, b, ldb, nb, out);
    size_t n = (size_t)na * (size_t)nb;
    for (size_t i = 0; i < n; i++) out[i] *= sc;
}

/* Scores of na rows of a against nb rows of b (both d wide): out[i][j] =
 * scale * (a_i . b_j), the dot product one FMA chain in order; since
 * fma(x, y, z) = fma(y, x, z) the transposed block (keys against queries)
 * holds exactly the same values, so every pass sees the same P. */
static void scores(const gattn *g, float *pack, const float *a, int na, const float *b, int nb, float *out)
{
    scores_ld(g, pack, a, (size_t)g->s->d, na, b, (size_t)g->s->d, nb, out);
}

/* add_product() with rows of b and acc ldb and ldacc floats apart. */
static void add_product_ld(const gattn *g, float *pack, const float *p, int na, int nk, const float *b, size_t ldb,
                           float *acc, size_t ldacc)
{
    sd_gemm_rows_mode mode = {.w_kn = 1, .accumulate = 1};
    sd_gemm_rows_ex(g->isa, na, g->s->d, nk, p, (size_t)nk, b, ldb, mode, NULL, acc, ldacc, pack);
}

/* acc[na, d] += p[na, nk] b[nk, d], each element one FMA chain over the nk
 * keys (or queries) in order from acc's old value. */
static void add_product(const gattn *g, float *pack, const float *p, int na, int nk, const float *b, float *acc)
{
    add_product_ld(g, pack, p, na, nk, b, (size_t)g->s->d, acc, (size_t)g->s->d);
}

/* Keys query row i may see among the nk keys from j0: all of them, or
 * those with j <= i under the causal mask (0 when none). */
static int row_keys(const sd_attn_shape *s, int i, int j0, int nk)
{
    if (!s->causal) return nk;
    int lim = i - j0 + 1;
    return lim < 0 ? 0 : lim > nk ? nk : lim;
}

/* x[j] = e^(x[j] - m) for j < n, 8 wide with AVX2 or 16 with AVX-512
 * (vx 1 or 2; the same bits). */
static void exp_shift(int n, float *restrict x, float m, int vx)
{
    if (vx == 2) {
        sd_vexp_shift_avx512(n, x, m);
        return;
    }
    if (vx == 1) {
        sd_vexp_shift_avx2(n, x, m);
        return;
    }
    for (int j = 0; j < n; j++) x[j] = sd_vexpf(x[j] - m);
}

/* x[j] = e^(x[j] - m) for j < n; returns their sum, taken in 8 interleaved
 * partial sums added in a fixed order. */
static float exp_shift_sum(int n, float *restrict x, float m, int vx)
{
    if (vx == 2) return sd_vexp_shift_sum_avx512(n, x, m);
    float acc[8] = {0};
    int j = 0;
    exp_shift(n, x, m, vx);
    for (j = 0; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += x[j + l];
    for (; j < n; j++) acc[j & 7] += x[j];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* Maximum of x[0..n) and m, in 8 interleaved partial maxima. */
static float row_max(int n, const float *restrict x, float m)
{
    float mx[8] = {m, m, m, m, m, m, m, m};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) mx[l] = x[j + l] > mx[l] ? x[j + l] : mx[l];
    for (; j < n; j++) mx[0] = x[j] > mx[0] ? x[j] : mx[0];
    for (int l = 1; l < 8; l++) mx[0] = mx[l] > mx[0] ? mx[l] : mx[0];
    return mx[0];
}

/* x[j] *= scale for j < n, then row_max(n, x, m): one pass with AVX-512
 * (vx 2), the same values. */
static float scale_max(int n, float *restrict x, float scale, float m, int vx)
{
    if (vx == 2) return sd_scale_max_avx512(n, x, scale, m);
    for (int j = 0; j < n; j++) x[j] *= scale;
    return row_max(n, x, m);
}

/* Softmax backward on one row of n entries: p = e^(s - lse) into s and
 * dp = p (dp - D) scale, lse and D one value for the row (query rows) or one
 * per entry (key rows, the transposed blocks; then lse_v and d_v are set). */
static void grad_row(int n, float *restrict sr, float *restrict dp, float lse, float D, const float *restrict lse_v,
                     const float *restrict d_v, float scale, int vx)
{
    if (lse_v)
        for (int j = 0; j < n; j++) sr[j] = sd_vexpf(sr[j] - lse_v[j]);
    else
        exp_shift(n, sr, lse, vx);
    if (!dp) return;
    if (d_v)
        for (int j = 0; j < n; j++) dp[j] = sr[j] * (dp[j] - d_v[j]) * scale;
    else
        for (int j = 0; j < n; j++) dp[j] = sr[j] * (dp[j] - D) * scale;
}

/* Where the forward's unit finds its rows: the first query row i0 of
 * (batch, head) bh in q and y, its first key row in k and v, and the row
 * strides (d head-major; token-major: ld for q, k, v and heads * d for y). */
typedef struct {
    const float *q, *k, *v;
    float *y;
    size_t ldi, ldy;
} fwd_rows;

/* The unit's row pointers in either layout. */
static fwd_rows fwd_rows_of(const gattn *g, size_t bh, int i0)
{
    const sd_attn_shape *s = g->s;
    size_t d = (size_t)s->d;
    if (!g->ld) {
        size_t row0 = bh * (size_t)s->tq + (size_t)i0, key0 = bh * (size_t)s->tk * d;
        return (fwd_rows){g->q + row0 * d, g->k + key0, g->v + key0, g->y + row0 * d, d, d};
    }
    size_t b = bh / (size_t)s->heads, h = bh % (size_t)s->heads, ld = (size_t)g->ld, w = (size_t)s->heads * d;
    size_t qrow = b * (size_t)s->tq + (size_t)i0, krow = b * (size_t)s->tk;
    return (fwd_rows){g->q + qrow * ld + h * d, g->k + krow * ld + h * d, g->v + krow * ld + h * d,
                      g->y + qrow * w + h * d, ld, w};
}

/* Forward: one unit is a query tile of one (batch, head). Per key tile,
 * S = scale q k^T; the running row maxima m and sums l absorb it, y is
 * rescaled where a maximum grew and gains exp(S - m) v. */
static void gattn_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gattn *g = vctx;
    const sd_attn_shape *s = g->s;
    size_t d = (size_t)s->d;
    float *pk = worker_pack(g, worker), *S = pk + sd_gemm_rows_scratch_floats();
    float *m = S + (size_t)g->qt * (size_t)g->kt, *l = m + g->qt;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / (size_t)g->nqt;
        int i0 = (int)(u % (size_t)g->nqt) * g->qt, nq = s->tq - i0 < g->qt ? s->tq - i0 : g->qt;
        fwd_rows r = fwd_rows_of(g, bh, i0);
        for (int i = 0; i < nq; i++) {
            memset(r.y + (size_t)i * r.ldy, 0, d * sizeof(float));
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        int kend = s->causal && i0 + nq < s->tk ? i0 + nq : s->tk;
        for (int j0 = 0; j0 < kend; j0 += g->kt) {
            int nk = kend - j0 < g->kt ? kend - j0 : g->kt;
            dots_ld(g, pk, r.q, r.ldi, nq, r.k + (size_t)j0 * r.ldi, r.ldi, nk, S);
            for (int i = 0; i < nq; i++) {
                float *row = S + (size_t)i * (size_t)nk;
                int lim = row_keys(s, i0 + i, j0, nk); /* entries past lim become 0 unscaled */
                float mx = scale_max(lim, row, s->scale, m[i], g->vx);
                float sum = exp_shift_sum(lim, row, mx, g->vx);
                for (int j = lim; j < nk; j++) row[j] = 0.0f;
                if (mx > m[i]) {
                    float a = sd_vexpf(m[i] - mx);
                    float *yr = r.y + (size_t)i * r.ldy;
                    for (size_t t = 0; t < d; t++) yr[t] *= a;
                    l[i] *= a;
                    m[i] = mx;
                }
                l[i] += sum;
            }
            add_product_ld(g, pk, S, nq, nk, r.v + (size_t)j0 * r.ldi, r.ldi, r.y, r.ldy);
        }
        size_t row0 = bh * (size_t)s->tq + (size_t)i0;
        for (int i = 0; i < nq; i++) {
            float *yr = r.y + (size_t)i * r.ldy, inv = 1.0f / l[i];
            for (size_t t = 0; t < d; t++) yr[t] *= inv;
            g->lse[row0 + (size_t)i] = m[i] + logf(l[i]);
        }
    }
}

/* The forward's query tiles: as long as QTILE allows while all heads
 * together still give MIN_UNITS units (CLIP's 12 heads of 77 tokens: one
 * tile per head, not 8 short ones each re-packing the keys). A row's
 * result does not depend on its tile (row-exact products, per-row
 * softmax; the key tiles stay as gattn_plan set them), so this is timing
 * only, and the backward keeps its own tiles. */
static void fwd_query_tiles(gattn *g)
{
    const sd_attn_shape *s = g->s;
    long pairs = (long)s->b * s->heads, per = pairs >= MIN_UNITS ? 1 : (MIN_UNITS + pairs - 1) / pairs;
    long qt = (s->tq + per - 1) / per; /* gattn_plan's qt is the floor */
    if (qt > g->qt) g->qt = qt > QTILE ? QTILE : (int)qt;
    g->nqt = (s->tq + g->qt - 1) / g->qt;
}

static void attn_fwd_ref_any(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                             const float *k, const float *v);

/* The scratch sd_attn_fwd allocates on nworkers (ops_cpu.h). */
size_t sd_attn_fwd_scratch_bytes(int nworkers, const sd_attn_shape *s)
{
    gattn g = {0};
    gattn_plan(&g, s, 0);
    fwd_query_tiles(&g);
    return sd_scratch_bytes(nworkers, worker_floats(&g, 1, 2));
}

/* The forward in either layout (ld 0: head-major). */
static void attn_fwd_any(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                         const float *k, const float *v)
{
    gattn g = {.y = y, .lse = lse, .q = q, .k = k, .v = v, .ld = ld};
    gattn_plan(&g, s, 0);
    fwd_query_tiles(&g);
    size_t per = worker_floats(&g, 1, 2);
    g.sstride = sd_scratch_stride(per);
    g.scratch = sd_scratch_alloc(sd_pool_size(pool), per);
    if (!g.scratch) {
        attn_fwd_ref_any(pool, s, ld, y, lse, q, k, v);
        return;
    }
    sd_pool_for(pool, (size_t)s->b * (size_t)s->heads * (size_t)g.nqt, gattn_fwd_range, &g);
    free(g.scratch);
}

/* y = softmax(q k^T * scale) v; lse saved for backward. */
void sd_attn_fwd(sd_pool *pool, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                 const float *v)
{
    attn_fwd_any(pool, s, 0, y, lse, q, k, v);
}

/* The forward on token-major rows, as a fused q|k|v projection leaves
 * them: no transposes before or after (the CLIP text encoder). */
void sd_attn_rows_fwd(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                      const float *k, const float *v)
{
    attn_fwd_any(pool, s, ld, y, lse, q, k, v);
}

/* D_i = dy_i . y_i for query rows [begin, end): the softmax backward's
 * row term, shared by the dq and the dk pass. */
static void gattn_drow_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gattn *g = vctx;
    size_t d = (size_t)g->s->d;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        const float *a = g->dy + r * d, *b = g->cy + r * d;
        float acc = 0.0f;
        for (size_t t = 0; t < d; t++) acc += a[t] * b[t];
        g->drow[r] = acc;
    }
}

/* P = exp(S - lse) and dS = P (dP - D) scale over an nq x nk block (row i
 * is query i0 + i, column j key j0 + j); masked entries get 0. With trans
 * the blocks are nk x nq (row = key). dS overwrites dP, P overwrites S. */
static void softmax_grad(const gattn *g, size_t row0, int i0, int j0, int nq, int nk, int trans, float *S,
                         float *dP)
{
    const sd_attn_shape *s = g->s;
    if (!trans) {
        for (int i = 0; i < nq; i++) {
            int lim = row_keys(s, i0 + i, j0, nk);
            float *sr = S + (size_t)i * (size_t)nk, *dr = dP ? dP + (size_t)i * (size_t)nk : NULL;
            grad_row(lim, sr, dr, g->clse[row0 + (size_t)i], g->drow[row0 + (size_t)i], NULL, NULL, s->scale, g->vx);
            for (int j = lim; j < nk; j++) {
                sr[j] = 0.0f;
                if (dr) dr[j] = 0.0f;
            }
        }
        return;
    }
    for (int j = 0; j < nk; j++) {
        /* key j0 + j is seen by queries i0 + i >= j0 + j under the mask */
        int first = s->causal ? j0 + j - i0 : 0;
        first = first < 0 ? 0 : first > nq ? nq : first;
        float *sr = S + (size_t)j * (size_t)nq, *dr = dP ? dP + (size_t)j * (size_t)nq : NULL;
        for (int i = 0; i < first; i++) {
            sr[i] = 0.0f;
            if (dr) dr[i] = 0.0f;
        }
        grad_row(nq - first, sr + first, dr ? dr + first : NULL, 0.0f, 0.0f, g->clse + row0 + (size_t)first,
                 g->drow + row0 + (size_t)first, s->scale, 0);
    }
}

/* dq: one unit is a query tile; per key tile S = scale q k^T,
 * dP = dy v^T, dS from softmax_grad, dq += dS k. */
static void gattn_dq_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gattn *g = vctx;
    const sd_attn_shape *s = g->s;
    size_t d = (size_t)s->d, blk = (size_t)g->qt * (size_t)g->kt;
    float *pk = worker_pack(g, worker), *S = pk + sd_gemm_rows_scratch_floats(), *dP = S + blk;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / (size_t)g->nqt;
        int i0 = (int)(u % (size_t)g->nqt) * g->qt, nq = s->tq - i0 < g->qt ? s->tq - i0 : g->qt;
        size_t row0 = bh * (size_t)s->tq + (size_t)i0;
        const float *qb = g->q + row0 * d, *dyb = g->dy + row0 * d;
        const float *kb = g->k + bh * (size_t)s->tk * d, *vb = g->v + bh * (size_t)s->tk * d;
        int kend = s->causal && i0 + nq < s->tk ? i0 + nq : s->tk;
        for (int j0 = 0; j0 < kend; j0 += g->kt) {
            int nk = kend - j0 < g->kt ? kend - j0 : g->kt;
            scores(g, pk, qb, nq, kb + (size_t)j0 * d, nk, S);
            sd_gemm_rows(g->isa, nq, nk, s->d, dyb, d, vb + (size_t)j0 * d, d, NULL, dP, (size_t)nk, pk);
            softmax_grad(g, row0, i0, j0, nq, nk, 0, S, dP);
            add_product(g, pk, dP, nq, nk, kb + (size_t)j0 * d, g->dq + row0 * d);
        }
    }
}

/* dk, dv: one unit is a key tile; per query tile that sees it, the
 * transposed blocks S^T = scale k q^T and dP^T = v dy^T give P^T and
 * dS^T; dv += P^T dy and dk += dS^T q. */
static void gattn_dkv_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gattn *g = vctx;
    const sd_attn_shape *s = g->s;
    size_t d = (size_t)s->d, blk = (size_t)g->qt * (size_t)g->kt;
    float *pk = worker_pack(g, worker), *St = pk + sd_gemm_rows_scratch_floats(), *dPt = g->dk ? St + blk : NULL;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / (size_t)g->nkt;
        int j0 = (int)(u % (size_t)g->nkt) * g->kt, nk = s->tk - j0 < g->kt ? s->tk - j0 : g->kt;
        size_t key0 = bh * (size_t)s->tk + (size_t)j0;
        const float *kb = g->k + key0 * d, *vb = g->v + key0 * d;
        for (int i0 = s->causal ? j0 : 0; i0 < s->tq; i0 += g->qt) {
            int nq = s->tq - i0 < g->qt ? s->tq - i0 : g->qt;
            size_t row0 = bh * (size_t)s->tq + (size_t)i0;
            const float *qb = g->q + row0 * d, *dyb = g->dy + row0 * d;
            scores(g, pk, kb, nk, qb, nq, St);
            if (dPt) sd_gemm_rows(g->isa, nk, nq, s->d, vb, d, dyb, d, NULL, dPt, (size_t)nq, pk);
            softmax_grad(g, row0, i0, j0, nq, nk, 1, St, dPt);
            if (g->dv) add_product(g, pk, St, nk, nq, dyb, g->dv + key0 * d);
            if (dPt) add_product(g, pk, dPt, nk, nq, qb, g->dk + key0 * d);
        }
    }
}

/* dq, dk, dv in one pass (five GEMMs per block where the split passes take
 * seven): one unit is a whole (batch, head), which owns its dq rows as well
 * as its dk and dv rows, so dq can gather every key tile's share in order
 * without a second pass. Per key tile j, per query tile i that sees it:
 * S = scale q_i k_j^T, P from softmax_grad; dv_j += P^T dy_i;
 * dP = dy_i v_j^T, dS; dk_j += dS^T q_i; dq_i += dS k_j. Each gradient
 * gathers its tiles in the same order as the split passes do (not the same
 * bits: dv and dk take sgemm on the transposed blocks here). */
static void gattn_bwd_head_range(void *vctx, int worker, size_t begin, size_t end)
{
    const gattn *g = vctx;
    const sd_attn_shape *s = g->s;
    size_t d = (size_t)s->d, blk = (size_t)g->qt * (size_t)g->kt;
    float *pk = worker_pack(g, worker), *S = pk + sd_gemm_rows_scratch_floats(), *dP = g->dk || g->dq ? S + blk : NULL;
    for (size_t bh = begin; bh < end; bh++) {
        const float *qh = g->q + bh * (size_t)s->tq * d, *dyh = g->dy + bh * (size_t)s->tq * d;
        size_t key0 = bh * (size_t)s->tk;
        for (int j0 = 0; j0 < s->tk; j0 += g->kt) {
            int nk = s->tk - j0 < g->kt ? s->tk - j0 : g->kt;
            const float *kb = g->k + (key0 + (size_t)j0) * d, *vb = g->v + (key0 + (size_t)j0) * d;
            for (int i0 = s->causal ? j0 / g->qt * g->qt : 0; i0 < s->tq; i0 += g->qt) {
                int nq = s->tq - i0 < g->qt ? s->tq - i0 : g->qt;
                size_t row0 = bh * (size_t)s->tq + (size_t)i0;
                const float *qb = qh + (size_t)i0 * d, *dyb = dyh + (size_t)i0 * d;
                scores(g, pk, qb, nq, kb, nk, S);
                if (dP) sd_gemm_rows(g->isa, nq, nk, s->d, dyb, d, vb, d, NULL, dP, (size_t)nk, pk);
                softmax_grad(g, row0, i0, j0, nq, nk, 0, S, dP);
                if (g->dv)
                    sd_sgemm(1, 0, nk, s->d, nq, 1.0f, S, nk, dyb, s->d, 1.0f, g->dv + (key0 + (size_t)j0) * d, s->d);
                if (g->dk)
                    sd_sgemm(1, 0, nk, s->d, nq, 1.0f, dP, nk, qb, s->d, 1.0f, g->dk + (key0 + (size_t)j0) * d, s->d);
                if (g->dq) add_product(g, pk, dP, nq, nk, kb, g->dq + row0 * d);
            }
        }
    }
}

/* Gradients for q, k, v from dy, the inputs, and the forward's y and lse:
 * with MIN_UNITS or more (batch, head) pairs one fused pass over them,
 * else the split passes over query and key tiles (one head, e.g. the
 * VAE's, still splits across workers). The choice is the shape's. */
/* The plan of the backward's tiles: fused over (batch, head) pairs when
 * there are MIN_UNITS of them, else split over query and key tiles. */
static int attn_bwd_plan(gattn *g, const sd_attn_shape *s)
{
    size_t bh = (size_t)s->b * (size_t)s->heads;
    int fused = bh >= MIN_UNITS;
    gattn_plan(g, s, !fused);
    return fused;
}

/* The scratch sd_attn_bwd allocates on nworkers (ops_cpu.h): the
 * workers' blocks and one float per query row. */
size_t sd_attn_bwd_scratch_bytes(int nworkers, const sd_attn_shape *s)
{
    gattn g = {0};
    attn_bwd_plan(&g, s);
    size_t rows = (size_t)s->b * (size_t)s->heads * (size_t)s->tq;
    return sd_scratch_bytes(nworkers, worker_floats(&g, 2, 0)) + rows * sizeof(float);
}

void sd_attn_bwd(sd_pool *pool, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                 const float *q, const float *k, const float *v, const float *y, const float *lse)
{
    if (!dq && !dk && !dv) return;
    gattn g = {.dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dy = dy, .cy = y, .clse = lse};
    size_t bh = (size_t)s->b * (size_t)s->heads;
    int fused = attn_bwd_plan(&g, s);
    size_t rows = (size_t)s->b * (size_t)s->heads * (size_t)s->tq;
    size_t per = worker_floats(&g, 2, 0);
    g.sstride = sd_scratch_stride(per);
    g.scratch = sd_scratch_alloc(sd_pool_size(pool), per);
    g.drow = malloc(rows * sizeof(float));
    if (!g.scratch || !g.drow) {
        free(g.scratch);
        free(g.drow);
        sd_attn_bwd_ref(pool, s, dq, dk, dv, dy, q, k, v, y, lse);
        return;
    }
    sd_pool_for(pool, rows, gattn_drow_range, &g);
    if (fused) {
        sd_pool_for(pool, bh, gattn_bwd_head_range, &g);
    } else {
        if (dq) sd_pool_for(pool, bh * (size_t)g.nqt, gattn_dq_range, &g);
        if (dk || dv) sd_pool_for(pool, bh * (size_t)g.nkt, gattn_dkv_range, &g);
    }
    free(g.scratch);
    free(g.drow);
}

typedef struct {
    const sd_attn_shape *s;
    int ld; /* forward: 0 head-major, else token-major rows ld apart */
    float *y, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dy, *cy, *clse;
} ref_ctx;

/* Plain dot product of two d-vectors. */
static float dot(const float *a, const float *b, int d)
{
    float acc = 0.0f;
    for (int i = 0; i < d; i++) acc += a[i] * b[i];
    return acc;
}

/* Keys a query row may see: all of them, or j <= i under the causal mask. */
static int keys_for_row(const sd_attn_shape *s, int i)
{
    if (!s->causal) return s->tk;
    return i + 1 < s->tk ? i + 1 : s->tk;
}

/* Forward: each unit is one query row (batch, head, i). Two passes over
 * the keys: the row maximum, then exp-sum and the weighted sum of values. */
static void ref_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
    const sd_attn_shape *s = c->s;
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / tq;
        int i = (int)(u % tq), nk = keys_for_row(s, i);
        const float *qr = c->q + u * d, *kb = c->k + bh * tk * d, *vb = c->v + bh * tk * d;
        float *yr = c->y + u * d;
        size_t ldk = d;
        if (c->ld) { /* token-major: batch b, head h */
            size_t b = bh / (size_t)s->heads, h = bh % (size_t)s->heads, ld = (size_t)c->ld;
            qr = c->q + (b * tq + (size_t)i) * ld + h * d;
            kb = c->k + b * tk * ld + h * d;
            vb = c->v + b * tk * ld + h * d;
            yr = c->y + (b * tq + (size_t)i) * (size_t)s->heads * d + h * d;
            ldk = ld;
        }
        float mx = -INFINITY;
        for (int j = 0; j < nk; j++) {
            float sc = dot(qr, kb + (size_t)j * ldk, s->d) * s->scale;
            if (sc > mx) mx = sc;
        }
        for (size_t t = 0; t < d; t++) yr[t] = 0.0f;
        float l = 0.0f;
        for (int j = 0; j < nk; j++) {
            float p = expf(dot(qr, kb + (size_t)j * ldk, s->d) * s->scale - mx);
            l += p;
            const float *vr = vb + (size_t)j * ldk;
            for (size_t t = 0; t < d; t++) yr[t] += p * vr[t];
        }
        for (size_t t = 0; t < d; t++) yr[t] /= l;
        c->lse[u] = mx + logf(l);
    }
}

/* The reference forward in either layout (ld 0: head-major). */
static void attn_fwd_ref_any(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                             const float *k, const float *v)
{
    ref_ctx c = {.s = s, .ld = ld, .y = y, .lse = lse, .q = q, .k = k, .v = v};
    sd_pool_for(pool, (size_t)s->b * (size_t)s->heads * (size_t)s->tq, ref_fwd_range, &c);
}

/* Reference y = softmax(q k^T * scale) v, row by row; lse saved. */
void sd_attn_fwd_ref(sd_pool *pool, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                     const float *v)
{
    attn_fwd_ref_any(pool, s, 0, y, lse, q, k, v);
}

/* The reference on token-major rows (sd_attn_rows_fwd's layout). */
void sd_attn_rows_fwd_ref(sd_pool *pool, const sd_attn_shape *s, int ld, float *y, float *lse, const float *q,
                          const float *k, const float *v)
{
    attn_fwd_ref_any(pool, s, ld, y, lse, q, k, v);
}

/* dq for one query row: dq_i += scale * sum_j p_ij (dy_i.v_j - dy_i.y_i) k_j. */
static void ref_bwd_dq_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
    const sd_attn_shape *s = c->s;
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / tq;
        int i = (int)(u % tq), nk = keys_for_row(s, i);
        const float *qr = c->q + u * d, *dyr = c->dy + u * d;
        const float *kb = c->k + bh * tk * d, *vb = c->v + bh * tk * d;
        float *dqr = c->dq + u * d;
        float dd = dot(dyr, c->cy + u * d, s->d);
        for (int j = 0; j < nk; j++) {
            const float *kr = kb + (size_t)j * d;
            float p = expf(dot(qr, kr, s->d) * s->scale - c->clse[u]);
            float ds = p * (dot(dyr, vb + (size_t)j * d, s->d) - dd) * s->scale;
            for (size_t t = 0; t < d; t++) dqr[t] += ds * kr[t];
        }
    }
}

/* dk and dv for one key row j, summing over the query rows that see it:
 * dv_j += sum_i p_ij dy_i; dk_j += scale * sum_i p_ij (dy_i.v_j - D_i) q_i. */
static void ref_bwd_dkv_range(void *vctx, int worker, size_t begin, size_t end)
{
    const ref_ctx *c = vctx;
    const sd_attn_shape *s = c->s;
    size_t d = (size_t)s->d, tq = (size_t)s->tq, tk = (size_t)s->tk;
    (void)worker;
    for (size_t u = begin; u < end; u++) {
        size_t bh = u / tk;
        int j = (int)(u % tk);
        const float *kr = c->k + u * d, *vr = c->v + u * d;
        float *dkr = c->dk ? c->dk + u * d : NULL, *dvr = c->dv ? c->dv + u * d : NULL;
        for (int i = s->causal ? j : 0; i < s->tq; i++) {
            size_t row = bh * tq + (size_t)i;
            const float *qr = c->q + row * d, *dyr = c->dy + row * d;
            float p = expf(dot(qr, kr, s->d) * s->scale - c->clse[row]);
            if (dvr)
                for (size_t t = 0; t < d; t++) dvr[t] += p * dyr[t];
            if (dkr) {
                float ds = p * (dot(dyr, vr, s->d) - dot(dyr, c->cy + row * d, s->d)) * s->scale;
                for (size_t t = 0; t < d; t++) dkr[t] += ds * qr[t];
            }
        }
    }
}

/* Reference gradients for q, k, v, row by row. */
void sd_attn_bwd_ref(sd_pool *pool, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                 const float *q, const float *k, const float *v, const float *y, const float *lse)
{
    ref_ctx c = {.s = s, .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dy = dy, .cy = y, .clse = lse};
    size_t bh = (size_t)s->b * (size_t)s->heads;
    if (dq) sd_pool_for(pool, bh * (size_t)s->tq, ref_bwd_dq_range, &c);
    if (dk || dv) sd_pool_for(pool, bh * (size_t)s->tk, ref_bwd_dkv_range, &c);
}
