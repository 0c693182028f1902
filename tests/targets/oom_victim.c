/* oom_victim: forks a child that joins the memory cgroup whose
 * cgroup.procs file is argv[1], allocates known sites (kept), then grows
 * by 1 MiB blocks it touches until the OOM killer kills it. The parent,
 * outside the cgroup, reports how the child ended and exits.
 *
 * Output (write(2), no stdio buffer is allocated):
 *   child PID kept           the known sites are allocated
 *   grew N                   N grow blocks allocated and touched
 *   child killed by signal S / child exited with status S
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#define BLOCK (1 << 20)

static void say(const char *line) {
    ssize_t n = write(1, line, strlen(line));
    (void)n;
}

__attribute__((noinline)) static char *keep_small(void) {
    char *p = malloc(1000);
    memset(p, 1, 1000);
    return p;
}

__attribute__((noinline)) static char *keep_large(void) {
    char *p = malloc(5000);
    memset(p, 2, 5000);
    return p;
}

__attribute__((noinline)) static char *grow_block(void) {
    return malloc(BLOCK);
}

static volatile char *kept[4];

static void child(const char *procs) {
    char line[64];
    int fd = open(procs, O_WRONLY);
    if (fd < 0) {
        say("cannot open cgroup.procs\n");
        _exit(3);
    }
    int n = snprintf(line, sizeof line, "%d\n", (int)getpid());
    if (write(fd, line, n) != n) {
        say("cannot join the cgroup\n");
        _exit(3);
    }
    close(fd);
    kept[0] = keep_small();
    kept[1] = keep_small();
    kept[2] = keep_small();
    kept[3] = keep_large();
    snprintf(line, sizeof line, "child %d kept\n", (int)getpid());
    say(line);
    for (long i = 1;; i++) {
        char *p = grow_block();
        if (!p) {
            say("malloc failed\n");
            _exit(4);
        }
        memset(p, 3, BLOCK);
        snprintf(line, sizeof line, "grew %ld\n", i);
        say(line);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        say("usage: oom_victim CGROUP_PROCS_FILE\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid == 0)
        child(argv[1]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return 1;
    char line[64];
    if (WIFSIGNALED(status))
        snprintf(line, sizeof line, "child killed by signal %d\n", WTERMSIG(status));
    else
        snprintf(line, sizeof line, "child exited with status %d\n", WEXITSTATUS(status));
    say(line);
    return 0;
}
