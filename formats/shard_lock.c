/* The locks around a shard: the writer's exclusive flock on the shard file,
 * the same lock taken by a tool about to replace the file, and LMDB's
 * PATH-lock reader table, whose pages are reserved before LMDB maps it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "shard_int.h"

/* The writer's exclusive lock: a second writer process fails at once. */
sd_status sd_shard_lock_writer(sd_shard *s, sd_error *err)
{
    int f = O_RDWR | O_CLOEXEC | (s->flags & SD_SHARD_CREATE ? O_CREAT : 0);
    s->lock_fd = open(s->path, f, 0644);
    if (s->lock_fd < 0)
        return sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", s->path, strerror(errno));
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB))
        return sd_err_set(err, SD_EIO, "%s: %s", s->path,
                          errno == EWOULDBLOCK ? "another process is writing this shard" : strerror(errno));
    return SD_OK;
}

/* The writer lock taken without opening the environment (see shard.h): a
 * tool replacing a shard file must not pull it from under a writer, whose
 * records would go on into the unlinked file and be lost. */
sd_status sd_shard_lock_file(const char *path, int *fd, int *held, sd_error *err)
{
    *held = 0;
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO there must not block the open */
    if (*fd < 0) return sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", path, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0) return SD_OK;
    int e = errno;
    close(*fd);
    *fd = -1;
    *held = e == EWOULDBLOCK;
    return sd_err_set(err, SD_EIO, "%s: %s", path, *held ? "another process is writing this shard" : strerror(e));
}

/* LMDB maps PATH-lock and writes its reader table into it: a lock file it
 * creates on a full disk is sparse, and the first write to it faults
 * (SIGBUS), in read-only tools too. So sdtk reserves its pages
 * (posix_fallocate; LMDB takes a larger file as it is): an existing one
 * in place (no data changes), a new one as a temporary file linked into
 * place (a process that made one meanwhile keeps its own; nothing another
 * process may use is ever unlinked). A full disk is then an error naming
 * the file. Where the lock file cannot be made or written because the
 * directory is not the user's (a team's shared cache), a reader goes
 * without LMDB's reader table (MDB_NOLOCK, *nolock set) with a warning: a
 * writer running meanwhile could reuse pages it reads. LMDB itself already
 * reads without a lock file on a read-only file system. */
sd_status sd_shard_prepare_lock_file(const char *path, int ro, int *nolock, sd_error *err)
{
    char lp[4200], tmp[4220];
    *nolock = 0;
    if ((size_t)snprintf(lp, sizeof lp, "%s-lock", path) >= sizeof lp)
        return sd_err_set(err, SD_EINVAL, "%s: path too long", path);
    off_t bytes = ((off_t)(MAX_READERS + 4) * 64 + 4095) & ~(off_t)4095;
    int fd = open(lp, O_RDWR | O_CLOEXEC), made = 0;
    if (fd < 0 && errno == ENOENT) {
        snprintf(tmp, sizeof tmp, "%s.XXXXXX", lp);
        fd = mkstemp(tmp);
        made = fd >= 0;
        if (made && fchmod(fd, 0644)) { /* mkstemp's 0600 would lock other users out, as LMDB's 0644 does not */
            close(fd);
            unlink(tmp);
            return SD_OK; /* LMDB's own open then */
        }
    }
    if (fd < 0) {
        if (ro && errno == EACCES) {
            sd_log(SD_LOG_WARN, "%s: cannot make or write it (%s): reading %s without LMDB's reader lock; do not "
                   "write that shard while this runs", lp, strerror(errno), path);
            *nolock = 1;
        }
        return SD_OK; /* anything else: LMDB's own open says it */
    }
    int e = posix_fallocate(fd, 0, bytes);
    close(fd);
    if (made) {
        if (!e && link(tmp, lp) != 0 && errno != EEXIST) e = errno;
        unlink(tmp);
    }
    if (e == ENOSPC || e == EDQUOT)
        return sd_err_set(err, SD_EIO, "%s: no room for LMDB's lock file (%lld bytes): %s", lp, (long long)bytes,
                          strerror(e));
    return SD_OK; /* EOPNOTSUPP and the like: LMDB sizes it as before */
}
