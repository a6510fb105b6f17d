/* Data-parallel training across processes: the few collective operations
 * the trainer needs, behind one interface. With MPI (SDTK_HAVE_MPI, built
 * when CMake finds it) and a launcher (mpirun, srun) the processes form one
 * world; otherwise, or before sd_dist_init, the world is this process
 * alone and every operation is a no-op on a world of one.
 *
 * Reductions are deterministic: the float sum visits the ranks in rank
 * order 0, 1, ..., N-1 for every element, so every rank gets the same bits
 * and a rerun with the same world size gets the same bits again. */
#ifndef SDTK_TRAIN_DIST_H
#define SDTK_TRAIN_DIST_H

#include <stddef.h>

#include "err.h"

/* Join the world when launched by an MPI launcher (its environment says
 * so); a plain start stays a world of one. Call once, early. A launcher
 * that started several processes which would not form a world (a build
 * without MPI, SD_DIST=none, srun without an MPI plugin) is refused: they
 * would all train the same run into the same output. */
sd_status sd_dist_init(int *argc, char ***argv, sd_error *err);
/* The number of processes a launcher started together with this one (1
 * when none says more), from the variables it sets in each process:
 * OMPI_COMM_WORLD_SIZE (Open MPI), PMI_SIZE (MPICH's Hydra, PMI-1
 * launchers), SLURM_STEP_NUM_TASKS (srun), each counted only with its
 * per-process rank variable; *var names the variable (dist_env.c). */
int sd_dist_launcher_size(const char **var);
/* SD_OK for one process; else the refusal naming the launcher's count and
 * `why` they form no world ("but this sd-train was built without MPI"). */
sd_status sd_dist_refuse_copies(const char *why, sd_error *err);
/* Leave the world (after the last collective). */
void sd_dist_finalize(void);
/* Stop every process of the world with this exit code (after a local
 * error the others could wait forever for). */
void sd_dist_abort(int code);
int sd_dist_rank(void);
int sd_dist_world(void);
/* What carries the reductions: "none", "MPI (Open MPI ...)" and so on. */
const char *sd_dist_transport(void);

/* buf[i] = sum over ranks of buf[i], summed in rank order on every rank:
 * sd_dist_reduce_scatter_f32 then sd_dist_allgather_f32. */
sd_status sd_dist_sum_f32(float *buf, size_t n, sd_error *err);

/* The layout both halves of the sum use, which ZeRO-1 shards the
 * optimizer by: n floats in blocks of SD_DIST_BLOCK, block b split in
 * world contiguous segments, segment r owned by rank r. */
enum { SD_DIST_BLOCK = 1 << 22 };
/* Blocks of n floats. */
size_t sd_dist_blocks(size_t n);
/* [*lo, *hi) of the whole buffer: rank's segment of block b. */
void sd_dist_segment(size_t n, size_t b, int rank, int world, size_t *lo, size_t *hi);
/* Floats rank owns in total. */
size_t sd_dist_owned(size_t n, int rank, int world);
/* Each rank's own segments get the rank-order sum of all ranks' values
 * there; the rest of buf is left as it was. */
sd_status sd_dist_reduce_scatter_f32(float *buf, size_t n, sd_error *err);
/* ZeRO-2's part of the sum: src holds this rank's values of [off, off +
 * len) of an n-float buffer, every rank calling with the same range in
 * the same order; each owner gets the rank-order sum of the range's part
 * in its segments, stored (add 0) or added (add 1) at its place in own,
 * the owner's packed segments (sd_dist_owned floats, block order). */
sd_status sd_dist_reduce_scatter_range(const float *src, size_t off, size_t len, size_t n, float *own, int add,
                                       sd_error *err);
/* ZeRO by whole tensors (8-bit AdamW, Adafactor): every rank's len values
 * of src summed in rank order on root, stored (add 0) or added (add 1)
 * into root's dst (ignored elsewhere), in pieces of SD_DIST_PIECE values;
 * and len values of buf from root to every rank. */
enum { SD_DIST_PIECE = 1 << 24 };
sd_status sd_dist_reduce_to(const float *src, size_t len, int root, float *dst, int add, sd_error *err);
sd_status sd_dist_bcast_f32(float *buf, size_t len, int root, sd_error *err);
/* Rank r's counts[r] bytes (own) into full on rank 0, rank after rank (full
 * ignored elsewhere); untimed, as sd_dist_gather. */
sd_status sd_dist_gather_ranks(void *full, const void *own, const size_t *counts, sd_error *err);
/* Where global index i, which rank owns, lies in rank's packed segments. */
size_t sd_dist_packed_index(size_t n, size_t i, int rank, int world);
/* The receive floats sd_dist_reduce_scatter_range needs on rank for
 * [off, off + len), and those sd_dist_reduce_scatter_f32 needs for any n
 * (0 in a world of one): the memory plan counts them. */
size_t sd_dist_range_recv_floats(size_t n, size_t off, size_t len, int rank, int world);
size_t sd_dist_sum_recv_floats(int world);
/* Every segment from its owner to all ranks. */
sd_status sd_dist_allgather_f32(float *buf, size_t n, sd_error *err);
/* Every rank's packed segments (own: sd_dist_owned values of elem bytes,
 * in block order) into full (n values) on rank 0 only; full is ignored
 * elsewhere. The layout counts values, whatever their size. It serves
 * checkpoints (ZeRO-1's moments), so it waits without the hung-peer
 * timeout, as sd_dist_all_ok_untimed. */
sd_status sd_dist_gather(void *full, const void *own, size_t n, size_t elem, sd_error *err);
/* Seconds this process spent in sd_dist_sum_f32 (waiting included): the
 * reduction's share of the step time. */
double sd_dist_sum_seconds(void);
/* The same for a few doubles (losses, counters). */
sd_status sd_dist_sum_f64(double *buf, int n, sd_error *err);
/* buf (bytes) from rank 0 to every rank (the NCCL id, for one). */
sd_status sd_dist_bcast(void *buf, size_t bytes, sd_error *err);
/* Every rank's bytes (the same count on each) into all, rank after rank
 * (bytes x world), on every rank. */
sd_status sd_dist_allgather_bytes(const void *mine, size_t bytes, void *all, sd_error *err);
/* Every rank waits for all; returns the smallest ok any rank passed, so a
 * failure on one rank is seen by all. */
sd_status sd_dist_all_ok(int ok, int *all_ok, sd_error *err);
/* The same without the hung-peer timeout (SD_DIST_TIMEOUT): for the wait
 * for another rank's long work, rank 0 writing a checkpoint, whose length
 * (tens of GB, fsync'ed) no timeout can bound. */
sd_status sd_dist_all_ok_untimed(int ok, int *all_ok, sd_error *err);

#endif
