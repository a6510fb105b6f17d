/* The shard store: opening an LMDB environment for a shard file (writer or
 * reader) after checking the file is whole, closing it, and its metadata.
 * The locks live in shard_lock.c, a file cut short is found by
 * shard_tail.c, reading in shard_read.c, writing in shard_write.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lmdb_layout.h"
#include "shard_int.h"

enum { DEFAULT_MAP = 256u << 20 };

/* Current UTC time as ISO 8601, for the created meta entry. */
static void iso_now(char out[32])
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Refuse shards written by a newer format version with a clear message. */
static sd_status check_version(sd_shard *s, MDB_txn *txn, sd_error *err)
{
    MDB_val k = {strlen(SD_SHARD_META_VERSION), (void *)SD_SHARD_META_VERSION}, v;
    int rc = mdb_get(txn, s->dbi[SD_SHARD_DB_META], &k, &v);
    if (rc == MDB_NOTFOUND) return sd_err_set(err, SD_EFORMAT, "%s: not an sdtk shard (no format_version)", s->path);
    if (rc) return sd_shard_mdb_err(err, rc, "reading format_version", s);
    char buf[16];
    size_t n = v.mv_size < sizeof buf - 1 ? v.mv_size : sizeof buf - 1;
    memcpy(buf, v.mv_data, n);
    buf[n] = 0;
    char *end;
    long ver = strtol(buf, &end, 10);
    if (end == buf || *end || ver < 1) return sd_err_set(err, SD_EFORMAT, "%s: bad format_version \"%s\"", s->path, buf);
    if (ver > SD_SHARD_VERSION)
        return sd_err_set(err, SD_EUNSUPPORTED,
                          "%s: shard format version %ld is newer than this sdtk supports (%d); upgrade sdtk",
                          s->path, ver, SD_SHARD_VERSION);
    return SD_OK;
}

/* Open (writer: create) the named databases and check or write the format
 * version, in one transaction whose database handles outlive it. */
static sd_status open_dbs(sd_shard *s, sd_error *err)
{
    int ro = (s->flags & SD_SHARD_RDONLY) != 0;
    MDB_txn *txn;
    int rc = ro ? sd_shard_txn_begin_ro(s, &txn) : mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc) return sd_shard_mdb_err(err, rc, "begin", s);
    for (int i = 0; i < NDBS; i++) {
        unsigned f = (ro ? 0 : MDB_CREATE) | (i == SD_SHARD_DB_BINDEX ? MDB_DUPSORT : 0);
        rc = mdb_dbi_open(txn, sd_shard_db_name(i), f, &s->dbi[i]);
        s->dbi_ok[i] = rc == 0;
        if (rc == MDB_NOTFOUND && sd_shard_db_optional(i)) continue; /* a shard from before it */
        if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE) {
            MDB_stat ms;
            int empty = rc == MDB_NOTFOUND && mdb_stat(txn, 1, &ms) == 0 && ms.ms_entries == 0;
            mdb_txn_abort(txn);
            if (empty) return sd_err_set(err, SD_ENOTFOUND, "%s: empty shard (its writer has not committed yet)", s->path);
            return sd_err_set(err, SD_EFORMAT, "%s: not an sdtk shard (no \"%s\" database)", s->path, sd_shard_db_name(i));
        }
        if (rc) {
            mdb_txn_abort(txn);
            return sd_shard_mdb_err(err, rc, "opening databases", s);
        }
    }
    MDB_val k = {strlen(SD_SHARD_META_VERSION), (void *)SD_SHARD_META_VERSION}, v;
    if (!ro && mdb_get(txn, s->dbi[SD_SHARD_DB_META], &k, &v) == MDB_NOTFOUND) {
        char ver[8], now[32];
        snprintf(ver, sizeof ver, "%d", SD_SHARD_VERSION);
        iso_now(now);
        MDB_val vv = {strlen(ver), ver}, kc = {strlen(SD_SHARD_META_CREATED), (void *)SD_SHARD_META_CREATED},
                vc = {strlen(now), now};
        rc = mdb_put(txn, s->dbi[SD_SHARD_DB_META], &k, &vv, 0);
        if (!rc) rc = mdb_put(txn, s->dbi[SD_SHARD_DB_META], &kc, &vc, 0);
        if (rc) {
            mdb_txn_abort(txn);
            return sd_shard_mdb_err(err, rc, "writing format_version", s);
        }
    }
    sd_status st = check_version(s, txn, err);
    if (st) {
        mdb_txn_abort(txn);
        return st;
    }
    rc = mdb_txn_commit(txn);
    return rc ? sd_shard_mdb_err(err, rc, "commit", s) : SD_OK;
}

