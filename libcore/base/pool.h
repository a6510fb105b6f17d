/* A fixed set of worker threads that run one parallel-for at a time:
 * the range [0, n) is cut into one contiguous slice per worker. */
#ifndef SDTK_POOL_H
#define SDTK_POOL_H

#include <stddef.h>

typedef struct sd_pool sd_pool;
typedef void (*sd_range_fn)(void *ctx, int worker, size_t begin, size_t end);

sd_pool *sd_pool_create(int nthreads);
void sd_pool_destroy(sd_pool *p);
int sd_pool_size(const sd_pool *p);
void sd_pool_for(sd_pool *p, size_t n, sd_range_fn fn, void *ctx);
int sd_default_threads(void);
size_t sd_memory_limit(void);
void *sd_worker_array(size_t n, size_t size);

/* Per-worker state structs start with this member so each worker's fields
 * live on their own cache lines (threads writing to one line slow both). */
#define SD_WORKER_ALIGN _Alignas(64)

#endif
