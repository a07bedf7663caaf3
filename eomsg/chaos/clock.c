/* A wall clock a chaos run moves (eomsg/chaos/clock.py): loaded into the node with
   LD_PRELOAD, it adds to every read of CLOCK_REALTIME — clock_gettime, gettimeofday,
   time — the offset in nanoseconds kept in the 8-byte file named by EOMSG_CLOCK_FILE,
   which the run rewrites in place; the monotonic clocks are left alone, as when NTP steps
   a machine's clock or a person sets it. The file is mapped once, so a jump is seen by
   the next read. (libfaketime does the same, but with the monotonic clock left alone
   its 0.9.10 breaks Python's time.sleep.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS 1000000000LL

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static const volatile int64_t *offset_ns; /* NULL: no file, no offset */

static void init(void) __attribute__((constructor));
static void init(void) {
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    const char *path = getenv("EOMSG_CLOCK_FILE");
    if (path == NULL)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *mapped = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (mapped != MAP_FAILED)
        offset_ns = (const volatile int64_t *)mapped;
}

static void shift(struct timespec *ts) {
    if (offset_ns == NULL)
        return;
    int64_t ns = (int64_t)ts->tv_sec * NS + ts->tv_nsec + __atomic_load_n(offset_ns, __ATOMIC_RELAXED);
    ts->tv_sec = (time_t)(ns / NS);
    ts->tv_nsec = (long)(ns % NS);
}

static int realtime(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (real_clock_gettime == NULL)
        init();
    int done = real_clock_gettime(id, ts);
    if (done == 0 && realtime(id))
        shift(ts);
    return done;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int done = clock_gettime(CLOCK_REALTIME, &ts);
    if (done == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return done;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
