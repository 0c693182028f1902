/* Builds up a live set: on "go", N blocks of 24 bytes (argv[1], default
 * 1000000) allocated as fast as it can and all kept; prints "done", then
 * waits for end of input. For the reader-never-stalls test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	void *volatile *keep = calloc(n, sizeof(void *));
	char line[64];

	printf("ready\n");
	fflush(stdout);
	if (!keep || !fgets(line, sizeof line, stdin))
		return 1;
	for (long i = 0; i < n; i++) {
		void *p = malloc(24);
		memset(p, (int)i, 24);
		keep[i] = p;
	}
	printf("done\n");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin))
		;
	return 0;
}
