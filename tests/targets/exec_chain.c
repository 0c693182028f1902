/* Test target for memtrace-bpf: a process that calls exec mid-trace.
 *
 * First image: prints "ready", waits for a line, keeps 10 blocks of 2000
 * bytes (site_before_exec), then execs itself as "exec_chain second",
 * with LD_PRELOAD=$EXEC_CHAIN_PRELOAD when that is set (so the new image
 * may use another allocator). Second image: prints "second ready", waits
 * for a line, keeps 8 blocks of 3000 bytes (site_after_exec), frees 100 of
 * 64 (site_after_exec_churn), prints "done", waits for stdin to close.
 * stdin and stdout stay open across the exec. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))
static void *volatile keep[16];
static volatile size_t sink;

static void *touch(void *p, size_t n) {
    if (p) memset(p, 0xab, n);
    return p;
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

SITE void site_before_exec(void) {
    for (int i = 0; i < 10; i++) keep[i] = touch(malloc(2000), 2000);
}

SITE void site_after_exec(void) {
    for (int i = 0; i < 8; i++) keep[i] = touch(malloc(3000), 3000);
}

SITE void site_after_exec_churn(void) {
    for (int i = 0; i < 100; i++) {
        char *p = touch(malloc(64), 64);
        sink += (size_t)p[5];
        free(p);
    }
}

int main(int argc, char **argv) {
    char buf[64];
    if (argc > 1 && strcmp(argv[1], "second") == 0) {
        say("second ready\n");
        if (read(0, buf, sizeof buf) <= 0) return 1;
        site_after_exec();
        site_after_exec_churn();
        say("done\n");
        while (read(0, buf, sizeof buf) > 0) {
        }
        return 0;
    }
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    site_before_exec();
    const char *preload = getenv("EXEC_CHAIN_PRELOAD");
    if (preload) setenv("LD_PRELOAD", preload, 1);
    char *args[] = {argv[0], "second", NULL};
    execv("/proc/self/exe", args);
    return 2;
}
