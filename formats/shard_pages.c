/* A bounds-checked walk of every page a shard's snapshot reaches, read with
 * pread and never through LMDB's map. LMDB trusts every offset and size it
 * reads from a page, so one flipped bit in a page header or a node sends
 * its cursors past the map (SIGSEGV in sd-verify, the very tool meant to
 * find the damage). sd_shard_open walks the structure first and refuses a
 * damaged file with a message naming the page; sd-verify walks deeper and
 * copies the entries of the intact pages out (shard_salvage.c). Layout:
 * lmdb_layout.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmdb_layout.h"
#include "shard_int.h"

/* What a tree is, for its checks and messages. */
typedef enum { TREE_MAIN, TREE_FREE, TREE_NAMED, TREE_DUPS } tree_kind;

typedef struct {
    tree_kind kind;
    int db;          /* sd_shard_db of a named database sdtk knows, else -1 */
    char name[64];   /* for messages */
    unsigned flags;  /* its md_flags */
    uint64_t root;
    unsigned depth;
    uint64_t entries; /* what its MDB_db says */
} tree;

enum { MAX_NAMED = 16 };

typedef struct {
    int fd;
    const char *path; /* for errors */
    size_t psize;
    uint64_t have;   /* whole pages in the file */
    uint64_t last;   /* the snapshot's last page */
    int deep;
    uint64_t budget; /* pages and runs left to visit: damage cannot make the walk loop */
    int looped;      /* the budget ran out (counted once) */
    uint8_t *seen;   /* deep: a bit per page of the file, set when a tree or run uses it */
    uint64_t *free;  /* deep: the pages the freelist names */
    size_t nfree, free_cap;
    uint8_t *val;    /* a value read whole for the entry callback */
    size_t val_cap;
    sd_shard_entry_fn fn;
    void *ctx;
    sd_shard_pages *out;
    tree named[MAX_NAMED];
    int nnamed;
    sd_status st; /* a failure that stops the walk (I/O, memory, the callback) */
    sd_error *err;
} walk;

