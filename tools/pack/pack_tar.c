/* sd-pack export-tar: records as WebDataset-style tar files of .npy members
 * (<name>.latents.npy, <name>.te1.npy, ..., <name>.json), N records per tar,
 * each tar written atomically, so millions of caches fit in ~1000 files. */
#include <archive.h>
#include <archive_entry.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "bucket_split.h"
#include "cli.h"
#include "log.h"
#include "outfile.h"
#include "pack_walk.h"

typedef struct {
    const char *pattern;
    long per_tar;
    sd_tally tally;
    sd_outfile out;
    struct archive *a;
    char tar_name[4096];
    int ntar;
    int utf8_locale; /* LC_CTYPE is C.UTF-8: libarchive passes UTF-8 names through */
    uint64_t in_tar, records;
    sd_buf npy, conv, member, json;
} tar_run;

/* The member suffix of a tensor role. */
static const char *role_suffix(int role)
{
    switch (role) {
    case SD_ROLE_SAMPLE: return "latents";
    case SD_ROLE_SAMPLE_FLIP: return "latents_flipped";
    case SD_ROLE_MEAN: return "mean";
    case SD_ROLE_STD: return "std";
    case SD_ROLE_MEAN_FLIP: return "mean_flipped";
    case SD_ROLE_STD_FLIP: return "std_flipped";
    case SD_ROLE_MASK: return "mask";
    case SD_ROLE_HIDDEN: return "te";
    case SD_ROLE_HIDDEN1: return "te1";
    case SD_ROLE_HIDDEN2: return "te2";
    case SD_ROLE_POOLED: return "pool2";
    default: return "tensor";
    }
}

/* libarchive's message for its last failure with the errno it kept: its
 * "Write error" alone does not say whether the disk is full or the file
 * too large. */
static const char *tar_error(struct archive *a, char *buf, size_t cap)
{
    const char *msg = archive_error_string(a);
    int e = archive_errno(a);
    if (!msg) msg = "unknown error";
    if (e > 0 && !strstr(msg, strerror(e))) snprintf(buf, cap, "%s: %s", msg, strerror(e));
    else snprintf(buf, cap, "%s", msg);
    return buf;
}

/* Finish the open tar: close the archive, fsync and rename it into place. */
static sd_status close_tar(tar_run *r, sd_error *err)
{
    if (!r->a) return SD_OK;
    char why[512];
    int rc = archive_write_close(r->a);
    if (rc != ARCHIVE_OK) tar_error(r->a, why, sizeof why);
    archive_write_free(r->a);
    r->a = NULL;
    if (rc != ARCHIVE_OK) {
        sd_outfile_abort(&r->out);
        return sd_err_set(err, SD_EIO, "%s: cannot finish tar: %s", r->tar_name, why);
    }
    return sd_outfile_commit(&r->out, err);
}

/* A pax writer that stores member names as the record names' bytes
 * (UTF-8). libarchive converts a name from the locale's charset to UTF-8,
 * which fails for any non-ASCII name in the C locale (sd-pack's default),
 * and its UTF-8 entry API crashes the pax writer there (libarchive 3.6):
 * so export-tar runs with LC_CTYPE C.UTF-8 (utf8_locale), where the
 * conversion passes UTF-8 through and a pax header is written only for
 * the names that need one, as before. Without that locale, every member is
 * marked hdrcharset=BINARY instead (names right, one pax header each). */
static int start_pax(struct archive *a, int utf8_locale)
{
    if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK) return -1;
    if (utf8_locale) return 0;
    return archive_write_set_format_option(a, "pax", "hdrcharset", "BINARY") == ARCHIVE_OK ? 0 : -1;
}

/* Start tar number r->ntar under a temporary name. */
static sd_status open_tar(tar_run *r, sd_error *err)
{
    if (sd_part_name(r->pattern, r->ntar, r->tar_name, sizeof r->tar_name))
        return sd_err_set(err, SD_EINVAL, "output pattern %s: name too long", r->pattern);
    sd_outfile_warn_own_leftovers(r->tar_name); /* a killed export's TAR.tmp.* */
    sd_status st = sd_outfile_open(&r->out, r->tar_name, err);
    if (st) return st;
    r->a = archive_write_new();
    if (!r->a || start_pax(r->a, r->utf8_locale) ||
        archive_write_open_FILE(r->a, r->out.f) != ARCHIVE_OK) {
        char why[512] = "out of memory";
        if (r->a) tar_error(r->a, why, sizeof why);
        if (r->a) archive_write_free(r->a);
        r->a = NULL;
        sd_outfile_abort(&r->out);
        return sd_err_set(err, SD_EIO, "%s: cannot start tar: %s", r->tar_name, why);
    }
    r->ntar++;
    r->in_tar = 0;
    return SD_OK;
}

