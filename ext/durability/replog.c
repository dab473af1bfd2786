/* replog.c - log sender and receiver threads, FETCH for recovery (see replog.h).
 * Threads: the sender thread owns its socket and buffers; the receiver thread owns
 * its listener and connections; stats are read under each one's stat_lock.
 * Frames are untrusted: magic, type, length (<= MAX_FRAME) and CRC32C are checked
 * before a payload is used; a peer that breaks the protocol is disconnected. */
#define _GNU_SOURCE
#include "durability/replog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "durability/wal.h"

#define RL_MAGIC 0x5052564bu /* "KVRP" */
#define RL_VERSION 1
#define HDR 32
#define MAX_FRAME (1u << 30)
#define SEG_LIMIT (64u << 20)
#define MAX_PEERS 16
#define MAX_BATCH_BYTES (16u << 20) /* a BATCH frame stops gathering records past this */

enum { F_HELLO = 1, F_HELLO_ACK, F_BATCH, F_ACK, F_FETCH, F_FILE, F_END, F_ERROR };

struct frame {
    uint32_t type, len;
    uint64_t a, b;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Wait until fd is ready for ev or the timeout (microseconds: the ship interval
 * is 100 us). Returns 1 ready, 0 timeout, -errno. */
static int wait_fd_us(int fd, short ev, uint64_t timeout_us)
{
    struct pollfd p = {.fd = fd, .events = ev};
    struct timespec ts = {(time_t)(timeout_us / 1000000), (long)(timeout_us % 1000000) * 1000};
    int r;
    do
        r = ppoll(&p, 1, &ts, NULL);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL | POLLHUP)) && !(p.revents & ev))
        return -ECONNRESET;
    return r;
}

/* Send all n bytes by the absolute deadline (ms, CLOCK_MONOTONIC): a peer that
 * reads one byte a second must not keep a frame going for ever. */
static int wait_fd(int fd, short ev, int timeout_ms) { return wait_fd_us(fd, ev, (uint64_t)timeout_ms * 1000); }

static int send_all(int fd, const void *buf, size_t n, uint64_t deadline)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN)
            return -errno;
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        int r = wait_fd(fd, POLLOUT, (int)(deadline - now));
        if (r <= 0)
            return r ? r : -ETIMEDOUT;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n, int timeout_ms)
{
    char *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return -errno;
        int w = wait_fd(fd, POLLIN, timeout_ms);
        if (w <= 0)
            return w ? w : -ETIMEDOUT;
    }
    return 0;
}

static int send_frame(int fd, uint32_t type, uint64_t a, uint64_t b, const void *payload, size_t len,
                      int timeout_ms)
{
    unsigned char h[HDR];
    put32(h, RL_MAGIC);
    put32(h + 4, type);
    put32(h + 8, (uint32_t)len);
    put32(h + 12, len ? crc32c(0, payload, len) : 0);
    put64(h + 16, a);
    put64(h + 24, b);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms; /* for the whole frame */
    int rc = send_all(fd, h, HDR, deadline);
    if (!rc && len)
        rc = send_all(fd, payload, len, deadline);
    return rc;
}

/* The largest payload each frame type may carry: checked before any allocation. */
static uint32_t max_len(uint32_t type)
{
    switch (type) {
    case F_HELLO:
    case F_FETCH:
    case F_END:
        return 16;
    case F_HELLO_ACK:
    case F_ACK:
        return 0;
    case F_BATCH:
        return MAX_FRAME; /* a batch stops at MAX_BATCH_BYTES, but one record may be 1 GiB */
    case F_ERROR:
        return 4096;
    default: /* F_FILE: a whole segment, only ever read by a recovering node */
        return MAX_FRAME;
    }
}

/* Read one frame; the payload replaces pl's contents. */
static int recv_frame(int fd, struct frame *f, struct kvbuf *pl, int timeout_ms)
{
    unsigned char h[HDR];
    int rc = recv_all(fd, h, HDR, timeout_ms);
    if (rc)
        return rc;
    f->type = get32(h + 4);
    f->len = get32(h + 8);
    f->a = get64(h + 16);
    f->b = get64(h + 24);
    if (get32(h) != RL_MAGIC || f->type < F_HELLO || f->type > F_ERROR || f->len > max_len(f->type))
        return -EPROTO;
    pl->len = 0;
    if (f->len) {
        if (kvbuf_reserve(pl, f->len))
            return -ENOMEM;
        if ((rc = recv_all(fd, pl->p, f->len, timeout_ms)))
            return rc;
        pl->len = f->len;
        if (crc32c(0, pl->p, f->len) != get32(h + 12))
            return -EBADMSG;
    }
    return 0;
}

