/* Aspect-ratio bucketing: the bucket plans (kohya-compatible, the SDXL list,
 * a user list, multi-resolution), choosing a bucket for an image, and the
 * resize/crop that maps the image onto it. */
#ifndef SDTK_BUCKET_H
#define SDTK_BUCKET_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "err.h"

typedef enum {
    SD_PLAN_KOHYA,    /* sd-scripts make_bucket_resolutions + BucketManager */
    SD_PLAN_SDXL,     /* the 41 SDXL training resolutions */
    SD_PLAN_LIST,     /* --buckets WxH,... */
    SD_PLAN_MULTIRES  /* own aspect, area clamped into [min_res^2, max_res^2] */
} sd_plan_kind;

typedef struct {
    int w, h;
} sd_reso;

typedef struct {
    sd_plan_kind kind;
    int max_w, max_h;       /* kohya: --resolution (max_reso) */
    int min_size, max_size; /* kohya: min/max bucket side (after step adjustment) */
    int steps;              /* kohya, multires: bucket sides are multiples of this */
    int no_upscale;         /* kohya: bucket_no_upscale; list/sdxl: skip instead of upscaling */
    int min_res, max_res;   /* multires: area range as square sides */
    int upscale;            /* multires: upscale images below min_res^2 instead of skipping */
    sd_reso *resos;         /* predefined buckets, sorted by (w, h) */
    double *ars;            /* w/h of each predefined bucket */
    size_t n;
} sd_plan;

/* Why select can refuse an image (these are skip reasons, not errors). */
typedef enum {
    SD_FIT_OK = 0,
    SD_FIT_TOO_SMALL,   /* a side would be 0 after flooring to steps */
    SD_FIT_BELOW_MIN,   /* multires without --upscale: area below min_res^2 */
    SD_FIT_NEEDS_UPSCALE, /* list/sdxl with no_upscale */
    SD_FIT_EXTREME_AR,  /* kohya no_upscale arithmetic breaks down (Python would divide by 0) */
    SD_FIT_RESIZE_TOO_LARGE /* a resize side over SD_BUCKET_MAX_RESIZE: the image pipeline refuses it */
} sd_fit_status;

/* The largest resize side a record may ask for: the image pipeline's limit
 * (SD_IMGHDR_MAX_SIDE, sd_image_plan_check), so sd-bucket never writes a
 * record sd-latents must refuse. */
enum { SD_BUCKET_MAX_RESIZE = 65535 };

typedef struct {
    int bw, bh;          /* bucket */
    int rw, rh;          /* size the image is resized to before cropping */
    int crop[4];         /* l, t, r, b of the crop actually taken from the resized image */
    double ltrb[4];      /* kohya get_crop_ltrb (letterbox offsets, Python values) */
    unsigned ltrb_float; /* bit i set: ltrb[i] is a Python float (else an int) */
    double ar_error;     /* bucket w/h - image w/h (signed, as kohya) */
} sd_fit;

sd_status sd_plan_kohya(sd_plan *p, int max_w, int max_h, int min_size, int max_size, int steps, int no_upscale,
                        sd_error *err);
sd_status sd_plan_sdxl(sd_plan *p, int no_upscale, sd_error *err);
sd_status sd_plan_list(sd_plan *p, const char *spec, int no_upscale, sd_error *err);
sd_status sd_plan_multires(sd_plan *p, int min_res, int max_res, int steps, int upscale, sd_error *err);
void sd_plan_free(sd_plan *p);
const char *sd_plan_name(const sd_plan *p);

sd_fit_status sd_bucket_select(const sd_plan *p, int w, int h, sd_fit *out);
const char *sd_fit_reason(sd_fit_status s);
void sd_kohya_crop_ltrb(int bw, int bh, int w, int h, double ltrb[4], unsigned *float_mask);
double sd_py_floordiv(double a, double b);
void sd_buf_py_float(sd_buf *b, double v);
int sd_parse_reso(const char *s, const char **end, sd_reso *out);

#endif
