/* Private state shared by the shard library's files (shard.c: open, close,
 * meta; shard_lock.c: the writer's lock and LMDB's lock file; shard_tail.c:
 * a file cut short; shard_read.c: reading; shard_write.c: batches, index
 * maintenance, map growth; shard_pages.c, shard_salvage.c: the page walk and
 * salvage). */
#ifndef SDTK_SHARD_INT_H
#define SDTK_SHARD_INT_H

#include <lmdb.h>

#include "shard.h"

enum { NDBS = 7 };
/* A database an older shard may lack (opened read-only: dbi_ok 0; the page
 * walk does not ask for it). */
static inline int sd_shard_db_optional(int db)
{
    return db == SD_SHARD_DB_VARIANTS;
}

/* LMDB's reader slots: what sd_shard_open asks for, and what its lock file's
 * pages are reserved for (sd_shard_prepare_lock_file). */
enum { MAX_READERS = 1024 };

struct sd_shard {
    MDB_env *env;
    MDB_dbi dbi[NDBS]; /* indexed by sd_shard_db */
    int dbi_ok[NDBS];  /* 0: an optional database this (read-only) shard lacks */
    char *path;
    unsigned flags;
    size_t map_size, max_map;
    int lock_fd;   /* writer: holds the exclusive flock */
    MDB_txn *wtxn; /* the open batch, or NULL */
    sd_buf log;    /* the open batch's operations, for replay */
    size_t nops;
    int damaged;   /* opened with SD_SHARD_KEEP_DAMAGED and its pages are damaged */
};

struct sd_shard_txn {
    sd_shard *s;
    MDB_txn *txn;
};

/* A named database's name ("latents", ...). */
const char *sd_shard_db_name(int db);
/* SD_EFORMAT for a shard kept open with damaged pages (only the page walk,
 * salvage and close may use it), else SD_OK. */
sd_status sd_shard_refuse_damaged(const sd_shard *s, sd_error *err);
/* An LMDB result as an sdtk error; MDB_NOTFOUND becomes SD_ENOTFOUND. */
sd_status sd_shard_mdb_err(sd_error *err, int rc, const char *what, const sd_shard *s);
/* Begin a read-only LMDB transaction, adopting a map grown by the writer. */
int sd_shard_txn_begin_ro(sd_shard *s, MDB_txn **out);
/* sd_shard_check_pages of the newest snapshot (older = 0) or of the one
 * before it (older = 1: the other meta page, which LMDB leaves intact until
 * the next commit, so a salvage can take what the newest snapshot's damaged
 * pages hide); SD_ENOTFOUND when that page holds no such snapshot. */
sd_status sd_shard_walk_snapshot(sd_shard *s, int deep, int older, sd_shard_entry_fn fn, void *ctx,
                                 sd_shard_pages *out, sd_error *err);
/* The writer's exclusive lock: a second writer process fails at once
 * (shard_lock.c; s->lock_fd holds it). */
sd_status sd_shard_lock_writer(sd_shard *s, sd_error *err);
/* Reserve the pages of PATH-lock before LMDB maps it, so a full disk is an
 * error and not a SIGBUS; a reader that cannot make or write it goes without
 * LMDB's reader table (*nolock set) (shard_lock.c). */
sd_status sd_shard_prepare_lock_file(const char *path, int ro, int *nolock, sd_error *err);
/* Refuse a file cut short before anything reads a page past its end, unless
 * every missing page is free (shard_tail.c). */
sd_status sd_shard_check_size(sd_shard *s, sd_error *err);

#endif