static int connect_to(const char *host, int port, int timeout_ms, char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "peer address '%s' is not an IPv4 address", host);
        return -EINVAL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS) {
        rc = -errno;
    } else {
        int w = wait_fd(fd, POLLOUT, timeout_ms);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (w <= 0)
            rc = w ? w : -ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr)
            rc = -(soerr ? soerr : errno);
    }
    if (rc) {
        snprintf(err, errlen, "cannot connect to peer %s:%d: %s", host, port, strerror(-rc));
        close(fd);
        return rc;
    }
    return fd;
}

/* Length of the record at p if it is intact and fits in n bytes, else 0. */
static size_t rec_len(const unsigned char *p, size_t n)
{
    size_t l = wal_rec_len(p, n);
    return l <= n ? l : 0;
}

static uint64_t rec_lsn(const unsigned char *p, size_t l) { return wal_rec_lsn(p, l); }

/* ======================================================================= sender */

struct rl_sender {
    struct rl_sender_config cfg;
    char host[64];
    struct wal *w;
    pthread_t th;
    _Atomic int stop;
    int fd;
    struct kvbuf ship, pend, cat, pl;
    uint64_t pend_first, pend_last;
    uint64_t degraded_at;      /* appended LSN when the fallback to local sync began, 0 = not degraded */
    int marked;                /* LOCAL-COMPLETE written */
    pthread_mutex_t stat_lock; /* guards st */
    struct rl_sender_stats st;
};

static void s_error(struct rl_sender *s, const char *msg)
{
    pthread_mutex_lock(&s->stat_lock);
    snprintf(s->st.last_error, sizeof s->st.last_error, "%s", msg);
    pthread_mutex_unlock(&s->stat_lock);
}

/* <log dir>/LOCAL-COMPLETE exists only while every acknowledged record is on
 * the local disk (degraded mode, after its first sync): a restart while the peer
 * is still away may then trust the local log alone. */
static void marker_path(struct rl_sender *s, char *dst, size_t n)
{
    snprintf(dst, n, "%s/LOCAL-COMPLETE", wal_dir(s->w));
}

static void sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static void marker_remove(struct rl_sender *s)
{
    char path[4200];
    marker_path(s, path, sizeof path);
    if (!unlink(path))
        sync_dir(wal_dir(s->w));
    s->marked = 0;
}

/* In degraded mode: once the local disk holds everything appended when the
 * fallback began, write the marker (synced, with its directory entry). */
