/* nbd.c - the NBD server's lifecycle (see nbd.h): settings checked, listeners
 * bound, worker threads and their backend contexts created, started, stopped;
 * stats summed over the threads; the "blockdev" INFO lines; and fe_nbd, the
 * front end server.c creates when kv_config.nbd is set.
 * Threads: control thread, except nbd_get_stats and the INFO provider (any
 * thread: relaxed counters). Thread 0 accepts every connection and hands them
 * round robin to the workers (nbd_conn.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "core/log.h"
#include "core/net.h"
#include "core/tls.h"
#include "engine/engine.h"
#include "frontend/frontend.h"
#include "frontend/nbd_int.h"

static char *dup_or(const char *s, const char *dflt)
{
    return strdup(s && *s ? s : dflt);
}

static int check(const struct nbd_config *c, char *err, size_t errlen)
{
#define BAD(...) return snprintf(err, errlen, __VA_ARGS__), -EINVAL
    if (!c)
        BAD("no block device settings");
    uint32_t bs = c->block_size;
    if (bs < 512 || bs > (1u << 20) || (bs & (bs - 1)))
        BAD("block size %u: expected a power of two from 512 to 1048576", bs);
    if (c->size == 0 || c->size % bs)
        BAD("size %llu: expected a positive multiple of the block size (%u)", (unsigned long long)c->size, bs);
    if (c->size > (1ull << 62))
        BAD("size %llu: at most 2^62 bytes", (unsigned long long)c->size);
    if (c->threads < 1 || c->threads > NBD_MAX_THREADS)
        BAD("threads %d: expected 1 to %d", c->threads, NBD_MAX_THREADS);
    if (c->conns_per_thread < 1 || c->conns_per_thread > NBD_MAX_CONNS_PER_THREAD)
        BAD("connections per thread %d: expected 1 to %d", c->conns_per_thread, NBD_MAX_CONNS_PER_THREAD);
    if (c->busy_poll_us < 0 || c->busy_poll_us > NBD_MAX_BUSY_POLL_US)
        BAD("busy poll %d us: expected 0 (off) to %d", c->busy_poll_us, NBD_MAX_BUSY_POLL_US);
    if (c->port < -1 || c->port > 65535)
        BAD("port %d: expected 0 to 65535 (0: any free port), or -1 for no TCP listener", c->port);
    int has_unix = c->unix_path && *c->unix_path;
    if (c->port < 0 && !has_unix)
        BAD("no listener: give a TCP port or a unix socket path");
    if (has_unix && strlen(c->unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        BAD("unix socket path too long: at most %zu bytes", sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    if (c->export_name && strlen(c->export_name) > NBD_MAX_NAME)
        BAD("export name too long: at most %u bytes", NBD_MAX_NAME);
    if (c->description && strlen(c->description) > NBD_MAX_NAME)
        BAD("description too long: at most %u bytes", NBD_MAX_NAME);
    if (c->tls < NBD_TLS_OFF || c->tls > NBD_TLS_REQUIRE)
        BAD("tls %d: expected off (0), on (1) or require (2)", c->tls);
    int has_cert = c->tls_cert_file && *c->tls_cert_file, has_psk = c->tls_psk_file && *c->tls_psk_file;
    if (c->tls && !has_cert && !has_psk)
        BAD("--tls %s needs --tls-cert-file and --tls-key-file (x509; and --tls-ca-cert-file unless "
            "--tls-auth-clients no) or --tls-psk-file", c->tls == NBD_TLS_ON ? "on" : "require");
    if (c->tls && tls_auth_parse(c->tls_auth_clients) < 0)
        BAD("tls-auth-clients '%s': expected yes, no or optional", c->tls_auth_clients);
    if (c->tls && has_cert && has_psk)
        BAD("--tls-psk-file and --tls-cert-file: give one of them (pre-shared keys or certificates)");
    struct in_addr a;
    const char *bind = c->bind && *c->bind ? c->bind : "127.0.0.1";
    if (c->port >= 0 && c->tls != NBD_TLS_REQUIRE && !c->allow_plain_remote &&
        (inet_pton(AF_INET, bind, &a) != 1 || (ntohl(a.s_addr) >> 24) != 127))
        BAD("listening on %s without --tls require would let anyone who reaches that address read and write "
            "the device: use --tls require (with --tls-cert-file, --tls-key-file and --tls-ca-cert-file, or "
            "--tls-psk-file), listen on 127.0.0.1 or a unix socket, or allow it with --no-protected-mode", bind);
    if (!nbd_backend_find(c->backend && *c->backend ? c->backend : "embedded"))
        BAD("unknown backend '%s': expected embedded, kvstore://HOST:PORT, redis://HOST:PORT[/DB] or "
            "memcached://HOST:PORT", c->backend);
#undef BAD
    return 0;
}

static int listen_unix(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return snprintf(err, errlen, "cannot create a unix socket: %s", strerror(errno)), -errno;
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path); /* a socket left by an earlier run (nothing can listen on a socket file twice) */
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 511) < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot listen on unix socket %s: %s", path, strerror(e));
        close(fd);
        return -e;
    }
    return fd;
}

