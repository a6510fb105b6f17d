/* sd-train's samples (--sample-prompts): the prompts read and their
 * conditioning made once at the start with the text encoders of the model
 * the run starts from, which are then freed; the VAE decoder kept on the
 * trainer's backend. At a sample step each prompt is rendered with the
 * trainer's own weights (and EMA weights) where they lie, through the same
 * code as sd-sample (libcore/models/txt2img.h), into PNGs with A1111's
 * infotext and TensorBoard images. Only rank 0 samples. A failure here is
 * a warning and a count, never the run's end: sampling reads the weights,
 * uses its own generator (torch's, seeded by the prompt line) and its own
 * buffers, so the training is the same with and without it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "log.h"
#include "outfile.h"
#include "png_write.h"
#include "progress.h"
#include "train_int.h"
#include "txt2img.h"

struct sd_train_samples {
    sd_sample_model m;
    int usable;             /* the model loaded and fits the UNet: images can be made */
    sd_sample_job *jobs;
    size_t n;
    sd_sample_cond *cond;   /* per job; ctx NULL where its prompt could not be encoded */
    sd_sample_skips skips;  /* prompt lines refused */
    size_t written, failed; /* images */
    size_t f_model, f_text, f_nonfinite, f_write, f_other; /* failed images by reason */
    long last_step;         /* the step last rendered, -1 before one */
    const char *path;       /* the model the conditioning came from */
};

/* The model the prompts' conditioning comes from: --sample-model, else
 * --save-full's --base-model, else the --unet folder (the tool checked
 * that it holds a text encoder). */
static const char *model_path(const sd_train_opts *o)
{
    return o->sample_model ? o->sample_model : o->base_model ? o->base_model : o->unet;
}

/* The caption tokens the samples are conditioned with: the training
 * shards', so the UNet sees the sequence length it trains on. */
static int sample_tokens(sd_trainer *tr)
{
    sd_load_opts lo = sd_train_unet_load_opts(&tr->unet.cfg);
    return tr->have_data ? sd_data_caption_tokens(&tr->data, &lo) : 75;
}

/* Every prompt's conditioning, then the text encoders freed; a prompt that
 * cannot be encoded is warned about and its images count as failed. */
static void make_conditioning(sd_train_samples *s, const char *prompts)
{
    for (size_t i = 0; i < s->n; i++) {
        sd_error e = {0};
        if (sd_sample_cond_make(&s->m, &s->jobs[i], &s->cond[i], &e))
            sd_log(SD_LOG_WARN, "%s line %ld: the prompt cannot be encoded (%s): no samples of it", prompts,
                   s->jobs[i].line, e.msg);
    }
    sd_sample_model_drop_text(&s->m);
}

/* See train_int.h. */
sd_status sd_train_samples_open(sd_trainer *tr, sd_error *err)
{
    const sd_train_opts *o = &tr->o;
    if (!o->sample_prompts || tr->rank != 0 || tr->samples) return SD_OK;
    sd_train_samples *s = calloc(1, sizeof *s);
    if (!s) return sd_err_set(err, SD_ENOMEM, "out of memory");
    tr->samples = s;
    s->last_step = -1;
    s->path = model_path(o);
    sd_sample_job def;
    sd_sample_job_default(&def);
    sd_status st = sd_sample_read_prompts(o->sample_prompts, "--sample-prompts", &def, &s->jobs, &s->n, &s->skips, err);
    if (st) return st;
    s->cond = calloc(s->n ? s->n : 1, sizeof *s->cond);
    if (!s->cond) return sd_err_set(err, SD_ENOMEM, "out of memory");
    if (!s->n) {
        sd_log(SD_LOG_WARN, "--sample-prompts %s: no usable line: no samples in this run", o->sample_prompts);
        return SD_OK;
    }
    sd_sample_source src = {.path = s->path, .tokenizer = o->sample_tokenizer,
                            .prediction = sd_prediction_name(o->pred), .no_unet = 1, .max_tokens = sample_tokens(tr)};
    sd_error e = {0};
    double t0 = sd_now();
    st = sd_sample_model_open(&s->m, &src, tr->be, tr->exec, &e);
    if (!st) st = sd_sample_model_fits(&s->m, &tr->unet, s->path, &e);
    if (st) {
        sd_log(SD_LOG_WARN, "samples: %s: no samples in this run; training goes on", e.msg);
        sd_sample_model_close(&s->m);
        return SD_OK;
    }
    make_conditioning(s, o->sample_prompts);
    sd_sample_model_release_work(&s->m);
    s->usable = 1;
    if (!o->quiet)
        sd_log(SD_LOG_INFO, "samples: %zu prompt(s) from %s, conditioned by %s's text encoder%s at %d tokens, as "
               "the shards (%.1f s, then freed); its VAE decoder kept (%.1f MiB of weights)", s->n, o->sample_prompts,
               s->path, s->m.sdxl ? "s" : "", s->m.max_tokens, sd_now() - t0,
               (double)s->m.vae.w.total * sizeof(float) / 1048576.0);
    return SD_OK;
}

