/* A cache at its capacity that replaces its entries, beside a slow leak,
 * paced by the program's own clock with absolute deadlines:
 *   fill_cache     allocates ENTRIES 2048-byte entries before "ready" (a
 *                  tracer attached later never sees them allocated);
 *   replace_entry  every 10 ms frees the oldest entry and allocates its
 *                  replacement: 204800 bytes/s of new blocks, the heap
 *                  flat (the entries freed are the ones from before);
 *   leak_slow      every 100 ms keeps one 2048-byte block: 20480 bytes/s.
 * ENTRIES covers 40 s of replacements, so a trace shorter than that never
 * sees an entry it saw allocated freed. Runs argv[1] seconds (default 60),
 * or until killed. Prints "ready" once the cache is full. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TICK_NS 10000000L
#define TICKS_PER_SEC 100
#define BLOCK 2048
#define ENTRIES 4000
#define LEAK_EVERY 10

static void *volatile cache[ENTRIES];
static void *volatile *leaked;
static volatile unsigned char sink;

__attribute__((noinline)) static void fill_cache(void)
{
	for (int i = 0; i < ENTRIES; i++) {
		unsigned char *p = malloc(BLOCK);
		memset(p, i, BLOCK);
		cache[i] = p;
	}
}

__attribute__((noinline)) static void replace_entry(long tick)
{
	long i = tick % ENTRIES;
	unsigned char *old = cache[i];
	sink = old[tick % BLOCK];
	free(old);
	unsigned char *p = malloc(BLOCK);
	memset(p, (int)tick, BLOCK);
	cache[i] = p;
}

__attribute__((noinline)) static void leak_slow(long tick)
{
	if (tick % LEAK_EVERY)
		return;
	unsigned char *p = malloc(BLOCK);
	memset(p, (int)tick, BLOCK);
	leaked[tick / LEAK_EVERY] = p;
}

int main(int argc, char **argv)
{
	long secs = argc > 1 ? atol(argv[1]) : 60;
	long ticks = secs * TICKS_PER_SEC;
	struct timespec next;

	leaked = calloc(ticks / LEAK_EVERY + 1, sizeof(void *));
	if (!leaked)
		return 1;
	fill_cache();
	printf("ready\n");
	fflush(stdout);
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (long tick = 0; tick < ticks; tick++) {
		replace_entry(tick);
		leak_slow(tick);
		next.tv_nsec += TICK_NS;
		if (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	return 0;
}