static int listen_tcp(struct nbd_server *s, char *err, size_t errlen)
{
    int port = s->port;
    int fd = net_bind(SOCK_STREAM | SOCK_NONBLOCK, s->bind, &port, 0, 0, "listen on", err, errlen);
    if (fd < 0)
        return fd;
    if (listen(fd, 511) < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot listen on %s:%d: %s", s->bind, port, strerror(e));
        close(fd);
        return -e;
    }
    s->tcp_port = port;
    return fd;
}

static int add_watch(int epfd, int fd, struct nbd_watch *w, char *err, size_t errlen)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = w};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
        return snprintf(err, errlen, "epoll_ctl: %s", strerror(errno)), -errno;
    return 0;
}

static int thread_init(struct nbd_server *s, int i, char *err, size_t errlen)
{
    struct nbd_thread *t = &s->th[i];
    t->s = s;
    t->idx = i;
    list_init(&t->conns);
    list_init(&t->live);
    pthread_mutex_init(&t->glock, NULL);
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    fdq_init(&t->q, t->evfd);
    t->blocks_cap = 256;
    t->blocks = calloc((size_t)t->blocks_cap, sizeof *t->blocks);
    if (t->epfd < 0 || t->evfd < 0 || !t->blocks)
        return snprintf(err, errlen, "cannot create thread %d's epoll/eventfd: %s", i, strerror(errno)), -ENOMEM;
    t->wake.kind = NBD_WATCH_WAKE;
    t->wake.ctx = t;
    int rc = add_watch(t->epfd, t->evfd, &t->wake, err, errlen);
    if (rc < 0)
        return rc;
    if (i == 0) { /* thread 0 accepts for all (round robin, nbd_conn.c) */
        for (int k = 0; k < 2; k++) {
            int fd = k ? s->unix_fd : s->tcp_fd;
            if (fd < 0)
                continue;
            s->listen_w[k].kind = NBD_WATCH_LISTEN;
            s->listen_w[k].ctx = (void *)(intptr_t)fd;
            if ((rc = add_watch(t->epfd, fd, &s->listen_w[k], err, errlen)) < 0)
                return rc;
        }
    }
    struct nbd_backend_cfg bc = {.url = s->backend, .key_prefix = s->key_prefix, .block_size = s->block_size,
                                 .size = s->size, .read_only = s->read_only, .conns = s->conns_per_thread,
                                 .thread = i, .eng = s->eng, .epfd = t->epfd};
    return s->be->open(&t->be, &bc, err, errlen);
}

