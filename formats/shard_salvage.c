/* Salvage of a shard whose pages are damaged (sd-verify --repair): LMDB
 * cannot be asked to delete the bad records of such a file, since reading
 * its damaged pages would crash it and writing into it would spread the
 * damage. So the entries of the intact pages are read by the page walk
 * (shard_pages.c) and put into a new file, which replaces the damaged one. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keyset.h"
#include "log.h"
#include "outfile.h"
#include "shard_int.h"

enum { BATCH_OPS = 4096, BATCH_BYTES = 64 << 20 };

typedef struct {
    sd_shard *out;
    sd_shard_salvage_counts *c;
    size_t batch;      /* operations in the open batch */
    int second;      /* the older snapshot's walk after the newest one's: only what that did not give */
    sd_keyset given; /* the entries (database and key) the newest walk copied, and apart (the
                      * database's id with its top bit set) those it dropped: kept only when
                      * the older snapshot is walked after it */
} copier;

/* Commit the open batch, if any. */
static sd_status flush(copier *cp, sd_error *err)
{
    if (!cp->batch) return SD_OK;
    cp->batch = 0;
    return sd_shard_commit(cp->out, err);
}

/* A meta entry as two C strings; 0 when a NUL inside makes it no text. */
static int meta_text(const void *key, size_t klen, const void *val, size_t vlen, char **k, char **v)
{
    *k = *v = NULL;
    if (memchr(key, 0, klen) || memchr(val, 0, vlen)) return 0;
    *k = malloc(klen + 1);
    *v = malloc(vlen + 1);
    if (*k && *v) {
        memcpy(*k, key, klen);
        (*k)[klen] = 0;
        memcpy(*v, val, vlen);
        (*v)[vlen] = 0;
    }
    return 1;
}

/* Why a record of the damaged file is not copied, or NULL: the checks
 * sd_shard_put makes, made first so that a failed put can only be the new
 * file's own failure (I/O, memory), which stops the salvage; and the
 * payload's checksum, so that a record whose bytes are damaged is not
 * copied (the record checks after the salvage would delete it) and the
 * older snapshot's sound copy, where there is one, is taken instead. */
static const char *refused(sd_shard_db db, size_t klen, const void *val, size_t vlen, sd_error *why)
{
    sd_shard_rec r;
    if (klen == 0 || klen > SD_SHARD_MAX_KEY || (db == SD_SHARD_DB_TEXT && klen != SD_SHARD_TEXT_KEY))
        return "a key of a wrong length";
    if (sd_shard_rec_parse(val, vlen, &r, why)) return why->msg;
    if (r.kind != (db == SD_SHARD_DB_TEXT ? SD_REC_TEXT : SD_REC_LATENT)) return "a record of the other kind";
    if (sd_shard_rec_check_payload(&r, why)) return why->msg;
    return NULL;
}

/* Why a variants entry is not copied: what sd_shard_get_variants would
 * refuse; NULL when it is whole keys. */
static const char *refused_variants(size_t klen, size_t vlen)
{
    if (klen == 0 || klen > SD_SHARD_MAX_KEY) return "a key of a wrong length";
    if (vlen % SD_SHARD_TEXT_KEY || vlen < 2 * SD_SHARD_TEXT_KEY || vlen > SD_SHARD_MAX_VARIANTS * SD_SHARD_TEXT_KEY)
        return "a variants entry that is not 2..64 text keys";
    return NULL;
}

/* An entry's identity across the two walks: its database and key, and
 * whether the newest walk dropped it (not copied). */
static sd_key128 entry_id(sd_shard_db db, int dropped, const void *key, size_t klen)
{
    unsigned char d = (unsigned char)((unsigned)db | (dropped ? 0x80u : 0u));
    return sd_key128_of2(&d, 1, key, klen);
}

/* Remember (the newest walk) or look up (the older walk: *was 1 when it was
 * there) an entry's identity; an insert answers both. */
static sd_status note_entry(copier *cp, sd_shard_db db, int dropped, const void *key, size_t klen, int *was,
                            sd_error *err)
{
    int fresh = sd_keyset_insert(&cp->given, entry_id(db, dropped, key, klen));
    if (fresh < 0) return sd_err_set(err, SD_ENOMEM, "out of memory");
    if (was) *was = !fresh;
    return SD_OK;
}

