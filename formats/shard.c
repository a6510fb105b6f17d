/* The shard store: opening an LMDB environment for a shard file (writer or
 * reader), its metadata, and the read side (zero-copy gets, cursors, the
 * bucket index). Writing lives in shard_write.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lmdb_layout.h"
#include "log.h"
#include "shard_int.h"

static const char *const db_names[NDBS] = {"latents", "text", "names", "buckets", "bindex", "meta"};

enum { DEFAULT_MAP = 256u << 20, MAX_READERS = 1024 };

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
        rc = mdb_dbi_open(txn, db_names[i], f, &s->dbi[i]);
        if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE) {
            MDB_stat ms;
            int empty = rc == MDB_NOTFOUND && mdb_stat(txn, 1, &ms) == 0 && ms.ms_entries == 0;
            mdb_txn_abort(txn);
            if (empty) return sd_err_set(err, SD_ENOTFOUND, "%s: empty shard (its writer has not committed yet)", s->path);
            return sd_err_set(err, SD_EFORMAT, "%s: not an sdtk shard (no \"%s\" database)", s->path, db_names[i]);
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

/* ---- files cut short -------------------------------------------------------
 * LMDB maps the whole file and reads pages in place, so a page past the end
 * of a cut file raises SIGBUS on first touch. A file may still legitimately
 * end before LMDB's last page: a page that a transaction allocated and freed
 * again (a loose page, an overflow run) is put on the freelist unwritten. So
 * when the file is short, the freelist of the snapshot is read with pread
 * (never through the map) and the file is refused only when a page past its
 * end is not free (LMDB's layout: lmdb_layout.h). */

/* A freelist walk: the free pages among [have, last] (missing from the file). */
typedef struct {
    int fd;
    size_t psize;
    uint64_t have;   /* whole pages in the file */
    uint64_t last;   /* the snapshot's last page */
    uint64_t budget; /* pages left to visit: a damaged tree cannot loop */
    uint64_t *free;
    size_t n, cap;
} tail_walk;

/* len bytes of page pgno; a page past the end or not naming itself is damage
 * (SD_ETRUNC: the freelist cannot tell which missing pages are free). */
static sd_status walk_read(tail_walk *w, uint64_t pgno, uint8_t *buf, size_t len)
{
    if (pgno >= w->have || w->budget == 0) return SD_ETRUNC;
    w->budget--;
    ssize_t r = pread(w->fd, buf, len, (off_t)(pgno * w->psize));
    if (r < 0) return SD_EIO;
    return (size_t)r == len && lmdb_rd64(buf) == pgno ? SD_OK : SD_ETRUNC;
}

/* Collect the missing pages of one freelist entry (count, then page numbers). */
static sd_status walk_idl(tail_walk *w, const uint8_t *p, size_t size)
{
    if (size < 8) return SD_ETRUNC; /* not even its count: damage (LMDB writes at least one) */
    uint64_t n = lmdb_rd64(p);
    if (n > size / 8 - 1) return SD_ETRUNC;
    for (uint64_t i = 1; i <= n; i++) {
        uint64_t pg = lmdb_rd64(p + 8 * i);
        if (pg < w->have || pg > w->last) continue;
        if (w->n == w->cap) {
            size_t cap = w->cap ? 2 * w->cap : 256;
            uint64_t *f = realloc(w->free, cap * sizeof *f);
            if (!f) return SD_ENOMEM;
            w->free = f;
            w->cap = cap;
        }
        w->free[w->n++] = pg;
    }
    return SD_OK;
}

