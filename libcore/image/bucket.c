#include "bucket.h"

#include "dtoa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The SDXL training resolutions (SDXL paper, appendix; the list Stability,
 * kohya users and SimpleTuner share): 1024x1024 plus 20 landscape sizes and
 * their portrait transposes. Stored landscape only; the plan adds the rest. */
static const sd_reso sdxl_landscape[] = {
    {1024, 1024}, {2048, 512}, {1984, 512}, {1920, 512}, {1856, 512}, {1792, 576}, {1728, 576},
    {1664, 576},  {1600, 640}, {1536, 640}, {1472, 704}, {1408, 704}, {1344, 704}, {1344, 768},
    {1280, 768},  {1216, 832}, {1152, 832}, {1152, 896}, {1088, 896}, {1088, 960}, {1024, 960},
};

/* Python's float // float (CPython float_floor_div), so values computed the
 * way kohya computes them come out bit-identical, signed zeros included. */
double sd_py_floordiv(double vx, double wx)
{
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod != 0.0) {
        if ((wx < 0) != (mod < 0)) div -= 1.0;
    }
    if (div != 0.0) {
        double fl = floor(div);
        if (div - fl > 0.5) fl += 1.0;
        return fl;
    }
    return copysign(0.0, vx / wx);
}

/* Append v as Python's repr(float) writes it (json.dumps of a float): the
 * shortest digits that round-trip, and ".0" on whole numbers. */
void sd_buf_py_float(sd_buf *b, double v)
{
    if (!isfinite(v)) {
        sd_buf_puts(b, isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity"));
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        if (v == 0.0 && signbit(v)) sd_buf_putc(b, '-');
        sd_buf_json_int(b, (int64_t)v);
        sd_buf_puts(b, ".0");
        return;
    }
    char tmp[64];
    int n = sd_dtoa_shortest(v, tmp, sizeof tmp);
    if (n > 0) sd_buf_put(b, tmp, (size_t)n);
}

/* Order of buckets in every plan: (w, h) lexicographic, as Python sorts tuples. */
static int reso_cmp(const void *a, const void *b)
{
    const sd_reso *x = a, *y = b;
    if (x->w != y->w) return x->w < y->w ? -1 : 1;
    if (x->h != y->h) return x->h < y->h ? -1 : 1;
    return 0;
}

/* Sort, de-duplicate and compute the aspect ratios of p->resos. */
static sd_status plan_finish(sd_plan *p, sd_error *err)
{
    if (p->n == 0) return SD_OK;
    qsort(p->resos, p->n, sizeof *p->resos, reso_cmp);
    size_t k = 1;
    for (size_t i = 1; i < p->n; i++)
        if (reso_cmp(&p->resos[i], &p->resos[k - 1]) != 0) p->resos[k++] = p->resos[i];
    p->n = k;
    p->ars = malloc(p->n * sizeof *p->ars);
    if (!p->ars) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < p->n; i++) p->ars[i] = (double)p->resos[i].w / (double)p->resos[i].h;
    return SD_OK;
}

/* Append one bucket to a plan being built (capacity grows by doubling). */
static sd_status plan_add(sd_plan *p, size_t *cap, int w, int h, sd_error *err)
{
    if (p->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        sd_reso *nr = realloc(p->resos, nc * sizeof *nr);
        if (!nr) return sd_err_set(err, SD_ENOMEM, "out of memory");
        p->resos = nr;
        *cap = nc;
    }
    p->resos[p->n].w = w;
    p->resos[p->n].h = h;
    p->n++;
    return SD_OK;
}

/* The kohya plan. min/max are adjusted to multiples of steps the way
 * adjust_min_max_bucket_reso_by_steps does (min floored, max ceiled), and
 * its assertions about the resolution become errors. With no_upscale kohya
 * makes no predefined buckets at all: they follow from each image. */
