/* Test target for --follow-forks: a process that forks children which
 * allocate known sizes and stay alive.
 *
 *   forker N [grandchild] [exit] [exec LIB PROGRAM]
 *
 * Prints "ready\n" and waits for a line on stdin. Then it starts a thread
 * (threads are not children), and forks N children; child k (1..N) keeps
 * k blocks of k*1000 bytes from child_site. With "grandchild", child 1
 * also forks a grandchild that keeps 3 blocks of 7000 bytes from
 * grandchild_site. With "exec LIB PROGRAM", one more child execs PROGRAM
 * with LD_PRELOAD=LIB (PROGRAM talks on stdin/stdout itself). With "exit",
 * the allocating children exit at once and the parent reaps them before it
 * goes on. The parent
 * keeps 5 blocks of 2000 bytes from parent_site and its thread 2 blocks of
 * 3000 bytes from thread_site. Once every allocating child has, it prints
 * "forked all\n" and waits (without reading stdin) until it is killed; its
 * children exit when it does (a pipe they wait on closes).
 *
 * Raw syscalls for output, so stdio allocates nothing; every block is kept
 * in a volatile global so nothing is elided. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))

static void *volatile keep[16];
static volatile size_t sink;

static void *touch(void *p, size_t n) {
    if (p) memset(p, 0xcd, n);
    return p;
}

SITE void child_site(int k) {
    for (int i = 0; i < k; i++) keep[i] = touch(malloc((size_t)k * 1000), (size_t)k * 1000);
}

SITE void grandchild_site(void) {
    for (int i = 0; i < 3; i++) keep[i] = touch(malloc(7000), 7000);
}

SITE void parent_site(void) {
    for (int i = 0; i < 5; i++) keep[i] = touch(malloc(2000), 2000);
}

SITE void *thread_site(void *arg) {
    (void)arg;
    for (int i = 0; i < 2; i++) keep[8 + i] = touch(malloc(3000), 3000);
    return NULL;
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

/* Tells the parent this process has allocated, then waits until the
 * parent is gone (the hold pipe's write end closes). */
static int exit_at_once;

static void report_and_hold(int status_fd, int hold_fd) {
    char c = 'a';
    sink += (size_t)write(status_fd, &c, 1);
    if (exit_at_once) _exit(0);
    while (read(hold_fd, &c, 1) > 0) {
    }
    _exit(0);
}

int main(int argc, char **argv) {
    char buf[64];
    int status[2], hold[2];
    pthread_t th;
    if (argc < 2) return 64;
    int n = atoi(argv[1]);
    int grandchild = 0;
    const char *lib = NULL, *program = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "grandchild") == 0) grandchild = 1;
        if (strcmp(argv[i], "exit") == 0) exit_at_once = 1;
        if (strcmp(argv[i], "exec") == 0 && i + 2 < argc) {
            lib = argv[i + 1];
            program = argv[i + 2];
            i += 2;
        }
    }
    if (pipe(status) != 0 || pipe(hold) != 0) return 65;
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    if (pthread_create(&th, NULL, thread_site, NULL) != 0) return 2;
    pthread_join(th, NULL);
    parent_site();
    int expected = 0;
    for (int k = 1; k <= n; k++) {
        expected += 1 + (k == 1 && grandchild);
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid > 0) continue;
        close(hold[1]);
        if (k == 1 && grandchild) {
            pid_t g = fork();
            if (g < 0) _exit(4);
            if (g == 0) {
                grandchild_site();
                report_and_hold(status[1], hold[0]);
            }
        }
        child_site(k);
        report_and_hold(status[1], hold[0]);
    }
    if (program) {
        pid_t pid = fork();
        if (pid < 0) return 5;
        if (pid == 0) {
            char *args[] = {(char *)program, NULL};
            close(hold[1]);
            setenv("LD_PRELOAD", lib, 1);
            execv(program, args);
            _exit(127);
        }
    }
    for (int got = 0; got < expected; got++) {
        char c;
        if (read(status[0], &c, 1) != 1) return 6;
    }
    /* The children (not a grandchild, which is not ours to reap). */
    for (int k = 1; exit_at_once && k <= n; k++) {
        if (wait(NULL) < 0) return 7;
    }
    say("forked all\n");
    for (;;) pause();
}
