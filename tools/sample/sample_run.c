/* sd-sample's run: the prompts, the backend (the CPU pool or --device
 * cuda:K), the model, then each prompt's image as DIR/NNNNN.png (written
 * whole or not at all), the contact sheet and a summary by reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "log.h"
#include "outfile.h"
#include "png_write.h"
#include "pool.h"
#include "progress.h"
#include "sample.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

/* The run's state across images. */
typedef struct {
    sd_progress prog;
    uint64_t steps_before; /* steps of the images before this one */
} run_state;

/* Per-step progress over all images' steps. */
static void step_progress(void *vc, int step, int steps)
{
    (void)steps;
    run_state *r = vc;
    sd_progress_update(&r->prog, r->steps_before + (uint64_t)step + 1, 0);
}

/* The backend: CUDA device K, or the CPU with a pool of threads. */
static sd_status open_backend(const sample_opts *o, const sd_backend **be, void **exec, sd_error *err)
{
    if (o->cuda_device < 0) {
        sd_pool *p = sd_pool_create(o->threads);
        if (!p) return sd_err_set(err, SD_ENOMEM, "cannot start %d threads", o->threads);
        *be = sd_backend_cpu();
        *exec = p;
        return SD_OK;
    }
#ifdef SDTK_HAVE_CUDA
    sd_cuda *c = NULL;
    sd_cuda_opts co = {0};
    sd_status st = sd_cuda_create(&c, o->cuda_device, &co, err);
    if (st) return st;
    *exec = c;
    *be = sd_backend_cuda();
    return SD_OK;
#else
    return sd_err_set(err, SD_EUNSUPPORTED, "--device cuda:%d: this sd-sample was built without CUDA (nvcc was not "
                      "found at build time)", o->cuda_device);
#endif
}

/* Release the backend of open_backend. */
static void close_backend(const sample_opts *o, void *exec)
{
    if (!exec) return;
    if (o->cuda_device < 0) {
        sd_pool_destroy(exec);
        return;
    }
#ifdef SDTK_HAVE_CUDA
    sd_cuda_destroy(exec);
#endif
}

/* The jobs: the prompts file's lines, or the command line's one prompt. */
static sd_status read_jobs(const sample_opts *o, sd_sample_job **jobs, size_t *n, sd_sample_skips *sk, sd_error *err)
{
    if (o->prompts) return sd_sample_read_prompts(o->prompts, "--prompts", &o->defaults, jobs, n, sk, err);
    *jobs = calloc(1, sizeof(**jobs));
    if (!*jobs) return sd_err_set(err, SD_ENOMEM, "out of memory");
    **jobs = o->defaults;
    (*jobs)->prompt = strdup(o->defaults.prompt ? o->defaults.prompt : "");
    (*jobs)->negative = strdup(o->defaults.negative ? o->defaults.negative : "");
    *n = 1;
    if (!(*jobs)->prompt || !(*jobs)->negative) return sd_err_set(err, SD_ENOMEM, "out of memory");
    return SD_OK;
}

/* One image's PNG with its infotext, written atomically to path. */
static sd_status write_png(const char *path, const sd_sample_job *j, int w, int h, const uint8_t *rgb, const char *model,
                           sd_error *err)
{
    sd_buf info, png;
    sd_buf_init(&info);
    sd_buf_init(&png);
    sd_sample_infotext(j, w, h, model, &info);
    sd_status st = info.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : SD_OK;
    if (!st) st = sd_png_encode(rgb, w, h, "parameters", sd_buf_cstr(&info), &png, err);
    if (!st) st = sd_write_file_atomic(path, png.data, png.len, err);
    sd_buf_free(&info);
    sd_buf_free(&png);
    return st;
}

/* The contact sheet of every image made, in order (failed ones dark). */
static sd_status write_sheet(const char *dir, size_t n, uint8_t **rgb, const int *w, const int *h, sd_error *err)
{
    uint8_t *sheet = NULL;
    int sw, sh;
    sd_status st = sample_contact_sheet((int)n, rgb, w, h, &sheet, &sw, &sh, err);
    if (st) return st;
    sd_buf png;
    sd_buf_init(&png);
    char path[4200];
    snprintf(path, sizeof path, "%s/contact.png", dir);
    st = sd_png_encode(sheet, sw, sh, NULL, NULL, &png, err);
    if (!st) st = sd_write_file_atomic(path, png.data, png.len, err);
    sd_buf_free(&png);
    free(sheet);
    return st;
}

/* A kept image (--skip-existing) read back for the contact sheet; NULL
 * (a dark cell) with a warning when it cannot be read. */
static uint8_t *read_kept(const char *path, int *w, int *h)
{
    uint8_t *rgb = NULL;
    sd_error e = {0};
    if (sample_read_kept(path, &rgb, w, h, &e))
        sd_log(SD_LOG_WARN, "%s: kept, but it cannot be read for the contact sheet (%s): a dark cell there", path,
               e.msg);
    return rgb;
}

/* Every job in turn (those kept[i] only read back for the sheet); a failed
 * image is named and counted, the rest go on. */
