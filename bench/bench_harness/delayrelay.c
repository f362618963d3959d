/* delayproxy.py's link in C: TCP relays that add a one-way delay and cap the rate, at a
 * fraction of a core where the Python relay took a quarter of one at 1 Gbit/s (issue 47).
 *
 *     delayrelay DELAY_US RATE_BYTES_PER_S LISTEN_HOST:PORT=TARGET_HOST:PORT ...
 *
 * The same link as delayproxy.py's: each direction of each connection holds what it reads
 * DELAY_US and writes it in the order it came, no faster than RATE a direction (0: no cap);
 * a direction holding HELD_MAX bytes stops reading until it drains (a full TCP window).  It
 * prints "ready" once every pair listens, and runs until killed.  One thread: epoll, and a
 * timerfd armed at the next chunk due (epoll's own timeout is whole milliseconds).
 * bench_harness/relays.py compiles it (cc -O2) and falls back to delayproxy.py without cc. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64 * 1024)
#define HELD_MAX (8 * 1024 * 1024)
#define MAX_PAIRS 64

typedef struct Chunk {
    struct Chunk *next;
    int64_t due;  /* ns, monotonic: when it may go */
    size_t len, off;
    char data[];
} Chunk;

typedef struct Conn Conn;
typedef struct {
    int from, to;      /* read from, write to */
    Chunk *head, *tail;
    size_t held;
    int64_t last_due;  /* a chunk never goes before the one ahead of it */
    int64_t free_at;   /* the rate cap: when the link has sent what it was given */
    int eof, shut;     /* read its end; passed it on */
    int blocked;       /* the last write pushed back: wait for room (EPOLLOUT) */
    Conn *conn;
} Dir;

struct Conn {
    int fds[2];        /* the accepted side, the target side */
    Dir dirs[2];       /* 0: accepted -> target, 1: target -> accepted */
    int connecting, closed;
    uint32_t watched[2];  /* what each side's fd waits on now: epoll_ctl only when it changes */
};

typedef struct { int kind; Conn *conn; int side; int fd; int target; } Tag;  /* kind 0 listener, 1 conn side, 2 timer */

static int64_t delay_ns;
static double rate;  /* bytes a second, 0: none */
static int ep, tfd;
static struct sockaddr_in targets[MAX_PAIRS];

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void die(const char *what) { perror(what); exit(1); }

static int parse_addr(const char *text, struct sockaddr_in *out) {
    char host[64];
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof host) return -1;
    memcpy(host, text, colon - text);
    host[colon - text] = 0;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)atoi(colon + 1));
    return inet_pton(AF_INET, host, &out->sin_addr) == 1 ? 0 : -1;
}

static void watch(int fd, uint32_t events, Tag *tag, int op) {
    struct epoll_event ev = {.events = events, .data.ptr = tag};
    if (epoll_ctl(ep, op, fd, &ev) < 0 && op != EPOLL_CTL_DEL) die("epoll_ctl");
}

/* what a side's fd waits on: reading while its direction may hold more, writing while
 * the other direction has bytes due and the socket pushed back */
static Tag *tags_of(Conn *c, int side);
static void rewatch(Conn *c, int side) {
    if (c->closed) return;
    uint32_t ev = 0;
    Dir *in = &c->dirs[side], *out = &c->dirs[1 - side];
    if (c->connecting && side == 1) ev |= EPOLLOUT;
    else {
        if (!in->eof && in->held < HELD_MAX && !c->connecting) ev |= EPOLLIN;
        if (out->head && out->blocked) ev |= EPOLLOUT;  /* a write that pushed back */
    }
    if (ev == c->watched[side]) return;  /* a syscall a wake-up saved: most wake-ups change nothing */
    c->watched[side] = ev;
    struct epoll_event e = {.events = ev, .data.ptr = tags_of(c, side)};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fds[side], &e);
}

static Tag *tags_of(Conn *c, int side) { return (Tag *)((char *)c + sizeof(Conn)) + side; }

static void close_conn(Conn *c) {
    if (c->closed) return;
    c->closed = 1;
    for (int s = 0; s < 2; s++) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fds[s], NULL);
        close(c->fds[s]);
        for (Chunk *k = c->dirs[s].head; k;) { Chunk *n = k->next; free(k); k = n; }
        c->dirs[s].head = c->dirs[s].tail = NULL;
    }
    /* the Conn is leaked on purpose: a tag may still be in this round's epoll events */
}

static int64_t next_due = INT64_MAX;

/* write what is due of one direction; returns the time it waits for next (INT64_MAX: none) */
static int64_t flush_dir(Dir *d) {
    Conn *c = d->conn;
    while (d->head && !c->closed && !c->connecting) {
        Chunk *k = d->head;
        int64_t t = now_ns(), start = k->due > d->free_at ? k->due : d->free_at;
        if (k->off == 0 && start > t) return start;
        if (start < t && d->free_at <= k->due) start = t;  /* the link was idle: its cap counts from now */
        ssize_t n = send(d->to, k->data + k->off, k->len - k->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                d->blocked = 1;  /* EPOLLOUT wakes it */
                return INT64_MAX;
            }
            close_conn(c);
            return INT64_MAX;
        }
        d->blocked = 0;
        if (k->off == 0 && rate > 0) d->free_at = start + (int64_t)(k->len * 1e9 / rate);
        k->off += (size_t)n;
        if (k->off < k->len) {
            d->blocked = 1;  /* a short write: the socket is full */
            return INT64_MAX;
        }
        d->head = k->next;
        if (!d->head) d->tail = NULL;
        d->held -= k->len;
        free(k);
    }
    if (!d->head && d->eof && !d->shut && !c->closed) {
        d->shut = 1;
        shutdown(d->to, SHUT_WR);
        if (c->dirs[0].shut && c->dirs[1].shut) close_conn(c);
    }
    return INT64_MAX;
}

