/* mqttgen.c - MQTT 3.1.1 publishers (see mqttgen.h). Threads: each worker owns its
 * clients and polls them; results merge after join. Broker bytes are untrusted: the
 * remaining length is bounded (4 varint bytes, MAX_PACKET) and every packet type
 * checked against what a publisher can be sent. */
#define _GNU_SOURCE
#include "bench/mqttgen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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

#define MAX_PACKET 4096 /* what a publisher is sent: CONNACK, PUBACK, PINGRESP */
#define RBUF 65536

struct mclient {
    int fd;
    int sub;                    /* a subscriber */
    char topic[24];
    size_t tlen;
    char *obuf;                 /* queued output, sent from ooff */
    size_t olen, ooff, ocap;
    unsigned char rbuf[RBUF];
    size_t rlen;
    uint64_t *sent;             /* QoS 1, 2: send time by packet id (1..window), 0 = free */
    unsigned char *released;    /* QoS 2: PUBREC came, PUBREL sent, by packet id */
    int next_id, inflight;
    uint64_t round_t;           /* QoS 0: the round's start, 0 when none is out */
};

struct mworker {
    const struct mq_config *cfg;
    struct mclient *c;
    int n, fail;
    pthread_t th;
    uint64_t deadline, first, last, messages, stopped;
    _Atomic uint64_t *budget;
    char *payload;
    uint64_t hist[HIST_LEN];
    uint64_t delivered, last_delivery;
    uint64_t dhist[HIST_LEN];   /* publish to delivery */
    char error[256];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((format(printf, 3, 4))) static int fail(struct mworker *w, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
    return w->fail = err;
}

static size_t put_len(unsigned char *p, size_t n)
{
    size_t i = 0;
    do {
        unsigned char b = n % 128;
        n /= 128;
        p[i++] = (unsigned char)(b | (n ? 0x80 : 0));
    } while (n);
    return i;
}

static int reserve(struct mclient *c, size_t more)
{
    if (c->ooff && c->ooff == c->olen)
        c->olen = c->ooff = 0;
    if (c->olen + more <= c->ocap)
        return 0;
    size_t cap = c->ocap ? c->ocap : 65536;
    while (cap < c->olen + more)
        cap *= 2;
    char *nb = realloc(c->obuf, cap);
    if (!nb)
        return -ENOMEM;
    c->obuf = nb, c->ocap = cap;
    return 0;
}

static int publish(struct mworker *w, struct mclient *c, int id)
{
    const struct mq_config *cfg = w->cfg;
    size_t body = 2 + c->tlen + (cfg->qos ? 2 : 0) + (size_t)cfg->msg_size;
    if (reserve(c, body + 5))
        return -ENOMEM;
    unsigned char *p = (unsigned char *)c->obuf + c->olen;
    size_t at = 0;
    p[at++] = (unsigned char)(0x30 | (cfg->qos << 1));
    at += put_len(p + at, body);
    p[at++] = (unsigned char)(c->tlen >> 8), p[at++] = (unsigned char)c->tlen;
    memcpy(p + at, c->topic, c->tlen), at += c->tlen;
    if (cfg->qos)
        p[at++] = (unsigned char)(id >> 8), p[at++] = (unsigned char)id;
    memcpy(p + at, w->payload, (size_t)cfg->msg_size);
    if (cfg->msg_size >= 8) {
        uint64_t t = now_ns();
        memcpy(p + at, &t, 8); /* its send time, for the subscribers */
    }
    at += (size_t)cfg->msg_size;
    c->olen += at;
    return 0;
}

/* Queue a 4-byte acknowledgement (PUBACK, PUBREC, PUBREL, PUBCOMP). */
static int put_ack(struct mclient *c, int type, int id)
{
    if (reserve(c, 4))
        return -ENOMEM;
    unsigned char *p = (unsigned char *)c->obuf + c->olen;
    p[0] = (unsigned char)(type << 4 | (type == 6 ? 2 : 0));
    p[1] = 2;
    p[2] = (unsigned char)(id >> 8);
    p[3] = (unsigned char)id;
    c->olen += 4;
    return 0;
}

static int take(struct mworker *w, int n)
{
    if (!w->cfg->messages)
        return n;
    uint64_t have = atomic_load_explicit(w->budget, memory_order_relaxed);
    while (have) {
        uint64_t t = have < (uint64_t)n ? have : (uint64_t)n;
        if (atomic_compare_exchange_weak_explicit(w->budget, &have, have - t, memory_order_relaxed,
                                                  memory_order_relaxed))
            return (int)t;
    }
    return 0;
}

/* Queue what the client may send now; returns messages queued. */
static int refill(struct mworker *w, struct mclient *c, int sending)
{
    const struct mq_config *cfg = w->cfg;
    if (!sending || c->sub)
        return 0;
    if (cfg->qos == 0) {
        if (c->round_t)
            return 0;
        int n = take(w, cfg->window);
        if (!n)
            return 0;
        for (int i = 0; i < n; i++)
            if (publish(w, c, 0))
                return fail(w, -ENOMEM, "out of memory"), 0;
        if (reserve(c, 2))
            return fail(w, -ENOMEM, "out of memory"), 0;
        c->obuf[c->olen++] = (char)0xC0, c->obuf[c->olen++] = 0;
        c->round_t = now_ns();
        c->inflight = n;
        return n;
    }
    int queued = 0;
    uint64_t t = now_ns();
    while (c->inflight < cfg->window) {
        int id = c->next_id;
        if (c->sent[id])
            break; /* acknowledged out of order: wait for this one */
        if (!take(w, 1))
            break;
        if (publish(w, c, id))
            return fail(w, -ENOMEM, "out of memory"), queued;
        c->sent[id] = t;
        c->inflight++;
        queued++;
        c->next_id = id == cfg->window ? 1 : id + 1;
    }
    return queued;
}

static void done_msgs(struct mworker *w, uint64_t n, uint64_t lat, uint64_t t)
{
    w->messages += n;
    w->hist[hist_index(lat)] += n;
    w->last = t;
}

/* A subscriber's packet: a PUBLISH (acknowledged as its QoS asks, its latency
 * filed), a PUBREL (PUBCOMP), a PINGRESP. 0 or -1 (failed). */
static int deliver(struct mworker *w, struct mclient *c, const unsigned char *p, size_t hl, size_t len, uint64_t t)
{
    int type = p[0] >> 4, qos = (p[0] >> 1) & 3;
    const unsigned char *b = p + hl;
    if (type == 6 && len == 2) /* PUBREL: PUBCOMP */
        return put_ack(c, 7, b[0] << 8 | b[1]) ? fail(w, -ENOMEM, "out of memory") : 0;
    if (type != 3)
        return fail(w, -EPROTO, "unexpected packet type %d (%zu bytes) to a subscriber", type, len);
    if (len < 2 || qos == 3)
        return fail(w, -EPROTO, "a malformed PUBLISH to a subscriber");
    size_t tl = (size_t)(b[0] << 8 | b[1]), at = 2 + tl;
    int id = 0;
    if (qos) {
        if (at + 2 > len)
            return fail(w, -EPROTO, "a PUBLISH without its packet id");
        id = b[at] << 8 | b[at + 1];
        at += 2;
    }
    if (at > len)
        return fail(w, -EPROTO, "a PUBLISH shorter than its topic");
    if (len - at >= 8 && (size_t)w->cfg->msg_size >= 8) {
        uint64_t sent;
        memcpy(&sent, b + at, 8);
        if (sent && sent <= t)
            w->dhist[hist_index(t - sent)]++;
    }
    w->delivered++;
    w->last_delivery = t;
    if (qos && put_ack(c, qos == 1 ? 4 : 5, id))
        return fail(w, -ENOMEM, "out of memory");
    return 0;
}

/* Parse the complete packets in c->rbuf. 0, or -1 (failed). */
static int parse(struct mworker *w, struct mclient *c)
{
    size_t at = 0;
    while (c->rlen - at >= 2) {
        unsigned char *p = c->rbuf + at;
        size_t len = 0, i = 1;
        int more = 1;
        for (int shift = 0; more && i < 5; shift += 7, i++) {
            if (i >= c->rlen - at)
                goto incomplete;
            len |= (size_t)(p[i] & 0x7f) << shift;
            more = p[i] & 0x80;
        }
        if (more || len > (c->sub ? RBUF - 8 : MAX_PACKET))
            return fail(w, -EPROTO, "a packet from the broker with a bad remaining length");
        if (c->rlen - at < i + len)
            break;
        uint64_t t = now_ns();
        int type = p[0] >> 4;
        if (c->sub) {
            if (deliver(w, c, p, i, len, t))
                return -1;
        } else if (type == 5 && len == 2 && w->cfg->qos == 2) { /* PUBREC: PUBREL */
            int id = p[i] << 8 | p[i + 1];
            if (id < 1 || id > w->cfg->window || !c->sent[id] || c->released[id])
                return fail(w, -EPROTO, "PUBREC for packet id %d, which is not in flight", id);
            c->released[id] = 1;
            if (put_ack(c, 6, id))
                return fail(w, -ENOMEM, "out of memory");
        } else if (type == 7 && len == 2 && w->cfg->qos == 2) { /* PUBCOMP */
            int id = p[i] << 8 | p[i + 1];
            if (id < 1 || id > w->cfg->window || !c->released[id])
                return fail(w, -EPROTO, "PUBCOMP for packet id %d, which was not released", id);
            done_msgs(w, 1, t - c->sent[id], t);
            c->sent[id] = 0;
            c->released[id] = 0;
            c->inflight--;
        } else if (type == 4 && len == 2 && w->cfg->qos == 1) { /* PUBACK */
            int id = p[i] << 8 | p[i + 1];
            if (id < 1 || id > w->cfg->window || !c->sent[id])
                return fail(w, -EPROTO, "PUBACK for packet id %d, which is not in flight", id);
            done_msgs(w, 1, t - c->sent[id], t);
            c->sent[id] = 0;
            c->inflight--;
        } else if (type == 13 && len == 0) { /* PINGRESP */
            if (w->cfg->qos == 0 && c->round_t) {
                done_msgs(w, (uint64_t)c->inflight, t - c->round_t, t);
                c->round_t = 0;
                c->inflight = 0;
            }
        } else {
            return fail(w, -EPROTO, "unexpected packet type %d (%zu bytes) from the broker", type, len);
        }
        at += i + len;
    }
incomplete:
    memmove(c->rbuf, c->rbuf + at, c->rlen - at);
    c->rlen -= at;
    return 0;
}

static void *worker_main(void *arg)
{
    struct mworker *w = arg;
    const struct mq_config *cfg = w->cfg;
    struct pollfd *pf = calloc((size_t)w->n, sizeof *pf);
    if (!pf) {
        fail(w, -ENOMEM, "out of memory");
        return NULL;
    }
    w->first = now_ns();
    for (;;) {
        uint64_t t = now_ns();
        int sending = !(cfg->stop && *cfg->stop) && (!w->deadline || t < w->deadline) && !w->fail &&
                      (!cfg->messages || atomic_load_explicit(w->budget, memory_order_relaxed) > 0);
        int out = 0;
        for (int i = 0; i < w->n; i++) {
            struct mclient *c = &w->c[i];
            refill(w, c, sending);
            out += c->inflight > 0;
            pf[i] = (struct pollfd){.fd = c->fd, .events = POLLIN | (c->olen > c->ooff ? POLLOUT : 0)};
        }
        int subs = 0;
        for (int i = 0; i < w->n; i++)
            subs += w->c[i].sub;
        uint64_t quiet = t - (w->last_delivery > w->stopped ? w->last_delivery : w->stopped);
        if (!sending && !w->stopped)
            w->stopped = t;
        if (w->fail || (!sending && !out && (!subs || quiet > 500000000ull)))
            break;
        if (!sending && t > w->stopped + 5000000000ull)
            break; /* replies that never came: give up on them */
        if (poll(pf, (nfds_t)w->n, 20) < 0 && errno != EINTR) {
            fail(w, -errno, "poll: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < w->n && !w->fail; i++) {
            struct mclient *c = &w->c[i];
            if (pf[i].revents & POLLOUT) {
                ssize_t k = send(c->fd, c->obuf + c->ooff, c->olen - c->ooff, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k > 0)
                    c->ooff += (size_t)k;
                else if (k < 0 && errno != EAGAIN && errno != EINTR)
                    fail(w, -errno, "send to the broker: %s", strerror(errno));
            }
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t k = recv(c->fd, c->rbuf + c->rlen, RBUF - c->rlen, MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
                    fail(w, -ECONNRESET, "the broker closed a connection");
                else if (k > 0) {
                    c->rlen += (size_t)k;
                    parse(w, c);
                }
            }
        }
    }
    free(pf);
    return NULL;
}

/* Connect c and do the CONNECT/CONNACK exchange (blocking, 2 s), then non-blocking. */
static int connect_client(const struct mq_config *cfg, struct mclient *c, const char *cid, char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port)};
    inet_pton(AF_INET, cfg->host, &sa.sin_addr);
    struct timeval tv = {2, 0};
    int one = 1;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa)) {
        snprintf(err, errlen, "connect to %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        return -errno;
    }
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    unsigned char p[128];
    size_t idl = strlen(cid), at = 0;
    p[at++] = 0x10;
    at += put_len(p + at, 10 + 2 + idl);
    memcpy(p + at, "\0\4MQTT\4\2\0\x3c", 10), at += 10; /* level 4, clean session, keepalive 60 s */
    p[at++] = (unsigned char)(idl >> 8), p[at++] = (unsigned char)idl;
    memcpy(p + at, cid, idl), at += idl;
    unsigned char ack[4];
    if (send(c->fd, p, at, MSG_NOSIGNAL) != (ssize_t)at || recv(c->fd, ack, 4, MSG_WAITALL) != 4) {
        snprintf(err, errlen, "MQTT CONNECT to %s:%d: no CONNACK (%s)", cfg->host, cfg->port, strerror(errno));
        return -EPROTO;
    }
    if (ack[0] != 0x20 || ack[1] != 2 || ack[3] != 0) {
        snprintf(err, errlen, "MQTT CONNECT to %s:%d refused (CONNACK %02x %02x %02x %02x)", cfg->host, cfg->port,
                 ack[0], ack[1], ack[2], ack[3]);
        return -ECONNREFUSED;
    }
    if (c->sub) { /* SUBSCRIBE t/# and its SUBACK */
        unsigned char sp[] = {0x82, 8, 0, 1, 0, 3, 't', '/', '#', (unsigned char)cfg->sub_qos};
        unsigned char sa[5];
        if (send(c->fd, sp, sizeof sp, MSG_NOSIGNAL) != (ssize_t)sizeof sp ||
            recv(c->fd, sa, 5, MSG_WAITALL) != 5 || sa[0] != 0x90 || sa[4] > 2) {
            snprintf(err, errlen, "MQTT SUBSCRIBE to %s:%d: no SUBACK granting it", cfg->host, cfg->port);
            return -EPROTO;
        }
    }
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    return 0;
}

