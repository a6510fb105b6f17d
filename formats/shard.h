/* The shard store: one LMDB environment per shard file holding every cached
 * tensor of one writer (latents, text embeddings), checksummed and
 * self-describing, with a bucket index so a trainer opens it in O(buckets).
 * The record format is specified byte by byte in docs/FORMATS.md, section
 * "Shard format, version 1".
 *
 * Named databases inside one shard file:
 *   meta     UTF-8 key -> UTF-8 value (format_version, producer, options, ...)
 *   latents  record key (1..511 caller-chosen bytes) -> record (kind latent)
 *   text     16-byte content hash -> record (kind text embedding)
 *   buckets  bucket (w,h) as 8 big-endian bytes -> uint64 LE record count
 *   bindex   bucket (w,h) as 8 big-endian bytes -> record key (MDB_DUPSORT,
 *            one duplicate per record: a range scan of one bucket)
 *   names    record name (the sd-meta `key`, 1..511 bytes) -> record key
 * buckets, bindex and names are maintained by sd_shard_put / sd_shard_del in
 * the same transaction as the record itself.
 *
 * Threads and processes: one writer process per shard (enforced with an
 * exclusive flock on the data file), any number of read-only handles in any
 * number of processes. A handle may be shared by threads; each thread uses
 * its own read transaction (sd_shard_txn). Write calls on one handle are
 * not thread-safe. */
#ifndef SDTK_SHARD_H
#define SDTK_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "dtype.h"
#include "err.h"

enum {
    SD_SHARD_VERSION = 1,     /* shard format version (meta format_version) this code writes and reads */
    SD_SHARD_HDR_SIZE = 256,  /* fixed record header of a version 1 record, name follows */
    SD_REC_VERSION_MAX = 2,   /* record format versions read: 1, and 2 (a record with a loss mask) */
    SD_SHARD_HDR_SIZE_V2 = 288, /* a version 2 record's header: a fifth tensor entry at 256 */
    SD_SHARD_MAX_TENSORS = 5, /* 4 in a version 1 record */
    SD_SHARD_MAX_KEY = 511,   /* record keys and names: LMDB's key limit */
    SD_SHARD_TEXT_KEY = 16    /* text-embedding keys: 16-byte content hash */
};

/* Meta keys every shard may carry (values are UTF-8 text; JSON where noted).
 * format_version and created are written by sd_shard_open on create. */
#define SD_SHARD_META_VERSION "format_version" /* "1" */
#define SD_SHARD_META_CREATED "created"        /* "2024-05-01T12:00:00Z" */
#define SD_SHARD_META_PRODUCER "producer"      /* "sd-latents 0.1.0" */
#define SD_SHARD_META_OPTIONS "options"        /* JSON object of the producer's options */
#define SD_SHARD_META_PARTS "parts"            /* sd-latents: JSON list of the --shard I/N parts that wrote it */
#define SD_SHARD_META_MODEL "model_hash"       /* hash of the weights used (hex) */
#define SD_SHARD_META_SCALING "scaling_factor" /* "0.18215", "0.13025" */
#define SD_SHARD_META_DTYPES "dtypes"          /* JSON object: {"latent":"fp16","text":"fp16"} */
#define SD_SHARD_META_EMPTY_TEXT "empty_text"  /* the empty caption's text key, 32 hex digits */
#define SD_SHARD_META_TEXT_ENCODER "text_encoder" /* the text encoder setup the embeddings came from */

/* A 16-byte text key as 32 lower-case hex digits (the empty_text meta). */
void sd_shard_text_key_hex(const uint8_t key[16], char out[33]);
/* 32 hex digits into a text key; 0 when s is anything else. */
int sd_shard_text_key_parse(const char *s, uint8_t key[16]);

/* ---- opening -------------------------------------------------------------- */

