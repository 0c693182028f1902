/* Test target for memtrace-bpf: C++'s array operators new[] and delete[]
 * (and their nothrow forms) called by their mangled names, linked against
 * Debian's libjemalloc.so.2, which defines them. There `_Znam` is
 * `jmp _Znwm`: one call must count once, and its return must match its
 * entry (no return_without_entry).
 *
 * Runs its sites in the main thread and exits with status 0: it is traced
 * as `memtrace-bpf -- new_array`. Expected numbers are in
 * tests/integration/allocators.rs. */
#include <stddef.h>
#include <string.h>

void *_Znwm(size_t size);
void *_Znam(size_t size);
void *_ZnamRKSt9nothrow_t(size_t size, const void *nothrow);
void _ZdlPv(void *ptr);
void _ZdaPv(void *ptr);

#define SITE __attribute__((noipa))
static void *volatile keep[64];
static volatile size_t sink;
/* Stands for std::nothrow: operator new only takes its address. */
static const char nothrow_tag;

static void *touch(void *p, size_t n) {
    if (p) memset(p, 0xab, n);
    return p;
}

/* 20 arrays of 1000 bytes kept: 20000 live. */
SITE void site_new_array(void) {
    for (int i = 0; i < 20; i++) keep[i] = touch(_Znam(1000), 1000);
}

/* 1000 arrays of 300 bytes, each deleted: 300000 allocated, none live. */
SITE void site_new_array_deleted(void) {
    for (int i = 0; i < 1000; i++) {
        void *p = touch(_Znam(300), 300);
        sink += ((volatile char *)p)[7];
        _ZdaPv(p);
    }
}

/* 5 nothrow arrays of 200 bytes kept: 1000 live. */
SITE void site_new_array_nothrow(void) {
    for (int i = 0; i < 5; i++) keep[20 + i] = touch(_ZnamRKSt9nothrow_t(200, &nothrow_tag), 200);
}

/* 10 objects of 48 bytes, 4 deleted: 288 live. */
SITE void site_new_object(void) {
    for (int i = 0; i < 10; i++) keep[30 + i] = touch(_Znwm(48), 48);
    for (int i = 0; i < 4; i++) _ZdlPv(keep[30 + i]);
}

int main(void) {
    site_new_array();
    site_new_array_deleted();
    site_new_array_nothrow();
    site_new_object();
    return 0;
}
