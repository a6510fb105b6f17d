/* The planning backend (plan_backend.h): memory counted, nothing run. */
#include "plan_backend.h"

#include <string.h>
#include <sys/mman.h>

#include "attn_blocks.h"
#include "dev_ws.h"

/* 64-byte blocks, as the other backends align theirs. */
size_t sd_plan_round(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* A PROT_NONE reservation: any read or write through a planned pointer
 * faults, so an op that touched memory here would show at once. */
sd_status sd_plan_exec_init(sd_plan_exec *x, size_t span, int workers, sd_error *err)
{
    memset(x, 0, sizeof *x);
    x->workers = workers > 0 ? workers : 1;
    x->span = sd_plan_round(span ? span : 64);
    void *b = mmap(NULL, x->span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (b == MAP_FAILED)
        return sd_err_set(err, SD_ENOMEM, "memory plan: cannot reserve %zu bytes of address space", span);
    x->base = b;
    return SD_OK;
}

/* Give the range back. */
void sd_plan_exec_free(sd_plan_exec *x)
{
    if (x->base) munmap(x->base, x->span);
    memset(x, 0, sizeof *x);
}

/* An op holding `bytes` of scratch on top of what is live. */
static void note(void *ex, size_t bytes)
{
    sd_plan_exec *x = ex;
    if (bytes > x->scratch) x->scratch = bytes;
    if (x->live + bytes > x->peak_total) x->peak_total = x->live + bytes;
}

/* The next block of the range; NULL when it is spent (as a full device). */
static void *plan_alloc(void *ex, size_t bytes)
{
    sd_plan_exec *x = ex;
    size_t r = sd_plan_round(bytes ? bytes : 1);
    if (r > x->span - x->used || x->nblk == SD_PLAN_MAX_BLOCKS) return NULL;
    char *p = x->base + x->used;
    x->used += r;
    x->blk[x->nblk].p = p;
    x->blk[x->nblk++].bytes = r;
    x->live += r;
    if (x->live > x->peak) x->peak = x->live;
    note(ex, 0);
    return p;
}

/* The block's bytes are no longer live (the range is not reused). */
static void plan_release(void *ex, void *p)
{
    sd_plan_exec *x = ex;
    for (size_t i = 0; i < x->nblk; i++)
        if (x->blk[i].p == p) {
            x->live -= x->blk[i].bytes;
            x->blk[i] = x->blk[--x->nblk];
            return;
        }
}

/* Copies and clears move nothing. */
static void plan_copy(void *ex, void *dst, const void *src, size_t bytes)
{
    (void)ex, (void)dst, (void)src, (void)bytes;
}

static void plan_zero(void *ex, void *p, size_t bytes)
{
    (void)ex, (void)p, (void)bytes;
}

/* Nothing is queued, nothing fails. */
static sd_status plan_sync(void *ex, sd_error *err)
{
    (void)ex, (void)err;
    return SD_OK;
}

/* Convolutions: the CPU's im2col or Winograd scratch; on CUDA the padded
 * copy of the input made for asymmetric padding (dev_ws.h; cuDNN's
 * workspace is a cap the caller adds once). */
static void plan_conv_fwd(void *ex, const sd_conv2d_shape *s, float *y, const float *x, const float *w,
                          const float *b)
{
    (void)y, (void)x, (void)w, (void)b;
    const sd_plan_exec *p = ex;
    note(ex, p->device ? sd_dev_conv_pad_bytes(s) : sd_conv2d_fwd_scratch_bytes(p->workers, s));
}

static void plan_conv_bwd(void *ex, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w)
{
    (void)db, (void)dy, (void)x, (void)w;
    const sd_plan_exec *p = ex;
    note(ex, p->device ? sd_dev_conv_pad_bytes(s) : sd_conv2d_bwd_scratch_bytes(p->workers, s, dx != NULL, dw != NULL));
}

/* Linear: one packed block of w per CPU worker; cuBLAS takes its own. */
static void plan_linear_fwd(void *ex, const sd_linear_shape *s, float *y, const float *x, const float *w,
                            const float *b)
{
    (void)s, (void)y, (void)x, (void)w, (void)b;
    const sd_plan_exec *p = ex;
    note(ex, p->device ? 0 : sd_linear_fwd_scratch_bytes(p->workers));
}

static void plan_linear_bwd(void *ex, const sd_linear_shape *s, float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w)
{
    (void)ex, (void)s, (void)dx, (void)dw, (void)db, (void)dy, (void)x, (void)w;
}

/* Attention: the CPU's tiles, or CUDA's blocks of scores (one in the
 * forward, two in the backward; none on the flash kernel). */
static void plan_attn_fwd(void *ex, const sd_attn_shape *s, float *y, float *lse, const float *q, const float *k,
                          const float *v)
{
    (void)y, (void)lse, (void)q, (void)k, (void)v;
    const sd_plan_exec *p = ex;
    if (p->device) note(ex, p->attn_flash ? 0 : sd_attn_block_bytes(s, p->attn_block));
    else note(ex, sd_attn_fwd_scratch_bytes(p->workers, s));
}

static void plan_attn_bwd(void *ex, const sd_attn_shape *s, float *dq, float *dk, float *dv, const float *dy,
                          const float *q, const float *k, const float *v, const float *y, const float *lse)
{
    (void)dq, (void)dk, (void)dv, (void)dy, (void)q, (void)k, (void)v, (void)y, (void)lse;
    const sd_plan_exec *p = ex;
    if (p->device) note(ex, p->attn_flash ? 0 : 2 * sd_attn_block_bytes(s, p->attn_block));
    else note(ex, sd_attn_bwd_scratch_bytes(p->workers, s));
}

/* The ops that take no scratch on either backend. */
static void gn_fwd(void *ex, const sd_gn_shape *s, float *y, float *m, float *r, const float *x, const float *g,
                   const float *b)
{
    (void)ex, (void)s, (void)y, (void)m, (void)r, (void)x, (void)g, (void)b;
}

static void gn_bwd(void *ex, const sd_gn_shape *s, float *dx, float *dg, float *db, const float *dy, const float *x,
                   const float *m, const float *r, const float *g)
{
    (void)ex, (void)s, (void)dx, (void)dg, (void)db, (void)dy, (void)x, (void)m, (void)r, (void)g;
}

static void ln_fwd(void *ex, const sd_ln_shape *s, float *y, float *m, float *r, const float *x, const float *g,
                   const float *b)
{
    (void)ex, (void)s, (void)y, (void)m, (void)r, (void)x, (void)g, (void)b;
}

static void ln_bwd(void *ex, const sd_ln_shape *s, float *dx, float *dg, float *db, const float *dy, const float *x,
                   const float *m, const float *r, const float *g)
{
    (void)ex, (void)s, (void)dx, (void)dg, (void)db, (void)dy, (void)x, (void)m, (void)r, (void)g;
}

static void un_fwd(void *ex, size_t n, float *y, const float *x)
{
    (void)ex, (void)n, (void)y, (void)x;
}

static void un_bwd(void *ex, size_t n, float *dx, const float *dy, const float *x)
{
    (void)ex, (void)n, (void)dx, (void)dy, (void)x;
}

static void add_fwd(void *ex, size_t n, float *y, const float *a, const float *b)
{
    (void)ex, (void)n, (void)y, (void)a, (void)b;
}

static void add_bwd(void *ex, size_t n, float *da, float *db, const float *dy)
{
    (void)ex, (void)n, (void)da, (void)db, (void)dy;
}

static void up_op(void *ex, int planes, int h, int w, float *y, const float *x)
{
    (void)ex, (void)planes, (void)h, (void)w, (void)y, (void)x;
}

static void geglu_fwd(void *ex, size_t m, size_t n, float *y, const float *x)
{
    (void)ex, (void)m, (void)n, (void)y, (void)x;
}

static void geglu_bwd(void *ex, size_t m, size_t n, float *dx, const float *dy, const float *x)
{
    (void)ex, (void)m, (void)n, (void)dx, (void)dy, (void)x;
}

static void cat_fwd(void *ex, const sd_concat_shape *s, float *y, const float *a, const float *b)
{
    (void)ex, (void)s, (void)y, (void)a, (void)b;
}

static void cat_bwd(void *ex, const sd_concat_shape *s, float *da, float *db, const float *dy)
{
    (void)ex, (void)s, (void)da, (void)db, (void)dy;
}

static void bc_fwd(void *ex, int n, int c, int hw, float *y, const float *x, const float *b)
{
    (void)ex, (void)n, (void)c, (void)hw, (void)y, (void)x, (void)b;
}

static void bc_bwd(void *ex, int n, int c, int hw, float *dx, float *db, const float *dy)
{
    (void)ex, (void)n, (void)c, (void)hw, (void)dx, (void)db, (void)dy;
}

static void temb_fwd(void *ex, const sd_temb_shape *s, float *y, const float *t)
{
    (void)ex, (void)s, (void)y, (void)t;
}

static void temb_bwd(void *ex, const sd_temb_shape *s, float *dt, const float *dy, const float *t)
{
    (void)ex, (void)s, (void)dt, (void)dy, (void)t;
}

static void tr_op(void *ex, int n, int r, int c, float *y, const float *x)
{
    (void)ex, (void)n, (void)r, (void)c, (void)y, (void)x;
}

static void scale_op(void *ex, size_t n, float *y, const float *x, float a)
{
    (void)ex, (void)n, (void)y, (void)x, (void)a;
}

static void mul_fwd(void *ex, size_t n, float *y, const float *a, const float *b)
{
    (void)ex, (void)n, (void)y, (void)a, (void)b;
}

static void mul_bwd(void *ex, size_t n, float *da, float *db, const float *dy, const float *a, const float *b)
{
    (void)ex, (void)n, (void)da, (void)db, (void)dy, (void)a, (void)b;
}

static void emb_fwd(void *ex, const sd_embedding_shape *s, float *y, const int32_t *ids, const float *tok,
                    const float *pos)
{
    (void)ex, (void)s, (void)y, (void)ids, (void)tok, (void)pos;
}

static void emb_bwd(void *ex, const sd_embedding_shape *s, float *dtok, float *dpos, const float *dy,
                    const int32_t *ids)
{
    (void)ex, (void)s, (void)dtok, (void)dpos, (void)dy, (void)ids;
}

/* The optimizer's entries: no scratch worth a line (sum_squares' partial
 * sums are a few doubles). */
static double sumsq(void *ex, size_t n, const float *x)
{
    (void)ex, (void)n, (void)x;
    return 0.0;
}

static void adamw(void *ex, const sd_adamw_args *a, size_t n, float *p, float *m, float *v, const float *g)
{
    (void)ex, (void)a, (void)n, (void)p, (void)m, (void)v, (void)g;
}

static void adamw_bf16(void *ex, const sd_adamw_args *a, size_t n, size_t i0, float *p, uint16_t *m, uint16_t *v,
                       const float *g)
{
    (void)ex, (void)a, (void)n, (void)i0, (void)p, (void)m, (void)v, (void)g;
}

static void ema(void *ex, size_t n, float *e, const float *p, float d)
{
    (void)ex, (void)n, (void)e, (void)p, (void)d;
}

static void adamw8(void *ex, const sd_adamw8_args *a, const sd_q8_tables *t, size_t nt, const sd_q8_tensor *ts,
                   float *p, const float *g)
{
    (void)ex, (void)a, (void)t, (void)nt, (void)ts, (void)p, (void)g;
}

static void adafactor(void *ex, const sd_adafactor_args *a, size_t nt, const sd_adafactor_tensor *ts, float *p,
                      const float *g)
{
    (void)ex, (void)a, (void)nt, (void)ts, (void)p, (void)g;
}

static void bf16_widen(void *ex, size_t n, float *d, const uint16_t *s)
{
    (void)ex, (void)n, (void)d, (void)s;
}

static void bf16_store_sr(void *ex, size_t n, size_t i0, uint32_t key, uint16_t *d, const float *s)
{
    (void)ex, (void)n, (void)i0, (void)key, (void)d, (void)s;
}

static const sd_backend plan_table = {
    .name = "plan",
    .is_device = 1,
    .alloc = plan_alloc,
    .release = plan_release,
    .h2d = plan_copy,
    .d2h = plan_copy,
    .d2d = plan_copy,
    .zero = plan_zero,
    .sync = plan_sync,
    .conv2d_fwd = plan_conv_fwd,
    .conv2d_bwd = plan_conv_bwd,
    .group_norm_fwd = gn_fwd,
    .group_norm_bwd = gn_bwd,
    .linear_fwd = plan_linear_fwd,
    .linear_bwd = plan_linear_bwd,
    .silu_fwd = un_fwd,
    .silu_bwd = un_bwd,
    .add_fwd = add_fwd,
    .add_bwd = add_bwd,
    .upsample2x_fwd = up_op,
    .upsample2x_bwd = up_op,
    .attn_fwd = plan_attn_fwd,
    .attn_bwd = plan_attn_bwd,
    .layer_norm_fwd = ln_fwd,
    .layer_norm_bwd = ln_bwd,
    .gelu_fwd = un_fwd,
    .gelu_bwd = un_bwd,
    .quick_gelu_fwd = un_fwd,
    .quick_gelu_bwd = un_bwd,
    .geglu_fwd = geglu_fwd,
    .geglu_bwd = geglu_bwd,
    .scale_fwd = scale_op,
    .scale_bwd = scale_op,
    .mul_fwd = mul_fwd,
    .mul_bwd = mul_bwd,
    .concat_fwd = cat_fwd,
    .concat_bwd = cat_bwd,
    .add_bcast_channel_fwd = bc_fwd,
    .add_bcast_channel_bwd = bc_bwd,
    .timestep_emb_fwd = temb_fwd,
    .timestep_emb_bwd = temb_bwd,
    .transpose_fwd = tr_op,
    .transpose_bwd = tr_op,
    .gauss_std_fwd = un_fwd,
    .gauss_std_bwd = un_bwd,
    .embedding_fwd = emb_fwd,
    .embedding_bwd = emb_bwd,
    .sum_squares = sumsq,
    .adamw = adamw,
    .adamw_bf16 = adamw_bf16,
    .ema = ema,
    .adamw8 = adamw8,
    .adafactor = adafactor,
    .bf16_widen = bf16_widen,
    .bf16_store_sr = bf16_store_sr,
};

/* The table. */
const sd_backend *sd_backend_plan(void)
{
    return &plan_table;
}
