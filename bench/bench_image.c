/* Image pipeline throughput: decode + resize + crop + float CHW for each job
 * line "path offset size rw rh l t r b" (tab-separated, size -1 = whole
 * file), on N threads pulling jobs from a shared counter; prints images/s by
 * the wall clock and per CPU-second used (user + system, all threads: the
 * per-core figure that holds up when other work shares the machine).
 * usage: bench_image THREADS PASSES < jobs.tsv */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "image.h"

typedef struct {
    sd_image_src src;
    sd_image_plan plan;
} job;

typedef struct {
    job *jobs;
    size_t n, total;
    atomic_size_t next;
    atomic_int failed;
} queue;

/* One worker: take the next job until all passes are done. */
static void *worker(void *arg)
{
    queue *q = arg;
    float *out = NULL;
    size_t cap = 0;
    for (size_t i; (i = atomic_fetch_add(&q->next, 1)) < q->total;) {
        job *j = &q->jobs[i % q->n];
        size_t need = (size_t)sd_image_out_w(&j->plan) * sd_image_out_h(&j->plan) * 3;
        if (need > cap) {
            free(out);
            out = malloc(need * sizeof *out);
            cap = out ? need : 0;
        }
        sd_error err = {0};
        if (!out || sd_image_load_chw(&j->src, &j->plan, out, &err)) {
            fprintf(stderr, "bench_image: %s\n", err.msg);
            atomic_fetch_add(&q->failed, 1);
        }
    }
    free(out);
    sd_image_thread_done();
    return NULL;
}

/* Parse the job list from stdin. */
static job *read_jobs(size_t *n)
{
    job *v = NULL;
    size_t cap = 0;
    char line[8192], path[4096];
    *n = 0;
    while (fgets(line, sizeof line, stdin)) {
        job j = {0};
        long long off, size;
        if (sscanf(line, "%4095[^\t]\t%lld\t%lld\t%d\t%d\t%d\t%d\t%d\t%d", path, &off, &size, &j.plan.resize_w,
                   &j.plan.resize_h, &j.plan.crop_l, &j.plan.crop_t, &j.plan.crop_r, &j.plan.crop_b) != 9)
            continue;
        j.src.path = strdup(path);
        j.src.offset = (uint64_t)off;
        j.src.size = size < 0 ? SD_IMAGE_WHOLE_FILE : (uint64_t)size;
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            v = realloc(v, cap * sizeof *v);
            if (!v) return NULL;
        }
        v[(*n)++] = j;
    }
    return v;
}

/* CPU seconds (user + system) this process has used so far. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1, passes = argc > 2 ? atoi(argv[2]) : 1;
    sd_error err = {0};
    if (threads < 1 || threads > 256 || passes < 1 || sd_image_init(&err)) {
        fprintf(stderr, "usage: bench_image THREADS PASSES < jobs.tsv %s\n", err.msg);
        return 2;
    }
    queue q = {0};
    q.jobs = read_jobs(&q.n);
    if (!q.jobs || !q.n) return 2;
    q.total = q.n * (size_t)passes;
    pthread_t tid[256];
    struct timespec t0, t1;
    double c0 = cpu_seconds();
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, &q);
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, cpu = cpu_seconds() - c0;
    printf("sdtk %d thread(s): %zu images in %.2f s = %.2f images/s (%.2f per thread); %.2f CPU s = %.2f images per "
           "CPU-second; %d failed\n",
           threads, q.total, s, (double)q.total / s, (double)q.total / s / threads, cpu, (double)q.total / cpu,
           atomic_load(&q.failed));
    for (size_t i = 0; i < q.n; i++) free((char *)q.jobs[i].src.path);
    free(q.jobs);
    sd_image_shutdown();
    return atomic_load(&q.failed) ? 1 : 0;
}