int nbd_create(struct nbd_server **out, const struct nbd_config *cfg, struct kv_engine *eng, char *err,
               size_t errlen)
{
    int rc = check(cfg, err, errlen);
    if (rc < 0)
        return rc;
    struct nbd_server *s = calloc(1, sizeof *s);
    if (!s)
        return snprintf(err, errlen, "out of memory"), -ENOMEM;
    s->tcp_fd = s->unix_fd = -1;
    s->tcp_port = -1;
    for (int i = 0; i < NBD_LOCK_STRIPES; i++)
        pthread_mutex_init(&s->locks[i].m, NULL);
    s->bind = dup_or(cfg->bind, "127.0.0.1");
    s->unix_path = cfg->unix_path && *cfg->unix_path ? strdup(cfg->unix_path) : NULL;
    s->export_name = strdup(cfg->export_name ? cfg->export_name : "kvstore");
    s->description = cfg->description ? strdup(cfg->description) : NULL;
    s->backend = dup_or(cfg->backend, "embedded");
    if (cfg->key_prefix && *cfg->key_prefix) {
        s->key_prefix = strdup(cfg->key_prefix);
    } else if ((s->key_prefix = malloc(strlen(s->export_name) + 6))) {
        sprintf(s->key_prefix, "nbd:%s:", s->export_name);
    }
    s->port = cfg->port;
    s->threads = cfg->threads;
    s->conns_per_thread = cfg->conns_per_thread;
    s->busy_poll_ns = (uint64_t)cfg->busy_poll_us * 1000;
    s->read_only = !!cfg->read_only;
    s->max_clients = cfg->max_clients > 0 ? cfg->max_clients : 1024;
    s->size = cfg->size;
    s->block_size = cfg->block_size;
    while ((1u << s->bs_shift) < s->block_size)
        s->bs_shift++;
    s->eng = eng;
    s->be = nbd_backend_find(s->backend);
    s->tls_mode = cfg->tls;
    if (cfg->tls) {
        int psk = cfg->tls_psk_file && *cfg->tls_psk_file;
        struct tls_opts o = {.server = 1, .cert_file = cfg->tls_cert_file, .key_file = cfg->tls_key_file,
                             .ca_file = cfg->tls_ca_cert_file, .psk_file = cfg->tls_psk_file,
                             .auth = psk ? TLS_AUTH_NO : (enum tls_auth)tls_auth_parse(cfg->tls_auth_clients)};
        char why[256];
        if ((rc = tls_ctx_new(&s->tls, &o, why, sizeof why)) < 0) {
            snprintf(err, errlen, "--tls: %s", why);
            goto fail;
        }
    }
    if (!s->bind || (cfg->unix_path && *cfg->unix_path && !s->unix_path) || !s->export_name || !s->backend ||
        !s->key_prefix || (cfg->description && !s->description)) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    if (s->port >= 0 && (rc = s->tcp_fd = listen_tcp(s, err, errlen)) < 0)
        goto fail;
    if (s->unix_path && (rc = s->unix_fd = listen_unix(s->unix_path, err, errlen)) < 0)
        goto fail;
    if (!(s->th = calloc((size_t)s->threads, sizeof *s->th))) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < s->threads; i++) /* all, before any init: nbd_destroy closes what is >= 0 */
        s->th[i].epfd = s->th[i].evfd = -1;
    for (int i = 0; i < s->threads; i++)
        if ((rc = thread_init(s, i, err, errlen)) < 0)
            goto fail;
    *out = s;
    return 0;
fail:
    nbd_destroy(s);
    return rc < 0 ? rc : -ENOMEM;
}

int nbd_start(struct nbd_server *s, char *err, size_t errlen)
{
    atomic_store(&s->stop, 0);
    for (int i = 0; i < s->threads; i++) {
        int rc = pthread_create(&s->th[i].tid, NULL, nbd_thread_main, &s->th[i]);
        if (rc) {
            snprintf(err, errlen, "cannot start NBD thread %d: %s", i, strerror(rc));
            nbd_stop(s);
            return -rc;
        }
        s->th[i].running = 1;
    }
    return 0;
}

void nbd_stop(struct nbd_server *s)
{
    if (!s || !s->th)
        return;
    atomic_store_explicit(&s->stop, 1, memory_order_release);
    for (int i = 0; i < s->threads; i++) { /* all at once: each drains its operations (NBD_DRAIN_MS) */
        uint64_t one = 1;
        if (s->th[i].running)
            (void)!write(s->th[i].evfd, &one, sizeof one);
    }
    for (int i = 0; i < s->threads; i++) {
        struct nbd_thread *t = &s->th[i];
        if (!t->running)
            continue;
        pthread_join(t->tid, NULL);
        t->running = 0;
    }
}

void nbd_destroy(struct nbd_server *s)
{
    if (!s)
        return;
    nbd_stop(s);
    for (int i = 0; s->th && i < s->threads; i++) {
        struct nbd_thread *t = &s->th[i];
        if (t->be)
            s->be->close(t->be); /* operations it still held never complete: */
        if (t->s) {
            nbd_req_free_live(t); /* their requests go here */
            nbd_conn_free_all(t);
        }
        nbd_req_pool_free(t);
        free(t->tls_out);
        if (t->s)
            fdq_free(&t->q);
        if (t->epfd >= 0)
            close(t->epfd);
        if (t->evfd >= 0)
            close(t->evfd);
        if (t->s)
            pthread_mutex_destroy(&t->glock);
    }
    free(s->th);
    if (s->tcp_fd >= 0)
        close(s->tcp_fd);
    if (s->unix_fd >= 0) {
        close(s->unix_fd);
        unlink(s->unix_path);
    }
    nbd_locks_free(s);
    tls_ctx_free(s->tls);
    free(s->bind);
    free(s->unix_path);
    free(s->export_name);
    free(s->description);
    free(s->backend);
    free(s->key_prefix);
    free(s);
}

int nbd_port(const struct nbd_server *s) { return s->tcp_fd >= 0 ? s->tcp_port : -1; }

