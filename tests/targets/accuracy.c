/* Test target for memtrace-bpf's sampling: two call sites keep 128 MiB each
 * (one in 1 KiB blocks, one in 16 KiB blocks), and a churn site allocates
 * and frees 200000 small blocks, keeping nothing. Same protocol as sites.c:
 * "ready", a line on stdin, the allocations, "done", then wait. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))
#define KEPT_BYTES (128u << 20)

static void *volatile *keep_small;
static void *volatile *keep_large;
static volatile size_t sink;

SITE void keep_1k(void) {
    size_t n = KEPT_BYTES / 1024;
    for (size_t i = 0; i < n; i++) {
        char *p = malloc(1024);
        p[0] = (char)i;
        keep_small[i] = p;
    }
}

SITE void keep_16k(void) {
    size_t n = KEPT_BYTES / 16384;
    for (size_t i = 0; i < n; i++) {
        char *p = malloc(16384);
        p[0] = (char)i;
        keep_large[i] = p;
    }
}

SITE void churn(void) {
    for (int i = 0; i < 200000; i++) {
        char *p = malloc(64 + (i % 512));
        p[1] = (char)i;
        sink += (size_t)p[1];
        free(p);
    }
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(void) {
    char buf[64];
    /* The pointer arrays are allocated before tracing starts. */
    keep_small = calloc(KEPT_BYTES / 1024, sizeof(void *));
    keep_large = calloc(KEPT_BYTES / 16384, sizeof(void *));
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    keep_1k();
    churn();
    keep_16k();
    say("done\n");
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