static void marker_maybe_write(struct rl_sender *s, int connected)
{
    if (connected || s->marked || !s->degraded_at || wal_synced_lsn(s->w) < s->degraded_at)
        return;
    char path[4200];
    marker_path(s, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    char txt[32];
    int n = snprintf(txt, sizeof txt, "%" PRIu64 "\n", s->degraded_at);
    if (write(fd, txt, (size_t)n) == n && !fsync(fd)) {
        sync_dir(wal_dir(s->w));
        s->marked = 1;
    }
    close(fd);
}

static void s_set(struct rl_sender *s, int connected, int degraded)
{
    pthread_mutex_lock(&s->stat_lock);
    if (s->st.connected && !connected)
        s->st.disconnects++;
    if (!s->st.connected && connected)
        s->st.connects++;
    s->st.connected = connected;
    int was = s->st.degraded;
    s->st.degraded = degraded;
    pthread_mutex_unlock(&s->stat_lock);
    if (!connected && degraded) /* every loss of the peer: the marker must cover all appended */
        s->degraded_at = wal_appended_lsn(s->w) ? wal_appended_lsn(s->w) : 1;
    if (was != degraded) {
        if (degraded) {
            s->degraded_at = wal_appended_lsn(s->w) ? wal_appended_lsn(s->w) : 1;
        } else {
            marker_remove(s); /* before acks come from the peer's memory again */
            s->degraded_at = 0;
        }
        wal_set_sync(s->w, degraded); /* without the peer, every group syncs locally */
    }
}

/* Send the records in buf[0..n) as BATCH frames of at most max_batch_records. */
static int ship_records(struct rl_sender *s, const unsigned char *buf, size_t n, uint64_t *sent)
{
    size_t off = 0;
    while (off < n) {
        size_t start = off;
        uint64_t first = 0, last = 0, cnt = 0;
        while (off < n && cnt < s->cfg.max_batch_records && off - start < MAX_BATCH_BYTES) {
            size_t l = rec_len(buf + off, n - off);
            if (!l)
                return -EPROTO;
            if (!first)
                first = rec_lsn(buf + off, l);
            last = rec_lsn(buf + off, l);
            off += l;
            cnt++;
        }
        int rc = send_frame(s->fd, F_BATCH, first, last, buf + start, off - start, (int)s->cfg.timeout_ms);
        if (rc)
            return rc;
        *sent = last;
        pthread_mutex_lock(&s->stat_lock);
        s->st.batches++;
        s->st.records += cnt;
        s->st.bytes += off - start;
        s->st.sent_lsn = last;
        pthread_mutex_unlock(&s->stat_lock);
    }
    return 0;
}

/* Drop the records below lsn from the front of pend. */
static void pend_skip_below(struct rl_sender *s, uint64_t lsn)
{
    size_t off = 0;
    while (off < s->pend.len) {
        size_t l = rec_len((unsigned char *)s->pend.p + off, s->pend.len - off);
        if (!l || rec_lsn((unsigned char *)s->pend.p + off, l) >= lsn)
            break;
        off += l;
    }
    kvbuf_consume(&s->pend, off);
    if (s->pend.len) {
        size_t l = rec_len((unsigned char *)s->pend.p, s->pend.len);
        s->pend_first = rec_lsn((unsigned char *)s->pend.p, l);
    }
}

static void *sender_main(void *arg)
{
    struct rl_sender *s = arg;
    char err[256];
    uint64_t acked = 0, sent = 0, next = 0; /* next: the LSN the peer needs next (0 = unknown) */
    uint64_t unacked_since = 0, next_ship = 0;
    int connected = 0;
    while (!atomic_load_explicit(&s->stop, memory_order_acquire)) {
        marker_maybe_write(s, connected);
        if (!connected) {
            /* Records stay in the local log; after reconnecting they are read back. */
            uint64_t first, last = wal_take_ship(s->w, &s->ship, &first);
            (void)last;
            s->pend.len = 0;
            int fd = connect_to(s->host, s->cfg.port, (int)s->cfg.timeout_ms, err, sizeof err);
            if (fd < 0) {
                s_error(s, err);
                usleep(100000);
                continue;
            }
            s->fd = fd;
            struct frame f = {0};
            int rc = send_frame(fd, F_HELLO, RL_VERSION, 0, s->cfg.node_id, 16, (int)s->cfg.timeout_ms);
            if (!rc)
                rc = recv_frame(fd, &f, &s->pl, (int)s->cfg.timeout_ms);
            if (!rc && f.type != F_HELLO_ACK)
                rc = -EPROTO;
            if (rc) {
                snprintf(err, sizeof err, "handshake with peer %s:%d failed: %s", s->host, s->cfg.port,
                         f.type == F_ERROR ? "peer refused" : strerror(-rc));
                s_error(s, err);
                close(fd);
                s->fd = -1;
                usleep(100000);
                continue;
            }
            struct wal_stats ws;
            wal_get_stats(s->w, &ws);
            uint64_t appended = ws.appended_lsn;
            if (f.a > appended) {
                snprintf(err, sizeof err,
                         "peer %s:%d holds this node's log up to LSN %" PRIu64 " but the local log ends at %"
                         PRIu64 ": recover from the peer first (--from-peer); not replicating",
                         s->host, s->cfg.port, f.a, appended);
                s_error(s, err);
                close(fd);
                s->fd = -1;
                sleep(1);
                continue;
            }
            connected = 1;
            s_error(s, "");
            /* From here on acks come from the peer's memory: the local log is no
             * longer known complete, so the marker goes before the first ack counts. */
            marker_remove(s);
            acked = sent = f.a;
            next = f.a + 1;
            unacked_since = 0;
            wal_publish_durable(s->w, acked);
            s_set(s, 1, 1); /* still degraded until caught up */
        }
        /* Until the next ship time, handle acks the moment they arrive: a reply
         * waits for its ack, so an ack read late is latency added to every write. */
        uint64_t now = now_us();
        if (next_ship <= now)
            next_ship = now + s->cfg.interval_us;
        int w = wait_fd_us(s->fd, POLLIN, next_ship - now);
        int rc = 0;
        while (w > 0 && !rc) {
            struct frame f;
            rc = recv_frame(s->fd, &f, &s->pl, (int)s->cfg.timeout_ms);
            if (!rc && f.type == F_ACK && f.a > sent) {
                rc = -EPROTO; /* acknowledging what was never sent: a confused peer */
            } else if (!rc && f.type == F_ACK && f.a > acked) {
                acked = f.a;
                wal_publish_durable(s->w, acked);
                unacked_since = acked < sent ? now_ms() : 0;
            } else if (!rc && f.type != F_ACK) {
                rc = -EPROTO;
            }
            if (!rc)
                w = wait_fd(s->fd, POLLIN, 0);
        }
        if (!rc && w < 0)
            rc = w;
        if (!rc && now_us() < next_ship) { /* woken by acks: not yet time to ship */
            pthread_mutex_lock(&s->stat_lock);
            s->st.acked_lsn = acked;
            pthread_mutex_unlock(&s->stat_lock);
            continue;
        }
        next_ship += s->cfg.interval_us;
        /* Gather what was appended meanwhile. */
        uint64_t first, last = wal_take_ship(s->w, &s->ship, &first);
        if (last) {
            if (!s->pend.len)
                s->pend_first = first;
            if (!rc && kvbuf_append(&s->pend, s->ship.p, s->ship.len))
                rc = -ENOMEM;
            s->pend_last = last;
        }
        if (!rc && s->pend.len && s->pend_first < next)
            pend_skip_below(s, next);
        /* Catch up from the local segment files when the peer needs records we no
         * longer hold in memory (after a reconnect). */
        if (!rc && (!s->pend.len || s->pend_first > next)) {
            uint64_t upto = s->pend.len ? s->pend_first - 1 : wal_written_lsn(s->w);
            if (upto >= next && wal_written_lsn(s->w) >= upto) {
                s->cat.len = 0;
                int64_t got = wal_read_range(wal_dir(s->w), next, upto, 8u << 20, &s->cat);
                if (got < 0) {
                    rc = (int)got;
                } else if (got > 0) {
                    rc = ship_records(s, (unsigned char *)s->cat.p, s->cat.len, &sent);
                    pthread_mutex_lock(&s->stat_lock);
                    s->st.catchup_records += (uint64_t)got - next + 1;
                    pthread_mutex_unlock(&s->stat_lock);
                    next = (uint64_t)got + 1;
                    if (!unacked_since)
                        unacked_since = now_ms();
                }
            }
        }
        if (!rc && s->pend.len && s->pend_first == next) {
            rc = ship_records(s, (unsigned char *)s->pend.p, s->pend.len, &sent);
            next = s->pend_last + 1;
            s->pend.len = 0;
            if (!rc && !unacked_since)
                unacked_since = now_ms();
        }
        /* Caught up and acknowledged: the peer's memory is the durability again. */
        if (!rc && acked == sent && !s->pend.len && next > wal_written_lsn(s->w)) {
            pthread_mutex_lock(&s->stat_lock);
            int deg = s->st.degraded;
            pthread_mutex_unlock(&s->stat_lock);
            if (deg)
                s_set(s, 1, 0);
        }
        if (!rc && unacked_since && acked < sent && now_ms() - unacked_since > s->cfg.timeout_ms) {
            snprintf(err, sizeof err, "peer %s:%d did not acknowledge LSN %" PRIu64 " within %u ms",
                     s->host, s->cfg.port, sent, s->cfg.timeout_ms);
            s_error(s, err);
            rc = -ETIMEDOUT;
        }
        if (rc) {
            if (rc != -ETIMEDOUT) {
                snprintf(err, sizeof err, "replication to %s:%d: %s", s->host, s->cfg.port, strerror(-rc));
                s_error(s, err);
            }
            close(s->fd);
            s->fd = -1;
            connected = 0;
            s_set(s, 0, 1);
        }
        pthread_mutex_lock(&s->stat_lock);
        s->st.acked_lsn = acked;
        pthread_mutex_unlock(&s->stat_lock);
    }
    if (s->fd >= 0)
        close(s->fd);
    return NULL;
}

int rl_sender_start(struct rl_sender **out, struct wal *w, const struct rl_sender_config *cfg,
                    char *err, size_t errlen)
{
    struct rl_sender *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->cfg = *cfg;
    snprintf(s->host, sizeof s->host, "%s", cfg->host);
    s->cfg.host = s->host;
    if (!s->cfg.interval_us)
        s->cfg.interval_us = 100;
    if (!s->cfg.max_batch_records)
        s->cfg.max_batch_records = 65536;
    if (!s->cfg.timeout_ms)
        s->cfg.timeout_ms = 1000;
    s->w = w;
    s->fd = -1;
    s->st.degraded = 1; /* until the peer has acknowledged everything */
    s->degraded_at = wal_appended_lsn(w) ? wal_appended_lsn(w) : 1;
    pthread_mutex_init(&s->stat_lock, NULL);
    wal_set_sync(w, 1);
    int rc = pthread_create(&s->th, NULL, sender_main, s);
    if (rc) {
        snprintf(err, errlen, "cannot start the log sender: %s", strerror(rc));
        free(s);
        return -rc;
    }
    pthread_setname_np(s->th, "kv-logsend");
    *out = s;
    return 0;
}

void rl_sender_stop(struct rl_sender *s)
{
    if (!s)
        return;
    atomic_store_explicit(&s->stop, 1, memory_order_release);
    pthread_join(s->th, NULL);
    kvbuf_free(&s->ship);
    kvbuf_free(&s->pend);
    kvbuf_free(&s->cat);
    kvbuf_free(&s->pl);
    pthread_mutex_destroy(&s->stat_lock);
    free(s);
}

void rl_sender_get_stats(struct rl_sender *s, struct rl_sender_stats *st)
{
    pthread_mutex_lock(&s->stat_lock);
    *st = s->st;
    pthread_mutex_unlock(&s->stat_lock);
}

/* ===================================================================== receiver */

struct rconn {
    int fd;
    int has_id;
    int dead;                /* replaced by a newer connection of the same node: close */
    char hex[33];
    char dir[4096];
    int dirfd, segfd;
    uint64_t seg_size, held;
    int dirty;
};

struct rl_receiver {
    int lfd, evfd, port;
    char *peer_dir;
    uint32_t sync_ms;
    pthread_t th;
    _Atomic int stop;
    struct rconn conns[MAX_PEERS];
    int nconns;
    struct kvbuf pl;
    pthread_mutex_t stat_lock;
    struct rl_receiver_stats st;
};

static void rconn_close(struct rl_receiver *r, int i)
{
    struct rconn *c = &r->conns[i];
    if (c->segfd >= 0) {
        fdatasync(c->segfd);
        close(c->segfd);
    }
    if (c->dirfd >= 0)
        close(c->dirfd);
    close(c->fd);
    r->conns[i] = r->conns[--r->nconns];
}

static void hexid(const unsigned char *id, char *hex)
{
    for (int i = 0; i < 16; i++)
        sprintf(hex + 2 * i, "%02x", id[i]);
}

/* Open (and check) the stored log of node hex: held = its last valid LSN. */
static int open_peer_log(struct rl_receiver *r, struct rconn *c)
{
    snprintf(c->dir, sizeof c->dir, "%s/%s", r->peer_dir, c->hex);
    mkdir(r->peer_dir, 0755);
    if (mkdir(c->dir, 0755) && errno != EEXIST)
        return -errno;
    c->dirfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dirfd < 0)
        return -errno;
    struct wal_recovery rec;
    char err[512];
    int rc = wal_recover(NULL, c->dir, 0, 1, &rec, err, sizeof err);
    if (rc)
        return rc;
    c->held = rec.last_lsn;
    c->segfd = -1; /* a new segment starts with the next batch */
    return 0;
}

