/* One metadata record through the bucketer: parse the JSONL line, find the
 * image size (record fields or the image header), pick the bucket and write
 * the record back with the bucket fields set and every other field kept. */
#ifndef SDTK_BUCKET_REC_H
#define SDTK_BUCKET_REC_H

#include <stddef.h>

#include "arena.h"
#include "pool.h"
#include "bucket.h"
#include "buf.h"

/* Per-thread state: a JSON arena and the last tar shard kept open, so
 * records from one WebDataset shard do not reopen it for every member. */
typedef struct {
    SD_WORKER_ALIGN sd_arena arena;
    sd_buf out; /* the worker's output records of the current batch */
    int tar_fd;
    char *tar_path;
    int read_sizes; /* sd-bucket --read-sizes: every size from the image header, none from the record */
} sd_brec_worker;

typedef struct {
    const char *reason; /* NULL: bucketed; else a skip reason (string literal) */
    int blank;          /* an empty line: neither output nor skipped */
    char detail[224];   /* what exactly was wrong, for the skip message */
    int w, h;           /* display size used for bucketing */
    sd_fit fit;
} sd_brec_result;

void sd_brec_worker_init(sd_brec_worker *wk);
void sd_brec_worker_free(sd_brec_worker *wk);
void sd_bucket_record(const sd_plan *plan, const char *root, sd_brec_worker *wk, char *line, size_t len, sd_buf *out,
                      sd_brec_result *res);
void sd_brec_write_fields(sd_buf *out, const sd_brec_result *res);

#endif
