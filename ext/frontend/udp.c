/* udp.c - the kernel-socket UDP front end (--arch udp): `udp_workers` threads,
 * each with its own SO_REUSEPORT UDP socket on bind:udp_port (the kernel spreads
 * senders over them), taking datagrams in recvmmsg batches and answering in
 * sendmmsg batches. Framing, durability and stalls as in udpfront.h. It is the
 * kernel's best UDP path for the same request loop that --arch dpdk runs over
 * kernel bypass, so the two compare like for like. TCP is still served by the
 * pollers (arch udp runs both front ends).
 * Each worker thread owns its socket, eventfd, buffers and reply ring; the table
 * is reached only through cmd_dispatch (udpfront.c). A worker loops:
 *   send the replies whose LSN is durable (sendmmsg, in order);
 *   run the datagrams received and not yet run, each reply built into the ring;
 *   receive a new batch (recvmmsg) when all have run and the ring has room;
 *   when none of that made progress, poll() the socket (only if it may receive)
 *   and the eventfd that the log and the data file write to.
 * A request that must wait for the data file stops the loop's running part: the
 * datagrams behind it wait in their buffers and nothing new is received, which
 * pushes back on senders the way a stalled TCP connection does. */
#define _GNU_SOURCE
#include "frontend/udpfront.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/counter.h"
#include "core/net.h"
#include "engine/engine.h"
#include "frontend/frontend.h"
#include "frontend/pullcache.h"
#include "durability/wal.h"

#define BURST 32
#define RING 512              /* replies built, waiting to be sent (a power of two) */
#define RXBUF KVU_MAX_REQUEST  /* a longer datagram shows up as MSG_TRUNC */
#define WAIT_MS 100           /* longest poll(): a lost wakeup costs at most this */
#define MAX_WORKERS 64

struct us_slot {
    uint64_t lsn;
    struct sockaddr_in to;
    uint16_t len;
    uint8_t buf[KVU_MAX_PAYLOAD];
};

struct us_worker {
    struct us_server *u;
    pthread_t th;
    int started;
    int fd, evfd;
    struct uf_worker w;
    /* received batch: rx[rx_i..rx_n) still to run; rx[rx_i] is the stalled one if stalled */
    struct mmsghdr rx[BURST];
    struct iovec rxv[BURST];
    struct sockaddr_in rxa[BURST];
    uint8_t (*rxb)[RXBUF];
    int rx_i, rx_n, stalled;
    /* built replies: ring[head..head+n) (mod RING), sent in order once durable */
    struct us_slot *ring;
    unsigned head, n;
    struct mmsghdr tx[BURST];
    struct iovec txv[BURST];
} __attribute__((aligned(64)));

struct us_server {
    struct kv_engine *eng;
    int port, nworkers;
    _Atomic int stopping;
    struct us_worker *wk;
    struct uf_info info;     /* what INFO shows of it */
    struct pull_cache *pc;   /* --pull-cache-slots: the XDP first level, or NULL */
};

/* INFO stats: the pull cache's counters (its program's and the engine's). */
static void info_pull_cache(void *arg, struct kvbuf *b)
{
    struct pc_stats st;
    pc_get_stats(arg, &st);
    kvbuf_printf(b,
                 "pull_cache_slots:%u\r\npull_cache_iface:%s\r\npull_cache_mode:%s\r\n"
                 "pull_cache_hits:%llu\r\npull_cache_misses:%llu\r\npull_cache_fills:%llu\r\n"
                 "pull_cache_invalidations:%llu\r\npull_cache_torn:%llu\r\npull_cache_no_room:%llu\r\n",
                 st.slots, st.ifname, st.native ? "native" : "generic", (unsigned long long)st.hits,
                 (unsigned long long)st.misses, (unsigned long long)st.fills,
                 (unsigned long long)st.invalidations, (unsigned long long)st.torn,
                 (unsigned long long)st.no_room);
}

/* Send ring replies in order while their LSN is durable. */
static void send_ready(struct us_worker *k)
{
    int failed;
    uint64_t durable = uf_durable(&k->w, &failed);
    if (failed && k->n) { /* the log failed: these writes can never be acknowledged */
        st_inc(&k->w.st.tx_failed, k->n);
        k->head = (k->head + k->n) % RING;
        k->n = 0;
        return;
    }
    unsigned sent = 0;
    while (k->n) {
        int m = 0;
        while (m < BURST && (unsigned)m < k->n) {
            struct us_slot *sl = &k->ring[(k->head + (unsigned)m) % RING];
            if (sl->lsn > durable)
                break;
            k->txv[m] = (struct iovec){sl->buf, sl->len};
            k->tx[m].msg_hdr = (struct msghdr){.msg_name = &sl->to, .msg_namelen = sizeof sl->to,
                                               .msg_iov = &k->txv[m], .msg_iovlen = 1};
            m++;
        }
        if (!m)
            break;
        int r = sendmmsg(k->fd, k->tx, (unsigned)m, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            r = 1; /* this datagram cannot go (e.g. the sender's route vanished): drop it, go on */
            st_inc(&k->w.st.tx_failed, 1);
        } else {
            sent += (unsigned)r;
        }
        k->head = (k->head + (unsigned)r) % RING;
        k->n -= (unsigned)r;
    }
    st_inc(&k->w.st.tx_packets, sent);
}