/* Whether the newest snapshot's walk copied this entry (the older
 * snapshot's walk: the newest snapshot's entry wins), or for a latent
 * record a record of its name (a name keeps one record, the newest). An
 * entry the newest walk dropped is not seen: the older snapshot's copy may
 * be sound. The new file's own created and format_version, written at its
 * creation, were not copied by the walk, so the older snapshot's replace
 * them where the newest gave none. The name is looked up through the
 * writer, which sees its own open batch: no read transaction stays open
 * while the copy may grow the map. */
static sd_status seen_already(copier *cp, sd_shard_db db, const void *key, size_t klen, const void *val,
                              size_t vlen, int *seen, sd_error *err)
{
    sd_status st = note_entry(cp, db, 0, key, klen, seen, err);
    sd_shard_rec r;
    sd_error why;
    if (!st && !*seen && db == SD_SHARD_DB_LATENTS && sd_shard_rec_parse(val, vlen, &r, &why) == SD_OK &&
        r.name_len > 0)
        st = sd_shard_name_exists(cp->out, r.name, r.name_len, seen, err);
    return st;
}

/* Put one entry of the damaged file into the new one: records that pass
 * the store's checks (the others are counted as dropped and the copy goes
 * on), meta entries that are text; the index databases are not copied, the
 * puts rebuild them from the records. */
