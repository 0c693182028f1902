/* Test target for memtrace-bpf: memory pressure from the page cache.
 *
 *   file_thrash FILE SECONDS
 *
 * Prints "ready", waits for a line on stdin, drops FILE's cached pages,
 * then reads FILE again and again for SECONDS, each pass through a 1 MiB
 * buffer read_pass mallocs and frees. In a memory cgroup smaller than FILE
 * every read refills the cache by reclaiming it, so the reader stalls on
 * memory (PSI's "some"). Prints "done" at the end. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noipa)) static int read_pass(int fd) {
    char *buf = malloc(1 << 20);
    if (!buf) return -1;
    ssize_t n;
    lseek(fd, 0, SEEK_SET);
    while ((n = read(fd, buf, 1 << 20)) > 0) sink += (unsigned char)buf[n - 1];
    free(buf);
    return n < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        static const char usage[] = "usage: file_thrash FILE SECONDS\n";
        write(2, usage, sizeof usage - 1);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return 1;
    write(1, "ready\n", 6);
    char line[16];
    if (read(0, line, sizeof line) <= 0) return 1;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    time_t end = time(NULL) + atol(argv[2]);
    while (time(NULL) < end)
        if (read_pass(fd) != 0) return 1;
    write(1, "done\n", 5);
    return 0;
}
