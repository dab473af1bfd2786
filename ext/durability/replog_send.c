/* replog_send.c - the log sender thread (see replog.h): ships new records in
 * BATCH frames, turns the peer's ACKs into the durable LSN, falls back to disk
 * mode when the peer is late or gone and catches it up from the segment files.
 * Each connection opens with the handshake (rl_auth_client): the peer must prove
 * it holds the pair's secret before it is shipped anything or its ACKs count;
 * with --repl-tls a TLS handshake (both certificates verified) comes first.
 * Threads: the sender thread owns its link and buffers; stats are read under
 * stat_lock. Frames from the peer are untrusted (rl_recv_frame checks them). */
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
#include "core/log.h"
#include "durability/wal.h"
#include "durability/replog_frame.h"

#include <openssl/crypto.h>

/* ======================================================================= sender */

struct rl_sender {
    struct rl_sender_config cfg;
    char host[64];
    struct wal *w;
    pthread_t th;
    _Atomic int stop;
    struct rl_link link;       /* fd -1 while not connected */
    struct tls_ctx *tls;       /* --repl-tls: the client context (NULL: plain TCP) */
    struct wal_ship pend;      /* the records the log holds for us (in its memory), not yet sent */
    struct kvbuf cat, pl;
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
    int was_connected = s->st.connected, was = s->st.degraded, first = s->st.connects == 1;
    s->st.connected = connected;
    s->st.degraded = degraded;
    pthread_mutex_unlock(&s->stat_lock);
    if (connected && !was_connected)
        kvlog(KVLOG_NOTICE, "peer %s:%d %s: catching it up", s->host, s->cfg.port, first ? "connected" : "back");
    if (!connected && was_connected) /* (last_error: written by this thread only) */
        kvlog(KVLOG_WARNING, "peer %s:%d lost (%s): falling back to disk mode, every write synced locally",
              s->host, s->cfg.port, s->st.last_error);
    if (was && !degraded)
        kvlog(KVLOG_NOTICE, "peer %s:%d caught up: writes acknowledged from its memory again", s->host, s->cfg.port);
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

/* One BATCH frame of records first..last, in parts pl[0..npl). */
static int ship_frame(struct rl_sender *s, const struct iovec *pl, int npl, size_t bytes, uint64_t first,
                      uint64_t last, uint64_t *sent)
{
    int rc = rl_send_framev(&s->link, F_BATCH, first, last, pl, npl, (int)s->cfg.timeout_ms);
    if (rc)
        return rc;
    *sent = last;
    pthread_mutex_lock(&s->stat_lock);
    s->st.batches++;
    s->st.records += last - first + 1;
    s->st.bytes += bytes;
    s->st.sent_lsn = last;
    pthread_mutex_unlock(&s->stat_lock);
    return 0;
}

/* Send the records in iov[0..n) (bytes in all; whole records, none split
 * between two parts) as BATCH frames of at most max_batch_records records,
 * MAX_BATCH_BYTES bytes and RL_FRAME_IOV parts, sent from where they lie.
 * first/last: their LSNs when known (the log's view: consecutive LSNs), 0 when
 * not (a range read from the files): a batch that fits in one frame is then
 * sent as it is, without walking its records. */
static int ship_records(struct rl_sender *s, const struct iovec *iov, int n, size_t bytes, uint64_t first_lsn,
                        uint64_t last_lsn, uint64_t *sent)
{
    if (first_lsn && last_lsn >= first_lsn && last_lsn - first_lsn < s->cfg.max_batch_records &&
        bytes <= MAX_BATCH_BYTES && bytes && n <= RL_FRAME_IOV)
        return ship_frame(s, iov, n, bytes, first_lsn, last_lsn, sent);
    struct iovec fr[RL_FRAME_IOV];
    int nfr = 0;
    size_t fbytes = 0;
    uint64_t first = 0, last = 0, cnt = 0;
    for (int i = 0; i < n; i++) {
        const unsigned char *p = iov[i].iov_base;
        size_t len = iov[i].iov_len, off = 0, start = 0;
        while (off < len) {
            /* A full frame (or one whose parts are all used) leaves first. */
            if (cnt && (cnt >= s->cfg.max_batch_records || fbytes + off - start >= MAX_BATCH_BYTES ||
                        nfr == RL_FRAME_IOV)) { /* (all parts used: only at a part's start) */
                if (off > start) {
                    fr[nfr++] = (struct iovec){(void *)(p + start), off - start};
                    fbytes += off - start;
                    start = off;
                }
                int rc = ship_frame(s, fr, nfr, fbytes, first, last, sent);
                if (rc)
                    return rc;
                nfr = 0;
                fbytes = 0;
                first = last = cnt = 0;
            }
            size_t l = rec_len(p + off, len - off);
            if (!l)
                return -EPROTO;
            if (!first)
                first = rec_lsn(p + off, l);
            last = rec_lsn(p + off, l);
            off += l;
            cnt++;
        }
        if (off > start) {
            fr[nfr++] = (struct iovec){(void *)(p + start), off - start};
            fbytes += off - start;
        }
    }
    return cnt ? ship_frame(s, fr, nfr, fbytes, first, last, sent) : 0;
}

/* Catch-up may hold the log's memory this long before the records it needs from
 * the files came: past it, the view is dropped and read back from the files
 * too (the log's appends must not wait on a catch-up: max_pending). */
#define PEND_HOLD_MAX (32u << 20)

/* How long a batch may wait for the previous one's ack, in ship intervals: an
 * ack that never covers all that was sent (a catch-up range from the files may
 * end inside a unit: the peer acknowledges whole units only) must not hold
 * shipping back for longer. */
#define SHIP_MAX_WAIT_INTERVALS 10
#define IDLE_WAKE_US 100000 /* idle and caught up: wake this often (the marker, stats) */

/* Sleep until the peer sends something (an ack) or a record the sender may take
 * is appended (the log's eventfd), at most timeout_us. Returns 1 if the link
 * is readable, 0 otherwise, -errno. Only while nothing is in flight: then the
 * appenders, not a timer, wake the sender. */
static int wait_idle(struct rl_sender *s, uint64_t timeout_us)
{
    if (rl_link_pending(&s->link))
        return 1;
    if (!wal_ship_sleep(s->w, 1))
        return 0; /* records came meanwhile: ship them */
    struct pollfd pf[2] = {{.fd = s->link.fd, .events = rl_link_events(&s->link)},
                           {.fd = wal_ship_fd(s->w), .events = POLLIN}};
    struct timespec ts = {.tv_sec = (time_t)(timeout_us / 1000000), .tv_nsec = (long)(timeout_us % 1000000) * 1000};
    int r = ppoll(pf, 2, &ts, NULL);
    int e = errno;
    wal_ship_sleep(s->w, 0);
    if (r < 0)
        return e == EINTR ? 0 : -e;
    return r > 0 && pf[0].revents ? 1 : 0;
}

static void *sender_main(void *arg)
{
    struct rl_sender *s = arg;
    char err[256];
    uint64_t acked = 0, sent = 0, next = 0; /* next: the LSN the peer needs next (0 = unknown) */
    uint64_t unacked_since = 0, last_ship = 0;
    int connected = 0, caught_up = 0;
    while (!atomic_load_explicit(&s->stop, memory_order_acquire)) {
        marker_maybe_write(s, connected);
        if (!connected) {
            /* Records stay in the local log; after reconnecting they are read back. */
            wal_ship_peek(s->w, &s->pend);
            wal_ship_consume(s->w, &s->pend, UINT64_MAX);
            int fd = rl_connect_to(s->host, s->cfg.port, (int)s->cfg.timeout_ms, err, sizeof err);
            if (fd < 0) {
                s_error(s, err);
                usleep(100000);
                continue;
            }
            rl_link_init(&s->link, fd, 0);
            struct frame f = {0};
            char why[400] = "";
            int rc = 0, tls_failed = 0;
            if (s->tls && (rc = rl_link_tls_client(&s->link, s->tls, (int)s->cfg.timeout_ms, why, sizeof why)))
                tls_failed = 1; /* a peer without our CA's certificate, or not speaking TLS: as a wrong secret */
            if (!rc)
                rc = rl_auth_client(&s->link, s->cfg.key, RL_ROLE_SENDER, s->cfg.node_id, (int)s->cfg.timeout_ms,
                                    why, sizeof why);
            if (rc == -EACCES || tls_failed) { /* a wrong secret, or not our peer: say so, and retry slowly */
                static struct kvlog_rate rate = KVLOG_RATE_INIT(3);
                snprintf(err, sizeof err, "peer %s:%d: %s", s->host, s->cfg.port, why);
                kvlog_rated(&rate, KVLOG_WARNING, "replication handshake with %s", err);
                s_error(s, err);
                pthread_mutex_lock(&s->stat_lock);
                s->st.auth_failures++;
                pthread_mutex_unlock(&s->stat_lock);
                rl_link_close(&s->link);
                usleep(1000000);
                continue;
            }
            if (!rc)
                rc = rl_send_frame(&s->link, F_HELLO, RL_VERSION, 0, s->cfg.node_id, 16, (int)s->cfg.timeout_ms);
            if (!rc)
                rc = rl_recv_frame(&s->link, &f, &s->pl, (int)s->cfg.timeout_ms);
            if (!rc && f.type != F_HELLO_ACK)
                rc = -EPROTO;
            if (rc) {
                snprintf(err, sizeof err, "handshake with peer %s:%d failed: %s", s->host, s->cfg.port,
                         f.type == F_ERROR ? "peer refused" : strerror(-rc));
                s_error(s, err);
                rl_link_close(&s->link);
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
                rl_link_close(&s->link);
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
            caught_up = 0;
        }
        /* Self-clocked shipping: a batch leaves at most every interval_us, and
         * while the previous one is unacknowledged it waits for that ack (at
         * most SHIP_MAX_WAIT_INTERVALS intervals): one batch in flight, so the
         * batch grows with the round trip and each batch, ack and wake-up of
         * the pollers carries as many records as the load gives — under load
         * the sender is woken by acks, not by a timer. Acks are handled the
         * moment they arrive: a reply waits for its ack, so an ack read late is
         * latency added to every write. Idle (caught up, nothing in flight or
         * pending), it sleeps until an append wakes it. */
        uint64_t now = now_us(), interval = s->cfg.interval_us;
        uint64_t due = last_ship + interval, max_due = last_ship + interval * SHIP_MAX_WAIT_INTERVALS;
        int w = 0;
        if (acked < sent)
            w = rl_link_wait(&s->link, POLLIN, max_due > now ? max_due - now : 0);
        else if (caught_up && !s->pend.bytes && (w = wait_idle(s, IDLE_WAKE_US)) == 0 && (now = now_us()) < due)
            w = rl_link_wait(&s->link, POLLIN, due - now); /* woken early: the interval still holds */
        else if (!caught_up || s->pend.bytes)
            w = rl_link_wait(&s->link, POLLIN, due > now ? due - now : 0);
        int rc = 0;
        uint64_t acked0 = acked;
        while (w > 0 && !rc) {
            struct frame f;
            rc = rl_recv_frame(&s->link, &f, &s->pl, (int)s->cfg.timeout_ms);
            if (!rc && f.type == F_ACK && f.a > sent) {
                rc = -EPROTO; /* acknowledging what was never sent: a confused peer */
            } else if (!rc && f.type == F_ACK && f.a > acked) {
                acked = f.a; /* published once for every ack read here */
                unacked_since = acked < sent ? now_ms() : 0;
            } else if (!rc && f.type != F_ACK) {
                rc = -EPROTO;
            }
            if (!rc)
                w = rl_link_wait(&s->link, POLLIN, 0);
        }
        if (acked > acked0)
            wal_publish_durable(s->w, acked);
        if (!rc && w < 0)
            rc = w;
        now = now_us();
        if (!rc && (now < due || (acked < sent && now < max_due))) { /* not yet time to ship */
            pthread_mutex_lock(&s->stat_lock);
            s->st.acked_lsn = acked;
            pthread_mutex_unlock(&s->stat_lock);
            continue;
        }
        last_ship = now;
        /* What was appended meanwhile (and what was held back before), in the
         * log's memory: shipped from there, not copied. Records the peer holds
         * already are passed over. */
        if (wal_ship_peek(s->w, &s->pend) && s->pend.first < next) {
            wal_ship_consume(s->w, &s->pend, next - 1);
            wal_ship_peek(s->w, &s->pend);
        }
        if (s->pend.bytes > PEND_HOLD_MAX && s->pend.first > next)
            wal_ship_consume(s->w, &s->pend, s->pend.last); /* read back from the files */
        /* Catch up from the local segment files when the peer needs records we no
         * longer hold in memory (after a reconnect). */
        if (!rc && (!s->pend.bytes || s->pend.first > next)) {
            uint64_t upto = s->pend.bytes ? s->pend.first - 1 : wal_written_lsn(s->w);
            if (upto >= next && wal_written_lsn(s->w) >= upto) {
                s->cat.len = 0;
                int64_t got = wal_read_range(wal_dir(s->w), next, upto, 8u << 20, &s->cat);
                if (got < 0) {
                    rc = (int)got;
                } else if (got > 0) {
                    struct iovec v = {s->cat.p, s->cat.len};
                    rc = ship_records(s, &v, 1, s->cat.len, 0, 0, &sent);
                    pthread_mutex_lock(&s->stat_lock);
                    s->st.catchup_records += (uint64_t)got - next + 1;
                    pthread_mutex_unlock(&s->stat_lock);
                    next = (uint64_t)got + 1;
                    if (!unacked_since)
                        unacked_since = now_ms();
                }
            }
        }
        if (!rc && s->pend.bytes && s->pend.first == next) {
            rc = ship_records(s, s->pend.iov, s->pend.n, s->pend.bytes, s->pend.first, s->pend.last, &sent);
            next = s->pend.last + 1;
            wal_ship_consume(s->w, &s->pend, s->pend.last);
            if (!rc && !unacked_since)
                unacked_since = now_ms();
        }
        /* Caught up and acknowledged: the peer's memory is the durability again. */
        if (!rc && acked == sent && !s->pend.bytes && next > wal_written_lsn(s->w)) {
            pthread_mutex_lock(&s->stat_lock);
            int deg = s->st.degraded;
            pthread_mutex_unlock(&s->stat_lock);
            if (deg)
                s_set(s, 1, 0);
            caught_up = 1;
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
            rl_link_close(&s->link);
            connected = 0;
            caught_up = 0;
            s_set(s, 0, 1);
        }
        pthread_mutex_lock(&s->stat_lock);
        s->st.acked_lsn = acked;
        pthread_mutex_unlock(&s->stat_lock);
    }
    rl_link_close(&s->link);
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
    rl_link_init(&s->link, -1, 0);
    int rc = rl_tls_ctx(&s->tls, &cfg->tls, 0, err, errlen);
    s->cfg.tls = (struct rl_tls_files){0}; /* the caller's strings: read above only */
    if (rc) {
        free(s);
        return rc;
    }
    s->st.degraded = 1; /* until the peer has acknowledged everything */
    s->degraded_at = wal_appended_lsn(w) ? wal_appended_lsn(w) : 1;
    pthread_mutex_init(&s->stat_lock, NULL);
    wal_set_sync(w, 1);
    rc = pthread_create(&s->th, NULL, sender_main, s);
    if (rc) {
        snprintf(err, errlen, "cannot start the log sender: %s", strerror(rc));
        tls_ctx_free(s->tls);
        free(s);
        return -rc;
    }
    pthread_setname_np(s->th, "kv-logsend");
    kvlog(KVLOG_NOTICE, "replicating the log to peer %s:%d%s (disk mode until it has caught up)", s->host, s->cfg.port,
          s->tls ? " over TLS" : "");
    *out = s;
    return 0;
}

void rl_sender_stop(struct rl_sender *s)
{
    if (!s)
        return;
    atomic_store_explicit(&s->stop, 1, memory_order_release);
    pthread_join(s->th, NULL);
    wal_ship_free(&s->pend);
    kvbuf_free(&s->cat);
    kvbuf_free(&s->pl);
    tls_ctx_free(s->tls);
    OPENSSL_cleanse(s->cfg.key, sizeof s->cfg.key);
    pthread_mutex_destroy(&s->stat_lock);
    free(s);
}

void rl_sender_get_stats(struct rl_sender *s, struct rl_sender_stats *st)
{
    pthread_mutex_lock(&s->stat_lock);
    *st = s->st;
    pthread_mutex_unlock(&s->stat_lock);
}
