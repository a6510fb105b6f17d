/* Image pipeline throughput: decode + resize + crop + float CHW for each job
 * line "path offset size rw rh l t r b" (tab-separated, size -1 = whole
 * file), on N threads pulling jobs from a shared counter; prints images/s by
 * the wall clock and per CPU-second used (user + system, all threads: the
 * per-core figure that holds up when other work shares the machine), and on
 * one thread the CPU time per format (each job's format from its header,
 * read before timing).
 *
 * With "floor", the decoder floor instead: for each job only the work the
 * decoder libraries must do for it, as libcore/image/image_dec.c calls them, so
 * bench_image.sh can show how close sdtk is to what these libraries allow:
 * - JPEG: libjpeg-turbo at the DCT scale sd_fast_jpeg picks (sd_jpeg_denom),
 *   RGB or grey out, every scanline read;
 * - PNG: the IDAT stream inflated by libdeflate into a reused buffer (no
 *   unfiltering: that is sdtk's own work, as are the CRC checks);
 * - WebP: WebPDecode scaled to the resize size, one thread, RGB or RGBA.
 * Files are read into memory (and a PNG's IDATs joined) before timing; no
 * resize, crop, colour management, floats or page faults of fresh buffers.
 * Jobs the direct path declines (upscales) are decoded at full size by the
 * same library: the cheapest a decode of them can be. Other formats fail.
 * usage: bench_image THREADS PASSES [floor] < jobs.tsv */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <libdeflate.h>
#include <webp/decode.h>

#include "image.h"
#include "image_int.h"
#include "image_jpeg.h"
#include "imghdr.h"

/* ---- the job list and the thread runner ---- */

enum { BENCH_FORMATS = SD_IMG_BMP + 1 };

typedef struct {
    sd_image_src src;
    sd_image_plan plan;
    sd_imginfo info;      /* from the header (format SD_IMG_UNKNOWN when unreadable) */
    unsigned char *bytes; /* the encoded file, after bench_jobs_load */
    size_t len;
    void *aux;            /* the floor's own per-job data (a PNG's joined IDATs), freed with the list */
} bench_job;

/* What a run does with one job (the pipeline or the floor) on a worker thread. `state` is the
 * thread's own pointer (NULL at first); `done` gets it when the thread ends.
 * run returns 0 on success. */
typedef struct {
    int (*run)(const bench_job *j, void **state);
    void (*done)(void *state);
} bench_work;

typedef struct {
    size_t images;
    int failed;
    double wall, cpu; /* seconds: wall clock, process CPU (user + system, all threads) */
    /* on one thread only: jobs and process CPU seconds inside them, by format */
    size_t fmt_images[BENCH_FORMATS];
    double fmt_cpu[BENCH_FORMATS];
} bench_result;

static void bench_jobs_free(bench_job *jobs, size_t n);

/* The header of one job's image, so results can be split by format; the
 * format stays unknown when the header cannot be read. */
static void read_info(bench_job *j)
{
    sd_error err = {0};
    int fd = open(j->src.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || sd_imghdr_read_fd(fd, j->src.offset, j->src.size, &j->info, &err)) memset(&j->info, 0, sizeof j->info);
    if (fd >= 0) close(fd);
}

/* One job line, or 0 when the line is not one. */
static int parse_line(const char *line, bench_job *j)
{
    char path[4096];
    long long off, size;
    memset(j, 0, sizeof *j);
    if (sscanf(line, "%4095[^\t]\t%lld\t%lld\t%d\t%d\t%d\t%d\t%d\t%d", path, &off, &size, &j->plan.resize_w,
               &j->plan.resize_h, &j->plan.crop_l, &j->plan.crop_t, &j->plan.crop_r, &j->plan.crop_b) != 9)
        return 0;
    j->src.path = strdup(path);
    j->src.offset = (uint64_t)off;
    j->src.size = size < 0 ? SD_IMAGE_WHOLE_FILE : (uint64_t)size;
    return j->src.path != NULL;
}

/* Parse the job list; each job's header is read here, before any timing. */
static bench_job *bench_jobs_read(FILE *in, size_t *n)
{
    bench_job *v = NULL;
    size_t cap = 0;
    char line[8192];
    *n = 0;
    while (fgets(line, sizeof line, in)) {
        bench_job j;
        if (!parse_line(line, &j)) continue;
        if (*n == cap) {
            size_t c2 = cap ? 2 * cap : 256;
            bench_job *v2 = realloc(v, c2 * sizeof *v);
            if (!v2) {
                free((char *)j.src.path);
                bench_jobs_free(v, *n);
                *n = 0;
                return NULL;
            }
            v = v2;
            cap = c2;
        }
        read_info(&j);
        v[(*n)++] = j;
    }
    if (!*n) {
        free(v);
        return NULL;
    }
    return v;
}