#define BAD(...) return snprintf(out->error, sizeof out->error, __VA_ARGS__), -EINVAL

int mq_run(const struct mq_config *cfg, struct mq_result *out)
{
    memset(out, 0, sizeof *out);
    struct in_addr a;
    if (!cfg->host || inet_pton(AF_INET, cfg->host, &a) != 1)
        BAD("host: expected an IPv4 address, got '%s'", cfg->host ? cfg->host : "");
    if (cfg->port < 1 || cfg->port > 65535) BAD("port: expected 1..65535, got %d", cfg->port);
    if (cfg->threads < 1 || cfg->threads > 256) BAD("threads: expected 1..256, got %d", cfg->threads);
    if (cfg->conns < cfg->threads || cfg->conns > 10000)
        BAD("conns (clients): expected %d..10000, got %d", cfg->threads, cfg->conns);
    if (cfg->qos < 0 || cfg->qos > 2) BAD("qos: expected 0, 1 or 2, got %d", cfg->qos);
    if (cfg->sub_qos < 0 || cfg->sub_qos > 2) BAD("subscriber qos: expected 0, 1 or 2, got %d", cfg->sub_qos);
    if (cfg->subscribers < 0 || cfg->subscribers > 10000)
        BAD("subscribers: expected 0..10000, got %d", cfg->subscribers);
    if (cfg->window < 1 || cfg->window > 65535) BAD("window: expected 1..65535, got %d", cfg->window);
    if (cfg->msg_size < 0 || cfg->msg_size > 65536) BAD("message size: expected 0..65536, got %d", cfg->msg_size);
    if (cfg->topics < 1 || cfg->topics > 1000000) BAD("topics: expected 1..1000000, got %d", cfg->topics);
    if (!(cfg->duration > 0) && !cfg->messages) BAD("give a duration or a message count");
    int nt = cfg->threads, rc = 0, started = 0;
    struct mworker *ws = calloc((size_t)nt, sizeof *ws);
    char *payload = malloc((size_t)cfg->msg_size + 1);
    _Atomic uint64_t budget = cfg->messages;
    if (!ws || !payload) {
        free(ws);
        free(payload);
        BAD("out of memory");
    }
    for (int i = 0; i < cfg->msg_size; i++)
        payload[i] = (char)('a' + i % 26);
    uint64_t t0 = now_ns();
    int nsub = 0;
    for (int t = 0, next = 0; t < nt && !rc; t++) {
        struct mworker *w = &ws[t];
        w->cfg = cfg, w->budget = &budget, w->payload = payload;
        int pubs = cfg->conns / nt + (t < cfg->conns % nt), subs = cfg->subscribers / nt + (t < cfg->subscribers % nt);
        w->n = pubs + subs;
        w->deadline = cfg->duration > 0 ? t0 + (uint64_t)(cfg->duration * 1e9) : 0;
        w->c = calloc((size_t)w->n, sizeof *w->c);
        if (!w->c) {
            rc = -ENOMEM;
            snprintf(out->error, sizeof out->error, "out of memory");
            break;
        }
        for (int i = 0; i < w->n; i++)
            w->c[i].fd = -1;
        /* subscribers first: every message published finds them subscribed */
        for (int i = pubs; i < w->n && !rc; i++, nsub++) {
            struct mclient *c = &w->c[i];
            c->sub = 1;
            char cid[64];
            snprintf(cid, sizeof cid, "kvbench-%llu-s%d", (unsigned long long)cfg->seed, nsub);
            rc = connect_client(cfg, c, cid, out->error, sizeof out->error);
        }
        for (int i = 0; i < pubs && !rc; i++, next++) {
            struct mclient *c = &w->c[i];
            c->tlen = (size_t)snprintf(c->topic, sizeof c->topic, "t/%d", next % cfg->topics);
            c->next_id = 1;
            if (cfg->qos && (!(c->sent = calloc((size_t)cfg->window + 1, sizeof *c->sent)) ||
                             !(c->released = calloc((size_t)cfg->window + 1, 1)))) {
                rc = -ENOMEM;
                snprintf(out->error, sizeof out->error, "out of memory");
                break;
            }
            char cid[64];
            snprintf(cid, sizeof cid, "kvbench-%llu-%d", (unsigned long long)cfg->seed, next);
            rc = connect_client(cfg, c, cid, out->error, sizeof out->error);
        }
    }
    for (int t = 0; t < nt && !rc; t++, started++)
        if (pthread_create(&ws[t].th, NULL, worker_main, &ws[t])) {
            rc = -EAGAIN;
            snprintf(out->error, sizeof out->error, "cannot start a thread");
        }
    for (int t = 0; t < started; t++)
        pthread_join(ws[t].th, NULL);
    uint64_t first = 0, last = 0, dlast = 0, *hist = calloc(HIST_LEN, sizeof *hist);
    uint64_t *dhist = calloc(HIST_LEN, sizeof *dhist);
    for (int t = 0; t < nt; t++) {
        struct mworker *w = &ws[t];
        out->messages += w->messages;
        if (w->first && (!first || w->first < first)) first = w->first;
        if (w->last > last) last = w->last;
        if (!rc && w->fail) {
            rc = w->fail;
            snprintf(out->error, sizeof out->error, "%s", w->error);
        }
        for (unsigned i = 0; hist && i < HIST_LEN; i++)
            hist[i] += w->hist[i];
        for (unsigned i = 0; dhist && i < HIST_LEN; i++)
            dhist[i] += w->dhist[i];
        out->delivered += w->delivered;
        if (w->last_delivery > dlast) dlast = w->last_delivery;
        for (int i = 0; w->c && i < w->n; i++) {
            if (w->c[i].fd >= 0) {
                send(w->c[i].fd, "\xe0\0", 2, MSG_NOSIGNAL | MSG_DONTWAIT); /* DISCONNECT */
                close(w->c[i].fd);
            }
            free(w->c[i].obuf);
            free(w->c[i].sent);
            free(w->c[i].released);
        }
        free(w->c);
    }
    out->elapsed = last > first ? (double)(last - first) / 1e9 : 0;
    out->throughput = out->elapsed > 0 ? (double)out->messages / out->elapsed : 0;
    if (out->messages && hist) {
        uint64_t clamp = 100ull * 1000000000ull;
        out->lat_p50_us = percentile(hist, out->messages, 0.50, clamp);
        out->lat_p99_us = percentile(hist, out->messages, 0.99, clamp);
    }
    if (out->delivered && dhist) {
        uint64_t clamp = 100ull * 1000000000ull, n = 0;
        for (unsigned i = 0; i < HIST_LEN; i++)
            n += dhist[i];
        double el = dlast > first ? (double)(dlast - first) / 1e9 : 0;
        out->deliver_throughput = el > 0 ? (double)out->delivered / el : 0;
        if (n) {
            out->dlat_p50_us = percentile(dhist, n, 0.50, clamp);
            out->dlat_p99_us = percentile(dhist, n, 0.99, clamp);
            out->dlat_p999_us = percentile(dhist, n, 0.999, clamp);
        }
    }
    free(dhist);
    free(hist);
    free(payload);
    free(ws);
    return rc;
}
