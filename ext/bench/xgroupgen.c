/* xgroupgen.c - consumers for the message queue's read side (see xgroupgen.h).
 * Threads: each worker owns its connections and buffers; results merge after join.
 * Replies come from the network: every length is bounded by what was received and
 * by MAX_REPLY, and nesting by the shape XREADGROUP answers with. */
#define _GNU_SOURCE
#include "bench/xgroupgen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/lathist.h"

#define MAX_REPLY (64u << 20) /* a read of COUNT entries, and their fields */
#define MAX_ID 48

struct xconn {
    int fd, done;
    char key[17], name[16];
    char *ids;                /* the last batch's IDs, MAX_ID bytes each, to acknowledge */
    int nids;
    char *rbuf;
    size_t rcap, rlen;
    uint64_t t;               /* when this round's requests went out */
    int busy, acks, reading;  /* a round in flight; it holds an XACK; it holds a read */
};

struct xworker {
    const struct xg_config *cfg;
    struct xconn *c;
    int n;
    pthread_t th;
    uint64_t deadline;
    _Atomic uint64_t *total;  /* messages read by every worker (max_messages) */
    uint64_t messages, reads, empty, acked, errors, first, last;
    uint64_t hist[HIST_LEN];
    char first_error[128], error[256];
    int fail;
    char *obuf;
    size_t ocap;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((format(printf, 2, 3))) static int fail(struct xworker *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
    return w->fail = -EPROTO;
}

static void note_error(struct xworker *w, const char *p, size_t n)
{
    w->errors++;
    if (!w->first_error[0])
        snprintf(w->first_error, sizeof w->first_error, "%.*s", (int)(n > 100 ? 100 : n), p);
}

/* A line ending at CRLF within p[0..n): its length, or -1 when incomplete. */
static long line(const char *p, size_t n)
{
    const char *e = memmem(p, n, "\r\n", 2);
    return e ? e - p : -1;
}

static int num(const char *p, long len, long long *out)
{
    char b[24];
    if (len < 1 || len > 20)
        return -1;
    memcpy(b, p, (size_t)len);
    b[len] = 0;
    char *e;
    *out = strtoll(b, &e, 10);
    return *e ? -1 : 0;
}

/* Parse one RESP value at p[0..n). Returns its length, 0 if incomplete, -1 malformed.
 * path[d]: the index of the value at depth d within its parent; an entry's ID is the
 * bulk at depth 4 with index 0 whose grandparent is the stream's entry list (index 1
 * at depth 2): it is copied to c->ids. */
static long value(struct xconn *c, const char *p, size_t n, int depth, int path[6])
{
    if (!n)
        return 0;
    long l = line(p + 1, n - 1);
    if (l < 0)
        return n > 64 * 1024 ? -1 : 0;
    long long v;
    size_t head = (size_t)l + 3;
    switch (p[0]) {
    case '+':
    case '-':
    case ':':
        return (long)head;
    case '$':
        if (num(p + 1, l, &v) || v < -1 || v > (long long)MAX_REPLY)
            return -1;
        if (v < 0)
            return (long)head;
        if (n < head + (size_t)v + 2)
            return 0;
        if (depth == 4 && path[4] == 0 && path[2] == 1) {
            if (v >= MAX_ID)
                return -1;
            memcpy(c->ids + (size_t)c->nids * MAX_ID, p + head, (size_t)v);
            c->ids[(size_t)c->nids * MAX_ID + (size_t)v] = 0;
            c->nids++;
        }
        return (long)(head + (size_t)v + 2);
    case '*': {
        if (num(p + 1, l, &v) || v < -1 || v > 1000000 || depth >= 5)
            return -1;
        size_t at = head;
        for (long long i = 0; i < v; i++) {
            path[depth + 1] = (int)i;
            long k = value(c, p + at, n - at, depth + 1, path);
            if (k <= 0)
                return k;
            at += (size_t)k;
        }
        return (long)at;
    }
    }
    return -1;
}

static int append(struct xworker *w, size_t *len, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(w->obuf + *len, w->ocap - *len, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < w->ocap - *len) {
            *len += (size_t)k;
            return 0;
        }
        char *nb = realloc(w->obuf, w->ocap * 2);
        if (!nb)
            return -ENOMEM;
        w->obuf = nb, w->ocap *= 2;
    }
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* The round's requests of c: the XACK of its last batch (if any) and the next read. */
static int send_round(struct xworker *w, struct xconn *c, int read)
{
    const struct xg_config *cfg = w->cfg;
    size_t len = 0, gl = strlen(cfg->group);
    int acks = cfg->ack && c->nids;
    if (acks) {
        append(w, &len, "*%d\r\n$4\r\nXACK\r\n$16\r\n%s\r\n$%zu\r\n%s\r\n", 3 + c->nids, c->key, gl, cfg->group);
        for (int i = 0; i < c->nids; i++) {
            const char *id = c->ids + (size_t)i * MAX_ID;
            append(w, &len, "$%zu\r\n%s\r\n", strlen(id), id);
        }
    }
    if (read) {
        char cnt[16];
        int cl = snprintf(cnt, sizeof cnt, "%d", cfg->count);
        append(w, &len, "*9\r\n$10\r\nXREADGROUP\r\n$5\r\nGROUP\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n$5\r\nCOUNT\r\n"
                        "$%d\r\n%s\r\n$7\r\nSTREAMS\r\n$16\r\n%s\r\n$1\r\n>\r\n",
               gl, cfg->group, strlen(c->name), c->name, cl, cnt, c->key);
    }
    c->t = now_ns();
    if (!w->first)
        w->first = c->t;
    return len ? send_all(c->fd, w->obuf, len) : 0;
}

/* Read until the n replies of c's round are in; the read's IDs go to c->ids. */
static int read_round(struct xworker *w, struct xconn *c, int acks, int read)
{
    int want = acks + read, got = 0;
    size_t at = 0;
    while (got < want) {
        int path[6] = {0};
        long k = 0;
        if (at < c->rlen) {
            if (got == 0 && acks) { /* the XACK's integer */
                long l = line(c->rbuf + at, c->rlen - at);
                if (l >= 0) {
                    const char *p = c->rbuf + at;
                    if (p[0] == '-')
                        note_error(w, p + 1, (size_t)l - 1);
                    else if (p[0] == ':')
                        w->acked += (uint64_t)strtoull(p + 1, NULL, 10);
                    else
                        return fail(w, "XACK: unexpected reply '%.*s'", (int)(l > 60 ? 60 : l), p);
                    k = l + 2;
                }
            } else {
                c->nids = 0;
                k = value(c, c->rbuf + at, c->rlen - at, 0, path);
                if (k < 0)
                    return fail(w, "XREADGROUP: malformed reply");
                if (k > 0) {
                    const char *p = c->rbuf + at;
                    w->reads++;
                    if (p[0] == '-') {
                        note_error(w, p + 1, (size_t)k - 3);
                        c->done = 1;
                    } else if (p[0] == '*' && p[1] == '-') { /* nil: nothing new */
                        w->empty++;
                        c->done = 1;
                    } else if (p[0] != '*') {
                        return fail(w, "XREADGROUP: unexpected reply '%.*s'", (int)(k > 60 ? 60 : k), p);
                    }
                    w->messages += (uint64_t)c->nids;
                    atomic_fetch_add_explicit(w->total, (uint64_t)c->nids, memory_order_relaxed);
                }
            }
        }
        if (k > 0) {
            at += (size_t)k;
            got++;
            continue;
        }
        if (c->rlen == c->rcap) {
            if (c->rcap >= MAX_REPLY)
                return fail(w, "a reply over %u bytes", MAX_REPLY);
            char *nb = realloc(c->rbuf, c->rcap * 2);
            if (!nb)
                return fail(w, "out of memory");
            c->rbuf = nb, c->rcap *= 2;
        }
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        if (r <= 0)
            return fail(w, "connection to the server lost: %s", r ? strerror(errno) : "closed");
        c->rlen += (size_t)r;
    }
    memmove(c->rbuf, c->rbuf + at, c->rlen - at);
    c->rlen -= at;
    if (!read)
        c->nids = 0; /* acknowledged, nothing new read */
    uint64_t t = now_ns();
    w->hist[hist_index(t - c->t)]++;
    w->last = t;
    return 0;
}

/* Send c's next round (an XACK of its last batch, if any, and a read unless the
 * load is stopping), or mark it done when there is nothing to send. */
static int next_round(struct xworker *w, struct xconn *c)
{
    const struct xg_config *cfg = w->cfg;
    int stopping = (cfg->stop && *cfg->stop) || (w->deadline && now_ns() >= w->deadline) ||
                   (cfg->max_messages && atomic_load_explicit(w->total, memory_order_relaxed) >= cfg->max_messages);
    c->acks = cfg->ack && c->nids > 0;
    c->reading = !stopping;
    if (!c->acks && !c->reading) {
        c->done = 1;
        return 0;
    }
    if (send_round(w, c, c->reading) < 0)
        return fail(w, "send: %s", strerror(errno));
    c->busy = 1;
    return 0;
}

/* Every consumer keeps one round in flight: the worker waits for whichever reply
 * comes first (poll), reads that round and sends the consumer's next. */
static void *worker_main(void *arg)
{
    struct xworker *w = arg;
    const struct xg_config *cfg = w->cfg;
    struct pollfd *pf = calloc((size_t)w->n, sizeof *pf); /* pf[i]: connection i, fd -1 while idle */
    if (!pf)
        fail(w, "out of memory");
    for (int i = 0; i < w->n && !w->fail; i++)
        next_round(w, &w->c[i]);
    while (!w->fail) {
        int busy = 0;
        for (int i = 0; i < w->n; i++) {
            pf[i] = (struct pollfd){.fd = w->c[i].busy ? w->c[i].fd : -1, .events = POLLIN};
            busy += w->c[i].busy;
        }
        if (!busy)
            break;
        int k = poll(pf, (nfds_t)w->n, -1);
        if (k < 0 && errno != EINTR) {
            fail(w, "poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < w->n && k > 0 && !w->fail; i++) {
            if (!pf[i].revents)
                continue;
            struct xconn *c = &w->c[i];
            c->busy = 0;
            if (read_round(w, c, c->acks, c->reading) < 0)
                break;
            if (!c->reading)
                c->done = 1; /* the stopping round: its last batch acknowledged */
            else if (!c->done)
                next_round(w, c);
        }
    }
    free(pf);
    for (int i = 0; i < w->n && !w->fail; i++) { /* a consumer that found nothing left: its last XACK */
        struct xconn *c = &w->c[i];
        if (cfg->ack && c->nids && send_round(w, c, 0) == 0)
            read_round(w, c, 1, 0);
    }
    return NULL;
}

static int connect_to(const struct xg_config *cfg, struct xconn *c, char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port)};
    inet_pton(AF_INET, cfg->host, &sa.sin_addr);
    int one = 1;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa)) {
        snprintf(err, errlen, "connect to %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        return -errno;
    }
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (cfg->password) {
        char buf[600];
        int n = snprintf(buf, sizeof buf, "*2\r\n$4\r\nAUTH\r\n$%zu\r\n%s\r\n", strlen(cfg->password), cfg->password);
        char r[256];
        ssize_t k = n > 0 && n < (int)sizeof buf && send_all(c->fd, buf, (size_t)n) == 0 ? recv(c->fd, r, sizeof r, 0) : -1;
        if (k < 5 || memcmp(r, "+OK\r\n", 5)) {
            snprintf(err, errlen, "AUTH on %s:%d failed", cfg->host, cfg->port);
            return -EACCES;
        }
    }
    return 0;
}

