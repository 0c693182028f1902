/* Test target for memtrace-bpf: a program that re-execs itself quickly.
 * `reexec N` keeps one block of 777 bytes (site_each_image) and, while N
 * is above 0, execs itself as `reexec N-1`: N+1 images in one process,
 * each living well under a millisecond. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))
static void *volatile keep;

SITE void site_each_image(void) {
    keep = malloc(777);
    memset(keep, 7, 777);
}

int main(int argc, char **argv) {
    site_each_image();
    int n = argc > 1 ? atoi(argv[1]) : 0;
    if (n > 0) {
        char next[16];
        snprintf(next, sizeof next, "%d", n - 1);
        execl("/proc/self/exe", argv[0], next, (char *)NULL);
        return 1;
    }
    return 0;
}