/* Run received datagrams until all ran, one stalls, or the ring is full.
 * Returns how many ran. */
static int run_received(struct us_worker *k)
{
    int ran = 0;
    int failed;
    uint64_t durable = k->rx_i < k->rx_n ? uf_durable(&k->w, &failed) : 0;
    while (k->rx_i < k->rx_n && k->n < RING) {
        struct mmsghdr *m = &k->rx[k->rx_i];
        int r;
        if (k->stalled)
            r = uf_resume(&k->w);
        else if (m->msg_hdr.msg_flags & MSG_TRUNC)
            r = UF_BAD; /* longer than any request may be (KVU_MAX_REQUEST) */
        else
            r = uf_run(&k->w, k->rxb[k->rx_i], m->msg_len);
        if (r == UF_STALL) {
            k->stalled = 1;
            break;
        }
        k->stalled = 0;
        ran++;
        if (r == UF_BAD) {
            st_inc(&k->w.st.bad_frames, 1);
        } else {
            struct us_slot *sl = &k->ring[(k->head + k->n) % RING];
            sl->len = (uint16_t)uf_frame_reply(&k->w, sl->buf, k->rxb[k->rx_i], sizeof sl->buf);
            sl->to = k->rxa[k->rx_i];
            sl->lsn = k->w.ses.need;
            if (sl->lsn > durable)
                st_inc(&k->w.st.held, 1);
            k->n++;
        }
        k->rx_i++;
    }
    return ran;
}

