/* The slow-disk nemesis: preloaded into a controller, it delays every fsync, fdatasync and
 * sync_file_range (RocksDB's syncs of the Raft log and state) by the milliseconds written in
 * the file that QUORUM_SLOWDISK_FILE names, read again at most every 100 ms.
 *
 * The lose-unsynced nemesis: after each fsync or fdatasync that succeeded, the file's device,
 * inode and size as the sync began are appended to the file QUORUM_SYNCED_FILE names, so that
 * the harness, having killed the process, can cut each of its files back to what was synced
 * (what a machine that lost its power would keep). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
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

/* The size of `fd`'s file as its sync begins (-1: not a regular file, or no journal). */
static long long size_before(int fd) {
    struct stat st;
    if (getenv("QUORUM_SYNCED_FILE") == NULL || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    return (long long)st.st_size;
}

/* Its sync succeeded: at least `size` bytes of `fd`'s file are on the disk. */
static void synced(int fd, long long size) {
    const char *path = getenv("QUORUM_SYNCED_FILE");
    struct stat st;
    if (path == NULL || size < 0 || fstat(fd, &st) != 0) return;
    char line[96];
    int n = snprintf(line, sizeof line, "%llu %llu %lld\n", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, size);
    int out = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (out < 0) return;
    ssize_t written = write(out, line, (size_t)n);
    (void)written;
    close(out);
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow();
    long long size = size_before(fd);
    int r = real(fd);
    if (r == 0) synced(fd, size);
    return r;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow();
    long long size = size_before(fd);
    int r = real(fd);
    if (r == 0) synced(fd, size);
    return r;
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (real == NULL) real = (int (*)(int, off64_t, off64_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range");
    slow();
    return real(fd, offset, nbytes, flags);
}