sd_status sd_plan_kohya(sd_plan *p, int max_w, int max_h, int min_size, int max_size, int steps, int no_upscale,
                        sd_error *err)
{
    memset(p, 0, sizeof *p);
    p->kind = SD_PLAN_KOHYA;
    if (steps <= 0 || steps > 4096) return sd_err_set(err, SD_EINVAL, "bucket steps must be 1..4096, got %d", steps);
    if (max_w <= 0 || max_h <= 0 || max_w > 65535 || max_h > 65535)
        return sd_err_set(err, SD_EINVAL, "resolution must be positive and at most 65535 per side");
    if (min_size <= 0 || max_size <= 0 || max_size > 65535)
        return sd_err_set(err, SD_EINVAL, "min/max bucket sizes must be positive and at most 65535");
    if (min_size % steps) min_size -= min_size % steps;
    if (max_size % steps) max_size += steps - max_size % steps;
    int lo = max_w < max_h ? max_w : max_h, hi = max_w > max_h ? max_w : max_h;
    if ((min_size == 0 && !no_upscale) || min_size > lo) /* kohya's no_upscale never uses the min: 0 passes its assert */
        return sd_err_set(err, SD_EINVAL, "min bucket size %d (a multiple of steps %d) must be positive and at most the smaller resolution side %d",
                          min_size, steps, lo);
    if (max_size < hi)
        return sd_err_set(err, SD_EINVAL, "max bucket size %d must be at least the larger resolution side %d", max_size, hi);
    if (min_size > max_size) return sd_err_set(err, SD_EINVAL, "min bucket size %d is over max %d", min_size, max_size);
    p->max_w = max_w;
    p->max_h = max_h;
    p->min_size = min_size;
    p->max_size = max_size;
    p->steps = steps;
    p->no_upscale = no_upscale;
    if (no_upscale) return SD_OK;

    /* make_bucket_resolutions: the square, then every width from min to
     * max in steps with the tallest height that keeps the area */
    int64_t area = (int64_t)max_w * max_h;
    size_t cap = 0;
    int sq = (int)sd_py_floordiv(sqrt((double)area), (double)steps) * steps;
    sd_status st = plan_add(p, &cap, sq, sq, err);
    for (int w = min_size; !st && w <= max_size; w += steps) {
        int64_t h = (area / w) / steps * steps;
        if (h > max_size) h = max_size;
        if (h >= min_size) {
            st = plan_add(p, &cap, w, (int)h, err);
            if (!st) st = plan_add(p, &cap, (int)h, w, err);
        }
    }
    if (!st) st = plan_finish(p, err);
    if (st) sd_plan_free(p);
    return st;
}

/* The SDXL resolution list (41 buckets around 1024^2). */
sd_status sd_plan_sdxl(sd_plan *p, int no_upscale, sd_error *err)
{
    memset(p, 0, sizeof *p);
    p->kind = SD_PLAN_SDXL;
    p->no_upscale = no_upscale;
    size_t cap = 0;
    sd_status st = SD_OK;
    for (size_t i = 0; !st && i < sizeof sdxl_landscape / sizeof sdxl_landscape[0]; i++) {
        st = plan_add(p, &cap, sdxl_landscape[i].w, sdxl_landscape[i].h, err);
        if (!st) st = plan_add(p, &cap, sdxl_landscape[i].h, sdxl_landscape[i].w, err);
    }
    if (!st) st = plan_finish(p, err);
    if (st) sd_plan_free(p);
    return st;
}

/* Parse "WxH" (each side 1..65535); *end is set past it. 0 on success. */
int sd_parse_reso(const char *s, const char **end, sd_reso *out)
{
    char *e;
    if (*s < '0' || *s > '9') return -1;
    long w = strtol(s, &e, 10);
    if ((*e != 'x' && *e != 'X') || e[1] < '0' || e[1] > '9') return -1;
    long h = strtol(e + 1, &e, 10);
    if (w < 1 || h < 1 || w > 65535 || h > 65535) return -1;
    out->w = (int)w;
    out->h = (int)h;
    *end = e;
    return 0;
}

/* A user-given list "512x768,768x512,...". */
sd_status sd_plan_list(sd_plan *p, const char *spec, int no_upscale, sd_error *err)
{
    memset(p, 0, sizeof *p);
    p->kind = SD_PLAN_LIST;
    p->no_upscale = no_upscale;
    size_t cap = 0;
    const char *s = spec ? spec : "";
    sd_status st = SD_OK;
    while (!st && *s) {
        sd_reso r;
        const char *e;
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        if (sd_parse_reso(s, &e, &r) != 0) {
            st = sd_err_set(err, SD_EINVAL, "bad bucket '%.32s' in list (want WxH,WxH,...)", s);
            break;
        }
        st = plan_add(p, &cap, r.w, r.h, err);
        s = e;
        if (*s && *s != ',' && *s != ' ') st = sd_err_set(err, SD_EINVAL, "bad bucket list near '%.32s'", s);
    }
    if (!st && p->n == 0) st = sd_err_set(err, SD_EINVAL, "empty bucket list");
    if (!st) st = plan_finish(p, err);
    if (st) sd_plan_free(p);
    return st;
}

