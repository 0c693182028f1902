/* Test target for `memtrace-bpf -- CMD`: allocates in the first line of
 * main, lives long enough for the tracer to read its maps, exits with 3. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile kept;

int main(void) {
    char *p = malloc(12345);
    memset(p, 1, 12345);
    kept = p;
    usleep(300 * 1000);
    return 3;
}
