/* Test target for memtrace-bpf's output safety. It allocates through a
 * function whose symbol-table name the test overwrites with a hostile one
 * (terminal escapes, a newline, ';' and a trailing number), so the reports
 * must escape it; the test also runs it under a hostile path and argv.
 * With a last argument "wait": prints "ready", allocates on a "go" line,
 * prints "done" and runs until stdin closes. Otherwise it allocates once
 * and exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile sink;

/* The test replaces this name, byte for byte, in the built binary. */
__attribute__((noinline)) void *hostile_name_placeholder_0123456789(size_t n) {
    char *p = malloc(n);
    memset(p, 7, n);
    return p;
}

int main(int argc, char **argv) {
    int wait = argc > 1 && strcmp(argv[argc - 1], "wait") == 0;
    char line[64];
    if (wait) {
        if (write(1, "ready\n", 6) != 6) return 1;
        while (fgets(line, sizeof line, stdin) && strncmp(line, "go", 2) != 0) {
        }
    }
    sink = hostile_name_placeholder_0123456789(4096);
    if (wait) {
        if (write(1, "done\n", 5) != 5) return 1;
        while (fgets(line, sizeof line, stdin)) {
        }
    }
    return 0;
}
