/* Test target for pid reuse: keeps one block of 4321 bytes; with the
 * argument "wait" it says "ready" and waits for a line on stdin, otherwise
 * it exits at once (without freeing the block). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile kept;

int main(int argc, char **argv) {
    char *p = malloc(4321);
    memset(p, 1, 4321);
    kept = p;
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char line[64];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    return 0;
}
