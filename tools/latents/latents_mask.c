/* sd-latents --masks: each record's loss mask, from the image's alpha
 * channel (kohya's alpha_mask) or from a mask image NAME_mask.png beside
 * the image, through the record's plan as the picture goes (resize, crop),
 * as alpha / 255 (sd-scripts: alpha.astype(float32) / 255), reduced to the
 * latent size as sd-scripts' apply_masked_loss reduces it (the mean of each
 * 8 x 8 block: sd_shard_mask_reduce). Stored at the latent size: 1/64 of
 * kohya's alpha_mask bytes, and what the trainer would compute from it. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "buf.h"
#include "image.h"
#include "latents.h"
#include "shard.h"
#include "strmap.h"

/* The mask image of an image file: its path with the extension replaced by
 * "_mask.png" (photos/cat.jpg -> photos/cat_mask.png) into out. */
static void mask_path(const char *image, sd_buf *out)
{
    const char *slash = strrchr(image, '/'), *dot = strrchr(image, '.');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - image) : strlen(image);
    sd_buf_clear(out);
    sd_buf_put(out, image, stem);
    sd_buf_puts(out, "_mask.png");
}

/* latents.h: job j's mask into j->mask (NULL: none), or a skip reason with
 * the details in e. */
const char *latents_mask_load(const latents_opts *o, latent_job *j, int lh, int lw, sd_error *e)
{
    free(j->mask);
    j->mask = NULL;
    if (!o->masks) return NULL;
    const sd_image_plan *p = &j->plan;
    int cw = sd_image_out_w(p), ch = sd_image_out_h(p);
    if (cw != 8 * lw || ch != 8 * lh) {
        sd_err_set(e, SD_EINVAL, "%s: image %dx%d is not 8 times the latent %dx%d", j->name, cw, ch, lw, lh);
        return "mask size not 8 times the latent's";
    }
    sd_image_src src = {.path = j->image, .member = j->member, .offset = j->offset, .size = j->size};
    sd_buf path;
    sd_buf_init(&path);
    if (o->masks == LATENTS_MASK_FILES) {
        if (j->member) return NULL; /* tar members: no mask files */
        mask_path(j->image, &path);
        struct stat sb;
        if (stat(sd_buf_cstr(&path), &sb) != 0 && errno == ENOENT) {
            sd_buf_free(&path);
            return NULL; /* no mask: weight 1 everywhere */
        }
        src = (sd_image_src){.path = sd_buf_cstr(&path), .member = NULL, .offset = 0, .size = SD_IMAGE_WHOLE_FILE};
    }
    unsigned char *px = malloc((size_t)cw * (size_t)ch);
    float *f = malloc((size_t)cw * (size_t)ch * sizeof(float));
    const char *why = NULL;
    int found = 0, w = 0, h = 0;
    if (!px || !f) {
        sd_err_set(e, SD_ENOMEM, "%s: out of memory for its mask", j->name);
        why = "out of memory for a mask";
    } else if (sd_image_load_band(&src, p, o->masks == LATENTS_MASK_FILES ? SD_BAND_FIRST : SD_BAND_ALPHA, px, &found,
                                  &w, &h, e))
        why = o->masks == LATENTS_MASK_FILES ? "unreadable mask" : "unreadable alpha channel";
    else if (found && o->masks == LATENTS_MASK_FILES && (w != j->orig_w || h != j->orig_h)) {
        sd_err_set(e, SD_EINVAL, "%s is %dx%d, its image %dx%d", sd_buf_cstr(&path), w, h, j->orig_w, j->orig_h);
        why = "mask size differs from the image's";
    } else if (found) {
        for (size_t i = 0; i < (size_t)cw * (size_t)ch; i++) f[i] = (float)px[i] / 255.0f;
        j->mask = malloc((size_t)lh * (size_t)lw * sizeof(float));
        if (!j->mask) {
            sd_err_set(e, SD_ENOMEM, "%s: out of memory for its mask", j->name);
            why = "out of memory for a mask";
        } else sd_shard_mask_reduce(f, ch, cw, 8, 0, j->mask);
    }
    free(px);
    free(f);
    sd_buf_free(&path);
    return why;
}

/* Whether name (nlen bytes) ends in "_mask.png". */
static int is_mask_name(const char *name, size_t nlen)
{
    return nlen > 9 && memcmp(name + nlen - 9, "_mask.png", 9) == 0;
}

/* latents.h: with --masks files, every NAME_mask.png in a folder of the
 * input's images whose image is not among the jobs is reported and counted
 * ("mask without an image"): a misnamed mask would silently train unmasked. */
void latents_mask_orphans(const latents_opts *o, const job_list *l, sd_tally *tally)
{
    if (o->masks != LATENTS_MASK_FILES) return;
    sd_strmap want, dirs;
    sd_strmap_init(&want);
    sd_strmap_init(&dirs);
    sd_buf p;
    sd_buf_init(&p);
    for (size_t i = 0; i < l->n; i++)
        if (!l->v[i].member) {
            mask_path(l->v[i].image, &p);
            sd_strmap_put(&want, p.data, p.len);
        }
    for (size_t i = 0; i < l->n; i++) {
        const char *img = l->v[i].image, *slash = strrchr(img, '/');
        size_t dl = slash ? (size_t)(slash - img) + 1 : 0;
        if (l->v[i].member || sd_strmap_get(&dirs, img, dl)) continue; /* a tar member, or a folder done */
        sd_strmap_put(&dirs, img, dl);
        sd_buf_clear(&p);
        sd_buf_put(&p, img, dl);
        DIR *d = opendir(dl ? sd_buf_cstr(&p) : ".");
        if (!d) continue;
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t nl = strlen(de->d_name);
            if (!is_mask_name(de->d_name, nl)) continue;
            p.len = dl;
            sd_buf_puts(&p, de->d_name);
            if (!sd_strmap_get(&want, p.data, p.len))
                sd_skip(tally, "mask without an image", "%s (no record's image is %.*s.*)", sd_buf_cstr(&p),
                        (int)(nl - 9), de->d_name);
        }
        closedir(d);
    }
    sd_buf_free(&p);
    sd_strmap_free(&want);
    sd_strmap_free(&dirs);
}
