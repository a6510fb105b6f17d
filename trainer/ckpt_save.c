/* Writing training checkpoints: out_dir/checkpoint-<step>/ holding unet/
 * (a diffusers folder: config.json + diffusion_pytorch_model.safetensors),
 * with EMA also unet_ema/, and state.safetensors (AdamW moments, the fp32
 * master and EMA weights when the folders are stored in half precision,
 * and in its metadata the step, data cursor, RNG state and the options a
 * resume must share). Written into a .tmp directory, every file fsync'ed,
 * then renamed into place; out_dir/latest names the newest complete one;
 * older checkpoints pruned to --keep. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "dist.h"
#include "full_ckpt.h"
#include "log.h"
#include "outfile.h"
#include "safetensors.h"
#include "slurp.h"
#include "train.h"
#include "train_int.h"

/* The files of a checkpoint; the state file first, since removal goes in
 * this order and a checkpoint counts as whole while its state file is
 * there (sd_train_newest_checkpoint): a kill while pruning must not leave
 * a state file without its UNet. */
static const char *const ckpt_files[] = {"state.safetensors", "unet/config.json",
                                         "unet/diffusion_pytorch_model.safetensors", "unet_ema/config.json",
                                         "unet_ema/diffusion_pytorch_model.safetensors", "train_config.json",
                                         "unet.safetensors", "unet_ema.safetensors", "full.safetensors",
                                         "full_ema.safetensors"};

/* dir/name into buf (PATH_CAP bytes); callers check their directory's
 * length first, so nothing is cut. */
void sd_train_pjoin(char *buf, const char *dir, const char *name)
{
    size_t len = strlen(dir);
    int slash = len > 0 && dir[len - 1] == '/'; /* -o run/ names run/checkpoint-N, not run//checkpoint-N */
    int n = snprintf(buf, PATH_CAP, "%s%s%s", dir, slash ? "" : "/", name);
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
    if (*sub) sd_train_pjoin(d, dir, sub);
    else snprintf(d, sizeof d, "%s", dir);
    DIR *dd = opendir(d);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd)))
        for (size_t i = 0; i < sizeof ckpt_files / sizeof *ckpt_files; i++) {
            const char *base = name_in(ckpt_files[i], sub);
            if (base && sd_train_is_temp_of(e->d_name, base)) {
                sd_train_pjoin(p, d, e->d_name);
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
    sd_train_pjoin(p, dir, sub);
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Remove a checkpoint directory made by this code (only its own files and
 * their temporary names, so a wrong path never loses anything else; a
 * link where a directory should be is never followed: what it leads to is
 * someone else's, and the link keeps the directory); whether it is gone.
 * In a directory that is not the trainer's (sd_train_ckpt_owned: another
 * tool's checkpoint-N, say diffusers' with its own unet/) files with the
 * trainer's names are someone's model: only the unmistakable temporary
 * names (NAME.tmp.XXXXXX) go. The ownership mark goes last, so a prune
 * killed halfway leaves a directory the next prune still knows. trusted:
 * the directory is the trainer's by its name (checkpoint-N.tmp, where
 * saves are written; an older version's killed save left one unmarked). */
static int remove_own_files(const char *dir, int trusted)
{
    struct stat sb;
    if (lstat(dir, &sb) != 0) return errno == ENOENT;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return 0;
    }
    int owned = trusted || sd_train_ckpt_owned(dir);
    int unet = real_dir(dir, "unet"), ema = real_dir(dir, "unet_ema");
    char p[PATH_CAP];
    for (size_t i = 0; owned && i < sizeof ckpt_files / sizeof *ckpt_files; i++) {
        const char *f = ckpt_files[i];
        if ((name_in(f, "unet") && !unet) || (name_in(f, "unet_ema") && !ema)) continue;
        sd_train_pjoin(p, dir, f);
        unlink(p);
    }
    if (owned) {
        sd_train_remove_samples(dir, "samples");
        sd_train_remove_samples(dir, "samples-ema");
    }
    remove_temps(dir, "");
    if (unet) remove_temps(dir, "unet");
    if (ema) remove_temps(dir, "unet_ema");
    sd_train_pjoin(p, dir, "unet");
    if (unet) rmdir(p);
    sd_train_pjoin(p, dir, "unet_ema");
    if (ema) rmdir(p);
    sd_train_pjoin(p, dir, CKPT_MARK);
    if (owned) unlink(p);
    return rmdir(dir) == 0 || errno == ENOENT;
}

/* remove_own_files, naming a directory that stays (it holds other files). */
static void remove_ckpt(const char *dir)
{
    if (!remove_own_files(dir, 0)) sd_log(SD_LOG_WARN, "%s: not removed: %s", dir, strerror(errno));
}

/* A directory this code is done with but that must not stay under its
 * name (a .tmp that the next save reuses): its own files go, and when
 * anything else is left (files someone put into a checkpoint that was
 * saved again) the directory is renamed aside to DIR-kept-XXXXXX with a
 * warning, never deleted. A file or link of that name is removed. */
static sd_status discard_dir(const char *dir, int trusted, sd_error *err)
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
    if (remove_own_files(dir, trusted)) return SD_OK;
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
long sd_train_ckpt_step(const char *name)
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
int sd_train_ckpt_whole(const char *out, const char *name)
{
    char p[PATH_CAP];
    sd_train_pjoin(p, out, name);
    size_t pl = strlen(p);
    snprintf(p + pl, sizeof p - pl, "/state.safetensors");
    return access(p, F_OK) == 0;
}

/* Whether dir holds the trainer's train_config.json (its "_shards" list):
 * what an older version's prune, killed after it removed the state file
 * (it went first, the config later), left to say the directory is ours. */
static int config_is_ours(const char *dir)
{
    char p[PATH_CAP];
    sd_train_pjoin(p, dir, "train_config.json");
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_error e = {0};
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 12);
    int ours = sd_parse_json_file(p, &text, &a, &root, &e) == SD_OK && root->type == SD_JSON_OBJECT &&
               sd_json_get(root, "_shards") != NULL;
    sd_arena_free(&a);
    sd_buf_free(&text);
    return ours;
}

