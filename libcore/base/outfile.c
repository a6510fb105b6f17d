#include "outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/* Whether a live process is writing the temporary output at path, so a
 * rerun can tell a killed run's leftover from a running run's file: the
 * writer holds an flock on it (sd_outfile_open on its PATH.tmp.* file, a
 * shard writer on its data file), which a probe from another open file
 * description sees, in this process too. The probe opens the file itself,
 * never LMDB's PATH-lock: closing any descriptor of a file drops every
 * fcntl lock this process holds on it, LMDB's own among them. */
int sd_outfile_held(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    int held = 0;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) held = errno == EWOULDBLOCK ? 1 : -1;
    int saved = errno;
    close(fd); /* drops the probe's own flock */
    errno = saved;
    return held;
}

/* The warning for one temporary output found beside an output: a killed
 * run's leftover (named, with the advice to remove it), a file a live run
 * is writing now (named, to be left alone), or, where the probe cannot
 * tell (no flock on this file system, no permission), the old hedge.
 * Never removed here. */
void sd_outfile_warn_leftover(const char *path, const char *also)
{
    int held = sd_outfile_held(path);
    if (held > 0)
        sd_log(SD_LOG_WARN, "%s: a temporary output another run is writing now; left alone", path);
    else if (held < 0)
        sd_log(SD_LOG_WARN, "%s: a temporary output left by an earlier run (killed?) or being written by another "
               "(cannot tell: %s); remove it%s unless a run is writing it now", path, strerror(errno), also);
    else
        sd_log(SD_LOG_WARN, "%s: a temporary output left by an earlier run (killed: no process holds it); remove "
               "it%s", path, also);
}

/* Name the temporary outputs a killed run left beside path (names that
 * start with path's base name and then infix: each run takes a fresh
 * mkstemp name, so they are never reused), so their space is not lost
 * unnoticed, and those a running run is writing, which are left alone.
 * also says what else to remove with one ("" for nothing). */
void sd_outfile_warn_leftovers(const char *path, const char *infix, const char *also)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? (slash == path ? "/" : path) : ".");
    const char *base = slash ? slash + 1 : path;
    size_t bl = strlen(base), il = strlen(infix);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, base, bl) != 0 || strncmp(e->d_name + bl, infix, il) != 0 ||
            strstr(e->d_name + bl, "-lock"))
            continue;
        char full[8200];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        sd_outfile_warn_leftover(full, also);
    }
    closedir(d);
}

/* sd_outfile_warn_leftovers for sd_outfile_open's own temporary names
 * (PATH.tmp.XXXXXX); nothing for stdout (NULL or "-"). A symlink's are
 * beside its target, where sd_outfile_open writes them. */
void sd_outfile_warn_own_leftovers(const char *path)
{
    if (!path || strcmp(path, "-") == 0) return;
    struct stat link;
    char *real = lstat(path, &link) == 0 && S_ISLNK(link.st_mode) ? realpath(path, NULL) : NULL;
    sd_outfile_warn_leftovers(real ? real : path, ".tmp.", "");
    free(real);
}

/* Create PATH.tmp.XXXXXX (six random letters and digits, a fresh name each
 * try) with mode 0666, so the kernel applies the umask as for any new file
 * (mkstemp's 0600 needed an fchmod to a guessed mode). tmp holds the name. */
static int create_temp(char *tmp, size_t cap, const char *path)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned char rnd[6];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t x = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)getpid() << 20 ^ (uint64_t)attempt << 40;
            for (size_t i = 0; i < sizeof rnd; i++) rnd[i] = (unsigned char)(x >> (8 * i));
        }
        char suffix[7];
        for (size_t i = 0; i < sizeof rnd; i++) suffix[i] = alnum[rnd[i] % (sizeof alnum - 1)];
        suffix[6] = 0;
        snprintf(tmp, cap, "%s.tmp.%s", path, suffix);
        int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Open path for writing through a temp file; NULL or "-" means stdout, and
 * an existing non-regular file (device, FIFO) is written in place. A new
 * file gets 0666 less the umask, a replaced one keeps its mode, and a
 * symlink to a regular file stays a link: its target is replaced. */