/* Store the records of a BATCH [first, last]: skip what is already held. */
static int store_batch(struct rl_receiver *r, struct rconn *c, const struct frame *f)
{
    const unsigned char *p = (unsigned char *)r->pl.p;
    size_t n = r->pl.len, off = 0;
    if (f->a > c->held + 1)
        return -EPROTO; /* a gap: the sender must catch us up from c->held + 1 */
    uint64_t nrec = 0;
    while (off < n) { /* validate every record; find the first one not yet held */
        size_t l = rec_len(p + off, n - off);
        if (!l || !wal_rec_ok(p + off, l))
            return -EBADMSG;
        if (rec_lsn(p + off, l) <= c->held) {
            off += l;
            continue;
        }
        break;
    }
    size_t start = off;
    uint64_t last = c->held, first = 0;
    while (off < n) {
        size_t l = rec_len(p + off, n - off);
        if (!l || !wal_rec_ok(p + off, l))
            return -EBADMSG;
        uint64_t lsn = rec_lsn(p + off, l);
        if (lsn != last + 1)
            return -EPROTO;
        if (!first)
            first = lsn;
        last = lsn;
        off += l;
        nrec++;
    }
    if (last != f->b || (nrec && first < f->a))
        return -EPROTO; /* the frame's LSN range must be what its records carry */
    if (!nrec)
        return 0;
    if (c->segfd < 0 || c->seg_size >= SEG_LIMIT) {
        char err[256];
        if (c->segfd >= 0) {
            fdatasync(c->segfd);
            close(c->segfd);
        }
        c->segfd = wal_seg_create(c->dir, c->dirfd, first, err, sizeof err);
        if (c->segfd < 0)
            return c->segfd;
        c->seg_size = WAL_SEG_HDR;
    }
    int wrc = wal_write_all(c->segfd, r->pl.p + start, n - start);
    if (wrc)
        return wrc;
    c->seg_size += n - start;
    c->held = last;
    c->dirty = 1;
    pthread_mutex_lock(&r->stat_lock);
    r->st.batches++;
    r->st.records += nrec;
    r->st.bytes += n - start;
    r->st.held_lsn = last;
    pthread_mutex_unlock(&r->stat_lock);
    return 0;
}

