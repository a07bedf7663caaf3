/* Power loss for one process: what it wrote to files under a directory and did not
 * fsync (or fdatasync) is lost when the power goes.
 *
 * Loaded with LD_PRELOAD into the node, with EOMSG_POWERLOSS_DIR (the data directory)
 * and EOMSG_POWERLOSS_SHADOW (a directory of its own) set. Every write to a file under
 * the data directory marks the byte range it touched; fsync or fdatasync of the file
 * copies those ranges, as the file holds them then, into the file's durable image,
 * SHADOW/<inode>, and gives the image the file's size. The images are what a disk
 * would hold after a power loss: eomsg.chaos.powerloss puts them back in place of the
 * files once the process is killed (a file with no image was never synced: it comes
 * back empty). As in LazyFS, which this follows, names — creating, renaming, removing
 * a file — are durable at once; only data waits for a sync.
 *
 * A file this process opens that existed before it is marked written whole the first
 * time it is seen: an earlier process (killed, not powered off) may have left writes
 * unsynced in the page cache, and a sync here makes them durable as a disk would.
 * Truncation is followed too (an image shrinks to the lowest size since its last sync,
 * then takes the file's). A file mapped shared and writable cannot be followed write by
 * write: each sync of it then copies it whole. Not followed: writes by other processes
 * (only the node runs with the shim), sendfile, splice and copy_file_range into a file,
 * msync, and sync()/syncfs() of a file no longer open — none of which eomsg uses.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAXFD 65536
#define BUCKETS 1024

struct range { off_t lo, hi; };

struct image {             /* one tracked file (by inode) */
    ino_t ino;
    struct range *ranges;  /* written since its last sync, unmerged */
    size_t n, cap;
    int mapped;            /* mapped shared and writable: synced whole */
    off_t low;             /* the lowest size truncation left since its last sync; -1 */
    struct image *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char dir[PATH_MAX], shadow[PATH_MAX - 32];  /* room for "/<inode>" */
static size_t dirlen;
static int enabled = -1;  /* -1: not read from the environment yet */
static ino_t fd_ino[MAXFD];  /* 0: not a tracked file */
static struct image *table[BUCKETS];

/* Every function the shim wraps, once: each gets a pointer to the real one (REAL), set
 * from the next library at setup (BIND). */
#define WRAPPED(X) \
    X(open) X(open64) X(openat) X(openat64) X(creat) X(close) \
    X(write) X(pwrite) X(pwrite64) X(writev) X(pwritev) X(pwritev2) X(pwritev64) \
    X(pwritev64v2) X(ftruncate) X(ftruncate64) X(fallocate) X(fsync) X(fdatasync) \
    X(dup) X(dup2) X(dup3) X(fcntl) X(fcntl64) X(mmap) X(mmap64) X(sync) X(syncfs)
#define REAL(name) static __typeof__(name) *real_##name;
WRAPPED(REAL)
#define BIND(name) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name);

static void die(const char *what) {
    char msg[512];
    int n = snprintf(msg, sizeof msg, "eomsg powerloss shim: %s: %s\n", what, strerror(errno));
    if (real_write) real_write(2, msg, (size_t)n);
    abort();
}

static void setup(void) {
    if (enabled != -1) return;
    WRAPPED(BIND)
    const char *d = getenv("EOMSG_POWERLOSS_DIR"), *s = getenv("EOMSG_POWERLOSS_SHADOW");
    if (!d || !s || !realpath(d, dir) || strlen(s) >= sizeof shadow) {
        enabled = 0;
        return;
    }
    strcpy(shadow, s);
    dirlen = strlen(dir);
    enabled = 1;
}

__attribute__((constructor)) static void init(void) { setup(); }

static struct image *image_of(ino_t ino, int create) {
    struct image **slot = &table[ino % BUCKETS];
    for (struct image *im = *slot; im; im = im->next)
        if (im->ino == ino) return im;
    if (!create) return NULL;
    struct image *im = calloc(1, sizeof *im);
    if (!im) die("out of memory");
    im->ino = ino;
    im->low = -1;
    im->next = *slot;
    *slot = im;
    return im;
}

static void shadow_path(char *out, ino_t ino) {
    snprintf(out, PATH_MAX, "%s/%ju", shadow, (uintmax_t)ino);
}

static void mark_im(struct image *im, off_t lo, off_t hi);

/* Start following fd if it names a regular file under the data directory. ``fresh``:
 * the open created it (its inode may be an old one's: its image starts empty);
 * ``truncated``: the open cut it to nothing (O_TRUNC). */
