/* Test target for saved-profile diffs: each "l" line on stdin leaks 25
 * blocks of 1000 bytes from leaky() and allocates and frees 10 blocks of
 * 3000 from churn(), then prints "did l". A diff of snapshots taken after
 * step i and step j shows leaky() grown by exactly (j - i) * 25000 bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BLOCKS 2500
static void *volatile kept[MAX_BLOCKS];
static int count;

__attribute__((noinline)) void *leaky(void) {
    void *p = malloc(1000);
    memset(p, 1, 1000);
    return p;
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < 10; i++) {
        char *volatile p = malloc(3000);
        memset(p, 2, 3000);
        free(p);
    }
}

int main(void) {
    char line[64];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin) && line[0] == 'l') {
        for (int i = 0; i < 25 && count < MAX_BLOCKS; i++)
            kept[count++] = leaky();
        churn();
        printf("did l\n");
        fflush(stdout);
    }
    return 0;
}
