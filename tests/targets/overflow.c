/* Test target for a ring buffer that overflows: allocations and frees in
 * a tight loop, far more events than a 1 MiB ring buffer holds, and every
 * block freed before the end, so what the report keeps in use is what it
 * lost the free of. No stdio: nothing is left allocated. */
#include <stdlib.h>
#include <string.h>

#define ROUNDS 200000
#define WINDOW 64

static void *volatile window[WINDOW];

int main(void) {
    for (int i = 0; i < ROUNDS; i++) {
        int slot = i % WINDOW;
        free(window[slot]);
        char *p = malloc(32 + (size_t)(i % 16) * 8);
        memset(p, 3, 32);
        window[slot] = p;
    }
    for (int i = 0; i < WINDOW; i++)
        free(window[i]);
    return 0;
}
