/* loadgen.c - closed/open-loop SET/GET load generator for RESP2 and memcached-text servers (see loadgen.h).
 * Threads: the lg_run caller validates, connects, starts and joins the workers and merges their results;
 * each worker alone owns its epoll fd, connections, buffers and histogram. Shared between workers: only the
 * atomic request budget and the first-failure slot (mutex). Replies are untrusted: parsing is incremental,
 * every line and length is bounded, so a reply split anywhere parses and garbage fails the run cleanly. */
#define _GNU_SOURCE
#include "bench/loadgen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "bench/loadgen_int.h"

/* Server text ends up in Python strings and logs: keep it printable. */
static void sanitize(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) *s = '?';
}

__attribute__((format(printf, 3, 4)))
int lg_fail(struct run *r, int err, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&r->mu);
    if (!atomic_load(&r->failed)) {
        va_start(ap, fmt), vsnprintf(r->msg, sizeof r->msg, fmt, ap), va_end(ap);
        sanitize(r->msg), r->err = err, atomic_store(&r->failed, 1);
    }
    pthread_mutex_unlock(&r->mu);
    return err;
}

static int sys_fail(struct run *r, int e, const char *what)
{
    char buf[128];
    /* GNU strerror_r: strerror() is not thread-safe and two lg_runs may fail at once */
    return lg_fail(r, -e, "%s %s:%d: %s", what, r->cfg->host, r->cfg->port, strerror_r(e, buf, sizeof buf));
}

__attribute__((format(printf, 2, 3)))
void lg_note_error(struct worker *w, const char *fmt, ...)
{
    va_list ap;
    if (w->first_error[0]) return;
    va_start(ap, fmt), vsnprintf(w->first_error, sizeof w->first_error, fmt, ap), va_end(ap);
    sanitize(w->first_error), w->first_error_t = mono_ns();
}

__attribute__((format(printf, 2, 3)))
int lg_proto_err(struct worker *w, const char *fmt, ...)
{
    char buf[160]; va_list ap;
    va_start(ap, fmt), vsnprintf(buf, sizeof buf, fmt, ap), va_end(ap);
    w->errors++;
    lg_note_error(w, "protocol error: %s", buf);
    return lg_fail(w->r, -EPROTO, "protocol error from %s:%d: %s", w->r->cfg->host, w->r->cfg->port, buf);
}


/* ---- output: requests are copied into obuf; huge values are referenced, not copied ---- */

static char *out_reserve(struct conn *c, size_t n)
{
    if (c->olen + n > c->ocap) {
        size_t cap = c->ocap ? c->ocap : 4096;
        while (cap < c->olen + n) cap *= 2;
        char *p = realloc(c->obuf, cap);
        if (!p) return NULL;
        c->obuf = p, c->ocap = cap;
    }
    return c->obuf + c->olen;
}

static int out_seg(struct conn *c, const char *ext, size_t n)
{
    if (!ext && c->nseg) {
        /* contiguous obuf bytes merge, so a batch of small requests is a single iovec */
        struct seg *s = &c->segs[c->nseg - 1];
        if (!s->ext && s->off + s->len == c->olen) { s->len += n; c->olen += n; return 0; }
    }
    if (c->nseg == c->segcap) {
        size_t cap = c->segcap ? 2 * c->segcap : 16;
        struct seg *p = realloc(c->segs, cap * sizeof *p);
        if (!p) return -ENOMEM;
        c->segs = p, c->segcap = cap;
    }
    c->segs[c->nseg++] = (struct seg){ ext, ext ? 0 : c->olen, n };
    if (!ext) c->olen += n;
    return 0;
}

