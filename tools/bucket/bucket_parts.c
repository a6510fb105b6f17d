/* sd-bucket --split: the part files, written as records arrive, then
 * published as a set with the manifest that vouches for it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bucket_tool.h"
#include "cli.h"
#include "outfile.h"

/* Split sink: append one record to its part file, count and hash it; a
 * failed write remembers the part and errno for the message. */
int bucket_write_part(void *ctx, int part, const char *data, size_t len)
{
    bucket_run *r = ctx;
    r->part_counts[part]++;
    r->part_bytes[part] += len;
    XXH3_64bits_update(r->part_hash[part], data, len);
    if (fwrite(data, 1, len, r->parts[part].f) == len) return 0;
    r->bad_part = part;
    r->bad_errno = errno;
    return -1;
}

/* The error for a part write that failed, naming the part's file (the
 * splitter fails by itself only when out of memory). */
sd_status bucket_part_write_error(const bucket_run *r, sd_error *err)
{
    char name[4096];
    if (r->bad_part < 0) return sd_err_set(err, SD_ENOMEM, "splitting: out of memory");
    if (sd_part_name(r->opt->output, r->bad_part, name, sizeof name) != 0)
        snprintf(name, sizeof name, "part %d", r->bad_part);
    return sd_err_set(err, SD_EIO, "%s: write failed: %s", name, strerror(r->bad_errno));
}

/* Open the N part files (atomic: they appear only when all are committed). */
sd_status bucket_open_parts(bucket_run *r, sd_error *err)
{
    const bucket_opts *o = r->opt;
    sd_status st = sd_stream_splitter_init(&r->ss, (int)o->split, (uint64_t)o->seed, err);
    if (st) return st;
    r->parts = calloc((size_t)o->split, sizeof *r->parts);
    r->part_counts = calloc((size_t)o->split, sizeof *r->part_counts);
    r->part_bytes = calloc((size_t)o->split, sizeof *r->part_bytes);
    r->part_hash = calloc((size_t)o->split, sizeof *r->part_hash);
    r->bad_part = -1;
    if (!r->parts || !r->part_counts || !r->part_bytes || !r->part_hash)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (long p = 0; p < o->split; p++) {
        r->part_hash[p] = XXH3_createState();
        if (!r->part_hash[p] || XXH3_64bits_reset(r->part_hash[p]) != XXH_OK)
            return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (; r->nparts < (int)o->split; r->nparts++) {
        char name[4096];
        if (sd_part_name(o->output, r->nparts, name, sizeof name) != 0)
            return sd_err_set(err, SD_EINVAL, "part file name too long");
        sd_outfile_warn_own_leftovers(name);
        if ((st = sd_outfile_open(&r->parts[r->nparts], name, err))) return st;
    }
    return SD_OK;
}

/* The manifest of a split: in part 0's directory, the -o pattern's last
 * component as given plus ".parts.json" (docs/FORMATS.md). */
static int manifest_name(const bucket_opts *o, char *out, size_t cap)
{
    /* beside part 0, which exists: -o 'rank-%d/train.jsonl' has no directory
     * 'rank-%d'; named by the pattern's last component */
    char first[4096];
    if (sd_part_name(o->output, 0, first, sizeof first) != 0) return -1;
    const char *pslash = strrchr(o->output, '/'), *fslash = strrchr(first, '/');
    int dirlen = fslash ? (int)(fslash - first + 1) : 0;
    const char *base = pslash ? pslash + 1 : o->output;
    return snprintf(out, cap, "%.*s%s.parts.json", dirlen, first, base) < (int)cap ? 0 : -1;
}

/* The manifest's text: the set's identity and every part's name, records,
 * bytes and XXH3-64, so a set whose parts come from two runs (a kill
 * between the renames) or were changed later can be told from a whole one. */
static void build_manifest(const bucket_run *r, const char *set_id, sd_buf *b)
{
    const bucket_opts *o = r->opt;
    sd_buf_puts(b, "{\"tool\":\"sd-bucket\",\"version\":");
    sd_buf_json_cstr(b, sd_version());
    sd_buf_puts(b, ",\"set\":");
    sd_buf_json_cstr(b, set_id);
    sd_buf_puts(b, ",\"pattern\":");
    sd_buf_json_cstr(b, o->output);
    sd_buf_puts(b, ",\"parts\":[");
    for (int p = 0; p < (int)o->split; p++) {
        char name[4096];
        sd_part_name(o->output, p, name, sizeof name);
        sd_buf_printf(b, "%s{\"file\":", p ? "," : "");
        sd_buf_json_cstr(b, name);
        sd_buf_printf(b, ",\"records\":%llu,\"bytes\":%llu,\"xxh3_64\":\"%016llx\"}",
                      (unsigned long long)r->part_counts[p], (unsigned long long)r->part_bytes[p],
                      (unsigned long long)XXH3_64bits_digest(r->part_hash[p]));
    }
    sd_buf_puts(b, "]}\n");
}

/* Publish the finished parts as a set and vouch for it: the old manifest
 * goes first (it must never describe a mix of its parts and new ones), the
 * renames run back to back, and the new manifest is written last, so a
 * set without a manifest, or whose parts do not match it, was interrupted. */
static sd_status publish_parts(bucket_run *r, sd_error *err)
{
    char mname[4200];
    if (manifest_name(r->opt, mname, sizeof mname) != 0) return sd_err_set(err, SD_EINVAL, "-o pattern too long");
    if (unlink(mname) != 0 && errno != ENOENT)
        return sd_err_set(err, SD_EIO, "%s: cannot remove the earlier split's manifest: %s", mname, strerror(errno));
    sd_status st = sd_outfile_publish_set(r->parts, r->nparts, err);
    if (st) return st;
    char set_id[64];
    sd_output_set_id(set_id, sizeof set_id);
    sd_buf b;
    sd_buf_init(&b);
    build_manifest(r, set_id, &b);
    st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(mname, b.data, b.len, err);
    sd_buf_free(&b);
    return st;
}

/* Release the held records, then commit the parts: every one written and
 * synced first, then all renamed into place back to back, so a failure
 * while writing (disk full, a kill) leaves the earlier set of parts
 * untouched; the manifest written last vouches for the new set. */
sd_status bucket_close_parts(bucket_run *r, sd_status st, sd_error *err)
{
    if (!st && sd_stream_splitter_finish(&r->ss, bucket_write_part, r)) st = bucket_part_write_error(r, err);
    for (int p = 0; p < r->nparts && !st; p++) st = sd_outfile_finish(&r->parts[p], err);
    if (!st) st = publish_parts(r, err);
    for (int p = 0; p < r->nparts; p++) sd_outfile_abort(&r->parts[p]); /* temp files a failure left */
    if (!st) sd_part_warn_leftovers(r->opt->output, (int)r->opt->split, "split into more parts");
    for (long p = 0; r->part_hash && p < r->opt->split; p++) XXH3_freeState(r->part_hash[p]);
    free(r->part_hash);
    free(r->part_bytes);
    r->part_hash = NULL;
    r->part_bytes = NULL;
    sd_stream_splitter_free(&r->ss);
    free(r->parts);
    r->parts = NULL;
    r->nparts = 0;
    return st;
}
