#include "kohya_cache.h"

#include <math.h>
#include <string.h>

#include "bucket.h"
#include "half.h"

enum { MAX_LATENT_SIDE = 1024, MAX_ORIG_SIDE = 1 << 20 };

/* 1 when s (length n) ends with suffix. */
static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* Parse the digits in s[b, e) (at least 4, as {W:04d} writes) into *v. */
static int parse_side(const char *s, size_t b, size_t e, uint32_t *v)
{
    if (e < b + 4 || e - b > 7) return -1;
    uint32_t x = 0;
    for (size_t i = b; i < e; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (uint32_t)(s[i] - '0');
    }
    *v = x;
    return 0;
}

/* Tell which kohya cache a file is from its base name, the image stem's
 * length and (current names) the original image size in the name. */
sd_kohya_kind sd_kohya_classify(const char *base, size_t *stem_len, uint32_t *w, uint32_t *h)
{
    size_t n = strlen(base);
    *w = *h = 0;
    if (!ends_with(base, n, ".npz") || n == 4) return SD_KOHYA_NONE;
    n -= 4;
    if (ends_with(base, n, "_te_outputs")) {
        *stem_len = n - 11;
        return *stem_len ? SD_KOHYA_TE : SD_KOHYA_NONE;
    }
    size_t arch = ends_with(base, n, "_sdxl") ? 5 : ends_with(base, n, "_sd") ? 3 : 0;
    if (arch) {
        size_t e = n - arch, us = e, x = e;
        while (us > 0 && base[us - 1] != '_') us--;
        for (size_t i = us; i < e; i++)
            if (base[i] == 'x') x = i;
        if (us > 1 && x < e && parse_side(base, us, x, w) == 0 && parse_side(base, x + 1, e, h) == 0) {
            *stem_len = us - 1;
            return arch == 5 ? SD_KOHYA_SDXL : SD_KOHYA_SD;
        }
        *w = *h = 0;
    }
    *stem_len = n;
    return SD_KOHYA_LEGACY;
}

/* Names used in shard metadata and on the command line. */
const char *sd_kohya_kind_name(sd_kohya_kind k)
{
    switch (k) {
    case SD_KOHYA_LEGACY: return "legacy";
    case SD_KOHYA_SD: return "sd";
    case SD_KOHYA_SDXL: return "sdxl";
    case SD_KOHYA_TE: return "te";
    default: return "none";
    }
}

/* The inverse of sd_kohya_kind_name for latents layouts; 0 on success. */
int sd_kohya_kind_parse(const char *name, sd_kohya_kind *out)
{
    static const sd_kohya_kind kinds[] = {SD_KOHYA_LEGACY, SD_KOHYA_SD, SD_KOHYA_SDXL};
    for (size_t i = 0; i < 3; i++)
        if (strcmp(name, sd_kohya_kind_name(kinds[i])) == 0) {
            *out = kinds[i];
            return 0;
        }
    return -1;
}

/* The file name sd-scripts uses for an image stem: legacy, current SD/SDXL
 * (w x h = original image size) or text-encoder outputs. */
void sd_kohya_file_name(sd_buf *out, const char *stem, sd_kohya_kind k, uint32_t w, uint32_t h)
{
    switch (k) {
    case SD_KOHYA_SD: sd_buf_printf(out, "%s_%04ux%04u_sd.npz", stem, w, h); break;
    case SD_KOHYA_SDXL: sd_buf_printf(out, "%s_%04ux%04u_sdxl.npz", stem, w, h); break;
    case SD_KOHYA_TE: sd_buf_printf(out, "%s_te_outputs.npz", stem); break;
    default: sd_buf_printf(out, "%s.npz", stem); break;
    }
}

/* Element i of a small numeric array as double (int or float dtypes). */
static double num_at(const sd_npz_member *m, size_t i)
{
    const unsigned char *p = m->data;
    switch (m->info.dtype) {
    case SD_NPY_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case SD_NPY_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case SD_NPY_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
    case SD_NPY_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
    default: return NAN;
    }
}

/* Element i of an int64 or int32 array, exactly: an int64 never goes
 * through a double (values of 2^63 and more would not convert back). */
