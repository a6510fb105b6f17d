/* Fuzz target for the safetensors reader: any bytes either fail with an
 * error or give tensors that lie inside the input and match their shapes. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "safetensors.h"

/* Parse the input; when accepted, touch every tensor byte and re-check sizes. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_safetensors *st;
    sd_error err;
    if (sd_st_open_memory(&st, data, size, "fuzz", &err) != SD_OK) return 0;
    unsigned sum = 0;
    for (size_t i = 0; i < sd_st_count(st); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(st, i);
        uint64_t count = 1;
        for (int k = 0; k < t->ndim; k++) count *= t->shape[k];
        if (count * sd_st_dtype_size(t->dtype) != t->nbytes) abort();
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size) abort();
        for (uint64_t k = 0; k < t->nbytes; k++) sum += p[k];
        if (sd_st_find(st, t->name) != t) abort();
    }
    for (size_t i = 0; i < sd_st_meta_count(st); i++) sum += (unsigned)strlen(sd_st_meta_at(st, i)->value);
    sd_st_close(st);
    return (int)(sum & 0);
}
