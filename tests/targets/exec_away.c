/* Test target for --binary's bounds: forks N children that each exec
 * /bin/cat (they leave the traced program) and stay alive reading a pipe
 * this process holds, allocates one kept block so the report has a stack,
 * and prints "done\n" once every child has exec'ed; then it waits for a
 * line on stdin (or to be killed), and the cats exit when it does. It
 * prints "ready\n" first and starts on a line on stdin.
 *
 *   exec_away N
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile keep;
static volatile size_t sink;

int main(int argc, char **argv) {
    char buf[8];
    int n = argc > 1 ? atoi(argv[1]) : 1;
    int hold[2];
    if (pipe(hold) != 0) return 70;
    sink += (size_t)write(1, "ready\n", 6);
    sink += (size_t)read(0, buf, sizeof buf);
    for (int i = 0; i < n; i++) {
        /* Closed by the child's exec: EOF here says it has exec'ed. */
        int execed[2];
        if (pipe2(execed, O_CLOEXEC) != 0) return 71;
        pid_t child = fork();
        if (child == 0) {
            close(execed[0]);
            close(hold[1]);
            dup2(hold[0], 0);
            execl("/bin/cat", "cat", (char *)NULL);
            _exit(127);
        }
        close(execed[1]);
        while (read(execed[0], buf, 1) > 0) {
        }
        close(execed[0]);
    }
    keep = malloc(4096);
    if (keep) memset(keep, 1, 4096);
    sink += (size_t)write(1, "done\n", 5);
    sink += (size_t)read(0, buf, sizeof buf);
    return 0;
}
