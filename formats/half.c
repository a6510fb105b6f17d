#include "half.h"

#include <math.h>
#include <string.h>

/* 1 for the float dtypes sd_convert handles. */
int sd_npy_is_float(sd_npy_dtype t)
{
    return t == SD_NPY_F16 || t == SD_NPY_BF16 || t == SD_NPY_F32 || t == SD_NPY_F64;
}

/* Element i of a float array as double. */
static double load(sd_npy_dtype t, const unsigned char *p, size_t i)
{
    uint16_t h;
    float f;
    double d;
    switch (t) {
    case SD_NPY_F16: memcpy(&h, p + 2 * i, 2); return sd_f16_to_f32(h);
    case SD_NPY_BF16: memcpy(&h, p + 2 * i, 2); return sd_bf16_to_f32(h);
    case SD_NPY_F32: memcpy(&f, p + 4 * i, 4); return f;
    default: memcpy(&d, p + 8 * i, 8); return d;
    }
}

/* Convert count floats between dtypes. Narrowing goes through float32 (one
 * rounding from fp32 sources, which is what caches hold). */
sd_status sd_convert(sd_npy_dtype to, void *dst, sd_npy_dtype from, const void *src, size_t count, sd_error *err)
{
    if (!sd_npy_is_float(to) || !sd_npy_is_float(from))
        return sd_err_set(err, SD_EUNSUPPORTED, "cannot convert %s to %s", sd_npy_dtype_name(from), sd_npy_dtype_name(to));
    if (to == from) {
        memcpy(dst, src, count * sd_npy_dtype_size(to));
        return SD_OK;
    }
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < count; i++) {
        double v = load(from, s, i);
        uint16_t h;
        float f = (float)v;
        switch (to) {
        case SD_NPY_F16: h = sd_f32_to_f16(f); memcpy(d + 2 * i, &h, 2); break;
        case SD_NPY_BF16: h = sd_f32_to_bf16(f); memcpy(d + 2 * i, &h, 2); break;
        case SD_NPY_F32: memcpy(d + 4 * i, &f, 4); break;
        default: memcpy(d + 8 * i, &v, 8); break;
        }
    }
    return SD_OK;
}