/* Where step's images go: into the checkpoint of the step when one was just
 * saved (checkpoint-N/samples, samples-ema), else out/samples/step-N and
 * out/samples-ema/step-N. */
static void sample_dir(const sd_trainer *tr, int ema, char *dir, char *name, size_t cap)
{
    char sub[PATH_CAP];
    if (tr->saved_step == tr->step) {
        snprintf(sub, sizeof sub, "checkpoint-%ld/%s", tr->step, ema ? "samples-ema" : "samples");
        snprintf(name, cap, "checkpoint-%ld%s", tr->step, ema ? "-ema" : "");
    } else {
        snprintf(sub, sizeof sub, "%s/step-%ld", ema ? "samples-ema" : "samples", tr->step);
        snprintf(name, cap, "step-%ld%s", tr->step, ema ? "-ema" : "");
    }
    sd_train_pjoin(dir, tr->o.out_dir, sub);
}

/* A failed image counted by its reason: a non-finite latent is SD_ERANGE
 * from the sampler, a write failure SD_EIO. */
static void count_failure(sd_train_samples *s, sd_status st)
{
    s->failed++;
    if (st == SD_ERANGE) s->f_nonfinite++;
    else if (st == SD_EIO) s->f_write++;
    else s->f_other++;
}

/* One image to its PNG file and TensorBoard; errors name nothing yet. */
static sd_status render_one(sd_trainer *tr, const float *params, size_t i, const char *path, const char *name,
                            const char *tag, sd_error *err)
{
    sd_train_samples *s = tr->samples;
    const sd_sample_job *j = &s->jobs[i];
    int w, h;
    sd_sample_model_default_size(&s->m, &tr->unet, &w, &h);
    if (j->width) w = j->width;
    if (j->height) h = j->height;
    uint8_t *rgb = malloc((size_t)w * (size_t)h * 3);
    if (!rgb) return sd_err_set(err, SD_ENOMEM, "out of memory for a %dx%d image", w, h);
    sd_buf info, png;
    sd_buf_init(&info);
    sd_buf_init(&png);
    sd_status st = sd_sample_generate(&s->m, &tr->unet, params, j, &s->cond[i], w, h, NULL, NULL, rgb, err);
    if (!st) {
        sd_sample_infotext(j, w, h, name, &info);
        st = info.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : SD_OK;
    }
    if (!st) st = sd_png_encode(rgb, w, h, "parameters", sd_buf_cstr(&info), &png, err);
    if (!st) st = sd_write_file_atomic(path, png.data, png.len, err);
    if (!st && tr->tb.f) {
        sd_error e = {0};
        if (sd_tb_image(&tr->tb, tag, tr->step, h, w, 3, png.data, png.len, &e)) {
            sd_log(SD_LOG_WARN, "%s: no more TensorBoard events in this run", e.msg);
            sd_tb_close(&tr->tb);
        }
    }
    sd_buf_free(&info);
    sd_buf_free(&png);
    free(rgb);
    return st;
}

/* The weights to sample from on the trainer's backend: the training
 * weights, or the EMA's; a GPU run keeping its EMA in host memory
 * (--ema-on-cpu) lends it to the device for the time of the samples
 * (*tmp, released by the caller); bf16 weights are widened into the
 * gradient buffer (zero between steps; the caller gives it back with
 * sd_train_w16_dev_f32_done), or into *tmp on a device without one. */
static const float *weights(sd_trainer *tr, int ema, float **tmp, sd_error *err)
{
    *tmp = NULL;
    if (!ema && tr->w16) return sd_train_w16_dev_f32(tr, tmp, err);
    if (!ema) return tr->d_w;
    if (tr->d_ema || !tr->be->is_device) return tr->d_ema ? tr->d_ema : tr->ema;
    size_t bytes = tr->unet.w.total * sizeof(float);
    *tmp = tr->be->alloc(tr->exec, bytes);
    if (!*tmp) {
        sd_err_set(err, SD_ENOMEM, "out of device memory for the EMA weights (%zu MiB)", bytes >> 20);
        return NULL;
    }
    tr->be->h2d(tr->exec, *tmp, tr->ema, bytes);
    return *tmp;
}

