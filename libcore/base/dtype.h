/* Element types of tensors, one definition for the engine and the shard
 * store. The values are stored in shard records, so they never change. */
#ifndef SDTK_DTYPE_H
#define SDTK_DTYPE_H

#include <stddef.h>

typedef enum { SD_DT_F16 = 1, SD_DT_BF16 = 2, SD_DT_F32 = 3 } sd_dtype;

size_t sd_dtype_size(int dtype);     /* 2, 2, 4; 0 when unknown */
const char *sd_dtype_name(int dtype); /* "fp16", "bf16", "fp32", "?" */
void sd_dtype_store(void *dst, const float *src, size_t n, int dtype); /* SD_DT_F16/BF16/F32 */

#endif
