/*
 * leaky: a small "service" that leaks at known places, for `cargo xtask demo`.
 *
 * Prints "ready pid=<pid>" once, then every ~100 ms runs one tick:
 *   handle_request  malloc 256 + malloc 2048 + calloc 16x8, all freed (no leak)
 *   cache_insert    malloc 4096, never freed (an unbounded cache)
 *   session_new     calloc 64 + strdup of 64 bytes; every 4th session is
 *                   never closed, so both blocks leak
 *   grow_log        realloc grows one buffer by 512 bytes, up to 1 MiB
 *   lookup_cache_put
 *                   malloc 2048 into a cache of at most 128 entries: once
 *                   full (after ~13 s) the oldest entry is freed for each
 *                   new one, so its memory rises, then stays flat
 * Runs until killed.
 *
 * Build: cc -O2 -g -fomit-frame-pointer -pthread -o leaky leaky.c
 * Every allocation is written to and its address published through a
 * volatile global, so the compiler cannot elide the calls.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* noipa: no inlining or cloning, so every function keeps its name at -O2. */
#define NOINLINE __attribute__((noipa))

#define CACHE_ENTRY_SIZE 4096
#define LOG_STEP 512
#define LOG_MAX (1 << 20)
#define LOOKUP_ENTRY_SIZE 2048
#define LOOKUP_ENTRIES 128

/* Publishing a pointer here makes every allocation observable. */
void *volatile sink;

struct cache_entry {
	struct cache_entry *next;
	unsigned long key;
};
static struct cache_entry *volatile cache_head;

struct session {
	unsigned long id;
	char *token;
	char user[48];
};
_Static_assert(sizeof(struct session) == 64, "session is 64 bytes");

/* A ring of the last LOOKUP_ENTRIES entries: bounded, unlike cache_head. */
static char *lookup_ring[LOOKUP_ENTRIES];

static char *log_buf;
static size_t log_len;

static void *xcheck(void *p)
{
	if (!p) {
		perror("leaky: out of memory");
		exit(1);
	}
	return p;
}

static NOINLINE void handle_request(unsigned long n)
{
	char *header = xcheck(malloc(256));
	char *body = xcheck(malloc(2048));
	long *fields = xcheck(calloc(16, sizeof(long)));

	snprintf(header, 256, "GET /item/%lu HTTP/1.1", n);
	memset(body, 'b', 2048);
	fields[n % 16] = (long)n;
	sink = header;
	sink = body;
	sink = fields;

	free(fields);
	free(body);
	free(header);
}

static NOINLINE void cache_insert(unsigned long key)
{
	struct cache_entry *e = xcheck(malloc(CACHE_ENTRY_SIZE));

	memset(e, 0, CACHE_ENTRY_SIZE);
	e->key = key;
	e->next = cache_head;
	cache_head = e; /* never evicted */
}

static NOINLINE struct session *session_new(unsigned long id)
{
	struct session *s = xcheck(calloc(1, sizeof(*s)));
	char token[64];

	/* 63 characters + NUL: strdup allocates exactly 64 bytes. */
	snprintf(token, sizeof(token), "%063lu", id);
	s->id = id;
	s->token = xcheck(strdup(token));
	snprintf(s->user, sizeof(s->user), "user-%lu", id % 100);
	sink = s;
	return s;
}

static NOINLINE void session_close(struct session *s)
{
	free(s->token);
	free(s);
}

static NOINLINE void grow_log(void)
{
	if (log_len + LOG_STEP > LOG_MAX) {
		free(log_buf);
		log_buf = NULL;
		log_len = 0;
	}
	log_buf = xcheck(realloc(log_buf, log_len + LOG_STEP));
	memset(log_buf + log_len, 'l', LOG_STEP);
	log_len += LOG_STEP;
	sink = log_buf;
}

static NOINLINE void lookup_cache_put(unsigned long key)
{
	char **slot = &lookup_ring[key % LOOKUP_ENTRIES];
	char *e = xcheck(malloc(LOOKUP_ENTRY_SIZE));

	memset(e, (int)(key & 0x7f), LOOKUP_ENTRY_SIZE);
	free(*slot); /* the oldest entry, once the ring is full */
	*slot = e;
	sink = e;
}

static NOINLINE void tick(unsigned long n)
{
	handle_request(n);
	cache_insert(n);

	struct session *s = session_new(n);
	if (n % 4 != 0)
		session_close(s);
	/* else: the session is forgotten and leaks */

	grow_log();
	lookup_cache_put(n);
}

int main(void)
{
	const struct timespec period = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };

	printf("ready pid=%d\n", (int)getpid());
	fflush(stdout);

	for (unsigned long n = 0;; n++) {
		tick(n);
		nanosleep(&period, NULL);
	}
}