/* Whether dir is a checkpoint this trainer wrote: it carries the mark
 * every save puts in first, or (saved before the mark existed) an sdtk
 * training state, or, that state already pruned, the trainer's config.
 * Pruning and replacing touch nothing else. */
int sd_train_ckpt_owned(const char *dir)
{
    char p[PATH_CAP];
    sd_train_pjoin(p, dir, CKPT_MARK);
    if (access(p, F_OK) == 0) return 1;
    sd_train_pjoin(p, dir, "state.safetensors");
    if (access(p, F_OK) != 0) return config_is_ours(dir);
    sd_safetensors *st = NULL;
    sd_error e = {0};
    if (sd_st_open(&st, p, &e)) return 0;
    int ours = 0;
    for (size_t i = 0; i < sd_st_meta_count(st); i++)
        if (strcmp(sd_st_meta_at(st, i)->key, "format") == 0)
            ours = strcmp(sd_st_meta_at(st, i)->value, "sdtk-train-state 1") == 0;
    sd_st_close(st);
    return ours;
}

/* Put the ownership mark (sd_train_ckpt_owned) into a new checkpoint
 * directory before anything else goes in. */
static sd_status write_mark(const char *dir, sd_error *err)
{
    char p[PATH_CAP];
    sd_train_pjoin(p, dir, CKPT_MARK);
    static const char text[] = "a checkpoint written by sdtk's sd-train (--keep may remove it)\n";
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return sd_err_set(err, SD_EIO, "%s: %s", p, strerror(errno));
    int ok = write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1);
    int e = errno;
    close(fd);
    return ok ? SD_OK : sd_err_set(err, SD_EIO, "%s: %s", p, strerror(e));
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
        if (sd_train_ckpt_step(base) < 0 || !sd_train_ckpt_whole(out, base)) continue;
        sd_train_pjoin(p, out, e->d_name);
        remove_ckpt(p);
    }
    closedir(d);
}

/* Delete all but the newest `keep` checkpoints up to the one just written
 * (step current, always kept), and the folders of sample steps before the
 * oldest one kept; later steps are left alone. */
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
        long s = sd_train_ckpt_step(e->d_name);
        if (s < 0 || s > current) continue; /* a later step is another run's (--fresh): not ours to delete */
        char p[PATH_CAP];
        sd_train_pjoin(p, out, e->d_name);
        if (!sd_train_ckpt_owned(p)) continue; /* another tool's checkpoint-N: neither counted nor removed */
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
        sd_train_pjoin(p, out, nm);
        remove_ckpt(p);
    }
    /* the sample steps' folders before the oldest checkpoint kept go too */
    if (n > (size_t)keep) sd_train_prune_step_samples(out, steps[n - (size_t)keep]);
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

/* The run's weights saved as sd_unet_save writes them: fp32, or bf16
 * widened while written (no copy). */
static sd_status save_weights(const sd_trainer *tr, const char *p, sd_unet_names names, const char *prefix,
                              sd_error *err)
{
    if (tr->w16) return sd_unet_save_bf16(&tr->unet, tr->w16, p, names, prefix, tr->o.save_dtype, err);
    return sd_unet_save(&tr->unet, tr->unet.w.data, p, names, prefix, tr->o.save_dtype, err);
}

