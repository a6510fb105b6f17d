/* Gradient sums on GPUs over NCCL (built when the CUDA toolkit has it):
 * one communicator per process over the world's ranks, its unique id made
 * by rank 0 and broadcast over the world's MPI (dist.h), all-reduces
 * queued on the CUDA context's stream behind the backward pass, so the
 * gradient never leaves the GPU. A world of one works too (the --nccl
 * check of the path on a single GPU). NCCL's ring/tree sums are not in
 * rank order: results match the MPI path to rounding, not bit for bit,
 * and repeat run to run on the same machines and world size. */
#ifndef SDTK_TRAIN_NCCL_SUM_H
#define SDTK_TRAIN_NCCL_SUM_H

#include <stddef.h>

#include "err.h"

typedef struct sd_nccl sd_nccl;

/* Join the communicator of rank of world on the current CUDA device. */
sd_status sd_nccl_open(sd_nccl **out, int rank, int world, sd_error *err);
/* buf[i] = sum over ranks of buf[i], in place, n floats of device memory,
 * queued on stream (a cudaStream_t). */
sd_status sd_nccl_sum_f32(sd_nccl *c, float *buf, size_t n, void *stream, sd_error *err);
/* ZeRO on GPU ranks, in dist.h's segment layout (the MPI path's, so
 * checkpoints gather the same way), queued on stream. Reduce-scatter:
 * each rank's segments of buf (n floats) get the sum over the ranks (one
 * ncclReduce per segment to its owner, a group per block); the rest of buf
 * is left as it was on the owner's peers. All-gather: every segment from
 * its owner to all ranks (one ncclBroadcast per segment). */
sd_status sd_nccl_reduce_scatter_f32(sd_nccl *c, float *buf, size_t n, void *stream, sd_error *err);
sd_status sd_nccl_allgather_f32(sd_nccl *c, float *buf, size_t n, void *stream, sd_error *err);
/* ZeRO-2: src holds this rank's len values of [off, off + len) of an
 * n-float buffer; each owner's part of the range is summed into own, its
 * packed segments (sd_dist_owned floats), replacing what was there (the
 * caller adds the owner's earlier value into its own src part first to
 * accumulate; src is the scratch it may reuse). Every rank calls with the
 * same ranges in the same order. */
sd_status sd_nccl_reduce_range(sd_nccl *c, float *src, size_t off, size_t len, size_t n, float *own,
                               void *stream, sd_error *err);
/* ZeRO of the per-tensor optimizers (whole tensors per rank, not dist.h's
 * segments): n floats of buf from root to every rank (ncclBroadcast), and
 * src's n floats summed into root's dst (ncclReduce; dst is ignored on the
 * other ranks), queued on stream. */
sd_status sd_nccl_bcast_f32(sd_nccl *c, float *buf, size_t n, int root, void *stream, sd_error *err);
sd_status sd_nccl_reduce_to(sd_nccl *c, const float *src, size_t n, int root, float *dst, void *stream,
                            sd_error *err);
void sd_nccl_close(sd_nccl *c);
/* "NCCL 2.28.x", for the log. */
const char *sd_nccl_version(sd_nccl *c);

#endif
