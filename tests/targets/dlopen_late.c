/* Test target for memtrace-bpf: a library loaded with dlopen after the
 * trace began, allocating under a 64 KiB stack frame. The tracer learns of
 * the library when a walk first meets it; that first walk is finished from
 * a stack copy, which cannot reach past the big frame.
 *
 * Built twice from this file: with -shared -fPIC -DAS_LIBRARY it is the
 * library (lib_entry -> lib_big_frame -> lib_site: malloc(n)); without, the
 * program. Usage: dlopen_late LIBRARY. Protocol as in sites.c: prints
 * "ready\n", waits for a line on stdin, dlopens LIBRARY and calls
 * lib_entry(3333) once (kept), prints "done\n", then waits for stdin to
 * close. Build both without frame pointers. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))

#ifdef AS_LIBRARY

SITE void *lib_site(size_t n) {
    void *p = malloc(n);
    memset(p, 1, n);
    return p;
}

SITE void *lib_big_frame(size_t n) {
    volatile char frame[64 << 10];
    for (size_t i = 0; i < sizeof frame; i += 4096) frame[i] = (char)i;
    void *p = lib_site(n);
    return frame[n % 7] ? p : p; /* the frame lives across the call */
}

void *lib_entry(size_t n) { return lib_big_frame(n); }

#else

#include <dlfcn.h>
#include <stdio.h>

static void *volatile kept;
static volatile size_t sink;

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(int argc, char **argv) {
    char buf[64];
    if (argc < 2) return 2;
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    void *(*entry)(size_t) = (void *(*)(size_t))dlsym(lib, "lib_entry");
    if (!entry) return 1;
    kept = entry(3333);
    say("done\n");
    while (read(0, buf, sizeof buf) > 0) {
    }
    free(kept);
    return 0;
}

#endif
