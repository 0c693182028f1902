/* Test target for snapshots taken during a trace: its heap goes through
 * three states, one per line read on stdin.
 *   a: allocates 10 blocks of 1000 bytes (kept)          -> "did a"
 *   b: frees them, allocates 20 blocks of 2000 (kept)     -> "did b"
 *   c: frees those, allocates 1 block of 5555 (kept)      -> "did c"
 * Each site is its own function, so its frame names the state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *blocks[32];
static int count;

static void drop_all(void) {
    for (int i = 0; i < count; i++)
        free(blocks[i]);
    count = 0;
}

__attribute__((noinline)) void *site_a(void) {
    void *p = malloc(1000);
    memset(p, 1, 1000);
    return p;
}

__attribute__((noinline)) void *site_b(void) {
    void *p = malloc(2000);
    memset(p, 2, 2000);
    return p;
}

__attribute__((noinline)) void *site_c(void) {
    void *p = malloc(5555);
    memset(p, 3, 5555);
    return p;
}

int main(void) {
    char line[64];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'a') {
            while (count < 10)
                blocks[count++] = site_a();
        } else if (line[0] == 'b') {
            drop_all();
            while (count < 20)
                blocks[count++] = site_b();
        } else if (line[0] == 'c') {
            drop_all();
            blocks[count++] = site_c();
        } else {
            break;
        }
        printf("did %c\n", line[0]);
        fflush(stdout);
    }
    return 0;
}