/* A freelist entry too big for its leaf, read from its overflow run. */
static sd_status walk_big(tail_walk *w, uint64_t pgno, size_t size)
{
    uint8_t head[PG_HDR];
    sd_status st = walk_read(w, pgno, head, sizeof head);
    if (st) return st;
    uint64_t pages = lmdb_rd32(head + PG_LOWER);
    if (!(lmdb_rd16(head + PG_FLAGS) & PG_OVERFLOW) || pages == 0 || pages > w->have - pgno ||
        size > pages * w->psize - PG_HDR)
        return SD_ETRUNC;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return SD_ENOMEM;
    ssize_t r = pread(w->fd, buf, size, (off_t)(pgno * w->psize + PG_HDR));
    st = r < 0 ? SD_EIO : (size_t)r != size ? SD_ETRUNC : walk_idl(w, buf, size);
    free(buf);
    return st;
}

/* One page of the freelist tree, depth levels above the leaves plus one:
 * a branch's children, a leaf's entries. */
static sd_status walk_page(tail_walk *w, uint64_t pgno, int depth)
{
    uint8_t *pg = malloc(w->psize);
    if (!pg) return SD_ENOMEM;
    sd_status st = walk_read(w, pgno, pg, w->psize);
    unsigned flags = st ? 0 : lmdb_rd16(pg + PG_FLAGS), lower = st ? 0 : lmdb_rd16(pg + PG_LOWER);
    int leaf = (flags & PG_LEAF) != 0;
    if (!st && (leaf ? depth != 1 : !(flags & PG_BRANCH) || depth < 2)) st = SD_ETRUNC;
    if (!st && (lower < PG_HDR || lower > w->psize)) st = SD_ETRUNC;
    for (size_t i = 0; !st && i < (lower - PG_HDR) / 2; i++) {
        size_t off = lmdb_rd16(pg + PG_HDR + 2 * i);
        if (off < PG_HDR || off > w->psize - NODE_HDR) {
            st = SD_ETRUNC;
            break;
        }
        const uint8_t *node = pg + off;
        uint64_t lo = lmdb_rd32(node), hi = lmdb_rd16(node + 4);
        size_t data = off + NODE_HDR + lmdb_rd16(node + 6);
        if (!leaf) st = walk_page(w, lo | hi << 32, depth - 1);
        else if (hi & NODE_BIGDATA) st = data + 8 > w->psize ? SD_ETRUNC : walk_big(w, lmdb_rd64(pg + data), lo);
        else st = data + lo > w->psize ? SD_ETRUNC : walk_idl(w, pg + data, lo);
    }
    free(pg);
    return st;
}

/* Where the highest missing page that is not free ends; 0 when all are free. */
static uint64_t walk_used_end(tail_walk *w)
{
    if (w->n) qsort(w->free, w->n, sizeof *w->free, lmdb_cmp_pgno); /* an empty list may be NULL */
    uint64_t pg = w->last;
    for (size_t i = w->n; i > 0 && pg >= w->have && pg > 0; i--) {
        if (w->free[i - 1] > pg) continue; /* a duplicate */
        if (w->free[i - 1] < pg) break;
        pg--;
    }
    return pg >= w->have ? (pg + 1) * w->psize : 0;
}

/* What one snapshot needs of a short file. */
typedef struct {
    uint64_t size;     /* the file's size */
    uint64_t used_end; /* the end of its last page past that size that is not free, or 0 */
    int changed;       /* the snapshot's meta page was rewritten meanwhile: try again */
} tail_check;

/* Read the meta page of snapshot id (LMDB writes txn t's meta into page t & 1). */
static sd_status read_meta(sd_shard *s, int fd, size_t psize, uint64_t id, uint8_t meta[META_END], sd_error *err)
{
    ssize_t r = pread(fd, meta, META_END, (off_t)((id & 1) * psize));
    if (r < 0) return sd_err_set(err, SD_EIO, "%s: %s", s->path, strerror(errno));
    if (r != META_END) memset(meta, 0, META_END);
    return SD_OK;
}

/* Fill c for the snapshot of a fresh read transaction: its pages, freelist
 * included, are not reused by a writer while that transaction lives, and its
 * meta page is read before the file's size, so pages a writer is adding are
 * never missed; the meta is read again after the walk to catch a rewrite.
 * A meta page of another layout than LMDB 0.9's cannot be walked: the file
 * is then accepted as before this check (never a false refusal). */