static void follow(int fd, int fresh, int truncated) {
    if (fd < 0 || fd >= MAXFD) return;
    fd_ino[fd] = 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if ((size_t)n < dirlen || strncmp(path, dir, dirlen) != 0 || (path[dirlen] && path[dirlen] != '/'))
        return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    pthread_mutex_lock(&mu);
    fd_ino[fd] = st.st_ino;
    struct image *im = image_of(st.st_ino, 0);
    if (!im) {  /* first seen here: what a killed process left unsynced counts as written */
        im = image_of(st.st_ino, 1);
        if (!fresh) mark_im(im, 0, st.st_size);
    }
    if (fresh) {
        im->n = 0;
        im->low = -1;
        char sp[PATH_MAX];
        shadow_path(sp, st.st_ino);
        int s = real_open(sp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (s < 0) die(sp);
        real_close(s);
    } else if (truncated) {
        im->low = 0;
    }
    pthread_mutex_unlock(&mu);
}

static int tracked(int fd) { return fd >= 0 && fd < MAXFD && fd_ino[fd]; }

/* Under mu. */
static void mark_im(struct image *im, off_t lo, off_t hi) {
    if (hi <= lo) return;
    if (im->n && im->ranges[im->n - 1].hi == lo) {
        im->ranges[im->n - 1].hi = hi;  /* an append: the usual case */
        return;
    }
    if (im->n == im->cap) {
        im->cap = im->cap ? 2 * im->cap : 16;
        im->ranges = realloc(im->ranges, im->cap * sizeof *im->ranges);
        if (!im->ranges) die("out of memory");
    }
    im->ranges[im->n++] = (struct range){lo, hi};
}

/* Under mu. */
static void mark(int fd, off_t lo, off_t hi) {
    if (tracked(fd)) mark_im(image_of(fd_ino[fd], 1), lo, hi);
}

/* Under mu: the file of fd was cut to ``size``. */
static void truncated_to(int fd, off_t size) {
    if (!tracked(fd)) return;
    struct image *im = image_of(fd_ino[fd], 1);
    if (im->low < 0 || size < im->low) im->low = size;
}

/* Copy what fd's file holds in its written ranges into its image (all of it if it is
 * mapped), and give the image the file's size. Under mu. */
static int flush(int fd, struct image *im) {
    struct stat st;
    if (fstat(fd, &st) != 0) return -1;
    char link[64], sp[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int src = real_open(link, O_RDONLY | O_CLOEXEC);
    if (src < 0) die("reopening a file to sync its image");
    shadow_path(sp, im->ino);
    int dst = real_open(sp, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (dst < 0) die(sp);
    if (im->low >= 0 && real_ftruncate(dst, im->low) != 0) die("cutting an image");
    static char buf[1 << 16];
    struct range all = {0, st.st_size};
    size_t count = im->mapped ? 1 : im->n;
    for (size_t i = 0; i < count; i++) {
        struct range r = im->mapped ? all : im->ranges[i];
        if (r.hi > st.st_size) r.hi = st.st_size;
        for (off_t at = r.lo; at < r.hi;) {
            size_t want = (size_t)(r.hi - at) < sizeof buf ? (size_t)(r.hi - at) : sizeof buf;
            ssize_t got = pread(src, buf, want, at);
            if (got <= 0) break;
            if (real_pwrite(dst, buf, (size_t)got, at) != got) die("writing an image");
            at += got;
        }
    }
    if (real_ftruncate(dst, st.st_size) != 0) die("sizing an image");
    real_close(dst);
    real_close(src);
    im->n = 0;
    im->low = -1;
    return 0;
}

/* Under mu. */
static void synced(int fd) {
    if (tracked(fd)) flush(fd, image_of(fd_ino[fd], 1));
}

static void copied(int from, int to) {
    if (from >= 0 && from < MAXFD && to >= 0 && to < MAXFD) fd_ino[to] = fd_ino[from];
}

static int opened(int fd, int flags, int existed) {
    if (fd >= 0 && enabled == 1) follow(fd, (flags & O_CREAT) && !existed, (flags & O_TRUNC) != 0);
    return fd;
}

static int exists_at(int dirfd, const char *path) {
    struct stat st;
    return fstatat(dirfd, path, &st, 0) == 0;
}

#define MODE_ARG(flags) mode_t mode = 0; \
    if ((flags) & (O_CREAT | __O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); }

int open(const char *path, int flags, ...) {
    setup(); MODE_ARG(flags);
    int existed = exists_at(AT_FDCWD, path);
    return opened(real_open(path, flags, mode), flags, existed);
}
int open64(const char *path, int flags, ...) {
    setup(); MODE_ARG(flags);
    int existed = exists_at(AT_FDCWD, path);
    return opened(real_open64(path, flags, mode), flags, existed);
}
int openat(int dirfd, const char *path, int flags, ...) {
    setup(); MODE_ARG(flags);
    int existed = exists_at(dirfd, path);
    return opened(real_openat(dirfd, path, flags, mode), flags, existed);
}
int openat64(int dirfd, const char *path, int flags, ...) {
    setup(); MODE_ARG(flags);
    int existed = exists_at(dirfd, path);
    return opened(real_openat64(dirfd, path, flags, mode), flags, existed);
}
int creat(const char *path, mode_t mode) {
    setup();
    int existed = exists_at(AT_FDCWD, path);
    return opened(real_creat(path, mode), O_CREAT, existed);
}
int close(int fd) {
    setup();
    if (fd >= 0 && fd < MAXFD) fd_ino[fd] = 0;
    return real_close(fd);
}
int dup(int fd) { setup(); int to = real_dup(fd); copied(fd, to); return to; }
int dup2(int fd, int to) { setup(); int r = real_dup2(fd, to); if (r >= 0) copied(fd, r); return r; }
int dup3(int fd, int to, int flags) {
    setup(); int r = real_dup3(fd, to, flags); if (r >= 0) copied(fd, r); return r;
}
int fcntl(int fd, int cmd, ...) {
    setup();
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    int r = real_fcntl(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) copied(fd, r);
    return r;
}
int fcntl64(int fd, int cmd, ...) {  /* what glibc's fcntl is, for callers built since 2.28 */
    setup();
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    int r = real_fcntl64(fd, cmd, arg);
    if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) copied(fd, r);
    return r;
}

/* A write to a tracked file runs under mu, its range marked before mu is let go: where
 * it landed is known (another thread's write cannot move the offset in between), and a
 * sync copies no range a write is still filling. */
#define WRITE_AT(fd, call, at) do { \
        if (!tracked(fd)) return call; \
        pthread_mutex_lock(&mu); \
        off_t start = (at); \
        __typeof__(call) r = call; \
        if (r > 0) mark(fd, start, start + r); \
        pthread_mutex_unlock(&mu); \
        return r; \
    } while (0)

static off_t append_point(int fd) {
    int flags = real_fcntl(fd, F_GETFL, 0);
    if (flags >= 0 && (flags & O_APPEND)) {
        struct stat st;
        return fstat(fd, &st) == 0 ? st.st_size : lseek(fd, 0, SEEK_END);
    }
    return lseek(fd, 0, SEEK_CUR);
}

ssize_t write(int fd, const void *buf, size_t n) {
    setup(); WRITE_AT(fd, real_write(fd, buf, n), append_point(fd));
}
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    setup(); WRITE_AT(fd, real_writev(fd, iov, cnt), append_point(fd));
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
    setup(); WRITE_AT(fd, real_pwrite(fd, buf, n, at), at);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) {
    setup(); WRITE_AT(fd, real_pwrite64(fd, buf, n, at), at);
}
ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t at) {
    setup(); WRITE_AT(fd, real_pwritev(fd, iov, cnt, at), at);
}
ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t at, int flags) {
    setup(); WRITE_AT(fd, real_pwritev2(fd, iov, cnt, at, flags), at == -1 ? append_point(fd) : at);
}
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t at) {
    setup(); WRITE_AT(fd, real_pwritev64(fd, iov, cnt, at), at);
}
ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off_t at, int flags) {
    setup();
    WRITE_AT(fd, real_pwritev64v2(fd, iov, cnt, at, flags), at == -1 ? append_point(fd) : at);
}
static int cut(int fd, off_t size, int (*real)(int, off_t)) {
    if (!tracked(fd)) return real(fd, size);
    pthread_mutex_lock(&mu);
    int r = real(fd, size);
    if (r == 0) truncated_to(fd, size);
    pthread_mutex_unlock(&mu);
    return r;
}
int ftruncate(int fd, off_t size) { setup(); return cut(fd, size, real_ftruncate); }
int ftruncate64(int fd, off_t size) { setup(); return cut(fd, size, real_ftruncate64); }
int fallocate(int fd, int mode, off_t at, off_t len) {
    setup();
    if (!tracked(fd)) return real_fallocate(fd, mode, at, len);
    pthread_mutex_lock(&mu);
    int r = real_fallocate(fd, mode, at, len);
    if (r == 0) mark(fd, at, at + len);
    pthread_mutex_unlock(&mu);
    return r;
}

