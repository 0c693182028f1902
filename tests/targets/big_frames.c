/* Test target for memtrace-bpf's kernel unwinding (--unwind tables): call
 * sites that copied-stack unwinding cannot reach past, each leaking a known
 * number of bytes.
 *
 *  - site_big_frame: malloc(1111) under a function with a 64 KiB stack
 *    array (far more than any stack copy);
 *  - site_asm: malloc(2222) in a C function called through hand-written
 *    assembly without CFI that keeps a frame pointer (asm_trampoline);
 *  - threads: 32 threads, each making ROUNDS malloc/free pairs through a
 *    function with a 20 KiB frame DEPTH (64) calls below the thread's
 *    start (descend), keeping the last KEPT blocks (100 + thread bytes
 *    each).
 *
 * Usage: big_frames [ROUNDS]. Protocol as in sites.c: prints "ready\n",
 * waits for a line on stdin, runs every site (the threads last, joined),
 * prints "done\n", then waits for stdin to close. Build it without frame
 * pointers: only the assembly keeps one. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))
#define THREADS 32
#define KEPT 10
#define DEPTH 64

static void *volatile kept[4];
static void *volatile thread_kept[THREADS][KEPT];
static volatile size_t sink;
static int rounds = 2000;

SITE void *site_big_frame(size_t n) {
    volatile char frame[64 << 10];
    for (size_t i = 0; i < sizeof frame; i += 4096) frame[i] = (char)i;
    void *p = malloc(n);
    return frame[n % 7] ? p : p; /* the frame lives across the call */
}

/* Called from assembly: allocates, then uses its own stack so the compiler
 * keeps a real frame. */
SITE void *site_asm(size_t n) {
    volatile char frame[64];
    frame[0] = (char)n;
    void *p = malloc(n);
    return frame[0] ? p : p;
}

/* asm_trampoline(n): push rbp; mov rbp, rsp; call site_asm; pop rbp; ret.
 * No .cfi directives: no FDE covers it. */
void *asm_trampoline(size_t n);
__asm__(".text\n"
        ".globl asm_trampoline\n"
        ".type asm_trampoline, @function\n"
        "asm_trampoline:\n"
        "    push %rbp\n"
        "    mov %rsp, %rbp\n"
        "    call site_asm\n"
        "    pop %rbp\n"
        "    ret\n"
        ".size asm_trampoline, .-asm_trampoline\n");

SITE void *site_thread_frame(int t, int i) {
    volatile char frame[20 << 10];
    for (size_t j = 0; j < sizeof frame; j += 4096) frame[j] = (char)(t + i);
    void *p = malloc(100 + (size_t)t);
    return frame[i % 5 * 4096] == (char)(t + i) ? p : p;
}

/* DEPTH frames of descend above site_thread_frame (not a tail call: the
 * result is used after the call). */
SITE void *descend(int depth, int t, int i) {
    void *p = depth > 1 ? descend(depth - 1, t, i) : site_thread_frame(t, i);
    sink += (size_t)depth;
    return p;
}

static void *worker(void *arg) {
    int t = (int)(long)arg;
    for (int i = 0; i < rounds; i++) {
        void *p = descend(DEPTH, t, i);
        int slot = i % KEPT;
        if (i >= rounds - KEPT) {
            thread_kept[t][slot] = p;
        } else {
            free(p);
        }
    }
    return NULL;
}

SITE void run_sites(void) {
    kept[0] = site_big_frame(1111);
    kept[1] = asm_trampoline(2222);
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(int argc, char **argv) {
    char buf[64];
    if (argc > 1) rounds = atoi(argv[1]);
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    run_sites();
    say("done\n");
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
