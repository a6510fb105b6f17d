#include "bucket_rec.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "imghdr.h"
#include "json.h"
#include "slurp.h"

/* Fields this tool owns: replaced on output, whatever the input held. */
static const char *const owned_fields[] = {"original_size", "bucket", "resize", "crop", "kohya_crop_ltrb"};

/* Fresh worker state. */
void sd_brec_worker_init(sd_brec_worker *wk)
{
    sd_arena_init(&wk->arena, 64 * 1024);
    wk->tar_fd = -1;
    wk->tar_path = NULL;
    wk->read_sizes = 0;
}

/* Close the cached shard and free the arena. */
void sd_brec_worker_free(sd_brec_worker *wk)
{
    if (wk->tar_fd >= 0) close(wk->tar_fd);
    free(wk->tar_path);
    wk->tar_fd = -1;
    wk->tar_path = NULL;
    sd_arena_free(&wk->arena);
}

/* Mark the record skipped with reason and a formatted detail. */
static void skip(sd_brec_result *res, const char *reason, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void skip(sd_brec_result *res, const char *reason, const char *fmt, ...)
{
    res->reason = reason;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->detail, sizeof res->detail, fmt, ap);
    va_end(ap);
}

/* A non-negative whole JSON number (record sizes, offsets); 0 on success. */
static int json_uint(const sd_json *v, double max, uint64_t *out)
{
    double d;
    if (sd_json_whole(v, 0, max, &d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* The skip reason for a failed header read. */
static const char *header_reason(sd_status st)
{
    switch (st) {
    case SD_ENOTFOUND: return "image file not found";
    case SD_EIO: return "image file unreadable";
    case SD_ETRUNC: return "image file empty or truncated";
    case SD_EFORMAT: return "corrupt image header";
    case SD_ERANGE: return "image dimensions out of range";
    case SD_EUNSUPPORTED: return "not a supported image";
    default: return "image header unreadable";
    }
}

/* Join root and a relative path into buf; absolute paths stay as they are. */
static const char *resolve(const char *root, const char *path, char *buf, size_t cap)
{
    if (!root || !*root || path[0] == '/') return path;
    if ((size_t)snprintf(buf, cap, "%s/%s", root, path) >= cap) return NULL;
    return buf;
}

/* Read the size of the image a record points at (a file, or a tar member at
 * offset/size inside a shard); on failure the record is marked skipped. */
static int read_size(const char *root, sd_brec_worker *wk, const sd_json *rec, const char *image, sd_brec_result *res,
                     uint32_t *w, uint32_t *h)
{
    char pbuf[4096];
    const char *path = resolve(root, image, pbuf, sizeof pbuf);
    if (!path) {
        skip(res, "image path too long", "%.64s...", image);
        return -1;
    }
    sd_imginfo info;
    sd_error err;
    sd_err_clear(&err);
    sd_status st;
    const sd_json *member = sd_json_get(rec, "member");
    if (member && member->type != SD_JSON_NULL) {
        uint64_t off, size;
        if (json_uint(sd_json_get(rec, "offset"), 9e15, &off) || json_uint(sd_json_get(rec, "size"), 9e15, &size)) {
            skip(res, "bad tar member location", "%s: member needs whole-number offset and size", image);
            return -1;
        }
        if (!wk->tar_path || strcmp(wk->tar_path, path) != 0) {
            if (wk->tar_fd >= 0) close(wk->tar_fd);
            free(wk->tar_path);
            wk->tar_path = NULL;
            sd_status ost = sd_open_regular(path, &wk->tar_fd, NULL, &err);
            if (ost) {
                skip(res, header_reason(ost), "%s: %s", path, err.msg);
                return -1;
            }
            wk->tar_path = strdup(path);
        }
        const char *mname = sd_json_str(member);
        if (size == 0) st = sd_err_set(&err, SD_ETRUNC, "empty member");
        else st = sd_imghdr_read_fd(wk->tar_fd, off, size, &info, &err);
        if (st) {
            skip(res, header_reason(st), "%s[%s]: %s", path, mname ? mname : "?", err.msg);
            return -1;
        }
    } else {
        st = sd_imghdr_read_file(path, &info, &err);
        if (st) {
            skip(res, header_reason(st), "%s: %s", path, err.msg);
            return -1;
        }
    }
    *w = info.disp_w;
    *h = info.disp_h;
    return 0;
}

/* Append [a,b] or [a,b,c,d] of ints. */
static void put_ints(sd_buf *out, const int *v, int n)
{
    sd_buf_putc(out, '[');
    for (int i = 0; i < n; i++) {
        if (i) sd_buf_putc(out, ',');
        sd_buf_json_int(out, v[i]);
    }
    sd_buf_putc(out, ']');
}

/* Append the bucket fields (each preceded by a comma) for a bucketed record. */
void sd_brec_write_fields(sd_buf *out, const sd_brec_result *res)
{
    const sd_fit *f = &res->fit;
    int v[4];
    sd_buf_puts(out, ",\"original_size\":");
    v[0] = res->w;
    v[1] = res->h;
    put_ints(out, v, 2);
    sd_buf_puts(out, ",\"bucket\":");
    v[0] = f->bw;
    v[1] = f->bh;
    put_ints(out, v, 2);
    sd_buf_puts(out, ",\"resize\":");
    v[0] = f->rw;
    v[1] = f->rh;
    put_ints(out, v, 2);
    sd_buf_puts(out, ",\"crop\":");
    put_ints(out, f->crop, 4);
    sd_buf_puts(out, ",\"kohya_crop_ltrb\":[");
    for (int i = 0; i < 4; i++) {
        if (i) sd_buf_putc(out, ',');
        if (f->ltrb_float & (1u << i)) sd_buf_py_float(out, f->ltrb[i]);
        else sd_buf_json_int(out, (int64_t)f->ltrb[i]);
    }
    sd_buf_putc(out, ']');
}

/* Is key one of the fields this tool rewrites? */
static int owned(const char *key, size_t kl)
{
    if (kl < 4 || (key[0] != 'o' && key[0] != 'b' && key[0] != 'r' && key[0] != 'c' && key[0] != 'k')) return 0;
    for (size_t i = 0; i < sizeof owned_fields / sizeof owned_fields[0]; i++)
        if (owned_fields[i][0] == key[0] && strlen(owned_fields[i]) == kl && memcmp(owned_fields[i], key, kl) == 0)
            return 1;
    return 0;
}

/* Process one JSONL line (modified in place). On success the output record
 * plus '\n' is appended to out and res->reason is NULL; otherwise nothing is
 * appended and res says why the record was skipped. */
void sd_bucket_record(const sd_plan *plan, const char *root, sd_brec_worker *wk, char *line, size_t len, sd_buf *out,
                      sd_brec_result *res)
{
    memset(res, 0, sizeof *res);
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i == len) {
        res->blank = 1;
        return;
    }
    sd_arena_reset(&wk->arena);
    sd_json *rec;
    sd_error err;
    sd_err_clear(&err);
    if (sd_json_parse(&wk->arena, line, len, &rec, &err) != SD_OK) {
        skip(res, "malformed JSON", "%s", err.msg);
        return;
    }
    if (rec->type != SD_JSON_OBJECT) {
        skip(res, "record is not a JSON object", "top-level value is not an object");
        return;
    }
    const char *image = sd_json_str(sd_json_get(rec, "image"));
    if (!image || !*image) {
        skip(res, "missing image field", "no \"image\" string");
        return;
    }
    const sd_json *jw = sd_json_get(rec, "width"), *jh = sd_json_get(rec, "height");
    uint32_t w = 0, h = 0;
    if (!wk->read_sizes && jw && jh && jw->type != SD_JSON_NULL && jh->type != SD_JSON_NULL) {
        uint64_t uw, uh;
        if (json_uint(jw, 1e9, &uw) || json_uint(jh, 1e9, &uh)) {
            skip(res, "bad width/height", "%s: width/height are not whole non-negative numbers", image);
            return;
        }
        if (sd_imghdr_check_dims(uw, uh, &err) != SD_OK) {
            skip(res, "image dimensions out of range", "%s: %s", image, err.msg);
            return;
        }
        w = (uint32_t)uw;
        h = (uint32_t)uh;
    } else if (read_size(root, wk, rec, image, res, &w, &h) != 0) {
        return;
    }
    res->w = (int)w;
    res->h = (int)h;
    sd_fit_status fs = sd_bucket_select(plan, (int)w, (int)h, &res->fit);
    if (fs != SD_FIT_OK) {
        skip(res, sd_fit_reason(fs), "%s: %ux%u", image, w, h);
        return;
    }

    /* write back: width/height in place, owned fields dropped, the rest as-is */
    int have_w = 0, have_h = 0;
    sd_buf_putc(out, '{');
    int first = 1;
    for (const sd_json *c = rec->child; c; c = c->next) {
        if (owned(c->key, c->key_len)) continue;
        if (!first) sd_buf_putc(out, ',');
        first = 0;
        sd_buf_json_str(out, c->key, c->key_len);
        sd_buf_putc(out, ':');
        if (c->key_len == 5 && memcmp(c->key, "width", 5) == 0) {
            sd_buf_json_int(out, w);
            have_w = 1;
        } else if (c->key_len == 6 && memcmp(c->key, "height", 6) == 0) {
            sd_buf_json_int(out, h);
            have_h = 1;
        } else {
            sd_json_write(out, c);
        }
    }
    /* the object has at least "image", so the fields below follow a member */
    if (!have_w) {
        sd_buf_puts(out, ",\"width\":");
        sd_buf_json_int(out, w);
    }
    if (!have_h) {
        sd_buf_puts(out, ",\"height\":");
        sd_buf_json_int(out, h);
    }
    sd_brec_write_fields(out, res);
    sd_buf_puts(out, "}\n");
}