sd_status sd_outfile_open(sd_outfile *o, const char *path, sd_error *err)
{
    o->f = NULL;
    o->path = o->tmp = NULL;
    o->special = 0;
    o->flushed = 0;
    o->iobuf = NULL;
    if (!path || strcmp(path, "-") == 0) {
        o->f = stdout;
        /* stdout's default 4 KiB buffer means a syscall every few records
         * (glibc ignores the size unless it is given the buffer) */
        static char stdout_buf[1 << 20];
        if (!isatty(STDOUT_FILENO)) setvbuf(stdout, stdout_buf, _IOFBF, sizeof stdout_buf);
        return SD_OK;
    }
    struct stat target;
    int exists = stat(path, &target) == 0;
    if (exists && !S_ISREG(target.st_mode)) {
        /* a device or pipe (/dev/null, a FIFO): write to it directly, never rename over it */
        if (S_ISDIR(target.st_mode)) return sd_err_set(err, SD_EINVAL, "%s: is a directory", path);
        o->f = fopen(path, "w");
        if (!o->f) return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
        o->special = 1;
        o->path = strdup(path); /* for messages; NULL only costs the name */
        return SD_OK;
    }
    struct stat link;
    char *real = exists && lstat(path, &link) == 0 && S_ISLNK(link.st_mode) ? realpath(path, NULL) : NULL;
    if (real) path = real; /* the rename goes to the link's target, beside it */
    size_t n = strlen(path) + 32;
    o->path = strdup(path);
    free(real);
    path = o->path ? o->path : "";
    o->tmp = malloc(n);
    if (!o->path || !o->tmp) {
        sd_outfile_abort(o);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    int fd = create_temp(o->tmp, n, path);
    if (fd < 0) {
        sd_status st = sd_err_set(err, SD_EIO, "%s: cannot create temp file: %s", path, strerror(errno));
        free(o->tmp);
        o->tmp = NULL;
        sd_outfile_abort(o);
        return st;
    }
    if (exists && fchmod(fd, target.st_mode & 07777) != 0)
        sd_log(SD_LOG_WARN, "%s: cannot keep its mode %o: %s", path, (unsigned)(target.st_mode & 07777), strerror(errno));
    flock(fd, LOCK_EX | LOCK_NB); /* a fresh file: tells a rerun this one is live (sd_outfile_held) */
    o->f = fdopen(fd, "w");
    if (!o->f) {
        close(fd);
        sd_outfile_abort(o);
        return sd_err_set(err, SD_EIO, "%s: %s", path, strerror(errno));
    }
    o->iobuf = malloc(1 << 20); /* big writes: outputs run to gigabytes */
    if (o->iobuf) setvbuf(o->f, o->iobuf, _IOFBF, 1 << 20);
    return SD_OK;
}

/* First half of a commit: everything written reaches the disk (flushed,
 * fsync'ed, closed) under the temporary name, so several files can all be
 * made durable before any of them replaces its target. On failure the temp
 * file is dropped. Devices, FIFOs and stdout are finished here. */
sd_status sd_outfile_finish(sd_outfile *o, sd_error *err)
{
    if (o->special) {
        int bad = fflush(o->f) != 0 || ferror(o->f);
        int saved = errno;
        if (fclose(o->f) != 0 && !bad) bad = 1, saved = errno;
        o->f = NULL;
        o->special = 0;
        const char *name = o->path ? o->path : "output";
        sd_status st = bad ? sd_err_set(err, SD_EIO, "%s: write failed: %s", name, strerror(saved)) : SD_OK;
        free(o->path);
        o->path = NULL;
        return st;
    }
    if (!o->path) {
        if (fflush(stdout) != 0 || ferror(stdout)) return sd_err_set(err, SD_EIO, "writing stdout: %s", strerror(errno));
        return SD_OK;
    }
    if (!o->f) return SD_OK; /* finished already */
    int bad = fflush(o->f) != 0 || ferror(o->f) || fsync(fileno(o->f)) != 0;
    int saved = errno;
    if (fclose(o->f) != 0) bad = 1;
    o->f = NULL;
    free(o->iobuf);
    o->iobuf = NULL;
    if (bad) {
        sd_status st = sd_err_set(err, SD_EIO, "%s: write failed: %s", o->path, strerror(saved));
        sd_outfile_abort(o);
        return st;
    }
    return SD_OK;
}

/* fsync the directory holding path, so a rename in it survives a crash. */
static void sync_parent_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
    int dfd = open(d, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
}

/* 1 when two paths lie in the same directory (the same text before the
 * last '/'), so a set's directory is synced once, not once per file. */
static int same_dir(const char *a, const char *b)
{
    const char *sa = strrchr(a, '/'), *sb = strrchr(b, '/');
    size_t la = sa ? (size_t)(sa - a) : 0, lb = sb ? (size_t)(sb - b) : 0;
    return (sa != NULL) == (sb != NULL) && la == lb && memcmp(a, b, la) == 0;
}

/* Renames back to back, then the directory syncs (outfile.h). */
sd_status sd_rename_set(char *const *tmp, char *const *final, int n, int *tried, sd_error *err)
{
    sd_status st = SD_OK;
    int renamed = 0, end = 0;
    for (; end < n && !st; end++) {
        if (!tmp[end]) continue;
        if (rename(tmp[end], final[end]) == 0) renamed++;
        else st = sd_err_set(err, SD_EIO, "%s: rename failed: %s", final[end], strerror(errno));
    }
    if (st && renamed) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        sd_err_set(err, SD_EIO, "%s; %d file(s) of the set before it were already replaced: the set is mixed, rerun",
                   why, renamed);
    }
    const char *synced = NULL;
    for (int i = 0; i < end; i++) {
        if (!tmp[i] || (synced && same_dir(synced, final[i]))) continue;
        sync_parent_dir(final[i]);
        synced = final[i];
    }
    *tried = end;
    return st;
}

