/* One band of an image (its alpha channel, or a mask image's first band)
 * through a record's plan, for loss masks: decoded whole by libvips, turned
 * upright, resized with the resizers the picture's direct decoders use and
 * cut to the crop box. */
#include <stdlib.h>
#include <string.h>

#include <vips/vips.h>

#include "image.h"
#include "image_int.h"

/* Replace *im by out when rc says the operation worked (0), as image.c's
 * chains do; returns rc. */
static int band_step(VipsImage **im, VipsImage *out, int rc)
{
    if (rc) return rc;
    g_object_unref(*im);
    *im = out;
    return 0;
}

/* The band as w x h uchar bytes (+16 readable bytes after, for the area
 * resizer): malloc'ed, NULL on failure (libvips' error set) or, with
 * *found 0, when there is no alpha. */
static unsigned char *band_pixels(const unsigned char *buf, size_t len, int which, int *found, int *w, int *h)
{
    VipsImage *im = vips_image_new_from_buffer(buf, len, "fail_on=truncated", NULL), *t = NULL;
    *found = 0;
    if (!im) return NULL;
    if (band_step(&im, t, vips_autorot(im, &t, NULL))) {
        g_object_unref(im);
        return NULL;
    }
    if (which == SD_BAND_ALPHA && !vips_image_hasalpha(im)) {
        g_object_unref(im);
        *found = 1; /* decoded fine; no alpha */
        return NULL;
    }
    int band = which == SD_BAND_ALPHA ? im->Bands - 1 : 0;
    int bad = band_step(&im, t, vips_extract_band(im, &t, band, NULL));
    if (!bad && im->BandFmt != VIPS_FORMAT_UCHAR)
        bad = band_step(&im, t, vips_cast(im, &t, VIPS_FORMAT_UCHAR, "shift", im->BandFmt == VIPS_FORMAT_USHORT, NULL));
    unsigned char *px = NULL;
    if (!bad) {
        size_t n = 0;
        void *mem = vips_image_write_to_memory(im, &n);
        *w = im->Xsize;
        *h = im->Ysize;
        if (mem && n == (size_t)*w * (size_t)*h && (px = malloc(n + 16))) {
            memcpy(px, mem, n);
            memset(px + n, 0, 16);
        }
        g_free(mem);
    }
    g_object_unref(im);
    if (px) *found = 2;
    return px;
}

/* The band resized and cut as the plan says into out (cw * ch bytes). */
static int band_resize(const unsigned char *px, int w, int h, const sd_image_plan *plan, unsigned char *out)
{
    sd_image_plan p = *plan;
    p.flip = 0;
    int cw = sd_image_out_w(&p), ch = sd_image_out_h(&p);
    unsigned char *rgb = malloc((size_t)cw * (size_t)ch * 3);
    if (!rgb) return -1;
    int rc = 0;
    if (p.resize_w <= w && p.resize_h <= h) {
        sd_area *a = sd_area_new(w, h, 1, &p, rgb);
        if (!a) rc = -1;
        for (int y = 0; a && y < h; y++)
            if (sd_area_push(a, px + (size_t)y * (size_t)w)) break;
        sd_area_free(a);
    } else {
        unsigned char *src = malloc((size_t)w * (size_t)h * 3);
        if (!src) rc = -1;
        for (size_t i = 0; src && i < (size_t)w * (size_t)h; i++) src[3 * i] = src[3 * i + 1] = src[3 * i + 2] = px[i];
        if (src) rc = sd_lanczos_rgb8(src, w, h, (size_t)w * 3, &p, rgb);
        free(src);
    }
    for (size_t i = 0; !rc && i < (size_t)cw * (size_t)ch; i++) out[i] = rgb[3 * i];
    free(rgb);
    return rc;
}

/* image.h: decode, pick the band, resize and cut. */
sd_status sd_image_load_band(const sd_image_src *src, const sd_image_plan *plan, int which, unsigned char *out,
                             int *found, int *w, int *h, sd_error *err)
{
    char name[200];
    if (src->member) snprintf(name, sizeof name, "%s[%s]", src->path, src->member);
    else snprintf(name, sizeof name, "%s", src->path);
    *found = 0;
    sd_error perr = {0};
    sd_status st = sd_image_plan_check(plan, &perr);
    if (st) return sd_err_set(err, st, "%s: %s", name, perr.msg);
    unsigned char *buf = NULL;
    size_t len = 0;
    st = sd_image_read_checked(src, plan, name, &buf, &len, err);
    if (st) return st;
    int iw = 0, ih = 0, how = 0;
    unsigned char *px = band_pixels(buf, len, which, &how, &iw, &ih);
    sd_scratch_trim();
    if (!px && how == 0) return sd_image_vips_fail(err, SD_EFORMAT, name, "decode failed");
    if (w) *w = iw;
    if (h) *h = ih;
    if (!px) return SD_OK; /* no alpha */
    if (band_resize(px, iw, ih, plan, out)) st = sd_err_set(err, SD_ENOMEM, "%s: no memory to resize its mask", name);
    free(px);
    *found = !st;
    return st;
}
