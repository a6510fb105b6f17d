/* Training checkpoints: out_dir/checkpoint-<step>/ holding unet/ (a
 * diffusers folder: config.json + diffusion_pytorch_model.safetensors), with
 * EMA also unet_ema/, and state.safetensors (AdamW moments, the fp32 master
 * and EMA weights when the folders are stored in half precision, and in its
 * metadata the step, data cursor, RNG
 * state and the options a resume must share). Written into a .tmp
 * directory, every file fsync'ed, then renamed into place; out_dir/latest
 * names the newest complete one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"
#include "dtype.h"
#include "log.h"
#include "outfile.h"
#include "safetensors.h"
#include "slurp.h"
#include "train.h"

enum { PATH_CAP = 4096 };

/* The files of a checkpoint; the state file first, since removal goes in
 * this order and a checkpoint counts as whole while its state file is
 * there (sd_train_newest_checkpoint): a kill while pruning must not leave
 * a state file without its UNet. */
static const char *const ckpt_files[] = {"state.safetensors", "unet/config.json",
                                         "unet/diffusion_pytorch_model.safetensors", "unet_ema/config.json",
                                         "unet_ema/diffusion_pytorch_model.safetensors", "train_config.json",
                                         "unet.safetensors", "unet_ema.safetensors"};

/* dir/name into buf (PATH_CAP bytes); callers check their directory's
 * length first, so nothing is cut. */
static void pjoin(char *buf, const char *dir, const char *name)
{
    int n = snprintf(buf, PATH_CAP, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_CAP) buf[0] = 0;
}

/* fsync a directory so renames and new entries in it are durable. */
static sd_status sync_dir(const char *path, sd_error *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    int bad = fsync(fd) != 0;
    close(fd);
    return bad ? sd_err_set(err, SD_EIO, "%s: fsync: %s", path, strerror(errno)) : SD_OK;
}

/* mkdir that accepts an existing directory. */
static sd_status make_dir(const char *path, sd_error *err)
{
    if (mkdir(path, 0777) == 0 || errno == EEXIST) return SD_OK;
    return sd_err_set(err, SD_EIO, "%s: cannot create directory: %s", path, strerror(errno));
}

/* Whether name is base + ".tmp." + 6 characters: the name sd_outfile
 * writes base under (mkstemp) until it renames it, left by a kill. */
static int is_temp_of(const char *name, const char *base)
{
    size_t bl = strlen(base);
    return strncmp(name, base, bl) == 0 && strncmp(name + bl, ".tmp.", 5) == 0 && strlen(name + bl + 5) == 6;
}

/* The checkpoint file rel (a ckpt_files entry) lies in sub ("" for the top):
 * its name there, or NULL when it lies elsewhere. */
static const char *name_in(const char *rel, const char *sub)
{
    const char *slash = strchr(rel, '/');
    if (!*sub) return slash ? NULL : rel;
    size_t sl = strlen(sub);
    return slash && (size_t)(slash - rel) == sl && strncmp(rel, sub, sl) == 0 ? slash + 1 : NULL;
}

/* Remove the temporary files that killed writes of this code's own files
 * left in dir/sub (a checkpoint saved by an older version took them in),
 * so that the directory can go. */
static void remove_temps(const char *dir, const char *sub)
{
    char d[PATH_CAP], p[PATH_CAP];
    if (*sub) pjoin(d, dir, sub);
    else snprintf(d, sizeof d, "%s", dir);
    DIR *dd = opendir(d);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd)))
        for (size_t i = 0; i < sizeof ckpt_files / sizeof *ckpt_files; i++) {
            const char *base = name_in(ckpt_files[i], sub);
            if (base && is_temp_of(e->d_name, base)) {
                pjoin(p, d, e->d_name);
                unlink(p);
                break;
            }
        }
    closedir(dd);
}

/* Whether dir/sub is a directory itself, not a link to one. */
static int real_dir(const char *dir, const char *sub)
{
    char p[PATH_CAP];
    pjoin(p, dir, sub);
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Remove a checkpoint directory made by this code (only its own files and
 * their temporary names, so a wrong path never loses anything else; a
 * link where a directory should be is never followed: what it leads to is
 * someone else's, and the link keeps the directory); whether it is gone. */
static int remove_own_files(const char *dir)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) return errno == ENOENT;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return 0;
    }
    int unet = real_dir(dir, "unet"), ema = real_dir(dir, "unet_ema");
    char p[PATH_CAP];
    for (size_t i = 0; i < sizeof ckpt_files / sizeof *ckpt_files; i++) {
        const char *f = ckpt_files[i];
        if ((name_in(f, "unet") && !unet) || (name_in(f, "unet_ema") && !ema)) continue;
        pjoin(p, dir, f);
        unlink(p);
    }
    remove_temps(dir, "");
    if (unet) remove_temps(dir, "unet");
    if (ema) remove_temps(dir, "unet_ema");
    pjoin(p, dir, "unet");
    if (unet) rmdir(p);
    pjoin(p, dir, "unet_ema");
    if (ema) rmdir(p);
    return rmdir(dir) == 0 || errno == ENOENT;
}

