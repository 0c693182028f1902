/* Test target for memtrace-bpf: a malloc at the bottom of a deep recursion.
 * Each level of `recurse` keeps an 80-byte volatile buffer, so its frame is
 * about 96 bytes: 200 levels (the default depth) take about 19 KiB of stack,
 * more than the tracer copies (--stack-bytes, 8192 by default, 16384 at
 * most), while 40 levels take under 4 KiB and unwind completely.
 *
 * Usage: recurse [DEPTH [exit]]. Protocol as in sites.c: prints "ready\n",
 * waits for a line on stdin, recurses DEPTH levels and mallocs 777 bytes at
 * the bottom (leaked), prints "done\n"; then, with "exit", exits at once,
 * otherwise waits for stdin to close. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile kept;
static volatile size_t sink;

/* noipa: no inlining, cloning or tail-call rewriting of the recursion. */
__attribute__((noipa)) int recurse(int depth) {
    volatile char frame[80];
    for (int i = 0; i < (int)sizeof frame; i++) frame[i] = (char)(depth + i);
    if (depth <= 1) {
        kept = malloc(777);
        return frame[0];
    }
    /* Uses the buffer after the call: the recursion is not a tail call. */
    return recurse(depth - 1) + frame[depth % (int)sizeof frame];
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(int argc, char **argv) {
    char buf[64];
    int depth = argc > 1 ? atoi(argv[1]) : 200;
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    sink += (size_t)recurse(depth);
    say("done\n");
    if (argc > 2 && strcmp(argv[2], "exit") == 0) return 0;
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