static sd_status check_snapshot(sd_shard *s, int fd, size_t psize, uint64_t lmdb_last, tail_check *c, sd_error *err)
{
    MDB_txn *txn;
    int rc = sd_shard_txn_begin_ro(s, &txn);
    if (rc) return sd_shard_mdb_err(err, rc, "begin", s);
    uint64_t id = mdb_txn_id(txn);
    uint8_t meta[META_END], again[META_END];
    struct stat sb;
    sd_status st = read_meta(s, fd, psize, id, meta, err);
    if (!st && fstat(fd, &sb)) st = sd_err_set(err, SD_EIO, "%s: %s", s->path, strerror(errno));
    int known = lmdb_rd32(meta + PG_HDR) == LMDB_MAGIC && lmdb_rd32(meta + META_VERSION) == LMDB_FORMAT &&
                lmdb_rd32(meta + META_FREE_DB) == psize && sizeof(size_t) == 8;
    c->changed = !st && known && lmdb_rd64(meta + META_TXNID) != id;
    uint64_t last = known ? lmdb_rd64(meta + META_LAST_PG) : lmdb_last;
    if (!st && !c->changed) {
        c->size = (uint64_t)sb.st_size;
        c->used_end = !known || c->size / psize > last ? 0 : (last + 1) * psize;
    }
    if (!st && !c->changed && c->used_end && known) {
        tail_walk w = {fd, psize, c->size / psize, last, last + 1, NULL, 0, 0};
        uint64_t root = lmdb_rd64(meta + META_FREE_DB + 40);
        int depth = lmdb_rd16(meta + META_FREE_DB + 6);
        sd_status ws = root == UINT64_MAX                 ? SD_OK /* an empty freelist */
                       : depth < 1 || depth > LMDB_MAX_DEPTH ? SD_ETRUNC
                                                        : walk_page(&w, root, depth);
        if (ws == SD_OK) c->used_end = walk_used_end(&w);
        else if (ws == SD_ENOMEM) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        else if (ws == SD_EIO) st = sd_err_set(err, SD_EIO, "%s: reading its freelist: %s", s->path, strerror(errno));
        free(w.free);
    }
    if (!st && !c->changed && known) st = read_meta(s, fd, psize, id, again, err);
    if (!st && !c->changed && known) c->changed = memcmp(meta, again, META_END) != 0;
    mdb_txn_abort(txn);
    return st;
}

/* Refuse a file cut short before anything reads a page past its end. A
 * writer never shrinks the file and writes a transaction's pages before the
 * meta page naming them, so the meta read first is covered by the size read
 * after it: a reader opening while a writer commits is never refused. */
static sd_status check_size(sd_shard *s, sd_error *err)
{
    MDB_envinfo info;
    MDB_stat ms;
    int fd;
    struct stat sb;
    int rc = mdb_env_info(s->env, &info);
    if (!rc) rc = mdb_env_stat(s->env, &ms);
    if (!rc) rc = mdb_env_get_fd(s->env, &fd);
    if (rc) return sd_shard_mdb_err(err, rc, "reading the environment", s);
    if (fstat(fd, &sb)) return sd_err_set(err, SD_EIO, "%s: %s", s->path, strerror(errno));
    if ((uint64_t)sb.st_size >= ((uint64_t)info.me_last_pgno + 1) * ms.ms_psize) return SD_OK;
    tail_check c = {0, 0, 1};
    for (int tries = 0; c.changed && tries < 4; tries++) {
        sd_status st = check_snapshot(s, fd, ms.ms_psize, info.me_last_pgno, &c, err);
        if (st) return st;
    }
    if (c.changed)
        return sd_err_set(err, SD_EIO, "%s: a writer kept rewriting the file while its size was checked; try again",
                          s->path);
    if (c.used_end <= c.size) return SD_OK;
    return sd_err_set(err, SD_ETRUNC,
                      "%s: truncated shard: the file has %llu bytes, LMDB's last used page ends at %llu (copy it "
                      "again or rebuild it)",
                      s->path, (unsigned long long)c.size, (unsigned long long)c.used_end);
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

/* The writer's exclusive lock: a second writer process fails at once. */
static sd_status lock_writer(sd_shard *s, sd_error *err)
{
    int f = O_RDWR | O_CLOEXEC | (s->flags & SD_SHARD_CREATE ? O_CREAT : 0);
    s->lock_fd = open(s->path, f, 0644);
    if (s->lock_fd < 0)
        return sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", s->path, strerror(errno));
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB))
        return sd_err_set(err, SD_EIO, "%s: %s", s->path,
                          errno == EWOULDBLOCK ? "another process is writing this shard" : strerror(errno));
    return SD_OK;
}