/* remove_own_files, naming a directory that stays (it holds other files). */
static void remove_ckpt(const char *dir)
{
    if (!remove_own_files(dir)) sd_log(SD_LOG_WARN, "%s: not removed: %s", dir, strerror(errno));
}

/* A directory this code is done with but that must not stay under its
 * name (a .tmp that the next save reuses): its own files go, and when
 * anything else is left (files someone put into a checkpoint that was
 * saved again) the directory is renamed aside to DIR-kept-XXXXXX with a
 * warning, never deleted. A file or link of that name is removed. */
static sd_status discard_dir(const char *dir, sd_error *err)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT) return SD_OK;
        return sd_err_set(err, SD_EIO, "%s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(dir) == 0) return SD_OK;
        return sd_err_set(err, SD_EIO, "%s: cannot remove: %s", dir, strerror(errno));
    }
    if (remove_own_files(dir)) return SD_OK;
    char aside[PATH_CAP];
    if ((size_t)snprintf(aside, sizeof aside, "%s-kept-XXXXXX", dir) >= sizeof aside)
        return sd_err_set(err, SD_EINVAL, "output path too long: %s", dir);
    if (!mkdtemp(aside) || rename(dir, aside) != 0)
        return sd_err_set(err, SD_EIO, "%s holds files that are not the trainer's and cannot be set aside: %s", dir,
                          strerror(errno));
    sd_log(SD_LOG_WARN, "%s held files that are not the trainer's: kept in %s", dir, aside);
    return SD_OK;
}

/* The step of a "checkpoint-<digits>" name, -1 for anything else. */
static long ckpt_step(const char *name)
{
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return -1;
    char *end;
    long s = strtol(name + 11, &end, 10);
    return *end || s < 0 ? -1 : s;
}

/* Sort helper for steps. */
static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

/* Whether out/name is a whole checkpoint: its state file is there (saves
 * write it before the rename, prunes remove it first). */
static int ckpt_whole(const char *out, const char *name)
{
    char p[PATH_CAP];
    pjoin(p, out, name);
    size_t pl = strlen(p);
    snprintf(p + pl, sizeof p - pl, "/state.safetensors");
    return access(p, F_OK) == 0;
}

/* Remove the checkpoint-N.old copies put_in_place set aside (a kill between
 * its two renames leaves one) once checkpoint-N itself is whole again. */
static void drop_old_asides(const char *out)
{
    DIR *d = opendir(out);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        char base[256], p[PATH_CAP];
        if (nl <= 4 || nl >= sizeof base || strcmp(e->d_name + nl - 4, ".old") != 0) continue;
        snprintf(base, sizeof base, "%.*s", (int)(nl - 4), e->d_name);
        if (ckpt_step(base) < 0 || !ckpt_whole(out, base)) continue;
        pjoin(p, out, e->d_name);
        remove_ckpt(p);
    }
    closedir(d);
}

/* Delete all but the newest `keep` checkpoints up to the one just written
 * (step current, always kept); later steps are left alone. */
static void prune(const char *out, int keep, long current)
{
    drop_old_asides(out);
    DIR *d = opendir(out);
    if (!d || keep <= 0) {
        if (d) closedir(d);
        return;
    }
    long *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = ckpt_step(e->d_name);
        if (s < 0 || s > current) continue; /* a later step is another run's (--fresh): not ours to delete */
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            long *q = realloc(steps, c * sizeof(long));
            if (!q) break;
            steps = q;
            cap = c;
        }
        steps[n++] = s;
    }
    closedir(d);
    qsort(steps, n, sizeof(long), cmp_long);
    char p[PATH_CAP];
    for (size_t i = 0; i + (size_t)keep < n; i++) {
        char nm[64];
        snprintf(nm, sizeof nm, "checkpoint-%ld", steps[i]);
        pjoin(p, out, nm);
        remove_ckpt(p);
    }
    free(steps);
}

/* One flat buffer of n values (fp32, or bf16 bits) as a safetensors tensor. */
static sd_st_tensor flat_as(const char *name, const void *p, size_t n, int st_dtype)
{
    sd_st_tensor t = {.name = name, .dtype = st_dtype, .ndim = 1, .nbytes = n * (st_dtype == SD_ST_BF16 ? 2 : 4),
                      .data = p};
    t.shape[0] = n;
    return t;
}