/* Multi-resolution: no fixed list; see sd_bucket_select for the rule. */
sd_status sd_plan_multires(sd_plan *p, int min_res, int max_res, int steps, int upscale, sd_error *err)
{
    memset(p, 0, sizeof *p);
    p->kind = SD_PLAN_MULTIRES;
    if (steps <= 0 || steps > 4096) return sd_err_set(err, SD_EINVAL, "bucket steps must be 1..4096, got %d", steps);
    if (min_res < 1 || max_res > 65535 || min_res > max_res)
        return sd_err_set(err, SD_EINVAL, "need 1 <= min-res <= max-res <= 65535, got %d..%d", min_res, max_res);
    if (max_res < steps) return sd_err_set(err, SD_EINVAL, "max-res %d is below the step %d", max_res, steps);
    p->min_res = min_res;
    p->max_res = max_res;
    p->steps = steps;
    p->upscale = upscale;
    return SD_OK;
}

/* Release the bucket arrays. */
void sd_plan_free(sd_plan *p)
{
    free(p->resos);
    free(p->ars);
    p->resos = NULL;
    p->ars = NULL;
    p->n = 0;
}

/* The plan's name for reports. */
const char *sd_plan_name(const sd_plan *p)
{
    switch (p->kind) {
    case SD_PLAN_KOHYA: return "kohya";
    case SD_PLAN_SDXL: return "sdxl";
    case SD_PLAN_LIST: return "list";
    case SD_PLAN_MULTIRES: return "multires";
    }
    return "?";
}

/* The skip reason for a refused fit (string literals, for sd_skip). */
const char *sd_fit_reason(sd_fit_status s)
{
    switch (s) {
    case SD_FIT_OK: return "ok";
    case SD_FIT_TOO_SMALL: return "image smaller than the bucket step";
    case SD_FIT_BELOW_MIN: return "image area below --min-res";
    case SD_FIT_NEEDS_UPSCALE: return "image would need upscaling (--no-upscale)";
    case SD_FIT_EXTREME_AR: return "aspect ratio too extreme for bucketing";
    case SD_FIT_RESIZE_TOO_LARGE: return "aspect ratio too extreme: resize over 65535 pixels a side";
    }
    return "?";
}

/* kohya BucketManager.get_crop_ltrb: where the image would sit if fitted
 * inside the bucket (letterbox), with Python's int/float mix. It is not the
 * crop that is taken; kohya stores it for SDXL conditioning all the same. */
void sd_kohya_crop_ltrb(int bw, int bh, int w, int h, double ltrb[4], unsigned *float_mask)
{
    double bucket_ar = (double)bw / (double)bh;
    double image_ar = (double)w / (double)h;
    if (bucket_ar > image_ar) {
        double rw = (double)bh * image_ar; /* float */
        double l = sd_py_floordiv((double)bw - rw, 2.0);
        ltrb[0] = l;
        ltrb[1] = 0.0; /* (bh - bh) // 2: int */
        ltrb[2] = l + rw;
        ltrb[3] = (double)bh; /* 0 + bh: int */
        *float_mask = 1u | 4u;
    } else {
        double rh = (double)bw / image_ar; /* float */
        double t = sd_py_floordiv((double)bh - rh, 2.0);
        ltrb[0] = 0.0;
        ltrb[1] = t;
        ltrb[2] = (double)bw;
        ltrb[3] = t + rh;
        *float_mask = 2u | 8u;
    }
}

/* kohya's round_to_steps: round half up, then down to a multiple of steps. */
static int64_t round_to_steps(double x, int steps)
{
    int64_t v = (int64_t)(x + 0.5);
    return v - v % steps;
}

/* Predefined-bucket choice (kohya select_bucket without no_upscale): an exact
 * size match wins, else the first bucket with the smallest |ar difference|;
 * scale so the image covers the bucket, rounding int(x + 0.5). */
static void select_predefined(const sd_plan *p, int w, int h, sd_fit *f)
{
    double ar = (double)w / (double)h;
    size_t best = 0;
    int exact = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->resos[i].w == w && p->resos[i].h == h) {
            best = i;
            exact = 1;
            break;
        }
    if (!exact) {
        double be = fabs(p->ars[0] - ar);
        for (size_t i = 1; i < p->n; i++) {
            double e = fabs(p->ars[i] - ar);
            if (e < be) {
                be = e;
                best = i;
            }
        }
    }
    f->bw = p->resos[best].w;
    f->bh = p->resos[best].h;
    double ar_reso = (double)f->bw / (double)f->bh;
    double scale = ar > ar_reso ? (double)f->bh / (double)h : (double)f->bw / (double)w;
    f->rw = (int)((double)w * scale + 0.5);
    f->rh = (int)((double)h * scale + 0.5);
}

/* kohya bucket_no_upscale: shrink (never enlarge) to at most the plan's
 * area, choosing whichever rounded side keeps the aspect better, then the
 * bucket is the resized size floored to steps. */
