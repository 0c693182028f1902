/* Test target for unknown frees: 16 threads that each malloc and free a
 * block, then exit (glibc hands back each thread's cache at its exit). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

void *volatile sink;

static void *run(void *arg) {
    char *p = malloc(100);
    memset(p, 1, 100);
    sink = p;
    free(p);
    return arg;
}

int main(void) {
    pthread_t t[16];
    for (int i = 0; i < 16; i++)
        pthread_create(&t[i], NULL, run, NULL);
    for (int i = 0; i < 16; i++)
        pthread_join(t[i], NULL);
    return 0;
}
