/* Test target for memtrace-bpf: distinct call sites, each leaking a known
 * number of bytes and objects through one allocator function.
 *
 * Protocol (stdin/stdout, raw syscalls so stdio allocates nothing while
 * traced): prints "ready\n", waits for a line on stdin, runs every site in
 * the main thread and in one worker thread, prints "done\n". Then, with the
 * argument "exit", exits at once; otherwise waits for stdin to close.
 *
 * Expected numbers per thread are in tests/integration/sites.rs; every site
 * keeps what it allocates in a volatile global so nothing is elided. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* noipa: no inlining, cloning or interprocedural changes at any -O level,
 * so every site keeps its name and its call from run_sites. */
#define SITE __attribute__((noipa))

#define KEEP 64
static void *volatile keep[2][KEEP];
static volatile size_t sink;

static void *touch(void *p, size_t n) {
    if (p) memset(p, 0xab, n);
    return p;
}

SITE int site_malloc(int t) {
    for (int i = 0; i < 10; i++) keep[t][i] = touch(malloc(1000), 1000);
    return 10;
}

SITE int site_calloc(int t) {
    for (int i = 0; i < 7; i++) keep[t][10 + i] = touch(calloc(3, 100), 300);
    return 7;
}

/* Each chain: realloc(NULL,16) -> 64 -> 256 -> 4096, the last one kept. */
SITE int site_realloc(int t) {
    static const size_t sizes[] = {16, 64, 256, 4096};
    for (int i = 0; i < 5; i++) {
        void *p = NULL;
        for (int s = 0; s < 4; s++) p = touch(realloc(p, sizes[s]), sizes[s]);
        keep[t][17 + i] = p;
    }
    return 5;
}

SITE int site_reallocarray(int t) {
    for (int i = 0; i < 4; i++) {
        void *p = touch(reallocarray(NULL, 25, 8), 200);
        keep[t][22 + i] = touch(reallocarray(p, 50, 8), 400);
    }
    return 4;
}

SITE int site_posix_memalign(int t) {
    for (int i = 0; i < 6; i++) {
        void *p = NULL;
        if (posix_memalign(&p, 64, 512) == 0) keep[t][26 + i] = touch(p, 512);
    }
    return 6;
}

SITE int site_aligned_alloc(int t) {
    for (int i = 0; i < 3; i++) keep[t][32 + i] = touch(aligned_alloc(256, 1024), 1024);
    return 3;
}

SITE int site_memalign(int t) {
    for (int i = 0; i < 4; i++) keep[t][35 + i] = touch(memalign(128, 640), 640);
    return 4;
}

SITE int site_valloc(int t) {
    for (int i = 0; i < 2; i++) keep[t][39 + i] = touch(valloc(5000), 5000);
    return 2;
}

/* realloc(p, 0) frees p and returns NULL in glibc: nothing stays live. */
SITE int site_realloc_zero(int t) {
    (void)t;
    for (int i = 0; i < 3; i++) {
        void *p = touch(malloc(300), 300);
        sink += (size_t)realloc(p, 0);
    }
    return 3;
}

/* Allocates and frees many blocks, keeps nothing; free(NULL) is a no-op. */
SITE int site_churn(int t) {
    (void)t;
    for (int i = 0; i < 20000; i++) {
        char *p = touch(malloc(48), 48);
        sink += (size_t)p[7];
        free(p);
        free(NULL);
    }
    return 20000;
}

SITE static int run_sites(int t) {
    int n = site_malloc(t) + site_calloc(t) + site_realloc(t) + site_reallocarray(t);
    n += site_posix_memalign(t) + site_aligned_alloc(t) + site_memalign(t);
    n += site_valloc(t) + site_realloc_zero(t) + site_churn(t);
    return n;
}

static void *worker(void *arg) {
    (void)arg;
    sink += (size_t)run_sites(1);
    return NULL;
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(int argc, char **argv) {
    char buf[64];
    pthread_t th;
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    if (pthread_create(&th, NULL, worker, NULL) != 0) return 2;
    sink += (size_t)run_sites(0);
    pthread_join(th, NULL);
    say("done\n");
    if (argc > 1 && strcmp(argv[1], "exit") == 0) return 0;
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