/* The training state file: moments (and master weights) plus metadata. */
static sd_status write_state(const sd_trainer *tr, const char *path, sd_error *err)
{
    size_t n = tr->unet.w.total, nt = 0;
    int mdt = tr->moment_size == 2 ? SD_ST_BF16 : SD_ST_F32; /* the moments as the run stores them */
    sd_st_tensor t[SD_OPT_MAX_BUFS + 2];
    char names[SD_OPT_MAX_BUFS][64];
    if (tr->o.optimizer == SD_OPT_ADAMW) {
        t[nt++] = flat_as("adam_m", tr->m, n, mdt);
        t[nt++] = flat_as("adam_v", tr->v, n, mdt);
    }
    const sd_opt_state *os = tr->opt_save ? tr->opt_save : &tr->opt; /* ZeRO: the gathered whole */
    for (size_t i = 0; i < os->nbufs; i++) { /* another optimizer's buffers, as opt.NAME */
        const sd_opt_buf *b = &os->bufs[i];
        if (!b->count) continue;
        snprintf(names[i], sizeof names[i], "opt.%s", b->name);
        t[nt] = (sd_st_tensor){.name = names[i], .dtype = b->st_dtype, .ndim = 1,
                               .nbytes = b->count * (b->st_dtype == SD_ST_U8 ? 1 : 4), .data = b->data};
        t[nt++].shape[0] = b->count;
    }
    if (tr->o.save_dtype != SD_ST_F32) {
        /* unet/ (and unet_ema/) are rounded: keep the fp32 originals here */
        t[nt++] = tr->w16 ? flat_as("params", tr->w16, n, SD_ST_BF16) : flat("params", tr->unet.w.data, n);
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
    char beta1[40] = "none";
    if (tr->o.adafactor_beta1 >= 0) snprintf(beta1, sizeof beta1, "%.17g", tr->o.adafactor_beta1);
    sd_st_meta meta[22] = {{"optimizer", sd_optimizer_name(tr->o.optimizer)}, {"adafactor_beta1", beta1},
                           {"weight_dtype", tr->w16 ? "bf16" : "fp32"},
                           {"epochs", v[15]}, {"epochs_steps", v[16]}, {"zero_terminal_snr", v[14]},
                           {"world_size", v[13]}, {"ema_updates", v[12]}, {"format", "sdtk-train-state 1"},
                           {"step", v[0]}, {"images", v[1]}, {"epoch", v[2]},
                           {"batch", v[3]}, {"rng", v[4]}, {"seed", v[5]}, {"data_fingerprint", v[6]},
                           {"batch_size", v[7]}, {"accumulation", v[8]}, {"prediction", v[9]},
                           {"param_floats", v[10]}, {"loss_smooth", v[11]},
                           {"batches", tr->o.no_carry ? "short" : "full"}};
    return sd_st_write(path, t, nt, meta, 22, err);
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
        if (discard_dir(tmp, 0, &why)) sd_log(SD_LOG_WARN, "%s", why.msg); /* now the old one: maybe not ours */
        return SD_OK;
    }
    char old[PATH_CAP];
    if ((size_t)snprintf(old, sizeof old, "%s.old", fin) >= sizeof old)
        return sd_err_set(err, SD_EINVAL, "output path too long: %s", fin);
    remove_ckpt(old);
    if (rename(fin, old) != 0) return sd_err_set(err, SD_EIO, "rename %s -> %s: %s", fin, old, strerror(errno));
    if (rename(tmp, fin) != 0) return sd_err_set(err, SD_EIO, "rename %s -> %s: %s", tmp, fin, strerror(errno));
    sd_error why = {0}; /* as after the swap: another tool's old one is set aside, not left as .old */
    if (discard_dir(old, 0, &why)) sd_log(SD_LOG_WARN, "%s", why.msg);
    return SD_OK;
}

/* full.safetensors (and full_ema.safetensors with an EMA) in dir: the
 * weights (and EMA) with the base model's VAE and text encoders, loaded for
 * this save and released after it (the run does not hold them between
 * saves; sd_trainer_open checked them at the start). */