/* One flat fp32 buffer as a safetensors tensor. */
static sd_st_tensor flat(const char *name, const float *p, size_t n)
{
    return flat_as(name, p, n, SD_ST_F32);
}

/* The training state file: moments (and master weights) plus metadata. */
static sd_status write_state(const sd_trainer *tr, const char *path, sd_error *err)
{
    size_t n = tr->unet.w.total, nt = 2;
    int mdt = tr->moment_size == 2 ? SD_ST_BF16 : SD_ST_F32; /* the moments as the run stores them */
    sd_st_tensor t[4] = {flat_as("adam_m", tr->m, n, mdt), flat_as("adam_v", tr->v, n, mdt)};
    if (tr->o.save_dtype != SD_ST_F32) {
        /* unet/ (and unet_ema/) are rounded: keep the fp32 originals here */
        t[nt++] = flat("params", tr->unet.w.data, n);
        if (tr->ema) t[nt++] = flat("ema", tr->ema, n);
    }
    char v[17][80];
    snprintf(v[0], 80, "%ld", tr->step);
    snprintf(v[1], 80, "%ld", tr->images);
    snprintf(v[2], 80, "%ld", tr->cur.epoch);
    snprintf(v[3], 80, "%zu", tr->cur.batch);
    snprintf(v[4], 80, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, tr->rng.s[0], tr->rng.s[1],
             tr->rng.s[2], tr->rng.s[3]);
    snprintf(v[5], 80, "%" PRIu64, tr->o.seed);
    snprintf(v[6], 80, "%016" PRIx64, tr->have_data ? tr->data.fingerprint : 0);
    snprintf(v[7], 80, "%d", tr->o.batch);
    snprintf(v[8], 80, "%d", tr->o.accum);
    snprintf(v[9], 80, "%s", sd_prediction_name(tr->o.pred));
    snprintf(v[10], 80, "%zu", n);
    snprintf(v[11], 80, "%.17g", tr->loss_ema);
    snprintf(v[12], 80, "%ld", tr->ema ? tr->ema_updates : -1);
    snprintf(v[13], 80, "%d", tr->world > 0 ? tr->world : 1);
    snprintf(v[14], 80, "%d", tr->o.zero_terminal_snr ? 1 : 0);
    snprintf(v[15], 80, "%ld", tr->epochs);
    snprintf(v[16], 80, "%ld", tr->epochs_steps);
    sd_st_meta meta[19] = {{"epochs", v[15]}, {"epochs_steps", v[16]}, {"zero_terminal_snr", v[14]}, {"world_size", v[13]}, {"ema_updates", v[12]}, {"format", "sdtk-train-state 1"}, {"step", v[0]}, {"images", v[1]}, {"epoch", v[2]},
                           {"batch", v[3]}, {"rng", v[4]}, {"seed", v[5]}, {"data_fingerprint", v[6]},
                           {"batch_size", v[7]}, {"accumulation", v[8]}, {"prediction", v[9]},
                           {"param_floats", v[10]}, {"loss_smooth", v[11]},
                           {"batches", tr->o.no_carry ? "short" : "full"}};
    return sd_st_write(path, t, nt, meta, 19, err);
}

/* Move the finished tmp directory to fin. When fin exists (the same step
 * saved by an earlier run into this directory) the two are swapped in one
 * step (renameat2 RENAME_EXCHANGE) and the old one removed afterwards, so
 * a kill at any moment leaves a complete fin. Where the filesystem cannot
 * swap, the old one is set aside as fin.old first, which resolve() takes
 * should a kill fall between the two renames. */
static sd_status put_in_place(const char *tmp, const char *fin, sd_error *err)
{
    struct stat sb;
    if (stat(fin, &sb) != 0) {
        if (rename(tmp, fin) == 0) return SD_OK;
        return sd_err_set(err, SD_EIO, "rename %s -> %s: %s", tmp, fin, strerror(errno));
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) == 0) {
        sd_error why = {0}; /* the new one is in place: what is left of the old one is no failure */
        if (discard_dir(tmp, &why)) sd_log(SD_LOG_WARN, "%s", why.msg); /* now the old one */
        return SD_OK;
    }
    char old[PATH_CAP];
    if ((size_t)snprintf(old, sizeof old, "%s.old", fin) >= sizeof old)
        return sd_err_set(err, SD_EINVAL, "output path too long: %s", fin);
    remove_ckpt(old);
    if (rename(fin, old) != 0) return sd_err_set(err, SD_EIO, "rename %s -> %s: %s", fin, old, strerror(errno));
    if (rename(tmp, fin) != 0) return sd_err_set(err, SD_EIO, "rename %s -> %s: %s", tmp, fin, strerror(errno));
    remove_ckpt(old);
    return SD_OK;
}

