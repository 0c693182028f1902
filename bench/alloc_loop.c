/* Benchmark target for memtrace-bpf: THREADS threads each doing PAIRS
 * malloc/free pairs of pseudo-random sizes (16..4095 bytes) with a small
 * live set (64 blocks per thread), built -O2 without frame pointers.
 * Prints "ready", waits for a line on stdin, runs, prints
 * "ns_per_pair N" (wall time per pair in each thread), then waits for stdin
 * to close. Usage: alloc_loop PAIRS THREADS */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LIVE 64

static long pairs;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

__attribute__((noipa)) static void *work(void *arg) {
    void *live[LIVE] = {0};
    uint32_t x = 2463534242u + (uint32_t)(uintptr_t)arg;
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
    for (int i = 0; i < LIVE; i++) free(live[i]);
    return NULL;
}

int main(int argc, char **argv) {
    pairs = argc > 1 ? atol(argv[1]) : 200000;
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    pthread_t th[64];
    char buf[64];
    if (threads < 1 || threads > 64) return 2;
    printf("ready\n");
    fflush(stdout);
    if (read(0, buf, sizeof buf) <= 0) return 1;
    uint64_t t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, work, (void *)(uintptr_t)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    uint64_t t1 = now_ns();
    printf("ns_per_pair %.1f\n", (double)(t1 - t0) / (double)pairs);
    fflush(stdout);
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