/* Count one damaged place and describe the first. */
static void damage(walk *w, const tree *t, uint64_t pgno, const char *fmt, ...)
{
    sd_shard_pages *o = w->out;
    o->damage++;
    o->hidden += t->kind != TREE_FREE;
    if (o->first[0]) return;
    int n = snprintf(o->first, sizeof o->first, "the %s database's page %llu: ", t->name, (unsigned long long)pgno);
    if (n < 0 || (size_t)n >= sizeof o->first) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->first + n, sizeof o->first - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Stop the walk with an error of its own (not damage). */
static int fail(walk *w, sd_status code, const char *what)
{
    if (!w->st) w->st = sd_err_set(w->err, code, "%s: reading its pages: %s", w->path, what);
    return -1;
}

/* Mark pages [pg, pg + n) used (deep walk); 1 when one was used already:
 * two references to one page are damage, and a loop would be one. */
static int mark_used(walk *w, uint64_t pg, uint64_t n)
{
    int twice = 0;
    for (uint64_t p = pg; p < pg + n; p++) {
        uint8_t bit = (uint8_t)(1u << (p & 7));
        twice |= (w->seen[p >> 3] & bit) != 0;
        w->seen[p >> 3] |= bit;
    }
    return twice;
}

/* Whether pages [pg, pg + n) may be read: past the meta pages, inside the
 * snapshot and inside the file; describes the damage when not. */
static int pages_ok(walk *w, const tree *t, uint64_t from, uint64_t pg, uint64_t n)
{
    if (pg < 2 || pg > w->last || n > w->last - pg + 1) {
        damage(w, t, from, "points at page %llu (+%llu), outside the snapshot's pages 2..%llu", (unsigned long long)pg,
               (unsigned long long)n, (unsigned long long)w->last);
        return 0;
    }
    if (pg + n > w->have) {
        damage(w, t, from, "points at page %llu, past the end of the file (%llu pages)", (unsigned long long)pg,
               (unsigned long long)w->have);
        return 0;
    }
    return 1;
}

/* One more page or run to visit; 0 when the walk has visited more than
 * the file holds (two pages pointing at each other), counted once. */
static int visit(walk *w, const tree *t, uint64_t pg)
{
    if (w->budget > 0) {
        w->budget--;
        return 1;
    }
    if (!w->looped++) damage(w, t, pg, "the trees reach more pages than the file holds (a loop)");
    return 0;
}

/* Read len bytes at page pg, offset off: 0 read, -1 failed (w->st). */
static int read_at(walk *w, uint64_t pg, size_t off, void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(w->fd, (uint8_t *)buf + done, len - done, (off_t)(pg * w->psize + off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return fail(w, SD_EIO, strerror(errno));
        if (r == 0) return fail(w, SD_ETRUNC, "the file ended inside a page it holds");
        done += (size_t)r;
    }
    return 0;
}

/* Read one tree page whole (from names the page pointing at it): 1 good, 0
 * damaged (counted), -1 failed. */
static int read_page(walk *w, const tree *t, uint64_t from, uint64_t pg, uint8_t *buf)
{
    if (!pages_ok(w, t, from, pg, 1) || !visit(w, t, pg)) return 0;
    if (read_at(w, pg, 0, buf, w->psize)) return -1;
    w->out->pages++;
    if (lmdb_rd64(buf) != pg) {
        damage(w, t, pg, "its header names page %llu", (unsigned long long)lmdb_rd64(buf));
        return 0;
    }
    if (w->deep && mark_used(w, pg, 1)) {
        damage(w, t, pg, "reached a second time");
        w->out->hidden += t->kind == TREE_FREE; /* a tree reaches it too: which one is wrong is not known */
        return 0;
    }
    return 1;
}

/* A grown value buffer for the callback and the freelist. */
static uint8_t *val_room(walk *w, size_t n)
{
    if (n <= w->val_cap) return w->val;
    uint8_t *v = realloc(w->val, n ? n : 1);
    if (!v) return fail(w, SD_ENOMEM, "out of memory"), NULL;
    w->val = v;
    w->val_cap = n;
    return v;
}

/* An overflow run holding a value of size bytes, named by page from: its
 * pages in range; deep, its first page's header and every page unshared.
 * *data gets the value read whole when want. 1 good, 0 damaged, -1 failed. */
static int check_run(walk *w, const tree *t, uint64_t from, uint64_t pg, uint64_t size, int want, const uint8_t **data)
{
    uint64_t need = (size + PG_HDR - 1) / w->psize + 1; /* LMDB's OVPAGES */
    if (size > (uint64_t)1 << 40) {
        damage(w, t, from, "a value of %llu bytes", (unsigned long long)size);
        return 0;
    }
    if (!pages_ok(w, t, from, pg, need) || !visit(w, t, pg)) return 0;
    w->out->overflow++;
    if (w->deep) {
        uint8_t head[PG_HDR];
        if (read_at(w, pg, 0, head, sizeof head)) return -1;
        uint64_t n = lmdb_rd32(head + PG_LOWER);
        if (lmdb_rd64(head) != pg || !(lmdb_rd16(head + PG_FLAGS) & PG_OVERFLOW) || n < need ||
            n > w->last - pg + 1 || n > w->have - pg) { /* a run is written whole */
            damage(w, t, pg, "not the head of an overflow run of at least %llu pages", (unsigned long long)need);
            return 0;
        }
        if (mark_used(w, pg, n)) {
            damage(w, t, pg, "an overflow run whose pages are also used elsewhere");
            return 0;
        }
    }
    if (!want) return 1;
    uint8_t *v = val_room(w, (size_t)size);
    if (!v) return -1;
    if (size && read_at(w, pg, PG_HDR, v, (size_t)size)) return -1;
    *data = v;
    return 1;
}

/* A freelist entry (a count, then page numbers): the count must fit the
 * entry, since LMDB's writer trusts it when it takes pages from the list;
 * deep, its pages are collected for check_free. */
static void take_free(walk *w, const tree *t, uint64_t pg, const uint8_t *idl, uint64_t size)
{
    uint64_t n = size >= 8 ? lmdb_rd64(idl) : 0;
    if (size < 8 || n > size / 8 - 1) {
        damage(w, t, pg, "a freelist entry of %llu bytes claims %llu pages", (unsigned long long)size,
               (unsigned long long)n);
        return;
    }
    for (uint64_t i = 2; i <= n; i++)
        if (lmdb_rd64(idl + 8 * i) >= lmdb_rd64(idl + 8 * (i - 1))) { /* LMDB's page search assumes it */
            damage(w, t, pg, "a freelist entry's pages are not in descending order");
            return;
        }
    if (!w->deep) return;
    if (w->nfree + n > w->free_cap) {
        size_t cap = w->free_cap ? w->free_cap : 256;
        while (cap < w->nfree + n) cap *= 2;
        uint64_t *f = realloc(w->free, cap * sizeof *f);
        if (!f) {
            fail(w, SD_ENOMEM, "out of memory");
            return;
        }
        w->free = f;
        w->free_cap = cap;
    }
    for (uint64_t i = 1; i <= n; i++) w->free[w->nfree++] = lmdb_rd64(idl + 8 * i);
}

/* A tree described by an MDB_db (48 bytes at db). */
static tree tree_of(tree_kind kind, const uint8_t *db, const char *name)
{
    unsigned flags = lmdb_rd16(db + DB_FLAGS);
    tree t = {kind, -1, "", flags, lmdb_rd64(db + DB_ROOT), lmdb_rd16(db + DB_DEPTH), lmdb_rd64(db + DB_ENTRIES)};
    snprintf(t.name, sizeof t.name, "%s", name);
    return t;
}

static uint64_t walk_tree(walk *w, const tree *t);

/* A named database's entry in the main tree: kept for its own walk; a name
 * sdtk knows must have exactly its flags (a flipped DUPSORT bit would make
 * LMDB read every value as a dup tree, REVERSEKEY or INTEGERKEY would make
 * every lookup miss and look like thousands of index problems). */
static void take_named(walk *w, const tree *t, uint64_t pg, const uint8_t *key, size_t klen, const uint8_t *db)
{
    tree nt = tree_of(TREE_NAMED, db, "");
    size_t n = klen < sizeof nt.name - 1 ? klen : sizeof nt.name - 1;
    memcpy(nt.name, key, n);
    nt.name[n] = 0;
    for (int i = 0; i < NDBS; i++)
        if (klen == strlen(sd_shard_db_name(i)) && !memcmp(key, sd_shard_db_name(i), klen)) nt.db = i;
    if (nt.db >= 0 && nt.flags != (nt.db == SD_SHARD_DB_BINDEX ? (unsigned)DB_DUPSORT : 0)) {
        damage(w, t, pg, "the %s database's flags are %#x", nt.name, lmdb_rd16(db + DB_FLAGS));
        return;
    }
    if (nt.db == SD_SHARD_DB_LATENTS) w->out->records = nt.entries;
    if (w->nnamed == MAX_NAMED) {
        damage(w, t, pg, "more than %d named databases", MAX_NAMED);
        return;
    }
    w->named[w->nnamed++] = nt;
}

/* A dup value's length (a record key in bindex): as any LMDB key. */
static int dup_fits(size_t klen)
{
    return klen >= 1 && klen <= SD_SHARD_MAX_KEY;
}

/* A dup sub-page stored inside a leaf node (size bytes at p): its header
 * and nodes inside it. Returns its entries. */
static uint64_t walk_subpage(walk *w, const tree *t, uint64_t pg, const uint8_t *p, size_t size)
{
    unsigned flags = size >= PG_HDR ? lmdb_rd16(p + PG_FLAGS) : 0;
    size_t lower = size >= PG_HDR ? lmdb_rd16(p + PG_LOWER) : 0, upper = size >= PG_HDR ? lmdb_rd16(p + PG_UPPER) : 0;
    if ((flags & (PG_LEAF | PG_SUBP | PG_LEAF2 | PG_BRANCH)) != (PG_LEAF | PG_SUBP) || lower < PG_HDR + 2 ||
        lower > upper || upper > size || (lower - PG_HDR) % 2) {
        damage(w, t, pg, "a damaged dup sub-page (flags %#x, lower %zu, upper %zu, size %zu)", flags, lower, upper,
               size);
        return 0;
    }
    size_t n = (lower - PG_HDR) / 2;
    for (size_t i = 0; i < n; i++) {
        size_t off = lmdb_rd16(p + PG_HDR + 2 * i);
        const uint8_t *node = p + off;
        if (off < upper || off + NODE_HDR > size || lmdb_rd16(node + 4) != 0 || !dup_fits(lmdb_rd16(node + 6)) ||
            off + NODE_HDR + lmdb_rd16(node + 6) + (uint64_t)lmdb_rd32(node) > size) {
            damage(w, t, pg, "node %zu of a dup sub-page runs past it", i);
            return 0;
        }
    }
    return n;
}

/* The key lengths a leaf of tree t may hold: LMDB writes keys (and dup
 * values) of 1..511 bytes (MDB_MAXKEYSIZE), and sdtk's own databases fix
 * some: 16-byte text hashes, 8-byte buckets, 8-byte freelist txnids. A key
 * outside them is a damaged node (one whose key size lost a bit shifts its
 * value too), which --repair could not even name to delete it. */
static int key_fits(const tree *t, size_t klen)
{
    if (t->kind == TREE_FREE) return klen == 8;
    if (t->kind == TREE_NAMED && t->db == SD_SHARD_DB_TEXT) return klen == SD_SHARD_TEXT_KEY;
    if (t->kind == TREE_NAMED && (t->db == SD_SHARD_DB_BUCKETS || t->db == SD_SHARD_DB_BINDEX)) return klen == 8;
    return klen >= 1 && klen <= SD_SHARD_MAX_KEY;
}

/* One leaf node's data; returns the entries it holds (a dup node: its
 * duplicates). Named databases' entries go to the callback. */
static uint64_t leaf_node(walk *w, const tree *t, uint64_t pg, const uint8_t *page, size_t off, size_t i)
{
    const uint8_t *node = page + off, *key = node + NODE_HDR;
    unsigned flags = lmdb_rd16(node + 4);
    size_t klen = lmdb_rd16(node + 6), at = off + NODE_HDR + klen;
    uint64_t size = lmdb_rd32(node);
    int big = flags == NODE_BIGDATA;
    int allowed = t->kind == TREE_MAIN ? flags == NODE_SUBDATA
                  : t->kind == TREE_DUPS ? flags == 0
                  : t->flags & DB_DUPSORT ? flags == 0 || flags == NODE_DUPDATA || flags == (NODE_DUPDATA | NODE_SUBDATA)
                               : flags == 0 || big;
    if (!key_fits(t, klen)) {
        damage(w, t, pg, "node %zu has a key of %zu bytes", i, klen);
        return 0;
    }
    if (!allowed) {
        damage(w, t, pg, "node %zu has flags %#x", i, flags);
        return 0;
    }
    if (at + (big ? 8 : size) > w->psize) {
        damage(w, t, pg, "node %zu's data runs past the page", i);
        return 0;
    }
    const uint8_t *data = page + at;
    if (flags & NODE_SUBDATA) {
        if (size != DB_SIZE) {
            damage(w, t, pg, "node %zu names a tree in %llu bytes, not %d", i, (unsigned long long)size, DB_SIZE);
            return 0;
        }
        if (t->kind == TREE_MAIN) {
            take_named(w, t, pg, key, klen, data);
            return 1;
        }
        tree dup = tree_of(TREE_DUPS, data, "");
        snprintf(dup.name, sizeof dup.name, "%.40s (a dup tree)", t->name);
        return walk_tree(w, &dup);
    }
    if (flags & NODE_DUPDATA) return walk_subpage(w, t, pg, data, (size_t)size);
    int want = w->fn && t->kind == TREE_NAMED && t->db >= 0;
    int want_free = t->kind == TREE_FREE;
    if (big) {
        int r = check_run(w, t, pg, lmdb_rd64(data), size, want || want_free, &data);
        if (r <= 0) return 0;
    }
    if (want_free) take_free(w, t, pg, data, size);
    if (want && !w->st) {
        w->st = w->fn(w->ctx, (sd_shard_db)t->db, key, klen, data, (size_t)size, w->err);
        if (w->st) return 0;
    }
    return 1;
}

/* One page of a tree, depth levels above the leaves plus one; returns the
 * entries below it. A damaged page is counted and its subtree skipped; the
 * walk goes on with its siblings. */
static uint64_t walk_page(walk *w, const tree *t, uint64_t from, uint64_t pg, unsigned depth)
{
    uint8_t *page = malloc(w->psize);
    if (!page) return fail(w, SD_ENOMEM, "out of memory"), 0;
    uint64_t entries = 0;
    int r = read_page(w, t, from, pg, page);
    unsigned kinds = PG_BRANCH | PG_LEAF | PG_OVERFLOW | PG_META | PG_LEAF2 | PG_SUBP;
    unsigned flags = r > 0 ? lmdb_rd16(page + PG_FLAGS) & kinds : 0;
    size_t lower = r > 0 ? lmdb_rd16(page + PG_LOWER) : 0, upper = r > 0 ? lmdb_rd16(page + PG_UPPER) : 0;
    if (r > 0 && flags != (depth > 1 ? PG_BRANCH : PG_LEAF)) {
        damage(w, t, pg, "flags %#x where a %s page belongs", flags, depth > 1 ? "branch" : "leaf");
        r = 0;
    } else if (r > 0 && (lower < PG_HDR + 2 || lower > upper || upper > w->psize || (lower - PG_HDR) % 2)) {
        damage(w, t, pg, "its node bounds are damaged (lower %zu, upper %zu)", lower, upper);
        r = 0;
    } else if (r > 0 && depth > 1 && t->kind != TREE_FREE && lower < PG_HDR + 4) {
        /* LMDB asserts (abort()) that a branch page outside the freelist has two keys */
        damage(w, t, pg, "a branch page with one key");
        r = 0;
    }
    size_t n = r > 0 ? (lower - PG_HDR) / 2 : 0, bad = 0;
    for (size_t i = 0; i < n && !w->st; i++) {
        size_t off = lmdb_rd16(page + PG_HDR + 2 * i);
        if (off < upper || off + NODE_HDR > w->psize || off + NODE_HDR + lmdb_rd16(page + off + 6) > w->psize) {
            if (!bad++) damage(w, t, pg, "node %zu (at byte %zu) runs past the page", i, off); /* once a page */
            continue;
        }
        const uint8_t *node = page + off;
        if (depth > 1)
            entries += walk_page(w, t, pg, lmdb_rd32(node) | (uint64_t)lmdb_rd16(node + 4) << 32, depth - 1);
        else
            entries += leaf_node(w, t, pg, page, off, i);
    }
    free(page);
    return entries;
}

/* A whole tree; its entries must be what its MDB_db says (unless damage
 * inside it already explains a difference): readers size arrays by it. */
static uint64_t walk_tree(walk *w, const tree *t)
{
    uint64_t before = w->out->damage;
    if (t->root == LMDB_NO_PAGE) {
        if (t->depth != 0 || t->entries != 0) damage(w, t, 0, "an empty tree of depth %u with %llu entries", t->depth,
                                                     (unsigned long long)t->entries);
        return 0;
    }
    if (t->depth < 1 || t->depth > LMDB_MAX_DEPTH) {
        damage(w, t, t->root, "the tree's depth is %u", t->depth);
        return 0;
    }
    uint64_t n = walk_page(w, t, t->root, t->root, t->depth);
    if (!w->st && w->out->damage == before && n != t->entries)
        damage(w, t, t->root, "the tree holds %llu entries, its header says %llu", (unsigned long long)n,
               (unsigned long long)t->entries);
    return n;
}

/* After every tree (deep): a page both on the freelist and in a tree, or
 * twice on the freelist, would be handed out again by a later write, which
 * would overwrite live data (or trip LMDB's assertions). */
static void check_free(walk *w, const tree *ft)
{
    if (w->nfree) qsort(w->free, w->nfree, sizeof *w->free, lmdb_cmp_pgno);
    for (size_t i = 0; i < w->nfree; i++) {
        uint64_t p = w->free[i];
        if (i > 0 && p == w->free[i - 1]) damage(w, ft, p, "on the freelist twice");
        else if (p < 2 || p > w->last) damage(w, ft, p, "on the freelist but outside the snapshot's pages");
        else if (p < w->have && w->seen[p >> 3] & (1u << (p & 7))) {
            damage(w, ft, p, "on the freelist and in use");
            w->out->hidden++; /* a tree pointer damaged into a freed page may be the cause */
        }
    }
}

/* The walk of one snapshot, its meta page already read into meta. */
static sd_status walk_snapshot(walk *w, const uint8_t *meta)
{
    if (w->deep) {
        /* the file's pages, not the snapshot's: a damaged last page may be anything */
        w->seen = calloc((size_t)((w->have > 2 ? w->have : 2) / 8 + 1), 1);
        if (!w->seen) return sd_err_set(w->err, SD_ENOMEM, "out of memory");
        mark_used(w, 0, 2);
    }
    tree main = tree_of(TREE_MAIN, meta + META_MAIN_DB, "main"), fr = tree_of(TREE_FREE, meta + META_FREE_DB, "free");
    snprintf(fr.name, sizeof fr.name, "freelist");
    uint64_t before = w->out->damage;
    if (main.flags) damage(w, &main, main.root, "the main database's flags are %#x", main.flags);
    else walk_tree(w, &main);
    int missing = 0;
    for (int db = 0; db < NDBS && main.root != LMDB_NO_PAGE; db++) {
        if (sd_shard_db_optional(db)) continue;
        int found = 0;
        for (int i = 0; i < w->nnamed; i++) found |= w->named[i].db == db;
        if (!found && !missing++) damage(w, &main, main.root, "no %s database", sd_shard_db_name(db));
    }
    w->out->directory = w->out->damage > before;
    for (int i = 0; i < w->nnamed && !w->st; i++) walk_tree(w, &w->named[i]);
    /* the freelist's flags: INTEGERKEY and the environment's own, never a dup or reverse flag */
    if ((fr.flags & 0x7e) != 0x08) damage(w, &fr, fr.root, "the freelist's flags are %#x", fr.flags);
    else if (!w->st) walk_tree(w, &fr);
    if (!w->st && w->deep) check_free(w, &fr);
    return w->st;
}

/* Read the meta page LMDB writes snapshot id into (page id & 1). */
static sd_status read_meta(int fd, size_t psize, uint64_t id, uint8_t meta[META_END], const char *path, sd_error *err)
{
    ssize_t r = pread(fd, meta, META_END, (off_t)((id & 1) * psize));
    if (r < 0) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    if (r != META_END) memset(meta, 0, META_END);
    return SD_OK;
}

/* One try: a fresh read transaction pins the snapshot, its meta page is
 * read and walked (older: the snapshot before it, on the other meta page,
 * which LMDB keeps intact until the next commit; SD_ENOTFOUND when that
 * page holds no such snapshot). Every page the walk can reach is then stable: a writer
 * reuses no page freed after the pinned snapshot, and the meta page read
 * holds that snapshot or, when a writer rewrote it meanwhile, a newer one,
 * whose pages are as safe. Only a read torn by that rewrite could mix two
 * snapshots' roots and counts, so when the walk found damage the meta page
 * is read again, and *changed (try again) when it differs. A meta page of
 * another layout than LMDB 0.9's 64-bit one is not walked: never a false
 * refusal. */
static sd_status walk_once(sd_shard *s, int fd, size_t psize, int older, walk *w, int *changed)
{
    MDB_txn *txn;
    int rc = sd_shard_txn_begin_ro(s, &txn);
    if (rc) return sd_shard_mdb_err(w->err, rc, "begin", s);
    uint64_t newest = mdb_txn_id(txn), id = older ? newest - 1 : newest;
    uint8_t meta[META_END] = {0}, again[META_END];
    struct stat sb;
    *changed = 0;
    /* snapshot 0 is the empty file's: nothing to take from it */
    sd_status st = older && newest < 2 ? SD_ENOTFOUND : read_meta(fd, psize, id, meta, s->path, w->err);
    if (!st && fstat(fd, &sb)) st = sd_err_set(w->err, SD_EIO, "%s: %s", s->path, strerror(errno));
    int known = lmdb_rd32(meta + PG_HDR) == LMDB_MAGIC && lmdb_rd32(meta + META_VERSION) == LMDB_FORMAT &&
                lmdb_rd32(meta + META_FREE_DB) == psize && sizeof(size_t) == 8;
    if (!st && older && (!known || lmdb_rd64(meta + META_TXNID) != id)) st = SD_ENOTFOUND;
    if (!st && known) {
        w->have = (uint64_t)sb.st_size / psize;
        w->last = lmdb_rd64(meta + META_LAST_PG);
        w->budget = w->have + 16;
        st = walk_snapshot(w, meta); /* a damaged last page (below 2) leaves every root outside */
        if (!st && w->out->damage) st = read_meta(fd, psize, id, again, s->path, w->err);
        if (!st && w->out->damage) *changed = memcmp(meta, again, META_END) != 0;
    }
    mdb_txn_abort(txn);
    return st;
}

/* Free a walk's buffers, so that it can be tried again from the start. */
static void walk_free(walk *w)
{
    free(w->seen);
    free(w->free);
    free(w->val);
    w->seen = NULL;
    w->free = NULL;
    w->val = NULL;
    w->nfree = w->free_cap = w->val_cap = 0;
    w->nnamed = w->looped = 0;
    w->st = SD_OK;
}

/* See shard.h. */
sd_status sd_shard_check_pages(sd_shard *s, int deep, sd_shard_entry_fn fn, void *ctx, sd_shard_pages *out,
                              sd_error *err)
{
    return sd_shard_walk_snapshot(s, deep, 0, fn, ctx, out, err);
}

/* See shard_int.h. */
sd_status sd_shard_walk_snapshot(sd_shard *s, int deep, int older, sd_shard_entry_fn fn, void *ctx,
                                 sd_shard_pages *out, sd_error *err)
{
    MDB_stat ms;
    int fd;
    int rc = mdb_env_stat(s->env, &ms);
    if (!rc) rc = mdb_env_get_fd(s->env, &fd);
    if (rc) return sd_shard_mdb_err(err, rc, "reading the environment", s);
    walk w = {.fd = fd, .path = s->path, .psize = ms.ms_psize, .deep = deep, .fn = fn, .ctx = ctx, .out = out, .err = err};
    sd_status st = SD_OK;
    int changed = 1;
    for (int tries = 0; changed && tries < 4; tries++) {
        walk_free(&w);
        memset(out, 0, sizeof *out);
        st = walk_once(s, fd, ms.ms_psize, older, &w, &changed);
        if (st == SD_ENOTFOUND) { /* no older snapshot: out says nothing */
            walk_free(&w);
            return sd_err_set(err, SD_ENOTFOUND, "%s: no older snapshot on its other meta page", s->path);
        }
        if (st && !changed) break;
        st = SD_OK;
    }
    walk_free(&w);
    if (!st && changed)
        st = sd_err_set(err, SD_EIO, "%s: a writer kept rewriting the file while its damaged pages were "
                        "checked; try again", s->path);
    return st;
}
