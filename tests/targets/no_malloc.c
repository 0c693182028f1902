/* Test target for memtrace-bpf: a static program with no malloc or free,
 * as a Go program is (Go has its own allocator), or with -m32 a 32-bit
 * program. No C library: raw system calls only.
 *
 * Prints "ready\n", waits for a line on stdin (or its end), exits 0.
 * Build: cc -static -nostdlib -fno-stack-protector [-m32 -fno-pie -no-pie] */
#if defined(__x86_64__)
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
enum { SYS_READ = 0, SYS_WRITE = 1, SYS_EXIT = 60 };
#else
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(n), "b"(a), "c"(b), "d"(c) : "memory");
    return r;
}
enum { SYS_READ = 3, SYS_WRITE = 4, SYS_EXIT = 1 };
#endif

/* Kept in a volatile global: the program's own "heap". */
static volatile char arena[4096];

void _start(void) {
    char line[64];
    for (int i = 0; i < (int)sizeof arena; i++) arena[i] = (char)i;
    sys3(SYS_WRITE, 1, (long)"ready\n", 6);
    sys3(SYS_READ, 0, (long)line, sizeof line);
    sys3(SYS_EXIT, 0, 0, 0);
    for (;;) {
    }
}
