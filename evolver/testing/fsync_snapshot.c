/* A power-loss model for a process and the processes it starts (the daemon and its worker processes,
 * which write one database): for each file under $DURABLE_PREFIX (except those whose path
 * under it starts with $DURABLE_EXCLUDE, when set), keep in $DURABLE_SNAPSHOTS a copy of the file as of
 * its last successful fsync/fdatasync, and nothing for a file never synced. tests/_durability.py builds
 * it with gcc and rebuilds a data dir from the copies.
 *
 * Writes and truncations of a watched file wait while a sync of any watched file and its copy run (one
 * lock: a mutex between threads and an flock on $DURABLE_SNAPSHOTS/.lock between processes), so a copy
 * holds exactly what the sync made durable: nothing written after it returned, by any process.
 * LD_PRELOAD stays set for children: the sandboxes start with a cleared environment anyway.
 * unlink and rename of a watched path apply to its copy at once (on ext4, an fsync commits the journal
 * with every earlier metadata change, so a later sync makes them durable anyway). Snapshot names are
 * the path under the prefix with '/' and '%' percent-encoded; ".log" lists every copy made. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define PATH 4096

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char prefix[PATH], snapshots[PATH], exclude[PATH];
static size_t prefix_len;
static int active;
static int lock_fd = -1;

static void take(void) {
    pthread_mutex_lock(&lock);
    if (lock_fd >= 0)
        while (flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {}
}

static void give(void) {
    if (lock_fd >= 0) flock(lock_fd, LOCK_UN);
    pthread_mutex_unlock(&lock);
}

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off_t);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);

__attribute__((constructor)) static void setup(void) {
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_ftruncate64 = dlsym(RTLD_NEXT, "ftruncate64");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    const char *p = getenv("DURABLE_PREFIX"), *s = getenv("DURABLE_SNAPSHOTS");
    if (p && s && strlen(p) < PATH && strlen(s) < PATH) {
        strcpy(prefix, p);
        strcpy(snapshots, s);
        prefix_len = strlen(prefix);
        const char *x = getenv("DURABLE_EXCLUDE");
        if (x && strlen(x) < PATH) strcpy(exclude, x);
        active = 1;
        char name[PATH + 8];
        snprintf(name, sizeof name, "%s/.lock", snapshots);
        lock_fd = open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    }
}

/* The part of an absolute path under the prefix, or NULL. */
static const char *under(const char *path) {
    size_t n = strlen(path);
    if (!active || n <= prefix_len + 1 || strncmp(path, prefix, prefix_len) != 0 || path[prefix_len] != '/')
        return NULL;
    if (exclude[0] && strncmp(path + prefix_len + 1, exclude, strlen(exclude)) == 0) return NULL;
    return path + prefix_len + 1;
}

/* The path of an open fd under the prefix, or NULL. */
static const char *tracked_fd(int fd, char *path) {
    char link[64];
    if (!active) return NULL;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, PATH - 1);
    if (n <= 0) return NULL;
    path[n] = 0;
    return under(path);
}

/* An absolute form of a path given to unlink/rename (relative to dirfd or the working directory). */
static const char *absolute(int dirfd, const char *path, char *out) {
    char base[PATH / 2];
    if (path[0] == '/') {
        snprintf(out, PATH, "%s", path);
        return under(out);
    }
    if (dirfd == AT_FDCWD) {
        if (getcwd(base, sizeof base) == NULL) return NULL;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n <= 0) return NULL;
        base[n] = 0;
    }
    snprintf(out, PATH, "%s/%s", base, path);
    return under(out);
}

static void copy_name(const char *rel, char *out) {
    char flat[PATH];
    size_t j = 0;
    for (const char *c = rel; *c && j + 4 < sizeof flat; c++) {
        if (*c == '/' || *c == '%') j += sprintf(flat + j, "%%%02X", (unsigned char)*c);
        else flat[j++] = *c;
    }
    flat[j] = 0;
    snprintf(out, 2 * PATH, "%s/%s", snapshots, flat);
}

static void note(const char *what, const char *rel) {
    char name[PATH + 8], line[PATH + 32];
    snprintf(name, sizeof name, "%s/.log", snapshots);
    int fd = open(name, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "%s %s\n", what, rel);
    real_write(fd, line, n);
    close(fd);
}

