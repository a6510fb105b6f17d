/* Prompt jobs (sd-sample's --prompts, sd-train's --sample-prompts): one
 * JSON object per line, each field over the defaults; a bad line is named
 * by its number and reason, counted and left out, and the run goes on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "json.h"
#include "log.h"
#include "txt2img.h"
#include "slurp.h"

/* Sizes must divide into latents (a multiple of 8) and stay sane. */
int sd_sample_size_ok(long v)
{
    return v >= 8 && v <= 8192 && v % 8 == 0;
}

/* A string field into *dst (a copy in the job), or the reason. */
static const char *take_str(const sd_json *root, const char *key, char **dst, char *why, size_t cap)
{
    const sd_json *v = sd_json_get(root, key);
    if (!v) return NULL;
    const char *s = sd_json_str(v);
    if (!s) {
        snprintf(why, cap, "\"%s\" is not a string", key);
        return "field of the wrong type";
    }
    char *c = strdup(s);
    if (!c) {
        snprintf(why, cap, "out of memory");
        return "out of memory";
    }
    free(*dst);
    *dst = c;
    return NULL;
}

/* A whole-number field in [lo, hi] into *dst, or the reason. */
static const char *take_whole(const sd_json *root, const char *key, double lo, double hi, double *dst, char *why,
                              size_t cap)
{
    const sd_json *v = sd_json_get(root, key);
    if (!v) return NULL;
    if (sd_json_whole(v, lo, hi, dst)) {
        snprintf(why, cap, "\"%s\" must be a whole number from %.0f to %.0f", key, lo, hi);
        return "field out of range or of the wrong type";
    }
    return NULL;
}

/* A key the line format does not know ("promt") would be dropped without a
 * word and its image rendered from the defaults: the reason, else NULL. */
static const char *unknown_key(const sd_json *root, char *why, size_t cap)
{
    static const char *const known[] = {"prompt", "negative", "seed", "steps", "cfg", "sampler", "width", "height"};
    for (const sd_json *c = root->child; c; c = c->next) {
        size_t i = 0;
        while (i < sizeof known / sizeof *known && strcmp(c->key, known[i])) i++;
        if (i == sizeof known / sizeof *known) {
            snprintf(why, cap, "\"%.60s\" is not one of prompt, negative, seed, steps, cfg, sampler, width, height",
                     c->key);
            return "unknown field";
        }
    }
    return NULL;
}

/* The line's fields over def; a reason when one is unknown or missing its
 * type or range (the job's strings are then freed by the caller). */
static const char *fields(const sd_json *root, sd_sample_job *j, char *why, size_t cap)
{
    const char *r;
    double d;
    if ((r = unknown_key(root, why, cap))) return r;
    if ((r = take_str(root, "prompt", &j->prompt, why, cap)) || (r = take_str(root, "negative", &j->negative, why, cap)))
        return r;
    if ((r = take_whole(root, "seed", 0, SD_SAMPLE_SEED_MAX, &d, why, cap))) return r;
    if (sd_json_get(root, "seed")) j->seed = (uint64_t)d;
    if ((r = take_whole(root, "steps", 1, 1000, &d, why, cap))) return r;
    if (sd_json_get(root, "steps")) j->steps = (int)d;
    const sd_json *v = sd_json_get(root, "cfg");
    if (v && (sd_json_num(v, &j->cfg) || j->cfg < 0 || j->cfg > 100)) {
        snprintf(why, cap, "\"cfg\" must be a number from 0 to 100");
        return "field out of range or of the wrong type";
    }
    v = sd_json_get(root, "sampler");
    if (v) {
        sd_error e = {0};
        const char *s = sd_json_str(v);
        if (!s || sd_sampler_parse(s, &j->sampler, &e)) {
            snprintf(why, cap, "%s", s ? e.msg : "\"sampler\" is not a string");
            return "unknown sampler";
        }
    }
    const char *dims[2] = {"width", "height"};
    int *dst[2] = {&j->width, &j->height};
    for (int i = 0; i < 2; i++) {
        v = sd_json_get(root, dims[i]);
        if (!v) continue;
        if (sd_json_whole(v, 8, 8192, &d) || !sd_sample_size_ok((long)d)) {
            snprintf(why, cap, "\"%s\" must be a multiple of 8 from 8 to 8192", dims[i]);
            return "size not a multiple of 8";
        }
        *dst[i] = (int)d;
    }
    return NULL;
}

