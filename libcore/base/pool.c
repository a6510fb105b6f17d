#include "pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sd_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    unsigned long generation; /* bumped for each sd_pool_for call */
    int pending;              /* workers still running the current job */
    int quit;
    size_t job_n;
    sd_range_fn job_fn;
    void *job_ctx;
};

typedef struct {
    sd_pool *pool;
    int id;
} worker_arg;

/* Slice [0,n) evenly so worker w gets [begin,end). */
static void slice(size_t n, int workers, int w, size_t *begin, size_t *end)
{
    *begin = n * (size_t)w / (size_t)workers;
    *end = n * (size_t)(w + 1) / (size_t)workers;
}

/* Worker loop: wait for a new generation, run our slice, report done. */
static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    sd_pool *p = wa->pool;
    int id = wa->id;
    free(wa);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        size_t n = p->job_n;
        sd_range_fn fn = p->job_fn;
        void *ctx = p->job_ctx;
        pthread_mutex_unlock(&p->mu);

        size_t b, e;
        slice(n, p->n, id, &b, &e);
        if (b < e) fn(ctx, id, b, e);

        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Start nthreads-1 threads; the caller's thread acts as worker 0. */
sd_pool *sd_pool_create(int nthreads)
{
    if (nthreads < 1) nthreads = 1;
    sd_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = nthreads;
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->n = i;
            break;
        }
        wa->pool = p;
        wa->id = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i;
            break;
        }
    }
    return p;
}

/* Stop and join all workers. */
void sd_pool_destroy(sd_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

/* Number of workers, so callers can size per-worker state. */
int sd_pool_size(const sd_pool *p)
{
    return p ? p->n : 1;
}

/* Run fn over [0,n) split across all workers and wait for all of them. */
void sd_pool_for(sd_pool *p, size_t n, sd_range_fn fn, void *ctx)
{
    if (!p || p->n == 1) {
        if (n) fn(ctx, 0, 0, n);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->job_n = n;
    p->job_fn = fn;
    p->job_ctx = ctx;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);

    size_t b, e;
    slice(n, p->n, 0, &b, &e);
    if (b < e) fn(ctx, 0, b, e);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* A zeroed array of n per-worker structs (declared with SD_WORKER_ALIGN)
 * on 64-byte boundaries, so no two workers share a cache line. free() it. */
void *sd_worker_array(size_t n, size_t size)
{
    size_t bytes = (n ? n : 1) * size;
    bytes = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

/* The CPUs this process may run on (taskset, cgroup cpusets, a launcher's
 * binding), else the online ones: the default for --threads. */
int sd_default_threads(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* A cgroup memory limit file's value in bytes; 0 for "max", none or unreadable. */
static size_t cgroup_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[64] = "";
    size_t v = 0;
    if (fgets(line, sizeof line, f) && line[0] >= '0' && line[0] <= '9') {
        unsigned long long x = strtoull(line, NULL, 10);
        v = x > (unsigned long long)SIZE_MAX ? 0 : (size_t)x;
    }
    fclose(f);
    return v;
}

/* The memory this process may use: the machine's, or less where a cgroup
 * limits it (a container, a Slurm job), v2 at the process's own cgroup or
 * the namespace root, v1's memory controller; 0 when unknown. Sizes a
 * memory check before an allocation that overcommit would let through. */
size_t sd_memory_limit(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t mem = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    char path[4200] = "", line[4096];
    FILE *f = fopen("/proc/self/cgroup", "r");
    while (f && fgets(line, sizeof line, f)) /* "0::/path" is the v2 hierarchy */
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = 0;
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
        }
    if (f) fclose(f);
    const char *const files[] = {path, "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        size_t lim = files[i][0] ? cgroup_limit(files[i]) : 0;
        if (lim && (!mem || lim < mem)) mem = lim;
    }
    return mem;
}