/* Write checkpoint-<step> through a .tmp directory and point latest at it. */
static sd_status save_local(sd_trainer *tr, sd_error *err)
{
    const char *out = tr->o.out_dir;
    if (!out) return SD_OK;
    char tmp[PATH_CAP], fin[PATH_CAP], p[PATH_CAP], name[64];
    snprintf(name, sizeof name, "checkpoint-%ld", tr->step);
    if (strlen(out) > PATH_CAP - 128) return sd_err_set(err, SD_EINVAL, "output path too long: %s", out);
    pjoin(fin, out, name);
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", fin) >= sizeof tmp)
        return sd_err_set(err, SD_EINVAL, "output path too long: %s", out);
    sd_status rc = sd_make_dirs(out, err); /* -o a/b/run: parents too */
    if (rc) return rc;
    rc = discard_dir(tmp, err); /* a run killed while saving left it */
    if (!rc) rc = make_dir(tmp, err);
    pjoin(p, tmp, "unet");
    if (!rc) rc = make_dir(p, err);
    pjoin(p, tmp, "unet/config.json");
    if (!rc) rc = sd_unet_config_write(&tr->unet.cfg, p, err);
    pjoin(p, tmp, "unet/diffusion_pytorch_model.safetensors");
    if (!rc) rc = sd_unet_save(&tr->unet, tr->unet.w.data, p, SD_UNET_NAMES_DIFFUSERS, "", tr->o.save_dtype, err);
    if (tr->ema) {
        pjoin(p, tmp, "unet_ema");
        if (!rc) rc = make_dir(p, err);
        pjoin(p, tmp, "unet_ema/config.json");
        if (!rc) rc = sd_unet_config_write(&tr->unet.cfg, p, err);
        pjoin(p, tmp, "unet_ema/diffusion_pytorch_model.safetensors");
        if (!rc) rc = sd_unet_save(&tr->unet, tr->ema, p, SD_UNET_NAMES_DIFFUSERS, "", tr->o.save_dtype, err);
        pjoin(p, tmp, "unet_ema");
        if (!rc) rc = sync_dir(p, err);
    }
    if (tr->o.save_single) { /* one file with the original ldm names, for UIs that load a UNet alone */
        pjoin(p, tmp, "unet.safetensors");
        if (!rc)
            rc = sd_unet_save(&tr->unet, tr->unet.w.data, p, SD_UNET_NAMES_LDM, "model.diffusion_model.",
                              tr->o.save_dtype, err);
        pjoin(p, tmp, "unet_ema.safetensors");
        if (!rc && tr->ema)
            rc = sd_unet_save(&tr->unet, tr->ema, p, SD_UNET_NAMES_LDM, "model.diffusion_model.", tr->o.save_dtype,
                              err);
    }
    pjoin(p, tmp, "state.safetensors");
    if (!rc) rc = write_state(tr, p, err);
    pjoin(p, tmp, "train_config.json");
    if (!rc && tr->o.config_json) rc = sd_write_file_atomic(p, tr->o.config_json, strlen(tr->o.config_json), err);
    pjoin(p, tmp, "unet");
    if (!rc) rc = sync_dir(p, err);
    if (!rc) rc = sync_dir(tmp, err);
    if (!rc) rc = put_in_place(tmp, fin, err);
    if (!rc) rc = sync_dir(out, err);
    pjoin(p, out, "latest");
    char line[80];
    int len = snprintf(line, sizeof line, "%s\n", name);
    if (!rc) rc = sd_write_file_atomic(p, line, (size_t)len, err);
    if (rc) return rc;
    prune(out, tr->o.keep, tr->step);
    if (!tr->o.quiet) sd_log(SD_LOG_INFO, "saved %s", fin);
    return SD_OK;
}

/* Several ranks: they all finished the step (the step's reduction needs
 * every rank, and the barrier below confirms it), rank 0 alone writes the
 * checkpoint (every rank holds the same weights, moments and cursor) and
 * latest last, so latest only ever names a checkpoint of a step every rank
 * completed; then all ranks learn whether the write worked. */
static sd_status save_all(sd_trainer *tr, sd_error *err);

/* The state the checkpoint holds in host memory first: a GPU run's
 * weights and moments copied back, ZeRO-1's moment shards gathered whole
 * (and sharded again afterwards). */