/* Walk every tree's pages before LMDB reads one (sd_shard_check_pages):
 * a damaged file is refused naming its first damaged page, or with
 * SD_SHARD_KEEP_DAMAGED kept for sd-verify with its databases unopened. A
 * writer walks deep: a page both free and in use, or an overflow run
 * whose head miscounts its pages, would make LMDB's writer hand out a
 * live page again and overwrite it. */
static sd_status check_pages(sd_shard *s, sd_error *err)
{
    sd_shard_pages found;
    int deep = !(s->flags & SD_SHARD_RDONLY);
    sd_status st = sd_shard_check_pages(s, deep, NULL, NULL, &found, err);
    if (st || !found.damage) return st;
    if (s->flags & SD_SHARD_KEEP_DAMAGED) {
        s->damaged = 1;
        return SD_OK;
    }
    return sd_err_set(err, SD_EFORMAT,
                      "%s: damaged shard: %s (%llu damaged place%s); sd-verify --repair copies the records of its "
                      "intact pages into a new file",
                      s->path, found.first, (unsigned long long)found.damage, found.damage == 1 ? "" : "s");
}

/* Free everything of a handle (no sync). */
static void shard_free(sd_shard *s)
{
    if (s->wtxn) mdb_txn_abort(s->wtxn);
    if (s->env) mdb_env_close(s->env);
    if (s->lock_fd >= 0) close(s->lock_fd);
    sd_buf_free(&s->log);
    free(s->path);
    free(s);
}

/* Where an intact second LMDB meta page lies when the first is damaged:
 * at one of LMDB's page sizes (512..64 KiB), the magic, the format and
 * that page size in its free database's record; 0 when none is. Tells a
 * shard with one damaged page from a file that was never one. */
static off_t second_meta_at(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    off_t found = 0;
    for (uint32_t psize = 512; psize <= 65536 && !found; psize *= 2) {
        uint8_t m[META_END];
        if (pread(fd, m, META_END, psize) == META_END && lmdb_rd32(m + PG_HDR) == LMDB_MAGIC &&
            lmdb_rd32(m + META_VERSION) == LMDB_FORMAT && lmdb_rd32(m + META_FREE_DB) == psize)
            found = psize;
    }
    close(fd);
    return found;
}

/* An existing file that is not an LMDB data file (a JSONL stream given as
 * a shard by mistake, an empty file) is refused before LMDB opens it, which
 * would leave a 64 KB PATH-lock beside it and, for an empty file, say only
 * "Bad file descriptor". LMDB's first page is a meta page: a 16-byte page
 * header, then the magic 0xBEEFC0DE (little-endian on every platform
 * sdtk builds for). */
static sd_status check_lmdb_magic(const char *path, off_t size, sd_error *err)
{
    if (size == 0) return sd_err_set(err, SD_EFORMAT, "%s: empty file, not a shard", path);
    unsigned char head[20];
    FILE *f = fopen(path, "rb");
    if (!f) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    static const unsigned char magic[4] = {0xDE, 0xC0, 0xEF, 0xBE};
    if (got < sizeof head || memcmp(head + 16, magic, 4) != 0) {
        off_t second = second_meta_at(path);
        if (second)
            return sd_err_set(err, SD_EFORMAT, "%s: damaged shard: its first LMDB meta page is damaged (the second, at "
                              "byte %lld, is intact); sd-verify --repair cannot rebuild a meta page: restore the file "
                              "from a copy, or rebuild it (sd-latents into a new shard)", path, (long long)second);
        return sd_err_set(err, SD_EFORMAT, "%s: not an LMDB shard file (no LMDB meta page at its start)", path);
    }
    return SD_OK;
}

/* LMDB's open trusts the newest meta page's page size and reads both meta
 * pages through its map, so a damaged page size (or a file too short for
 * the second meta page) makes mdb_env_open itself fault (SIGBUS). Both meta
 * pages are read with pread first: LMDB's magic and version, one page size
 * (a power of two, 512..64 KiB, LMDB's range), the file holding both. */
