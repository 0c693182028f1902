/* Test target for memtrace-bpf: allocations made through code in anonymous
 * executable memory, as a JIT makes it (no file, no unwind table; it keeps
 * a frame pointer, as V8's code does), named in /tmp/perf-PID.map.
 *
 * The code, copied into an mmap'ed page before "ready": push %rbp; mov
 * %rsp,%rbp; movabs $anon_site,%rax; call *%rax; pop %rbp; ret. It calls
 * anon_site(n): malloc(n). The perf map names it with JIT_NAME (an escape
 * sequence included: a traced process's text is hostile).
 *
 * Usage: anon_code [COUNT [symlink]]. With "symlink" the perf map is a
 * symbolic link to /tmp/anon_code-PID.real, which holds the lines (the
 * tracer must refuse it). Protocol as in sites.c: prints "ready\n", waits
 * for a line on stdin, calls the code COUNT times (default 100), keeping
 * 3333 bytes each time, prints "done\n", then waits for stdin to close
 * and removes its files. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SITE __attribute__((noipa))
#define JIT_NAME "JS:anon_trampoline \x1b[31mred"

static void *volatile kept[1000];
static volatile size_t sink;

SITE void *anon_site(size_t n) {
    void *p = malloc(n);
    memset(p, 1, n);
    return p;
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 100;
    if (count < 1 || count > 1000) return 2;
    uint8_t code[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0,
                      0xff, 0xd0, 0x5d, 0xc3};
    void *(*site)(size_t) = anon_site;
    memcpy(code + 6, &site, sizeof site);
    uint8_t *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    memcpy(page, code, sizeof code);
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return 1;
    char path[64], real[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    snprintf(real, sizeof real, "/tmp/anon_code-%d.real", getpid());
    int symlinked = argc > 2 && strcmp(argv[2], "symlink") == 0;
    if (symlinked && symlink(real, path) != 0) return 1;
    FILE *map = fopen(symlinked ? real : path, "w");
    if (!map) return 1;
    fprintf(map, "%lx %zx %s\n", (unsigned long)(uintptr_t)page, sizeof code, JIT_NAME);
    fclose(map);
    void *(*jit)(size_t) = (void *(*)(size_t))(uintptr_t)page;
    char buf[64];
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    for (int i = 0; i < count; i++) kept[i] = jit(3333);
    say("done\n");
    while (read(0, buf, sizeof buf) > 0) {
    }
    unlink(path);
    if (symlinked) unlink(real);
    return 0;
}
