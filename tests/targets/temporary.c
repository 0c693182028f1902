/* temporary: allocations whose churn is known exactly (heaptrack's
 * "temporary": freed by the allocating thread before its next allocation).
 *
 *   pair       1000 malloc(64)/free pairs                 1000 temporary
 *   first      100 x: a = first(48), b = second(16),
 *   second         free(a), free(b)                       first 0, second 100
 *   cross      50 x malloc(80) freed by another thread    0
 *   grown      10 x malloc(32) realloc'ed to 4096 (the
 *              old block released by realloc: not
 *              temporary), then freed                     10 (4096 bytes each)
 *   kept       1 malloc(100) never freed                  0
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int to_worker[2], from_worker[2];

__attribute__((noinline)) static char *pair(void) { return malloc(64); }
__attribute__((noinline)) static char *first(void) { return malloc(48); }
__attribute__((noinline)) static char *second(void) { return malloc(16); }
__attribute__((noinline)) static char *cross(void) { return malloc(80); }
__attribute__((noinline)) static char *kept(void) { return malloc(100); }

__attribute__((noinline)) static char *grown(void) {
    char *p = malloc(32);
    memset(p, 1, 32);
    return realloc(p, 4096);
}

static void *worker(void *arg) {
    (void)arg;
    char *p;
    while (read(to_worker[0], &p, sizeof p) == sizeof p) {
        free(p);
        char ack = 1;
        if (write(from_worker[1], &ack, 1) != 1)
            break;
    }
    return NULL;
}

static volatile char sink;

static void use(char *p, size_t n) {
    memset(p, 7, n);
    sink = p[n - 1];
}

int main(void) {
    pthread_t t;
    if (pipe(to_worker) || pipe(from_worker) || pthread_create(&t, NULL, worker, NULL))
        return 1;
    for (int i = 0; i < 1000; i++) {
        char *p = pair();
        use(p, 64);
        free(p);
    }
    for (int i = 0; i < 100; i++) {
        char *a = first();
        char *b = second();
        use(a, 48);
        use(b, 16);
        free(a);
        free(b);
    }
    for (int i = 0; i < 50; i++) {
        char *c = cross();
        use(c, 80);
        char ack;
        if (write(to_worker[1], &c, sizeof c) != sizeof c || read(from_worker[0], &ack, 1) != 1)
            return 1;
    }
    for (int i = 0; i < 10; i++) {
        char *g = grown();
        use(g, 4096);
        free(g);
    }
    char *k = kept();
    use(k, 100);
    close(to_worker[1]);
    pthread_join(t, NULL);
    static const char done[] = "done\n";
    return write(1, done, sizeof done - 1) == sizeof done - 1 ? 0 : 1;
}