static int64_t int_at(const sd_npz_member *m, size_t i)
{
    const unsigned char *p = m->data;
    if (m->info.dtype == SD_NPY_I32) {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, p + 8 * i, 8);
    return v;
}

/* 1 when every element of a float array is finite. */
static int all_finite(const sd_npz_member *m)
{
    const unsigned char *p = m->data;
    for (uint64_t i = 0; i < m->info.count; i++) {
        if (m->info.dtype == SD_NPY_F16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            if ((h & 0x7c00) == 0x7c00) return 0;
        } else if (m->info.dtype == SD_NPY_F32) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7f800000) == 0x7f800000) return 0;
        } else if (!isfinite(num_at(m, (size_t)i))) {
            return 0;
        }
    }
    return 1;
}

/* 1 when every element of a float array lies in 0..1 (an alpha mask:
 * alpha / 255); NaN fails too. */
static int all_unit(const sd_npz_member *m)
{
    const unsigned char *p = m->data;
    for (uint64_t i = 0; i < m->info.count; i++) {
        double v;
        if (m->info.dtype == SD_NPY_F16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v = sd_f16_to_f32(h);
        } else v = num_at(m, (size_t)i);
        if (!(v >= 0.0 && v <= 1.0)) return 0;
    }
    return 1;
}

/* A latent-like float array: f16, f32 or f64. */
static int is_float_member(const sd_npz_member *m)
{
    return m->info.dtype == SD_NPY_F16 || m->info.dtype == SD_NPY_F32 || m->info.dtype == SD_NPY_F64;
}

/* Check the latents array itself and take its shape. */
static sd_status check_latents_array(sd_kohya_latents *l, const char **reason, sd_error *err)
{
    const sd_npz_member *m = l->latents;
    if (!is_float_member(m)) {
        *reason = "bad latents dtype";
        return sd_err_set(err, SD_EFORMAT, "latents dtype is %s, not float", sd_npy_dtype_name(m->info.dtype));
    }
    if (m->info.ndim != 3 || (m->info.shape[0] != 4 && m->info.shape[0] != 16) || !m->info.shape[1] ||
        !m->info.shape[2] || m->info.shape[1] > MAX_LATENT_SIDE || m->info.shape[2] > MAX_LATENT_SIDE) {
        *reason = "bad latents shape";
        return sd_err_set(err, SD_EFORMAT, "latents shape is not (4|16, H/8, W/8) with sides 1..%d (ndim %d)",
                          MAX_LATENT_SIDE, m->info.ndim);
    }
    l->c = (uint32_t)m->info.shape[0];
    l->h = (uint32_t)m->info.shape[1];
    l->w = (uint32_t)m->info.shape[2];
    if (!all_finite(m)) {
        *reason = "NaN or Inf in latents";
        return sd_err_set(err, SD_ERANGE, "latents hold NaN or Inf");
    }
    return SD_OK;
}

/* Check original_size (2,) ints = (W, H) and crop_ltrb (4,) numbers. */
static sd_status check_geometry(sd_kohya_latents *l, const char **reason, sd_error *err)
{
    const sd_npz_member *o = sd_npz_find(&l->z, "original_size");
    if (!o || o->info.ndim != 1 || o->info.shape[0] != 2 ||
        (o->info.dtype != SD_NPY_I64 && o->info.dtype != SD_NPY_I32)) {
        *reason = "bad original_size";
        return sd_err_set(err, SD_EFORMAT, "original_size %s", o ? "is not (2,) int64" : "is missing");
    }
    l->orig_w = int_at(o, 0);
    l->orig_h = int_at(o, 1);
    if (l->orig_w < 1 || l->orig_h < 1 || l->orig_w > MAX_ORIG_SIDE || l->orig_h > MAX_ORIG_SIDE) {
        *reason = "bad original_size";
        return sd_err_set(err, SD_ERANGE, "original_size (%lld, %lld) out of range", (long long)l->orig_w,
                          (long long)l->orig_h);
    }
    const sd_npz_member *c = sd_npz_find(&l->z, "crop_ltrb");
    if (!c || c->info.ndim != 1 || c->info.shape[0] != 4 ||
        (c->info.dtype != SD_NPY_I64 && c->info.dtype != SD_NPY_I32 && c->info.dtype != SD_NPY_F64 &&
         c->info.dtype != SD_NPY_F32)) {
        *reason = "bad crop_ltrb";
        return sd_err_set(err, SD_EFORMAT, "crop_ltrb %s", c ? "is not (4,) numbers" : "is missing");
    }
    for (int i = 0; i < 4; i++) {
        l->crop[i] = num_at(c, (size_t)i);
        if (!isfinite(l->crop[i]) || fabs(l->crop[i]) > MAX_ORIG_SIDE) {
            *reason = "bad crop_ltrb";
            return sd_err_set(err, SD_ERANGE, "crop_ltrb[%d] is not a finite pixel position", i);
        }
    }
    return SD_OK;
}

