/* sd-pack export-kohya: write a shard back as an sd-scripts cache
 * directory: one latents npz per record (float32, keys and dtypes as
 * sd-scripts writes them) and <stem>_te_outputs.npz for SDXL text
 * embeddings. Every file is written atomically. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bucket.h"
#include "cli.h"
#include "kohya_cache.h"
#include "log.h"
#include "outfile.h"
#include "pack_walk.h"

typedef struct {
    const char *dir;
    sd_kohya_kind layout;
    sd_tally tally;    /* records not exported */
    sd_tally te_tally; /* text embeddings without a te_outputs file (their latents were written) */
    sd_buf file, path, lat, flip, mask, te[3];
    uint64_t written, te_written;
} export_run;

/* 1 for the temporary name sd_outfile_open gives an npz (NAME.npz.tmp.
 * and mkstemp's six characters). */
static int is_npz_tmp(const char *name)
{
    const char *t = strstr(name, ".npz.tmp.");
    return t && t != name && strlen(t + 9) == 6;
}

/* A killed export leaves NAME.npz.tmp.XXXXXX files anywhere in its tree,
 * which a rerun never reuses: each is named (the first ten, then a count),
 * as a leftover or as one a running export is writing, and not removed. Depth-limited like
 * the names an export writes. */
static void warn_tmp_files(const char *dir, int depth, long *found)
{
    DIR *d = depth < 32 ? opendir(dir) : NULL;
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) continue;
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            warn_tmp_files(path, depth + 1, found);
        } else if (S_ISREG(sb.st_mode) && is_npz_tmp(e->d_name) && ++*found <= 10) {
            sd_outfile_warn_leftover(path, "");
        }
    }
    closedir(d);
}

/* mkdir -p for the directories of path (relative to nothing: full path). */
static sd_status make_parents(char *path, sd_error *err)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int r = mkdir(path, 0755);
        int e = errno;
        *p = '/';
        if (r && e != EEXIST) return sd_err_set(err, SD_EIO, "%.200s: cannot create directory: %s", path, strerror(e));
    }
    return SD_OK;
}

/* Write buf to dir/file atomically, creating directories. */
static sd_status write_out(export_run *r, const char *rel, const sd_buf *data, sd_error *err)
{
    sd_buf_clear(&r->path);
    sd_buf_printf(&r->path, "%s/%s", r->dir, rel);
    if (r->path.oom) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status st = make_parents((char *)sd_buf_cstr(&r->path), err);
    return st ? st : sd_write_file_atomic(r->path.data, data->data, data->len, err);
}

/* The SDXL text embedding of a record as <stem>_te_outputs.npz: fp16 stays
 * float16 (sd-scripts keeps fp16 outputs), fp32 and bf16 become float32. */
static sd_status export_te(export_run *r, const pack_item *it, sd_error *err)
{
    const sd_shard_tensor *t[3] = {sd_shard_rec_tensor(&it->text, SD_ROLE_HIDDEN1),
                                   sd_shard_rec_tensor(&it->text, SD_ROLE_HIDDEN2),
                                   sd_shard_rec_tensor(&it->text, SD_ROLE_POOLED)};
    if (!t[0] || !t[1] || !t[2] || t[0]->ndim != 2 || t[0]->shape[1] != 768 || t[1]->ndim != 2 ||
        t[1]->shape[0] != t[0]->shape[0] || t[1]->shape[1] != 1280 || t[2]->ndim != 1 || t[2]->shape[0] != 1280) {
        sd_skip(&r->te_tally, "text embedding has no kohya layout (not SDXL hidden1/hidden2/pool)", "record '%s'",
                it->name);
        return SD_OK;
    }
    int f16 = t[0]->dtype == SD_DT_F16 && t[1]->dtype == SD_DT_F16 && t[2]->dtype == SD_DT_F16;
    const void *data[3];
    for (int i = 0; i < 3; i++) {
        if (f16) {
            data[i] = t[i]->data;
            continue;
        }
        sd_status st = pack_tensor_f32(t[i], &r->te[i], err);
        if (st) return st;
        data[i] = r->te[i].data;
    }
    sd_status st = sd_kohya_te_encode(f16 ? SD_NPY_F16 : SD_NPY_F32, t[0]->shape[0], data[0], data[1], data[2],
                                      &r->file, err);
    sd_buf_clear(&r->lat);
    sd_kohya_file_name(&r->lat, it->name, SD_KOHYA_TE, 0, 0);
    if (!st) st = write_out(r, sd_buf_cstr(&r->lat), &r->file, err);
    if (!st) r->te_written++;
    return st;
}