enum {
    SD_SHARD_RDONLY = 1,  /* read-only: MDB_RDONLY|MDB_NOTLS, no writer lock */
    SD_SHARD_CREATE = 2,  /* create the file when missing (writer only) */
    SD_SHARD_NOSYNC = 4,  /* fastest: no fsync per commit (MDB_NOSYNC); synced at close.
                           * A killed process loses nothing, but an OS crash or power
                           * loss before the close may leave a CORRUPT file unless the
                           * filesystem preserves write order: only for files that are
                           * thrown away after a crash (a temp file renamed into place
                           * after the close). */
    SD_SHARD_NOGROW = 8,  /* never grow the map: a full map is SD_ERANGE */
    SD_SHARD_RANDOM = 16, /* reader: random access, no OS read-ahead (MDB_NORDAHEAD) */
    SD_SHARD_NOMETASYNC = 32, /* one fsync per commit instead of two (MDB_NOMETASYNC): an OS
                               * crash may undo the last commit, the file stays consistent */
    SD_SHARD_KEEP_DAMAGED = 64 /* open a file whose pages are damaged instead of refusing it
                                * (sd-verify): sd_shard_damaged says so, and then only
                                * sd_shard_check_pages, sd_shard_salvage and close may be used */
};

typedef struct {
    unsigned flags;      /* SD_SHARD_* */
    size_t map_size;     /* initial map size for a writer; 0 = 256 MiB (or the file size if larger) */
    size_t max_map_size; /* growth limit; 0 = 1 TiB */
} sd_shard_opts;

typedef struct sd_shard sd_shard;

/* Open (or with SD_SHARD_CREATE create) a shard; opts may be NULL (writer,
 * durable, existing file). A shard whose format_version is newer than
 * SD_SHARD_VERSION fails with SD_EUNSUPPORTED and a message naming both.
 * Every page of every tree is checked first (sd_shard_check_pages; deep
 * for a writer): a damaged file fails with SD_EFORMAT naming the first
 * damaged page, never a crash inside LMDB, unless SD_SHARD_KEEP_DAMAGED. */
sd_status sd_shard_open(sd_shard **out, const char *path, const sd_shard_opts *opts, sd_error *err);
/* 1 when the shard was opened with SD_SHARD_KEEP_DAMAGED and its pages are
 * damaged: LMDB must not read it; its databases are not open. */
int sd_shard_damaged(const sd_shard *s);
/* Abort any open batch, sync (NOSYNC mode) and close; the handle is freed
 * even when the final sync fails. */
sd_status sd_shard_close(sd_shard *s, sd_error *err);
/* Force the data to disk (useful in NOSYNC mode at checkpoints). */
sd_status sd_shard_sync(sd_shard *s, sd_error *err);
const char *sd_shard_path(const sd_shard *s);
/* Current map size in bytes (grows in the writer). */
size_t sd_shard_map_size(const sd_shard *s);
/* Take a shard file's writer lock (the exclusive flock a writing
 * sd_shard_open holds on the data file) without opening the shard, for a
 * tool about to rename another file over it: while *fd (close it to release)
 * holds the lock no writer can open the file. Fails with *held = 1 (SD_EIO)
 * when another process is writing the shard, SD_ENOTFOUND when path does
 * not exist. */
sd_status sd_shard_lock_file(const char *path, int *fd, int *held, sd_error *err);
/* Whether an existing path may be replaced by a new shard: a regular file
 * holding a shard, or empty (SD_OK); anything else SD_EFORMAT, naming it;
 * SD_ENOTFOUND when nothing is there. */
sd_status sd_shard_replaceable(const char *path, sd_error *err);
/* path + suffix ("X.shard" + "-lock"), malloc'ed; NULL when out of memory. */
char *sd_shard_path_with(const char *path, const char *suffix);
/* Remove a shard file and the LMDB lock file beside it (a temporary
 * output given up); errors are ignored, as for unlink. */
void sd_shard_remove_files(const char *path);

/* ---- damaged pages ---------------------------------------------------------- */

/* The named databases of a shard. */
typedef enum {
    SD_SHARD_DB_LATENTS = 0,
    SD_SHARD_DB_TEXT,
    SD_SHARD_DB_NAMES,   /* key = name, val = record key */
    SD_SHARD_DB_BUCKETS, /* key = 8-byte bucket, val = uint64 LE count */
    SD_SHARD_DB_BINDEX,  /* key = 8-byte bucket, val = record key */
    SD_SHARD_DB_META
} sd_shard_db;