/* A sync holds mu from before it starts until its image is taken: no tracked write runs
 * meanwhile, so the image holds what was written before the sync, and nothing after. */
static int sync_with(int fd, int (*real)(int)) {
    if (!tracked(fd)) return real(fd);
    pthread_mutex_lock(&mu);
    int r = real(fd);
    if (r == 0) synced(fd);
    pthread_mutex_unlock(&mu);
    return r;
}
int fsync(int fd) { setup(); return sync_with(fd, real_fsync); }
int fdatasync(int fd) { setup(); return sync_with(fd, real_fdatasync); }
static void sync_open_files(void) {
    pthread_mutex_lock(&mu);
    for (int fd = 0; fd < MAXFD; fd++) if (fd_ino[fd]) synced(fd);
    pthread_mutex_unlock(&mu);
}
void sync(void) { setup(); real_sync(); sync_open_files(); }
int syncfs(int fd) {
    setup();
    int r = real_syncfs(fd);
    if (r == 0) sync_open_files();
    return r;
}

static void mapping(int fd, int prot, int flags) {
    if (fd < 0 || fd >= MAXFD || !fd_ino[fd] || !(prot & PROT_WRITE) || !(flags & MAP_SHARED)) return;
    pthread_mutex_lock(&mu);
    image_of(fd_ino[fd], 1)->mapped = 1;
    pthread_mutex_unlock(&mu);
}
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t at) {
    setup(); mapping(fd, prot, flags); return real_mmap(addr, len, prot, flags, fd, at);
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t at) {
    setup(); mapping(fd, prot, flags); return real_mmap64(addr, len, prot, flags, fd, at);
}