static int run_jobs(const sample_opts *o, sd_sample_model *m, sd_sample_job *jobs, size_t n, const uint8_t *kept,
                    size_t *failed)
{
    uint8_t **rgb = calloc(n ? n : 1, sizeof(*rgb));
    int *ws = calloc(n ? n : 1, sizeof(int)), *hs = calloc(n ? n : 1, sizeof(int));
    if (!rgb || !ws || !hs) {
        free(rgb), free(ws), free(hs);
        sd_log(SD_LOG_ERROR, "out of memory");
        return -1;
    }
    run_state r = {0};
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += kept[i] ? 0 : (uint64_t)jobs[i].steps;
    sd_progress_init(&r.prog, "sampling", "steps", total, !o->quiet && total);
    int dw = 0, dh = 0;
    if (total) sd_sample_model_default_size(m, &m->unet, &dw, &dh); /* no model is loaded when all are kept */
    for (size_t i = 0; i < n; i++) {
        sd_sample_job *j = &jobs[i];
        int w = j->width ? j->width : dw, h = j->height ? j->height : dh;
        char path[4200], where[4200] = "";
        sample_path(o, j, i, path, sizeof path);
        if (kept[i]) {
            rgb[i] = o->contact ? read_kept(path, &ws[i], &hs[i]) : NULL;
            continue;
        }
        if (j->line) snprintf(where, sizeof where, " (%s line %ld)", o->prompts, j->line);
        sd_error e = {0};
        uint8_t *img = malloc((size_t)w * (size_t)h * 3);
        sd_sample_cond cond = {0};
        double t0 = sd_now();
        sd_status st = img ? sd_sample_cond_make(m, j, &cond, &e)
                           : sd_err_set(&e, SD_ENOMEM, "out of memory for a %dx%d image", w, h);
        if (!st) sd_log(SD_LOG_DEBUG, "times: text %.3f s (%s)", sd_now() - t0, path); /* -v; the rest: generate's */
        if (!st) st = sd_sample_generate(m, &m->unet, m->params, j, &cond, w, h, step_progress, &r, img, &e);
        sd_sample_cond_free(&cond);
        if (!st) st = write_png(path, j, w, h, img, m->name, &e);
        r.steps_before += (uint64_t)j->steps;
        if (st) {
            sd_log(SD_LOG_WARN, "%s%s: %s: image not written", path, where, e.msg);
            (*failed)++;
            free(img);
            img = NULL;
        }
        rgb[i] = img;
        ws[i] = w;
        hs[i] = h;
    }
    sd_progress_finish(&r.prog);
    int rc = 0;
    if (o->contact && *failed < n) { /* a sheet of dark cells only would pass for a result */
        sd_error e = {0};
        if (write_sheet(o->output, n, rgb, ws, hs, &e)) {
            sd_log(SD_LOG_ERROR, "%s/contact.png: %s", o->output, e.msg);
            rc = -1;
        }
    }
    for (size_t i = 0; i < n; i++) free(rgb[i]);
    free(rgb), free(ws), free(hs);
    return rc;
}

/* The whole run (see sample.h). */
int sample_run(const sample_opts *o)
{
    sd_error err = {0};
    sd_sample_job *jobs = NULL;
    size_t n = 0, failed = 0;
    sd_sample_skips sk = {0};
    const sd_backend *be = NULL;
    void *exec = NULL;
    sd_sample_model m;
    memset(&m, 0, sizeof m);
    int rc = SD_EXIT_FATAL, images = 0;
    uint8_t *kept = NULL;
    size_t nkept = 0;
    if (read_jobs(o, &jobs, &n, &sk, &err) || sd_make_dirs(o->output, &err)) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
    } else if (!(kept = calloc(n ? n : 1, 1))) {
        sd_log(SD_LOG_ERROR, "out of memory");
    } else if (sample_check_outputs(o, jobs, n, kept, &nkept)) {
        rc = SD_EXIT_USAGE; /* before any model is loaded */
    } else if ((nkept && o->contact && (images = !sd_image_init(&err)) == 0) ||
               (nkept < n && (open_backend(o, &be, &exec, &err) || sd_sample_model_open(&m, &o->src, be, exec, &err)))) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
    } else if (run_jobs(o, &m, jobs, n, kept, &failed) == 0) {
        size_t skipped = sd_sample_skips_total(&sk), made = n - nkept - failed;
        sd_log(failed || skipped ? SD_LOG_WARN : SD_LOG_INFO,
               "%zu image(s) written to %s, %zu kept from before, %zu failed; %zu line(s) skipped (bad JSON %zu, unknown "
               "sampler %zu, size not a multiple of 8 %zu, other fields %zu)", made, o->output, nkept, failed, skipped,
               sk.bad_json, sk.bad_sampler, sk.bad_size, sk.bad_field);
        /* a failed image is a result missing: 1 always; a skipped line only with --strict */
        rc = failed || (skipped && o->strict) ? SD_EXIT_SKIPPED : SD_EXIT_OK;
    }
    sd_sample_model_close(&m);
    close_backend(o, exec);
    if (images) sd_image_shutdown();
    free(kept);
    sd_sample_jobs_free(jobs, n);
    return rc;
}