static sd_status check_lmdb_metas(const char *path, sd_error *err)
{
    uint8_t m[2][META_END];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    ssize_t r0 = pread(fd, m[0], META_END, 0);
    uint32_t psize = r0 == META_END ? lmdb_rd32(m[0] + META_FREE_DB) : 0;
    int sane = psize >= 512 && psize <= 65536 && (psize & (psize - 1)) == 0;
    ssize_t r1 = sane ? pread(fd, m[1], META_END, psize) : 0;
    int e = errno, fs = fstat(fd, &sb);
    close(fd);
    if (r0 < 0 || r1 < 0 || fs) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(e));
    for (int i = 0; sane && i < 2; i++)
        sane = (i == 0 || r1 == META_END) && lmdb_rd32(m[i] + PG_HDR) == LMDB_MAGIC &&
               lmdb_rd32(m[i] + META_VERSION) == LMDB_FORMAT && lmdb_rd32(m[i] + META_FREE_DB) == psize;
    if (sane && (uint64_t)sb.st_size >= 2 * (uint64_t)psize) return SD_OK;
    return sd_err_set(err, SD_EFORMAT,
                      sane ? "%s: damaged shard: the file (%lld bytes) is too short for its two LMDB meta pages"
                           : "%s: damaged shard: its LMDB meta pages do not agree on a valid page size and format "
                             "(%lld bytes); restore it from a copy or rebuild it",
                      path, (long long)sb.st_size);
}

/* See shard.h: the names of a shard's companions (its -lock, a temporary
 * output beside it). */
char *sd_shard_path_with(const char *path, const char *suffix)
{
    size_t a = strlen(path), b = strlen(suffix);
    char *s = malloc(a + b + 1);
    if (s) {
        memcpy(s, path, a);
        memcpy(s + a, suffix, b + 1);
    }
    return s;
}

/* See shard.h: LMDB leaves PATH-lock behind; a removed shard takes it along. */
void sd_shard_remove_files(const char *path)
{
    char *lock = sd_shard_path_with(path, "-lock");
    unlink(path);
    if (lock) unlink(lock);
    free(lock);
}

/* Whether an existing path may be replaced by a new shard (sd-pack
 * --force): a regular file that is a shard, or empty; --force must never
 * replace a FIFO, a device (-o /dev/null as root) or a user's JSONL.
 * SD_ENOTFOUND when nothing is there. */
sd_status sd_shard_replaceable(const char *path, sd_error *err)
{
    struct stat sb;
    if (stat(path, &sb)) return sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return sd_err_set(err, SD_EFORMAT, "%s: not a regular file, so not a shard: not replaced, even with --force", path);
    if (sb.st_size == 0) return SD_OK;
    sd_error e = {0};
    if (check_lmdb_magic(path, sb.st_size, &e))
        return sd_err_set(err, SD_EFORMAT, "%s: not a shard file: not replaced, even with --force", path);
    return SD_OK;
}