/* The writer lock taken without opening the environment (see shard.h): a
 * tool replacing a shard file must not pull it from under a writer, whose
 * records would go on into the unlinked file and be lost. */
sd_status sd_shard_lock_file(const char *path, int *fd, int *held, sd_error *err)
{
    *held = 0;
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO there must not block the open */
    if (*fd < 0) return sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", path, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return SD_OK;
    int e = errno;
    close(*fd);
    *fd = -1;
    *held = e == EWOULDBLOCK;
    return sd_err_set(err, SD_EIO, "%s: %s", path, *held ? "another process is writing this shard" : strerror(e));
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
    if (got < sizeof head || memcmp(head + 16, magic, 4) != 0)
        return sd_err_set(err, SD_EFORMAT, "%s: not an LMDB shard file (no LMDB meta page at its start)", path);
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

/* LMDB maps PATH-lock and writes its reader table into it: a lock file it
 * creates on a full disk is sparse, and the first write to it faults
 * (SIGBUS), in read-only tools too. So sdtk reserves its pages
 * (posix_fallocate; LMDB takes a larger file as it is): an existing one
 * in place (no data changes), a new one as a temporary file linked into
 * place (a process that made one meanwhile keeps its own; nothing another
 * process may use is ever unlinked). A full disk is then an error naming
 * the file. Where the lock file cannot be made or written because the
 * directory is not the user's (a team's shared cache), a reader goes
 * without LMDB's reader table (MDB_NOLOCK, *nolock set) with a warning: a
 * writer running meanwhile could reuse pages it reads. LMDB itself already
 * reads without a lock file on a read-only file system. */
static sd_status prepare_lock_file(const char *path, int ro, int *nolock, sd_error *err)
{
    char lp[4200], tmp[4220];
    *nolock = 0;
    if ((size_t)snprintf(lp, sizeof lp, "%s-lock", path) >= sizeof lp)
        return sd_err_set(err, SD_EINVAL, "%s: path too long", path);
    off_t bytes = ((off_t)(MAX_READERS + 4) * 64 + 4095) & ~(off_t)4095;
    int fd = open(lp, O_RDWR | O_CLOEXEC), made = 0;
    if (fd < 0 && errno == ENOENT) {
        snprintf(tmp, sizeof tmp, "%s.XXXXXX", lp);
        fd = mkstemp(tmp);
        made = fd >= 0;
        if (made && fchmod(fd, 0644)) { /* mkstemp's 0600 would lock other users out, as LMDB's 0644 does not */
            close(fd);
            unlink(tmp);
            return SD_OK; /* LMDB's own open then */
        }
    }
    if (fd < 0) {
        if (ro && errno == EACCES) {
            sd_log(SD_LOG_WARN, "%s: cannot make or write it (%s): reading %s without LMDB's reader lock; do not "
                   "write that shard while this runs", lp, strerror(errno), path);
            *nolock = 1;
        }
        return SD_OK; /* anything else: LMDB's own open says it */
    }
    int e = posix_fallocate(fd, 0, bytes);
    close(fd);
    if (made) {
        if (!e && link(tmp, lp) != 0 && errno != EEXIST) e = errno;
        unlink(tmp);
    }
    if (e == ENOSPC || e == EDQUOT)
        return sd_err_set(err, SD_EIO, "%s: no room for LMDB's lock file (%lld bytes): %s", lp, (long long)bytes,
                          strerror(e));
    return SD_OK; /* EOPNOTSUPP and the like: LMDB sizes it as before */
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
    if (!st && !ro) st = lock_writer(s, err);
    int nolock = 0;
    if (!st) st = prepare_lock_file(path, ro, &nolock, err);
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
    if (!st) st = check_size(s, err);
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

const char *sd_shard_path(const sd_shard *s)
{
    return s->path;
}

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

/* ---- read transactions ---------------------------------------------------- */

/* A snapshot for one thread. */
sd_status sd_shard_read_begin(sd_shard *s, sd_shard_txn **out, sd_error *err)
{
    *out = NULL;
    sd_status refused = sd_shard_refuse_damaged(s, err);
    if (refused) return refused;
    sd_shard_txn *t = calloc(1, sizeof *t);
    if (!t) return sd_err_set(err, SD_ENOMEM, "out of memory");
    t->s = s;
    int rc = sd_shard_txn_begin_ro(s, &t->txn);
    if (rc) {
        free(t);
        return sd_shard_mdb_err(err, rc, "begin read", s);
    }
    *out = t;
    return SD_OK;
}

void sd_shard_read_end(sd_shard_txn *t)
{
    if (!t) return;
    if (t->txn) mdb_txn_abort(t->txn);
    free(t);
}

void sd_shard_read_reset(sd_shard_txn *t)
{
    mdb_txn_reset(t->txn);
}

/* Fresh snapshot after a reset; a grown map needs a new transaction. */
sd_status sd_shard_read_renew(sd_shard_txn *t, sd_error *err)
{
    int rc = mdb_txn_renew(t->txn);
    if (rc == MDB_MAP_RESIZED) {
        mdb_txn_abort(t->txn);
        t->txn = NULL;
        rc = sd_shard_txn_begin_ro(t->s, &t->txn);
    }
    return rc ? sd_shard_mdb_err(err, rc, "renew read", t->s) : SD_OK;
}

/* Zero-copy lookup in one database. */
static sd_status get_in(sd_shard_txn *t, int db, const void *key, size_t klen, const void **val, size_t *vlen,
                        sd_error *err)
{
    MDB_val k = {klen, (void *)key}, v;
    *val = NULL;
    *vlen = 0;
    if (klen == 0 || klen > SD_SHARD_MAX_KEY) return sd_err_set(err, SD_EINVAL, "key length %zu not in 1..511", klen);
    int rc = mdb_get(t->txn, t->s->dbi[db], &k, &v);
    if (rc == MDB_NOTFOUND) return sd_err_set(err, SD_ENOTFOUND, "not found");
    if (rc) return sd_shard_mdb_err(err, rc, "get", t->s);
    *val = v.mv_data;
    *vlen = v.mv_size;
    return SD_OK;
}

sd_status sd_shard_get(sd_shard_txn *t, const void *key, size_t klen, const void **val, size_t *vlen, sd_error *err)
{
    return get_in(t, SD_SHARD_DB_LATENTS, key, klen, val, vlen, err);
}

sd_status sd_shard_get_text(sd_shard_txn *t, const uint8_t hash[16], const void **val, size_t *vlen, sd_error *err)
{
    return get_in(t, SD_SHARD_DB_TEXT, hash, SD_SHARD_TEXT_KEY, val, vlen, err);
}

sd_status sd_shard_get_name(sd_shard_txn *t, const char *name, size_t nlen, const void **key, size_t *klen, sd_error *err)
{
    return get_in(t, SD_SHARD_DB_NAMES, name, nlen, key, klen, err);
}

/* An exact (bucket, key) lookup among the bucket's duplicates. */
sd_status sd_shard_index_has(sd_shard_txn *t, uint32_t w, uint32_t h, const void *key, size_t klen, int *found,
                             sd_error *err)
{
    uint8_t bk[8];
    sd_shard_bucket_key(w, h, bk);
    MDB_cursor *c;
    *found = 0;
    int rc = mdb_cursor_open(t->txn, t->s->dbi[SD_SHARD_DB_BINDEX], &c);
    if (rc) return sd_shard_mdb_err(err, rc, "cursor", t->s);
    MDB_val k = {8, bk}, v = {klen, (void *)key};
    rc = mdb_cursor_get(c, &k, &v, MDB_GET_BOTH);
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND) return sd_shard_mdb_err(err, rc, "index lookup", t->s);
    *found = rc == 0;
    return SD_OK;
}

/* Entries of one database, from LMDB's page statistics (O(1)). */
sd_status sd_shard_count(sd_shard_txn *t, sd_shard_db db, uint64_t *n, sd_error *err)
{
    MDB_stat st;
    int rc = mdb_stat(t->txn, t->s->dbi[db], &st);
    if (rc) return sd_shard_mdb_err(err, rc, "stat", t->s);
    *n = st.ms_entries;
    return SD_OK;
}

/* Every bucket with its count: what a trainer reads at startup. */
sd_status sd_shard_buckets(sd_shard_txn *t, sd_shard_bucket **out, size_t *n, sd_error *err)
{
    *out = NULL;
    *n = 0;
    uint64_t cnt = 0;
    sd_status st = sd_shard_count(t, SD_SHARD_DB_BUCKETS, &cnt, err);
    if (st) return st;
    sd_shard_bucket *b = malloc((cnt ? cnt : 1) * sizeof *b);
    if (!b) return sd_err_set(err, SD_ENOMEM, "out of memory");
    MDB_cursor *c;
    int rc = mdb_cursor_open(t->txn, t->s->dbi[SD_SHARD_DB_BUCKETS], &c);
    if (rc) {
        free(b);
        return sd_shard_mdb_err(err, rc, "cursor", t->s);
    }
    MDB_val k, v;
    size_t i = 0;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc && i < cnt; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 8 || v.mv_size != 8) continue;
        sd_shard_bucket_unkey(k.mv_data, &b[i].w, &b[i].h);
        const uint8_t *p = v.mv_data;
        b[i].count = 0;
        for (int j = 7; j >= 0; j--) b[i].count = b[i].count << 8 | p[j];
        i++;
    }
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND) {
        free(b);
        return sd_shard_mdb_err(err, rc, "reading buckets", t->s);
    }
    *out = b;
    *n = i;
    return SD_OK;
}

