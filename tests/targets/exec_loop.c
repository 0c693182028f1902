/* Test target for memtrace-bpf: a process that execs itself again and
 * again, as a tracer attaches to it and while it traces it.
 *
 * `exec_loop` prints "ready" and execs itself as `exec_loop spin`. A spin
 * image looks at stdin for at most 1 ms: with nothing there it execs
 * itself again as `exec_loop spin` (hundreds of images a second, so that
 * a tracer attaching meanwhile meets images that come and go); with a
 * line it execs `exec_loop 1`.
 *
 * Image `exec_loop N` (N >= 1): prints "image N ready", waits for a line,
 * keeps N blocks of 1000 bytes (site_each_image), prints "image N done",
 * waits for a line and execs `exec_loop N+1`, whose exec drops those
 * blocks: from its main thread when N+1 is odd, from a thread it starts
 * when N+1 is even (the kernel then gives that thread the process's pid,
 * and the main thread's task is gone). At end of input it stays as it is
 * until killed.
 *
 * stdin is read with read(2), one line at a time, never through stdio:
 * what a buffer held would be lost at the exec. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))
static void *volatile keep[64];
static volatile size_t sink;

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

/* Reads one line from stdin; 0 at its end. */
static int read_line(void) {
    char c;
    for (;;) {
        ssize_t n = read(0, &c, 1);
        if (n <= 0) return 0;
        if (c == '\n') return 1;
    }
}

SITE void site_each_image(int n) {
    for (int i = 0; i < n && i < 64; i++) {
        keep[i] = malloc(1000);
        memset(keep[i], 0xab, 1000);
    }
}

static void exec_as(char *argv0, const char *arg) {
    char *args[] = {argv0, (char *)arg, NULL};
    execv("/proc/self/exe", args);
    say("exec failed\n");
    exit(2);
}

static char *next_argv0;
static char next_arg[16];

static void *exec_from_thread(void *unused) {
    (void)unused;
    exec_as(next_argv0, next_arg);
    return NULL;
}

int main(int argc, char **argv) {
    char line[96];
    if (argc < 2) {
        say("ready\n");
        exec_as(argv[0], "spin");
    }
    if (strcmp(argv[1], "spin") == 0) {
        struct pollfd in = {.fd = 0, .events = POLLIN};
        if (poll(&in, 1, 1) == 1 && read_line()) exec_as(argv[0], "1");
        exec_as(argv[0], "spin");
    }
    int n = atoi(argv[1]);
    snprintf(line, sizeof line, "image %d ready\n", n);
    say(line);
    if (!read_line()) pause();
    site_each_image(n);
    snprintf(line, sizeof line, "image %d done\n", n);
    say(line);
    if (!read_line()) pause();
    snprintf(next_arg, sizeof next_arg, "%d", n + 1);
    if ((n + 1) % 2 == 1) exec_as(argv[0], next_arg);
    next_argv0 = argv[0];
    pthread_t thread;
    if (pthread_create(&thread, NULL, exec_from_thread, NULL) != 0) {
        say("pthread_create failed\n");
        return 2;
    }
    pause();
    return 0;
}
