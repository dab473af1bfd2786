/* tcp.c - the shared parts of the TCP front ends (see tcp.h). */
#define _GNU_SOURCE
#include "frontend/tcp.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/counter.h"
#include "core/log.h"
#include "core/net.h"
#include "core/table.h"
#include "cmd/cmd.h"
#include "engine/engine.h"

#define HOUSEKEEP_BUDGET 64

static void info_pollers(void *arg, struct kvbuf *b)
{
    struct tcp_front *f = arg;
    uint64_t tot[4] = {0};
    for (int i = 0; i < f->nthreads; i++) {
        struct fe_thread_stats ps;
        tcp_thread_stats(f, i, &ps);
        kvbuf_printf(b,
                     "poller%d:clients=%llu,commands=%llu,epoll_wait=%llu,epoll_ctl=%llu,"
                     "read=%llu,write=%llu\r\n",
                     i, (unsigned long long)ps.clients, (unsigned long long)ps.commands,
                     (unsigned long long)ps.epoll_wait, (unsigned long long)ps.epoll_ctl,
                     (unsigned long long)ps.reads, (unsigned long long)ps.writes);
        tot[0] += ps.epoll_wait;
        tot[1] += ps.epoll_ctl;
        tot[2] += ps.reads;
        tot[3] += ps.writes;
    }
    kvbuf_printf(b,
                 "total_epoll_wait_calls:%llu\r\ntotal_epoll_ctl_calls:%llu\r\n"
                 "total_read_calls:%llu\r\ntotal_write_calls:%llu\r\n",
                 (unsigned long long)tot[0], (unsigned long long)tot[1], (unsigned long long)tot[2],
                 (unsigned long long)tot[3]);
}

/* CONFIG RESETSTAT: the counters INFO presents as totals since reset. Each thread
 * is the single writer of its counters, so a concurrent increment may be lost:
 * fine for statistics, as in Redis. */
static void reset_pollers(void *arg)
{
    struct tcp_front *f = arg;
    for (int i = 0; i < f->nthreads; i++) {
        struct tcp_thread *t = &f->st[i];
        atomic_store_explicit(&t->epoll_wait, 0, memory_order_relaxed);
        atomic_store_explicit(&t->epoll_ctl, 0, memory_order_relaxed);
        atomic_store_explicit(&t->reads, 0, memory_order_relaxed);
        atomic_store_explicit(&t->writes, 0, memory_order_relaxed);
    }
}

/* INFO stats: what the client limits did (the rest of the section is the server's). */
static void info_limits(void *arg, struct kvbuf *b)
{
    struct tcp_front *f = arg;
    kvbuf_printf(b, "acl_access_denied_auth:%llu\r\nclient_timeout_disconnections:%llu\r\n",
                 (unsigned long long)st_get(&f->eng->auth_denied), (unsigned long long)st_get(&f->timed_out));
}

static void reset_limits(void *arg)
{
    struct tcp_front *f = arg;
    atomic_store_explicit(&f->timed_out, 0, memory_order_relaxed);
    atomic_store_explicit(&f->eng->auth_denied, 0, memory_order_relaxed);
}

/* A descriptor held in reserve (tcp_accept), or -1: an epoll instance, which
 * needs no file (a chroot without /dev/null could otherwise never have one). */
static int open_spare(void) { return epoll_create1(EPOLL_CLOEXEC); }

int tcp_init(struct tcp_front *f, struct kv_engine *eng, int nthreads, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->eng = eng;
    if (nthreads < 1 || nthreads > 1024) {
        snprintf(err, errlen, "threads must be between 1 and 1024, got %d", nthreads);
        return -EINVAL;
    }
    if (eng->cfg.port < 0 || eng->cfg.port > 65535) {
        snprintf(err, errlen, "port must be between 0 and 65535, got %d", eng->cfg.port);
        return -EINVAL;
    }
    if (eng->cfg.maxclients < 1) {
        snprintf(err, errlen, "maxclients must be at least 1, got %d", eng->cfg.maxclients);
        return -EINVAL;
    }
    f->st = aligned_alloc(64, sizeof *f->st * (size_t)nthreads);
    if (!f->st) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    memset(f->st, 0, sizeof *f->st * (size_t)nthreads);
    f->nthreads = nthreads;
    pthread_mutex_init(&f->spare_lock, NULL);
    atomic_init(&f->spare_fd, open_spare()); /* -1 only costs the shedding until one frees */
    int rc = eng_info_add(eng, "pollers", info_pollers, reset_pollers, f);
    return rc < 0 ? rc : eng_info_add(eng, "stats", info_limits, reset_limits, f);
}

void tcp_free(struct tcp_front *f)
{
    if (f->st) { /* (initialised) */
        int spare = atomic_exchange(&f->spare_fd, -1);
        if (spare >= 0)
            close(spare);
        pthread_mutex_destroy(&f->spare_lock);
    }
    free(f->st);
    f->st = NULL;
}