/* A record's loss mask as kohya's alpha_mask into b: float32 at the image's
 * (the bucket's) size. A mask stored at the latent size is widened, each
 * value repeated over its 8 x 8 pixels, so sd-scripts' area reduction gives
 * it back. NULL without a mask. */
static const float *alpha_mask_of(const sd_shard_rec *rec, sd_buf *b, sd_error *err, sd_status *st)
{
    const sd_shard_tensor *m = sd_shard_rec_tensor(rec, SD_ROLE_MASK);
    *st = SD_OK;
    if (!m) return NULL;
    size_t H = rec->bucket_h, W = rec->bucket_w, f = m->shape[0] == H ? 1 : 8, mw = m->shape[1];
    sd_buf_clear(b);
    if (sd_buf_reserve(b, H * W * 4)) {
        *st = sd_err_set(err, SD_ENOMEM, "out of memory");
        return NULL;
    }
    const unsigned char *src = m->data;
    unsigned char *dst = (unsigned char *)b->data;
    for (size_t y = 0; y < H; y++)
        for (size_t x = 0; x < W; x++) memcpy(dst + 4 * (y * W + x), src + 4 * ((y / f) * mw + x / f), 4);
    b->len = H * W * 4;
    return (const float *)(void *)b->data;
}

/* Write one record's latents npz (and te_outputs). */
static sd_status export_one(void *ctx, const pack_item *it, sd_error *err)
{
    export_run *r = ctx;
    const sd_shard_rec *rec = &it->rec;
    if (rec->flags & SD_REC_F_MEANSTD) {
        sd_skip(&r->tally, "mean+std record (kohya caches hold samples)", "record '%s'", it->name);
        return SD_OK;
    }
    const sd_shard_tensor *s = sd_shard_rec_tensor(rec, SD_ROLE_SAMPLE), *f = sd_shard_rec_tensor(rec, SD_ROLE_SAMPLE_FLIP);
    if (!s || s->ndim != 3) {
        sd_skip(&r->tally, "latents are not (C, H/8, W/8)", "record '%s'", it->name);
        return SD_OK;
    }
    if (!rec->orig_w || !rec->orig_h || !rec->bucket_w || !rec->bucket_h) {
        sd_skip(&r->tally, "no original size (kohya's crop_ltrb is computed from it)", "record '%s'", it->name);
        return SD_OK;
    }
    sd_status st = pack_tensor_f32(s, &r->lat, err);
    if (!st && f) st = pack_tensor_f32(f, &r->flip, err);
    if (st) return st;
    const float *alpha = alpha_mask_of(rec, &r->mask, err, &st);
    if (st) return st;
    sd_kohya_latents_out lo = {s->shape[0], s->shape[1], s->shape[2], (const float *)(void *)r->lat.data,
                               f ? (const float *)(void *)r->flip.data : NULL, alpha, rec->orig_w, rec->orig_h,
                               {0, 0, 0, 0}};
    pack_crop_ltrb(rec, lo.crop_ltrb);
    st = sd_kohya_latents_encode(&lo, &r->file, err);
    if (st) return st;
    sd_buf name;
    sd_buf_init(&name);
    int t = (rec->flags & SD_REC_F_TRANSPOSED) != 0; /* sd-scripts' imagesize reads the stored size, not EXIF's */
    sd_kohya_file_name(&name, it->name, r->layout, t ? rec->orig_h : rec->orig_w, t ? rec->orig_w : rec->orig_h);
    st = name.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : write_out(r, sd_buf_cstr(&name), &r->file, err);
    sd_buf_free(&name);
    if (st) return st;
    r->written++;
    return it->has_text ? export_te(r, it, err) : SD_OK;
}

