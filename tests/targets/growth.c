/* Three heap shapes side by side, paced by the program's own clock with
 * absolute deadlines (clock_nanosleep TIMER_ABSTIME), so their rates stay
 * right on a loaded machine: every 10 ms tick,
 *   leak_grow   keeps one 2048-byte block: 204800 bytes/s, never freed;
 *   cache_fill  keeps four 4096-byte blocks during the first 3 s (4.9 MB),
 *               then holds them: a cache that fills, then stays flat;
 *   churn_spin  allocates and frees twenty 1024-byte blocks: 2 MB/s, none
 *               kept.
 * Runs argv[1] seconds (default 60), or until killed. Prints "ready" first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TICK_NS 10000000L
#define TICKS_PER_SEC 100
#define LEAK_BLOCK 2048
#define CACHE_BLOCK 4096
#define CACHE_TICKS (3 * TICKS_PER_SEC)
#define CACHE_PER_TICK 4
#define CHURN_PER_TICK 20

static void *volatile *leaked;
static void *volatile cache[CACHE_TICKS * CACHE_PER_TICK];
static volatile unsigned char sink;

__attribute__((noinline)) static void leak_grow(long tick)
{
	void *p = malloc(LEAK_BLOCK);
	memset(p, (int)tick, LEAK_BLOCK);
	leaked[tick] = p;
}

__attribute__((noinline)) static void cache_fill(long tick)
{
	if (tick >= CACHE_TICKS)
		return;
	for (int i = 0; i < CACHE_PER_TICK; i++) {
		void *p = malloc(CACHE_BLOCK);
		memset(p, i, CACHE_BLOCK);
		cache[tick * CACHE_PER_TICK + i] = p;
	}
}

__attribute__((noinline)) static void churn_spin(long tick)
{
	for (int i = 0; i < CHURN_PER_TICK; i++) {
		unsigned char *p = malloc(1024);
		memset(p, (int)(tick + i), 1024);
		sink = p[tick % 1024];
		free(p);
	}
}

int main(int argc, char **argv)
{
	long secs = argc > 1 ? atol(argv[1]) : 60;
	long ticks = secs * TICKS_PER_SEC;
	struct timespec next;

	leaked = calloc(ticks + 1, sizeof(void *));
	if (!leaked)
		return 1;
	printf("ready\n");
	fflush(stdout);
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (long tick = 0; tick < ticks; tick++) {
		leak_grow(tick);
		cache_fill(tick);
		churn_spin(tick);
		next.tv_nsec += TICK_NS;
		if (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	return 0;
}
