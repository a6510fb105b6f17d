/* sd-sample's outputs already on disk: found before any work (an earlier
 * run's images are never replaced unless --overwrite; --skip-existing
 * keeps them and renders the rest, so a killed run goes on), and a kept
 * image read back for the contact sheet. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "image.h"
#include "imghdr.h"
#include "log.h"
#include "sample.h"

/* See sample.h. */
void sample_path(const sample_opts *o, const sd_sample_job *j, size_t i, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%05ld.png", o->output, j->line ? j->line - 1 : (long)i);
}

/* Whether something (a file, a link, a folder) is at path. */
static int taken(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* See sample.h. */
int sample_check_outputs(const sample_opts *o, const sd_sample_job *jobs, size_t n, uint8_t *kept, size_t *nkept)
{
    char path[4200], first[4200] = "";
    size_t found = 0;
    *nkept = 0;
    for (size_t i = 0; i < n; i++) {
        sample_path(o, &jobs[i], i, path, sizeof path);
        kept[i] = taken(path) != 0;
        if (!kept[i]) continue;
        if (!found++) snprintf(first, sizeof first, "%s", path);
    }
    snprintf(path, sizeof path, "%s/contact.png", o->output);
    int sheet = o->contact && taken(path); /* rewritten by every run: one with --skip-existing includes the kept */
    if ((found || sheet) && !o->overwrite && !o->skip_existing) {
        char what[160];
        if (found)
            snprintf(what, sizeof what, "%zu of this run's %zu image(s) are there%s", found, n,
                     sheet ? ", and a contact sheet" : "");
        else
            snprintf(what, sizeof what, "an earlier run's contact sheet");
        sd_log(SD_LOG_ERROR, "%s exists (%s): not replaced; --overwrite replaces them, --skip-existing keeps the "
               "images there and renders the missing ones (a killed run goes on)", found ? first : path, what);
        return -1;
    }
    if (o->overwrite) {
        for (size_t i = 0; i < n; i++) kept[i] = 0;
        if (found) sd_log(SD_LOG_INFO, "--overwrite: %zu image(s) already in %s are replaced", found, o->output);
        return 0;
    }
    *nkept = found;
    if (found)
        sd_log(SD_LOG_INFO, "--skip-existing: %zu of %zu image(s) already in %s are kept (not rendered again, "
               "whatever settings made them)", found, n, o->output);
    return 0;
}

/* See sample.h. */
sd_status sample_read_kept(const char *path, uint8_t **rgb, int *w, int *h, sd_error *err)
{
    sd_imginfo info;
    sd_status st = sd_imghdr_read_file(path, &info, err);
    if (st) return st;
    sd_image_src src = {.path = path, .size = SD_IMAGE_WHOLE_FILE};
    sd_image_plan plan = {.resize_w = (int)info.disp_w, .resize_h = (int)info.disp_h, .crop_r = (int)info.disp_w,
                          .crop_b = (int)info.disp_h};
    *rgb = malloc((size_t)info.disp_w * info.disp_h * 3);
    if (!*rgb) return sd_err_set(err, SD_ENOMEM, "out of memory for %s", path);
    st = sd_image_load_rgb8(&src, &plan, *rgb, err);
    if (st) {
        free(*rgb);
        *rgb = NULL;
        return st;
    }
    *w = (int)info.disp_w;
    *h = (int)info.disp_h;
    return SD_OK;
}