static int enqueue(struct worker *w, struct conn *c, uint64_t t_lat, uint64_t now)
{
    struct run *r = w->r;
    const struct lg_config *cfg = r->cfg;
    uint64_t key = below(w, r->keyspace);
    int kind = !cfg->get_ratio ? K_SET : !cfg->set_ratio ? K_GET
             : below(w, (uint64_t)cfg->set_ratio + (uint64_t)cfg->get_ratio) < (uint64_t)cfg->set_ratio
             ? K_SET : K_GET;
    char d[12], *p;
    fmt12(d, key);
    if (kind == K_GET) {
        if (!(p = out_reserve(c, r->get_len))) return -ENOMEM;
        memcpy(p, r->get_t, r->get_len), memcpy(p + r->get_key, d, 12);
        if (out_seg(c, NULL, r->get_len)) return -ENOMEM;
    } else {
        /* value = filler with the key's digits over its first min(12,n) and, if n >= 24, last 12 bytes */
        size_t k = r->vsize < 12 ? (size_t)r->vsize : 12;
        if (!(p = out_reserve(c, r->set_len))) return -ENOMEM;
        memcpy(p, r->set_t, r->set_len), memcpy(p + r->set_key, d, 12);
        memcpy(p + r->set_val, d + 12 - k, k);
        if (r->vsize >= 24 && !r->large) memcpy(p + r->set_val + r->vsize - 12, d, 12);
        if (out_seg(c, NULL, r->set_len)) return -ENOMEM;
        if (r->large) {
            if (out_seg(c, r->filler + 12, r->vsize - 24) || !(p = out_reserve(c, 14))) return -ENOMEM;
            memcpy(p, d, 12), memcpy(p + 12, "\r\n", 2);
            if (out_seg(c, NULL, 14)) return -ENOMEM;
        }
    }
    uint32_t i = c->rhead + c->rcount;
    if (i >= r->depth) i -= r->depth;
    c->ring[i] = (struct slot){ t_lat, key, kind };
    c->rcount++, w->inflight++;
    if (!w->first_send) w->first_send = now;
    return 0;
}

static int set_out(struct worker *w, struct conn *c, int on)
{
    if (c->want_out == on) return 0;
    struct epoll_event ev = { .events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c };
    if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) return sys_fail(w->r, errno, "epoll_ctl for");
    c->want_out = on;
    return 0;
}

/* One sendmsg for everything queued (more only if it exceeds IOV_BATCH segments). */
static int flush(struct worker *w, struct conn *c)
{
    struct iovec iov[IOV_BATCH];
    while (c->shead < c->nseg) {
        size_t want = 0, n = 0;
        for (size_t i = c->shead; i < c->nseg && n < IOV_BATCH; i++, n++) {
            const struct seg *s = &c->segs[i];
            size_t skip = i == c->shead ? c->sdone : 0;
            iov[n].iov_base = (char *)(s->ext ? s->ext : c->obuf + s->off) + skip;
            iov[n].iov_len = s->len - skip;
            want += iov[n].iov_len;
        }
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n };
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT); /* NOSIGNAL: no SIGPIPE in Python */
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return set_out(w, c, 1);
            return sys_fail(w->r, errno, "write to");
        }
        w->bsent += (uint64_t)k;
        for (size_t left = (size_t)k; left;) {
            size_t rem = c->segs[c->shead].len - c->sdone;
            if (left < rem) { c->sdone += left; break; }
            left -= rem, c->sdone = 0, c->shead++;
        }
        if ((size_t)k < want)
            return set_out(w, c, 1); /* socket buffer full: resume on EPOLLOUT */
    }
    c->nseg = c->shead = c->sdone = c->olen = 0;
    return set_out(w, c, 0);
}

/* Budget comes in chunks so the hot path rarely touches the shared atomic; the total stays exact. */
static int take_budget(struct worker *w)
{
    struct run *r = w->r;
    if (!r->bounded) return 1;
    if (!w->budget) {
        uint64_t cur = atomic_load(&r->left), take;
        do {
            if (!cur) return 0;
            take = cur < r->chunk ? cur : r->chunk;
        } while (!atomic_compare_exchange_weak(&r->left, &cur, cur - take));
        w->budget = take;
    }
    w->budget--;
    return 1;
}

static int fill(struct worker *w, struct conn *c)
{
    if (c->rcount >= w->r->depth || c->olen >= OUT_SOFT) return 0;
    uint64_t now = mono_ns();
    while (c->rcount < w->r->depth && c->olen < OUT_SOFT) {
        if (!take_budget(w)) { w->sending = 0; break; }
        if (enqueue(w, c, now, now) < 0) return lg_fail(w->r, -ENOMEM, "out of memory queueing requests");
    }
    return 0;
}

static int conn_read(struct worker *w, struct conn *c)
{
    /* only an incomplete line (< MAX_LINE) or CRLF is ever left over, so this move is small */
    if (c->rpos) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos, c->rpos = 0;
    }
    ssize_t n = read(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0
             : sys_fail(w->r, errno, "read from");
    if (!n)
        return lg_fail(w->r, -ECONNRESET, "connection to %s:%d closed by server", w->r->cfg->host,
                    w->r->cfg->port);
    uint64_t now = mono_ns();
    w->brecv += (uint64_t)n, w->last_rx = now, c->rlen += (size_t)n;
    return lg_parse(w, c, now);
}

