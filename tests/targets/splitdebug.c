/* Test target for memtrace-bpf: a program whose allocating functions are
 * static, so a stripped copy names them nowhere but in its separate debug
 * file. One block of 4321 bytes is kept (static_site_kept, called through
 * static_caller), 1000 blocks of 64 bytes allocated and freed
 * (static_site_churn); then it exits. Built without frame pointers. */
#include <stdlib.h>
#include <string.h>

#define SITE __attribute__((noipa))
static void *volatile keep;

SITE static void static_site_kept(void) {
    keep = malloc(4321);
    memset(keep, 2, 4321);
}

SITE static void static_caller(void) {
    static_site_kept();
    keep = (char *)keep + 0;
}

SITE static void static_site_churn(void) {
    for (int i = 0; i < 1000; i++) {
        void *p = malloc(64);
        memset(p, 1, 64);
        keep = p;
        free(p);
    }
}

int main(void) {
    static_site_churn();
    void *churned = keep;
    static_caller();
    return churned == keep;
}
