/* Soak target for memtrace-bpf: allocation churn at a paced rate plus a
 * slow leak of known size. Usage:
 *   soak_leak RATE THREADS LEAK_BYTES_PER_SEC BLOCK SECONDS
 * Prints "ready", waits for a line on stdin, then for SECONDS: THREADS
 * threads each do malloc/free churn (16..1039 bytes, 64 blocks kept per
 * thread, all freed in turn) paced to RATE allocations per second in all,
 * while the main thread leaks BLOCK-byte blocks at LEAK_BYTES_PER_SEC (each
 * memset and kept in a list forever, by leak_block). Then prints
 * "allocs N rate R/s leaked B bytes in K blocks" and "done", and waits for
 * end of input. Built -O2 without frame pointers (DWARF unwinding). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LIVE 64
#define BATCH 1000

static long rate_per_thread;
static double seconds;
static volatile long churned[64];
void *volatile sink;

struct leak {
    struct leak *next;
};
static struct leak *volatile leaked_list;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* One thread's churn; paced after every BATCH allocations. */
__attribute__((noinline)) static void *churn(void *arg) {
    long id = (long)(uintptr_t)arg;
    char *live[LIVE] = {0};
    uint32_t x = 2463534242u + (uint32_t)id;
    double start = now_s();
    long n = 0;
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            size_t size = 16 + (x % 1024);
            unsigned slot = (x >> 12) % LIVE;
            char *p = malloc(size);
            p[0] = (char)i;
            p[size - 1] = (char)x;
            sink = p;
            free(live[slot]);
            live[slot] = p;
        }
        n += BATCH;
        churned[id] = n;
        double elapsed = now_s() - start;
        if (elapsed >= seconds) break;
        sleep_s((double)n / (double)rate_per_thread - elapsed);
    }
    for (int i = 0; i < LIVE; i++) free(live[i]);
    return NULL;
}

/* The leak: one block, used and kept forever. */
__attribute__((noinline)) static void leak_block(size_t block) {
    struct leak *l = malloc(block);
    memset(l, 0x5a, block);
    l->next = leaked_list;
    leaked_list = l;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: soak_leak RATE THREADS LEAK_BYTES_PER_SEC BLOCK SECONDS\n");
        return 2;
    }
    long rate = atol(argv[1]);
    int threads = atoi(argv[2]);
    double leak_rate = atof(argv[3]);
    size_t block = (size_t)atol(argv[4]);
    seconds = atof(argv[5]);
    if (rate < 1 || threads < 1 || threads > 64 || leak_rate <= 0 || block < sizeof(struct leak) ||
        seconds <= 0)
        return 2;
    rate_per_thread = rate / threads > 0 ? rate / threads : 1;
    pthread_t th[64];
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    double start = now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)i);
    long blocks = 0;
    double elapsed;
    while ((elapsed = now_s() - start) < seconds) {
        while ((double)(blocks + 1) * (double)block <= leak_rate * elapsed) {
            leak_block(block);
            blocks++;
        }
        sleep_s(0.005);
    }
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    elapsed = now_s() - start;
    long allocs = 0;
    for (int i = 0; i < threads; i++) allocs += churned[i];
    printf("allocs %ld rate %.0f/s leaked %ld bytes in %ld blocks\n", allocs + blocks,
           (double)(allocs + blocks) / elapsed, blocks * (long)block, blocks);
    printf("done\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
