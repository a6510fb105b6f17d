/* The reduce-scatter layout ZeRO shards by (trainer/dist_layout.c) for
 * worlds of 1 to 5 ranks and buffers of one float to several blocks: every
 * index owned by exactly one rank, a rank's packed index counting its
 * segments in block order, the receive sizes of a range, and a world of
 * one's ZeRO-2 reduce-scatter storing, then adding. Plain arithmetic, so
 * the MPI tests' world of 2 is not the only world checked. */
#include <stdlib.h>

#include "check.h"
#include "dist.h"

/* Every rank's segments tile [0, n) in block order, the packed index of
 * each segment's first and last values is the running count, and the
 * owned totals add up to n. */
static void test_layout(size_t n, int world)
{
    size_t owned_sum = 0;
    for (int r = 0; r < world; r++) {
        size_t count = 0, lo, hi;
        for (size_t b = 0; b < sd_dist_blocks(n); b++) {
            sd_dist_segment(n, b, r, world, &lo, &hi);
            CHECK(hi >= lo);
            if (hi > lo) {
                CHECK(sd_dist_packed_index(n, lo, r, world) == count);
                CHECK(sd_dist_packed_index(n, hi - 1, r, world) == count + (hi - lo) - 1);
            }
            count += hi - lo;
            size_t plo, phi; /* the next rank's segment starts where this one ends */
            if (r + 1 < world) {
                sd_dist_segment(n, b, r + 1, world, &plo, &phi);
                CHECK(plo == hi);
            }
        }
        CHECK(count == sd_dist_owned(n, r, world));
        owned_sum += count;
    }
    CHECK(owned_sum == n);
}

/* A range's receive floats: the rank's largest part in one block, times
 * the world; the whole buffer's at most one block's segments. */
static void test_recv(size_t n, int world)
{
    for (int r = 0; r < world; r++) {
        size_t all = sd_dist_range_recv_floats(n, 0, n, r, world), most = 0, lo, hi;
        for (size_t b = 0; b < sd_dist_blocks(n); b++) {
            sd_dist_segment(n, b, r, world, &lo, &hi);
            if ((hi - lo) * (size_t)world > most) most = (hi - lo) * (size_t)world;
        }
        CHECK(all == (world > 1 ? most : 0));
        CHECK(all <= sd_dist_sum_recv_floats(world));
        /* a range inside rank r's first segment: its length times the world */
        sd_dist_segment(n, 0, r, world, &lo, &hi);
        if (world > 1 && hi - lo >= 3) CHECK(sd_dist_range_recv_floats(n, lo + 1, 2, r, world) == 2 * (size_t)world);
    }
}

/* Outside a launched world the range lands whole in own: stored, then
 * added. */
static void test_single_reduce(void)
{
    float src[4] = {1, 2, 3, 4}, own[8] = {0};
    sd_error err = {0};
    CHECK(sd_dist_reduce_scatter_range(src, 2, 4, 8, own, 0, &err) == SD_OK);
    CHECK(sd_dist_reduce_scatter_range(src, 2, 4, 8, own, 1, &err) == SD_OK);
    CHECK(own[0] == 0 && own[1] == 0 && own[2] == 2 && own[5] == 8 && own[6] == 0);
    CHECK(sd_dist_reduce_scatter_range(src, 2, 4, 8, own, 0, &err) == SD_OK);
    CHECK(own[2] == 1 && own[5] == 4);
}

int main(void)
{
    const size_t sizes[] = {1, 7, 1000, SD_DIST_BLOCK - 1, SD_DIST_BLOCK, 3 * (size_t)SD_DIST_BLOCK + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int world = 1; world <= 5; world++) {
            test_layout(sizes[i], world);
            test_recv(sizes[i], world);
        }
    test_single_reduce();
    return check_done("test_dist_layout");
}
