/* A shard file cut short, refused before LMDB reads a page past its end.
 * LMDB maps the whole file and reads pages in place, so a page past the end
 * of a cut file raises SIGBUS on first touch. A file may still legitimately
 * end before LMDB's last page: a page that a transaction allocated and freed
 * again (a loose page, an overflow run) is put on the freelist unwritten. So
 * when the file is short, the freelist of the snapshot is read with pread
 * (never through the map) and the file is refused only when a page past its
 * end is not free (LMDB's layout: lmdb_layout.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmdb_layout.h"
#include "shard_int.h"

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
sd_status sd_shard_check_size(sd_shard *s, sd_error *err)
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