sd_status sd_train_save(sd_trainer *tr, sd_error *err)
{
    sd_status rc = sd_train_sync_host(tr, err);
    if (!rc) rc = sd_train_moments_full(tr, err);
    if (!rc) rc = save_all(tr, err);
    sd_train_moments_shard(tr);
    if (!rc) tr->saved_step = tr->step;
    return rc;
}

/* Rank 0 writes; every rank learns whether it worked, waiting without
 * the hung-peer timeout. */
static sd_status save_all(sd_trainer *tr, sd_error *err)
{
    if (tr->world <= 1) return save_local(tr, err);
    int ok = 1;
    sd_status rc = sd_dist_all_ok(1, &ok, err);
    if (rc) return rc;
    sd_error e2 = {0};
    sd_status mine = tr->rank == 0 ? save_local(tr, err) : SD_OK;
    /* the others wait as long as rank 0 writes (tens of GB with fsync on
     * slow storage): the hung-peer timeout must not stop them mid-save */
    rc = sd_dist_all_ok_untimed(mine == SD_OK, &ok, mine ? &e2 : err);
    if (mine) return mine;
    if (rc) return rc;
    if (!ok) return sd_err_set(err, SD_EIO, "rank 0 could not write checkpoint-%ld (its log says why)", tr->step);
    return SD_OK;
}

/* A metadata value of the state file, NULL when absent. */
static const char *meta_of(const sd_safetensors *st, const char *key)
{
    for (size_t i = 0; i < sd_st_meta_count(st); i++)
        if (strcmp(sd_st_meta_at(st, i)->key, key) == 0) return sd_st_meta_at(st, i)->value;
    return NULL;
}

/* A flat fp32 tensor of n values in the state file, checked. */
static sd_status flat_of(const sd_safetensors *st, const char *name, size_t n, const char *path,
                         const sd_st_tensor **out, sd_error *err)
{
    const sd_st_tensor *t = sd_st_find(st, name);
    if (!t || t->dtype != SD_ST_F32 || t->ndim != 1 || t->shape[0] != n)
        return sd_err_set(err, SD_EFORMAT, "%s: tensor %s missing or not %zu fp32 values", path, name, n);
    *out = t;
    return SD_OK;
}

/* The state file's moments (fp32 or bf16, both of n values and the same
 * dtype), checked; *dt their SD_DT_ type. A run that stores the other
 * type is told that they are converted once. */
static sd_status moments_of(const sd_trainer *tr, const sd_safetensors *st, size_t n, const char *path,
                            const sd_st_tensor **m, const sd_st_tensor **v, int *dt, sd_error *err)
{
    *m = sd_st_find(st, "adam_m");
    *v = sd_st_find(st, "adam_v");
    for (int i = 0; i < 2; i++) {
        const sd_st_tensor *t = i ? *v : *m;
        if (!t || (t->dtype != SD_ST_F32 && t->dtype != SD_ST_BF16) || t->dtype != (*m)->dtype || t->ndim != 1 ||
            t->shape[0] != n)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor %s missing or not %zu fp32 or bf16 values (as adam_m)",
                              path, i ? "adam_v" : "adam_m", n);
    }
    *dt = (*m)->dtype == SD_ST_BF16 ? SD_DT_BF16 : SD_DT_F32;
    if (*dt != tr->o.moments && tr->rank == 0)
        sd_log(SD_LOG_WARN, "%s: the AdamW moments are %s there and %s in this run: %s once (not an exact "
               "continuation)", path, sd_dtype_name(*dt), sd_dtype_name(tr->o.moments),
               *dt == SD_DT_F32 ? "rounded to bf16" : "widened");
    return SD_OK;
}

/* A flat fp32 tensor of the state file into dst (n floats). */
static sd_status read_flat(const sd_safetensors *st, const char *name, float *dst, size_t n, const char *path,
                           sd_error *err)
{
    const sd_st_tensor *t = NULL;
    sd_status rc = flat_of(st, name, n, path, &t, err);
    if (!rc) memcpy(dst, t->data, n * 4);
    return rc;
}

/* Resolve dir (a checkpoint, or an output directory with latest) into out
 * (PATH_CAP bytes); name gets what latest holds, "" without one. */
static sd_status resolve(const char *dir, char *out, char name[128], sd_error *err)
{
    char p[PATH_CAP];
    pjoin(p, dir, "latest");
    name[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f) {
        snprintf(out, PATH_CAP, "%s", dir);
        return SD_OK;
    }
    int ok = fgets(name, 128, f) != NULL;
    fclose(f);
    name[strcspn(name, "\r\n")] = 0;
    if (!ok || ckpt_step(name) < 0) return sd_err_set(err, SD_EFORMAT, "%s: not a checkpoint name", p);
    pjoin(out, dir, name);
    struct stat sb;
    char old[PATH_CAP];
    if (stat(out, &sb) != 0 && (size_t)snprintf(old, sizeof old, "%s.old", out) < sizeof old && stat(old, &sb) == 0) {
        sd_log(SD_LOG_WARN, "%s is missing: taking %s, the same step's earlier save (a run was killed while "
               "replacing it)", out, old);
        memcpy(out, old, strlen(old) + 1);
    }
    return SD_OK;
}

