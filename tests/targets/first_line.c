/* Test target for `memtrace-bpf -- CMD`: allocates in the first line of
 * main and exits with 3 at once: the tracer holds it at its exit (ptrace)
 * to read its maps, so its frames are still named. */
#include <stdlib.h>
#include <string.h>

void *volatile kept;

int main(void) {
    char *p = malloc(12345);
    memset(p, 1, 12345);
    kept = p;
    return 3;
}