static sd_fit_status select_no_upscale(const sd_plan *p, int w, int h, sd_fit *f)
{
    int64_t max_area = (int64_t)p->max_w * p->max_h;
    int steps = p->steps;
    double ar = (double)w / (double)h;
    int64_t rw = w, rh = h;
    if ((int64_t)w * h > max_area) {
        double rwf = sqrt((double)max_area * ar);
        double rhf = (double)max_area / rwf;
        int64_t bw_r = round_to_steps(rwf, steps);
        int64_t bh_in_wr = round_to_steps((double)bw_r / ar, steps);
        int64_t bh_r = round_to_steps(rhf, steps);
        int64_t bw_in_hr = round_to_steps((double)bh_r * ar, steps);
        if (bh_in_wr == 0 || bh_r == 0) return SD_FIT_EXTREME_AR; /* ZeroDivisionError in Python */
        double ar_wr = (double)bw_r / (double)bh_in_wr;
        double ar_hr = (double)bw_in_hr / (double)bh_r;
        if (fabs(ar_wr - ar) < fabs(ar_hr - ar)) {
            rw = bw_r;
            rh = (int64_t)((double)bw_r / ar + 0.5);
        } else {
            rw = (int64_t)((double)bh_r * ar + 0.5);
            rh = bh_r;
        }
    }
    f->rw = (int)rw;
    f->rh = (int)rh;
    f->bw = (int)(rw - rw % steps);
    f->bh = (int)(rh - rh % steps);
    return f->bw > 0 && f->bh > 0 ? SD_FIT_OK : SD_FIT_TOO_SMALL;
}

/* Multi-resolution rule: the image keeps its aspect; its area is clamped into
 * [min_res^2, max_res^2] (scale = sqrt(target/area), sides rounded half up;
 * images already inside the range are not resized); the bucket is the
 * resized size floored to steps, so the centre crop is under steps px per
 * axis. Below min_res^2 the image is skipped unless upscaling is allowed. */
static sd_fit_status select_multires(const sd_plan *p, int w, int h, sd_fit *f)
{
    int64_t area = (int64_t)w * h;
    int64_t lo = (int64_t)p->min_res * p->min_res, hi = (int64_t)p->max_res * p->max_res;
    if (area < lo && !p->upscale) return SD_FIT_BELOW_MIN;
    int64_t target = area < lo ? lo : area > hi ? hi : area;
    int64_t rw = w, rh = h;
    if (target != area) {
        double scale = sqrt((double)target / (double)area);
        rw = (int64_t)((double)w * scale + 0.5);
        rh = (int64_t)((double)h * scale + 0.5);
        /* rounding up both sides can overshoot the cap by a sliver: step back */
        while (target == hi && rw * rh > hi && rw > 1 && rh > 1) {
            if (rw * h >= rh * w) rw--;
            else rh--;
        }
    }
    f->rw = (int)rw;
    f->rh = (int)rh;
    f->bw = (int)(rw - rw % p->steps);
    f->bh = (int)(rh - rh % p->steps);
    return f->bw > 0 && f->bh > 0 ? SD_FIT_OK : SD_FIT_TOO_SMALL;
}

/* Choose the bucket for a w x h image (display orientation) and work out the
 * resize and the centre crop (offset = trim // 2, as kohya). */
sd_fit_status sd_bucket_select(const sd_plan *p, int w, int h, sd_fit *f)
{
    memset(f, 0, sizeof *f);
    if (w <= 0 || h <= 0) return SD_FIT_TOO_SMALL;
    sd_fit_status st = SD_FIT_OK;
    if (p->kind == SD_PLAN_MULTIRES) st = select_multires(p, w, h, f);
    else if (p->kind == SD_PLAN_KOHYA && p->no_upscale) st = select_no_upscale(p, w, h, f);
    else {
        select_predefined(p, w, h, f);
        if (p->no_upscale && (f->rw > w || f->rh > h)) st = SD_FIT_NEEDS_UPSCALE;
    }
    if (st) return st;
    /* the resized image always covers the bucket; keep the box inside it anyway */
    if (f->rw < f->bw) f->rw = f->bw;
    if (f->rh < f->bh) f->rh = f->bh;
    if (f->rw > SD_BUCKET_MAX_RESIZE || f->rh > SD_BUCKET_MAX_RESIZE) return SD_FIT_RESIZE_TOO_LARGE;
    f->crop[0] = (f->rw - f->bw) / 2;
    f->crop[1] = (f->rh - f->bh) / 2;
    f->crop[2] = f->crop[0] + f->bw;
    f->crop[3] = f->crop[1] + f->bh;
    sd_kohya_crop_ltrb(f->bw, f->bh, w, h, f->ltrb, &f->ltrb_float);
    f->ar_error = (double)f->bw / (double)f->bh - (double)w / (double)h;
    return SD_FIT_OK;
}
