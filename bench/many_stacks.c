/* COUNT allocations, each from a distinct call stack of LEVELS + 5
 * frames: _start, __libc_start_main_impl, __libc_start_call_main, main,
 * LEVELS calls through a(), b() or c() chosen by the base-3 digits of the
 * allocation's index, and leaf(). The choice is written out in each
 * function (a macro, not an inlined function) so that symbolized stacks
 * have exactly these frames. For measuring the report's time and the
 * tracer's memory on many distinct stacks (cargo xtask bench-report).
 * Blocks are kept live.
 * Usage: many_stacks [LEVELS [COUNT]] (default 12 and 100000: the 17-frame
 * case of issue #21; COUNT at most 3^LEVELS); prints "ready", allocates on
 * a line from stdin, prints "done COUNT", then waits for end of input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile *keep;
static volatile unsigned long sink;

__attribute__((noinline)) static void a(int d, unsigned digits, unsigned idx);
__attribute__((noinline)) static void b(int d, unsigned digits, unsigned idx);
__attribute__((noinline)) static void c(int d, unsigned digits, unsigned idx);

__attribute__((noinline)) static void leaf(unsigned idx)
{
	void *p = malloc(32);
	memset(p, 1, 32);
	keep[idx] = p;
}

#define STEP(d, digits, idx)                                                   \
	do {                                                                   \
		if ((d) == 0)                                                  \
			leaf(idx);                                             \
		else if ((digits) % 3 == 0)                                    \
			a((d) - 1, (digits) / 3, idx);                         \
		else if ((digits) % 3 == 1)                                    \
			b((d) - 1, (digits) / 3, idx);                         \
		else                                                           \
			c((d) - 1, (digits) / 3, idx);                         \
	} while (0)

/* The work after each call keeps it from becoming a tail call. */
__attribute__((noinline)) static void a(int d, unsigned digits, unsigned idx)
{
	STEP(d, digits, idx);
	sink++;
}

__attribute__((noinline)) static void b(int d, unsigned digits, unsigned idx)
{
	STEP(d, digits, idx);
	sink += 2;
}

__attribute__((noinline)) static void c(int d, unsigned digits, unsigned idx)
{
	STEP(d, digits, idx);
	sink += 3;
}

int main(int argc, char **argv)
{
	int levels = argc > 1 ? atoi(argv[1]) : 12;
	unsigned long n = argc > 2 ? strtoul(argv[2], NULL, 10) : 100000;
	unsigned long most = 1;
	char line[64];

	for (int i = 0; i < levels && most <= n; i++)
		most *= 3;
	if (levels < 1 || levels > 20 || n < 1 || n > most) {
		fprintf(stderr, "usage: many_stacks [LEVELS (1-20) [COUNT (at most 3^LEVELS)]]\n");
		return 2;
	}
	keep = calloc(n, sizeof(void *));
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		return 1;
	for (unsigned i = 0; i < n; i++)
		STEP(levels, i, i);
	printf("done %lu\n", n);
	fflush(stdout);
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
