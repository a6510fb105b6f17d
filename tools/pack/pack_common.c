#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bucket.h"
#include "log.h"
#include "outfile.h"
#include "pack.h"

enum { BATCH_OPS = 512 };
static const size_t BATCH_BYTES = (size_t)64 << 20;

/* A fresh, empty file beside path (PATH.partial-XXXXXX, mkstemp): the
 * temporary shard of a merge, compact or split. Being new, it can never be
 * one of the inputs, and no existing file is removed to make room for it. */
static sd_status make_temp(const char *path, char **out, sd_error *err)
{
    sd_outfile_warn_leftovers(path, ".partial-", " (and its -lock)");
    *out = sd_shard_path_with(path, ".partial-XXXXXX");
    if (!*out) return sd_err_set(err, SD_ENOMEM, "out of memory");
    int fd = mkstemp(*out);
    if (fd < 0) {
        sd_status st =
            sd_err_set(err, SD_EIO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        free(*out);
        *out = NULL;
        return st;
    }
    fchmod(fd, 0644);
    close(fd);
    return SD_OK;
}

/* Open the output shard. Without RESUME (merge, compact, split) the shard
 * is built under a fresh temporary name (make_temp) and renamed into place
 * by pack_out_publish, so PATH is whole or untouched; its commits skip
 * fsync (MDB_NOSYNC), which is safe only because a temp file interrupted by
 * a crash is never used again and the finished one is synced before the
 * rename. With RESUME (import) an existing PATH is extended in place and an
 * existing PATH.partial from a killed run is picked up where it stopped;
 * both outlive a crash, so their commits keep the file consistent
 * (MDB_NOMETASYNC: an OS crash may undo the last commit, never corrupt).
 * REPLACE is kept for the publish. */
sd_status pack_out_open(pack_out *o, const char *path, unsigned mode, sd_error *err)
{
    memset(o, 0, sizeof *o);
    o->mode = mode;
    int resume = (mode & PACK_OUT_RESUME) != 0;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return sd_err_set(err, SD_EINVAL, "%s: is a directory", path);
    o->final = strdup(path);
    if (!o->final) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status s = SD_OK;
    if (!resume) s = make_temp(path, &o->tmp, err);
    else if (stat(path, &st) != 0) {
        o->tmp = sd_shard_path_with(path, ".partial");
        if (!o->tmp) s = sd_err_set(err, SD_ENOMEM, "out of memory");
        else if (stat(o->tmp, &st) != 0) sd_shard_remove_files(o->tmp);
    }
    sd_shard_opts opts = {SD_SHARD_CREATE | (resume ? SD_SHARD_NOMETASYNC : SD_SHARD_NOSYNC), 0, 0};
    if (!s) s = sd_shard_open(&o->s, o->tmp ? o->tmp : path, &opts, err);
    if (s) {
        if (o->tmp && !resume) sd_shard_remove_files(o->tmp);
        free(o->final);
        free(o->tmp);
        o->final = o->tmp = NULL;
    }
    return s;
}

/* Count one operation in the open batch and commit when it is big enough. */
static sd_status after_put(pack_out *o, sd_error *err)
{
    o->batch_n++;
    if (o->batch_n >= (o->batch_max ? o->batch_max : BATCH_OPS) || sd_shard_batch_bytes(o->s) >= BATCH_BYTES) return pack_out_flush(o, err);
    return SD_OK;
}

/* Start a batch when none is open. */
static sd_status ensure_batch(pack_out *o, sd_error *err)
{
    if (o->batch_n) return SD_OK;
    sd_status st = sd_shard_begin(o->s, err);
    if (!st) o->batch_n = 1;
    return st;
}

/* Put a latent record in the current batch. */
sd_status pack_out_put(pack_out *o, const void *key, size_t klen, const void *val, size_t vlen, sd_error *err)
{
    sd_status st = ensure_batch(o, err);
    if (!st) st = sd_shard_put(o->s, key, klen, val, vlen, err);
    return st ? st : after_put(o, err);
}

/* Put a text-embedding record in the current batch. */
sd_status pack_out_put_text(pack_out *o, const uint8_t hash[16], const void *val, size_t vlen, sd_error *err)
{
    sd_status st = ensure_batch(o, err);
    if (!st) st = sd_shard_put_text(o->s, hash, val, vlen, err);
    return st ? st : after_put(o, err);
}

/* Commit the open batch, if any. */
sd_status pack_out_flush(pack_out *o, sd_error *err)
{
    if (!o->batch_n) return SD_OK;
    o->batch_n = 0;
    return sd_shard_commit(o->s, err);
}

/* Commit the open batch, sync and close the shard: its data is on disk
 * under the temporary name, not yet in place (split closes every part
 * before it publishes any). On failure the output is dropped. */
sd_status pack_out_close(pack_out *o, sd_error *err)
{
    sd_status st = pack_out_flush(o, err);
    if (st) {
        pack_out_abort(o, 0);
        return st;
    }
    st = sd_shard_close(o->s, err);
    o->s = NULL;
    if (st) pack_out_abort(o, 0);
    return st;
}

/* Rename a closed output's temporary file into place and sync the
 * directory; an output written in place only has its names freed. */
sd_status pack_out_publish(pack_out *o, sd_error *err)
{
    return pack_out_publish_set(o, 1, err);
}

/* The refusal of a final name that appeared while this run wrote its
 * output (one that existed at the start was refused then): only --force
 * replaces a file, and import keeps its resumable PATH.partial. */
static sd_status refuse_appeared(const pack_out *o, sd_error *err)
{
    if (o->mode & PACK_OUT_RESUME)
        return sd_err_set(err, SD_EIO, "%s: appeared while this run was writing %s; not replaced (%s kept)", o->final,
                          o->tmp, o->tmp);
    return sd_err_set(err, SD_EIO, "%s: appeared while this run was writing it; not replaced (--force replaces it)",
                      o->final);
}

/* Just before the renames of a publish, take the writer lock of each
 * temporary file (no writer may open the new shard before the final's old
 * -lock file is gone) and of each final name that exists, which only
 * REPLACE may replace and only when no writer holds it: records a writer
 * puts into a file renamed over go to the unlinked file and are lost.
 * fds[i] and fds[n + i] get output i's locks (-1: none); on failure
 * nothing has been renamed. */
static sd_status lock_for_publish(const pack_out *v, long n, int *fds, sd_error *err)
{
    sd_status st = SD_OK;
    for (long i = 0; !st && i < n; i++) {
        int held = 0;
        struct stat sb;
        if (!v[i].tmp) continue; /* written in place: nothing is replaced */
        st = sd_shard_lock_file(v[i].tmp, &fds[n + i], &held, err);
        if (st || lstat(v[i].final, &sb) != 0) continue;
        if (!(v[i].mode & PACK_OUT_REPLACE)) return refuse_appeared(&v[i], err);
        if (sd_shard_replaceable(v[i].final, err) == SD_EFORMAT) return SD_EFORMAT; /* appeared meanwhile */
        st = sd_shard_lock_file(v[i].final, &fds[i], &held, err);
        if (st == SD_ENOTFOUND) st = SD_OK; /* gone meanwhile, or a dangling link: no writer to protect */
        else if (held)
            st = sd_err_set(err, SD_EIO, "%s: being written by another process (it holds the shard's writer lock); "
                            "not replaced, even with --force", v[i].final);
    }
    return st;
}

/* Room for a publish's locks, up to two open files per output (a split
 * into thousands of parts may need more than the usual soft limit of 1024):
 * the soft limit is raised towards the hard one when short; the error says
 * when even that is too low. */
static sd_status room_for_locks(long n, sd_error *err)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)n * 2 + 256; /* and the files already open */
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return SD_OK;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
        return sd_err_set(err, SD_EIO, "publishing %ld outputs under their writer locks needs about %llu open files; "
                          "the limit is %llu (ulimit -n)", n, (unsigned long long)need,
                          (unsigned long long)rl.rlim_max);
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        return sd_err_set(err, SD_EIO, "raising the open-file limit to %llu: %s", (unsigned long long)need,
                          strerror(errno));
    return SD_OK;
}