/* Check one option the checkpoint was made with against this run's. */
static sd_status same(const sd_safetensors *st, const char *key, const char *want, const char *path, sd_error *err)
{
    const char *v = meta_of(st, key);
    if (!v || strcmp(v, want) != 0)
        return sd_err_set(err, SD_EINVAL, "%s: made with %s %s, this run has %s: resume with the same options", path,
                          key, v ? v : "(none)", want);
    return SD_OK;
}

/* The shard list of a run: names joined by ", ", cut with "..." where
 * they do not fit cap. */
static void join_names(char *buf, size_t cap, const char *const *v, size_t n)
{
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && at + 4 < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", v[i]);
        if (w < 0 || (size_t)w >= cap - at) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), 4, "...");
            return;
        }
        at += (size_t)w;
    }
}

/* Other training data than the checkpoint's: the shards it was made from
 * (its train_config.json's _shards) and this run's, since a fingerprint
 * alone tells a user nothing. */
static sd_status data_differs(const sd_trainer *tr, const char *ck, const char *p, sd_error *err)
{
    char cfg[PATH_CAP], was[600] = "(not recorded)", now[600];
    pjoin(cfg, ck, "train_config.json");
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 12);
    sd_error e = {0};
    const sd_json *sh = sd_parse_json_file(cfg, &text, &a, &root, &e) == SD_OK ? sd_json_get(root, "_shards") : NULL;
    if (sh && sh->type == SD_JSON_ARRAY) {
        const char *names[64];
        size_t n = 0;
        for (const sd_json *v = sh->child; v && n < 64; v = v->next)
            if (v->type == SD_JSON_STRING) names[n++] = v->str;
        join_names(was, sizeof was, names, n);
    }
    join_names(now, sizeof now, tr->o.shards, (size_t)tr->o.nshards);
    sd_status rc = sd_err_set(err, SD_EINVAL, "%s: made from other training data (%s) than this run's (%s), or from "
                              "shards of these names holding other records: resume with the same shards in the same "
                              "order and repeats, or start a new run from its weights with --unet %s/unet",
                              p, was, now, ck);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}

/* The newest checkpoint-N of out below step `below` that is whole (it
 * holds its state file), -1 when there is none. */
long sd_train_newest_checkpoint(const char *out, long below)
{
    DIR *d = opendir(out);
    if (!d) return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s = ckpt_step(e->d_name);
        if (s > best && s < below && ckpt_whole(out, e->d_name)) best = s;
    }
    closedir(d);
    return best;
}

/* The checkpoint's unet/config.json against the run's UNet: a resume
 * under another architecture with the same parameter count (other head
 * counts or norm groups) would load the weights into the wrong model
 * silently. The first field that differs is named. */
static sd_status same_unet(const sd_unet_config *run, const char *ck, sd_error *err)
{
    char p[PATH_CAP], field[96], here[32], there[32];
    pjoin(p, ck, "unet/config.json");
    sd_unet_config c;
    sd_error e = {0};
    sd_unet_config_default(&c); /* what the file leaves out keeps diffusers' default, as for the run's */
    if (sd_unet_config_read(p, &c, &e)) return sd_err_set(err, SD_EFORMAT, "%s", e.msg);
    if (!sd_unet_config_diff(run, &c, field, sizeof field, here, there, sizeof here)) return SD_OK;
    return sd_err_set(err, SD_EINVAL, "%s: the checkpoint's UNet differs from this run's (%s: %s there, %s here): "
                      "resume with the model it was made with, or start a new run from its weights with --unet "
                      "%s/unet", p, field, there, here, ck);
}

