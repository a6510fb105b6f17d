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