/* One line over def; NULL on success, else the reason (and details in why). */
const char *sd_sample_parse_line(char *text, size_t len, const sd_sample_job *def, sd_sample_job *out, char *why, size_t cap)
{
    sd_arena a;
    sd_arena_init(&a, 4096);
    sd_json *root = NULL;
    sd_error e = {0};
    const char *r = NULL;
    *out = *def;
    out->prompt = strdup(def->prompt ? def->prompt : "");
    out->negative = strdup(def->negative ? def->negative : "");
    why[0] = 0;
    if (!out->prompt || !out->negative) {
        snprintf(why, cap, "out of memory");
        r = "out of memory";
    } else if (sd_json_parse(&a, text, len, &root, &e)) {
        snprintf(why, cap, "%s", e.msg);
        r = "bad JSON";
    } else if (root->type != SD_JSON_OBJECT) {
        snprintf(why, cap, "a line must be a JSON object");
        r = "bad JSON";
    } else {
        r = fields(root, out, why, cap);
        if (!r && !sd_json_get(root, "prompt") && !out->prompt[0])
            snprintf(why, cap, "no \"prompt\": rendered with the empty prompt (unconditional)");
    }
    sd_arena_free(&a);
    if (r) {
        free(out->prompt);
        free(out->negative);
        out->prompt = out->negative = NULL;
    }
    return r;
}

/* Count a refused line by its reason. */
static void count_skip(sd_sample_skips *s, const char *reason)
{
    if (!strcmp(reason, "bad JSON")) s->bad_json++;
    else if (!strcmp(reason, "unknown sampler")) s->bad_sampler++;
    else if (!strcmp(reason, "size not a multiple of 8")) s->bad_size++;
    else s->bad_field++;
}

/* Read every line of path into jobs (see txt2img.h). */
sd_status sd_sample_read_prompts(const char *path, const char *what, const sd_sample_job *def, sd_sample_job **jobs,
                                 size_t *n, sd_sample_skips *skips, sd_error *err)
{
    sd_buf text;
    sd_buf_init(&text);
    *jobs = NULL;
    *n = 0;
    sd_error e = {0};
    sd_status st = sd_read_file(path, &text, &e);
    if (st) {
        sd_buf_free(&text);
        return sd_err_set(err, st, "%s: %s", what, e.msg);
    }
    size_t cap = 0;
    long line = 0;
    char *p = text.data, *end = text.data + text.len;
    while (p && p < end && !st) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *stop = nl ? nl : end;
        size_t len = (size_t)(stop - p);
        line++;
        if (len && p[len - 1] == '\r') len--;
        size_t lead = 0;
        while (lead < len && (p[lead] == ' ' || p[lead] == '\t')) lead++;
        if (lead < len) {
            if (*n == cap) {
                size_t nc = cap ? 2 * cap : 16;
                sd_sample_job *g = realloc(*jobs, nc * sizeof(**jobs));
                if (!g) {
                    st = sd_err_set(err, SD_ENOMEM, "out of memory");
                    break;
                }
                *jobs = g;
                cap = nc;
            }
            char why[256];
            const char *r = sd_sample_parse_line(p, len, def, &(*jobs)[*n], why, sizeof why);
            if (r) {
                sd_log(SD_LOG_WARN, "%s:%ld: %s (%s): line skipped", path, line, r, why);
                count_skip(skips, r);
            } else {
                if (why[0]) sd_log(SD_LOG_WARN, "%s:%ld: %s", path, line, why);
                (*jobs)[*n].line = line;
                (*n)++;
            }
        }
        p = nl ? nl + 1 : NULL;
    }
    sd_buf_free(&text);
    if (st) {
        sd_sample_jobs_free(*jobs, *n);
        *jobs = NULL;
        *n = 0;
    }
    return st;
}

/* The lines refused, all reasons together. */
size_t sd_sample_skips_total(const sd_sample_skips *s)
{
    return s->bad_json + s->bad_field + s->bad_size + s->bad_sampler;
}

/* sd-sample's flag defaults (see txt2img.h). */
void sd_sample_job_default(sd_sample_job *j)
{
    memset(j, 0, sizeof *j);
    j->steps = 20;
    j->cfg = 7.0;
    j->sampler = SD_SAMPLER_DPMPP_2M;
}

/* Free jobs and their strings. */
void sd_sample_jobs_free(sd_sample_job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(jobs[i].prompt);
        free(jobs[i].negative);
    }
    free(jobs);
}
