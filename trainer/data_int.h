/* Inside sdtrain only: what the data files share (data_index.c: opening
 * and indexing the shards; data_load.c: records to batches). */
#ifndef SDTK_DATA_INT_H
#define SDTK_DATA_INT_H

#include <stddef.h>

/* Grow an array of elem-sized entries to hold need; 0 on success. */
int sd_data_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
