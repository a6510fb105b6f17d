/* The world of one: the build without MPI. */
#include "dist.h"

#include <string.h>

#include <stdlib.h>

/* Nothing to join without MPI; but a launcher that started several
 * copies would have each train the whole run into the same output. */
sd_status sd_dist_init(int *argc, char ***argv, sd_error *err)
{
    (void)argc;
    (void)argv;
    return sd_dist_refuse_copies("but this sd-train was built without MPI", err);
}

/* Nothing to leave. */
void sd_dist_finalize(void) {}

/* One process: stopping it stops the world. */
void sd_dist_abort(int code)
{
    exit(code);
}

/* Always rank 0 of 1. */
int sd_dist_rank(void)
{
    return 0;
}

/* Always a world of one. */
int sd_dist_world(void)
{
    return 1;
}

/* Says that no transport was built in. */
const char *sd_dist_transport(void)
{
    return "none (built without MPI)";
}

/* The sum over one rank is the buffer itself. */
sd_status sd_dist_sum_f32(float *buf, size_t n, sd_error *err)
{
    (void)buf;
    (void)n;
    (void)err;
    return SD_OK;
}

/* No reductions, no time in them. */
double sd_dist_sum_seconds(void)
{
    return 0;
}

/* The sum over one rank is the buffer itself. */
sd_status sd_dist_sum_f64(double *buf, int n, sd_error *err)
{
    (void)buf;
    (void)n;
    (void)err;
    return SD_OK;
}

/* The only rank's ok is everybody's. */
sd_status sd_dist_all_ok(int ok, int *all_ok, sd_error *err)
{
    (void)err;
    *all_ok = ok;
    return SD_OK;
}

/* No timeout to leave out in a world of one. */
sd_status sd_dist_all_ok_untimed(int ok, int *all_ok, sd_error *err)
{
    return sd_dist_all_ok(ok, all_ok, err);
}

/* A world of one gathers its own bytes. */
sd_status sd_dist_allgather_bytes(const void *mine, size_t bytes, void *all, sd_error *err)
{
    (void)err;
    memcpy(all, mine, bytes);
    return SD_OK;
}

/* A world of one already has rank 0's bytes. */
sd_status sd_dist_bcast(void *buf, size_t bytes, sd_error *err)
{
    (void)buf;
    (void)bytes;
    (void)err;
    return SD_OK;
}

/* A world of one owns everything: already summed. */
sd_status sd_dist_reduce_scatter_f32(float *buf, size_t n, sd_error *err)
{
    (void)buf;
    (void)n;
    (void)err;
    return SD_OK;
}

/* A world of one owns the whole range: its values are the sum. */
sd_status sd_dist_reduce_scatter_range(const float *src, size_t off, size_t len, size_t n, float *own, int add,
                                       sd_error *err)
{
    (void)n;
    (void)err;
    for (size_t i = 0; i < len; i++) own[off + i] = add ? own[off + i] + src[i] : src[i];
    return SD_OK;
}

/* A world of one: the sum is its own values. */
sd_status sd_dist_reduce_to(const float *src, size_t len, int root, float *dst, int add, sd_error *err)
{
    (void)root;
    (void)err;
    for (size_t i = 0; i < len; i++) dst[i] = add ? dst[i] + src[i] : src[i];
    return SD_OK;
}

/* A world of one already holds root's values. */
sd_status sd_dist_bcast_f32(float *buf, size_t len, int root, sd_error *err)
{
    (void)buf, (void)len, (void)root, (void)err;
    return SD_OK;
}

/* A world of one gathers its own bytes. */
sd_status sd_dist_gather_ranks(void *full, const void *own, const size_t *counts, sd_error *err)
{
    (void)err;
    memcpy(full, own, counts[0]);
    return SD_OK;
}

/* A world of one holds every segment. */
sd_status sd_dist_allgather_f32(float *buf, size_t n, sd_error *err)
{
    (void)buf;
    (void)n;
    (void)err;
    return SD_OK;
}

/* A world of one: its segments are the whole buffer. */
sd_status sd_dist_gather(void *full, const void *own, size_t n, size_t elem, sd_error *err)
{
    (void)err;
    memcpy(full, own, n * elem);
    return SD_OK;
}
