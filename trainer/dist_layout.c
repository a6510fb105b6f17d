/* The reduce-scatter layout of dist.h: plain arithmetic shared by the MPI
 * world, the world of one and ZeRO-1's optimizer shards. */
#include "dist.h"

/* Whole blocks, and the partial last one. */
size_t sd_dist_blocks(size_t n)
{
    return (n + SD_DIST_BLOCK - 1) / SD_DIST_BLOCK;
}

/* Segment rank of block b: [m r / N, m (r + 1) / N) of the block's m. */
void sd_dist_segment(size_t n, size_t b, int rank, int world, size_t *lo, size_t *hi)
{
    size_t b0 = b * SD_DIST_BLOCK, m = n - b0 < SD_DIST_BLOCK ? n - b0 : SD_DIST_BLOCK;
    *lo = b0 + m * (size_t)rank / (size_t)world;
    *hi = b0 + m * (size_t)(rank + 1) / (size_t)world;
}

/* The sum of rank's segment lengths. */
size_t sd_dist_owned(size_t n, int rank, int world)
{
    size_t total = 0, lo, hi;
    for (size_t b = 0; b < sd_dist_blocks(n); b++) {
        sd_dist_segment(n, b, rank, world, &lo, &hi);
        total += hi - lo;
    }
    return total;
}

/* The owned floats of the blocks before i's, plus i's place in its segment. */
size_t sd_dist_packed_index(size_t n, size_t i, int rank, int world)
{
    size_t b = i / SD_DIST_BLOCK, before = 0, lo, hi;
    for (size_t k = 0; k < b; k++) {
        sd_dist_segment(n, k, rank, world, &lo, &hi);
        before += hi - lo;
    }
    sd_dist_segment(n, b, rank, world, &lo, &hi);
    return before + (i - lo);
}

/* Per block the range touches: rank's part of it from every rank. */
size_t sd_dist_range_recv_floats(size_t n, size_t off, size_t len, int rank, int world)
{
    size_t most = 0, lo, hi;
    if (world <= 1 || len == 0) return 0;
    for (size_t b = off / SD_DIST_BLOCK; b * SD_DIST_BLOCK < off + len; b++) {
        sd_dist_segment(n, b, rank, world, &lo, &hi);
        size_t s = lo > off ? lo : off, e = hi < off + len ? hi : off + len;
        if (e > s && (e - s) * (size_t)world > most) most = (e - s) * (size_t)world;
    }
    return most;
}

/* One block's segments from every rank (dist_mpi.c's recv_room). */
size_t sd_dist_sum_recv_floats(int world)
{
    return world <= 1 ? 0 : (SD_DIST_BLOCK + (size_t)world - 1) / (size_t)world * (size_t)world;
}