/* Append one member to the open tar. */
static sd_status add_member(tar_run *r, const char *name, const char *suffix, const sd_buf *data, sd_error *err)
{
    sd_buf_clear(&r->member);
    sd_buf_printf(&r->member, "%s.%s", name, suffix);
    struct archive_entry *e = archive_entry_new();
    if (!e || r->member.oom) {
        archive_entry_free(e);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    archive_entry_set_pathname(e, sd_buf_cstr(&r->member));
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)data->len);
    archive_entry_set_mtime(e, 0, 0); /* reproducible output */
    int rc = archive_write_header(r->a, e);
    archive_entry_free(e);
    if (rc != ARCHIVE_OK || archive_write_data(r->a, data->data, data->len) != (la_ssize_t)data->len) {
        char why[512];
        return sd_err_set(err, SD_EIO, "%s: writing %s: %s", r->tar_name, r->member.data,
                          tar_error(r->a, why, sizeof why));
    }
    return SD_OK;
}

/* One tensor as a .npy member: fp16 and fp32 as they are, bf16 widened to
 * float32 (numpy has no bfloat16). */
static sd_status add_tensor(tar_run *r, const char *name, const sd_shard_tensor *t, sd_error *err)
{
    uint64_t shape[4];
    for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
    const void *data = t->data;
    int dt = t->dtype == SD_DT_F16 ? SD_NPY_F16 : SD_NPY_F32;
    if (t->dtype == SD_DT_BF16) {
        sd_status st = pack_tensor_f32(t, &r->conv, err);
        if (st) return st;
        data = r->conv.data;
    }
    sd_buf_clear(&r->npy);
    char suffix[64];
    snprintf(suffix, sizeof suffix, "%s.npy", role_suffix(t->role));
    sd_status st = sd_npy_write(&r->npy, (sd_npy_dtype)dt, t->ndim, shape, data, err);
    return st ? st : add_member(r, name, suffix, &r->npy, err);
}

/* Four numbers as a JSON array. */
static void json_box(sd_buf *b, const double v[4])
{
    sd_buf_putc(b, '[');
    for (int i = 0; i < 4; i++) {
        if (i) sd_buf_puts(b, ", ");
        sd_buf_json_num(b, v[i]);
    }
    sd_buf_putc(b, ']');
}

/* The per-record JSON member: geometry (the stored crop box and sd-scripts'
 * crop_ltrb for the same image, null without an original size), flags,
 * dtype, text key. */
static void record_json(sd_buf *b, const pack_item *it)
{
    const sd_shard_rec *rec = &it->rec;
    sd_buf_clear(b);
    sd_buf_puts(b, "{\"name\": ");
    sd_buf_json_cstr(b, it->name);
    sd_buf_printf(b, ", \"original_size\": [%u, %u], \"crop\": ", rec->orig_w, rec->orig_h);
    json_box(b, rec->crop);
    sd_buf_puts(b, ", \"crop_ltrb\": ");
    if (rec->orig_w && rec->orig_h && rec->bucket_w && rec->bucket_h) {
        double ltrb[4];
        pack_crop_ltrb(rec, ltrb);
        json_box(b, ltrb);
    } else {
        sd_buf_puts(b, "null");
    }
    sd_buf_printf(b, ", \"bucket\": [%u, %u], \"dtype\": \"%s\", \"flipped\": %s, \"mean_std\": %s", rec->bucket_w,
                  rec->bucket_h, sd_dtype_name(rec->t[0].dtype), rec->flags & SD_REC_F_FLIPPED ? "true" : "false",
                  rec->flags & SD_REC_F_MEANSTD ? "true" : "false");
    if (it->has_text) {
        char hex[33];
        pack_hex(rec->text_ref, 16, hex, sizeof hex);
        sd_buf_printf(b, ", \"text\": \"%s\"", hex);
    }
    sd_buf_puts(b, "}\n");
}

