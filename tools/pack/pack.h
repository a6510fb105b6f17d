/* sd-pack: shared pieces of the subcommands (one file each in tools/pack/):
 * output shards built under a temporary name and renamed into place,
 * batched copies of records with their text embeddings, and the glue
 * between npy dtypes and shard dtypes. */
#ifndef SDTK_PACK_H
#define SDTK_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "kohya_cache.h"
#include "npy.h"
#include "progress.h"
#include "shard.h"
#include "tally.h"

/* The meta entry naming a split's part: "<set id> <i>/<N>" (one id per run
 * of sd-pack split, so parts of two runs are told apart). */
#define PACK_META_SPLIT_SET "split_set"
/* sd-latents' meta entries for text embeddings: the key of the empty
 * caption's embedding (stored unreferenced, for conditioning dropout) and
 * the text encoder setup the embeddings were made with. */

/* Flags every subcommand accepts. */
typedef struct {
    int quiet, verbose, strict;
} pack_common;

/* How pack_out_open treats an output path. RESUME (import): an existing
 * PATH is extended in place, PATH.partial from a killed run picked up.
 * REPLACE (--force): the finished output may replace a PATH that exists at
 * publish time, unless a writer holds that shard's lock; without it such a
 * PATH is refused. */
enum { PACK_OUT_RESUME = 1, PACK_OUT_REPLACE = 2 };

/* A shard being written: under tmp until pack_out_publish renames it. */
typedef struct {
    char *final, *tmp; /* tmp == NULL when writing the final file in place */
    sd_shard *s;       /* NULL once pack_out_close has synced and closed it */
    size_t batch_n;    /* operations in the open batch (0: none open) */
    size_t batch_max;  /* commit after this many operations (default 512) */
    unsigned mode;     /* PACK_OUT_* */
} pack_out;

sd_status pack_out_open(pack_out *o, const char *path, unsigned mode, sd_error *err);
sd_status pack_out_put(pack_out *o, const void *key, size_t klen, const void *val, size_t vlen, sd_error *err);
sd_status pack_out_put_text(pack_out *o, const uint8_t hash[16], const void *val, size_t vlen, sd_error *err);
sd_status pack_out_flush(pack_out *o, sd_error *err);
sd_status pack_out_close(pack_out *o, sd_error *err);
sd_status pack_out_publish(pack_out *o, sd_error *err);
sd_status pack_out_publish_set(pack_out *v, long n, sd_error *err);
sd_status pack_out_commit(pack_out *o, sd_error *err);
void pack_out_abort(pack_out *o, int keep);
int pack_same_file(const char *a, const char *b);
int pack_path_taken(const char *path);
int pack_path_busy(const char *path);

sd_status pack_open_ro(sd_shard **s, sd_shard_txn **t, const char *path, sd_error *err);
void pack_close_ro(sd_shard *s, sd_shard_txn *t);
sd_status pack_copy_meta(sd_shard_txn *from, pack_out *to, const char *producer, sd_error *err);
sd_status pack_copy_text(sd_shard_txn *from, pack_out *to, const uint8_t ref[16], const char **skip, sd_error *why,
                         sd_error *err);
/* The record's caption variants and their embeddings (pack_common.c). */
sd_status pack_copy_variants(sd_shard_txn *from, pack_out *to, const void *key, size_t klen,
                             const uint8_t text_ref[16], uint64_t *dropped, sd_error *err);
int pack_has_text_ref(const uint8_t ref[16]);
sd_status pack_find_empty_text(sd_shard *s, sd_shard_txn *t, uint8_t key[16], int *found, const char **skip,
                               sd_error *why, sd_error *err);
sd_status pack_put_empty_text(sd_shard_txn *from, pack_out *to, const uint8_t key[16], sd_error *err);
void pack_hex(const void *key, size_t n, char *out, size_t cap);
void pack_rec_label(const void *key, size_t klen, const void *v, size_t vl, char *out, size_t cap);

int pack_npy_dtype(int shard_dtype);
int pack_shard_dtype(int npy_dtype);
int pack_rec_check(const void *v, size_t vl, int kind, const char *wrong_kind, sd_shard_rec *rec, sd_error *why);
/* kohya's crop_ltrb for a record with an original size and bucket. */
void pack_crop_ltrb(const sd_shard_rec *rec, double ltrb[4]);

int pack_finish(const sd_tally *t, const pack_common *c, const char *what);
void pack_progress_finish(sd_progress *p, const sd_tally *t);
sd_status pack_import_target_check(sd_shard *s, const char *path, sd_kohya_kind family, int allow_mixed,
                                   int *keep_meta, sd_error *err);

typedef int (*pack_cmd)(int argc, char **argv);
int pack_info(int argc, char **argv);
int pack_merge(int argc, char **argv);
int pack_split(int argc, char **argv);
int pack_compact(int argc, char **argv);
int pack_import_kohya(int argc, char **argv);
int pack_export_kohya(int argc, char **argv);
int pack_export_tar(int argc, char **argv);

#endif
