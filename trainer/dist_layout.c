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
