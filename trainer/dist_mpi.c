/* The world over MPI: launch, rank and size from the launcher, CPU
 * reductions in a fixed order, errors returned (not fatal inside MPI) so
 * the message names the rank and the call, and a watchdog (SIGALRM) that
 * ends a rank whose collective has waited longer than SD_DIST_TIMEOUT
 * seconds (default 600): a peer that died or hangs never leaves the others
 * waiting forever. The wait counts the peers' work since the last
 * collective too (loading, a step, validation); the waits for rank 0's
 * checkpoint writing are not watched (sd_dist_all_ok_untimed). */
#include "dist.h"

#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_on, g_rank, g_world = 1;
static char g_name[160] = "none";
/* the watchdog: SIGALRM after the timeout while a collective waits; the
 * message is formatted before the wait (a handler may only write()) */
static unsigned g_timeout = 600;
static char g_msg[512];
static size_t g_msg_len;
static double g_sum_s; /* seconds in sd_dist_sum_f32 */
static float *g_recv; /* the reduction's receive buffer, kept */
static size_t g_recv_cap;

/* SIGALRM during a collective: say which and stop this rank; mpirun then
 * stops the others. */
static void on_alarm(int sig)
{
    (void)sig;
    ssize_t w = write(2, g_msg, g_msg_len);
    (void)w;
    _exit(3);
}

/* Arm the watchdog before a collective (what) or disarm it after (NULL). */
static void watch(const char *what)
{
    if (!what) {
        alarm(0);
        return;
    }
    int len = snprintf(g_msg, sizeof g_msg,
                       "sd-train: rank %d of %d: %s has waited %u s for the other ranks (SD_DIST_TIMEOUT): one of "
                       "them died or hangs; stopping\n",
                       g_rank, g_world, what, g_timeout);
    g_msg_len = len > 0 && (size_t)len < sizeof g_msg ? (size_t)len : 0;
    alarm(g_timeout);
}

/* An MPI return code as an error naming the rank and the call. */
static sd_status mpi_fail(int code, const char *call, sd_error *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", code);
    return sd_err_set(err, SD_EIO, "rank %d of %d: %s failed: %s (another rank probably stopped)", g_rank, g_world,
                      call, s);
}

/* Whether a launcher started this process as part of a world. */
static int launched(void)
{
    const char *force = getenv("SD_DIST");
    if (force && strcmp(force, "mpi") == 0) return 1;
    if (force && (strcmp(force, "none") == 0 || strcmp(force, "single") == 0)) return 0;
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") || getenv("PMI_SIZE");
}

/* MPI_Init when launched, errors returned, the watchdog started. */
sd_status sd_dist_init(int *argc, char ***argv, sd_error *err)
{
    if (g_on) return SD_OK;
    if (!launched())
        return sd_dist_refuse_copies("that do not form an MPI world (SD_DIST=none, or srun without --mpi=pmix)", err);
    int rc = MPI_Init(argc, argv);
    if (rc != MPI_SUCCESS) return sd_err_set(err, SD_EIO, "MPI_Init failed (error %d)", rc);
    g_on = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(ver, &len);
    ver[strcspn(ver, ",\n")] = 0;
    ver[100] = 0;
    snprintf(g_name, sizeof g_name, "MPI (%.100s), %d ranks", ver, g_world);
    const char *t = getenv("SD_DIST_TIMEOUT");
    if (t && atoi(t) > 0) g_timeout = (unsigned)atoi(t);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    return SD_OK;
}

/* MPI_Finalize once, when MPI was started. */
void sd_dist_finalize(void)
{
    if (!g_on) return;
    watch(NULL);
    MPI_Finalize();
    g_on = 0;
    free(g_recv);
    g_recv = NULL;
    g_recv_cap = 0;
}