/* The file-name layout: --layout, else the one the import recorded, else legacy. */
static int pick_layout(const char *opt, const char *shard, sd_kohya_kind *out)
{
    *out = SD_KOHYA_LEGACY;
    if (opt) return sd_kohya_kind_parse(opt, out);
    sd_shard *s;
    sd_shard_txn *t;
    sd_error err;
    if (pack_open_ro(&s, &t, shard, &err)) return 0; /* the walk reports it */
    char *v = NULL;
    if (sd_shard_meta_get(s, "kohya_layout", &v, &err) == SD_OK) sd_kohya_kind_parse(v, out);
    free(v);
    pack_close_ro(s, t);
    return 0;
}

/* A layout whose names say another model than the shard's scaling_factor
 * (_sd: 0.18215, _sdxl: 0.13025): import-kohya takes the factor from those
 * names, so a round trip would silently change it. 1 with the refusal in
 * msg; 0 for legacy names (they say no model) or a shard without a factor. */
static int layout_contradicts(const char *shard, sd_kohya_kind layout, int explicit_layout, char *msg, size_t cap)
{
    double want = layout == SD_KOHYA_SD ? 0.18215 : layout == SD_KOHYA_SDXL ? 0.13025 : 0;
    sd_shard *s;
    sd_shard_txn *t;
    sd_error err;
    if (!want || pack_open_ro(&s, &t, shard, &err)) return 0; /* the walk reports an unreadable shard */
    char *v = NULL, *end = NULL;
    int bad = sd_shard_meta_get(s, SD_SHARD_META_SCALING, &v, &err) == SD_OK && strtod(v, &end) != want;
    if (bad)
        snprintf(msg, cap, "%s: scaling_factor %s, but %s %s names are read back as scaling_factor %g (import-kohya "
                 "takes it from _sd/_sdxl names): use --layout legacy or %s, or --force-layout to write them anyway",
                 shard, v, explicit_layout ? "--layout" : "the layout it was imported with,", sd_kohya_kind_name(layout),
                 want, layout == SD_KOHYA_SD ? "sdxl" : "sd");
    free(v);
    pack_close_ro(s, t);
    return bad;
}

