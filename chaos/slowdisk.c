/* A slow disk for `electra chaos`, loaded with LD_PRELOAD into one node.
 *
 * fsync() and fdatasync() first wait the number of milliseconds written in the file
 * $ELECTRA_SLOW_DISK_FILE (0 or no file: no wait), then do the real call. The Raft log
 * acknowledges only what is synced, so this is the latency a slow or overloaded disk
 * adds to every durable write; reads and plain writes are not slowed. Built on first
 * use by chaos/cluster.py with the system C compiler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

static void slow_down(void) {
    int saved = errno;
    long ms = delay_ms();
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow_down();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow_down();
    return real(fd);
}