/* Stream node hex's stored segments to a recovering node, then END carrying
 * the held LSN and the node id. An all-zero id asks for the only log held here
 * (a node that lost its disk, identity included). */
static int serve_fetch(struct rl_receiver *r, int fd, const char *want)
{
    char hex[33];
    snprintf(hex, sizeof hex, "%s", want);
    if (!strcmp(hex, "00000000000000000000000000000000")) {
        int found = 0;
        DIR *pd = opendir(r->peer_dir);
        struct dirent *de;
        while (pd && (de = readdir(pd)))
            if (strlen(de->d_name) == 32 && strspn(de->d_name, "0123456789abcdef") == 32 && found++ == 0)
                snprintf(hex, sizeof hex, "%s", de->d_name);
        if (pd)
            closedir(pd);
        if (found > 1) {
            static const char msg[] = "this peer holds the logs of several nodes: name one (node id)";
            send_frame(fd, F_ERROR, 0, 0, msg, sizeof msg - 1, 1000);
            return -EINVAL;
        }
    }
    unsigned char id[16] = {0};
    for (int i = 0; i < 16 && hex[2 * i]; i++)
        sscanf(hex + 2 * i, "%2hhx", &id[i]);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", r->peer_dir, hex);
    /* Data written by a sender connection of this thread is already in the files. */
    struct wal_recovery rec;
    char err[512];
    uint64_t held = 0;
    if (!access(dir, F_OK) && !wal_recover(NULL, dir, 0, 0, &rec, err, sizeof err))
        held = rec.last_lsn;
    DIR *d = opendir(dir);
    int rc = 0;
    if (d) {
        struct dirent *de;
        while (!rc && (de = readdir(d))) {
            uint64_t first;
            if (strlen(de->d_name) != 24 || sscanf(de->d_name, "wal-%16" SCNx64 ".log", &first) != 1)
                continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            int f = open(path, O_RDONLY | O_CLOEXEC);
            struct stat st;
            struct kvbuf b = {0};
            rc = -EIO; /* a segment that cannot be sent whole fails the fetch: never a silent gap */
            if (f >= 0 && !fstat(f, &st) && st.st_size < MAX_FRAME && !kvbuf_reserve(&b, (size_t)st.st_size + 1)) {
                ssize_t got = pread(f, b.p, (size_t)st.st_size, 0);
                if (got == st.st_size)
                    rc = send_frame(fd, F_FILE, first, 0, b.p, (size_t)got, 10000);
            }
            if (rc == -EIO) {
                char msg[256];
                int n = snprintf(msg, sizeof msg, "cannot read stored segment %s", de->d_name);
                send_frame(fd, F_ERROR, 0, 0, msg, (size_t)n, 1000);
            }
            kvbuf_free(&b);
            if (f >= 0)
                close(f);
        }
        closedir(d);
    }
    if (!rc)
        rc = send_frame(fd, F_END, held, 0, id, 16, 10000);
    pthread_mutex_lock(&r->stat_lock);
    r->st.fetches++;
    pthread_mutex_unlock(&r->stat_lock);
    return rc;
}