/* epoll_wait only sleeps in whole ms, far too coarse for open-loop schedules at thousands of req/s per
 * thread; epoll_pwait2 (Linux 5.11, glibc 2.35) takes ns. Without it we sleep the whole ms and spin
 * (timeout 0) through the sub-ms rest: costs CPU, keeps the schedule. */
static int wait_events(struct worker *w, struct epoll_event *ev, int max, int64_t tmo)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
    if (w->pwait2) {
        struct timespec ts = { tmo / 1000000000, tmo % 1000000000 };
        int n = epoll_pwait2(w->epfd, ev, max, &ts, NULL);
        if (n >= 0 || errno != ENOSYS) return n;
        w->pwait2 = 0;
    }
#endif
    return epoll_wait(w->epfd, ev, max, (int)(tmo / 1000000));
}

/* Open loop: hand every request whose scheduled time has passed to the next connection (round robin)
 * with a free slot; requests that find none wait and keep their scheduled time as latency start. */
static int open_tick(struct worker *w, uint64_t now, int64_t *tmo)
{
    struct run *r = w->r;
    if (now < w->t0) {
        if ((int64_t)(w->t0 - now) < *tmo) *tmo = (int64_t)(w->t0 - now);
        return 0;
    }
    uint64_t due = (uint64_t)((double)(now - w->t0) / w->interval) + 1;
    int miss = 0;
    while (w->sched < due && miss < w->nconn) {
        struct conn *c = &w->conns[w->rr];
        if (++w->rr == w->nconn) w->rr = 0;
        if (c->auth_pending || c->rcount >= r->depth || c->olen >= OUT_SOFT) { miss++; continue; }
        if (!take_budget(w)) { w->sending = 0; break; }
        if (enqueue(w, c, w->t0 + (uint64_t)((double)w->sched * w->interval), now) < 0)
            return lg_fail(r, -ENOMEM, "out of memory queueing requests");
        w->sched++, c->dirty = 1, miss = 0;
    }
    for (int i = 0; i < w->nconn; i++) {
        struct conn *c = &w->conns[i];
        if (!c->dirty) continue;
        c->dirty = 0;
        if (!c->want_out && flush(w, c) < 0) return -1;
    }
    if (w->sched < due || !w->sending)
        return 0; /* all pipelines full: a reply wakes us */
    uint64_t next = w->t0 + (uint64_t)((double)w->sched * w->interval);
    int64_t d = next > now ? (int64_t)(next - now) : 0;
    if (d < *tmo) *tmo = d;
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->r;
    const struct lg_config *cfg = r->cfg;
    struct epoll_event ev[256];
    int open = cfg->rate > 0;
    uint64_t now = mono_ns();
    if (open) /* the default 50 us timer slack would smear the schedule; this thread is ours */
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    w->sending = w->pwait2 = 1, w->last_rx = now;
    w->t0 = now + (uint64_t)(w->interval * w->idx / cfg->threads); /* interleave the threads' ticks */
    for (int i = 0; i < w->nconn; i++) {
        struct conn *c = &w->conns[i];
        if (r->auth_t) {
            char *p = out_reserve(c, r->auth_len);
            if (!p || out_seg(c, NULL, r->auth_len)) { lg_fail(r, -ENOMEM, "out of memory"); return NULL; }
            memcpy(p, r->auth_t, r->auth_len), c->auth_pending = 1;
        } else if (!open && fill(w, c) < 0) {
            return NULL;
        }
        if (flush(w, c) < 0) return NULL;
    }
    /* *stop is written by another thread with no lock; an atomic load keeps that well-defined */
    while (!atomic_load_explicit(&r->failed, memory_order_relaxed) &&
           !(cfg->stop && __atomic_load_n(cfg->stop, __ATOMIC_RELAXED))) {
        int64_t tmo = IDLE_NS;
        now = mono_ns();
        if (w->sending && r->deadline && now >= r->deadline) w->sending = 0;
        if (open && w->sending && open_tick(w, now, &tmo) < 0) break;
        if (!w->sending && (!w->inflight || (r->deadline && now >= r->deadline + DRAIN_NS))) break;
        if (w->sending && r->deadline && (int64_t)(r->deadline - now) < tmo)
            tmo = (int64_t)(r->deadline - now);
        if (w->inflight && now - w->last_rx > STALL_NS) {
            lg_fail(r, -ETIMEDOUT, "no reply from %s:%d for %llu s", cfg->host, cfg->port, STALL_NS / 1000000000);
            break;
        }
        int n = wait_events(w, ev, 256, tmo);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) { sys_fail(r, errno, "epoll_wait for"); break; }
        for (int i = 0; i < n; i++) {
            struct conn *c = ev[i].data.ptr;
            uint32_t e = ev[i].events;
            if ((e & (EPOLLIN | EPOLLERR | EPOLLHUP)) && conn_read(w, c) < 0) return NULL;
            if ((e & EPOLLOUT) && flush(w, c) < 0) return NULL;
            if (!open && w->sending && !c->auth_pending && fill(w, c) < 0) return NULL;
            if (c->shead < c->nseg && !c->want_out && flush(w, c) < 0) return NULL;
        }
    }
    return NULL;
}