static sd_status copy_entry(void *ctx, sd_shard_db db, const void *key, size_t klen, const void *val, size_t vlen,
                            sd_error *err)
{
    copier *cp = ctx;
    if (db != SD_SHARD_DB_LATENTS && db != SD_SHARD_DB_TEXT && db != SD_SHARD_DB_META && db != SD_SHARD_DB_VARIANTS)
        return SD_OK;
    if (cp->second) {
        int seen = 0;
        sd_status sst = seen_already(cp, db, key, klen, val, vlen, &seen, err);
        if (sst || seen) return sst;
    }
    int keep = cp->c->older && !cp->c->older_only && !cp->second; /* the newest walk, with the older to come */
    sd_error why;
    const char *no = db == SD_SHARD_DB_META       ? NULL
                     : db == SD_SHARD_DB_VARIANTS ? refused_variants(klen, vlen)
                                                  : refused(db, klen, val, vlen, &why);
    char *k = NULL, *v = NULL;
    if (db == SD_SHARD_DB_META && !meta_text(key, klen, val, vlen, &k, &v)) no = "a meta entry that is not text";
    if (no) {
        free(k);
        free(v);
        int twice = 0; /* the older snapshot's copy as bad as the newest one's: counted once */
        sd_status dst = keep || cp->second ? note_entry(cp, db, 1, key, klen, &twice, err) : SD_OK;
        if (dst) return dst;
        if (!twice) cp->c->dropped++;
        sd_log(SD_LOG_DEBUG, "salvage into %s drops %s entry: %s", sd_shard_path(cp->out), sd_shard_db_name(db), no);
        return SD_OK;
    }
    sd_status st = cp->batch ? SD_OK : sd_shard_begin(cp->out, err);
    uint64_t variants = 0; /* variants entries are copied, not counted (a record's companion) */
    uint64_t *count = db == SD_SHARD_DB_META       ? &cp->c->meta
                      : db == SD_SHARD_DB_TEXT     ? &cp->c->texts
                      : db == SD_SHARD_DB_VARIANTS ? &variants
                                                   : &cp->c->latents;
    if (!st) {
        cp->batch++;
        st = db == SD_SHARD_DB_VARIANTS ? sd_shard_put_variants(cp->out, key, klen, val, vlen / SD_SHARD_TEXT_KEY, err)
             : db == SD_SHARD_DB_LATENTS ? sd_shard_put(cp->out, key, klen, val, vlen, err)
             : db == SD_SHARD_DB_TEXT  ? sd_shard_put_text(cp->out, key, val, vlen, err)
             : k && v                  ? sd_shard_meta_set(cp->out, k, v, err)
                                       : sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    if (!st) (*count)++;
    if (!st && cp->second) cp->c->from_older++;
    if (!st && keep) st = note_entry(cp, db, 0, key, klen, NULL, err);
    free(k);
    free(v);
    if (!st && (cp->batch >= BATCH_OPS || sd_shard_batch_bytes(cp->out) >= BATCH_BYTES)) st = flush(cp, err);
    return st;
}

/* Write the intact entries of s into the new file tmp (created empty):
 * the newest snapshot's, then what only the older snapshot still reaches;
 * when the newest one's directory of databases is damaged, the older
 * snapshot's entries alone, all of them (its created and format_version
 * too, over the new file's own). */
static sd_status copy_into(sd_shard *s, const char *tmp, sd_shard_salvage_counts *c, sd_error *err)
{
    sd_shard_opts so = {SD_SHARD_CREATE | SD_SHARD_NOSYNC, 0, 0};
    copier cp = {NULL, c, 0, 0, {0}};
    sd_keyset_init(&cp.given);
    sd_status st = sd_shard_open(&cp.out, tmp, &so, err);
    if (st) {
        sd_keyset_free(&cp.given);
        return st;
    }
    if (!c->older_only) st = sd_shard_check_pages(s, 1, copy_entry, &cp, &c->found, err);
    if (!st) st = flush(&cp, err);
    cp.second = !c->older_only;
    if (!st && c->older) st = sd_shard_walk_snapshot(s, 1, 1, copy_entry, &cp, &c->older_found, err);
    if (!st) st = flush(&cp, err);
    if (!st && c->older_only) c->from_older = c->latents + c->texts + c->meta;
    sd_keyset_free(&cp.given);
    if (st && cp.batch) sd_shard_abort(cp.out);
    sd_error e2;
    sd_status cst = sd_shard_close(cp.out, st ? &e2 : err); /* NOSYNC: the close syncs */
    return st ? st : cst;
}

/* Rename tmp over the damaged file (whose writer lock *s holds) under
 * tmp's own writer lock, so that no writer opens the new file while the
 * old file's -lock is still beside it; then that -lock goes. */
static sd_status publish(sd_shard *s, const char *tmp, sd_error *err)
{
    int fd = -1, held = 0;
    sd_status st = sd_shard_lock_file(tmp, &fd, &held, err);
    char *names[2] = {(char *)tmp, s->path};
    int tried = 0;
    if (!st) st = sd_rename_set(names, names + 1, 1, &tried, err);
    if (!st) {
        char *lock = sd_shard_path_with(s->path, "-lock");
        if (lock) unlink(lock);
        free(lock);
    }
    if (fd >= 0) close(fd);
    return st;
}

/* What the first walk finds that forbids a salvage by this sdtk. */
typedef struct {
    int newer_shard;      /* format_version above SD_SHARD_VERSION */
    uint64_t newer_records; /* records of a newer format (the store could not put them) */
} survey;

/* One entry of the first walk: the format version and newer records. */
static sd_status survey_entry(void *ctx, sd_shard_db db, const void *key, size_t klen, const void *val, size_t vlen,
                              sd_error *err)
{
    (void)err;
    survey *sv = ctx;
    sd_shard_rec r;
    sd_error e;
    if (db == SD_SHARD_DB_META && klen == strlen(SD_SHARD_META_VERSION) && !memcmp(key, SD_SHARD_META_VERSION, klen)) {
        char buf[16];
        size_t n = vlen < sizeof buf - 1 ? vlen : sizeof buf - 1;
        memcpy(buf, val, n);
        buf[n] = 0;
        sv->newer_shard |= atol(buf) > SD_SHARD_VERSION; /* in either snapshot */
    } else if ((db == SD_SHARD_DB_LATENTS || db == SD_SHARD_DB_TEXT) &&
               sd_shard_rec_parse(val, vlen, &r, &e) == SD_EUNSUPPORTED) {
        sv->newer_records++;
    }
    return SD_OK;
}

/* Walk once before copying: a salvage needs the directory of databases
 * (without it no entry can be told to belong to one, and a copy would be
 * an empty shard renamed over records that may still be there) of the
 * newest snapshot or of the one before it, and must not drop what only a
 * newer sdtk can read. Sets whether the older snapshot is walked too. */
static sd_status check_salvageable(sd_shard *s, sd_shard_salvage_counts *c, sd_error *err)
{
    survey sv = {0, 0};
    sd_status st = sd_shard_check_pages(s, 1, survey_entry, &sv, &c->found, err);
    if (st) return st;
    /* the older snapshot only where the newest one's damage hides entries (not a damaged freelist):
     * it may hold what the last commit deleted */
    int hides = c->found.directory || c->found.hidden > 0, have_older = 0;
    if (hides) {
        sd_error none;
        st = sd_shard_walk_snapshot(s, 1, 1, survey_entry, &sv, &c->older_found, &none);
        if (st && st != SD_ENOTFOUND) return sd_err_set(err, st, "%s", none.msg);
        have_older = !st;
    }
    c->older = have_older && !c->older_found.directory;
    c->older_only = c->older && c->found.directory;
    if (c->found.directory && !c->older)
        return sd_err_set(err, SD_EFORMAT,
                          "%s: not salvaged: LMDB's directory of databases is damaged (%s)%s, so no record can be told "
                          "apart; restore the file from a copy or rebuild it",
                          s->path, c->found.first,
                          have_older ? ", in the snapshot before the newest too"
                                     : " and the file holds no earlier snapshot to take it from");
    if (sv.newer_shard || sv.newer_records)
        return sd_err_set(err, SD_EUNSUPPORTED,
                          "%s: not salvaged: it holds %s of a newer format than this sdtk writes; repair it with the "
                          "sdtk that wrote it",
                          s->path, sv.newer_shard ? "a shard" : "records");
    return SD_OK;
}

/* Keep the damaged file under PATH.damaged (or .damaged-2 ...), a hard
 * link made before the new file replaces it: the records the salvage could
 * not reach are then still there for a closer look, at no cost in space. */
static sd_status keep_original(sd_shard *s, sd_shard_salvage_counts *c, sd_error *err)
{
    for (int i = 1; i < 100; i++) {
        int n = i == 1 ? snprintf(c->kept, sizeof c->kept, "%s.damaged", s->path)
                       : snprintf(c->kept, sizeof c->kept, "%s.damaged-%d", s->path, i);
        if (n < 0 || (size_t)n >= sizeof c->kept) break;
        if (link(s->path, c->kept) == 0) return SD_OK;
        if (errno != EEXIST)
            return sd_err_set(err, SD_EIO, "%s: cannot keep it as %s: %s", s->path, c->kept, strerror(errno));
    }
    c->kept[0] = 0;
    return sd_err_set(err, SD_EIO, "%s: cannot find a free name to keep it under (%s.damaged...)", s->path, s->path);
}

/* See shard.h. */
sd_status sd_shard_salvage(sd_shard **sp, sd_shard_salvage_counts *c, sd_error *err)
{
    sd_shard *s = *sp;
    memset(c, 0, sizeof *c);
    if (s->flags & SD_SHARD_RDONLY) return sd_err_set(err, SD_EINVAL, "%s: salvage needs the writer lock", s->path);
    sd_status st = check_salvageable(s, c, err);
    if (!st) st = keep_original(s, c, err);
    if (st) return st; /* *s stays open: nothing was changed */
    sd_outfile_warn_leftovers(s->path, ".salvage-", " (and its -lock)"); /* before this salvage's own */
    char *tmp = sd_shard_path_with(s->path, ".salvage-XXXXXX");
    int fd = tmp ? mkstemp(tmp) : -1;
    struct stat sb;
    if (!tmp) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    else if (fd < 0) st = sd_err_set(err, SD_EIO, "%s: cannot create a file beside it: %s", s->path, strerror(errno));
    else {
        if (fstat(s->lock_fd, &sb) == 0) fchmod(fd, sb.st_mode & 07777);
        close(fd);
        st = copy_into(s, tmp, c, err);
        if (st) sd_shard_remove_files(tmp);
    }
    if (st) { /* nothing replaced: *s stays open, the original where it was */
        unlink(c->kept);
        c->kept[0] = 0;
        free(tmp);
        return st;
    }
    unsigned flags = s->flags;
    st = publish(s, tmp, err); /* on a failure here the copy at PATH.damaged stays */
    char *lock = sd_shard_path_with(tmp, "-lock");
    if (lock) unlink(lock);
    if (st) unlink(tmp);
    free(lock);
    free(tmp);
    char *path = strdup(s->path);
    sd_error e2;
    sd_shard_close(s, &e2);
    *sp = NULL;
    if (!path) return st ? st : sd_err_set(err, SD_ENOMEM, "out of memory");
    if (!st) {
        sd_shard_opts so = {flags & ~(unsigned)SD_SHARD_CREATE, 0, 0};
        st = sd_shard_open(sp, path, &so, err);
    }
    free(path);
    return st;
}
