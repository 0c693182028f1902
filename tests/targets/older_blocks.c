/* Test target for exact mode's frees: with "free", allocates OLD blocks
 * of 1000 bytes, says "ready", and on a line on stdin frees them all and
 * keeps NEW blocks of 4242 bytes from keep_new(); with "hold", says
 * "ready" and on a line on stdin keeps OLD blocks of 1000 bytes from
 * hold(). Then says "done" and waits for stdin to close. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OLD 500
#define NEW 3

static char *old[OLD];
static char *volatile kept[NEW];

__attribute__((noinline)) static void keep_new(void) {
    for (int i = 0; i < NEW; i++) {
        kept[i] = malloc(4242);
        memset(kept[i], 1, 4242);
    }
}

__attribute__((noinline)) static void hold(void) {
    for (int i = 0; i < OLD; i++) {
        old[i] = malloc(1000);
        memset(old[i], 2, 1000);
    }
}

int main(int argc, char **argv) {
    int freeing = argc > 1 && strcmp(argv[1], "free") == 0;
    char line[64];
    if (freeing) {
        for (int i = 0; i < OLD; i++) {
            old[i] = malloc(1000);
            memset(old[i], 3, 1000);
        }
    }
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    if (freeing) {
        for (int i = 0; i < OLD; i++)
            free(old[i]);
        keep_new();
    } else {
        hold();
    }
    printf("done\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
