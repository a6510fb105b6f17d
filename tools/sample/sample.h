/* sd-sample's engine: the run over every prompt (sample_run.c) and the
 * contact sheet (sample_sheet.c). The prompts, the model, one image and
 * A1111's infotext are libcore/models' txt2img.h, shared with sd-train's
 * samples; the PNG writer is libcore/image's png_write.h. */
#ifndef SDTK_SAMPLE_H
#define SDTK_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "txt2img.h"

typedef struct {
    sd_sample_source src;
    const char *prompts, *output, *device;
    int cuda_device; /* -1: the CPU */
    int threads, strict, quiet, contact;
    int overwrite, skip_existing; /* what to do with outputs already there (neither: refuse) */
    sd_sample_job defaults; /* the flags' values; prompt/negative not owned here */
} sample_opts;

/* The whole run; returns the tool's exit code (0 ok, 1 images failed or
 * lines skipped with --strict, 3 fatal). */
int sample_run(const sample_opts *o);

/* n images (rgb[i] of w[i] x h[i]; NULL for a failed one: grey) in a grid
 * of ceil(sqrt(n)) columns, each cell the largest size, into *sheet (RGB,
 * *sw x *sh, malloc'ed). */
sd_status sample_contact_sheet(int n, uint8_t *const *rgb, const int *w, const int *h, uint8_t **sheet, int *sw,
                               int *sh, sd_error *err);

/* ---- outputs already there (sample_outputs.c) ---- */

/* DIR/NNNNN.png of job j (the i-th), NNNNN its line's 0-based number. */
void sample_path(const sample_opts *o, const sd_sample_job *j, size_t i, char *path, size_t cap);
/* Which jobs' images exist (kept[i] 1: --skip-existing keeps it, *nkept
 * of them); -1 with the error logged when an image or the contact sheet
 * is there and neither --overwrite nor --skip-existing was given. */
int sample_check_outputs(const sample_opts *o, const sd_sample_job *jobs, size_t n, uint8_t *kept, size_t *nkept);
/* A kept image read back (8-bit RGB, malloc'ed) for the contact sheet. */
sd_status sample_read_kept(const char *path, uint8_t **rgb, int *w, int *h, sd_error *err);

#endif
