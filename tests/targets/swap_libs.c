/* Test target for memtrace-bpf: one library unloaded (dlclose) and another
 * loaded (dlopen) at the same addresses while traced, as a program that
 * reloads a plugin does. The addresses the tracer knew for the first mean
 * other code now.
 *
 * Built three times from this file: -shared -fPIC -DLIB_A is library A
 * (entry -> a_mid -> a_site: malloc), -shared -fPIC -DLIB_B library B
 * (entry -> b_mid -> b_mid2 -> b_site: malloc, larger frames), and without
 * either the program. Usage: swap_libs LIB_A LIB_B. Prints "ready\n",
 * then for each line on stdin:
 *   "a": dlopens LIB_A and keeps 100 blocks of 1111 bytes through it;
 *   "b": dlcloses LIB_A, dlopens LIB_B, keeps 100 blocks of 2222 bytes;
 *   "c": keeps 100 blocks of 3333 bytes through LIB_B;
 * and answers "did X ENTRY" (the address of the library's entry). Build
 * all three without frame pointers. */
#include <stdlib.h>
#include <string.h>

#define SITE __attribute__((noipa))

#if defined(LIB_A)

SITE void *a_site(size_t n) {
    void *p = malloc(n);
    memset(p, 1, n);
    return p;
}

SITE void *a_mid(size_t n) {
    volatile char frame[200];
    frame[0] = (char)n;
    void *p = a_site(n);
    return frame[0] ? p : p;
}

void *entry(size_t n) { return a_mid(n); }

#elif defined(LIB_B)

SITE void *b_site(size_t n) {
    void *p = malloc(n);
    memset(p, 2, n);
    return p;
}

SITE void *b_mid2(size_t n) {
    volatile char frame[5000];
    frame[0] = (char)n;
    void *p = b_site(n);
    return frame[0] ? p : p;
}

SITE void *b_mid(size_t n) {
    volatile char frame[1000];
    frame[0] = (char)n;
    void *p = b_mid2(n);
    return frame[0] ? p : p;
}

void *entry(size_t n) { return b_mid(n); }

#else

#include <dlfcn.h>
#include <stdio.h>

static void *volatile kept[300];
static int nkept;

static void *(*load(const char *path, void **handle))(size_t) {
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*handle) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(1);
    }
    void *(*entry)(size_t) = (void *(*)(size_t))dlsym(*handle, "entry");
    if (!entry) exit(1);
    return entry;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    void *handle = NULL;
    void *(*entry)(size_t) = NULL;
    char line[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        size_t size;
        if (line[0] == 'a') {
            entry = load(argv[1], &handle);
            size = 1111;
        } else if (line[0] == 'b') {
            dlclose(handle);
            entry = load(argv[2], &handle);
            size = 2222;
        } else if (line[0] == 'c') {
            size = 3333;
        } else {
            continue;
        }
        for (int i = 0; i < 100 && nkept < 300; i++) kept[nkept++] = entry(size);
        printf("did %c %p\n", line[0], (void *)entry);
    }
    return 0;
}

#endif
