#include "dtype.h"

#include <stdint.h>
#include <string.h>

#include "f16.h"

/* Bytes per element of a dtype, 0 for an unknown one. */
size_t sd_dtype_size(int dtype)
{
    switch (dtype) {
    case SD_DT_F16:
    case SD_DT_BF16: return 2;
    case SD_DT_F32: return 4;
    default: return 0;
    }
}

/* The dtype's name as reports and kohya metadata spell it. */
const char *sd_dtype_name(int dtype)
{
    switch (dtype) {
    case SD_DT_F16: return "fp16";
    case SD_DT_BF16: return "bf16";
    case SD_DT_F32: return "fp32";
    default: return "?";
    }
}

/* n floats into dtype at dst (fp16/bf16 round to nearest-even): the one
 * conversion every cache writer uses. */
void sd_dtype_store(void *dst, const float *src, size_t n, int dtype)
{
    unsigned char *d = dst;
    if (dtype == SD_DT_F32) {
        memcpy(d, src, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h = dtype == SD_DT_F16 ? sd_f32_to_f16(src[i]) : sd_f32_to_bf16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}
