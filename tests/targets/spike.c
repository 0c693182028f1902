/* Test target for the heap at its peak: a service that holds a
 * base, leaks slowly, bursts by tens of MiB then falls back, and later
 * bursts lower. One line on stdin per step, acknowledged on stdout, so the
 * test decides when each step happens:
 *   base:  holds 4 MiB, 64 blocks of 64 KiB (site_base)       -> "did base"
 *   leak:  leaks 10 blocks of 1000 bytes (site_leak)            -> "did leak"
 *   burst: allocates 96 MiB, 3072 blocks of 32 KiB (site_burst) -> "did burst"
 *   free:  frees the burst                                      -> "did free"
 *   low:   allocates 24 MiB, 768 blocks of 32 KiB (site_low),
 *          and frees them                                       -> "did low"
 * Anything else (or EOF) exits. Every block is written to: the memory is
 * really used. Each site is its own function, so its frame names it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BASE_BLOCKS 64
#define BASE_SIZE (64 * 1024)
#define LEAK_BLOCKS 10
#define LEAK_SIZE 1000
#define BURST_BLOCKS 3072
#define LOW_BLOCKS 768
#define BURST_SIZE (32 * 1024)

static void *base[BASE_BLOCKS];
static void *burst[BURST_BLOCKS];
static void *leaked[1024];
static int nleaked;

__attribute__((noinline)) void *site_base(void) {
    void *p = malloc(BASE_SIZE);
    memset(p, 1, BASE_SIZE);
    return p;
}

__attribute__((noinline)) void *site_leak(void) {
    void *p = malloc(LEAK_SIZE);
    memset(p, 2, LEAK_SIZE);
    return p;
}

__attribute__((noinline)) void *site_burst(void) {
    void *p = malloc(BURST_SIZE);
    memset(p, 3, BURST_SIZE);
    return p;
}

__attribute__((noinline)) void *site_low(void) {
    void *p = malloc(BURST_SIZE);
    memset(p, 4, BURST_SIZE);
    return p;
}

static unsigned long sum(void *const *blocks, int n, size_t size) {
    unsigned long s = 0;
    for (int i = 0; i < n; i++)
        s += ((const unsigned char *)blocks[i])[size - 1];
    return s;
}

int main(void) {
    char line[64];
    unsigned long check = 0;
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strcmp(line, "base") == 0) {
            for (int i = 0; i < BASE_BLOCKS; i++)
                base[i] = site_base();
            check += sum(base, BASE_BLOCKS, BASE_SIZE);
        } else if (strcmp(line, "leak") == 0) {
            for (int i = 0; i < LEAK_BLOCKS && nleaked < 1024; i++)
                leaked[nleaked++] = site_leak();
        } else if (strcmp(line, "burst") == 0) {
            for (int i = 0; i < BURST_BLOCKS; i++)
                burst[i] = site_burst();
            check += sum(burst, BURST_BLOCKS, BURST_SIZE);
        } else if (strcmp(line, "free") == 0) {
            for (int i = 0; i < BURST_BLOCKS; i++)
                free(burst[i]);
        } else if (strcmp(line, "low") == 0) {
            for (int i = 0; i < LOW_BLOCKS; i++)
                burst[i] = site_low();
            check += sum(burst, LOW_BLOCKS, BURST_SIZE);
            for (int i = 0; i < LOW_BLOCKS; i++)
                free(burst[i]);
        } else {
            break;
        }
        printf("did %s\n", line);
        fflush(stdout);
    }
    /* The checksum keeps the writes from being optimized away. */
    return check == 0 ? 1 : 0;
}
