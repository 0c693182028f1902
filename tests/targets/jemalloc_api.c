/* Test target for memtrace-bpf: jemalloc's own API (mallocx, rallocx,
 * xallocx, sdallocx, dallocx) with alignment and zeroing in the flags, and
 * C++'s operator new and delete, which jemalloc also defines. Linked
 * against Debian's libjemalloc.so.2, which ships no header in the runtime
 * package: the prototypes and flag macros are jemalloc's documented ones.
 *
 * Same protocol as sites.c: "ready", a line on stdin, the sites in the main
 * thread, "done", then wait for stdin to close. Expected numbers are in
 * tests/integration/allocators.rs. */
#include <stddef.h>
#include <string.h>
#include <unistd.h>

void *mallocx(size_t size, int flags);
void *rallocx(void *ptr, size_t size, int flags);
size_t xallocx(void *ptr, size_t size, size_t extra, int flags);
void sdallocx(void *ptr, size_t size, int flags);
void dallocx(void *ptr, int flags);
void *malloc(size_t size);
/* operator new(size_t) and operator delete(void*) by their mangled names. */
void *_Znwm(size_t size);
void _ZdlPv(void *ptr);

#define MALLOCX_LG_ALIGN(la) ((int)(la))
#define MALLOCX_ZERO ((int)0x40)

#define SITE __attribute__((noipa))
static void *volatile keep[64];
static volatile size_t sink;

static void *touch(void *p, size_t n) {
    if (p) memset(p, 0xab, n);
    return p;
}

/* 4 blocks of 3000 bytes aligned to 4096: 12000 live. */
SITE void site_mallocx_aligned(void) {
    for (int i = 0; i < 4; i++) {
        void *p = mallocx(3000, MALLOCX_LG_ALIGN(12) | MALLOCX_ZERO);
        if (((size_t)p & 4095) != 0) _exit(3);
        keep[i] = touch(p, 3000);
    }
}

/* 3 chains mallocx(100) -> rallocx(5000, align 64): 15000 live, 15300 allocated. */
SITE void site_rallocx(void) {
    for (int i = 0; i < 3; i++) {
        void *p = touch(mallocx(100, 0), 100);
        keep[4 + i] = touch(rallocx(p, 5000, MALLOCX_LG_ALIGN(6)), 5000);
    }
}

/* 2 blocks of mallocx(1000) (size class 1024) grown in place to 1010 + 10 extra:
 * xallocx returns 1024 and the blocks now hold min(1024, 1020) = 1020. */
SITE void site_xallocx_grow(void) {
    for (int i = 0; i < 2; i++) {
        void *p = touch(mallocx(1000, 0), 1000);
        size_t got = xallocx(p, 1010, 10, 0);
        if (got < 1010) _exit(4);
        keep[8 + i] = touch(p, 1020);
    }
}

/* 2 blocks of 1000 that cannot grow in place to 1 MiB: they stay 1000. */
SITE void site_xallocx_fail(void) {
    for (int i = 0; i < 2; i++) {
        void *p = touch(malloc(1000), 1000);
        size_t got = xallocx(p, 1 << 20, 0, 0);
        if (got >= (1 << 20)) _exit(5);
        keep[10 + i] = p;
    }
}

/* 50 mallocx(2000) freed by sdallocx, 30 malloc(700) freed by dallocx. */
SITE void site_sized_free(void) {
    for (int i = 0; i < 50; i++) {
        void *p = touch(mallocx(2000, 0), 2000);
        sink += ((char *)p)[3];
        sdallocx(p, 2000, 0);
    }
    for (int i = 0; i < 30; i++) {
        void *p = touch(malloc(700), 700);
        sink += ((char *)p)[3];
        dallocx(p, 0);
    }
}

/* operator new: 5 objects of 48 bytes kept, 5 deleted. */
SITE void site_operator_new(void) {
    for (int i = 0; i < 5; i++) keep[12 + i] = touch(_Znwm(48), 48);
    for (int i = 0; i < 5; i++) {
        void *p = touch(_Znwm(48), 48);
        sink += ((char *)p)[1];
        _ZdlPv(p);
    }
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(void) {
    char buf[64];
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    site_mallocx_aligned();
    site_rallocx();
    site_xallocx_grow();
    site_xallocx_fail();
    site_sized_free();
    site_operator_new();
    say("done\n");
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