/* ---- cursors --------------------------------------------------------------- */

struct sd_shard_cursor {
    sd_shard_txn *t;
    MDB_cursor *c;
    int db;
    int state; /* 0 = before first, 1 = positioned (next moves on), 2 = positioned, yield current, 3 = end */
    int bucket;
    uint8_t bkey[8];
};

static sd_status cursor_new(sd_shard_txn *t, int db, sd_shard_cursor **out, sd_error *err)
{
    *out = NULL;
    sd_shard_cursor *c = calloc(1, sizeof *c);
    if (!c) return sd_err_set(err, SD_ENOMEM, "out of memory");
    c->t = t;
    c->db = db;
    int rc = mdb_cursor_open(t->txn, t->s->dbi[db], &c->c);
    if (rc) {
        free(c);
        return sd_shard_mdb_err(err, rc, "cursor", t->s);
    }
    *out = c;
    return SD_OK;
}

sd_status sd_shard_cursor_open(sd_shard_txn *t, sd_shard_db db, sd_shard_cursor **out, sd_error *err)
{
    if ((int)db < 0 || (int)db >= NDBS) return sd_err_set(err, SD_EINVAL, "bad database %d", (int)db);
    return cursor_new(t, db, out, err);
}

sd_status sd_shard_cursor_bucket(sd_shard_txn *t, uint32_t w, uint32_t h, sd_shard_cursor **out, sd_error *err)
{
    sd_status st = cursor_new(t, SD_SHARD_DB_BINDEX, out, err);
    if (st) return st;
    (*out)->bucket = 1;
    sd_shard_bucket_key(w, h, (*out)->bkey);
    return SD_OK;
}

