#include "npz.h"

#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>
#include <string.h>

#include "slurp.h"

enum { KEY_MAX = 255 };

/* Free every member read so far. */
void sd_npz_free(sd_npz *z)
{
    for (size_t i = 0; i < z->n; i++) {
        free(z->m[i].key);
        free(z->m[i].raw);
    }
    free(z->m);
    z->m = NULL;
    z->n = 0;
}

/* The member stored under key (name without .npy), or NULL. */
const sd_npz_member *sd_npz_find(const sd_npz *z, const char *key)
{
    for (size_t i = 0; i < z->n; i++)
        if (strcmp(z->m[i].key, key) == 0) return &z->m[i];
    return NULL;
}

/* Read the current entry's data whole, refusing more than budget bytes. */
static sd_status read_entry(struct archive *ar, const char *name, size_t budget, sd_buf *b, sd_error *err)
{
    for (;;) {
        if (sd_buf_reserve(b, 1 << 16)) return sd_err_set(err, SD_ENOMEM, "out of memory reading '%s'", name);
        la_ssize_t r = archive_read_data(ar, b->data + b->len, 1 << 16);
        if (r < 0)
            return sd_err_set(err, SD_EFORMAT, "member '%s': %s", name,
                              archive_error_string(ar) ? archive_error_string(ar) : "read error");
        if (r == 0) return SD_OK;
        b->len += (size_t)r;
        if (b->len > budget)
            return sd_err_set(err, SD_ERANGE, "member '%s' larger than the %zu MiB limit of an npz", name,
                              SD_NPZ_MAX_BYTES >> 20);
    }
}

/* Check one member name and turn it into its key (without .npy). */
static sd_status member_key(const sd_npz *z, const char *name, char **key, sd_error *err)
{
    size_t n = strlen(name);
    if (n < 5 || n - 4 > KEY_MAX || strcmp(name + n - 4, ".npy") != 0)
        return sd_err_set(err, SD_EFORMAT, "member '%.64s' is not a .npy array", name);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20) return sd_err_set(err, SD_EFORMAT, "member name has control characters");
    char *k = malloc(n - 3);
    if (!k) return sd_err_set(err, SD_ENOMEM, "out of memory");
    memcpy(k, name, n - 4);
    k[n - 4] = 0;
    if (sd_npz_find(z, k)) {
        sd_status st = sd_err_set(err, SD_EFORMAT, "member '%s' appears twice", name);
        free(k);
        return st;
    }
    *key = k;
    return SD_OK;
}

/* Walk the archive's entries, parsing each as .npy. */
static sd_status read_members(struct archive *ar, sd_npz *z, sd_error *err)
{
    size_t used = 0;
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(ar, &e);
        if (r == ARCHIVE_EOF) return z->n ? SD_OK : sd_err_set(err, SD_EFORMAT, "npz has no arrays");
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
            return sd_err_set(err, SD_EFORMAT, "not a readable zip/npz: %s",
                              archive_error_string(ar) ? archive_error_string(ar) : "bad archive");
        const char *name = archive_entry_pathname(e);
        if (!name) return sd_err_set(err, SD_EFORMAT, "zip member without a name");
        if (archive_entry_filetype(e) != AE_IFREG) return sd_err_set(err, SD_EFORMAT, "member '%.64s' is not a file", name);
        if (archive_entry_is_encrypted(e)) return sd_err_set(err, SD_EUNSUPPORTED, "member '%.64s' is encrypted", name);
        if (z->n == SD_NPZ_MAX_MEMBERS)
            return sd_err_set(err, SD_ERANGE, "npz has more than %d members", SD_NPZ_MAX_MEMBERS);
        char *key = NULL;
        sd_status st = member_key(z, name, &key, err);
        if (st) return st;
        sd_npz_member *m = &z->m[z->n];
        memset(m, 0, sizeof *m);
        m->key = key;
        z->n++;
        sd_buf b;
        sd_buf_init(&b);
        st = read_entry(ar, key, SD_NPZ_MAX_BYTES - used, &b, err);
        m->raw = (unsigned char *)b.data;
        if (st) return st;
        used += b.len;
        sd_error perr;
        if (sd_npy_parse(b.data ? b.data : "", b.len, &m->info, &m->data, &perr))
            return sd_err_set(err, perr.code, "member '%s': %s", name, perr.msg);
    }
}