void nbd_get_stats(struct nbd_server *s, struct nbd_stats *st)
{
    uint64_t sum[NBD_NSTATS] = {0};
    struct nbd_backend_stats bs = {0};
    for (int i = 0; i < s->threads; i++) {
        for (size_t k = 0; k < NBD_NSTATS; k++)
            sum[k] += st_get(&s->th[i].st[k]);
        if (s->th[i].be && s->be->add_stats)
            s->be->add_stats(s->th[i].be, &bs);
    }
    memcpy(st, sum, sizeof *st);
    st->backend_errors += bs.errors;
    st->backend_reconnects = bs.reconnects;
}

/* ---- the front end (server.c creates it when kv_config.nbd is set) */

static void info_blockdev(void *arg, struct kvbuf *b)
{
    struct nbd_server *s = arg;
    struct nbd_stats st;
    nbd_get_stats(s, &st);
    uint64_t ios = st.reads + st.writes + st.trims + st.zeroes;
    uint64_t kv = st.kv_gets + st.kv_puts + st.kv_dels;
#define U(x) (unsigned long long)(x)
    kvbuf_printf(b,
                 "blockdev_export:%s\r\nblockdev_size:%llu\r\nblockdev_block_size:%u\r\nblockdev_backend:%s\r\n"
                 "blockdev_threads:%d\r\nblockdev_port:%d\r\nblockdev_unix_socket:%s\r\nblockdev_read_only:%d\r\n"
                 "blockdev_tls:%s\r\n"
                 "blockdev_connections:%llu\r\nblockdev_total_connections:%llu\r\n"
                 "blockdev_rejected_connections:%llu\r\nblockdev_protocol_errors:%llu\r\n"
                 "blockdev_reads:%llu\r\nblockdev_writes:%llu\r\nblockdev_flushes:%llu\r\nblockdev_trims:%llu\r\n"
                 "blockdev_write_zeroes:%llu\r\nblockdev_fua:%llu\r\nblockdev_errors:%llu\r\n"
                 "blockdev_bytes_read:%llu\r\nblockdev_bytes_written:%llu\r\n"
                 "blockdev_kv_gets:%llu\r\nblockdev_kv_puts:%llu\r\nblockdev_kv_dels:%llu\r\n"
                 "blockdev_kv_syncs:%llu\r\nblockdev_kv_per_io:%.2f\r\nblockdev_rmw:%llu\r\n"
                 "blockdev_inflight:%llu\r\nblockdev_avg_queue_depth:%.2f\r\n"
                 "blockdev_backend_errors:%llu\r\nblockdev_backend_reconnects:%llu\r\n",
                 s->export_name, U(s->size), s->block_size, s->backend, s->threads, nbd_port(s),
                 s->unix_path ? s->unix_path : "", s->read_only,
                 s->tls_mode == NBD_TLS_REQUIRE ? "require" : s->tls_mode == NBD_TLS_ON ? "on" : "off",
                 U(st.connections), U(st.total_connections),
                 U(st.rejected_connections), U(st.protocol_errors), U(st.reads), U(st.writes), U(st.flushes),
                 U(st.trims), U(st.zeroes), U(st.fua), U(st.errors), U(st.bytes_read), U(st.bytes_written),
                 U(st.kv_gets), U(st.kv_puts), U(st.kv_dels), U(st.kv_syncs), ios ? (double)kv / (double)ios : 0.0,
                 U(st.rmw), U(st.inflight),
                 st.inflight_samples ? (double)st.inflight_sum / (double)st.inflight_samples : 0.0,
                 U(st.backend_errors), U(st.backend_reconnects));
#undef U
}

static int fe_create(void **state, struct kv_engine *eng, char *err, size_t errlen)
{
    struct nbd_server *s;
    int rc = nbd_create(&s, eng->cfg.nbd, eng, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = eng_info_add(eng, "blockdev", info_blockdev, NULL, s)) < 0) {
        snprintf(err, errlen, "cannot register INFO blockdev: %s", strerror(-rc));
        nbd_destroy(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int fe_start(void *state, char *err, size_t errlen) { return nbd_start(state, err, errlen); }
static void fe_stop(void *state) { nbd_stop(state); }
static void fe_destroy(void *state) { nbd_destroy(state); }
static int fe_port(const void *state) { return nbd_port(state); }
/* NBD connections are not RESP clients: INFO clients/stats leave them out (INFO blockdev has them) */
static void fe_add_stats(void *state, struct fe_stats *st) {}

const struct kv_frontend_ops fe_nbd = {
    .name = "nbd",
    .create = fe_create,
    .start = fe_start,
    .stop = fe_stop,
    .destroy = fe_destroy,
    .port = fe_port,
    .add_stats = fe_add_stats,
};
