/* Test target for allocations made by a signal handler that interrupts
 * malloc: a SIGALRM handler (every 500 us) mallocs and keeps a block while
 * the main loop mallocs, reallocs and frees continually. When the handler
 * has kept KEEP blocks the program writes "BLOCKS BYTES" (what the handler
 * kept) to the file named by argv[1] and exits.
 *
 * malloc is not async-signal-safe; this stays safe with glibc because the
 * two never touch the same state: after the warm-up the main loop only
 * takes and returns 64-byte chunks through its thread cache, while the
 * handler asks for sizes of other bins (its cache bins stay empty, so it
 * works in the arena, which the main loop no longer touches). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define KEEP 2000

static void *volatile kept[KEEP];
static volatile sig_atomic_t blocks;
static volatile size_t bytes;
void *volatile sink;

__attribute__((noinline)) void on_alarm(int sig) {
    (void)sig;
    if (blocks >= KEEP)
        return;
    size_t size = 200 + (size_t)(blocks % 8) * 48;
    char *p = malloc(size);
    if (!p)
        return;
    memset(p, 7, size);
    kept[blocks] = p;
    bytes += size;
    blocks++;
}

__attribute__((noinline)) static void churn(void) {
    char *a = malloc(48);
    /* realloc(NULL, n) is glibc's malloc called from inside realloc. */
    char *b = realloc(NULL, 40);
    memset(a, 1, 48);
    memset(b, 2, 40);
    sink = a;
    sink = b;
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    for (int i = 0; i < 100; i++)
        churn();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 500}, {0, 500}};
    setitimer(ITIMER_REAL, &every, NULL);
    while (blocks < KEEP)
        churn();
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 1;
    fprintf(f, "%d %zu\n", (int)blocks, (size_t)bytes);
    fclose(f);
    return 0;
}