/* What a page walk found. */
typedef struct {
    uint64_t pages;    /* branch and leaf pages read */
    uint64_t overflow; /* overflow runs (values of more than about half a page) */
    uint64_t damage;   /* damaged pages, nodes, runs and counts */
    uint64_t hidden;   /* of those, the ones in LMDB's directory or a named database (not the
                        * freelist), and a page both free and in a tree: entries the walk could
                        * not reach, or may have read from a freed page */
    uint64_t records;  /* latent records the latents database's header counts */
    int directory;     /* LMDB's directory of databases is damaged or lacks one of sdtk's:
                        * no entry can be told to belong to a database (salvage refuses) */
    char first[400];   /* the first damage, described ("the latents database's page 12: ...") */
} sd_shard_pages;

/* One entry of a named database met by a page walk (key and value valid
 * only during the call); a failure stops the walk. */
typedef sd_status (*sd_shard_entry_fn)(void *ctx, sd_shard_db db, const void *key, size_t klen, const void *val,
                                       size_t vlen, sd_error *err);

/* Walk every page of the newest snapshot's trees (LMDB's own directory of
 * databases, each named database, the dup trees, the freelist) with pread,
 * bounds-checking every page header, node and overflow pointer against the
 * page and the file, so that nothing LMDB's cursors would read lies outside
 * them, plus the few values LMDB asserts on or trusts (database flags,
 * key sizes, two keys per branch page, each tree's entry count, freelist
 * entries in descending order). deep also reads each overflow run's first
 * page and finds pages used twice, listed free twice, or both used and free.
 * Damage is counted in out (a damaged page's subtree is skipped, the
 * walk goes on), not returned: the result is an error only for I/O, memory,
 * a writer rewriting the file throughout, or fn's own failure. fn (may be
 * NULL) gets every entry of the latents, text, meta, names, buckets and
 * bindex databases on intact pages, in key order. O(pages) reads. */
sd_status sd_shard_check_pages(sd_shard *s, int deep, sd_shard_entry_fn fn, void *ctx, sd_shard_pages *out,
                               sd_error *err);

/* What a salvage copied and dropped. */
typedef struct {
    sd_shard_pages found; /* the deep walk before the copy */
    uint64_t latents, texts, meta; /* entries copied */
    uint64_t dropped;     /* entries not copied: records the store refuses (sd_shard_put's checks), meta not text */
    int older;            /* 1: the snapshot before the newest was walked too (the other meta page),
                           * since the newest one's damage hid entries (not only its freelist) */
    int older_only;       /* 1: only it (the newest one's directory of databases is damaged) */
    sd_shard_pages older_found; /* its walk */
    uint64_t from_older;  /* entries (of latents, meta, texts above) found only in it */
    char kept[4200];      /* where the damaged file was kept (PATH.damaged), "" when it was not replaced */
} sd_shard_salvage_counts;

/* Replace a damaged shard (opened as writer, so no other writer runs) with
 * a new file holding every latent record, text embedding and meta entry on
 * its intact pages, the indexes rebuilt from the records: written under a
 * temporary name beside it, synced, renamed over it under both files' writer
 * locks, the old LMDB lock file removed (the protocol of sd-pack's
 * replacements); the damaged file stays as PATH.damaged (a hard link,
 * c->kept). The entries the newest snapshot's damaged pages hide are then
 * taken from the snapshot before it (LMDB's other meta page, intact until
 * the next commit; a write copies every page from the root down to what it
 * changes, so damage to a recent root or branch page hides the most
 * records, and the older snapshot still reaches them through its own
 * copies): an entry missing from the newest snapshot's intact pages (and
 * not dropped there), or a latent record whose name they lack, is copied
 * from the older one; what the last commit alone wrote, or deleted, may
 * then be missing, or back (the record checks after a salvage find a
 * deleted bad record again). A newest snapshot whose only damage is in its
 * freelist hides nothing: the older one is not read then. Refused, with *s
 * still open and nothing changed, when LMDB's directory of databases is
 * damaged in the newest snapshot and there is no older one with it intact
 * (nothing could be told apart), or either snapshot holds a newer format
 * (the store could not put those records), and left
 * so when the copy fails (a full disk). After the rename *s is closed and
 * reopened on the new file (on a failure from the rename on: closed, NULL).
 * Records on pages damaged in both snapshots are missing from the new file:
 * a rerun of sd-latents computes them again. */
