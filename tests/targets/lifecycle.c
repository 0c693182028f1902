/* Test target for the life of `memtrace-bpf -- CMD`. It reports what
 * happens to it by appending lines to the file named by its first argument
 * (its stdout is the tracer's, closed at once), and allocates in a function named after
 * each step, so the report shows which steps ran while traced.
 *
 *   lifecycle FILE jobctl       waits for two SIGCONTs (the test stops it
 *                               with SIGSTOP, then SIGTSTP), exits 0
 *   lifecycle FILE shutdown     waits for SIGTERM, SIGINT or SIGHUP,
 *                               allocates, exits 0
 *   lifecycle FILE stubborn     ignores SIGTERM, SIGINT and SIGHUP, runs
 *                               until killed
 *   lifecycle FILE argv ARG...  writes its arguments to FILE, each followed
 *                               by a NUL byte, exits 0
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile kept[8];
static volatile sig_atomic_t continued, got_signal;
static const char *state_file;

static void on_cont(int sig) { (void)sig; continued++; }
static void on_stop_request(int sig) { got_signal = sig; }

static void say(const char *fmt, int value) {
    FILE *f = fopen(state_file, "a");
    if (!f) exit(90);
    fprintf(f, fmt, value);
    fputc('\n', f);
    fclose(f);
}

__attribute__((noinline)) static void keep(int slot, size_t size) {
    char *p = malloc(size);
    memset(p, slot + 1, size);
    kept[slot] = p;
}

__attribute__((noinline)) void before_stop(void) { keep(0, 1111); }
__attribute__((noinline)) void after_continue(void) { keep(1, 2222); }
__attribute__((noinline)) void on_shutdown(void) { keep(2, 3333); }
__attribute__((noinline)) void with_args(void) { keep(3, 4444); }

/* Waits, signals unblocked, until *flag reaches want. */
static void wait_until(volatile sig_atomic_t *flag, int want, sigset_t *blocked) {
    sigset_t old;
    sigprocmask(SIG_BLOCK, blocked, &old);
    while (*flag < want) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    /* Its stdout and stderr are the tracer's pipes to the test: let them
     * go, so that the test sees them end when the tracer exits even if
     * this outlives it (--keep-running). */
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    state_file = argv[1];
    const char *mode = argv[2];
    sigset_t blocked;
    sigemptyset(&blocked);
    if (!strcmp(mode, "jobctl")) {
        signal(SIGCONT, on_cont);
        sigaddset(&blocked, SIGCONT);
        before_stop();
        say("ready %d", getpid());
        wait_until(&continued, 1, &blocked);
        say("continued %d", 1);
        wait_until(&continued, 2, &blocked);
        after_continue();
        say("continued %d", 2);
        return 0;
    }
    if (!strcmp(mode, "shutdown") || !strcmp(mode, "stubborn")) {
        int stubborn = !strcmp(mode, "stubborn");
        signal(SIGTERM, stubborn ? SIG_IGN : on_stop_request);
        signal(SIGINT, stubborn ? SIG_IGN : on_stop_request);
        signal(SIGHUP, stubborn ? SIG_IGN : on_stop_request);
        sigaddset(&blocked, SIGTERM);
        sigaddset(&blocked, SIGINT);
        sigaddset(&blocked, SIGHUP);
        before_stop();
        say("ready %d", getpid());
        wait_until(&got_signal, 1, &blocked);
        on_shutdown();
        say("got signal %d", got_signal);
        return 0;
    }
    if (!strcmp(mode, "argv")) {
        FILE *f = fopen(state_file, "w");
        if (!f) return 90;
        for (int i = 3; i < argc; i++) fwrite(argv[i], 1, strlen(argv[i]) + 1, f);
        fclose(f);
        with_args();
        return 0;
    }
    return 2;
}
