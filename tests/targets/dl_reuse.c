/* Test target for memtrace-bpf: a plugin unloaded and another loaded at
 * the same address, in one go, before the tracer can have read the maps
 * in between: dlopen A, allocate through A, dlclose A, dlopen B, allocate
 * through B. The two libraries are built from this file with the same code
 * and names of the same length, so that B takes exactly A's place and A's
 * unwind table fits B's code as well.
 *
 * Built three times: -shared -fPIC -DLIB_A is library A (plugin_entry ->
 * a_plugin_mid -> a_plugin_site: malloc(4444)), -DLIB_B library B (the same
 * with b_, malloc(5555)), and without either the program. Usage: dl_reuse
 * LIB_A LIB_B STATE [loaded-first]. Prints "ready\n" (with loaded-first,
 * once A is loaded, so that a tracer attached then reads maps showing A),
 * waits for a line on stdin (or its end: a command started by the tracer
 * has none), runs the sequence, writes
 * "base A_BASE B_BASE\n" to STATE (where each library's first mapping
 * started, from /proc/self/maps), prints "done\n" and waits for stdin to
 * end. Exits 3 if A is still mapped after dlclose, 4 if B is not at A's
 * base: the test then fails, never passes without the reuse it is about.
 * Build all three without frame pointers. */
#include <stdlib.h>
#include <string.h>

#define SITE __attribute__((noipa))

#if defined(LIB_A) || defined(LIB_B)

#if defined(LIB_A)
#define NAME(x) a_##x
#define SIZE 4444
#else
#define NAME(x) b_##x
#define SIZE 5555
#endif

SITE void *NAME(plugin_site)(size_t n) {
    void *p = malloc(n);
    if (p) memset(p, 1, n);
    return p;
}

SITE void *NAME(plugin_mid)(size_t n) {
    volatile char frame[300];
    frame[0] = (char)n;
    void *p = NAME(plugin_site)(n);
    return frame[0] ? p : p; /* the frame lives across the call */
}

void *plugin_entry(void) { return NAME(plugin_mid)(SIZE); }

#else

#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

static void *volatile kept[2];

/* Start of the first mapping of `path` in /proc/self/maps, or 0. */
static unsigned long mapped_at(const char *path) {
    char line[4096];
    unsigned long start = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) exit(5);
    while (fgets(line, sizeof line, f)) {
        char *name = strchr(line, '/');
        if (!name) continue;
        name[strcspn(name, "\n")] = 0;
        if (strcmp(name, path) == 0) {
            start = strtoul(line, NULL, 16);
            break;
        }
    }
    fclose(f);
    return start;
}

static void load(const char *path, void **handle) {
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(1);
    }
}

static void *load_and_allocate(const char *path, void **handle) {
    if (!*handle) load(path, handle);
    void *(*entry)(void) = (void *(*)(void))dlsym(*handle, "plugin_entry");
    if (!entry) exit(1);
    return entry();
}

int main(int argc, char **argv) {
    char line[64];
    if (argc < 4) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *handle = NULL;
    if (argc > 4 && strcmp(argv[4], "loaded-first") == 0) load(argv[1], &handle);
    printf("ready\n");
    if (!fgets(line, sizeof line, stdin)) clearerr(stdin);
    kept[0] = load_and_allocate(argv[1], &handle);
    unsigned long a_base = mapped_at(argv[1]);
    dlclose(handle);
    if (mapped_at(argv[1]) != 0) {
        fprintf(stderr, "%s is still mapped after dlclose\n", argv[1]);
        return 3;
    }
    handle = NULL;
    kept[1] = load_and_allocate(argv[2], &handle);
    unsigned long b_base = mapped_at(argv[2]);
    FILE *state = fopen(argv[3], "w");
    if (!state) return 5;
    fprintf(state, "base %lx %lx\n", a_base, b_base);
    fclose(state);
    if (a_base == 0 || a_base != b_base) {
        fprintf(stderr, "B at %lx, not at A's %lx\n", b_base, a_base);
        return 4;
    }
    printf("done\n");
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}

#endif