#define BAD(...) return snprintf(err, n, __VA_ARGS__), -EINVAL

static int validate(const struct lg_config *c, struct in_addr *addr, char *err, size_t n)
{
    if (!c->host || inet_pton(AF_INET, c->host, addr) != 1)
        BAD("host must be an IPv4 dotted address, got '%.64s'", c->host ? c->host : "(null)");
    if (c->port < 1 || c->port > 65535) BAD("port must be 1..65535, got %d", c->port);
    if (c->threads < 1) BAD("threads must be >= 1, got %d", c->threads);
    if (c->conns < c->threads) BAD("conns (%d) must be >= threads (%d)", c->conns, c->threads);
    if (c->pipeline < 1 || c->pipeline > 100000) BAD("pipeline must be 1..100000, got %d", c->pipeline);
    if (c->value_size < 1 || (uint64_t)c->value_size > MAX_VALUE)
        BAD("value_size must be 1..512 MiB, got %d", c->value_size);
    if (c->keyspace < 1 || c->keyspace > MAX_KEYSPACE)
        BAD("keyspace must be 1..10^12 (keys are key:%%012llu), got %llu", (unsigned long long)c->keyspace);
    if (c->set_ratio < 0 || c->get_ratio < 0 || (!c->set_ratio && !c->get_ratio))
        BAD("set_ratio and get_ratio must be >= 0 and not both 0, got %d:%d", c->set_ratio, c->get_ratio);
    if (!(c->duration >= 0 && c->duration < 1e9)) BAD("duration must be 0..1e9 seconds, got %g", c->duration);
    if (!c->requests && !(c->duration > 0)) BAD("at least one of requests and duration must be > 0");
    if (!(c->rate >= 0 && c->rate < 1e12)) BAD("rate must be >= 0 (and finite), got %g", c->rate);
    if (c->proto != LG_PROTO_RESP && c->proto != LG_PROTO_MEMCACHE)
        BAD("proto must be LG_PROTO_RESP or LG_PROTO_MEMCACHE, got %d", c->proto);
    if (c->xadd && (c->proto != LG_PROTO_RESP || c->get_ratio))
        BAD("xadd: RESP and writes only (a ratio of N:0)");
    return 0;
}

static int build_templates(struct run *r)
{
    const struct lg_config *cfg = r->cfg;
    unsigned long long n = r->vsize;
    char hdr[96];
    int h = r->mc        ? snprintf(hdr, sizeof hdr, "set key:000000000000 0 0 %llu\r\n", n)
            : cfg->xadd  ? snprintf(hdr, sizeof hdr, "*5\r\n$4\r\nXADD\r\n$16\r\nkey:000000000000\r\n$1\r\n*\r\n"
                                                      "$1\r\nv\r\n$%llu\r\n", n)
                         : snprintf(hdr, sizeof hdr, "*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000000\r\n$%llu\r\n", n);
    static const char get_resp[] = "*2\r\n$3\r\nGET\r\n$16\r\nkey:000000000000\r\n";
    static const char get_mc[] = "get key:000000000000\r\n";
    r->large = n > LARGE_VALUE, r->get_key = r->mc ? 8 : 22, r->set_val = (size_t)h;
    r->set_key = (size_t)(strstr(hdr, "key:") - hdr) + 4;
    r->set_len = (size_t)h + (r->large ? 12 : n + 2);
    r->get_len = r->mc ? sizeof get_mc - 1 : sizeof get_resp - 1;
    /* the full filler is needed to send large values and to verify; a GET-only run needs no more than
       the (unused) SET template takes */
    size_t fl = r->check || cfg->set_ratio || !r->large ? n : 12;
    if (!(r->filler = malloc(fl)) || !(r->set_t = malloc(r->set_len)) || !(r->get_t = malloc(r->get_len)))
        return lg_fail(r, -ENOMEM, "out of memory for %llu-byte values", n);
    for (size_t i = 0; i < fl; i++) r->filler[i] = (char)('a' + i % 26);
    memcpy(r->set_t, hdr, (size_t)h);
    memcpy(r->set_t + h, r->filler, r->large ? 12 : n);
    if (!r->large) memcpy(r->set_t + r->set_len - 2, "\r\n", 2);
    memcpy(r->get_t, r->mc ? get_mc : get_resp, r->get_len);
    if (cfg->password && !r->mc) {
        size_t pl = strlen(cfg->password);
        if (!(r->auth_t = malloc(pl + 64))) return lg_fail(r, -ENOMEM, "out of memory");
        r->auth_len = (size_t)snprintf(r->auth_t, pl + 64, "*2\r\n$4\r\nAUTH\r\n$%zu\r\n%s\r\n", pl,
                                       cfg->password);
    }
    return 0;
}

