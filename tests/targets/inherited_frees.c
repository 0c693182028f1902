/* Test target for memtrace-bpf: a server that allocates at its start and
 * forks workers that free what they inherited (as postgres' backends do).
 * Usage: inherited_frees N WORKERS. Allocates N blocks of 24..88 bytes,
 * prints "ready", waits for a line on stdin, then forks WORKERS children
 * one after another; each frees all N blocks it inherited, allocates and
 * frees one block of 7777 bytes, and exits 0. Prints "done" when all
 * exited, then waits for stdin to end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long n = atol(argv[1]);
    int workers = atoi(argv[2]);
    char **blocks = malloc(sizeof(char *) * (size_t)n);
    if (!blocks) return 1;
    for (long i = 0; i < n; i++) {
        blocks[i] = malloc(24 + (size_t)(i % 5) * 16);
        if (!blocks[i]) return 1;
        blocks[i][0] = (char)i;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[64];
    if (!fgets(line, sizeof line, stdin)) clearerr(stdin);
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            long sum = 0;
            for (long i = 0; i < n; i++) {
                sum += blocks[i][0];
                free(blocks[i]);
            }
            char *p = malloc(7777);
            if (!p) _exit(1);
            memset(p, (int)sum, 7777);
            free(p);
            _exit(0);
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
            return 1;
    }
    printf("done\n");
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