static sd_status save_full(sd_trainer *tr, const char *dir, sd_error *err)
{
    sd_full_parts parts;
    sd_status rc = sd_full_parts_load(&parts, tr->o.base_model, &tr->unet.cfg, NULL, err);
    if (rc) return rc;
    char p[PATH_CAP];
    sd_train_pjoin(p, dir, "full.safetensors");
    rc = sd_train_w16_f32(tr, err); /* bf16 weights: widened into the (zero) gradient buffer */
    if (!rc) rc = sd_full_ckpt_write(p, &tr->unet, tr->unet.w.data, &parts, tr->o.save_dtype, err);
    sd_train_w16_f32_done(tr, 0);
    sd_train_pjoin(p, dir, "full_ema.safetensors");
    if (!rc && tr->ema) rc = sd_full_ckpt_write(p, &tr->unet, tr->ema, &parts, tr->o.save_dtype, err);
    sd_full_parts_free(&parts);
    return rc;
}

/* Write checkpoint-<step> through a .tmp directory and point latest at it. */
static sd_status save_local(sd_trainer *tr, sd_error *err)
{
    const char *out = tr->o.out_dir;
    if (!out) return SD_OK;
    char tmp[PATH_CAP], fin[PATH_CAP], p[PATH_CAP], name[64];
    snprintf(name, sizeof name, "checkpoint-%ld", tr->step);
    if (strlen(out) > PATH_CAP - 128) return sd_err_set(err, SD_EINVAL, "output path too long: %s", out);
    sd_train_pjoin(fin, out, name);
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", fin) >= sizeof tmp)
        return sd_err_set(err, SD_EINVAL, "output path too long: %s", out);
    sd_status rc = sd_make_dirs(out, err); /* -o a/b/run: parents too */
    if (rc) return rc;
    rc = discard_dir(tmp, 1, err); /* a run killed while saving left it */
    if (!rc) rc = make_dir(tmp, err);
    if (!rc) rc = write_mark(tmp, err);
    sd_train_pjoin(p, tmp, "unet");
    if (!rc) rc = make_dir(p, err);
    sd_train_pjoin(p, tmp, "unet/config.json");
    if (!rc) rc = sd_unet_config_write(&tr->unet.cfg, p, err);
    sd_train_pjoin(p, tmp, "unet/diffusion_pytorch_model.safetensors");
    if (!rc) rc = save_weights(tr, p, SD_UNET_NAMES_DIFFUSERS, "", err);
    if (tr->ema) {
        sd_train_pjoin(p, tmp, "unet_ema");
        if (!rc) rc = make_dir(p, err);
        sd_train_pjoin(p, tmp, "unet_ema/config.json");
        if (!rc) rc = sd_unet_config_write(&tr->unet.cfg, p, err);
        sd_train_pjoin(p, tmp, "unet_ema/diffusion_pytorch_model.safetensors");
        if (!rc) rc = sd_unet_save(&tr->unet, tr->ema, p, SD_UNET_NAMES_DIFFUSERS, "", tr->o.save_dtype, err);
        sd_train_pjoin(p, tmp, "unet_ema");
        if (!rc) rc = sync_dir(p, err);
    }
    if (tr->o.save_single) { /* one file with the original ldm names, for UIs that load a UNet alone */
        sd_train_pjoin(p, tmp, "unet.safetensors");
        if (!rc) rc = save_weights(tr, p, SD_UNET_NAMES_LDM, "model.diffusion_model.", err);
        sd_train_pjoin(p, tmp, "unet_ema.safetensors");
        if (!rc && tr->ema)
            rc = sd_unet_save(&tr->unet, tr->ema, p, SD_UNET_NAMES_LDM, "model.diffusion_model.", tr->o.save_dtype,
                              err);
    }
    if (!rc && tr->o.save_full) rc = save_full(tr, tmp, err); /* one file as A1111 and ComfyUI load a model */
    sd_train_pjoin(p, tmp, "state.safetensors");
    if (!rc) rc = write_state(tr, p, err);
    sd_train_pjoin(p, tmp, "train_config.json");
    if (!rc && tr->o.config_json) rc = sd_write_file_atomic(p, tr->o.config_json, strlen(tr->o.config_json), err);
    sd_train_pjoin(p, tmp, "unet");
    if (!rc) rc = sync_dir(p, err);
    if (!rc) rc = sync_dir(tmp, err);
    if (!rc) rc = put_in_place(tmp, fin, err);
    if (!rc) rc = sync_dir(out, err);
    sd_train_pjoin(p, out, "latest");
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
 * weights and moments copied back, ZeRO's moment shards (or the per-tensor
 * optimizers' runs) gathered whole (and sharded again afterwards). */
sd_status sd_train_save(sd_trainer *tr, sd_error *err)
{
    sd_status rc = sd_train_sync_host(tr, err);
    if (!rc) rc = sd_train_moments_full(tr, err);
    if (!rc) rc = sd_train_tensor_state_full(tr, err);
    if (!rc) rc = save_all(tr, err);
    sd_train_moments_shard(tr);
    sd_train_tensor_state_shard(tr);
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