static int connect_all(struct run *r, struct conn *cs, int n, const struct in_addr *addr)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)r->cfg->port),
                              .sin_addr = *addr };
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    int pending = 0, rc = 0, one = 1;
    if (!pf) return lg_fail(r, -ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) { rc = sys_fail(r, errno, "connect to"); goto out; }
        cs[i].fd = fd, pf[i].fd = -1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) continue;
        if (errno != EINPROGRESS) { rc = sys_fail(r, errno, "connect to"); goto out; }
        pf[i] = (struct pollfd){ .fd = fd, .events = POLLOUT }, pending++;
    }
    for (uint64_t end = mono_ns() + CONNECT_MS * 1000000ull; pending;) {
        uint64_t now = mono_ns();
        if (now >= end) { rc = sys_fail(r, ETIMEDOUT, "connect to"); goto out; }
        int k = poll(pf, (nfds_t)n, (int)((end - now + 999999) / 1000000));
        if (k < 0 && errno != EINTR) { rc = sys_fail(r, errno, "connect to"); goto out; }
        for (int i = 0; k > 0 && i < n; i++) {
            int e = 0; socklen_t l = sizeof e;
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            if (getsockopt(pf[i].fd, SOL_SOCKET, SO_ERROR, &e, &l) < 0) e = errno;
            if (e) { rc = sys_fail(r, e, "connect to"); goto out; }
            pf[i].fd = -1, pending--;
        }
    }
out:
    free(pf);
    return rc;
}