/* Remove LMDB's lock file beside each renamed final name: it belongs to the
 * replaced data file, and while a process that still has that file open
 * holds it, LMDB would not reset it for the new file, whose readers would
 * take the old file's transaction id from it and read a wrong snapshot (a
 * writer would corrupt the file). The processes holding it keep their own
 * pair of unlinked files; the next opener creates a fresh lock file. */
static void remove_old_locks(const pack_out *v, long renamed)
{
    for (long i = 0; i < renamed; i++) {
        char *lock = v[i].tmp ? sd_shard_path_with(v[i].final, "-lock") : NULL;
        if (lock) unlink(lock);
        free(lock);
    }
}

/* Publish n closed outputs as one set (split's parts): every final name
 * that exists checked and locked (lock_for_publish), every rename back to
 * back, then the lock files of the replaced shards and the temporary ones
 * removed and each directory synced once, so a kill can mix two sets only
 * inside that short run of renames (POSIX renames one file at a time; each
 * part's split_set meta tells the sets apart). A refused final name drops
 * every output (import keeps its PATH.partial) and replaces nothing; a
 * rename that fails drops that output and the ones after it; the error
 * says how many before it were already replaced. */
sd_status pack_out_publish_set(pack_out *v, long n, sd_error *err)
{
    if (n > INT_MAX / 2) return sd_err_set(err, SD_EINVAL, "too many outputs");
    char **names = calloc((size_t)(n > 0 ? n : 1) * 2, sizeof *names); /* tmp[0..n), then final */
    int *fds = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *fds);     /* final's lock, then tmp's */
    if (!names || !fds) {
        free(names);
        free(fds);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (long i = 0; i < n; i++) {
        names[i] = v[i].tmp; /* NULL: written in place */
        names[n + i] = v[i].final;
        fds[i] = fds[n + i] = -1;
    }
    int end = 0;       /* outputs [0, end) were tried */
    long renamed = 0;  /* outputs [0, renamed) are in place */
    sd_status st = room_for_locks(n, err);
    if (!st) st = lock_for_publish(v, n, fds, err);
    int refused = st != SD_OK;
    if (!refused) {
        st = sd_rename_set(names, names + n, (int)n, &end, err);
        renamed = st ? end - 1 : end;
        remove_old_locks(v, renamed);
    }
    for (long i = 0; i < 2 * n; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    free(names);
    for (long i = 0; i < n; i++) {
        if (i >= renamed) pack_out_abort(&v[i], refused && (v[i].mode & PACK_OUT_RESUME));
        char *lock = v[i].tmp ? sd_shard_path_with(v[i].tmp, "-lock") : NULL; /* LMDB's, beside the temp name */
        if (lock) unlink(lock);
        free(lock);
        free(v[i].final);
        free(v[i].tmp);
        v[i].final = v[i].tmp = NULL;
    }
    return st;
}

/* Commit, sync and close; then rename the temporary file into place. */
sd_status pack_out_commit(pack_out *o, sd_error *err)
{
    sd_status st = pack_out_close(o, err);
    return st ? st : pack_out_publish(o, err);
}

/* Drop the open batch and close; the temporary file is removed unless keep
 * (a resumable import keeps what it committed). Safe on a closed output. */
void pack_out_abort(pack_out *o, int keep)
{
    if (o->s) {
        if (o->batch_n) sd_shard_abort(o->s);
        sd_error e;
        sd_shard_close(o->s, &e);
        o->s = NULL;
    }
    o->batch_n = 0;
    if (o->tmp && !keep) sd_shard_remove_files(o->tmp);
    free(o->final);
    free(o->tmp);
    o->final = o->tmp = NULL;
}

/* 1 when something is at path, even a dangling symbolic link: an output
 * renamed there would replace it. */
int pack_path_taken(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* 1 when another process is writing the shard at path (holds its writer
 * lock): checked before a run too, so that an output the publish would
 * refuse is refused before the work. */
int pack_path_busy(const char *path)
{
    int fd = -1, held = 0;
    sd_error e;
    if (sd_shard_lock_file(path, &fd, &held, &e) == SD_OK) close(fd);
    return held;
}

/* 1 when two paths name the same file: the same text, or both exist with
 * the same device and inode (hard links, symlinks, "./x" and "x"). */
int pack_same_file(const char *a, const char *b)
{
    struct stat x, y;
    if (!strcmp(a, b)) return 1;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* Open an input shard read-only with one read transaction. */
sd_status pack_open_ro(sd_shard **s, sd_shard_txn **t, const char *path, sd_error *err)
{
    sd_shard_opts opts = {SD_SHARD_RDONLY, 0, 0};
    *t = NULL;
    sd_status st = sd_shard_open(s, path, &opts, err);
    if (st) return st;
    st = sd_shard_read_begin(*s, t, err);
    if (st) {
        sd_error e;
        sd_shard_close(*s, &e);
        *s = NULL;
    }
    return st;
}

/* Close what pack_open_ro opened. */
void pack_close_ro(sd_shard *s, sd_shard_txn *t)
{
    if (t) sd_shard_read_end(t);
    sd_error e;
    if (s) sd_shard_close(s, &e);
}

/* Copy the meta entries of an input shard (all but format_version and
 * created, which the new shard sets itself, split_set, which names one
 * file's place in one split, not a merge's or another split's, and
 * empty_text, which pack_put_empty_text sets with its embedding so it never
 * names a record the output lacks) and record the producer. */
sd_status pack_copy_meta(sd_shard_txn *from, pack_out *to, const char *producer, sd_error *err)
{
    sd_shard_cursor *c;
    sd_status st = sd_shard_cursor_open(from, SD_SHARD_DB_META, &c, err);
    if (st) return st;
    const void *k, *v;
    size_t kl, vl;
    char key[256], *val = NULL;
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        if (kl >= sizeof key) continue;
        memcpy(key, k, kl);
        key[kl] = 0;
        if (!strcmp(key, SD_SHARD_META_VERSION) || !strcmp(key, SD_SHARD_META_CREATED) ||
            !strcmp(key, SD_SHARD_META_PRODUCER) || !strcmp(key, PACK_META_SPLIT_SET) ||
            !strcmp(key, SD_SHARD_META_EMPTY_TEXT))
            continue;
        char *nv = realloc(val, vl + 1);
        if (!nv) {
            st = sd_err_set(err, SD_ENOMEM, "out of memory");
            break;
        }
        val = nv;
        memcpy(val, v, vl);
        val[vl] = 0;
        st = sd_shard_meta_set(to->s, key, val, err);
    }
    free(val);
    sd_shard_cursor_close(c);
    if (st == SD_ENOTFOUND) st = SD_OK;
    if (!st && producer) st = sd_shard_meta_set(to->s, SD_SHARD_META_PRODUCER, producer, err);
    return st;
}

/* 1 when a record references a text embedding (a non-zero key). */
int pack_has_text_ref(const uint8_t ref[16])
{
    for (int i = 0; i < 16; i++)
        if (ref[i]) return 1;
    return 0;
}

/* The text embedding an input's empty_text meta names: sd-latents stores
 * the empty caption's embedding unreferenced, so no record leads a copy to
 * it and conditioning dropout would find it missing. *found is 1 with its
 * key when the input holds it, sound; 0 when the input has no empty_text,
 * or, with *skip (a reason for the tally) and *why (the detail), when the
 * value is malformed or the embedding missing or corrupt. Only a failure to
 * read is returned. */
sd_status pack_find_empty_text(sd_shard *s, sd_shard_txn *t, uint8_t key[16], int *found, const char **skip,
                               sd_error *why, sd_error *err)
{
    char *v = NULL;
    *found = 0;
    *skip = NULL;
    sd_status st = sd_shard_meta_get(s, SD_SHARD_META_EMPTY_TEXT, &v, err);
    if (st == SD_ENOTFOUND) return SD_OK;
    if (st) return st;
    int ok = sd_shard_text_key_parse(v, key);
    if (!ok) {
        *skip = "empty_text meta malformed";
        sd_err_set(why, SD_EFORMAT, "meta empty_text '%.64s' is not a 32-hex-digit text key", v);
    }
    free(v);
    if (!ok) return SD_OK;
    const void *tv;
    size_t tl;
    char hex[40];
    pack_hex(key, 16, hex, sizeof hex);
    st = sd_shard_get_text(t, key, &tv, &tl, why);
    if (st == SD_ENOTFOUND) {
        *skip = "empty_text embedding missing";
        sd_err_set(why, SD_ENOTFOUND, "meta empty_text names text embedding %s, which is not in the shard", hex);
        return SD_OK;
    }
    if (st) {
        *err = *why;
        return st;
    }
    sd_shard_rec rec;
    if (pack_rec_check(tv, tl, SD_REC_TEXT, "a latent record", &rec, why)) {
        *skip = "empty_text embedding corrupt";
        sd_error e = *why;
        sd_err_set(why, e.code, "meta empty_text names text embedding %s: %s", hex, e.msg);
        return SD_OK;
    }
    *found = 1;
    return SD_OK;
}

/* Copy the empty caption's embedding (found by pack_find_empty_text) into
 * the output unless it has it, and name it in the output's empty_text. */
sd_status pack_put_empty_text(sd_shard_txn *from, pack_out *to, const uint8_t key[16], sd_error *err)
{
    const char *skip;
    sd_error why;
    sd_status st = pack_copy_text(from, to, key, &skip, &why, err);
    if (!st && skip) st = sd_err_set(err, why.code, "empty_text: %s", why.msg); /* checked before: not expected */
    char hex[33];
    sd_shard_text_key_hex(key, hex);
    return st ? st : sd_shard_meta_set(to->s, SD_SHARD_META_EMPTY_TEXT, hex, err);
}

/* Copy the text embedding ref from an input unless the output has it,
 * after checking its header and payload checksum: a missing or corrupt
 * embedding sets *skip (a reason for the tally) and *why (the detail) and
 * copies nothing. Only a failure to write (or memory) is returned. */
sd_status pack_copy_text(sd_shard_txn *from, pack_out *to, const uint8_t ref[16], const char **skip, sd_error *why,
                         sd_error *err)
{
    *skip = NULL;
    int found = 0;
    sd_status st = sd_shard_text_exists(to->s, ref, &found, err);
    if (st || found) return st;
    const void *v;
    size_t vl;
    st = sd_shard_get_text(from, ref, &v, &vl, why);
    if (st == SD_ENOTFOUND) {
        *skip = "text embedding missing";
        sd_err_set(why, SD_ENOTFOUND, "its text embedding is not in the shard");
        return SD_OK;
    }
    if (st) {
        *err = *why;
        return st;
    }
    sd_shard_rec rec;
    if (pack_rec_check(v, vl, SD_REC_TEXT, "its text embedding is a latent record", &rec, why)) {
        *skip = "text embedding corrupt";
        return SD_OK;
    }
    return pack_out_put_text(to, ref, v, vl, err);
}

/* The caption variants of record key (the input's variants entry) into
 * the output: each variant's embedding copied as pack_copy_text does, then
 * the entry, under the same key, in the open batch (after the record). A
 * variant whose embedding is missing or corrupt is left out of the entry
 * (*dropped counts them; the record keeps its other variants), and an
 * entry that is not whole keys starting with the record's text_ref is not
 * copied (sd-verify reports it in the input). */
sd_status pack_copy_variants(sd_shard_txn *from, pack_out *to, const void *key, size_t klen,
                             const uint8_t text_ref[16], uint64_t *dropped, sd_error *err)
{
    const uint8_t *refs;
    size_t n;
    sd_error e;
    if (sd_shard_get_variants(from, key, klen, &refs, &n, &e) != SD_OK || memcmp(refs, text_ref, 16)) return SD_OK;
    uint8_t keep[SD_SHARD_MAX_VARIANTS * 16];
    size_t m = 0;
    sd_status st = SD_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const char *skip = NULL;
        sd_error why;
        st = pack_copy_text(from, to, refs + 16 * i, &skip, &why, err);
        if (!st && skip) ++*dropped;
        else if (!st) memcpy(keep + 16 * m++, refs + 16 * i, 16);
    }
    if (st) return st;
    st = ensure_batch(to, err);
    if (!st) st = sd_shard_put_variants(to->s, key, klen, keep, m, err);
    return st;
}

/* Hex of a binary key for messages (truncated to cap). */
void pack_hex(const void *key, size_t n, char *out, size_t cap)
{
    const unsigned char *k = key;
    size_t j = 0;
    for (size_t i = 0; i < n && j + 3 <= cap; i++, j += 2) snprintf(out + j, 3, "%02x", k[i]);
    out[j < cap ? j : cap - 1] = 0;
}

/* How a skip message names a latent record: "'NAME' (KEY HEX)" when its
 * header can be read and carries a name (as the exporters and sd-train
 * name records), else the key's hex alone. A name over 200 bytes is cut at
 * a character boundary, marked "...". */
void pack_rec_label(const void *key, size_t klen, const void *v, size_t vl, char *out, size_t cap)
{
    char hex[80];
    sd_shard_rec rec;
    sd_error e;
    pack_hex(key, klen, hex, sizeof hex);
    if (sd_shard_rec_parse(v, vl, &rec, &e) != SD_OK || !rec.name_len) {
        snprintf(out, cap, "%s", hex);
        return;
    }
    size_t n = rec.name_len < 200 ? rec.name_len : 200;
    while (n < rec.name_len && n && ((unsigned char)rec.name[n] & 0xC0) == 0x80) n--;
    snprintf(out, cap, "'%.*s%s' (%s)", (int)n, rec.name, n < rec.name_len ? "..." : "", hex);
}

/* The .npy dtype of a shard dtype (bf16 maps to itself: callers widen). */
int pack_npy_dtype(int shard_dtype)
{
    switch (shard_dtype) {
    case SD_DT_F16: return SD_NPY_F16;
    case SD_DT_BF16: return SD_NPY_BF16;
    default: return SD_NPY_F32;
    }
}

/* The shard dtype for an npy float dtype (float64 is stored as fp32). */
int pack_shard_dtype(int npy_dtype)
{
    switch (npy_dtype) {
    case SD_NPY_F16: return SD_DT_F16;
    case SD_NPY_BF16: return SD_DT_BF16;
    default: return SD_DT_F32;
    }
}

/* Log the skip summary and choose the exit code (1 only under --strict). */
int pack_finish(const sd_tally *t, const pack_common *c, const char *what)
{
    if (t->total) sd_tally_log(t, what);
    return t->total && c->strict ? SD_EXIT_SKIPPED : SD_EXIT_OK;
}

/* End a progress display with the run's final skip count: skips counted
 * after its last update (the last record's) would be missing from its last
 * line, which then disagrees with the summary below it. */
void pack_progress_finish(sd_progress *p, const sd_tally *t)
{
    p->skipped = t->total;
    sd_progress_finish(p);
}

/* kohya's crop_ltrb for a record: sd-scripts' get_crop_ltrb for its
 * original size and bucket, or, for a record whose crop box holds a
 * crop_ltrb kept as a kohya file gave it (SD_REC_F_CROP_FLOAT), that box,
 * so an import -> export round trip gives the file's own values back. */
void pack_crop_ltrb(const sd_shard_rec *rec, double ltrb[4])
{
    if (rec->flags & SD_REC_F_CROP_FLOAT) {
        memcpy(ltrb, rec->crop, 4 * sizeof(double));
        return;
    }
    unsigned float_mask;
    sd_kohya_crop_ltrb((int)rec->bucket_w, (int)rec->bucket_h, (int)rec->orig_w, (int)rec->orig_h, ltrb, &float_mask);
}

/* Parse a stored record, check its payload checksum and that it is of the
 * kind expected (wrong_kind says what it is otherwise); 0 when good, else
 * -1 with the reason in why. */
int pack_rec_check(const void *v, size_t vl, int kind, const char *wrong_kind, sd_shard_rec *rec, sd_error *why)
{
    if (sd_shard_rec_parse(v, vl, rec, why) || sd_shard_rec_check_payload(rec, why)) return -1;
    if (rec->kind != kind) {
        sd_err_set(why, SD_EFORMAT, "%s", wrong_kind);
        return -1;
    }
    return 0;
}
