#include "dtype.h"

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