#define BAD(...) return snprintf(out->error, sizeof out->error, __VA_ARGS__), -EINVAL

int xg_run(const struct xg_config *cfg, struct xg_result *out)
{
    memset(out, 0, sizeof *out);
    struct in_addr a;
    if (!cfg->host || inet_pton(AF_INET, cfg->host, &a) != 1)
        BAD("host: expected an IPv4 address, got '%s'", cfg->host ? cfg->host : "");
    if (cfg->port < 1 || cfg->port > 65535) BAD("port: expected 1..65535, got %d", cfg->port);
    if (cfg->threads < 1 || cfg->threads > 256) BAD("threads: expected 1..256, got %d", cfg->threads);
    if (cfg->conns < cfg->threads || cfg->conns > 10000)
        BAD("conns (consumers): expected %d..10000, got %d", cfg->threads, cfg->conns);
    if (cfg->streams < 1 || cfg->streams > 1000000000000ull) BAD("streams: expected 1..10^12");
    if (!cfg->group || !*cfg->group || strlen(cfg->group) > 200) BAD("group: expected a name of 1..200 bytes");
    if (cfg->count < 1 || cfg->count > 100000) BAD("count: expected 1..100000, got %d", cfg->count);
    if (!(cfg->duration >= 0)) BAD("duration: expected >= 0 seconds");
    int nt = cfg->threads, rc = 0, started = 0;
    struct xworker *ws = calloc((size_t)nt, sizeof *ws);
    _Atomic uint64_t total = 0;
    if (!ws) BAD("out of memory");
    uint64_t t0 = now_ns();
    for (int t = 0, next = 0; t < nt && !rc; t++) {
        struct xworker *w = &ws[t];
        w->cfg = cfg;
        w->total = &total;
        w->n = cfg->conns / nt + (t < cfg->conns % nt);
        w->deadline = cfg->duration > 0 ? t0 + (uint64_t)(cfg->duration * 1e9) : 0;
        w->ocap = 4096;
        w->obuf = malloc(w->ocap);
        w->c = calloc((size_t)w->n, sizeof *w->c);
        if (!w->obuf || !w->c) {
            rc = -ENOMEM;
            snprintf(out->error, sizeof out->error, "out of memory");
            break;
        }
        for (int i = 0; i < w->n; i++)
            w->c[i].fd = -1;
        for (int i = 0; i < w->n && !rc; i++, next++) {
            struct xconn *c = &w->c[i];
            snprintf(c->key, sizeof c->key, "key:%012llu", (unsigned long long)((uint64_t)next % cfg->streams));
            snprintf(c->name, sizeof c->name, "c%d", next);
            c->rcap = 64 * 1024;
            c->rbuf = malloc(c->rcap);
            c->ids = malloc((size_t)cfg->count * MAX_ID);
            if (!c->rbuf || !c->ids) {
                rc = -ENOMEM;
                snprintf(out->error, sizeof out->error, "out of memory");
                break;
            }
            rc = connect_to(cfg, c, out->error, sizeof out->error);
        }
    }
    pthread_t *th = rc ? NULL : calloc((size_t)nt, sizeof *th);
    for (int t = 0; th && t < nt; t++, started++)
        if (pthread_create(&ws[t].th, NULL, worker_main, &ws[t])) {
            rc = -EAGAIN;
            snprintf(out->error, sizeof out->error, "cannot start a thread");
            break;
        }
    for (int t = 0; t < started; t++)
        pthread_join(ws[t].th, NULL);
    free(th);
    uint64_t first = 0, last = 0, *hist = calloc(HIST_LEN, sizeof *hist), rounds = 0;
    for (int t = 0; t < nt; t++) {
        struct xworker *w = &ws[t];
        out->messages += w->messages, out->reads += w->reads, out->empty_reads += w->empty;
        out->acked += w->acked, out->errors += w->errors;
        if (w->first && (!first || w->first < first)) first = w->first;
        if (w->last > last) last = w->last;
        if (!out->first_error[0] && w->first_error[0])
            memcpy(out->first_error, w->first_error, sizeof out->first_error);
        if (!rc && w->fail) {
            rc = w->fail;
            snprintf(out->error, sizeof out->error, "%s", w->error);
        }
        for (unsigned i = 0; hist && i < HIST_LEN; i++) {
            hist[i] += w->hist[i];
            rounds += w->hist[i];
        }
        for (int i = 0; w->c && i < w->n; i++) {
            if (w->c[i].fd >= 0)
                close(w->c[i].fd);
            free(w->c[i].rbuf);
            free(w->c[i].ids);
        }
        free(w->c);
        free(w->obuf);
    }
    out->elapsed = last > first ? (double)(last - first) / 1e9 : 0;
    out->throughput = out->elapsed > 0 ? (double)out->messages / out->elapsed : 0;
    if (rounds && hist) {
        uint64_t clamp = 100ull * 1000000000ull; /* the histogram's own top: 100 s */
        out->lat_p50_us = percentile(hist, rounds, 0.50, clamp);
        out->lat_p99_us = percentile(hist, rounds, 0.99, clamp);
    }
    free(hist);
    free(ws);
    return rc;
}
