/* The shard handle's small shared pieces, below the open (shard.c), the
 * page walk (shard_pages.c), the cut-file check (shard_tail.c) and the
 * readers and writers: database names, LMDB's errors as sdtk errors, the
 * damaged-handle refusal and read transactions that adopt a grown map. */
#include <errno.h>

#include "shard_int.h"

static const char *const db_names[NDBS] = {"latents", "text", "names", "buckets", "bindex", "meta", "variants"};

/* A named database's name, for the page walk's messages and checks. */
const char *sd_shard_db_name(int db)
{
    return db >= 0 && db < NDBS ? db_names[db] : "?";
}

/* The refusal of every use but the page walk, salvage and close on a shard
 * opened with SD_SHARD_KEEP_DAMAGED whose pages are damaged: LMDB would
 * read them. */
sd_status sd_shard_refuse_damaged(const sd_shard *s, sd_error *err)
{
    if (!s->damaged) return SD_OK;
    return sd_err_set(err, SD_EFORMAT, "%s: damaged shard: its pages must not be read through LMDB", s->path);
}

/* For sd-verify, which opens a damaged file to walk and salvage it: whether
 * LMDB must be kept away from this handle's records. */
int sd_shard_damaged(const sd_shard *s)
{
    return s->damaged;
}

/* LMDB's error text with what was being done and the shard's path. */
sd_status sd_shard_mdb_err(sd_error *err, int rc, const char *what, const sd_shard *s)
{
    sd_status code = rc == MDB_NOTFOUND ? SD_ENOTFOUND
                     : rc == MDB_MAP_FULL ? SD_ERANGE
                     : rc == ENOMEM       ? SD_ENOMEM
                     : rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_VERSION_MISMATCH
                         ? SD_EFORMAT
                         : SD_EIO;
    return sd_err_set(err, code, "%s: %s: %s", s && s->path ? s->path : "shard", what, mdb_strerror(rc));
}

/* A read transaction; when the writer grew the map since we mapped it,
 * adopt the new size (no transaction of ours is active then) and retry. */
int sd_shard_txn_begin_ro(sd_shard *s, MDB_txn **out)
{
    int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, out);
    if (rc == MDB_MAP_RESIZED) {
        rc = mdb_env_set_mapsize(s->env, 0);
        if (!rc) rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, out);
    }
    return rc;
}