int tcp_listen_port(struct kv_engine *e, int *port, int *probed, int reuseport, const char *what, char *err,
                    size_t errlen)
{
    int picked = *port == 0;
    int fd = net_bind(SOCK_STREAM | SOCK_NONBLOCK, e->cfg.bind, port, reuseport, reuseport && *port != 0 && !*probed,
                      what, err, errlen);
    if (fd < 0)
        return fd;
    /* probed, or the kernel gave us a free port: nobody else holds it */
    *probed |= reuseport || picked;
    if (listen(fd, e->cfg.tcp_backlog > 0 ? e->cfg.tcp_backlog : 511)) {
        int rc = -errno;
        snprintf(err, errlen, "cannot %s %s:%d: %s", what, e->cfg.bind, *port, strerror(-rc));
        close(fd);
        return rc;
    }
    return fd;
}

int tcp_listen(struct tcp_front *f, int reuseport, char *err, size_t errlen)
{
    return tcp_listen_port(f->eng, &f->eng->port, &f->port_probed, reuseport, "listen on", err, errlen);
}

static const char max_clients_msg[] = "-ERR max number of clients reached\r\n";

/* Tell a refused client why, without waiting: a fresh socket's buffer takes it. */
static void refuse(int fd)
{
    ssize_t w = send(fd, max_clients_msg, sizeof max_clients_msg - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
}

int tcp_admit(struct tcp_front *f, int fd, int resp)
{
    uint64_t n = atomic_fetch_add_explicit(&f->clients, 1, memory_order_relaxed);
    uint64_t cap = atomic_load_explicit(&f->fd_cap, memory_order_relaxed);
    atomic_fetch_add_explicit(&f->total_conns, 1, memory_order_relaxed);
    int maxclients = __atomic_load_n(&f->eng->cfg.maxclients, __ATOMIC_RELAXED); /* (CONFIG SET maxclients) */
    if (n >= (uint64_t)maxclients || (cap && n >= cap)) {
        static struct kvlog_rate refusals = KVLOG_RATE_INIT(5);
        char addr[64] = "?";
        if (kvlog_on(KVLOG_WARNING))
            net_peer_addr(fd, addr, sizeof addr);
        if (n >= (uint64_t)maxclients)
            kvlog_rated(&refusals, KVLOG_WARNING, "refused connection from %s: maxclients (%d) reached", addr,
                        maxclients);
        else
            kvlog_rated(&refusals, KVLOG_WARNING,
                        "refused connection from %s: out of file descriptors at %llu clients (raise the "
                        "open-file limit, e.g. LimitNOFILE, or lower --maxclients)", addr, (unsigned long long)cap);
        if (resp)
            refuse(fd);
        close(fd);
        atomic_fetch_sub_explicit(&f->clients, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&f->rejected, 1, memory_order_relaxed);
        return 0;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 1;
}

/* Refuse connection fd as Redis refuses past maxclients, close it and reserve
 * its descriptor as the spare. spare_lock held. */
static void shed(struct tcp_front *f, int fd)
{
    atomic_fetch_add_explicit(&f->total_conns, 1, memory_order_relaxed);
    refuse(fd);
    close(fd);
    atomic_fetch_add_explicit(&f->rejected, 1, memory_order_relaxed);
    atomic_store_explicit(&f->spare_fd, open_spare(), memory_order_relaxed);
    static struct kvlog_rate shedding = KVLOG_RATE_INIT(5);
    kvlog_rated(&shedding, KVLOG_WARNING, "refused a connection: out of file descriptors (raise the open-file "
                                          "limit, e.g. LimitNOFILE, or lower --maxclients)");
}

int tcp_accept(struct tcp_front *f, int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0 && atomic_load_explicit(&f->spare_fd, memory_order_relaxed) >= 0)
            return fd;
        if (fd >= 0) {
            /* The spare is missing: this accept may have taken its very fd (freed
             * to shed a connection), and admitted it would leave no descriptor to
             * shed with. The connection is refused and its fd reserved again. */
            pthread_mutex_lock(&f->spare_lock);
            int missing = atomic_load_explicit(&f->spare_fd, memory_order_relaxed) < 0;
            if (missing)
                shed(f, fd);
            pthread_mutex_unlock(&f->spare_lock);
            if (!missing)
                return fd;
            continue;
        }
        if (errno != EMFILE && errno != ENFILE)
            return -errno;
        uint64_t now = atomic_load_explicit(&f->clients, memory_order_relaxed);
        atomic_store_explicit(&f->fd_cap, now ? now : 1, memory_order_relaxed);
        /* Out of descriptors: the pending connection would keep the level-triggered
         * listener readable forever (a busy loop). Spend the spare descriptor to
         * accept it, answer it as Redis answers past maxclients (the client learns
         * why instead of hanging) and close it. accept4 says EMFILE before it looks
         * at the queue, so the queue may be empty: then the round is over. */
        pthread_mutex_lock(&f->spare_lock);
        int spare = atomic_load_explicit(&f->spare_fd, memory_order_relaxed);
        if (spare < 0)
            spare = open_spare(); /* taken by another accept meanwhile: fd_cap gives one back */
        if (spare < 0) {
            pthread_mutex_unlock(&f->spare_lock);
            return -EMFILE;
        }
        atomic_store_explicit(&f->spare_fd, -1, memory_order_relaxed); /* (another accept sees it missing) */
        close(spare);
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        int empty = fd < 0;
        if (fd >= 0)
            shed(f, fd);
        else
            atomic_store_explicit(&f->spare_fd, open_spare(), memory_order_relaxed);
        pthread_mutex_unlock(&f->spare_lock);
        if (empty)
            return -EAGAIN;
    }
}