/* Copy the file's whole content to its snapshot, through a temporary file and a rename. */
static void snapshot(int fd, const char *rel) {
    struct stat st;
    char dest[2 * PATH], tmp[PATH + 32], buf[1 << 16];
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    copy_name(rel, dest);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d", snapshots, (int)getpid());
    int src = fd, own = -1;
    if (pread(fd, buf, 0, 0) < 0) { /* opened write-only: read it through /proc */
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        own = src = open(link, O_RDONLY);
        if (src < 0) { note("unreadable", rel); return; }
    }
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0) { if (own >= 0) close(own); note("failed", rel); return; }
    off_t at = 0;
    for (;;) {
        ssize_t n = pread(src, buf, sizeof buf, at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (ssize_t done = 0; done < n;) {
            ssize_t w = real_write(out, buf + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) { close(out); if (own >= 0) close(own); note("failed", rel); return; }
            done += w;
        }
        at += n;
    }
    close(out);
    if (own >= 0) close(own);
    note(real_rename(tmp, dest) == 0 ? "synced" : "failed", rel);
}

static int synced(int fd, int (*real)(int)) {
    char path[PATH];
    const char *rel = tracked_fd(fd, path);
    if (rel == NULL) return real(fd);
    take();
    int rc = real(fd);
    int saved = errno;
    if (rc == 0) snapshot(fd, rel);
    give();
    errno = saved;
    return rc;
}

int fsync(int fd) { return synced(fd, real_fsync); }
int fdatasync(int fd) { return synced(fd, real_fdatasync); }

#define GUARDED(call) do { \
        char path[PATH]; \
        if (tracked_fd(fd, path) == NULL) return call; \
        take(); \
        __typeof__(call) rc = call; \
        int saved = errno; \
        give(); \
        errno = saved; \
        return rc; \
    } while (0)

ssize_t write(int fd, const void *b, size_t n) { GUARDED(real_write(fd, b, n)); }
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) { GUARDED(real_pwrite(fd, b, n, o)); }
ssize_t pwrite64(int fd, const void *b, size_t n, off_t o) { GUARDED(real_pwrite64(fd, b, n, o)); }
ssize_t writev(int fd, const struct iovec *v, int c) { GUARDED(real_writev(fd, v, c)); }
int ftruncate(int fd, off_t l) { GUARDED(real_ftruncate(fd, l)); }
int ftruncate64(int fd, off_t l) { GUARDED(real_ftruncate64(fd, l)); }

static int removed(int dirfd, const char *path, int rc) {
    char abs[PATH], dest[2 * PATH];
    const char *rel = rc == 0 ? absolute(dirfd, path, abs) : NULL;
    if (rel != NULL) {
        copy_name(rel, dest);
        if (real_unlink(dest) == 0) note("unlinked", rel);
    }
    return rc;
}

int unlink(const char *path) {
    take();
    int rc = real_unlink(path), saved = errno;
    removed(AT_FDCWD, path, rc);
    give();
    errno = saved;
    return rc;
}

int unlinkat(int dirfd, const char *path, int flags) {
    take();
    int rc = real_unlinkat(dirfd, path, flags), saved = errno;
    removed(dirfd, path, rc);
    give();
    errno = saved;
    return rc;
}

/* The new path names the old file now: its snapshot moves along (or, never synced, the new path has none). */
static void moved(int olddir, const char *old, int newdir, const char *new_, int rc) {
    char abs_old[PATH], abs_new[PATH], from[2 * PATH], to[2 * PATH];
    if (rc != 0) return;
    const char *rel_old = absolute(olddir, old, abs_old), *rel_new = absolute(newdir, new_, abs_new);
    if (rel_new == NULL) {
        if (rel_old != NULL) { copy_name(rel_old, from); real_unlink(from); }
        return;
    }
    copy_name(rel_new, to);
    if (rel_old != NULL) {
        copy_name(rel_old, from);
        if (real_rename(from, to) == 0) { note("renamed", rel_new); return; }
    }
    if (real_unlink(to) == 0) note("unlinked", rel_new);
}

int rename(const char *old, const char *new_) {
    take();
    int rc = real_rename(old, new_), saved = errno;
    moved(AT_FDCWD, old, AT_FDCWD, new_, rc);
    give();
    errno = saved;
    return rc;
}

int renameat(int olddir, const char *old, int newdir, const char *new_) {
    take();
    int rc = real_renameat(olddir, old, newdir, new_), saved = errno;
    moved(olddir, old, newdir, new_, rc);
    give();
    errno = saved;
    return rc;
}