/* Validate a latents npz already read into l->z (the fuzz target and the
 * loader share this), setting the member pointers and geometry. */
sd_status sd_kohya_latents_check(sd_kohya_latents *l, const char **reason, sd_error *err)
{
    l->latents = sd_npz_find(&l->z, "latents");
    l->flipped = sd_npz_find(&l->z, "latents_flipped");
    l->alpha = sd_npz_find(&l->z, "alpha_mask");
    for (size_t i = 0; i < l->z.n; i++) {
        const char *k = l->z.m[i].key;
        if (strcmp(k, "latents") && strcmp(k, "latents_flipped") && strcmp(k, "alpha_mask") &&
            strcmp(k, "original_size") && strcmp(k, "crop_ltrb")) {
            *reason = strncmp(k, "latents_", 8) == 0 || strncmp(k, "original_size_", 14) == 0
                          ? "per-resolution keys (sd-scripts PR #2269)"
                          : "unexpected npz key";
            return sd_err_set(err, SD_EUNSUPPORTED, "unexpected array '%.64s' in a latents npz", k);
        }
    }
    if (!l->latents) {
        *reason = "no latents array";
        return sd_err_set(err, SD_ENOTFOUND, "no 'latents' array");
    }
    sd_status st = check_latents_array(l, reason, err);
    if (!st) st = check_geometry(l, reason, err);
    if (st) return st;
    const sd_npz_member *f = l->flipped;
    if (f && (!is_float_member(f) || f->info.ndim != 3 || f->info.shape[0] != l->c || f->info.shape[1] != l->h ||
              f->info.shape[2] != l->w)) {
        *reason = "bad latents_flipped";
        return sd_err_set(err, SD_EFORMAT, "latents_flipped does not match the latents' shape (%u, %u, %u)", l->c,
                          l->h, l->w);
    }
    if (f && !all_finite(f)) {
        *reason = "NaN or Inf in latents";
        return sd_err_set(err, SD_ERANGE, "latents_flipped holds NaN or Inf");
    }
    const sd_npz_member *a = l->alpha;
    if (a && (!is_float_member(a) || a->info.ndim != 2 || a->info.shape[0] != (uint64_t)l->h * 8 ||
              a->info.shape[1] != (uint64_t)l->w * 8)) {
        *reason = "bad alpha_mask";
        return sd_err_set(err, SD_EFORMAT, "alpha_mask is not (%u, %u) float", l->h * 8, l->w * 8);
    }
    if (a && !all_unit(a)) {
        *reason = "alpha_mask values outside 0..1";
        return sd_err_set(err, SD_ERANGE, "alpha_mask holds values outside 0..1 (or NaN)");
    }
    return SD_OK;
}

/* Read and validate one latents npz; reason is a short literal for tallies. */
sd_status sd_kohya_latents_load(const char *path, sd_kohya_latents *l, const char **reason, sd_error *err)
{
    memset(l, 0, sizeof *l);
    sd_status st = sd_npz_read_file(&l->z, path, err);
    if (st) {
        *reason = st == SD_EIO || st == SD_ENOTFOUND ? "cannot read file" : "unreadable npz";
        return st;
    }
    st = sd_kohya_latents_check(l, reason, err);
    if (st) sd_kohya_latents_free(l);
    return st;
}

/* Release a loaded latents file. */
void sd_kohya_latents_free(sd_kohya_latents *l)
{
    sd_npz_free(&l->z);
    l->latents = l->flipped = l->alpha = NULL;
}

