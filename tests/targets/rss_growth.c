/* Memory that grows at a known pace, by the program's own clock:
 *   rss_growth mmap SECS    every 100 ms maps 2 MiB of anonymous memory
 *                           with mmap (not malloc) and writes every page;
 *   rss_growth malloc SECS [MIB]
 *                           every 100 ms keeps MIB (default 1) 1 MiB blocks
 *                           from malloc, written in full.
 * Both also allocate, use and free a small block every tick
 * (churn_block), so that the allocator is called either way. Prints
 * "ready" once started; runs SECS seconds (default 60), or until killed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define TICK_NS 100000000L
#define MAP_BYTES (2L << 20)
#define LEAK_BYTES (1L << 20)

static volatile unsigned char sink;

__attribute__((noinline)) static void map_more(long tick)
{
	unsigned char *p = mmap(NULL, MAP_BYTES, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memset(p, (int)tick | 1, MAP_BYTES);
	sink = p[tick % MAP_BYTES];
}

__attribute__((noinline)) static void leak_block(long tick)
{
	unsigned char *p = malloc(LEAK_BYTES);
	memset(p, (int)tick | 1, LEAK_BYTES);
	sink = p[tick % LEAK_BYTES];
}

__attribute__((noinline)) static void churn_block(long tick)
{
	unsigned char *p = malloc(64);
	memset(p, (int)tick, 64);
	sink = p[tick % 64];
	free(p);
}

int main(int argc, char **argv)
{
	if (argc < 2 || (strcmp(argv[1], "mmap") && strcmp(argv[1], "malloc"))) {
		fprintf(stderr, "usage: rss_growth mmap|malloc [SECS]\n");
		return 2;
	}
	int mapping = !strcmp(argv[1], "mmap");
	long secs = argc > 2 ? atol(argv[2]) : 60;
	long per_tick = argc > 3 ? atol(argv[3]) : 1;
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	printf("ready\n");
	fflush(stdout);
	for (long tick = 0; tick < secs * 10; tick++) {
		if (mapping)
			map_more(tick);
		else
			for (long i = 0; i < per_tick; i++)
				leak_block(tick);
		churn_block(tick);
		next.tv_nsec += TICK_NS;
		if (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
	}
	return 0;
}
