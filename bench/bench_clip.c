/* CLIP text encoding benchmark (bench_clip.sh runs it): load a text
 * encoder, encode N raw int32 id rows [N, 77] REPS times on THREADS threads
 * after a warm-up (SD 1.x output: last layer + final layer norm), print the
 * best and median seconds and captions/s, wall time and the process's CPU
 * time (on a shared VM the CPU time of a 1-thread run is the steadier
 * figure); write the hidden states to OUT for comparison with PyTorch's.
 * usage: bench_clip MODEL_DIR IDS.i32 N THREADS REPS OUT.f32 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "prof_backend.h"
#include "clip_text.h"
#include "progress.h"

/* Seconds of CPU time used by this process (all its threads). */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ascending order of doubles, for the median. */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: bench_clip MODEL_DIR IDS.i32 N THREADS REPS OUT.f32\n");
        return 2;
    }
    int n = atoi(argv[3]), threads = atoi(argv[4]), reps = atoi(argv[5]), t = 77;
    if (n < 1 || threads < 1 || reps < 1 || reps > 100) return 2;
    sd_clip_text m;
    sd_error err = {0};
    if (sd_clip_text_load(&m, argv[1], NULL, &err)) {
        fprintf(stderr, "bench_clip: %s\n", err.msg);
        return 1;
    }
    size_t nid = (size_t)n * (size_t)t, nh = nid * (size_t)m.cfg.width;
    int32_t *ids = malloc(nid * sizeof(int32_t));
    FILE *f = fopen(argv[2], "rb");
    if (!ids || !f || fread(ids, sizeof(int32_t), nid, f) != nid) {
        fprintf(stderr, "bench_clip: cannot read %s\n", argv[2]);
        return 1;
    }
    fclose(f);
    sd_clip_text_out out;
    if (sd_clip_text_preset(&m, SD_CLIP_SD1, 0, &out, &err)) {
        fprintf(stderr, "bench_clip: %s\n", err.msg);
        return 1;
    }
    size_t wsn = sd_clip_text_workspace_floats(&m, n, t);
    float *hidden = malloc(nh * sizeof(float)), *ws = malloc(wsn * sizeof(float));
    double *ts = calloc((size_t)reps, sizeof(double)), *cs = calloc((size_t)reps, sizeof(double));
    if (!hidden || !ws || !ts || !cs) return 1;
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    const sd_backend *be = sd_backend_cpu();
    if (sd_clip_text_encode(&m, be, pool, n, t, ids, &out, hidden, NULL, ws, &err)) { /* warm-up */
        fprintf(stderr, "bench_clip: %s\n", err.msg);
        return 1;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = sd_now(), c0 = cpu_now();
        sd_clip_text_encode(&m, be, pool, n, t, ids, &out, hidden, NULL, ws, &err);
        ts[r] = sd_now() - t0;
        cs[r] = cpu_now() - c0;
    }
    qsort(ts, (size_t)reps, sizeof(double), cmp_double);
    qsort(cs, (size_t)reps, sizeof(double), cmp_double);
    printf("sdtk cpu fp32, %d thread(s): best %.3f s, median %.3f s, %.2f captions/s; cpu time best %.3f s, %.2f "
           "captions per cpu-s (workspace %zu KB, weights %zu MB)\n",
           threads, ts[0], ts[reps / 2], n / ts[0], cs[0], n / cs[0], wsn * sizeof(float) >> 10,
           sd_weights_bytes(&m.w) >> 20);
    memset(tsum, 0, sizeof tsum); /* one more encode, every op timed: where the time goes */
    double t0 = sd_now();
    sd_clip_text_encode(&m, prof_backend(be), pool, n, t, ids, &out, hidden, NULL, ws, &err);
    printf("  profiled encode %.3f s:", sd_now() - t0);
    for (int k = 0; k < C_N; k++) printf(" %s %.3f s,", class_name[k], tsum[k]);
    printf("\n");
    f = fopen(argv[6], "wb");
    if (f) {
        fwrite(hidden, sizeof(float), nh, f);
        fclose(f);
    }
    if (pool) sd_pool_destroy(pool);
    free(ids);
    free(hidden);
    free(ws);
    free(ts);
    free(cs);
    sd_clip_text_free(&m);
    return 0;
}