/* The job's encoded bytes, read whole into memory (with 16 spare bytes). */
static int load_one(bench_job *j)
{
    int fd = open(j->src.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    uint64_t size = j->src.size;
    if (size == SD_IMAGE_WHOLE_FILE) {
        off_t end = lseek(fd, 0, SEEK_END);
        size = end > 0 && (uint64_t)end > j->src.offset ? (uint64_t)end - j->src.offset : 0;
    }
    j->bytes = size ? malloc((size_t)size + 16) : NULL;
    size_t have = 0;
    while (j->bytes && have < size) {
        ssize_t r = pread(fd, j->bytes + have, (size_t)size - have, (off_t)(j->src.offset + have));
        if (r <= 0) break;
        have += (size_t)r;
    }
    close(fd);
    j->len = have;
    return j->bytes && have == size ? 0 : -1;
}

/* Every job's file into memory, so the timed part reads no files. */
static int bench_jobs_load(bench_job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (load_one(&jobs[i])) {
            fprintf(stderr, "bench: cannot read %s\n", jobs[i].src.path);
            return -1;
        }
    return 0;
}

/* Free the list, the paths, the bytes and the benchmarks' per-job data. */
static void bench_jobs_free(bench_job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free((char *)jobs[i].src.path);
        free(jobs[i].bytes);
        free(jobs[i].aux);
    }
    free(jobs);
}

/* CPU seconds (user + system) this process has used so far. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

/* Seconds on the monotonic clock. */
static double wall_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    const bench_job *jobs;
    size_t n, total;
    const bench_work *work;
    int by_format; /* one thread: the process's CPU time is this thread's */
    atomic_size_t next;
    atomic_int failed;
    bench_result *r;
} queue;

/* One worker: take the next job until all passes are done. On a single
 * thread each job's process CPU time (which also counts any helper thread
 * a library starts for it) is added to its format. */
static void *worker(void *arg)
{
    queue *q = arg;
    void *state = NULL;
    for (size_t i; (i = atomic_fetch_add(&q->next, 1)) < q->total;) {
        const bench_job *j = &q->jobs[i % q->n];
        double c0 = q->by_format ? cpu_seconds() : 0;
        if (q->work->run(j, &state)) atomic_fetch_add(&q->failed, 1);
        if (q->by_format) {
            q->r->fmt_images[j->info.format]++;
            q->r->fmt_cpu[j->info.format] += cpu_seconds() - c0;
        }
    }
    if (q->work->done) q->work->done(state);
    return NULL;
}

/* Run all passes on `threads` threads and time them. */
static int bench_run(const bench_job *jobs, size_t n, int threads, int passes, const bench_work *w, bench_result *r)
{
    memset(r, 0, sizeof *r);
    if (threads < 1 || threads > 256 || passes < 1 || !n) return -1;
    queue q = {.jobs = jobs, .n = n, .total = n * (size_t)passes, .work = w, .by_format = threads == 1, .r = r};
    atomic_init(&q.next, 0);
    atomic_init(&q.failed, 0);
    pthread_t tid[256];
    int started = 0;
    double c0 = cpu_seconds(), t0 = wall_seconds();
    while (started < threads && pthread_create(&tid[started], NULL, worker, &q) == 0) started++;
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    r->wall = wall_seconds() - t0;
    r->cpu = cpu_seconds() - c0;
    r->images = q.total;
    r->failed = atomic_load(&q.failed);
    return started == threads ? 0 : -1;
}

/* The summary line the scripts parse, then the per-format lines. */
static void bench_print(const char *who, int threads, const bench_result *r)
{
    double n = (double)r->images;
    printf("%s %d thread(s): %zu images in %.2f s = %.2f images/s (%.2f per thread); %.2f CPU s = %.2f images per "
           "CPU-second; %d failed\n",
           who, threads, r->images, r->wall, n / r->wall, n / r->wall / threads, r->cpu, n / r->cpu, r->failed);
    for (int f = 0; f < BENCH_FORMATS; f++)
        if (r->fmt_images[f] && r->fmt_cpu[f] > 0)
            printf("%s %d thread(s) %s: %zu images, %.3f CPU s = %.2f images per CPU-second\n", who, threads,
                   sd_img_format_name((sd_img_format)f), r->fmt_images[f], r->fmt_cpu[f],
                   (double)r->fmt_images[f] / r->fmt_cpu[f]);
}

