/* udpgen.c - UDP load generator (see udpgen.h; frame format in udpfront.h).
 * Threads: ug_run's caller waits; each worker thread owns its sockets, slots and
 * histogram; the only shared state is the request budget (atomic) and the result
 * merge after join. Reads replies from the network: lengths are checked before use. */
#define _GNU_SOURCE
#include "core/lathist.h"
#include "bench/udpgen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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

#define FRAME_HDR 8
#define F_REPLY 0x0001u
#define F_ERROR 0x0002u
#define F_XADD 0x0004u
#define F_PULL 0x0008u
#define MAX_DGRAM 9000 /* a request: KVU_MAX_REQUEST (a batch of messages) */
#define MAX_BATCH 1024
#define PULL_HDR 24
#define PULL_PADDED 1472 /* a pull's datagram, frame header included: one MTU, room for any answer */
#define MAX_VALUE 1400
#define MAX_WINDOW 4096
#define MMSG 64

enum { K_SET = 1, K_GET = 2, K_PULL = 3 };

struct slot { uint64_t t, key, no; uint32_t id; int kind; };

struct usock {
    int fd;
    struct slot *slots;  /* pipeline of them */
    int *free, nfree;    /* stack of free slot indices */
};

struct uworker {
    const struct lg_config *cfg;
    int idx, nsock, window, timeout_ms;
    struct usock *socks;
    uint64_t rng;
    uint16_t counter;
    _Atomic long long *budget; /* requests left to send when cfg->requests > 0 */
    uint64_t deadline_ns;
    uint64_t requests, sets, gets, hits, misses, errors, timeouts, bytes_sent, bytes_received;
    uint64_t lat_sum, lat_max, first_ns, last_ns;
    uint64_t *hist;
    char first_error[128];
    int fail;
    char error[256];
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t rnd(struct uworker *w)
{
    uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t below(struct uworker *w, uint64_t n) { return (uint64_t)(((unsigned __int128)rnd(w) * n) >> 64); }


static void note_error(struct uworker *w, const char *fmt, ...)
{
    w->errors++;
    if (w->first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first_error, sizeof w->first_error, fmt, ap);
    va_end(ap);
    for (char *p = w->first_error; *p; p++)
        if (*p == '\r' || *p == '\n') *p = ' ';
}

static inline char value_byte(uint64_t key, size_t i) { return (char)('a' + (key + i) % 26); }

/* Take up to n requests from the budget; returns how many may be sent. */
static int take(struct uworker *w, int n)
{
    if (!w->cfg->requests)
        return n;
    long long have = atomic_load_explicit(w->budget, memory_order_relaxed);
    while (have > 0) {
        long long t = have < n ? have : n;
        if (atomic_compare_exchange_weak_explicit(w->budget, &have, have - t, memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int)t;
    }
    return 0;
}

static void give_back(struct uworker *w, int n)
{
    if (w->cfg->requests && n)
        atomic_fetch_add_explicit(w->budget, n, memory_order_relaxed);
}

/* One request into buf (frame header + RESP); returns its length. */
static size_t build(struct uworker *w, struct slot *s, char *buf)
{
    const struct lg_config *c = w->cfg;
    uint32_t id = htonl(s->id);
    memcpy(buf, &id, 4);
    memset(buf + 4, 0, 4);
    char *p = buf + FRAME_HDR;
    int total = c->set_ratio + c->get_ratio;
    s->key = below(w, c->keyspace);
    if (c->pull_batches || (c->xadd && c->batch)) { /* the framed stream operations */
        unsigned char *q = (unsigned char *)p;
        char key[20];
        snprintf(key, sizeof key, "key:%012llu", (unsigned long long)s->key);
        *q++ = 0, *q++ = 16;
        memcpy(q, key, 16), q += 16;
        if (c->pull_batches) {
            s->kind = K_PULL;
            buf[7] = F_PULL;
            s->no = below(w, c->pull_batches);
            for (int i = 7; i >= 0; i--)
                *q++ = (unsigned char)(s->no >> (8 * i));
            size_t n = (size_t)((char *)q - buf);
            memset(q, 0, PULL_PADDED - n); /* room for the answer: the pull cache replies in place */
            return PULL_PADDED;
        }
        s->kind = K_SET;
        buf[7] = F_XADD;
        *q++ = 0, *q++ = 1, *q++ = 'v';
        *q++ = (unsigned char)(c->batch >> 8), *q++ = (unsigned char)c->batch;
        for (int m = 0; m < c->batch; m++) {
            *q++ = (unsigned char)(c->value_size >> 8), *q++ = (unsigned char)c->value_size;
            for (int i = 0; i < c->value_size; i++)
                q[i] = (unsigned char)value_byte(s->key + (uint64_t)m, (size_t)i);
            q += c->value_size;
        }
        return (size_t)((char *)q - buf);
    }
    s->kind = (int)below(w, (uint64_t)total) < c->set_ratio ? K_SET : K_GET;
    if (s->kind == K_GET)
        return FRAME_HDR + (size_t)sprintf(p, "*2\r\n$3\r\nGET\r\n$16\r\nkey:%012llu\r\n", (unsigned long long)s->key);
    int n = sprintf(p, "*3\r\n$3\r\nSET\r\n$16\r\nkey:%012llu\r\n$%d\r\n", (unsigned long long)s->key, c->value_size);
    for (int i = 0; i < c->value_size; i++)
        p[n + i] = value_byte(s->key, (size_t)i);
    memcpy(p + n + c->value_size, "\r\n", 2);
    return FRAME_HDR + (size_t)n + (size_t)c->value_size + 2;
}

static uint64_t be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* One LEB128 varint at *p (before end): 0, or -1 when cut short or too long. */
static int varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        unsigned char b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

/* A pull's answer (core/stream.h xs_pull_encode): the asked batch, its entries well formed. */
static int pull_ok(const struct slot *s, const unsigned char *p, size_t len)
{
    if (len < PULL_HDR || (p[0] != 0 && p[0] != 1) || be64(p + 8) != s->no)
        return 0;
    unsigned count = (unsigned)p[2] << 8 | p[3], n = 0;
    const unsigned char *q = p + PULL_HDR, *end = p + len;
    while (q < end) {
        uint64_t v, nf, fl;
        q++; /* flags */
        if (varint(&q, end, &v) || varint(&q, end, &v) || varint(&q, end, &nf) || !nf)
            return 0;
        for (uint64_t f = 0; f < 2 * nf; f++) {
            if (varint(&q, end, &fl) || fl > (uint64_t)(end - q))
                return 0;
            q += fl;
        }
        n++;
    }
    return n == count;
}

static void check_reply(struct uworker *w, struct slot *s, uint16_t flags, const char *p, size_t len)
{
    const struct lg_config *c = w->cfg;
    if ((flags & F_ERROR) || (len && p[0] == '-')) {
        note_error(w, "%.*s", (int)(len > 100 ? 100 : len), p);
        return;
    }
    if (s->kind == K_PULL) {
        const unsigned char *u = (const unsigned char *)p;
        w->gets++;
        if (len >= 16 && (u[0] == 2 || u[0] == 3)) { /* no such batch, no such stream */
            w->misses++;
            return;
        }
        w->hits++;
        if (c->check && !pull_ok(s, u, len))
            note_error(w, "pull of batch %llu of key:%012llu: a malformed answer (%zu bytes, status %d)",
                       (unsigned long long)s->no, (unsigned long long)s->key, len, len ? u[0] : -1);
        return;
    }
    if (s->kind == K_SET && c->xadd && c->batch) {
        char tail[24];
        int t = snprintf(tail, sizeof tail, "\r\n:%d\r\n", c->batch);
        if (len < 8 || memcmp(p, "*2\r\n$", 5) || len < (size_t)t || memcmp(p + len - t, tail, (size_t)t)) {
            note_error(w, "XADD batch to key:%012llu: unexpected reply %.*s", (unsigned long long)s->key,
                       (int)(len > 60 ? 60 : len), p);
            return;
        }
        w->sets += (uint64_t)c->batch;
        return;
    }
    if (s->kind == K_SET) {
        w->sets++;
        if (c->check && !(len == 5 && !memcmp(p, "+OK\r\n", 5)))
            note_error(w, "SET key:%012llu: unexpected reply %.*s", (unsigned long long)s->key,
                       (int)(len > 60 ? 60 : len), p);
        return;
    }
    w->gets++;
    if (len == 5 && !memcmp(p, "$-1\r\n", 5)) {
        w->misses++;
        return;
    }
    w->hits++;
    if (!c->check)
        return;
    char hdr[32];
    int h = snprintf(hdr, sizeof hdr, "$%d\r\n", c->value_size);
    int ok = len == (size_t)h + (size_t)c->value_size + 2 && !memcmp(p, hdr, (size_t)h) &&
             !memcmp(p + len - 2, "\r\n", 2);
    for (int i = 0; ok && i < c->value_size; i++)
        ok = p[h + i] == value_byte(s->key, (size_t)i);
    if (!ok)
        note_error(w, "GET key:%012llu: wrong value %.*s", (unsigned long long)s->key, (int)(len > 60 ? 60 : len), p);
}

static void complete(struct uworker *w, struct usock *u, int si, uint64_t now)
{
    struct slot *s = &u->slots[si];
    uint64_t lat = now - s->t;
    w->hist[hist_index(lat)]++;
    w->lat_sum += lat;
    if (lat > w->lat_max) w->lat_max = lat;
    w->requests++;
    w->last_ns = now;
    s->kind = 0;
    u->free[u->nfree++] = si;
}

static int send_some(struct uworker *w, struct usock *u, char *scratch, int sending)
{
    struct mmsghdr mm[MMSG];
    struct iovec iov[MMSG];
    int idx[MMSG], n = u->nfree < MMSG ? u->nfree : MMSG;
    if (!sending || !n || !(n = take(w, n)))
        return 0;
    uint64_t now = mono_ns();
    for (int i = 0; i < n; i++) {
        int si = u->free[--u->nfree];
        struct slot *s = &u->slots[si];
        idx[i] = si;
        /* id: the slot in its low 16 bits (index within this worker), a counter above
         * it so that a late reply to a slot's earlier request is not taken for the new one */
        s->id = (uint32_t)w->counter++ << 16 | ((uint32_t)(u - w->socks) * (uint32_t)w->window + (uint32_t)si);
        s->t = now;
        iov[i].iov_base = scratch + (size_t)i * MAX_DGRAM;
        iov[i].iov_len = build(w, s, iov[i].iov_base);
        memset(&mm[i], 0, sizeof mm[i]);
        mm[i].msg_hdr.msg_iov = &iov[i];
        mm[i].msg_hdr.msg_iovlen = 1;
    }
    int sent = sendmmsg(u->fd, mm, (unsigned)n, MSG_DONTWAIT);
    if (sent < 0)
        sent = 0; /* EAGAIN/ENOBUFS: the slots go back and are tried again */
    for (int i = sent; i < n; i++) {
        u->slots[idx[i]].kind = 0;
        u->free[u->nfree++] = idx[i];
    }
    give_back(w, n - sent);
    if (!w->first_ns && sent) w->first_ns = now;
    for (int i = 0; i < sent; i++)
        w->bytes_sent += iov[i].iov_len;
    return sent;
}

static int recv_some(struct uworker *w, struct usock *u, char *rbuf)
{
    struct mmsghdr mm[MMSG];
    struct iovec iov[MMSG];
    memset(mm, 0, sizeof mm);
    for (int i = 0; i < MMSG; i++) {
        iov[i].iov_base = rbuf + (size_t)i * 2048;
        iov[i].iov_len = 2048;
        mm[i].msg_hdr.msg_iov = &iov[i];
        mm[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(u->fd, mm, MMSG, MSG_DONTWAIT, NULL);
    if (n <= 0)
        return 0;
    uint64_t now = mono_ns();
    for (int i = 0; i < n; i++) {
        const unsigned char *p = iov[i].iov_base;
        size_t len = mm[i].msg_len;
        w->bytes_received += len;
        if (len < FRAME_HDR || !(p[7] & F_REPLY))
            continue;
        uint32_t id = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        uint32_t g = id & 0xffff;
        int si = (int)(g % (uint32_t)w->window);
        if (g / (uint32_t)w->window != (uint32_t)(u - w->socks))
            continue;
        struct slot *s = &u->slots[si];
        if (!s->kind || s->id != id)
            continue; /* late: its request already timed out */
        check_reply(w, s, (uint16_t)(p[6] << 8 | p[7]), (const char *)p + FRAME_HDR, len - FRAME_HDR);
        complete(w, u, si, now);
    }
    return n;
}

static void expire(struct uworker *w, uint64_t now, int all)
{
    uint64_t tmo = (uint64_t)w->timeout_ms * 1000000ull;
    for (int k = 0; k < w->nsock; k++) {
        struct usock *u = &w->socks[k];
        for (int i = 0; i < w->window; i++) {
            struct slot *s = &u->slots[i];
            if (s->kind && (all || (now > s->t && now - s->t > tmo))) { /* t may be after now */
                w->timeouts++;
                s->kind = 0;
                u->free[u->nfree++] = i;
            }
        }
    }
}

static void *worker_main(void *arg)
{
    struct uworker *w = arg;
    char *scratch = malloc((size_t)MMSG * MAX_DGRAM), *rbuf = malloc((size_t)MMSG * 2048);
    struct pollfd *pf = calloc((size_t)w->nsock, sizeof *pf);
    if (!scratch || !rbuf || !pf) {
        w->fail = -ENOMEM;
        snprintf(w->error, sizeof w->error, "out of memory");
        goto out;
    }
    uint64_t last_expire = mono_ns(), drain_until = 0;
    for (;;) {
        uint64_t now = mono_ns();
        int sending = !(w->cfg->stop && *w->cfg->stop) && (!w->deadline_ns || now < w->deadline_ns);
        if (!sending && !drain_until)
            drain_until = now + (uint64_t)w->timeout_ms * 1000000ull;
        int inflight = 0, moved = 0;
        for (int k = 0; k < w->nsock; k++) {
            moved += send_some(w, &w->socks[k], scratch, sending);
            moved += recv_some(w, &w->socks[k], rbuf);
            inflight += w->window - w->socks[k].nfree;
        }
        if (now - last_expire > 10000000ull) {
            expire(w, now, 0);
            last_expire = now;
        }
        if (!inflight && (!sending || (w->cfg->requests && !atomic_load(w->budget))))
            break;
        if (drain_until && now > drain_until) {
            expire(w, now, 1);
            break;
        }
        if (!moved) {
            for (int k = 0; k < w->nsock; k++)
                pf[k] = (struct pollfd){.fd = w->socks[k].fd, .events = POLLIN};
            poll(pf, (nfds_t)w->nsock, 1);
        }
    }
out:
    free(scratch);
    free(rbuf);
    free(pf);
    return NULL;
}

#define BAD(...) return snprintf(out->error, sizeof out->error, __VA_ARGS__), -EINVAL

int ug_run(const struct lg_config *cfg, int timeout_ms, struct lg_result *out, uint64_t *timeouts)
{
    memset(out, 0, sizeof *out);
    *timeouts = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port)};
    if (!cfg->host || inet_pton(AF_INET, cfg->host, &sa.sin_addr) != 1)
        BAD("host: expected an IPv4 address, got '%s'", cfg->host ? cfg->host : "");
    if (cfg->port < 1 || cfg->port > 65535) BAD("port: expected 1..65535, got %d", cfg->port);
    if (cfg->threads < 1 || cfg->threads > 256) BAD("threads: expected 1..256, got %d", cfg->threads);
    if (cfg->conns < cfg->threads) BAD("conns (sockets): expected at least one per thread (%d), got %d",
                                       cfg->threads, cfg->conns);
    if (cfg->pipeline < 1 || cfg->pipeline > MAX_WINDOW)
        BAD("pipeline (requests in flight per socket): expected 1..%d over UDP, got %d", MAX_WINDOW, cfg->pipeline);
    if (cfg->value_size < 1 || cfg->value_size > MAX_VALUE)
        BAD("value size: expected 1..%d bytes over UDP (one datagram), got %d", MAX_VALUE, cfg->value_size);
    if (cfg->xadd && cfg->pull_batches)
        BAD("xadd and pulls: one load at a time (writes with xadd, reads with pull batches)");
    if (cfg->xadd && (cfg->batch < 1 || cfg->batch > MAX_BATCH))
        BAD("batch: expected 1..%d messages per datagram over UDP, got %d", MAX_BATCH, cfg->batch);
    if (cfg->xadd && 8 + 22 + (long)cfg->batch * (2 + cfg->value_size) > MAX_DGRAM)
        BAD("batch x (value size + 2) must fit one request datagram (%d bytes), got %d x %d", MAX_DGRAM - 30,
            cfg->batch, cfg->value_size + 2);
    if (cfg->xadd && cfg->get_ratio)
        BAD("xadd: writes only (a ratio of N:0)");
    if (cfg->keyspace < 1 || cfg->keyspace > 1000000000000ull) BAD("keyspace: expected 1..10^12");
    if (cfg->set_ratio < 0 || cfg->get_ratio < 0 || cfg->set_ratio + cfg->get_ratio == 0) BAD("ratio: bad SET:GET");
    if (!cfg->requests && cfg->duration <= 0) BAD("give a request count or a duration");
    if (cfg->rate > 0) BAD("rate: the UDP mode is closed loop only");
    if (cfg->proto != LG_PROTO_RESP) BAD("protocol: the UDP mode speaks RESP only");
    if (cfg->password) BAD("password: the UDP path has no AUTH");
    if (timeout_ms < 1) BAD("timeout: expected at least 1 ms, got %d", timeout_ms);
    int nt = cfg->threads;
    int per = cfg->conns / nt;
    if ((long)per * cfg->pipeline > 65536) BAD("sockets per thread x pipeline must be at most 65536 (the id's slot bits)");

    struct uworker *ws = calloc((size_t)nt, sizeof *ws);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    _Atomic long long budget = (long long)cfg->requests;
    int rc = 0, started = 0;
    if (!ws || !th) {
        free(ws);
        free(th);
        snprintf(out->error, sizeof out->error, "out of memory");
        return -ENOMEM;
    }
    uint64_t start = mono_ns();
    for (int t = 0; t < nt && !rc; t++) {
        struct uworker *w = &ws[t];
        w->cfg = cfg;
        w->idx = t;
        w->nsock = per + (t < cfg->conns % nt);
        w->window = cfg->pipeline;
        w->timeout_ms = timeout_ms;
        w->budget = &budget;
        w->rng = cfg->seed * 0x9e3779b97f4a7c15ull + (uint64_t)t + 1;
        w->deadline_ns = cfg->duration > 0 ? start + (uint64_t)(cfg->duration * 1e9) : 0;
        w->hist = calloc(HIST_LEN, sizeof *w->hist);
        w->socks = calloc((size_t)w->nsock, sizeof *w->socks);
        if (!w->hist || !w->socks) {
            rc = -ENOMEM;
            snprintf(out->error, sizeof out->error, "out of memory");
            break;
        }
        for (int k = 0; k < w->nsock; k++)
            w->socks[k].fd = -1;
        for (int k = 0; k < w->nsock && !rc; k++) {
            struct usock *u = &w->socks[k];
            u->slots = calloc((size_t)w->window, sizeof *u->slots);
            u->free = calloc((size_t)w->window, sizeof *u->free);
            if (!u->slots || !u->free) {
                rc = -ENOMEM;
                snprintf(out->error, sizeof out->error, "out of memory");
                break;
            }
            for (int i = 0; i < w->window; i++)
                u->free[u->nfree++] = w->window - 1 - i;
            u->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            int big = 4 << 20;
            if (u->fd >= 0) {
                setsockopt(u->fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
                setsockopt(u->fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
            }
            if (u->fd < 0 || connect(u->fd, (struct sockaddr *)&sa, sizeof sa)) {
                rc = -errno;
                snprintf(out->error, sizeof out->error, "UDP socket to %s:%d: %s", cfg->host, cfg->port,
                         strerror(errno));
            }
        }
    }
    for (int t = 0; t < nt && !rc; t++) {
        if ((rc = -pthread_create(&th[t], NULL, worker_main, &ws[t])))
            snprintf(out->error, sizeof out->error, "cannot start thread: %s", strerror(-rc));
        else
            started++;
    }
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);

    uint64_t *hist = calloc(HIST_LEN, sizeof *hist), first = 0, last = 0, lat_sum = 0, lat_max = 0;
    for (int t = 0; t < nt; t++) {
        struct uworker *w = &ws[t];
        out->requests += w->requests, out->sets += w->sets, out->gets += w->gets;
        out->hits += w->hits, out->misses += w->misses, out->errors += w->errors;
        out->bytes_sent += w->bytes_sent, out->bytes_received += w->bytes_received;
        *timeouts += w->timeouts;
        lat_sum += w->lat_sum;
        if (w->lat_max > lat_max) lat_max = w->lat_max;
        if (w->first_ns && (!first || w->first_ns < first)) first = w->first_ns;
        if (w->last_ns > last) last = w->last_ns;
        if (!out->first_error[0] && w->first_error[0])
            memcpy(out->first_error, w->first_error, sizeof out->first_error);
        if (!rc && w->fail) {
            rc = w->fail;
            snprintf(out->error, sizeof out->error, "%s", w->error);
        }
        for (unsigned i = 0; hist && w->hist && i < HIST_LEN; i++)
            hist[i] += w->hist[i];
        for (int k = 0; w->socks && k < w->nsock; k++) {
            if (w->socks[k].fd >= 0)
                close(w->socks[k].fd);
            free(w->socks[k].slots);
            free(w->socks[k].free);
        }
        free(w->socks);
        free(w->hist);
    }
    out->elapsed = last > first ? (double)(last - first) / 1e9 : 0;
    out->throughput = out->elapsed > 0 ? (double)out->requests / out->elapsed : 0;
    if (out->requests && hist) {
        out->lat_mean_us = (double)lat_sum / (double)out->requests / 1000.0;
        out->lat_p50_us = percentile(hist, out->requests, 0.50, lat_max);
        out->lat_p90_us = percentile(hist, out->requests, 0.90, lat_max);
        out->lat_p99_us = percentile(hist, out->requests, 0.99, lat_max);
        out->lat_p999_us = percentile(hist, out->requests, 0.999, lat_max);
        out->lat_max_us = (double)lat_max / 1000.0;
    }
    free(hist);
    free(ws);
    free(th);
    return rc;
}
