/* The AdamW moments' storage: converted between fp32 and bf16, and with
 * ZeRO-1 gathered whole for a checkpoint and sharded again. */
#include "train.h"

#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "dtype.h"
#include "f16.h"

/* Every rank's segments into whole m and v on rank 0, which writes the
 * checkpoint; the other ranks only send (their memory stays n + 2n/ranks). */
sd_status sd_train_moments_full(sd_trainer *tr, sd_error *err)
{
    if (!sd_train_sharded(&tr->o) || tr->o.optimizer != SD_OPT_ADAMW) return SD_OK;
    size_t n = tr->unet.w.total;
    int ok = 1, all = 1;
    if (tr->rank == 0) {
        if (!tr->m) tr->m = malloc(n * tr->moment_size);
        if (!tr->v) tr->v = malloc(n * tr->moment_size);
        ok = tr->m && tr->v;
    }
    sd_status rc = sd_dist_all_ok(ok, &all, err); /* every rank learns it, none waits in the gather */
    if (rc) return rc;
    if (!all) return sd_err_set(err, SD_ENOMEM, "rank 0 is out of memory for the whole AdamW moments");
    rc = sd_dist_gather(tr->m, tr->m_sh, n, tr->moment_size, err);
    return rc ? rc : sd_dist_gather(tr->v, tr->v_sh, n, tr->moment_size, err);
}

/* n moment values of dtype src_dt (SD_DT_F32 or SD_DT_BF16) into dst in
 * dst_dt: copied when the two agree, else widened exactly or rounded to
 * nearest (a run resumed with the other --adam-moments). */
void sd_train_moments_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n)
{
    const char *s = src; /* a mapped state file's tensors need not be aligned */
    char *d = dst;
    if (dst_dt == src_dt) {
        memcpy(dst, src, n * sd_dtype_size(dst_dt));
    } else if (dst_dt == SD_DT_BF16) {
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, s + 4 * i, 4);
            uint16_t h = sd_f32_to_bf16(f);
            memcpy(d + 2 * i, &h, 2);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            float f = sd_bf16_to_f32(h);
            memcpy(d + 4 * i, &f, 4);
        }
    }
}

/* This rank's segments of whole moments (a state file's, of dtype src_dt)
 * into the packed shards. */
void sd_train_moments_from(sd_trainer *tr, const void *m, const void *v, int src_dt)
{
    size_t n = tr->unet.w.total, off = 0, lo, hi, ms = tr->moment_size, ss = sd_dtype_size(src_dt);
    for (size_t b = 0; b < sd_dist_blocks(n); b++) {
        sd_dist_segment(n, b, tr->rank, tr->world, &lo, &hi);
        sd_train_moments_convert((char *)tr->m_sh + off * ms, tr->o.moments, (const char *)m + lo * ss, src_dt,
                                 hi - lo);
        sd_train_moments_convert((char *)tr->v_sh + off * ms, tr->o.moments, (const char *)v + lo * ss, src_dt,
                                 hi - lo);
        off += hi - lo;
    }
}

/* The whole moments dropped again after a checkpoint (the shards hold
 * the state). */
void sd_train_moments_shard(sd_trainer *tr)
{
    if (!sd_train_sharded(&tr->o)) return;
    free(tr->m);
    free(tr->v);
    tr->m = tr->v = NULL;
}
