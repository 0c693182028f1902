/* Test target for memtrace-bpf: allocates all the time, including while the
 * tracer attaches and detaches. Each tick: `request` mallocs and frees (keeps
 * nothing), `grow` reallocs one buffer 4 KiB larger (crossing glibc's mmap
 * threshold, then starting over), so exactly one grow block is live at any
 * moment. Prints "ready" and runs until killed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile sink;
static char *buf;
static size_t len;

__attribute__((noinline)) void request(void) {
    char *a = malloc(256);
    char *b = calloc(8, 64);
    memset(a, 1, 256);
    sink = a;
    sink = b;
    free(b);
    free(a);
}

__attribute__((noinline)) void grow(void) {
    if (len + 4096 > (1 << 20)) {
        free(buf);
        buf = NULL;
        len = 0;
    }
    buf = realloc(buf, len + 4096);
    memset(buf + len, 1, 4096);
    len += 4096;
    sink = buf;
}

int main(void) {
    if (write(1, "ready\n", 6) != 6) return 1;
    for (;;) {
        request();
        grow();
        usleep(500);
    }
}