/* One text-encoder array: float, (T, width) or (width,) for the pool. */
static sd_status check_te_member(const sd_npz_member *m, const char *key, uint32_t width, int pooled,
                                 uint32_t *tokens, const char **reason, sd_error *err)
{
    if (!m) {
        *reason = "no te arrays";
        return sd_err_set(err, SD_ENOTFOUND, "no '%s' array (not an SDXL te_outputs npz)", key);
    }
    if (m->info.dtype != SD_NPY_F16 && m->info.dtype != SD_NPY_F32) {
        *reason = "bad te dtype";
        return sd_err_set(err, SD_EFORMAT, "%s dtype is %s, not float16/float32", key, sd_npy_dtype_name(m->info.dtype));
    }
    int ok = pooled ? m->info.ndim == 1 && m->info.shape[0] == width
                    : m->info.ndim == 2 && m->info.shape[1] == width &&
                          (m->info.shape[0] == 77 || m->info.shape[0] == 152 || m->info.shape[0] == 227) &&
                          (!*tokens || m->info.shape[0] == *tokens);
    if (!ok) {
        *reason = "bad te shape";
        return sd_err_set(err, SD_EFORMAT, pooled ? "%s is not (%u,)" : "%s is not (77|152|227, %u)", key, width);
    }
    if (!pooled) *tokens = (uint32_t)m->info.shape[0];
    if (!all_finite(m)) {
        *reason = "NaN or Inf in te outputs";
        return sd_err_set(err, SD_ERANGE, "%s holds NaN or Inf", key);
    }
    return SD_OK;
}

/* Validate a te_outputs npz already read into t->z. */
sd_status sd_kohya_te_check(sd_kohya_te *t, const char **reason, sd_error *err)
{
    for (size_t i = 0; i < t->z.n; i++) {
        const char *k = t->z.m[i].key;
        if (strcmp(k, "hidden_state1") && strcmp(k, "hidden_state2") && strcmp(k, "pool2")) {
            *reason = "unexpected npz key";
            return sd_err_set(err, SD_EUNSUPPORTED, "unexpected array '%.64s' in a te_outputs npz", k);
        }
    }
    t->h1 = sd_npz_find(&t->z, "hidden_state1");
    t->h2 = sd_npz_find(&t->z, "hidden_state2");
    t->pool = sd_npz_find(&t->z, "pool2");
    t->tokens = 0;
    sd_status st = check_te_member(t->h1, "hidden_state1", 768, 0, &t->tokens, reason, err);
    if (!st) st = check_te_member(t->h2, "hidden_state2", 1280, 0, &t->tokens, reason, err);
    if (!st) st = check_te_member(t->pool, "pool2", 1280, 1, &t->tokens, reason, err);
    return st;
}

/* Read and validate one <stem>_te_outputs.npz. */
sd_status sd_kohya_te_load(const char *path, sd_kohya_te *t, const char **reason, sd_error *err)
{
    memset(t, 0, sizeof *t);
    sd_status st = sd_npz_read_file(&t->z, path, err);
    if (st) {
        *reason = st == SD_EIO || st == SD_ENOTFOUND ? "cannot read file" : "unreadable npz";
        return st;
    }
    st = sd_kohya_te_check(t, reason, err);
    if (st) sd_kohya_te_free(t);
    return st;
}

/* Release a loaded te_outputs file. */
void sd_kohya_te_free(sd_kohya_te *t)
{
    sd_npz_free(&t->z);
    t->h1 = t->h2 = t->pool = NULL;
}

/* Build a latents npz exactly as sd-scripts' np.savez call does: latents,
 * original_size (int64), crop_ltrb (float64: numpy's array of get_crop_ltrb's
 * tuple, which always mixes ints and floats), latents_flipped, alpha_mask
 * (float32 at the image's size). */
