/* Test target for memtrace-bpf: a program run in a chroot or another mount
 * namespace (its libc is not the host's file). 20000 blocks of 100 bytes
 * allocated and freed (site_churn), one block of 12345 bytes kept
 * (site_kept), then it exits. */
#include <stdlib.h>
#include <string.h>

#define SITE __attribute__((noipa))
static void *volatile keep;

SITE void site_churn(void) {
    for (int i = 0; i < 20000; i++) {
        void *p = malloc(100);
        memset(p, 1, 100);
        keep = p;
        free(p);
    }
}

SITE void site_kept(void) {
    keep = malloc(12345);
    memset(keep, 2, 12345);
}

int main(void) {
    site_churn();
    site_kept();
    return 0;
}