/* ---- the whole pipeline ---- */

typedef struct {
    float *out;
    size_t cap;
} chw_buf;

/* One image through the whole pipeline into the thread's float buffer. */
static int run_one(const bench_job *j, void **state)
{
    chw_buf *b = *state;
    if (!b && !(b = *state = calloc(1, sizeof *b))) return -1;
    size_t need = (size_t)sd_image_out_w(&j->plan) * sd_image_out_h(&j->plan) * 3;
    if (need > b->cap) {
        free(b->out);
        b->out = malloc(need * sizeof *b->out);
        b->cap = b->out ? need : 0;
    }
    sd_error err = {0};
    if (b->out && !sd_image_load_chw(&j->src, &j->plan, b->out, &err)) return 0;
    fprintf(stderr, "bench_image: %s\n", b->out ? err.msg : "out of memory");
    return -1;
}

/* The thread is done: its buffer and the image library's thread state. */
static void thread_done(void *state)
{
    chw_buf *b = state;
    if (b) free(b->out);
    free(b);
    sd_image_thread_done();
}

/* ---- the decoder floor ---- */

/* A PNG job's zlib stream (the IDAT payloads end to end) and inflated size. */
typedef struct {
    size_t zn, rawn;
    unsigned char z[];
} png_aux;

/* A thread's buffers, grown as needed and kept from job to job. */
typedef struct {
    unsigned char *buf;
    size_t cap;
    struct libdeflate_decompressor *inflater;
} floor_state;

/* At least n bytes of the thread's buffer (NULL when out of memory). */
static unsigned char *room(floor_state *s, size_t n)
{
    if (n <= s->cap) return s->buf;
    free(s->buf);
    s->buf = malloc(n);
    s->cap = s->buf ? n : 0;
    return s->buf;
}

/* Whether the plan shrinks (or keeps) both sides: the direct decoders' case. */
static int shrinks(const bench_job *j)
{
    return j->info.width >= (uint32_t)j->plan.resize_w && j->info.height >= (uint32_t)j->plan.resize_h;
}


/* libjpeg-turbo as sd_fast_jpeg drives it: markers saved for the ICC
 * profile, RGB or grey out, the same DCT scale, all scanlines read. */
static int floor_jpeg(const bench_job *j, floor_state *s)
{
    struct jpeg_decompress_struct c;
    sd_jpeg_fail fail; /* errors and warnings fail the job, as they end the pipeline's fast path */
    sd_jpeg_fail_init(&c, &fail);
    if (setjmp(fail.jump)) {
        jpeg_destroy_decompress(&c);
        return -1;
    }
    jpeg_create_decompress(&c);
    jpeg_mem_src(&c, j->bytes, (unsigned long)j->len);
    jpeg_save_markers(&c, JPEG_APP0 + 2, 0xFFFF);
    jpeg_read_header(&c, TRUE);
    c.out_color_space = c.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
    c.scale_num = 1;
    c.scale_denom = shrinks(j) ? (unsigned)sd_jpeg_denom(c.image_width, c.image_height, &j->plan) : 1;
    jpeg_start_decompress(&c);
    unsigned char *rows = room(s, sd_jpeg_drain_bytes(&c));
    if (!rows) longjmp(fail.jump, 1);
    sd_jpeg_drain(&c, rows);
    jpeg_finish_decompress(&c);
    jpeg_destroy_decompress(&c);
    return 0;
}

/* The IDAT stream inflated in one libdeflate call, as sd_fast_png does. */
static int floor_png(const bench_job *j, floor_state *s)
{
    const png_aux *a = j->aux;
    if (!a) return -1;
    if (!s->inflater && !(s->inflater = libdeflate_alloc_decompressor())) return -1;
    unsigned char *raw = room(s, a->rawn);
    if (!raw) return -1;
    return libdeflate_zlib_decompress(s->inflater, a->z, a->zn, raw, a->rawn, NULL) == LIBDEFLATE_SUCCESS ? 0 : -1;
}

/* WebPDecode as sd_fast_webp calls it: no threads, scaled to the resize
 * size, RGB or RGBA into a buffer of our own. */
