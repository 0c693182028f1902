/* Benchmark target for memtrace-bpf: malloc/free pairs of pseudo-random
 * sizes with a small live set, in one thread, built without frame pointers.
 * Prints "ready", waits for a line on stdin, runs PAIRS pairs, prints
 * "ns_per_pair N", then waits for stdin to close. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LIVE 64

static void *volatile live[LIVE];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__attribute__((noipa)) static void work(long pairs) {
    uint32_t x = 2463534242u;
    for (long i = 0; i < pairs; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        size_t size = 16 + (x % 4080);
        unsigned slot = (x >> 12) % LIVE;
        char *p = malloc(size);
        p[0] = (char)i;
        free(live[slot]);
        live[slot] = p;
    }
}

int main(int argc, char **argv) {
    long pairs = argc > 1 ? atol(argv[1]) : 200000;
    char buf[64];
    printf("ready\n");
    fflush(stdout);
    if (read(0, buf, sizeof buf) <= 0) return 1;
    uint64_t t0 = now_ns();
    work(pairs);
    uint64_t t1 = now_ns();
    printf("ns_per_pair %.1f\n", (double)(t1 - t0) / (double)pairs);
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