sd_status sd_shard_salvage(sd_shard **s, sd_shard_salvage_counts *c, sd_error *err);

/* ---- metadata -------------------------------------------------------------- */

/* Set one meta entry; inside a batch it joins the batch, else it commits. */
sd_status sd_shard_meta_set(sd_shard *s, const char *key, const char *value, sd_error *err);
/* Get one meta entry as a malloc'ed NUL-terminated string; SD_ENOTFOUND when absent. */
sd_status sd_shard_meta_get(sd_shard *s, const char *key, char **value, sd_error *err);

/* ---- records (format: docs/FORMATS.md) ----------------------------------- */

typedef enum { SD_REC_LATENT = 1, SD_REC_TEXT = 2 } sd_rec_kind;

/* What a tensor is. Latent records hold SAMPLE (and SAMPLE_FLIP), or
 * MEAN+STD (and MEAN_FLIP+STD_FLIP), and with flag SD_REC_F_MASK a MASK
 * (record version 2); text records hold HIDDEN (SD1/SD2: one encoder) or
 * HIDDEN1+HIDDEN2+POOLED (SDXL), or any subset of those. */
typedef enum {
    SD_ROLE_SAMPLE = 1,
    SD_ROLE_SAMPLE_FLIP = 2,
    SD_ROLE_MEAN = 3,
    SD_ROLE_STD = 4,
    SD_ROLE_MEAN_FLIP = 5,
    SD_ROLE_STD_FLIP = 6,
    SD_ROLE_MASK = 7, /* loss weight per pixel, 0..1, fp32 [bucket_h, bucket_w] or [bucket_h/8, bucket_w/8];
                       * unflipped: a flipped variant's mask is this one mirrored */
    SD_ROLE_HIDDEN = 16,
    SD_ROLE_HIDDEN1 = 17,
    SD_ROLE_HIDDEN2 = 18,
    SD_ROLE_POOLED = 19
} sd_tensor_role;

enum {
    SD_REC_F_FLIPPED = 1,    /* a flipped variant is present */
    SD_REC_F_MEANSTD = 2,    /* mean+std of the latent distribution, not a sample */
    SD_REC_F_CROP_FLOAT = 4, /* crop holds kohya's crop_ltrb, not the box cut (earlier
                              * import-kohya versions; now only a crop_ltrb that is not
                              * sd-scripts' value for the record's size and bucket) */
    SD_REC_F_TRANSPOSED = 8, /* the image file stores it transposed (EXIF orientation 5-8):
                              * orig_w/orig_h are the displayed size, the stored one is
                              * (orig_h, orig_w), the size sd-scripts names its npz by */
    SD_REC_F_MASK = 16,      /* a loss mask (SD_ROLE_MASK) is present: record version 2 */
    SD_REC_F_ALL = 31
};

typedef struct {
    uint8_t dtype;        /* sd_dtype */
    uint8_t role;         /* sd_tensor_role */
    uint8_t ndim;         /* 1..4 */
    uint32_t shape[4];    /* unused dims 0 */
    uint32_t offset;      /* byte offset inside the payload (16-aligned); set by build */
    uint32_t length;      /* bytes = product(shape) * dtype size; set by build */
    const void *data;     /* build: input bytes; parse: pointer into the value */
} sd_shard_tensor;