/* sd-pack export-kohya SHARD -o DIR */
int pack_export_kohya(int argc, char **argv)
{
    const char *output = NULL, *layout = NULL;
    pack_common pc = {0};
    int force_layout = 0;
    const sd_opt opts[] = {
        {"output", 'o', SD_OPT_STR, &output, "DIR", "directory to write the npz files into (created)"},
        {"layout", 0, SD_OPT_STR, &layout, "L", "file names: legacy (<stem>.npz), sd or sdxl (<stem>_WWWWxHHHH_sd[xl].npz);\n"
                                              "                                 default: as imported, else legacy"},
        {"force-layout", 0, SD_OPT_FLAG, &force_layout, NULL,
         "write sd/sdxl names even when they contradict the shard's scaling_factor"},
        {"strict", 0, SD_OPT_FLAG, &pc.strict, NULL, "exit 1 if any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &pc.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &pc.verbose, NULL, "show every skipped record"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-pack export-kohya", "SHARD -o DIR",
        "Write a shard as a kohya-ss/sd-scripts cache directory. Each record becomes a latents npz\n"
        "named by its record name: latents (float32), original_size (int64 W,H), crop_ltrb (float64:\n"
        "sd-scripts' get_crop_ltrb(bucket, original_size), the image fitted inside the bucket, which\n"
        "is what sd-scripts conditions SDXL on; not the box sdtk cut), latents_flipped when present,\n"
        "alpha_mask (float32 at the image's size) for a record with a loss mask (one stored at the\n"
        "latent size, as sd-latents --masks stores it, is widened 8x8).\n"
        "An SDXL text embedding becomes <stem>_te_outputs.npz (hidden_state1, hidden_state2, pool2;\n"
        "float16 when stored as fp16, else float32); other text embeddings have no kohya file and are\n"
        "counted apart (they do not make --strict fail). Records the names index misses are exported\n"
        "under their own names, with a warning. Files are written atomically; existing ones are\n"
        "replaced. sd and sdxl names say the model (import-kohya takes scaling_factor 0.18215 from\n"
        "_sd names, 0.13025 from _sdxl): a layout that contradicts the shard's scaling_factor is\n"
        "refused (exit 2) unless --force-layout.",
        opts, "Example:\n  sd-pack export-kohya cache.lmdb -o train_data --layout sdxl", NULL};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    sd_log_setup("sd-pack export-kohya", pc.quiet ? SD_LOG_WARN : pc.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    export_run r;
    memset(&r, 0, sizeof r);
    rc = -1;
    if (pos.n != 1) rc = (sd_cli_usage_error(&cli, "give exactly one SHARD"), SD_EXIT_USAGE);
    else if (!output) rc = (sd_cli_usage_error(&cli, "-o DIR is required"), SD_EXIT_USAGE);
    else if (pick_layout(layout, pos.v[0], &r.layout) || r.layout == SD_KOHYA_TE)
        rc = (sd_cli_usage_error(&cli, "--layout must be legacy, sd or sdxl"), SD_EXIT_USAGE);
    char msg[4200];
    if (rc < 0 && !force_layout && layout_contradicts(pos.v[0], r.layout, layout != NULL, msg, sizeof msg)) {
        sd_log(SD_LOG_ERROR, "%s", msg);
        rc = SD_EXIT_USAGE;
    }
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    r.dir = output;
    sd_tally_init(&r.tally, pc.verbose ? -1 : 10);
    sd_tally_init(&r.te_tally, pc.verbose ? -1 : 10);
    r.te_tally.verb = "te_outputs not written for";
    sd_progress prog;
    sd_progress_init(&prog, "sd-pack export-kohya", "records", 0, !pc.quiet);
    long leftovers = 0;
    warn_tmp_files(output, 0, &leftovers);
    if (leftovers > 10)
        sd_log(SD_LOG_WARN, "%s: %ld such temporary files in all (find %s -name '*.npz.tmp.*')", output, leftovers,
               output);
    sd_error err;
    sd_status st = mkdir(output, 0755) && errno != EEXIST
                       ? sd_err_set(&err, SD_EIO, "%s: cannot create directory: %s", output, strerror(errno))
                       : pack_walk(pos.v[0], &r.tally, &prog, export_one, &r, &err);
    pack_progress_finish(&prog, &r.tally);
    sd_buf_free(&r.file);
    sd_buf_free(&r.path);
    sd_buf_free(&r.lat);
    sd_buf_free(&r.flip);
    sd_buf_free(&r.mask);
    for (int i = 0; i < 3; i++) sd_buf_free(&r.te[i]);
    sd_strlist_free(&pos);
    if (st) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return SD_EXIT_FATAL;
    }
    if (r.te_tally.total) sd_tally_log(&r.te_tally, "text embeddings without a te_outputs file");
    sd_log(SD_LOG_INFO, "wrote %llu latents and %llu te_outputs npz files to %s, %llu records skipped, %llu text "
           "embeddings not written", (unsigned long long)r.written, (unsigned long long)r.te_written, output,
           (unsigned long long)r.tally.total, (unsigned long long)r.te_tally.total);
    if (!r.written && sd_tally_count(&r.tally, "mean+std record (kohya caches hold samples)") == r.tally.total &&
        r.tally.total)
        sd_log(SD_LOG_WARN, "nothing exported: every record holds the posterior's mean and std (sd-latents' "
               "default), and a kohya cache holds one sample per image; make the shard with sd-latents --sample");
    return pack_finish(&r.tally, &pc, "skipped");
}
