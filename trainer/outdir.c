/* sd-train's output directory before the run: made, probed for
 * writing, and held against a second trainer writing there. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "log.h"
#include "outfile.h"
#include "train.h"

/* checkpoint-N directories in out that another tool wrote (diffusers'
 * training scripts use the same names): named once at the start, so a
 * user sees that --keep neither counts nor removes them. */
static void warn_foreign_checkpoints(const char *out)
{
    DIR *d = opendir(out);
    if (!d) return;
    struct dirent *e;
    char p[PATH_CAP];
    struct stat sb;
    while ((e = readdir(d))) {
        if (sd_train_ckpt_step(e->d_name) < 0) continue;
        sd_train_pjoin(p, out, e->d_name);
        if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode) || sd_train_ckpt_owned(p)) continue;
        sd_log(SD_LOG_WARN, "%s: not a checkpoint of sd-train's (no %s, no sdtk training state): left alone; "
               "--keep neither counts nor removes it, and a save of that step sets it aside", p, CKPT_MARK);
    }
    closedir(d);
}

/* An -o that is a file, read-only or on a full disk would otherwise be
 * found when the first checkpoint is written: with the default of saving
 * at the end only, after the whole run. A probe file is made and removed
 * (a full disk may still show only at a checkpoint's fsync). */
sd_status sd_train_check_output(const char *out, sd_error *err)
{
    sd_status rc = sd_make_dirs(out, err);
    if (rc) return rc;
    char probe[PATH_CAP];
    if ((size_t)snprintf(probe, sizeof probe, "%s/.sd-train-probe.XXXXXX", out) >= sizeof probe)
        return sd_err_set(err, SD_EINVAL, "output path too long: %s", out);
    int fd = mkstemp(probe);
    if (fd < 0) return sd_err_set(err, SD_EIO, "%s: cannot write checkpoints there: %s", out, strerror(errno));
    int ok = write(fd, "x", 1) == 1; /* no fsync: a startup probe need not wait for the disk */
    int saved = errno;
    close(fd);
    unlink(probe);
    if (!ok) return sd_err_set(err, SD_EIO, "%s: cannot write checkpoints there: %s", out, strerror(saved));
    warn_foreign_checkpoints(out);
    return SD_OK;
}

/* Two trainers writing one -o (a job started twice, a requeue while the
 * first still runs) would delete each other's checkpoint-N.tmp and mix
 * their files in one checkpoint: the first holds an exclusive flock on the
 * directory itself for its whole run (no lock file to leave behind; the
 * kernel drops it when the process ends, however it ends). A file system
 * without flock (some NFS setups) gets a warning. */
sd_status sd_train_lock_output(const char *out, int *fd, sd_error *err)
{
    *fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0) return sd_err_set(err, SD_EIO, "%s: %s", out, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return SD_OK;
    int e = errno;
    if (e == EWOULDBLOCK) {
        close(*fd);
        *fd = -1;
        return sd_err_set(err, SD_EINVAL, "%s: another sd-train is writing its checkpoints there (it holds the "
                          "directory's lock): two runs in one -o would overwrite each other's checkpoints; wait for "
                          "it, stop it, or give this run another -o", out);
    }
    sd_log(SD_LOG_WARN, "%s: cannot lock it (%s): make sure no other sd-train writes there", out, strerror(e));
    return SD_OK;
}