typedef struct {
    uint8_t kind;          /* sd_rec_kind */
    uint16_t flags;        /* SD_REC_F_* */
    uint32_t orig_w, orig_h;
    double crop[4];        /* l, t, r, b: the box cut from the resized image (sd-bucket `crop`) */
    uint32_t bucket_w, bucket_h;
    uint8_t text_ref[16];  /* key of the text-embedding record; zeros = none */
    const char *name;      /* record name (sd-meta `key`), not NUL-terminated on parse */
    size_t name_len;       /* 0..511 */
    int ntensors;          /* 1..4 (1..5 with a mask) */
    sd_shard_tensor t[SD_SHARD_MAX_TENSORS];
    /* filled by parse (and by build): */
    const void *payload;
    uint32_t payload_off, payload_len;
    uint64_t payload_hash; /* XXH3-64 of the payload, as stored */
} sd_shard_rec;

/* Serialized size of r: header + name + aligned tensors. */
size_t sd_shard_rec_size(const sd_shard_rec *r);
/* Lay out header + name + tensors (from r->t[i].data) at the end of out
 * (cleared first), computing offsets, lengths and both checksums. Validates
 * r as parse would. */
sd_status sd_shard_rec_build(const sd_shard_rec *r, sd_buf *out, sd_error *err);
/* Validate a stored value without trusting any field (magic, version, sizes,
 * offsets in bounds, alignment, no overlap, dtype/shape/role consistency,
 * flags, header checksum) and describe it; pointers in out point into val.
 * Does NOT hash the payload: see sd_shard_rec_check_payload. */
sd_status sd_shard_rec_parse(const void *val, size_t len, sd_shard_rec *out, sd_error *err);
/* Recompute the payload's XXH3-64 and compare with the stored one. */
sd_status sd_shard_rec_check_payload(const sd_shard_rec *r, sd_error *err);
/* A loss mask reduced by f on each side as sd-scripts' area interpolation
 * does (the mean of each f x f block; formats/shard_mask.c): src fp32
 * [mh, mw] bytes, out [mh / f, mw / f], mirrored when flip. */
void sd_shard_mask_reduce(const void *src, int mh, int mw, int f, int flip, float *out);
/* Find a tensor by role; NULL when absent. */
const sd_shard_tensor *sd_shard_rec_tensor(const sd_shard_rec *r, int role);

/* ---- writing: batches ------------------------------------------------------ */

/* Start a batch (one LMDB write transaction). Every operation until commit
 * is kept (copied) by the shard so it can be replayed when the map is full:
 * abort, double the map (up to max_map_size), replay. */
sd_status sd_shard_begin(sd_shard *s, sd_error *err);
/* Put a latent record (built by sd_shard_rec_build) under key, replacing an
 * existing one; updates buckets, bindex and names. The value is parsed and
 * rejected when invalid. Outside a batch it is its own batch. */
sd_status sd_shard_put(sd_shard *s, const void *key, size_t klen, const void *val, size_t vlen, sd_error *err);
/* Put a text-embedding record under its 16-byte content hash. */
sd_status sd_shard_put_text(sd_shard *s, const uint8_t hash[16], const void *val, size_t vlen, sd_error *err);
/* Delete a latent record and its buckets/bindex/names entries, also when its
 * value is corrupt (the index entries are then found by scanning bindex
 * and names for the key). SD_ENOTFOUND when absent. */
sd_status sd_shard_del(sd_shard *s, const void *key, size_t klen, sd_error *err);
/* Delete a text-embedding record. SD_ENOTFOUND when absent. */
sd_status sd_shard_del_text(sd_shard *s, const uint8_t hash[16], sd_error *err);
/* Commit the batch (durable unless NOSYNC or NOMETASYNC). On failure nothing of the batch
 * is stored and the shard is as it was before sd_shard_begin. */
sd_status sd_shard_commit(sd_shard *s, sd_error *err);
/* Drop the batch. */
void sd_shard_abort(sd_shard *s);
/* Rebuild buckets and bindex from the latent records, add missing names
 * entries and drop names whose record is gone (sd-verify --repair). Joins
 * the open batch, else is its own. O(records). */
sd_status sd_shard_reindex(sd_shard *s, sd_error *err);
/* Bytes of operations kept for replay in the open batch (to size batches). */
size_t sd_shard_batch_bytes(const sd_shard *s);

/* Resume helpers for the writer: they see the open batch's own puts.
 * *found is set to 1 or 0. */