sd_status sd_kohya_latents_encode(const sd_kohya_latents_out *l, sd_buf *out, sd_error *err)
{
    sd_npz_writer w;
    sd_status st = sd_npz_writer_init(&w, err);
    if (st) return st;
    uint64_t shape[3] = {l->c, l->h, l->w}, two = 2, four = 4;
    int64_t orig[2] = {l->orig_w, l->orig_h};
    st = sd_npz_writer_add(&w, "latents", SD_NPY_F32, 3, shape, l->latents, err);
    if (!st) st = sd_npz_writer_add(&w, "original_size", SD_NPY_I64, 1, &two, orig, err);
    if (!st) st = sd_npz_writer_add(&w, "crop_ltrb", SD_NPY_F64, 1, &four, l->crop_ltrb, err);
    if (!st && l->flipped) st = sd_npz_writer_add(&w, "latents_flipped", SD_NPY_F32, 3, shape, l->flipped, err);
    uint64_t mshape[2] = {(uint64_t)l->h * 8, (uint64_t)l->w * 8};
    if (!st && l->alpha_mask) st = sd_npz_writer_add(&w, "alpha_mask", SD_NPY_F32, 2, mshape, l->alpha_mask, err);
    if (!st) st = sd_npz_writer_finish(&w, err);
    if (!st) {
        sd_buf_clear(out);
        sd_buf_put(out, w.out.data, w.out.len);
        if (out->oom) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    sd_npz_writer_free(&w);
    return st;
}

/* The box sd-scripts cut for an image when it cached its latents, in sdtk's
 * convention (l, t, r, b in the resized image): select_bucket scales the
 * image to cover the bucket (by height when the image is wider than the
 * bucket, else by width; int(x + 0.5)) and trim_and_resize_if_required cuts
 * the centre (offset trim // 2; random_crop is refused with cached
 * latents). With bucket_no_upscale sd-scripts may resize differently, and
 * the box can then be off by the difference. */
void sd_kohya_cut_box(uint32_t orig_w, uint32_t orig_h, uint32_t bucket_w, uint32_t bucket_h, double box[4])
{
    double ar = (double)orig_w / (double)orig_h;
    double scale = ar > (double)bucket_w / (double)bucket_h ? (double)bucket_h / (double)orig_h
                                                            : (double)bucket_w / (double)orig_w;
    int64_t rw = (int64_t)((double)orig_w * scale + 0.5), rh = (int64_t)((double)orig_h * scale + 0.5);
    int64_t l = rw > bucket_w ? (rw - bucket_w) / 2 : 0, t = rh > bucket_h ? (rh - bucket_h) / 2 : 0;
    box[0] = (double)l;
    box[1] = (double)t;
    box[2] = (double)(l + bucket_w);
    box[3] = (double)(t + bucket_h);
}

/* 1 when a stored crop_ltrb is what sd-scripts computes for this original
 * size and bucket (get_crop_ltrb), allowing float32 rounding. */
int sd_kohya_crop_is_ltrb(const double crop[4], uint32_t orig_w, uint32_t orig_h, uint32_t bucket_w,
                          uint32_t bucket_h)
{
    double want[4];
    unsigned mask;
    sd_kohya_crop_ltrb((int)bucket_w, (int)bucket_h, (int)orig_w, (int)orig_h, want, &mask);
    for (int i = 0; i < 4; i++)
        if (fabs(crop[i] - want[i]) > 1e-6 * fmax(1.0, fabs(want[i]))) return 0;
    return 1;
}

/* Build an SDXL te_outputs npz (hidden_state1, hidden_state2, pool2) in
 * float32 or float16. */
sd_status sd_kohya_te_encode(int npy_dtype, uint32_t tokens, const void *h1, const void *h2, const void *pool,
                             sd_buf *out, sd_error *err)
{
    sd_npz_writer w;
    sd_status st = sd_npz_writer_init(&w, err);
    if (st) return st;
    uint64_t s1[2] = {tokens, 768}, s2[2] = {tokens, 1280}, sp = 1280;
    st = sd_npz_writer_add(&w, "hidden_state1", (sd_npy_dtype)npy_dtype, 2, s1, h1, err);
    if (!st) st = sd_npz_writer_add(&w, "hidden_state2", (sd_npy_dtype)npy_dtype, 2, s2, h2, err);
    if (!st) st = sd_npz_writer_add(&w, "pool2", (sd_npy_dtype)npy_dtype, 1, &sp, pool, err);
    if (!st) st = sd_npz_writer_finish(&w, err);
    if (!st) {
        sd_buf_clear(out);
        sd_buf_put(out, w.out.data, w.out.len);
        if (out->oom) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    sd_npz_writer_free(&w);
    return st;
}