/* MPI_Abort ends every rank; a world of one just exits. */
void sd_dist_abort(int code)
{
    if (g_on && g_world > 1) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* This process's rank (0 outside a world). */
int sd_dist_rank(void)
{
    return g_rank;
}

/* The number of ranks (1 outside a world). */
int sd_dist_world(void)
{
    return g_world;
}

/* The library and world size, for the log. */
const char *sd_dist_transport(void)
{
    return g_name;
}

/* Room for one block's segments from every rank. */
static sd_status recv_room(size_t seg_max, sd_error *err)
{
    size_t need = seg_max * (size_t)g_world;
    if (g_recv_cap >= need) return SD_OK;
    free(g_recv);
    g_recv = malloc(need * sizeof(float));
    g_recv_cap = g_recv ? need : 0;
    return g_recv ? SD_OK : sd_err_set(err, SD_ENOMEM, "out of memory for the reduction buffer");
}

/* Counts and offsets (within block b) of every rank's segment. */
static void block_layout(size_t n, size_t b, int *cnt, int *off)
{
    for (int k = 0; k < g_world; k++) {
        size_t lo, hi;
        sd_dist_segment(n, b, k, g_world, &lo, &hi);
        off[k] = (int)(lo - b * SD_DIST_BLOCK);
        cnt[k] = (int)(hi - lo);
    }
}

/* Per block: every rank sends segment k to rank k (MPI_Alltoallv), which
 * sums the N copies of its own segment in rank order. The order of the
 * additions never depends on timing or the MPI algorithm. */
sd_status sd_dist_reduce_scatter_f32(float *buf, size_t n, sd_error *err)
{
    if (!g_on || g_world == 1) return SD_OK;
    int N = g_world;
    sd_status st = recv_room((SD_DIST_BLOCK + (size_t)N - 1) / (size_t)N, err);
    if (st) return st;
    int *cnt = malloc(4 * (size_t)N * sizeof(int));
    if (!cnt) return sd_err_set(err, SD_ENOMEM, "out of memory");
    int *off = cnt + N, *rcnt = cnt + 2 * N, *roff = cnt + 3 * N;
    double t0 = MPI_Wtime();
    watch("the gradient reduce-scatter");
    for (size_t b = 0; b < sd_dist_blocks(n) && !st; b++) {
        float *p = buf + b * SD_DIST_BLOCK;
        block_layout(n, b, cnt, off);
        int mine = cnt[g_rank];
        for (int k = 0; k < N; k++) {
            rcnt[k] = mine;
            roff[k] = k * mine;
        }
        int rc = MPI_Alltoallv(p, cnt, off, MPI_FLOAT, g_recv, rcnt, roff, MPI_FLOAT, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            st = mpi_fail(rc, "MPI_Alltoallv (gradient sum)", err);
            break;
        }
        float *dst = p + off[g_rank];
        for (int i = 0; i < mine; i++) {
            float s = g_recv[i];
            for (int k = 1; k < N; k++) s += g_recv[(size_t)k * (size_t)mine + (size_t)i];
            dst[i] = s;
        }
    }
    watch(NULL);
    g_sum_s += MPI_Wtime() - t0;
    free(cnt);
    return st;
}

/* Per block the range touches: every rank sends the range's part in
 * segment k to rank k (MPI_Alltoallv), which sums the N copies in rank
 * order and stores or adds them into its packed segments: the arithmetic
 * of sd_dist_reduce_scatter_f32 on a piece of the buffer. */
sd_status sd_dist_reduce_scatter_range(const float *src, size_t off, size_t len, size_t n, float *own, int add,
                                       sd_error *err)
{
    int N = g_on ? g_world : 1;
    if (N == 1) {
        for (size_t i = 0; i < len; i++) own[off + i] = add ? own[off + i] + src[i] : src[i];
        return SD_OK;
    }
    sd_status st = SD_OK;
    if (len == 0) return SD_OK;
    int *cnt = malloc(4 * (size_t)N * sizeof(int));
    if (!cnt) return sd_err_set(err, SD_ENOMEM, "out of memory");
    int *dsp = cnt + N, *rcnt = cnt + 2 * N, *roff = cnt + 3 * N;
    double t0 = MPI_Wtime();
    watch("a gradient reduce-scatter (ZeRO-2)");
    for (size_t b = off / SD_DIST_BLOCK; b * SD_DIST_BLOCK < off + len && !st; b++) {
        /* the range's part in block b starts at first: displacements from there fit an int */
        size_t first = b * SD_DIST_BLOCK > off ? b * SD_DIST_BLOCK : off, mlo = first, mhi = first;
        for (int k = 0; k < N; k++) {
            size_t lo, hi;
            sd_dist_segment(n, b, k, N, &lo, &hi);
            size_t s = lo > first ? lo : first, e = hi < off + len ? hi : off + len;
            if (e < s) e = s;
            cnt[k] = (int)(e - s);
            dsp[k] = (int)(s - first);
            if (k == g_rank) {
                mlo = s;
                mhi = e;
            }
        }
        const float *base = src + (first - off);
        int mine = (int)(mhi - mlo);
        st = recv_room((size_t)mine, err);
        if (st) break;
        for (int k = 0; k < N; k++) {
            rcnt[k] = mine;
            roff[k] = k * mine;
        }
        int rc = MPI_Alltoallv(base, cnt, dsp, MPI_FLOAT, g_recv, rcnt, roff, MPI_FLOAT, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            st = mpi_fail(rc, "MPI_Alltoallv (ZeRO-2 gradient reduce-scatter)", err);
            break;
        }
        if (mine == 0) continue;
        float *dst = own + sd_dist_packed_index(n, mlo, g_rank, N);
        for (int i = 0; i < mine; i++) {
            float v = g_recv[i];
            for (int k = 1; k < N; k++) v += g_recv[(size_t)k * (size_t)mine + (size_t)i];
            dst[i] = add ? dst[i] + v : v;
        }
    }
    watch(NULL);
    g_sum_s += MPI_Wtime() - t0;
    free(cnt);
    return st;
}

/* Piece by piece, every rank's values to root (MPI_Gather), which sums
 * them in rank order into dst: the rank-order sum of sd_dist_sum_f32 for
 * one owner. */
sd_status sd_dist_reduce_to(const float *src, size_t len, int root, float *dst, int add, sd_error *err)
{
    int N = g_on ? g_world : 1;
    if (N == 1) {
        for (size_t i = 0; i < len; i++) dst[i] = add ? dst[i] + src[i] : src[i];
        return SD_OK;
    }
    sd_status st = SD_OK;
    double t0 = MPI_Wtime();
    watch("a gradient reduce to its owner (ZeRO-2)");
    for (size_t at = 0; at < len && !st; at += SD_DIST_PIECE) {
        int k = (int)(len - at < SD_DIST_PIECE ? len - at : SD_DIST_PIECE);
        if (g_rank == root) st = recv_room((size_t)k, err);
        if (st) break;
        int rc = MPI_Gather(src + at, k, MPI_FLOAT, g_rank == root ? g_recv : NULL, k, MPI_FLOAT, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            st = mpi_fail(rc, "MPI_Gather (ZeRO-2 gradient reduce)", err);
            break;
        }
        if (g_rank != root) continue;
        for (int i = 0; i < k; i++) {
            float v = g_recv[i];
            for (int r = 1; r < N; r++) v += g_recv[(size_t)r * (size_t)k + (size_t)i];
            dst[at + (size_t)i] = add ? dst[at + (size_t)i] + v : v;
        }
    }
    watch(NULL);
    g_sum_s += MPI_Wtime() - t0;
    return st;
}

/* Piece by piece from root (MPI_Bcast). */
sd_status sd_dist_bcast_f32(float *buf, size_t len, int root, sd_error *err)
{
    if (!g_on || g_world == 1) return SD_OK;
    sd_status st = SD_OK;
    double t0 = MPI_Wtime();
    watch("a broadcast of weights from their owner");
    for (size_t at = 0; at < len && !st; at += SD_DIST_PIECE) {
        int k = (int)(len - at < SD_DIST_PIECE ? len - at : SD_DIST_PIECE);
        int rc = MPI_Bcast(buf + at, k, MPI_FLOAT, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) st = mpi_fail(rc, "MPI_Bcast (weights)", err);
    }
    watch(NULL);
    g_sum_s += MPI_Wtime() - t0;
    return st;
}

/* Rank by rank, in pieces of at most 1 GiB, to rank 0 (MPI_Send / Recv). */
sd_status sd_dist_gather_ranks(void *full, const void *own, const size_t *counts, sd_error *err)
{
    int N = g_on ? g_world : 1;
    if (g_rank == 0) memcpy(full, own, counts[0]);
    if (N == 1) return SD_OK;
    const size_t piece = (size_t)1 << 30;
    size_t at = counts[0];
    for (int r = 1; r < N; r++) {
        for (size_t done = 0; done < counts[r]; done += piece) {
            int k = (int)(counts[r] - done < piece ? counts[r] - done : piece), rc = MPI_SUCCESS;
            if (g_rank == 0)
                rc = MPI_Recv((char *)full + at + done, k, MPI_BYTE, r, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else if (g_rank == r)
                rc = MPI_Send((const char *)own + done, k, MPI_BYTE, 0, 77, MPI_COMM_WORLD);
            if (rc != MPI_SUCCESS) return mpi_fail(rc, g_rank == 0 ? "MPI_Recv (optimizer state)" : "MPI_Send", err);
        }
        at += counts[r];
    }
    return SD_OK;
}

/* Per block, every rank's segment to everyone (MPI_Allgatherv in place). */
sd_status sd_dist_allgather_f32(float *buf, size_t n, sd_error *err)
{
    if (!g_on || g_world == 1) return SD_OK;
    int N = g_world;
    int *cnt = malloc(2 * (size_t)N * sizeof(int));
    if (!cnt) return sd_err_set(err, SD_ENOMEM, "out of memory");
    int *off = cnt + N;
    sd_status st = SD_OK;
    double t0 = MPI_Wtime();
    watch("an all-gather of the segments");
    for (size_t b = 0; b < sd_dist_blocks(n) && !st; b++) {
        block_layout(n, b, cnt, off);
        int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf + b * SD_DIST_BLOCK, cnt, off, MPI_FLOAT,
                                MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) st = mpi_fail(rc, "MPI_Allgatherv", err);
    }
    watch(NULL);
    g_sum_s += MPI_Wtime() - t0;
    free(cnt);
    return st;
}

/* Per block, the segments to rank 0 (MPI_Gatherv): only rank 0 holds the
 * whole buffer. Not watched: it moves whole optimizer states for a
 * checkpoint, which may take long on a slow network. */
sd_status sd_dist_gather(void *full, const void *own, size_t n, size_t elem, sd_error *err)
{
    int N = g_on ? g_world : 1;
    if (N == 1) {
        memcpy(full, own, n * elem);
        return SD_OK;
    }
    int *cnt = malloc(2 * (size_t)N * sizeof(int));
    if (!cnt) return sd_err_set(err, SD_ENOMEM, "out of memory");
    int *off = cnt + N;
    sd_status st = SD_OK;
    size_t o = 0; /* values of own sent so far */
    for (size_t b = 0; b < sd_dist_blocks(n) && !st; b++) {
        block_layout(n, b, cnt, off);
        int mine = cnt[g_rank];
        for (int r = 0; r < N; r++) { /* values to bytes: a block's bytes fit an int (SD_DIST_BLOCK x 8) */
            cnt[r] *= (int)elem;
            off[r] *= (int)elem;
        }
        int rc = MPI_Gatherv((const char *)own + o * elem, cnt[g_rank], MPI_BYTE,
                             g_rank == 0 ? (char *)full + b * SD_DIST_BLOCK * elem : NULL, cnt, off, MPI_BYTE, 0,
                             MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) st = mpi_fail(rc, "MPI_Gatherv", err);
        o += (size_t)mine;
    }
    free(cnt);
    return st;
}

/* Each element crosses the network twice, as in a ring all-reduce. */
sd_status sd_dist_sum_f32(float *buf, size_t n, sd_error *err)
{
    sd_status st = sd_dist_reduce_scatter_f32(buf, n, err);
    return st ? st : sd_dist_allgather_f32(buf, n, err);
}

/* The time the gradient sums took so far. */
double sd_dist_sum_seconds(void)
{
    return g_sum_s;
}

/* A few doubles: gathered whole to every rank, summed in rank order. */
sd_status sd_dist_sum_f64(double *buf, int n, sd_error *err)
{
    if (!g_on || g_world == 1 || n <= 0) return SD_OK;
    double *all = malloc((size_t)n * (size_t)g_world * sizeof(double));
    if (!all) return sd_err_set(err, SD_ENOMEM, "out of memory");
    watch("a small all-gather (losses, counters)");
    int rc = MPI_Allgather(buf, n, MPI_DOUBLE, all, n, MPI_DOUBLE, MPI_COMM_WORLD);
    watch(NULL);
    sd_status st = SD_OK;
    if (rc != MPI_SUCCESS) st = mpi_fail(rc, "MPI_Allgather", err);
    else
        for (int i = 0; i < n; i++) {
            double s = all[i];
            for (int k = 1; k < g_world; k++) s += all[(size_t)k * (size_t)n + (size_t)i];
            buf[i] = s;
        }
    free(all);
    return st;
}

/* Rank 0's bytes to everyone. */
sd_status sd_dist_bcast(void *buf, size_t bytes, sd_error *err)
{
    if (!g_on || g_world == 1) return SD_OK;
    if (bytes > (size_t)1 << 30) return sd_err_set(err, SD_EINVAL, "broadcast of %zu bytes: too large", bytes);
    watch("a broadcast from rank 0");
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    watch(NULL);
    return rc == MPI_SUCCESS ? SD_OK : mpi_fail(rc, "MPI_Bcast", err);
}

/* Every rank's bytes to every rank (MPI_Allgather). */
sd_status sd_dist_allgather_bytes(const void *mine, size_t bytes, void *all, sd_error *err)
{
    if (!g_on || g_world == 1) {
        memcpy(all, mine, bytes);
        return SD_OK;
    }
    if (bytes > (size_t)1 << 30) return sd_err_set(err, SD_EINVAL, "all-gather of %zu bytes: too large", bytes);
    watch("an all-gather (the ranks' states)");
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    watch(NULL);
    return rc == MPI_SUCCESS ? SD_OK : mpi_fail(rc, "MPI_Allgather", err);
}

/* The minimum of ok over all ranks (a barrier too), under the watchdog
 * when what names the wait for it. */
static sd_status all_min(int ok, int *all_ok, const char *what, sd_error *err)
{
    *all_ok = ok;
    if (!g_on || g_world == 1) return SD_OK;
    if (what) watch(what);
    int rc = MPI_Allreduce(&ok, all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (what) watch(NULL);
    return rc == MPI_SUCCESS ? SD_OK : mpi_fail(rc, "MPI_Allreduce (all ranks ok?)", err);
}

/* A barrier that a hung peer cannot stall for longer than the timeout. */
sd_status sd_dist_all_ok(int ok, int *all_ok, sd_error *err)
{
    return all_min(ok, all_ok, "a barrier (all ranks ok?)", err);
}

/* A barrier that waits as long as the slowest rank's work takes. */
sd_status sd_dist_all_ok_untimed(int ok, int *all_ok, sd_error *err)
{
    return all_min(ok, all_ok, NULL, err);
}