sd_status sd_shard_exists(sd_shard *s, const void *key, size_t klen, int *found, sd_error *err);
sd_status sd_shard_text_exists(sd_shard *s, const uint8_t hash[16], int *found, sd_error *err);
sd_status sd_shard_name_exists(sd_shard *s, const char *name, size_t nlen, int *found, sd_error *err);
/* A copy of a latent record's value (the open batch's puts included) into out. */
sd_status sd_shard_peek(sd_shard *s, const void *key, size_t klen, sd_buf *out, int *found, sd_error *err);

/* ---- reading --------------------------------------------------------------- */

typedef struct sd_shard_txn sd_shard_txn;

/* A read transaction: a consistent snapshot; pointers returned by get and
 * cursors stay valid until it ends or resets. One per thread at a time. */
sd_status sd_shard_read_begin(sd_shard *s, sd_shard_txn **out, sd_error *err);
void sd_shard_read_end(sd_shard_txn *t);
/* Release the snapshot but keep the handle; renew takes a fresh snapshot
 * (cheap: for trainers refreshing between epochs). */
void sd_shard_read_reset(sd_shard_txn *t);
sd_status sd_shard_read_renew(sd_shard_txn *t, sd_error *err);

/* Zero-copy get of a latent record / a text-embedding record; SD_ENOTFOUND
 * when absent. *val points into the map (read-only, valid inside t). */
sd_status sd_shard_get(sd_shard_txn *t, const void *key, size_t klen, const void **val, size_t *vlen, sd_error *err);
sd_status sd_shard_get_text(sd_shard_txn *t, const uint8_t hash[16], const void **val, size_t *vlen, sd_error *err);
/* Record key of a record name; SD_ENOTFOUND when absent. */
sd_status sd_shard_get_name(sd_shard_txn *t, const char *name, size_t nlen, const void **key, size_t *klen, sd_error *err);

/* Whether bindex holds (bucket (w, h), record key): sd-verify's check that
 * a record is findable through its bucket. */
sd_status sd_shard_index_has(sd_shard_txn *t, uint32_t w, uint32_t h, const void *key, size_t klen, int *found,
                             sd_error *err);

/* Number of entries of one database. */
sd_status sd_shard_count(sd_shard_txn *t, sd_shard_db db, uint64_t *n, sd_error *err);

typedef struct {
    uint32_t w, h;
    uint64_t count;
} sd_shard_bucket;

/* All buckets with their record counts, sorted by (w, h); *out is malloc'ed. */
sd_status sd_shard_buckets(sd_shard_txn *t, sd_shard_bucket **out, size_t *n, sd_error *err);

/* Cursors: iterate one database in key order, or one bucket's records. */
typedef struct sd_shard_cursor sd_shard_cursor;
sd_status sd_shard_cursor_open(sd_shard_txn *t, sd_shard_db db, sd_shard_cursor **out, sd_error *err);
/* Cursor over the record keys of bucket (w, h) (bindex duplicates); next()
 * yields key = record key, val = that record (looked up; NULL with vlen 0
 * when the index points to a missing record). */
sd_status sd_shard_cursor_bucket(sd_shard_txn *t, uint32_t w, uint32_t h, sd_shard_cursor **out, sd_error *err);
/* Position so that the next call of next() yields the first entry with
 * key >= key (plain database cursors only). */
sd_status sd_shard_cursor_seek(sd_shard_cursor *c, const void *key, size_t klen, sd_error *err);
/* Next entry; SD_ENOTFOUND at the end. Pointers valid inside the txn. */
sd_status sd_shard_cursor_next(sd_shard_cursor *c, const void **key, size_t *klen, const void **val, size_t *vlen,
                               sd_error *err);
void sd_shard_cursor_close(sd_shard_cursor *c);

/* Encode / decode a bucket index key (8 bytes, big-endian w then h, so LMDB
 * sorts buckets by width then height). */
void sd_shard_bucket_key(uint32_t w, uint32_t h, uint8_t out[8]);
void sd_shard_bucket_unkey(const uint8_t in[8], uint32_t *w, uint32_t *h);

#endif
