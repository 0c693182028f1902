/* 2^LEVELS allocations, each from a distinct call stack: the path to the
 * allocation goes through a() or b() at each of LEVELS levels, chosen by
 * the bits of its index. For measuring the report's time and memory on
 * many distinct stacks (cargo xtask bench). Blocks are kept live.
 * Usage: many_stacks [LEVELS]; prints "ready", allocates on a line from
 * stdin, prints "done", then waits for end of input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile *keep;
static volatile unsigned long sink;

__attribute__((noinline)) static void a(int d, unsigned bits, unsigned idx);
__attribute__((noinline)) static void b(int d, unsigned bits, unsigned idx);

__attribute__((noinline)) static void leaf(unsigned idx)
{
	void *p = malloc(32);
	memset(p, 1, 32);
	keep[idx] = p;
}

static void step(int d, unsigned bits, unsigned idx)
{
	if (d == 0)
		leaf(idx);
	else if (bits & 1)
		a(d - 1, bits >> 1, idx);
	else
		b(d - 1, bits >> 1, idx);
}

/* The work after each call keeps it from becoming a tail call. */
__attribute__((noinline)) static void a(int d, unsigned bits, unsigned idx)
{
	step(d, bits, idx);
	sink++;
}

__attribute__((noinline)) static void b(int d, unsigned bits, unsigned idx)
{
	step(d, bits, idx);
	sink += 2;
}

int main(int argc, char **argv)
{
	int levels = argc > 1 ? atoi(argv[1]) : 17;
	unsigned n = 1u << levels;
	char line[64];

	keep = calloc(n, sizeof(void *));
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	for (unsigned i = 0; i < n; i++)
		step(levels, i, i);
	printf("done %u\n", n);
	fflush(stdout);
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