static int setup(struct run *r, struct worker *ws, struct conn *cs, const struct in_addr *addr)
{
    const struct lg_config *cfg = r->cfg;
    uint64_t want = (uint64_t)r->depth * (r->vsize + 64);
    size_t rcap = want < (32u << 10) ? (32u << 10) : want > (512u << 10) ? (512u << 10) : (size_t)want;
    int rc, at = 0;
    if ((rc = connect_all(r, cs, cfg->conns, addr)) < 0) return rc;
    for (int t = 0; t < cfg->threads; t++) {
        struct worker *w = &ws[t];
        w->r = r, w->idx = t;
        w->rng = cfg->seed ^ (0x632be59bd9b4e019ull * (uint64_t)(t + 1));
        w->interval = cfg->rate > 0 ? 1e9 * cfg->threads / cfg->rate : 0;
        w->conns = cs + at, w->nconn = cfg->conns / cfg->threads + (t < cfg->conns % cfg->threads);
        at += w->nconn;
        if ((w->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return sys_fail(r, errno, "epoll_create for");
        for (int i = 0; i < w->nconn; i++) {
            struct conn *c = &w->conns[i];
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
            c->rcap = rcap;
            if (!(c->ring = calloc(r->depth, sizeof *c->ring)) || !(c->rbuf = malloc(rcap)))
                return lg_fail(r, -ENOMEM, "out of memory for %d connections", cfg->conns);
            if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) return sys_fail(r, errno, "epoll_ctl for");
        }
    }
    return 0;
}

static void merge(struct worker *ws, int nw, struct lg_result *out)
{
    uint64_t first = 0, last = 0, sum = 0, max = 0, ferr_t = 0;
    for (int t = 0; t < nw; t++) {
        struct worker *w = &ws[t];
        out->requests += w->requests, out->sets += w->sets, out->gets += w->gets;
        out->hits += w->hits, out->misses += w->misses, out->errors += w->errors;
        out->bytes_sent += w->bsent, out->bytes_received += w->brecv;
        sum += w->lat_sum, max = w->lat_max > max ? w->lat_max : max;
        if (w->first_send && (!first || w->first_send < first)) first = w->first_send;
        if (w->last_reply > last) last = w->last_reply;
        if (w->first_error[0] && (!ferr_t || w->first_error_t < ferr_t))
            ferr_t = w->first_error_t, memcpy(out->first_error, w->first_error, sizeof out->first_error);
        if (t)
            for (unsigned i = 0; i < HIST_LEN; i++) ws[0].hist[i] += w->hist[i];
    }
    out->elapsed = last > first && first ? (double)(last - first) / 1e9 : 0;
    out->throughput = out->elapsed > 0 ? (double)out->requests / out->elapsed : 0;
    if (out->requests) {
        out->lat_mean_us = (double)sum / (double)out->requests / 1000.0;
        double *at[] = { &out->lat_p50_us, &out->lat_p90_us, &out->lat_p99_us, &out->lat_p999_us };
        static const double q[] = { 0.50, 0.90, 0.99, 0.999 };
        for (int i = 0; i < 4; i++) *at[i] = percentile(ws[0].hist, out->requests, q[i], max);
        out->lat_max_us = (double)max / 1000.0;
    }
}

int lg_run(const struct lg_config *cfg, struct lg_result *out)
{
    struct in_addr addr;
    struct run *r;
    struct worker *ws = NULL; struct conn *cs = NULL;
    int rc, started = 0;
    sigset_t all, old;
    if (!out) return -EINVAL;
    memset(out, 0, sizeof *out);
    if (!cfg) { snprintf(out->error, sizeof out->error, "config is NULL"); return -EINVAL; }
    if ((rc = validate(cfg, &addr, out->error, sizeof out->error)) < 0) return rc;
    if (!(r = calloc(1, sizeof *r))) {
        snprintf(out->error, sizeof out->error, "out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->cfg = cfg, r->vsize = (uint64_t)cfg->value_size, r->keyspace = cfg->keyspace;
    r->depth = (uint32_t)cfg->pipeline, r->mc = cfg->proto == LG_PROTO_MEMCACHE, r->check = !!cfg->check;
    if ((ws = calloc((size_t)cfg->threads, sizeof *ws)))
        for (int t = 0; t < cfg->threads; t++) ws[t].epfd = -1;
    if ((cs = calloc((size_t)cfg->conns, sizeof *cs)))
        for (int i = 0; i < cfg->conns; i++) cs[i].fd = -1;
    if (!ws || !cs) rc = lg_fail(r, -ENOMEM, "out of memory");
    else if ((rc = build_templates(r)) >= 0) rc = setup(r, ws, cs, &addr);
    if (rc >= 0) {
        r->bounded = cfg->requests > 0, atomic_store(&r->left, cfg->requests);
        r->chunk = cfg->requests / ((uint64_t)cfg->threads * 64);
        r->chunk = r->chunk < 1 ? 1 : r->chunk > 1024 ? 1024 : r->chunk;
        r->deadline = cfg->duration > 0 ? mono_ns() + (uint64_t)(cfg->duration * 1e9) : 0;
        /* workers block every signal so Python's handlers keep running in the main thread */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        for (; started < cfg->threads; started++)
            if ((rc = pthread_create(&ws[started].tid, NULL, worker_main, &ws[started])) != 0) {
                lg_fail(r, -rc, "pthread_create: error %d", rc);
                break;
            }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        for (int t = 0; t < started; t++) pthread_join(ws[t].tid, NULL);
        merge(ws, cfg->threads, out);
    }
    rc = 0;
    if (atomic_load(&r->failed)) { rc = r->err; memcpy(out->error, r->msg, sizeof out->error); }
    for (int t = 0; ws && t < cfg->threads; t++)
        if (ws[t].epfd >= 0) close(ws[t].epfd);
    for (int i = 0; cs && i < cfg->conns; i++) {
        if (cs[i].fd >= 0) close(cs[i].fd);
        free(cs[i].ring), free(cs[i].obuf), free(cs[i].segs), free(cs[i].rbuf);
    }
    free(ws), free(cs), free(r->filler), free(r->set_t), free(r->get_t), free(r->auth_t);
    pthread_mutex_destroy(&r->mu), free(r);
    return rc;
}