/* Open a shard file as writer or reader (see shard.h). */
sd_status sd_shard_open(sd_shard **out, const char *path, const sd_shard_opts *opts, sd_error *err)
{
    *out = NULL;
    sd_shard_opts def = {0, 0, 0};
    if (!opts) opts = &def;
    sd_shard *s = calloc(1, sizeof *s);
    if (!s) return sd_err_set(err, SD_ENOMEM, "out of memory");
    s->lock_fd = -1;
    s->flags = opts->flags;
    sd_buf_init(&s->log);
    s->path = strdup(path);
    s->max_map = opts->max_map_size ? opts->max_map_size : (size_t)1 << 40;
    int ro = (s->flags & SD_SHARD_RDONLY) != 0;
    sd_status st = SD_OK;
    struct stat sb;
    int create = !ro && (s->flags & SD_SHARD_CREATE);
    if (!s->path) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    else if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) st = sd_err_set(err, SD_EFORMAT, "%s: is a directory, not a shard file", path);
        else if (!S_ISREG(sb.st_mode)) /* a FIFO or device: LMDB would say "Illegal seek" and leave a -lock */
            st = sd_err_set(err, SD_EFORMAT, "%s: not a regular file, so not a shard file", path);
        else if (sb.st_size > 0 || !create) st = check_lmdb_magic(path, sb.st_size, err);
        if (!st && sb.st_size > 0) st = check_lmdb_metas(path, err);
    } else if (!create || errno != ENOENT) {
        st = sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", path, strerror(errno));
    }
    if (!st && !ro) st = sd_shard_lock_writer(s, err);
    int nolock = 0;
    if (!st) st = sd_shard_prepare_lock_file(path, ro, &nolock, err);
    int rc = st ? 0 : mdb_env_create(&s->env);
    if (!st && !rc) rc = mdb_env_set_maxdbs(s->env, NDBS + 2);
    if (!st && !rc) rc = mdb_env_set_maxreaders(s->env, MAX_READERS);
    if (!st && !rc && !ro) {
        s->map_size = opts->map_size ? opts->map_size : DEFAULT_MAP;
        if (fstat(s->lock_fd, &sb) == 0 && (size_t)sb.st_size > s->map_size) s->map_size = (size_t)sb.st_size;
        rc = mdb_env_set_mapsize(s->env, s->map_size);
    }
    if (!st && !rc) {
        unsigned f = MDB_NOSUBDIR | MDB_NOTLS | (ro ? MDB_RDONLY : 0) | (s->flags & SD_SHARD_NOSYNC ? MDB_NOSYNC : 0) |
                     (s->flags & SD_SHARD_NOMETASYNC ? MDB_NOMETASYNC : 0) |
                     (s->flags & SD_SHARD_RANDOM ? MDB_NORDAHEAD : 0) | (nolock ? MDB_NOLOCK : 0);
        rc = mdb_env_open(s->env, path, f, 0644);
        if (rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH)
            st = sd_err_set(err, SD_EFORMAT, "%s: not an LMDB shard file (%s)", path, mdb_strerror(rc));
    }
    if (!st && rc) st = sd_shard_mdb_err(err, rc, "open", s);
    if (!st) st = sd_shard_check_size(s, err);
    if (!st) st = check_pages(s, err);
    if (!st && !s->damaged) {
        MDB_envinfo info;
        mdb_env_info(s->env, &info);
        s->map_size = info.me_mapsize;
        st = open_dbs(s, err);
    }
    if (st) {
        shard_free(s);
        return st;
    }
    *out = s;
    return SD_OK;
}

/* Close: drop an unfinished batch, make NOSYNC/NOMETASYNC writes durable, free. */
sd_status sd_shard_close(sd_shard *s, sd_error *err)
{
    if (!s) return SD_OK;
    sd_status st = SD_OK;
    if (s->wtxn) {
        mdb_txn_abort(s->wtxn);
        s->wtxn = NULL;
    }
    if (!(s->flags & SD_SHARD_RDONLY)) st = sd_shard_sync(s, err);
    shard_free(s);
    return st;
}

/* fsync data and meta pages now. */
sd_status sd_shard_sync(sd_shard *s, sd_error *err)
{
    if (s->flags & SD_SHARD_RDONLY) return SD_OK;
    int rc = mdb_env_sync(s->env, 1);
    return rc ? sd_shard_mdb_err(err, rc, "sync", s) : SD_OK;
}

/* The file's path as opened, for callers' messages (the trainer's skipped records). */
const char *sd_shard_path(const sd_shard *s)
{
    return s->path;
}

/* The writer's current map, which grows as batches fill it (the shard tests check that growth). */
size_t sd_shard_map_size(const sd_shard *s)
{
    return s->map_size;
}

/* Read one meta value into a fresh string; sees the open batch in a writer. */
sd_status sd_shard_meta_get(sd_shard *s, const char *key, char **value, sd_error *err)
{
    *value = NULL;
    sd_status refused = sd_shard_refuse_damaged(s, err);
    if (refused) return refused;
    MDB_txn *txn = s->wtxn;
    int rc = txn ? 0 : sd_shard_txn_begin_ro(s, &txn);
    if (rc) return sd_shard_mdb_err(err, rc, "begin", s);
    MDB_val k = {strlen(key), (void *)key}, v;
    rc = mdb_get(txn, s->dbi[SD_SHARD_DB_META], &k, &v);
    sd_status st = SD_OK;
    if (rc == MDB_NOTFOUND) st = sd_err_set(err, SD_ENOTFOUND, "%s: no meta entry \"%s\"", s->path, key);
    else if (rc) st = sd_shard_mdb_err(err, rc, "reading meta", s);
    else if (!(*value = malloc(v.mv_size + 1))) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    else {
        memcpy(*value, v.mv_data, v.mv_size);
        (*value)[v.mv_size] = 0;
    }
    if (txn != s->wtxn) mdb_txn_abort(txn);
    return st;
}