static void read_dir(Dir *d) {
    static char buf[CHUNK];
    Conn *c = d->conn;
    while (d->held < HELD_MAX && !d->eof && !c->closed) {
        ssize_t n = recv(d->from, buf, CHUNK, 0);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n < 0) { close_conn(c); return; }
            d->eof = 1;
            return;
        }
        Chunk *k = malloc(sizeof(Chunk) + (size_t)n);  /* its own size: a few bytes read hold a few */
        if (!k) die("malloc");
        memcpy(k->data, buf, (size_t)n);
        int64_t due = delay_ns ? now_ns() + delay_ns : 0;
        if (due < d->last_due) due = d->last_due;
        d->last_due = due;
        k->due = due; k->len = (size_t)n; k->off = 0; k->next = NULL;
        if (d->tail) d->tail->next = k; else d->head = k;
        d->tail = k;
        d->held += (size_t)n;
    }
}

static void arm(int64_t due) {
    if (due >= next_due && next_due > now_ns()) return;
    next_due = due;
    struct itimerspec it = {0};
    if (due != INT64_MAX) {
        if (due <= 0) due = 1;
        it.it_value.tv_sec = due / 1000000000;
        it.it_value.tv_nsec = due % 1000000000;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &it, NULL);
}

/* every connection, to flush on the timer: a small relay has a few */
static Conn **conns;
static size_t n_conns, cap_conns;

static void service(Conn *c) {
    for (int s = 0; s < 2; s++) {
        int64_t w = flush_dir(&c->dirs[s]);
        if (w != INT64_MAX) arm(w);
    }
    rewatch(c, 0);
    rewatch(c, 1);
}

static void accept_one(int lfd, int pair) {
    int a = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
    if (a < 0) return;
    int b = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn *c = calloc(1, sizeof(Conn) + 2 * sizeof(Tag));
    if (!c) die("calloc");
    c->fds[0] = a; c->fds[1] = b;
    for (int s = 0; s < 2; s++) {
        Dir *d = &c->dirs[s];
        d->from = c->fds[s]; d->to = c->fds[1 - s]; d->conn = c;
        Tag *t = tags_of(c, s);
        t->kind = 1; t->conn = c; t->side = s;
    }
    int r = connect(b, (struct sockaddr *)&targets[pair], sizeof targets[pair]);
    if (r < 0 && errno != EINPROGRESS) { close(a); close(b); free(c); return; }
    c->connecting = 1;
    watch(a, 0, tags_of(c, 0), EPOLL_CTL_ADD);
    watch(b, EPOLLOUT, tags_of(c, 1), EPOLL_CTL_ADD);
    c->watched[0] = 0; c->watched[1] = EPOLLOUT;
    if (n_conns == cap_conns) {
        cap_conns = cap_conns ? 2 * cap_conns : 16;
        conns = realloc(conns, cap_conns * sizeof *conns);
    }
    conns[n_conns++] = c;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: delayrelay DELAY_US RATE_BYTES_PER_S LISTEN=TARGET ...\n");
        return 2;
    }
    delay_ns = (int64_t)(atof(argv[1]) * 1000);
    rate = atof(argv[2]);
    if ((ep = epoll_create1(0)) < 0) die("epoll_create1");
    if ((tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK)) < 0) die("timerfd_create");
    static Tag timer_tag = {.kind = 2};
    watch(tfd, EPOLLIN, &timer_tag, EPOLL_CTL_ADD);
    static Tag listeners[MAX_PAIRS];
    for (int i = 3; i < argc && i - 3 < MAX_PAIRS; i++) {
        char *eq = strchr(argv[i], '=');
        struct sockaddr_in listen_at;
        if (!eq) { fprintf(stderr, "not LISTEN=TARGET: %s\n", argv[i]); return 2; }
        *eq = 0;
        if (parse_addr(argv[i], &listen_at) || parse_addr(eq + 1, &targets[i - 3])) {
            fprintf(stderr, "not an IPv4 HOST:PORT pair: %s=%s\n", argv[i], eq + 1);
            return 2;
        }
        int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&listen_at, sizeof listen_at) < 0) die("bind");
        if (listen(l, 128) < 0) die("listen");
        listeners[i - 3] = (Tag){.kind = 0, .fd = l, .target = i - 3};
        watch(l, EPOLLIN, &listeners[i - 3], EPOLL_CTL_ADD);
    }
    printf("ready\n");
    fflush(stdout);
    struct epoll_event evs[64];
    for (;;) {
        int n = epoll_wait(ep, evs, 64, -1);
        if (n < 0) { if (errno == EINTR) continue; die("epoll_wait"); }
        for (int i = 0; i < n; i++) {
            Tag *t = evs[i].data.ptr;
            if (t->kind == 0) { accept_one(t->fd, t->target); continue; }
            if (t->kind == 2) {
                uint64_t ticks;
                if (read(tfd, &ticks, sizeof ticks) < 0 && errno != EAGAIN) die("timerfd read");
                next_due = INT64_MAX;
                size_t keep = 0;
                for (size_t j = 0; j < n_conns; j++) {
                    if (conns[j]->closed) continue;  /* leaked: tags of this round may name it */
                    service(conns[j]);
                    conns[keep++] = conns[j];
                }
                n_conns = keep;
                continue;
            }
            Conn *c = t->conn;
            if (c->closed) continue;
            if (c->connecting && t->side == 1) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(c->fds[1], SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) { close_conn(c); continue; }
                c->connecting = 0;
            }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_dir(&c->dirs[t->side]);
            if (!c->closed) service(c);
        }
    }
}