static int handle_frame(struct rl_receiver *r, int i)
{
    struct rconn *c = &r->conns[i];
    struct frame f;
    int rc = recv_frame(c->fd, &f, &r->pl, 5000);
    if (rc)
        return rc;
    if (f.type == F_HELLO || f.type == F_FETCH) {
        if (r->pl.len != 16 || (f.type == F_HELLO && f.a != RL_VERSION)) {
            send_frame(c->fd, F_ERROR, 0, 0, "bad hello", 9, 1000);
            return -EPROTO;
        }
        char hex[33];
        hexid((unsigned char *)r->pl.p, hex);
        if (f.type == F_FETCH)
            return serve_fetch(r, c->fd, hex) ? -EIO : 1; /* 1: done, close */
        if (c->has_id)
            return -EPROTO; /* one HELLO per connection */
        for (int j = 0; j < r->nconns; j++)
            if (j != i && r->conns[j].has_id && !strcmp(r->conns[j].hex, hex))
                r->conns[j].dead = 1; /* one sender per node: the newest wins (the old one may
                                         be a ghost of a machine that vanished without a FIN) */
        memcpy(c->hex, hex, sizeof hex);
        if ((rc = open_peer_log(r, c)))
            return rc;
        c->has_id = 1;
        return send_frame(c->fd, F_HELLO_ACK, c->held, 0, NULL, 0, 1000);
    }
    if (f.type == F_BATCH && c->has_id) {
        if ((rc = store_batch(r, c, &f)))
            return rc;
        return send_frame(c->fd, F_ACK, c->held, 0, NULL, 0, 1000);
    }
    return -EPROTO;
}