/* Second half: the finished temp file replaces the target, and the rename
 * itself is made durable. A no-op for stdout and devices. */
sd_status sd_outfile_publish(sd_outfile *o, sd_error *err)
{
    return sd_outfile_publish_set(o, 1, err);
}

/* Publish n finished files as one set: every rename back to back, with
 * nothing in between (no fsync, no allocation), then each directory synced
 * once, so a kill can split the set only inside that short run of renames.
 * POSIX has no rename of several files at once: a kill or a failing rename
 * there still leaves the files renamed before it in place (the error says
 * so); callers that need to tell write a marker of the set (sd-bucket's
 * manifest, sd-pack's split_set). */
sd_status sd_outfile_publish_set(sd_outfile *v, int n, sd_error *err)
{
    char **names = calloc((size_t)(n > 0 ? n : 1) * 2, sizeof *names); /* tmp[0..n), then final */
    if (!names) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        names[i] = v[i].path ? v[i].tmp : NULL; /* stdout or a device: nothing to rename */
        names[n + i] = v[i].path;
    }
    int end = 0; /* files [0, end) were tried */
    sd_status st = sd_rename_set(names, names + n, n, &end, err);
    free(names);
    if (st) sd_outfile_abort(&v[end - 1]); /* the one whose rename failed */
    for (int i = 0; i < n; i++) {
        if (i >= end) sd_outfile_abort(&v[i]); /* not renamed: drop the temp file */
        if (!v[i].tmp) continue;
        free(v[i].path);
        free(v[i].tmp);
        v[i].path = v[i].tmp = NULL;
    }
    return st;
}

/* Make the file appear whole: finish, then publish. */
sd_status sd_outfile_commit(sd_outfile *o, sd_error *err)
{
    sd_status st = sd_outfile_finish(o, err);
    return st ? st : sd_outfile_publish(o, err);
}

/* Start write-back of what was written so far without waiting for it, every
 * 8 MiB, so the fsync at commit finds little left to do: the disk works
 * while we compute. Call it between batches; a no-op for stdout/devices. */
void sd_outfile_writeback(sd_outfile *o)
{
    if (!o->tmp || !o->f) return;
    long long pos = ftell(o->f);
    if (pos < 0 || pos - o->flushed < (8ll << 20)) return;
    fflush(o->f);
    sync_file_range(fileno(o->f), o->flushed, pos - o->flushed, SYNC_FILE_RANGE_WRITE);
    o->flushed = pos;
}

/* Drop the temp file; the target is left as it was. */
void sd_outfile_abort(sd_outfile *o)
{
    if (o->f && o->f != stdout) fclose(o->f);
    free(o->iobuf);
    o->iobuf = NULL;
    if (o->tmp) unlink(o->tmp);
    o->special = 0;
    free(o->path);
    free(o->tmp);
    o->f = NULL;
    o->path = o->tmp = NULL;
}

/* An identity for the set of files one run publishes together (UTC time
 * and 8 random hex digits, e.g. 20260101T120000Z-3f9a1c2e): the time tells
 * a person which run is newer, the digits keep two runs in one second
 * apart. */
void sd_output_set_id(char *out, size_t cap)
{
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        rnd = (uint32_t)ts.tv_nsec * 2654435761u ^ (uint32_t)getpid();
    }
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32] = "00000000T000000Z";
    if (gmtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(out, cap, "%s-%08x", stamp, (unsigned)rnd);
}

/* Write a whole buffer atomically (reports, plots, small outputs). */
sd_status sd_write_file_atomic(const char *path, const void *data, size_t len, sd_error *err)
{
    sd_outfile o;
    sd_status st = sd_outfile_open(&o, path, err);
    if (st) return st;
    if (len && fwrite(data, 1, len, o.f) != len) {
        sd_outfile_abort(&o);
        return sd_err_set(err, SD_EIO, "%s: write failed: %s", path, strerror(errno));
    }
    return sd_outfile_commit(&o, err);
}

/* Each prefix ending at a '/' first, then the whole path; existing ones
 * are fine. */
sd_status sd_make_dirs(const char *path, sd_error *err)
{
    char p[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof p) return sd_err_set(err, SD_EINVAL, "bad directory path '%s'", path);
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return sd_err_set(err, SD_EIO, "%s: cannot create directory: %s", p, strerror(errno));
        p[i] = c;
    }
    return SD_OK;
}
