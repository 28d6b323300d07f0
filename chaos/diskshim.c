/* The disk as `electra chaos` sees it, loaded with LD_PRELOAD into every node.
 *
 * - A slow disk: fsync() and fdatasync() first wait the number of milliseconds written in
 *   the file $ELECTRA_SLOW_DISK_FILE (0 or no file: no wait), then do the real call. The
 *   Raft log acknowledges only what is synced, so this is the latency a slow disk adds to
 *   every durable write; reads and plain writes are not slowed.
 * - What survives a power cut: once a real fsync/fdatasync succeeds, the file's size when
 *   the call began and its path are appended to $ELECTRA_SYNCED_LOG ("<size>\t<path>\n").
 *   Bytes beyond the last size logged for a file were never synced, so the power-loss
 *   fault cuts them off after SIGKILL (a killed process keeps its page cache; a powered-off
 *   machine does not). The line is written before the call returns, so the caller cannot
 *   have acted on a sync that is not logged yet.
 *
 * Built on first use by chaos/cluster.py with the system C compiler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long delay_ms(void) {
    const char *path = getenv("ELECTRA_SLOW_DISK_FILE");
    long ms = 0;
    FILE *f;
    if (path == NULL || (f = fopen(path, "r")) == NULL)
        return 0;
    if (fscanf(f, "%ld", &ms) != 1 || ms < 0)
        ms = 0;
    fclose(f);
    return ms;
}

/* The file's size now (-1 if not a regular file): what the coming sync will make durable. */
static long long size_of(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? (long long)st.st_size : -1;
}

static void slow_down(void) {
    int saved = errno;
    long ms = delay_ms();
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    errno = saved;
}

/* Called once the real sync succeeded: `size` bytes of the file are durable now. */
static void synced(int fd, long long size) {
    int saved = errno;
    const char *log = getenv("ELECTRA_SYNCED_LOG");
    char link[64], path[PATH_MAX], line[PATH_MAX + 32];
    if (log == NULL || size < 0)
        return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) {
        path[n] = '\0';
        int len = snprintf(line, sizeof line, "%lld\t%s\n", size, path);
        int out = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (out >= 0) {
            if (write(out, line, (size_t)len) < 0) {
            }
            close(out);
        }
    }
    errno = saved;
}

static int sync_with(int (*real)(int), int fd) {
    long long size = size_of(fd);
    slow_down();
    int rc = real(fd);
    if (rc == 0)
        synced(fd, size);
    return rc;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return sync_with(real, fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return sync_with(real, fd);
}