/* Load weights, moments, counters, cursor and RNG state. */
static sd_status resume_from(sd_trainer *tr, const char *ck, sd_error *err)
{
    char p[PATH_CAP], w[64];
    pjoin(p, ck, "state.safetensors");
    sd_safetensors *st = NULL;
    sd_status rc = sd_st_open(&st, p, err);
    if (rc) return rc;
    size_t n = tr->unet.w.total;
    const char *fmt = meta_of(st, "format");
    if (!fmt || strcmp(fmt, "sdtk-train-state 1") != 0)
        rc = sd_err_set(err, SD_EFORMAT, "%s: not an sdtk training state", p);
    snprintf(w, sizeof w, "%zu", n);
    if (!rc) rc = same(st, "param_floats", w, p, err);
    if (!rc) rc = same_unet(&tr->unet.cfg, ck, err);
    snprintf(w, sizeof w, "%" PRIu64, tr->o.seed);
    if (!rc) rc = same(st, "seed", w, p, err);
    snprintf(w, sizeof w, "%d", tr->o.batch);
    if (!rc) rc = same(st, "batch_size", w, p, err);
    snprintf(w, sizeof w, "%d", tr->o.accum);
    if (!rc) rc = same(st, "accumulation", w, p, err);
    if (!rc) {
        /* the global batch is world x batch x accumulation: another world
         * size keeps the model, moments and cursor but changes the batch */
        const char *ws = meta_of(st, "world_size");
        int was = ws ? atoi(ws) : 1, now = tr->world > 0 ? tr->world : 1;
        tr->saved_world = was > 0 ? was : 1;
        const char *ep = meta_of(st, "epochs"), *es = meta_of(st, "epochs_steps");
        tr->saved_epochs = ep ? atol(ep) : 0;
        tr->saved_epochs_steps = es ? atol(es) : 0;
        if (was != now && tr->rank == 0)
            sd_log(SD_LOG_WARN,
                   "%s: made with %d rank(s), this run has %d: the global batch changes from %d to %d samples per "
                   "step and the batches continue from the saved cursor in another grouping (not an exact "
                   "continuation)",
                   p, was, now, was * tr->o.batch * tr->o.accum, now * tr->o.batch * tr->o.accum);
    }
    if (!rc) rc = same(st, "prediction", sd_prediction_name(tr->o.pred), p, err);
    if (!rc) { /* the schedule: states from before the option have the plain one */
        const char *was = meta_of(st, "zero_terminal_snr");
        if ((was && strcmp(was, "1") == 0) != (tr->o.zero_terminal_snr != 0))
            rc = sd_err_set(err, SD_EINVAL, "%s: made %s --zero-terminal-snr, this run %s it: resume with the same "
                            "noise schedule", p, was && strcmp(was, "1") == 0 ? "with" : "without",
                            tr->o.zero_terminal_snr ? "has" : "lacks");
    }
    if (!rc) { /* how epochs are cut decides the data order; states from before full batches cut short ones */
        const char *was = meta_of(st, "batches"), *now = tr->o.no_carry ? "short" : "full";
        if (strcmp(was ? was : "short", now) != 0)
            rc = sd_err_set(err, SD_EINVAL, "%s: made with %s last batches per bucket, this run has %s: resume %s",
                            p, was ? was : "short", now, tr->o.no_carry ? "without --no-carry" : "with --no-carry");
    }
    snprintf(w, sizeof w, "%016" PRIx64, tr->have_data ? tr->data.fingerprint : 0);
    if (!rc && (!meta_of(st, "data_fingerprint") || strcmp(meta_of(st, "data_fingerprint"), w) != 0))
        rc = data_differs(tr, ck, p, err);
    const sd_st_tensor *tm = NULL, *tv = NULL;
    int mdt = SD_DT_F32;
    if (!rc) rc = moments_of(tr, st, n, p, &tm, &tv, &mdt, err);
    if (!rc && tr->o.zero1) { /* each rank takes its segments from the mapped file: no whole copy */
        sd_train_moments_from(tr, tm->data, tv->data, mdt);
    } else if (!rc) {
        sd_train_moments_convert(tr->m, tr->o.moments, tm->data, mdt, n);
        sd_train_moments_convert(tr->v, tr->o.moments, tv->data, mdt, n);
    }
    if (!rc && sd_st_find(st, "params")) {
        rc = read_flat(st, "params", tr->unet.w.data, n, p, err);
    } else if (!rc) {
        /* fp32 unet/ holds the master weights exactly */
        char wp[PATH_CAP];
        pjoin(wp, ck, "unet/diffusion_pytorch_model.safetensors");
        sd_safetensors *ws = NULL;
        rc = sd_st_open(&ws, wp, err);
        sd_weight_layout lay = {"", 0};
        if (!rc) rc = sd_weights_load(&tr->unet.w, ws, &lay, wp, err);
        if (ws) sd_st_close(ws);
    }
    if (!rc && !tr->ema) {
        const char *eu = meta_of(st, "ema_updates");
        if (eu && strtol(eu, NULL, 10) >= 0)
            rc = sd_err_set(err, SD_EINVAL, "%s: the checkpoint keeps an EMA of the weights: resume with --ema-decay "
                            "(or start a new run from its unet/ without one)", p);
    }
    if (!rc && tr->ema) {
        const char *eu = meta_of(st, "ema_updates");
        long upd = eu ? strtol(eu, NULL, 10) : -1;
        if (upd < 0) rc = sd_err_set(err, SD_EINVAL, "%s: the checkpoint has no EMA weights (trained without EMA)", p);
        else if (sd_st_find(st, "ema")) rc = read_flat(st, "ema", tr->ema, n, p, err);
        else {
            char wp[PATH_CAP];
            pjoin(wp, ck, "unet_ema/diffusion_pytorch_model.safetensors");
            sd_safetensors *ws = NULL;
            rc = sd_st_open(&ws, wp, err);
            sd_weight_layout lay = {"", 0};
            float *model = tr->unet.w.data;
            tr->unet.w.data = tr->ema; /* load the EMA file into the EMA buffer */
            if (!rc) rc = sd_weights_load(&tr->unet.w, ws, &lay, wp, err);
            tr->unet.w.data = model;
            if (ws) sd_st_close(ws);
        }
        tr->ema_updates = upd;
    }
    if (!rc) {
        const char *rs = meta_of(st, "rng");
        int ok = rs && strlen(rs) == 64;
        for (int i = 0; i < 4 && ok; i++) {
            char word[17];
            memcpy(word, rs + 16 * i, 16);
            word[16] = 0;
            char *end;
            tr->rng.s[i] = strtoull(word, &end, 16);
            ok = !*end;
        }
        const char *s = meta_of(st, "step"), *im = meta_of(st, "images"), *ep = meta_of(st, "epoch");
        const char *bt = meta_of(st, "batch"), *ls = meta_of(st, "loss_smooth");
        if (!ok || !s || !im || !ep || !bt) rc = sd_err_set(err, SD_EFORMAT, "%s: incomplete metadata", p);
        else {
            tr->step = strtol(s, NULL, 10);
            tr->images = strtol(im, NULL, 10);
            tr->cur.epoch = strtol(ep, NULL, 10);
            tr->cur.batch = (size_t)strtoull(bt, NULL, 10);
            tr->loss_ema = ls ? strtod(ls, NULL) : NAN;
        }
    }
    memset(tr->grad, 0, n * sizeof(float));
    tr->dev_stale = tr->cuda != NULL; /* a GPU run uploads the loaded state before its next step */
    tr->host_stale = 0;
    sd_st_close(st);
    if (rc) return rc;
    if (!tr->o.quiet) sd_log(SD_LOG_INFO, "resumed from %s at step %ld", ck, tr->step);
    if (tr->rank == 0) {
        pjoin(p, ck, "train_config.json");
        sd_train_resume_diff(p, tr->o.config_json);
    }
    if (tr->o.out_dir) { /* the step is on disk where this run saves: no need to write it again */
        char mine[PATH_CAP], a[PATH_CAP], b[PATH_CAP];
        snprintf(w, sizeof w, "checkpoint-%ld", tr->step);
        pjoin(mine, tr->o.out_dir, w);
        if (realpath(mine, a) && realpath(ck, b) && strcmp(a, b) == 0) tr->saved_step = tr->step;
    }
    return SD_OK;
}