static void *receiver_main(void *arg)
{
    struct rl_receiver *r = arg;
    uint64_t last_sync = now_ms();
    while (!atomic_load_explicit(&r->stop, memory_order_acquire)) {
        struct pollfd p[MAX_PEERS + 2];
        p[0] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = r->evfd, .events = POLLIN};
        for (int i = 0; i < r->nconns; i++)
            p[i + 2] = (struct pollfd){.fd = r->conns[i].fd, .events = POLLIN};
        int nfds = r->nconns + 2;
        int n = poll(p, (nfds_t)nfds, (int)r->sync_ms);
        if (n > 0 && (p[0].revents & POLLIN)) {
            int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0 && r->nconns < MAX_PEERS) {
                int one = 1, idle = 5, intvl = 2, cnt = 3;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                /* a peer machine that vanished sends no FIN: find out within ~11 s */
                setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
                setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
                setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
                setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
                r->conns[r->nconns++] = (struct rconn){.fd = fd, .dirfd = -1, .segfd = -1};
            } else if (fd >= 0) {
                close(fd);
            }
        }
        for (int i = nfds - 3; i >= 0; i--) /* backwards: closing moves the last one here */
            if (i < r->nconns && p[i + 2].revents && handle_frame(r, i))
                rconn_close(r, i);
        for (int i = r->nconns - 1; i >= 0; i--)
            if (r->conns[i].dead)
                rconn_close(r, i);
        if (now_ms() - last_sync >= r->sync_ms) {
            /* The peer's memory (page cache) acknowledged; its disk copy follows. */
            for (int i = 0; i < r->nconns; i++) {
                if (r->conns[i].dirty && r->conns[i].segfd >= 0 && !fdatasync(r->conns[i].segfd)) {
                    r->conns[i].dirty = 0;
                    pthread_mutex_lock(&r->stat_lock);
                    r->st.syncs++;
                    pthread_mutex_unlock(&r->stat_lock);
                }
            }
            last_sync = now_ms();
        }
        pthread_mutex_lock(&r->stat_lock);
        r->st.peers_connected = 0;
        for (int i = 0; i < r->nconns; i++)
            r->st.peers_connected += r->conns[i].has_id;
        pthread_mutex_unlock(&r->stat_lock);
    }
    while (r->nconns)
        rconn_close(r, r->nconns - 1);
    return NULL;
}

