/* Test target for --snapshot-on-peak under --follow-forks: a service that
 * forks short-lived workers, then spikes. One line on stdin per step,
 * acknowledged on stdout:
 *   base:    holds 2 MiB, 32 blocks of 64 KiB (site_base)        -> "did base"
 *   churn N: forks N workers one after another; each allocates 256 KiB
 *            (site_worker), holds it 40 ms and exits             -> "did churn"
 *   spike:   allocates 64 MiB, 2048 blocks of 32 KiB (site_spike) -> "did spike"
 *   free:    frees the spike                                      -> "did free"
 * Anything else (or EOF) exits. Every block is written to. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BASE_BLOCKS 32
#define BASE_SIZE (64 * 1024)
#define WORKER_SIZE (256 * 1024)
#define SPIKE_BLOCKS 2048
#define SPIKE_SIZE (32 * 1024)

static void *volatile base[BASE_BLOCKS];
static void *volatile spike[SPIKE_BLOCKS];
static void *volatile worker;

/* A macro, not a function: the site is the frame that calls malloc. */
#define TOUCHED(n, c)                \
    do {                             \
        p = malloc(n);               \
        if (p) memset(p, c, n);      \
    } while (0)

__attribute__((noinline)) void *site_base(void) { void *p; TOUCHED(BASE_SIZE, 1); return p; }
__attribute__((noinline)) void *site_worker(void) { void *p; TOUCHED(WORKER_SIZE, 2); return p; }
__attribute__((noinline)) void *site_spike(void) { void *p; TOUCHED(SPIKE_SIZE, 3); return p; }

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            struct timespec t = {0, 40 * 1000 * 1000};
            worker = site_worker();
            nanosleep(&t, NULL);
            _exit(0);
        }
        if (pid > 0) waitpid(pid, NULL, 0);
    }
}

int main(void) {
    char line[64];
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        if (!strcmp(line, "base\n")) {
            for (int i = 0; i < BASE_BLOCKS; i++) base[i] = site_base();
        } else if (!strncmp(line, "churn ", 6)) {
            churn(atoi(line + 6));
        } else if (!strcmp(line, "spike\n")) {
            for (int i = 0; i < SPIKE_BLOCKS; i++) spike[i] = site_spike();
        } else if (!strcmp(line, "free\n")) {
            for (int i = 0; i < SPIKE_BLOCKS; i++) free(spike[i]);
        } else {
            return 0;
        }
        line[strcspn(line, "\n")] = 0;
        printf("did %s\n", line);
    }
    return 0;
}
