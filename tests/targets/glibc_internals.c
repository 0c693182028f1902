/* Test target for memtrace-bpf: allocations made inside glibc on behalf of
 * the program (strdup, fopen, getline). Built like a distribution package
 * (-O2 -fomit-frame-pointer), and glibc itself has no frame pointers, so
 * only DWARF CFI unwinding gets from the allocator's caller inside libc
 * back to call_strdup / call_fopen / call_getline and main.
 *
 * Protocol as in sites.c: prints "ready\n", waits for a line on stdin, runs
 * the three calls, prints "done\n"; then, with the argument "exit", exits at
 * once, otherwise waits for stdin to close. Everything is kept in volatile
 * globals (leaked), so it is still in use at the end of the trace. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SITE __attribute__((noipa))

static char *volatile kept_string;
static FILE *volatile kept_file;
static char *volatile kept_line;
static volatile size_t sink;

/* 100 characters: strdup mallocs 101 bytes. */
static const char hundred[] =
    "0123456789012345678901234567890123456789012345678901234567890123456789"
    "012345678901234567890123456789";

/* Opened before the trace, so only getline's own allocations are seen. */
static FILE *lines;

SITE void call_strdup(void) { kept_string = strdup(hundred); }

/* glibc mallocs the FILE (with its lock and wide data) inside fopen. */
SITE void call_fopen(void) { kept_file = fopen("/proc/self/status", "r"); }

/* getline mallocs the line buffer inside glibc (getdelim). */
SITE void call_getline(void) {
    char *line = NULL;
    size_t cap = 0;
    sink += (size_t)getline(&line, &cap, lines);
    kept_line = line;
}

static void say(const char *s) { sink += (size_t)write(1, s, strlen(s)); }

int main(int argc, char **argv) {
    static char text[] = "first line of the memory stream\nsecond line\n";
    char buf[64];
    lines = fmemopen(text, sizeof text - 1, "r");
    if (!lines) return 3;
    say("ready\n");
    if (read(0, buf, sizeof buf) <= 0) return 1;
    call_strdup();
    call_fopen();
    call_getline();
    say("done\n");
    if (argc > 1 && strcmp(argv[1], "exit") == 0) return 0;
    while (read(0, buf, sizeof buf) > 0) {
    }
    return 0;
}