int rl_receiver_start(struct rl_receiver **out, const char *addr, int port, const char *peer_dir,
                      uint32_t sync_ms, char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "replication bind address '%s' is not an IPv4 address", addr);
        return -EINVAL;
    }
    struct rl_receiver *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->peer_dir = strdup(peer_dir);
    r->sync_ms = sync_ms ? sync_ms : 1000;
    pthread_mutex_init(&r->stat_lock, NULL);
    r->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1, rc = 0;
    if (r->lfd < 0 || r->evfd < 0)
        rc = -errno;
    if (!rc)
        setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!rc && (bind(r->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(r->lfd, 16)))
        rc = -errno;
    if (rc) {
        snprintf(err, errlen, "cannot listen for replication on %s:%d: %s", addr, port, strerror(-rc));
        goto fail;
    }
    socklen_t sl = sizeof sa;
    getsockname(r->lfd, (struct sockaddr *)&sa, &sl);
    r->port = ntohs(sa.sin_port);
    if ((rc = -pthread_create(&r->th, NULL, receiver_main, r))) {
        snprintf(err, errlen, "cannot start the log receiver: %s", strerror(-rc));
        goto fail;
    }
    pthread_setname_np(r->th, "kv-logrecv");
    *out = r;
    return 0;
fail:
    if (r->lfd >= 0)
        close(r->lfd);
    if (r->evfd >= 0)
        close(r->evfd);
    free(r->peer_dir);
    free(r);
    return rc;
}

int rl_receiver_port(struct rl_receiver *r) { return r->port; }

void rl_receiver_stop(struct rl_receiver *r)
{
    if (!r)
        return;
    atomic_store_explicit(&r->stop, 1, memory_order_release);
    uint64_t one = 1;
    ssize_t wr = write(r->evfd, &one, sizeof one);
    (void)wr;
    pthread_join(r->th, NULL);
    close(r->lfd);
    close(r->evfd);
    kvbuf_free(&r->pl);
    pthread_mutex_destroy(&r->stat_lock);
    free(r->peer_dir);
    free(r);
}

void rl_receiver_get_stats(struct rl_receiver *r, struct rl_receiver_stats *st)
{
    pthread_mutex_lock(&r->stat_lock);
    *st = r->st;
    pthread_mutex_unlock(&r->stat_lock);
}

/* ======================================================================= fetch */

int64_t rl_fetch(const char *host, int port, uint8_t node_id[16], const char *dest_dir,
                 uint32_t timeout_ms, char *err, size_t errlen)
{
    int fd = connect_to(host, port, (int)timeout_ms, err, errlen);
    if (fd < 0)
        return fd;
    struct kvbuf pl = {0};
    int64_t rc = send_frame(fd, F_FETCH, 0, 0, node_id, 16, (int)timeout_ms);
    if (mkdir(dest_dir, 0755) && errno != EEXIST)
        rc = -errno;
    while (!rc) {
        struct frame f;
        rc = recv_frame(fd, &f, &pl, (int)timeout_ms * 10);
        if (rc)
            break;
        if (f.type == F_END) {
            if (pl.len == 16)
                memcpy(node_id, pl.p, 16);
            rc = (int64_t)f.a;
            break;
        }
        if (f.type == F_ERROR) {
            snprintf(err, errlen, "the peer %s:%d refused: %.*s", host, port, (int)pl.len, pl.p);
            kvbuf_free(&pl);
            close(fd);
            return -EINVAL;
        }
        if (f.type != F_FILE) {
            rc = -EPROTO;
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/wal-%016" PRIx64 ".log", dest_dir, f.a);
        int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (out < 0) {
            rc = -errno;
            break;
        }
        rc = wal_write_all(out, pl.p, pl.len);
        if (!rc && fdatasync(out))
            rc = -errno;
        close(out);
    }
    if (rc < 0)
        snprintf(err, errlen, "fetching the log from %s:%d failed: %s", host, port, strerror((int)-rc));
    kvbuf_free(&pl);
    close(fd);
    return rc;
}

/* ===================================================================== generator */

int64_t rl_generate(struct wal *w, uint64_t n, uint32_t record_bytes)
{
    if (record_bytes < WAL_HDR + WAL_TRAILER + 17 || record_bytes > 1u << 20)
        return -EINVAL;
    uint32_t vlen = record_bytes - WAL_HDR - WAL_TRAILER - 16;
    char key[17], *val = malloc(vlen);
    if (!val)
        return -ENOMEM;
    memset(val, 'v', vlen);
    int64_t last = 0;
    for (uint64_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "dev:%012llu", (unsigned long long)i);
        int64_t lsn;
        while ((lsn = wal_append(w, WAL_SET, key, 16, val, vlen, NULL, 0, 0)) == -EAGAIN)
            usleep(50); /* backlog full: the sender (or the disk) is behind */
        if (lsn < 0) {
            free(val);
            return lsn;
        }
        last = lsn;
    }
    free(val);
    return last;
}