/* resume_from the checkpoint dir's latest names (or dir itself), and
 * where that cannot be read (missing, cut short, garbage in latest), the
 * way on: the newest whole checkpoint before it, or --fresh. Option
 * mismatches (SD_EINVAL) say their own remedy; rank 0 speaks for all. */
sd_status sd_train_resume(sd_trainer *tr, const char *dir, sd_error *err)
{
    char ck[PATH_CAP], name[128], lp[PATH_CAP];
    if (strlen(dir) > PATH_CAP - 128) return sd_err_set(err, SD_EINVAL, "checkpoint path too long: %s", dir);
    sd_status rc = resolve(dir, ck, name, err);
    if (!rc) rc = resume_from(tr, ck, err);
    if (!rc || rc == SD_EINVAL || !name[0] || tr->rank != 0) return rc;
    pjoin(lp, dir, "latest");
    long step = ckpt_step(name), older = sd_train_newest_checkpoint(dir, step >= 0 ? step : LONG_MAX);
    if (older >= 0)
        sd_log(SD_LOG_ERROR, "%s names %s, which cannot be read; %s/checkpoint-%ld is the newest whole checkpoint "
               "before it: --resume %s/checkpoint-%ld continues from there, --fresh starts over", lp, name, dir, older,
               dir, older);
    else
        sd_log(SD_LOG_ERROR, "%s names %s, which cannot be read, and no whole checkpoint before it is there: --fresh "
               "starts over", lp, name);
    return rc;
}