/* Position at the first key >= key; next() yields it. */
sd_status sd_shard_cursor_seek(sd_shard_cursor *c, const void *key, size_t klen, sd_error *err)
{
    if (c->bucket) return sd_err_set(err, SD_EINVAL, "seek on a bucket cursor");
    MDB_val k = {klen, (void *)key}, v;
    int rc = mdb_cursor_get(c->c, &k, &v, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND) {
        c->state = 3;
        return SD_OK;
    }
    if (rc) return sd_shard_mdb_err(err, rc, "seek", c->t->s);
    c->state = 2;
    return SD_OK;
}

/* Step a bucket cursor over its duplicates and look the record up. */
static sd_status bucket_next(sd_shard_cursor *c, const void **key, size_t *klen, const void **val, size_t *vlen,
                             sd_error *err)
{
    MDB_val k = {8, c->bkey}, v;
    int rc = c->state == 0 ? mdb_cursor_get(c->c, &k, &v, MDB_SET_KEY) : mdb_cursor_get(c->c, &k, &v, MDB_NEXT_DUP);
    if (!rc && c->state == 0) rc = mdb_cursor_get(c->c, &k, &v, MDB_FIRST_DUP);
    c->state = 1;
    if (rc == MDB_NOTFOUND) {
        c->state = 3;
        return sd_err_set(err, SD_ENOTFOUND, "end");
    }
    if (rc) return sd_shard_mdb_err(err, rc, "bucket cursor", c->t->s);
    *key = v.mv_data;
    *klen = v.mv_size;
    MDB_val rk = v, rv;
    rc = mdb_get(c->t->txn, c->t->s->dbi[SD_SHARD_DB_LATENTS], &rk, &rv);
    if (rc == MDB_NOTFOUND) {
        *val = NULL;
        *vlen = 0;
        return SD_OK;
    }
    if (rc) return sd_shard_mdb_err(err, rc, "get", c->t->s);
    *val = rv.mv_data;
    *vlen = rv.mv_size;
    return SD_OK;
}

sd_status sd_shard_cursor_next(sd_shard_cursor *c, const void **key, size_t *klen, const void **val, size_t *vlen,
                               sd_error *err)
{
    if (c->state == 3) return sd_err_set(err, SD_ENOTFOUND, "end");
    if (c->bucket) return bucket_next(c, key, klen, val, vlen, err);
    MDB_val k, v;
    MDB_cursor_op op = c->state == 0 ? MDB_FIRST : c->state == 2 ? MDB_GET_CURRENT : MDB_NEXT;
    int rc = mdb_cursor_get(c->c, &k, &v, op);
    c->state = 1;
    if (rc == MDB_NOTFOUND) {
        c->state = 3;
        return sd_err_set(err, SD_ENOTFOUND, "end");
    }
    if (rc) return sd_shard_mdb_err(err, rc, "cursor", c->t->s);
    *key = k.mv_data;
    *klen = k.mv_size;
    *val = v.mv_data;
    *vlen = v.mv_size;
    return SD_OK;
}

void sd_shard_cursor_close(sd_shard_cursor *c)
{
    if (!c) return;
    mdb_cursor_close(c->c);
    free(c);
}
