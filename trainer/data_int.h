/* Inside sdtrain only: what the data files share (data_index.c: opening
 * and indexing the shards; data_load.c: records to batches). */
#ifndef SDTK_DATA_INT_H
#define SDTK_DATA_INT_H

#include <stddef.h>

#include "shard.h"

/* Room for the numbers behind a skip reason (a record's note). */
enum { NOTE_CAP = 112 };

/* sd-train --masked-loss (data_mask.c): the record's loss mask reduced to
 * the latent size [h, w] as sd-scripts' apply_masked_loss does, mirrored
 * when flip; ones without a mask. A skip reason (numbers in note) when it
 * cannot be used, else NULL. */
const char *sd_data_mask_load(const sd_shard_rec *r, int flip, int h, int w, float *out, char *note);

/* Grow an array of elem-sized entries to hold need; 0 on success. */
int sd_data_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
