/* A small HTTP/1.1 server shaped like actix-web's: one thread accepts
 * connections and hands each to one of WORKERS worker threads, which serve
 * them from their own epoll loop, keep-alive or not. Every request
 * allocates and frees a few blocks (a list of strings, a growing buffer)
 * from the glibc allocator, as a Rust handler's Vec and String do.
 *
 * Prints "ready" and then "port PORT" once it listens on 127.0.0.1 (an
 * ephemeral port).
 * GET /r/N answers "N LEN\n", LEN the bytes the handler put together.
 * Runs until killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define WORKERS 4
#define MAX_REQUEST 4096

struct conn {
    int fd;
    size_t len;
    char buf[MAX_REQUEST];
};

struct worker {
    int epoll;
    pthread_t thread;
};

static struct worker workers[WORKERS];

/* What a handler allocates for request n: n % 16 + 4 strings of up to
 * 500 bytes, then one buffer that grows by realloc to hold them all. */
static size_t handle(unsigned long n)
{
    size_t count = n % 16 + 4;
    char **parts = calloc(count, sizeof *parts);
    if (!parts)
        return 0;
    size_t cap = 64, len = 0;
    char *all = malloc(cap);
    for (size_t i = 0; i < count && all; i++) {
        size_t pad = (i * 37) % 500;
        parts[i] = malloc(pad + 32);
        if (!parts[i])
            break;
        int w = snprintf(parts[i], 32, "item-%zu-", i);
        memset(parts[i] + w, 'x', pad);
        size_t plen = (size_t)w + pad;
        while (len + plen > cap) {
            char *grown = realloc(all, cap * 2);
            if (!grown)
                break;
            all = grown;
            cap *= 2;
        }
        if (len + plen <= cap) {
            memcpy(all + len, parts[i], plen);
            len += plen;
        }
    }
    for (size_t i = 0; i < count; i++)
        free(parts[i]);
    free(parts);
    free(all);
    return len;
}

static void close_conn(struct worker *w, struct conn *c)
{
    epoll_ctl(w->epoll, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Serves every complete request in the buffer; 0 to keep the connection. */
static int serve(struct conn *c)
{
    char *end;
    while ((end = memmem(c->buf, c->len, "\r\n\r\n", 4)) != NULL) {
        size_t used = (size_t)(end - c->buf) + 4;
        unsigned long n = 0;
        if (strncmp(c->buf, "GET /r/", 7) == 0)
            n = strtoul(c->buf + 7, NULL, 10);
        int keep = memmem(c->buf, used, "Connection: close", 17) == NULL;
        char *body = NULL;
        int blen = asprintf(&body, "%lu %zu\n", n, handle(n));
        if (blen < 0)
            return -1;
        char head[160];
        int hlen = snprintf(head, sizeof head,
                            "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n",
                            blen, keep ? "" : "Connection: close\r\n");
        int failed = write_all(c->fd, head, (size_t)hlen) ||
                     write_all(c->fd, body, (size_t)blen);
        free(body);
        if (failed || !keep)
            return -1;
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
    }
    return c->len == sizeof c->buf ? -1 : 0;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(w->epoll, events, 64, -1);
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            ssize_t k = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
            if (k < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (k <= 0) {
                close_conn(w, c);
                continue;
            }
            c->len += (size_t)k;
            if (serve(c))
                close_conn(w, c);
        }
    }
    return NULL;
}

int main(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof addr;
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 1024) ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen)) {
        perror("listen");
        return 1;
    }
    for (int i = 0; i < WORKERS; i++) {
        workers[i].epoll = epoll_create1(0);
        pthread_create(&workers[i].thread, NULL, work, &workers[i]);
    }
    printf("ready\nport %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (unsigned next = 0;; next++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
            continue;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = malloc(sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->len = 0;
        struct worker *w = &workers[next % WORKERS];
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(w->epoll, EPOLL_CTL_ADD, fd, &ev)) {
            close(fd);
            free(c);
        }
    }
}
