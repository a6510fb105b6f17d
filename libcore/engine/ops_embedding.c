/* Token + position embedding lookup (CLIP's text embeddings, torch's
 * F.embedding of the ids plus the position table's first t rows), forward
 * and backward. Forward: each thread owns whole output rows. Backward
 * scatters dy into the embedding tables; to stay deterministic without
 * atomics each thread owns whole embedding rows: it walks every token in
 * sequence order and adds only those whose id falls in its rows, so each
 * row's sum runs in the same order for any thread count. */
#include "ops_cpu.h"

/* Counts must be positive and the sequence must fit the position table. */
sd_status sd_embedding_check(const sd_embedding_shape *s, sd_error *err)
{
    if (s->n <= 0 || s->t <= 0 || s->dim <= 0 || s->vocab <= 0)
        return sd_err_set(err, SD_EINVAL, "embedding: n, t, dim and vocab must be positive");
    if (s->npos < 0 || (s->npos > 0 && s->t > s->npos))
        return sd_err_set(err, SD_EINVAL, "embedding: %d tokens per sequence, the position table has %d rows", s->t,
                          s->npos);
    return SD_OK;
}

/* The ids are data, not shape: checked once by the caller before the ops
 * (which trust them) read table rows with them. */
sd_status sd_embedding_check_ids(const sd_embedding_shape *s, const int32_t *ids, sd_error *err)
{
    size_t n = (size_t)s->n * (size_t)s->t;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab)
            return sd_err_set(err, SD_ERANGE, "embedding: token id %d at sequence %zu position %zu is outside the "
                              "vocabulary of %d", (int)ids[i], i / (size_t)s->t, i % (size_t)s->t, s->vocab);
    return SD_OK;
}

typedef struct {
    const sd_embedding_shape *s;
    float *y, *dtok, *dpos;
    const float *tok, *pos, *dy;
    const int32_t *ids;
} emb_ctx;

/* Forward rows [begin, end) of the flattened [n * t] tokens. */
static void emb_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const emb_ctx *c = vctx;
    size_t dim = (size_t)c->s->dim, t = (size_t)c->s->t;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        float *yr = c->y + r * dim;
        const float *tr = c->tok + (size_t)c->ids[r] * dim;
        if (c->pos) {
            const float *pr = c->pos + (r % t) * dim;
            for (size_t i = 0; i < dim; i++) yr[i] = tr[i] + pr[i];
        } else {
            for (size_t i = 0; i < dim; i++) yr[i] = tr[i];
        }
    }
}

/* y [n, t, dim] = tok[ids] + pos[0..t) (pos may be NULL: no positions). */
void sd_embedding_fwd(sd_pool *pool, const sd_embedding_shape *s, float *y, const int32_t *ids, const float *tok,
                      const float *pos)
{
    emb_ctx c = {.s = s, .y = y, .ids = ids, .tok = tok, .pos = s->npos > 0 ? pos : NULL};
    sd_pool_for(pool, (size_t)s->n * (size_t)s->t, emb_fwd_range, &c);
}

/* Token-table gradient for vocabulary rows [begin, end): every token in
 * order, the ones this thread owns added into their row. */
static void emb_dtok_range(void *vctx, int worker, size_t begin, size_t end)
{
    const emb_ctx *c = vctx;
    size_t dim = (size_t)c->s->dim, n = (size_t)c->s->n * (size_t)c->s->t;
    (void)worker;
    for (size_t r = 0; r < n; r++) {
        size_t id = (size_t)c->ids[r];
        if (id < begin || id >= end) continue;
        float *g = c->dtok + id * dim;
        const float *d = c->dy + r * dim;
        for (size_t i = 0; i < dim; i++) g[i] += d[i];
    }
}

/* Position-table gradient for positions [begin, end): the batch's rows at
 * that position added in sequence order. */
static void emb_dpos_range(void *vctx, int worker, size_t begin, size_t end)
{
    const emb_ctx *c = vctx;
    size_t dim = (size_t)c->s->dim, t = (size_t)c->s->t;
    (void)worker;
    for (size_t p = begin; p < end; p++) {
        float *g = c->dpos + p * dim;
        for (size_t b = 0; b < (size_t)c->s->n; b++) {
            const float *d = c->dy + (b * t + p) * dim;
            for (size_t i = 0; i < dim; i++) g[i] += d[i];
        }
    }
}

/* dtok [vocab, dim] += dy scattered by id; dpos [npos, dim] += dy summed
 * over the batch (rows t.. untouched). Either may be NULL. */
void sd_embedding_bwd(sd_pool *pool, const sd_embedding_shape *s, float *dtok, float *dpos, const float *dy,
                      const int32_t *ids)
{
    emb_ctx c = {.s = s, .dtok = dtok, .dpos = dpos, .dy = dy, .ids = ids};
    if (dtok) sd_pool_for(pool, (size_t)s->vocab, emb_dtok_range, &c);
    if (dpos && s->npos > 0) sd_pool_for(pool, (size_t)s->t, emb_dpos_range, &c);
}