static int receive(struct us_worker *k)
{
    for (int i = 0; i < BURST; i++) {
        k->rxv[i] = (struct iovec){k->rxb[i], RXBUF};
        k->rx[i].msg_hdr = (struct msghdr){.msg_name = &k->rxa[i], .msg_namelen = sizeof k->rxa[i],
                                           .msg_iov = &k->rxv[i], .msg_iovlen = 1};
    }
    int n = recvmmsg(k->fd, k->rx, BURST, MSG_DONTWAIT, NULL);
    if (n <= 0)
        return 0;
    st_inc(&k->w.st.rx_packets, (uint64_t)n);
    k->rx_i = 0;
    k->rx_n = n;
    return n;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *worker_main(void *arg)
{
    struct us_worker *k = arg;
    struct us_server *u = k->u;
    uint64_t t0 = now_ns();
    while (!atomic_load_explicit(&u->stopping, memory_order_acquire)) {
        send_ready(k);
        int progress = run_received(k);
        if (k->rx_i == k->rx_n && k->n < RING - BURST)
            progress += receive(k);
        if (progress) {
            send_ready(k);
            continue;
        }
        uint64_t t = now_ns(); /* busy since the last wait: the time spent serving */
        st_inc(&k->w.st.busy_ns, t - t0);
        /* Nothing to do until a datagram comes (if we may take one), or the log or
         * the data file moves on (eventfd). */
        int may_receive = k->rx_i == k->rx_n && k->n < RING - BURST;
        struct pollfd pf[2] = {{.fd = k->evfd, .events = POLLIN}, {.fd = k->fd, .events = POLLIN}};
        if (poll(pf, may_receive ? 2 : 1, WAIT_MS) > 0 && (pf[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = read(k->evfd, &v, sizeof v);
            (void)r;
        }
        t0 = now_ns();
    }
    return NULL;
}

static int bind_socket(struct us_server *u, const char *bind_addr, int probe, char *err, size_t errlen)
{
    int fd = net_bind(SOCK_DGRAM, bind_addr, &u->port, 1, probe, "bind UDP", err, errlen);
    if (fd >= 0) {
        int buf = 4 << 20; /* absorb bursts while a worker is busy; capped by net.core.rmem_max */
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    }
    return fd;
}

static void us_stop(void *st);
static void us_destroy(void *st);
static void us_totals(void *st, struct uf_totals *t);

static int us_create(void **out, struct kv_engine *eng, char *err, size_t errlen)
{
    const char *bind_addr = eng->cfg.bind;
    int port = eng->cfg.udp_port, workers = eng->cfg.udp_workers;
    if (workers < 1 || workers > MAX_WORKERS) {
        snprintf(err, errlen, "udp workers must be between 1 and %d, got %d", MAX_WORKERS, workers);
        return -EINVAL;
    }
    if (port < 0 || port > 65535) {
        snprintf(err, errlen, "UDP port must be between 0 and 65535, got %d", port);
        return -EINVAL;
    }
    struct us_server *u = calloc(1, sizeof *u);
    struct us_worker *wk = u ? aligned_alloc(64, sizeof *wk * (size_t)workers) : NULL;
    if (!wk) {
        free(u);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    memset(wk, 0, sizeof *wk * (size_t)workers);
    u->eng = eng;
    u->port = port;
    u->wk = wk;
    u->info = (struct uf_info){us_totals, u, &u->port, workers};
    int rc = uf_register_info(eng, &u->info);
    for (int i = 0; i < workers && rc == 0; i++) {
        struct us_worker *k = &wk[i];
        u->nworkers = i + 1; /* us_destroy releases what this one got so far */
        k->u = u;
        k->fd = k->evfd = -1;
        k->rxb = malloc(sizeof *k->rxb * BURST);
        k->ring = malloc(sizeof *k->ring * RING);
        k->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        char addr[64];
        snprintf(addr, sizeof addr, "udp:%s", bind_addr);
        uf_init(&k->w, eng, i, k->evfd, addr);
        if (!k->rxb || !k->ring || k->evfd < 0) {
            rc = -ENOMEM;
            snprintf(err, errlen, "out of memory (or eventfd: %s)", strerror(errno));
            break;
        }
        k->fd = bind_socket(u, bind_addr, i == 0 && port != 0, err, errlen);
        if (k->fd < 0)
            rc = k->fd;
        else
            rc = ses_subscribe(eng, k->evfd, err, errlen);
    }
    if (rc == 0 && eng->cfg.pull_cache_slots > 0) {
        rc = pc_open(&u->pc, eng->table, bind_addr, u->port, (uint32_t)eng->cfg.pull_cache_slots, err, errlen);
        if (rc == 0)
            rc = eng_info_add(eng, "stats", info_pull_cache, NULL, u->pc);
    }
    if (rc < 0) {
        us_destroy(u);
        return rc;
    }
    *out = u;
    return 0;
}

static int us_start(void *st, char *err, size_t errlen)
{
    struct us_server *u = st;
    for (int i = 0; i < u->nworkers; i++) {
        struct us_worker *k = &u->wk[i];
        int rc = pthread_create(&k->th, NULL, worker_main, k);
        if (rc) {
            snprintf(err, errlen, "cannot start UDP worker thread: %s", strerror(rc));
            us_stop(u);
            return -rc;
        }
        k->started = 1;
        char name[16];
        snprintf(name, sizeof name, "kv-udp-%d", i % 100);
        pthread_setname_np(k->th, name);
    }
    return 0;
}

static void us_stop(void *st)
{
    struct us_server *u = st;
    /* release: workers that see it have nothing more to finish */
    atomic_store_explicit(&u->stopping, 1, memory_order_release);
    for (int i = 0; i < u->nworkers; i++) {
        uint64_t one = 1;
        if (u->wk[i].evfd >= 0) {
            ssize_t r = write(u->wk[i].evfd, &one, sizeof one);
            (void)r;
        }
    }
    for (int i = 0; i < u->nworkers; i++) {
        if (u->wk[i].started) {
            pthread_join(u->wk[i].th, NULL);
            u->wk[i].started = 0;
        }
    }
}

static void us_destroy(void *st)
{
    struct us_server *u = st;
    if (!u)
        return;
    us_stop(u);
    pc_close(u->pc); /* after the workers: nothing of ours changes streams now */
    for (int i = 0; i < u->nworkers; i++) {
        struct us_worker *k = &u->wk[i];
        if (k->fd >= 0)
            close(k->fd);
        if (k->evfd >= 0)
            close(k->evfd);
        uf_free(&k->w);
        free(k->rxb);
        free(k->ring);
    }
    free(u->wk);
    free(u);
}

static int us_port(const void *st) { return ((const struct us_server *)st)->port; }

static void us_totals(void *st, struct uf_totals *t)
{
    struct us_server *u = st;
    for (int i = 0; i < u->nworkers; i++)
        uf_add_totals(&u->wk[i].w.st, t);
}

static void us_add_stats(void *st, struct fe_stats *out)
{
    struct uf_totals t = {0};
    us_totals(st, &t);
    uf_add_stats(&t, out);
}

const struct kv_frontend_ops fe_udp = {"udp", us_create, us_start, us_stop, us_destroy, us_port, us_add_stats, NULL};
