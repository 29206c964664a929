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

/* The journal's descriptor, opened on the first sync that needs it (-1: none, or it could not be
 * opened; -2: not tried yet). One descriptor for the process, so that a sync costs one write. */
static _Atomic int journal = -2;

static int journal_fd(void) {
    int fd = atomic_load(&journal);
    if (fd != -2) return fd;
    const char *path = getenv("QUORUM_SYNCED_FILE");
    int opened = path == NULL ? -1 : open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    int expected = -2;
    if (!atomic_compare_exchange_strong(&journal, &expected, opened)) {
        /* Another thread opened it first. */
        if (opened >= 0) close(opened);
        return expected;
    }
    return opened;
}

/* `real` (fsync or fdatasync) of `fd`, slowed as the slow disk says; once it succeeded, the
 * file's device, inode and size as the sync began go to the journal: at least that much of it is
 * on the disk. */
static int durable(int (*real)(int), int fd) {
    slow();
    int out = journal_fd();
    struct stat before;
    int regular = out >= 0 && fstat(fd, &before) == 0 && S_ISREG(before.st_mode);
    int r = real(fd);
    if (r == 0 && regular) {
        char line[96];
        int n = snprintf(line, sizeof line, "%llu %llu %lld\n", (unsigned long long)before.st_dev,
                         (unsigned long long)before.st_ino, (long long)before.st_size);
        ssize_t written = write(out, line, (size_t)n);
        (void)written;
    }
    return r;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return durable(real, fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return durable(real, fd);
}

int sync_file_range(int fd, off64_t offset, off64_t nbytes, unsigned int flags) {
    static int (*real)(int, off64_t, off64_t, unsigned int);
    if (real == NULL) real = (int (*)(int, off64_t, off64_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range");
    slow();
    return real(fd, offset, nbytes, flags);
}
