/* NCCL communicator and all-reduce for sd-train's GPU ranks (nccl_sum.h). */
#include "nccl_sum.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "dist.h"

struct sd_nccl {
    ncclComm_t comm;
    int rank, world;
    char version[32];
};

/* An NCCL status as an error naming the rank and the call. */
static sd_status nccl_fail(ncclResult_t r, int rank, const char *call, sd_error *err)
{
    return sd_err_set(err, SD_EIO, "rank %d: %s failed: %s", rank, call, ncclGetErrorString(r));
}

/* Rank 0 makes the id, every rank receives it, all join. */
sd_status sd_nccl_open(sd_nccl **out, int rank, int world, sd_error *err)
{
    *out = NULL;
    sd_nccl *c = calloc(1, sizeof *c);
    if (!c) return sd_err_set(err, SD_ENOMEM, "out of memory");
    c->rank = rank;
    c->world = world;
    ncclUniqueId id;
    ncclResult_t r = ncclSuccess;
    if (rank == 0) r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        free(c);
        return nccl_fail(r, rank, "ncclGetUniqueId", err);
    }
    sd_status st = sd_dist_bcast(&id, sizeof id, err);
    if (st) {
        free(c);
        return st;
    }
    r = ncclCommInitRank(&c->comm, world, id, rank);
    if (r != ncclSuccess) {
        free(c);
        return nccl_fail(r, rank, "ncclCommInitRank", err);
    }
    int v = 0;
    ncclGetVersion(&v);
    snprintf(c->version, sizeof c->version, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    *out = c;
    return SD_OK;
}

/* In-place sum on the stream; NCCL takes counts as size_t. */
sd_status sd_nccl_sum_f32(sd_nccl *c, float *buf, size_t n, void *stream, sd_error *err)
{
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, c->comm, (cudaStream_t)stream);
    return r == ncclSuccess ? SD_OK : nccl_fail(r, c->rank, "ncclAllReduce (gradient sum)", err);
}

/* The segments of block b, one collective per segment inside one group:
 * reduce to (reduce set) or broadcast from its owner, in place. */
static sd_status block_segments(sd_nccl *c, float *buf, size_t n, size_t b, int reduce, cudaStream_t s,
                                sd_error *err)
{
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; k < c->world && r == ncclSuccess; k++) {
        size_t lo, hi;
        sd_dist_segment(n, b, k, c->world, &lo, &hi);
        if (hi == lo) continue; /* the same on every rank */
        r = reduce ? ncclReduce(buf + lo, buf + lo, hi - lo, ncclFloat, ncclSum, k, c->comm, s)
                   : ncclBroadcast(buf + lo, buf + lo, hi - lo, ncclFloat, k, c->comm, s);
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess) r = e;
    return r == ncclSuccess ? SD_OK : nccl_fail(r, c->rank, reduce ? "ncclReduce (ZeRO)" : "ncclBroadcast (ZeRO)", err);
}

/* Block by block, each segment summed into its owner. */
sd_status sd_nccl_reduce_scatter_f32(sd_nccl *c, float *buf, size_t n, void *stream, sd_error *err)
{
    sd_status st = SD_OK;
    for (size_t b = 0; b < sd_dist_blocks(n) && !st; b++) st = block_segments(c, buf, n, b, 1, stream, err);
    return st;
}

/* Block by block, each segment from its owner to all. */
sd_status sd_nccl_allgather_f32(sd_nccl *c, float *buf, size_t n, void *stream, sd_error *err)
{
    sd_status st = SD_OK;
    for (size_t b = 0; b < sd_dist_blocks(n) && !st; b++) st = block_segments(c, buf, n, b, 0, stream, err);
    return st;
}

/* Per block the range touches, each owner's part reduced into its place
 * in own (the other ranks pass their send buffer, which NCCL ignores). */
sd_status sd_nccl_reduce_range(sd_nccl *c, float *src, size_t off, size_t len, size_t n, float *own,
                               void *stream, sd_error *err)
{
    for (size_t b = off / SD_DIST_BLOCK; b * SD_DIST_BLOCK < off + len; b++) {
        ncclResult_t r = ncclGroupStart();
        for (int k = 0; k < c->world && r == ncclSuccess; k++) {
            size_t lo, hi;
            sd_dist_segment(n, b, k, c->world, &lo, &hi);
            size_t s = lo > off ? lo : off, e = hi < off + len ? hi : off + len;
            if (e <= s) continue; /* the same on every rank */
            float *send = src + (s - off), *recv = k == c->rank ? own + sd_dist_packed_index(n, s, k, c->world) : send;
            r = ncclReduce(send, recv, e - s, ncclFloat, ncclSum, k, c->comm, (cudaStream_t)stream);
        }
        ncclResult_t e = ncclGroupEnd();
        if (r == ncclSuccess) r = e;
        if (r != ncclSuccess) return nccl_fail(r, c->rank, "ncclReduce (ZeRO-2 gradient reduce-scatter)", err);
    }
    return SD_OK;
}

/* See nccl_sum.h: one run of weights from its owner to every rank. */
sd_status sd_nccl_bcast_f32(sd_nccl *c, float *buf, size_t n, int root, void *stream, sd_error *err)
{
    if (n == 0) return SD_OK; /* the same on every rank */
    ncclResult_t r = ncclBroadcast(buf, buf, n, ncclFloat, root, c->comm, (cudaStream_t)stream);
    return r == ncclSuccess ? SD_OK : nccl_fail(r, c->rank, "ncclBroadcast (ZeRO weights of a tensor run)", err);
}

/* See nccl_sum.h: one tensor's gradient summed into its owner's share. */
sd_status sd_nccl_reduce_to(sd_nccl *c, const float *src, size_t n, int root, float *dst, void *stream,
                            sd_error *err)
{
    if (n == 0) return SD_OK;
    ncclResult_t r = ncclReduce(src, c->rank == root ? dst : (float *)src, n, ncclFloat, ncclSum, root, c->comm,
                                (cudaStream_t)stream);
    return r == ncclSuccess ? SD_OK : nccl_fail(r, c->rank, "ncclReduce (ZeRO-2 gradient of a whole tensor)", err);
}

/* Leave the communicator. */
void sd_nccl_close(sd_nccl *c)
{
    if (!c) return;
    ncclCommDestroy(c->comm);
    free(c);
}

/* The library version the communicator runs on. */
const char *sd_nccl_version(sd_nccl *c)
{
    return c->version;
}
