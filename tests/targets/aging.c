/* Test target for --min-age: two sets of blocks allocated at times the test
 * chooses, one per line read on stdin, and all kept until it quits.
 *   a: allocates 10 blocks of 1000 bytes at site_old  -> "did a"
 *   b: allocates 20 blocks of 2000 bytes at site_new  -> "did b"
 * Any other line: frees nothing and exits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *volatile blocks[30];
static int count;

__attribute__((noinline)) void *site_old(void) {
    void *p = malloc(1000);
    memset(p, 1, 1000);
    return p;
}

__attribute__((noinline)) void *site_new(void) {
    void *p = malloc(2000);
    memset(p, 2, 2000);
    return p;
}

int main(void) {
    char line[64];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'a') {
            for (int i = 0; i < 10 && count < 30; i++)
                blocks[count++] = site_old();
        } else if (line[0] == 'b') {
            for (int i = 0; i < 20 && count < 30; i++)
                blocks[count++] = site_new();
        } else {
            break;
        }
        printf("did %c\n", line[0]);
        fflush(stdout);
    }
    return 0;
}