/* Every prompt with one set of weights into one folder. */
static void render_set(sd_trainer *tr, int ema, int only_missing)
{
    sd_train_samples *s = tr->samples;
    char dir[PATH_CAP], name[64], path[PATH_CAP], file[32], tag[48];
    sample_dir(tr, ema, dir, name, sizeof name);
    sd_error e = {0};
    float *tmp = NULL;
    const float *params = NULL;
    size_t done = 0, bad = 0;
    if (sd_make_dirs(dir, &e) || !(params = weights(tr, ema, &tmp, &e))) {
        sd_log(SD_LOG_WARN, "samples at step %ld: %s: none written", tr->step, e.msg);
        s->failed += s->n;
        s->f_other += s->n;
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        const sd_sample_job *j = &s->jobs[i];
        if (tr->stop_req && *tr->stop_req) { /* a stop asked for during the samples: the checkpoint is what counts */
            sd_log(SD_LOG_WARN, "step %ld: stop requested: the step's remaining samples are skipped", tr->step);
            break;
        }
        snprintf(file, sizeof file, "%05ld.png", j->line - 1);
        sd_train_pjoin(path, dir, file);
        if (only_missing && access(path, F_OK) == 0) continue;
        snprintf(tag, sizeof tag, "%s/%05ld", ema ? "samples_ema" : "samples", j->line - 1);
        sd_status st = SD_OK;
        if (!s->cond[i].ctx) {
            s->failed++;
            s->f_text++;
            bad++;
            continue;
        }
        st = render_one(tr, params, i, path, name, tag, &e);
        if (st) {
            sd_log(SD_LOG_WARN, "%s (%s line %ld): %s: sample not written; training goes on", path,
                   tr->o.sample_prompts, j->line, e.msg);
            count_failure(s, st);
            bad++;
        } else {
            s->written++;
            done++;
        }
    }
    if (tmp) tr->be->release(tr->exec, tmp);
    if (!ema && tr->w16) sd_train_w16_dev_f32_done(tr, params);
    if (!tr->o.quiet && (done || bad))
        sd_log(SD_LOG_INFO, "step %ld: %zu sample(s)%s in %s%s", tr->step, done, ema ? " of the EMA weights" : "", dir,
               bad ? " (some failed: see the warnings)" : "");
}

/* See train_int.h. */
void sd_train_samples_render(sd_trainer *tr, int only_missing)
{
    sd_train_samples *s = tr->samples;
    if (!s || !s->n || s->last_step == tr->step) return;
    s->last_step = tr->step;
    if (!s->usable) {
        s->failed += s->n * (tr->ema ? 2 : 1);
        s->f_model += s->n * (tr->ema ? 2 : 1);
        return;
    }
    double t0 = sd_now();
    render_set(tr, 0, only_missing);
    if (tr->ema && !(tr->stop_req && *tr->stop_req)) render_set(tr, 1, only_missing);
    sd_sample_model_release_work(&s->m); /* the UNet's and decoder's workspace back between sample steps */
    sd_log(SD_LOG_DEBUG, "step %ld: samples took %.1f s", tr->step, sd_now() - t0);
}

/* See train_int.h. */
void sd_train_samples_summary(const sd_trainer *tr)
{
    const sd_train_samples *s = tr->samples;
    if (!s) return;
    size_t skipped = sd_sample_skips_total(&s->skips);
    if (!s->failed && !skipped && tr->o.quiet) return;
    sd_log(s->failed || skipped ? SD_LOG_WARN : SD_LOG_INFO,
           "samples: %zu written, %zu failed (model unusable %zu, prompt not encoded %zu, non-finite latents %zu, "
           "write failed %zu, other %zu); %zu prompt line(s) skipped (bad JSON %zu, unknown sampler %zu, size not a "
           "multiple of 8 %zu, other fields %zu)", s->written, s->failed, s->f_model, s->f_text, s->f_nonfinite,
           s->f_write, s->f_other, skipped, s->skips.bad_json, s->skips.bad_sampler, s->skips.bad_size,
           s->skips.bad_field);
}

/* See train_int.h. */
void sd_train_samples_close(sd_trainer *tr)
{
    sd_train_samples *s = tr->samples;
    if (!s) return;
    for (size_t i = 0; i < s->n && s->cond; i++) sd_sample_cond_free(&s->cond[i]);
    free(s->cond);
    sd_sample_jobs_free(s->jobs, s->n);
    sd_sample_model_close(&s->m);
    free(s);
    tr->samples = NULL;
}