/* Parse an npz held in memory; on error z is left empty. */
sd_status sd_npz_read_mem(sd_npz *z, const void *data, size_t len, sd_error *err)
{
    z->n = 0;
    z->m = calloc(SD_NPZ_MAX_MEMBERS, sizeof *z->m);
    if (!z->m) return sd_err_set(err, SD_ENOMEM, "out of memory");
    if (len < 22) {
        sd_npz_free(z);
        return sd_err_set(err, len ? SD_ETRUNC : SD_EFORMAT, "not a zip/npz (%zu bytes)", len);
    }
    struct archive *ar = archive_read_new();
    if (!ar) {
        sd_npz_free(z);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    archive_read_support_format_zip_seekable(ar);
    sd_status st;
    if (archive_read_open_memory(ar, data, len) != ARCHIVE_OK)
        st = sd_err_set(err, SD_EFORMAT, "not a zip/npz: %s",
                        archive_error_string(ar) ? archive_error_string(ar) : "unrecognised");
    else
        st = read_members(ar, z, err);
    archive_read_free(ar);
    if (st) sd_npz_free(z);
    return st;
}

/* Read an npz file (the whole file, then parse it in memory). */
sd_status sd_npz_read_file(sd_npz *z, const char *path, sd_error *err)
{
    sd_buf b;
    sd_buf_init(&b);
    z->m = NULL;
    z->n = 0;
    sd_status st = sd_read_file(path, &b, err);
    if (!st) st = sd_npz_read_mem(z, b.data ? b.data : "", b.len, err);
    sd_buf_free(&b);
    return st;
}

/* libarchive output callback: append to the writer's buffer. */
static la_ssize_t write_cb(struct archive *a, void *ctx, const void *buf, size_t n)
{
    (void)a;
    sd_npz_writer *w = ctx;
    sd_buf_put(&w->out, buf, n);
    return w->out.oom ? -1 : (la_ssize_t)n;
}

/* Start an uncompressed zip in memory. */
sd_status sd_npz_writer_init(sd_npz_writer *w, sd_error *err)
{
    memset(w, 0, sizeof *w);
    sd_buf_init(&w->out);
    sd_buf_init(&w->npy);
    w->a = archive_write_new();
    if (!w->a) return sd_err_set(err, SD_ENOMEM, "out of memory");
    if (archive_write_set_format_zip(w->a) != ARCHIVE_OK || archive_write_zip_set_compression_store(w->a) != ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(w->a, 1) != ARCHIVE_OK ||
        archive_write_open(w->a, w, NULL, write_cb, NULL) != ARCHIVE_OK) {
        sd_status st = sd_err_set(err, SD_EIO, "npz writer: %s", archive_error_string(w->a));
        sd_npz_writer_free(w);
        return st;
    }
    return SD_OK;
}

/* Add one array as member key.npy. */
sd_status sd_npz_writer_add(sd_npz_writer *w, const char *key, sd_npy_dtype t, int ndim, const uint64_t *shape,
                            const void *data, sd_error *err)
{
    if (!w->a || w->failed) return sd_err_set(err, SD_EINVAL, "npz writer already failed");
    sd_buf_clear(&w->npy);
    sd_status st = sd_npy_write(&w->npy, t, ndim, shape, data, err);
    if (st) return st;
    char name[KEY_MAX + 5];
    if (snprintf(name, sizeof name, "%s.npy", key) >= (int)sizeof name)
        return sd_err_set(err, SD_EINVAL, "npz member name too long");
    struct archive_entry *e = archive_entry_new();
    if (!e) return sd_err_set(err, SD_ENOMEM, "out of memory");
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)w->npy.len);
    archive_entry_set_mtime(e, 315532800, 0); /* 1980-01-01, as numpy's zipfile writes: output is reproducible */
    int r = archive_write_header(w->a, e);
    archive_entry_free(e);
    if (r != ARCHIVE_OK || archive_write_data(w->a, w->npy.data, w->npy.len) != (la_ssize_t)w->npy.len) {
        w->failed = 1;
        return sd_err_set(err, SD_EIO, "npz writer: %s", archive_error_string(w->a));
    }
    return SD_OK;
}

/* Write the central directory; the archive is then in w->out. */
sd_status sd_npz_writer_finish(sd_npz_writer *w, sd_error *err)
{
    if (!w->a || w->failed) return sd_err_set(err, SD_EINVAL, "npz writer already failed");
    int r = archive_write_close(w->a);
    if (r != ARCHIVE_OK || w->out.oom) {
        w->failed = 1;
        return sd_err_set(err, SD_EIO, "npz writer: %s", archive_error_string(w->a));
    }
    return SD_OK;
}

/* Release the writer (the output buffer too). */
void sd_npz_writer_free(sd_npz_writer *w)
{
    if (w->a) archive_write_free(w->a);
    w->a = NULL;
    sd_buf_free(&w->out);
    sd_buf_free(&w->npy);
}
