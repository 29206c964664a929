/* The slow-disk nemesis: preloaded into a controller, it delays every fsync, fdatasync and
 * sync_file_range (RocksDB's syncs of the Raft log and state) by the milliseconds written in
 * the file that QUORUM_SLOWDISK_FILE names, read again at most every 100 ms. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

static _Atomic long delay_ms = 0;
static _Atomic long checked_ms = -1000;

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void slow(void) {
    const char *path = getenv("QUORUM_SLOWDISK_FILE");
    if (path == NULL) return;
    long now = now_ms();
    if (now - atomic_load(&checked_ms) >= 100) {
        atomic_store(&checked_ms, now);
        long d = 0;
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            if (fscanf(f, "%ld", &d) != 1) d = 0;
            fclose(f);
        }
        atomic_store(&delay_ms, d);
    }
    long d = atomic_load(&delay_ms);
    if (d > 0) {
        struct timespec ts = {d / 1000, (d % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow();
    return real(fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (real == NULL) real = (int (*)(int, off64_t, off64_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range");
    slow();
    return real(fd, offset, nbytes, flags);
}