/* Write one record's members, opening the next tar when this one is full. */
static sd_status tar_one(void *ctx, const pack_item *it, sd_error *err)
{
    tar_run *r = ctx;
    sd_status st = SD_OK;
    if (r->a && r->in_tar >= (uint64_t)r->per_tar) st = close_tar(r, err);
    if (!st && !r->a) st = open_tar(r, err);
    for (int i = 0; !st && i < it->rec.ntensors; i++) st = add_tensor(r, it->name, &it->rec.t[i], err);
    for (int i = 0; !st && it->has_text && i < it->text.ntensors; i++) st = add_tensor(r, it->name, &it->text.t[i], err);
    if (!st) {
        record_json(&r->json, it);
        st = add_member(r, it->name, "json", &r->json, err);
    }
    if (!st) {
        r->in_tar++;
        r->records++;
    }
    return st;
}

/* sd-pack export-tar SHARD -o 'out-%05d.tar' --per-tar N */
int pack_export_tar(int argc, char **argv)
{
    tar_run r;
    memset(&r, 0, sizeof r);
    r.per_tar = 1000;
    pack_common pc = {0};
    const sd_opt opts[] = {
        {"output", 'o', SD_OPT_STR, &r.pattern, "PATTERN", "tar names with one %d (e.g. out-%05d.tar), numbered from 0"},
        {"per-tar", 0, SD_OPT_INT, &r.per_tar, "N", "records per tar (default 1000)"},
        {"strict", 0, SD_OPT_FLAG, &pc.strict, NULL, "exit 1 if any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &pc.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &pc.verbose, NULL, "show every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-pack export-tar", "SHARD -o 'out-%05d.tar' [--per-tar N]",
        "Write the records as tar files (POSIX pax) of .npy members, in record-name order (records\n"
        "the names index misses come last, under their own names, with a warning):\n"
        "<name>.latents.npy (and .latents_flipped.npy, or .mean/.std for mean+std records), the text\n"
        "embedding as <name>.te1.npy, .te2.npy, .pool2.npy (SDXL) or <name>.te.npy, and <name>.json\n"
        "with name, original_size, crop (the box cut from the resized image, as stored), crop_ltrb\n"
        "(sd-scripts' value for the same image), bucket, dtype, flags and the text key. fp16 and fp32\n"
        "stay as stored; bf16 is written as float32 (numpy has no bfloat16). Member names are the\n"
        "record names' UTF-8 bytes whatever the locale (pax path records where a name needs one).\n"
        "Each tar is written under a temporary name and renamed when complete.",
        opts, "Example:\n  sd-pack export-tar cache.lmdb -o 'tars/cache-%05d.tar' --per-tar 2000", NULL};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    sd_log_setup("sd-pack export-tar", pc.quiet ? SD_LOG_WARN : pc.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    rc = -1;
    if (pos.n != 1) rc = (sd_cli_usage_error(&cli, "give exactly one SHARD"), SD_EXIT_USAGE);
    else if (!r.pattern || !sd_part_pattern_ok(r.pattern))
        rc = (sd_cli_usage_error(&cli, "-o needs a pattern with exactly one %%d, e.g. 'out-%%05d.tar'"), SD_EXIT_USAGE);
    else if (r.per_tar < 1) rc = (sd_cli_usage_error(&cli, "--per-tar must be at least 1"), SD_EXIT_USAGE);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    r.utf8_locale = setlocale(LC_CTYPE, "C.UTF-8") != NULL; /* record names are UTF-8: see start_pax */
    sd_tally_init(&r.tally, pc.verbose ? -1 : 10);
    sd_progress prog;
    sd_progress_init(&prog, "sd-pack export-tar", "records", 0, !pc.quiet);
    sd_error err;
    sd_status st = pack_walk(pos.v[0], &r.tally, &prog, tar_one, &r, &err);
    pack_progress_finish(&prog, &r.tally);
    if (!st) st = close_tar(&r, &err);
    if (r.a) { /* a failed tar: close it first, as free skips that (and leaks) once a write has failed */
        archive_write_close(r.a);
        archive_write_free(r.a);
        sd_outfile_abort(&r.out);
    }
    sd_buf_free(&r.npy);
    sd_buf_free(&r.conv);
    sd_buf_free(&r.member);
    sd_buf_free(&r.json);
    sd_strlist_free(&pos);
    if (st) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return SD_EXIT_FATAL;
    }
    sd_log(SD_LOG_INFO, "wrote %llu records into %d tar files, %llu skipped", (unsigned long long)r.records, r.ntar,
           (unsigned long long)r.tally.total);
    sd_part_warn_leftovers(r.pattern, r.ntar, "export into more tar files");
    return pack_finish(&r.tally, &pc, "skipped");
}
