/* The few facts of LMDB 0.9's on-disk layout (data format 1, 64-bit) that
 * sdtk reads itself, with pread, before LMDB touches a page: the size check
 * of a file cut short (shard_tail.c) and the bounds-checked page walk that
 * keeps a damaged page from crashing LMDB's cursors (shard_pages.c). lmdb.h
 * publishes none of it; the offsets are those of lmdb/mdb.c's MDB_page,
 * MDB_node, MDB_db and MDB_meta. LMDB writes its files in host byte order. */
#ifndef SDTK_LMDB_LAYOUT_H
#define SDTK_LMDB_LAYOUT_H

#include <stdint.h>
#include <string.h>

static const uint32_t LMDB_MAGIC = 0xBEEFC0DEu; /* mm_magic */
static const uint64_t LMDB_NO_PAGE = UINT64_MAX; /* P_INVALID: an empty tree's root */

enum {
    LMDB_FORMAT = 1, /* mm_version */
    /* page header: pgno u64, pad u16, flags u16, lower u16, upper u16
     * (an overflow page: the run's page count u32 in place of lower+upper) */
    PG_HDR = 16,
    PG_FLAGS = 10,
    PG_LOWER = 12,
    PG_UPPER = 14,
    PG_BRANCH = 0x01,
    PG_LEAF = 0x02,
    PG_OVERFLOW = 0x04,
    PG_META = 0x08,
    PG_LEAF2 = 0x20,
    PG_SUBP = 0x40,
    /* node: data size u32 (a branch: child page, low 32 bits), flags u16
     * (a branch: child page, high 16 bits), key size u16, key, data */
    NODE_HDR = 8,
    NODE_BIGDATA = 0x01, /* the data is the page number of an overflow run */
    NODE_SUBDATA = 0x02, /* the data is an MDB_db: a named database or a dup tree */
    NODE_DUPDATA = 0x04, /* the data is a dup sub-page (or with SUBDATA a dup tree) */
    /* MDB_db: pad u32 (the free DB in a meta: page size), flags u16, depth
     * u16, branch/leaf/overflow page counts u64, entries u64, root u64 */
    DB_SIZE = 48,
    DB_FLAGS = 4,
    DB_DEPTH = 6,
    DB_ENTRIES = 32,
    DB_ROOT = 40,
    DB_DUPSORT = 0x04, /* MDB_DUPSORT among md_flags */
    /* MDB_meta after the page header: magic u32, version u32, address,
     * map size, the free and the main MDB_db, last page u64, txnid u64 */
    META_VERSION = PG_HDR + 4,
    META_FREE_DB = PG_HDR + 24,
    META_MAIN_DB = PG_HDR + 72,
    META_LAST_PG = PG_HDR + 120,
    META_TXNID = PG_HDR + 128,
    META_END = PG_HDR + 136,
    LMDB_MAX_DEPTH = 32 /* LMDB's cursor stack */
};

/* Host-order integers from an unaligned place in a page. */
static inline uint16_t lmdb_rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t lmdb_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t lmdb_rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* qsort's order of page numbers (the freelist checks sort them). */
static inline int lmdb_cmp_pgno(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#endif