void tcp_closed(struct tcp_front *f) { atomic_fetch_sub_explicit(&f->clients, 1, memory_order_relaxed); }

void tcp_timed_out(struct tcp_front *f, const char *addr, int limit_ms)
{
    static struct kvlog_rate stalls = KVLOG_RATE_INIT(5);
    atomic_fetch_add_explicit(&f->timed_out, 1, memory_order_relaxed);
    kvlog_rated(&stalls, KVLOG_WARNING,
                "closed client %s: stalled %d ms mid-request or not reading its reply (--client-timeout-ms)", addr,
                limit_ms);
}

void tcp_cron(struct tcp_front *f, int idx, int64_t now)
{
    /* each thread keeps its own slice of the shards rehashed and expired; not
     * while the node waits for its state (as Redis expires nothing while loading):
     * the log is being replayed and attached, and an expiry must be logged
     * (acquire: pairs with eng_attach's release of the log it attached) */
    unsigned per = (KVT_SHARDS + (unsigned)f->nthreads - 1) / (unsigned)f->nthreads;
    if (!atomic_load_explicit(&f->eng->loading, memory_order_acquire))
        kvt_housekeep(f->eng->table, (unsigned)idx * per, per, HOUSEKEEP_BUDGET);
    cmd_monitor_flush(f->eng); /* a thread pool's monitors: what their sockets did not take */
    if (idx != 0)
        return;
    if (!atomic_load_explicit(&f->fd_cap, memory_order_relaxed) ||
        atomic_load_explicit(&f->spare_fd, memory_order_relaxed) < 0) {
        f->fd_cap_seen_ms = 0;
    } else if (!f->fd_cap_seen_ms) {
        f->fd_cap_seen_ms = now;
    } else if (now - f->fd_cap_seen_ms >= TCP_FD_CAP_MS) {
        atomic_store_explicit(&f->fd_cap, 0, memory_order_relaxed);
        f->fd_cap_seen_ms = 0;
    }
    uint64_t total = 0;
    for (int i = 0; i < f->nthreads; i++)
        total += st_get(&f->st[i].commands);
    int64_t dt = now - f->ops_last_ms;
    if (f->ops_last_ms && dt > 0)
        atomic_store_explicit(&f->ops_samples[f->ops_idx++ % TCP_OPS_SAMPLES],
                              (total - f->ops_last) * 1000 / (uint64_t)dt, memory_order_relaxed);
    f->ops_last = total;
    f->ops_last_ms = now;
}

void tcp_add_stats(struct tcp_front *f, struct fe_stats *st)
{
    st->pollers += f->nthreads;
    st->connected_clients += atomic_load_explicit(&f->clients, memory_order_relaxed);
    st->total_connections += st_get(&f->total_conns);
    st->rejected_connections += st_get(&f->rejected);
    for (int i = 0; i < f->nthreads; i++) {
        struct tcp_thread *t = &f->st[i];
        st->total_commands += st_get(&t->commands);
        st->bytes_in += st_get(&t->bytes_in);
        st->bytes_out += st_get(&t->bytes_out);
        st->protocol_errors += st_get(&t->protocol_errors);
    }
    uint64_t ops = 0;
    for (int i = 0; i < TCP_OPS_SAMPLES; i++)
        ops += st_get(&f->ops_samples[i]);
    st->ops_per_sec += ops / TCP_OPS_SAMPLES;
}

int tcp_thread_stats(struct tcp_front *f, int i, struct fe_thread_stats *st)
{
    if (i < 0 || i >= f->nthreads)
        return -EINVAL;
    struct tcp_thread *t = &f->st[i];
    st->epoll_wait = st_get(&t->epoll_wait);
    st->epoll_ctl = st_get(&t->epoll_ctl);
    st->reads = st_get(&t->reads);
    st->writes = st_get(&t->writes);
    st->commands = st_get(&t->commands);
    st->accepted = st_get(&t->accepted);
    st->clients = st_get(&t->clients);
    st->bytes_in = st_get(&t->bytes_in);
    st->bytes_out = st_get(&t->bytes_out);
    return 0;
}

int tcp_fe_port(const void *state) { return ((const struct tcp_front *)state)->eng->port; }
void tcp_fe_add_stats(void *state, struct fe_stats *st) { tcp_add_stats(state, st); }
int tcp_fe_thread_stats(void *state, int i, struct fe_thread_stats *st) { return tcp_thread_stats(state, i, st); }