static int floor_webp(const bench_job *j, floor_state *s)
{
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg) || WebPGetFeatures(j->bytes, j->len, &cfg.input) != VP8_STATUS_OK) return -1;
    int w = cfg.input.width, h = cfg.input.height, chan = cfg.input.has_alpha ? 4 : 3;
    cfg.options.use_threads = 0;
    if (shrinks(j) && (w != j->plan.resize_w || h != j->plan.resize_h)) {
        w = j->plan.resize_w;
        h = j->plan.resize_h;
        cfg.options.use_scaling = 1;
        cfg.options.scaled_width = w;
        cfg.options.scaled_height = h;
    }
    size_t stride = (size_t)w * (size_t)chan, size = stride * (size_t)h;
    unsigned char *px = room(s, size);
    if (!px) return -1;
    cfg.output.colorspace = chan == 4 ? MODE_RGBA : MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = px;
    cfg.output.u.RGBA.stride = (int)stride;
    cfg.output.u.RGBA.size = size;
    int rc = WebPDecode(j->bytes, j->len, &cfg) == VP8_STATUS_OK ? 0 : -1;
    WebPFreeDecBuffer(&cfg.output);
    return rc;
}

/* One job's decoder work, by format. */
static int floor_one(const bench_job *j, void **state)
{
    floor_state *s = *state;
    if (!s && !(s = *state = calloc(1, sizeof *s))) return -1;
    int rc = -1;
    switch (j->info.format) {
    case SD_IMG_JPEG: rc = floor_jpeg(j, s); break;
    case SD_IMG_PNG: rc = floor_png(j, s); break;
    case SD_IMG_WEBP: rc = floor_webp(j, s); break;
    default: break;
    }
    if (rc) fprintf(stderr, "bench_decode: %s: no decoder floor (format %s or a decode error)\n", j->src.path,
                    sd_img_format_name(j->info.format));
    return rc;
}

/* The thread's buffers go. */
static void floor_done(void *state)
{
    floor_state *s = state;
    if (!s) return;
    if (s->inflater) libdeflate_free_decompressor(s->inflater);
    free(s->buf);
    free(s);
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* A PNG's IDAT payloads joined and its inflated size (rows of 1 filter
 * byte + width x channels bytes, 8-bit), before timing; NULL when the file
 * is not one the direct decoder would inflate this way. */
static png_aux *png_prepare(const bench_job *j)
{
    const unsigned char *b = j->bytes;
    if (j->len < 33 || b[24] != 8 || b[28] != 0) return NULL;
    int chan = b[25] == 0 ? 1 : b[25] == 2 ? 3 : b[25] == 4 ? 2 : b[25] == 6 ? 4 : 0;
    if (!chan) return NULL;
    size_t zn = 0;
    for (size_t p = 8; p + 12 <= j->len; p += 12 + be32(b + p))
        if (memcmp(b + p + 4, "IDAT", 4) == 0) zn += be32(b + p);
    png_aux *a = malloc(sizeof *a + zn);
    if (!a) return NULL;
    a->zn = 0;
    a->rawn = (size_t)j->info.height * ((size_t)j->info.width * (size_t)chan + 1);
    for (size_t p = 8; p + 12 <= j->len; p += 12 + be32(b + p)) {
        size_t n = be32(b + p);
        if (memcmp(b + p + 4, "IDAT", 4) == 0 && n <= j->len - p - 12 && a->zn + n <= zn) {
            memcpy(a->z + a->zn, b + p + 8, n);
            a->zn += n;
        }
    }
    return a;
}

/* Before timing: every file into memory, every PNG's IDATs joined. */
static int prepare_floor(bench_job *jobs, size_t n)
{
    if (bench_jobs_load(jobs, n)) return -1;
    for (size_t i = 0; i < n; i++)
        if (jobs[i].info.format == SD_IMG_PNG) jobs[i].aux = png_prepare(&jobs[i]);
    return 0;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1, passes = argc > 2 ? atoi(argv[2]) : 1;
    int floor = argc > 3 && strcmp(argv[3], "floor") == 0;
    sd_error err = {0};
    if (threads < 1 || threads > 256 || passes < 1 || (argc > 3 && !floor) || sd_image_init(&err)) {
        fprintf(stderr, "usage: bench_image THREADS PASSES [floor] < jobs.tsv %s\n", err.msg);
        return 2;
    }
    size_t n = 0;
    bench_job *jobs = bench_jobs_read(stdin, &n);
    if (!jobs) return 2;
    int rc = floor ? prepare_floor(jobs, n) : 0;
    const bench_work work = floor ? (bench_work){floor_one, floor_done} : (bench_work){run_one, thread_done};
    bench_result r;
    if (!rc) rc = bench_run(jobs, n, threads, passes, &work, &r);
    if (!rc) bench_print(floor ? "decoder floor" : "sdtk", threads, &r);
    bench_jobs_free(jobs, n);
    sd_image_shutdown();
    return rc ? 3 : r.failed ? 1 : 0;
}
