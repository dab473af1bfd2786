/* threadpool.c - the thread-pool architecture (--arch threadpool), paper 000's
 * "LinuxTCP" baseline: a pool of worker threads, each handling one request at a
 * time with blocking calls — read the request, run it (its log record is
 * appended), wait until the log holds it, reply — before taking the next.
 *
 * Workers share one epoll instance; every connection (and the listener) is
 * registered EPOLLONESHOT, so exactly one worker owns a ready connection until
 * it re-arms it. Blocking waits are poll()/read() calls bounded by TCP_CRON_MS so a
 * stopping server is noticed; a wait on a client (the rest of a request, room for
 * a reply) ends after --client-timeout-ms without progress and closes it: else a
 * client that stalls mid-request, or never reads, holds its worker forever and
 * as many of them as there are workers freeze the server. Untrusted input (RESP
 * from clients). Same table, log, data file and commands as the
 * pollers (requests run through ses_run, waits through ses_wait); only the
 * request-handling loop differs. Worker state: struct tp_worker (its counters,
 * its eventfd for log wakeups). Client memory is published as the pollers do
 * (frontend/tcpmem.h) before each blocking wait — for the rest of a request (its
 * input and argument array), for room to send a reply (what is unsent) — and when
 * the connection goes idle, so that maxmemory-clients, client-output-buffer-limit
 * and the query-buffer limit hold for the pool too. Not after every request: a
 * reply the socket takes at once holds no memory worth counting, and the pool's
 * per-request cost stays the baseline's. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/counter.h"
#include "core/list.h"
#include "core/net.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "frontend/frontend.h"
#include "frontend/tcp.h"
#include "frontend/tcpmem.h"
#include "proto/resp.h"

struct tp_server;

struct tp_worker {
    int idx;
    struct tp_server *tp;
    pthread_t th;
    int started;
    int evfd;                /* woken by the log (subscribed): replies wait on it */
    struct tcp_thread *st;   /* its counters (in tp->tcp) */
    int64_t last_cron;
    struct resp_args args;   /* the request being run */
} __attribute__((aligned(64)));

struct tp_server {
    struct tcp_front tcp;    /* first: the tcp_fe_* callbacks take the state as one */
    struct kv_engine *eng;
    int lfd;                 /* the listener, EPOLLONESHOT in epfd */
    int epfd;                /* the workers' shared epoll set (connections EPOLLONESHOT) */
    int listener_tag;
    int nworkers;
    struct tp_worker *workers;
    _Atomic int stopping;
    pthread_mutex_t lock;    /* guards conns */
    struct list conns;       /* every connection, for closing them at stop */
};

struct tp_conn {
    int fd;
    struct kvbuf in, out;
    size_t in_off;
    struct resp_parser rp;
    struct session ses;
    struct list node;        /* on tp->conns */
};

static int stopping(struct tp_server *tp) { return atomic_load_explicit(&tp->stopping, memory_order_acquire); }

/* CONFIG SET client-timeout-ms changes it while workers wait (cmd/config.c). */
static int client_timeout(struct tp_server *tp)
{
    return __atomic_load_n(&tp->eng->cfg.client_timeout_ms, __ATOMIC_RELAXED);
}

/* Publish the connection's buffers (out from out_off unsent) and memory; -ENOMEM when
 * a client-memory limit closes it (counted and logged by the command layer). */
static int tp_publish(struct tp_conn *c, size_t out_off, int events)
{
    return tcp_conn_publish(&c->ses, kv_coarse_ms(), &c->in, c->in_off, &c->rp, &c->out, out_off, events) ? -ENOMEM
                                                                                                          : 0;
}

static void tp_close(struct tp_server *tp, struct tp_conn *c)
{
    pthread_mutex_lock(&tp->lock);
    list_del(&c->node);
    pthread_mutex_unlock(&tp->lock);
    ses_disconnect(&c->ses); /* before close: a CLIENT KILL must never see the fd reused */
    close(c->fd); /* also leaves the epoll set */
    tcp_closed(&tp->tcp);
    kvbuf_free(&c->in);
    kvbuf_free(&c->out);
    resp_parser_free(&c->rp);
    ses_free(&c->ses);
    free(c);
}

static void tp_accept(struct tp_worker *w)
{
    struct tp_server *tp = w->tp;
    for (int i = 0; i < 64; i++) {
        int fd = tcp_accept(&tp->tcp, tp->lfd);
        if (fd < 0)
            break;
        if (!tcp_admit(&tp->tcp, fd, 1))
            continue;
        struct tp_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            tcp_closed(&tp->tcp);
            continue;
        }
        c->fd = fd;
        resp_parser_init(&c->rp);
        char addr[64];
        net_peer_addr(fd, addr, sizeof addr);
        /* no eventfd: a worker waits for the data file in ses_wait, blocking */
        ses_init(&c->ses, tp->eng, &c->out, addr, w->idx, -1);
        pthread_mutex_lock(&tp->lock);
        list_add(&tp->conns, &c->node);
        pthread_mutex_unlock(&tp->lock);
        ses_connect(&c->ses, fd, kv_coarse_ms());
        struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        st_inc(&w->st->epoll_ctl, 1);
        if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &e)) {
            tp_close(tp, c);
            continue;
        }
        st_inc(&w->st->accepted, 1);
    }
}

/* Wait until the client's fd is ready for ev; 0 ready, -ETIMEDOUT when it was
 * not within client_timeout_ms (0: no bound), -EPIPE stopping or error. Called
 * after each EAGAIN, so the bound is on a stall, not on a whole transfer. */
static int wait_fd(struct tp_server *tp, int fd, short ev)
{
    int limit = client_timeout(tp);
    int64_t deadline = kv_coarse_ms() + limit;
    for (;;) {
        int wait = TCP_CRON_MS;
        if (limit > 0) {
            int64_t left = deadline - kv_coarse_ms();
            if (left <= 0)
                return -ETIMEDOUT;
            wait = left < wait ? (int)left : wait;
        }
        struct pollfd pf = {.fd = fd, .events = ev};
        int r = poll(&pf, 1, wait);
        if (r > 0)
            return (pf.revents & (POLLERR | POLLNVAL)) ? -EPIPE : 0;
        if ((r < 0 && errno != EINTR) || stopping(tp))
            return -EPIPE;
    }
}

/* Read more input. Returns bytes read, 0 at end of stream, -EAGAIN when nothing
 * is there and !block, another -errno on error or stop. */
static ssize_t tp_read(struct tp_worker *w, struct tp_conn *c, int block)
{
    if (kvbuf_reserve(&c->in, TCP_READ_CHUNK))
        return -ENOMEM;
    for (;;) {
        ssize_t n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
        st_inc(&w->st->reads, 1);
        if (n > 0) {
            c->in.len += (size_t)n;
            st_inc(&w->st->bytes_in, (uint64_t)n);
            return n;
        }
        if (n == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return -errno;
        if (!block)
            return -EAGAIN;
        int rc = wait_fd(w->tp, c->fd, POLLIN);
        if (rc)
            return rc;
    }
}

static int tp_send(struct tp_worker *w, struct tp_conn *c)
{
    if (c->ses.cl.mon) /* other threads write its lines: its socket is written under their lock */
        return cmd_monitor_reply(&c->ses.cl);
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + off, c->out.len - off, MSG_NOSIGNAL);
        st_inc(&w->st->writes, 1);
        if (n > 0) {
            off += (size_t)n;
            st_inc(&w->st->bytes_out, (uint64_t)n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            /* the client reads slower than it asks: its unsent reply counts against the
             * output-buffer limits (soft: for how long) and maxmemory-clients */
            int rc = tp_publish(c, off, CMD_EV_WRITE);
            if (rc || (rc = wait_fd(w->tp, c->fd, POLLOUT)))
                return rc;
        } else {
            return n < 0 ? -errno : -EPIPE;
        }
    }
    c->out.len = 0;
    kvbuf_shrink(&c->out, TCP_BUF_KEEP);
    return 0;
}

/* Block until the log holds LSN need (the worker's eventfd is woken by the log). */
static int wait_durable(struct tp_worker *w, uint64_t need)
{
    struct wal *log = w->tp->eng->wal;
    while (log && wal_durable_lsn(log) < need) {
        if (wal_failed(log) || stopping(w->tp))
            return -EIO;
        struct pollfd pf = {.fd = w->evfd, .events = POLLIN};
        if (poll(&pf, 1, TCP_CRON_MS) > 0) {
            uint64_t v;
            ssize_t r = read(w->evfd, &v, sizeof v);
            (void)r;
        }
    }
    return 0;
}

/* Run one request, waiting (blocking) for whatever the data file must do first,
 * then for the log to hold what the reply depends on. 0 or -errno. */
static int run_one(struct tp_worker *w, struct tp_conn *c, int argc)
{
    int r;
    while ((r = ses_run(&c->ses, argc, w->args.argv, w->args.argl)) == SES_STALL) {
        ses_wait(&c->ses); /* an error is reported by the run after it */
        if (stopping(w->tp))
            return -EPIPE;
    }
    if (r < 0)
        return r;
    st_inc(&w->st->commands, 1);
    return r == SES_HOLD ? wait_durable(w, c->ses.need) : 0;
}

/* Serve the requests a ready connection has, one at a time. Returns 0 to keep
 * the connection (re-armed), -errno to close it. */
static int tp_serve(struct tp_worker *w, struct tp_conn *c)
{
    ssize_t n = tp_read(w, c, 0);
    if (n <= 0)
        return n == -EAGAIN ? 0 : n ? (int)n : -EPIPE;
    for (;;) {
        if (c->in_off == c->in.len) {
            c->in.len = c->in_off = 0;
            kvbuf_shrink(&c->in, TCP_BUF_KEEP);
            return tp_publish(c, 0, CMD_EV_READ); /* all served: wait for the next request */
        }
        c->rp.unauth = !c->ses.cl.authenticated;
        int rc = resp_parse(&c->rp, c->in.p + c->in_off, c->in.len - c->in_off);
        if (rc == RESP_AGAIN) {
            /* the query-buffer limit (the parser's argument array counted) and the
             * client bound, before reading more of a request in part */
            if ((rc = tp_publish(c, 0, CMD_EV_READ)))
                return rc;
            n = tp_read(w, c, 1); /* block for the rest of it */
            if (n <= 0)
                return n ? (int)n : -EPIPE;
            continue;
        }
        if (rc == RESP_ERROR) {
            resp_add_errorf(&c->out, "ERR %s", c->rp.err);
            st_inc(&w->st->protocol_errors, 1);
            tp_send(w, c);
            return -EPROTO;
        }
        int argc = c->rp.argc;
        size_t start = c->in_off;
        c->in_off += c->rp.scan;
        if (argc > 0) {
            if (resp_args_reserve(&w->args, argc))
                return -ENOMEM;
            for (int i = 0; i < argc; i++) {
                w->args.argv[i] = c->in.p + start + c->rp.argv[i].off;
                w->args.argl[i] = c->rp.argv[i].len;
            }
            c->ses.cl.poller = w->idx;
            if ((rc = run_one(w, c, argc)) || (rc = tp_send(w, c)))
                return rc;
        }
        resp_reset(&c->rp);
        if (c->ses.cl.close_after_reply)
            return -EPIPE;
        if (c->in_off > 0 && c->in_off >= c->in.cap / 2) {
            kvbuf_consume(&c->in, c->in_off);
            c->in_off = 0;
        }
    }
}

static void *tp_worker_main(void *arg)
{
    struct tp_worker *w = arg;
    struct tp_server *tp = w->tp;
    while (!stopping(tp)) {
        struct epoll_event ev;
        int n = epoll_wait(tp->epfd, &ev, 1, TCP_CRON_MS);
        st_inc(&w->st->epoll_wait, 1);
        int64_t now = kv_coarse_ms();
        if (now - w->last_cron >= TCP_CRON_MS) {
            w->last_cron = now;
            tcp_cron(&tp->tcp, w->idx, now);
        }
        if (n <= 0)
            continue;
        if (ev.data.ptr == &tp->listener_tag) {
            tp_accept(w);
            struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = &tp->listener_tag};
            epoll_ctl(tp->epfd, EPOLL_CTL_MOD, tp->lfd, &e);
            continue;
        }
        struct tp_conn *c = ev.data.ptr;
        int rc = tp_serve(w, c);
        if (rc) {
            if (rc == -ETIMEDOUT)
                tcp_timed_out(&tp->tcp, c->ses.cl.addr, client_timeout(tp));
            tp_close(tp, c);
            continue;
        }
        struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        st_inc(&w->st->epoll_ctl, 1);
        if (epoll_ctl(tp->epfd, EPOLL_CTL_MOD, c->fd, &e))
            tp_close(tp, c);
    }
    return NULL;
}

/* ---- lifecycle (struct kv_frontend_ops) */

static void tp_stop(void *st);
static void tp_destroy(void *st);

static int tp_create(void **out, struct kv_engine *eng, char *err, size_t errlen)
{
    int n = eng->cfg.threads;
    struct tp_server *tp = calloc(1, sizeof *tp);
    if (!tp) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    tp->lfd = tp->epfd = -1;
    tp->eng = eng;
    list_init(&tp->conns);
    pthread_mutex_init(&tp->lock, NULL);
    int rc = tcp_init(&tp->tcp, eng, n, err, errlen); /* checks the thread count */
    if (rc < 0 || !(tp->workers = aligned_alloc(64, sizeof *tp->workers * (size_t)n))) {
        if (!rc)
            snprintf(err, errlen, "out of memory");
        tp_destroy(tp);
        return rc < 0 ? rc : -ENOMEM;
    }
    memset(tp->workers, 0, sizeof *tp->workers * (size_t)n);
    for (int i = 0; i < n; i++)
        tp->workers[i].evfd = -1;
    tp->nworkers = n;
    if ((tp->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        struct tp_worker *w = &tp->workers[i];
        w->idx = i;
        w->tp = tp;
        w->st = &tp->tcp.st[i];
        if ((w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
            rc = -errno;
            snprintf(err, errlen, "eventfd: %s", strerror(errno));
            goto fail;
        }
        if ((rc = ses_subscribe(eng, w->evfd, err, errlen)) < 0)
            goto fail;
    }
    if ((tp->lfd = tcp_listen(&tp->tcp, 0, err, errlen)) < 0) {
        rc = tp->lfd;
        goto fail;
    }
    /* one worker at a time accepts, then re-arms the listener */
    struct epoll_event le = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = &tp->listener_tag};
    epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->lfd, &le);
    *out = tp;
    return 0;
fail:
    tp_destroy(tp);
    return rc;
}

static int tp_start(void *st, char *err, size_t errlen)
{
    struct tp_server *tp = st;
    for (int i = 0; i < tp->nworkers; i++) {
        struct tp_worker *w = &tp->workers[i];
        int rc = pthread_create(&w->th, NULL, tp_worker_main, w);
        if (rc) {
            snprintf(err, errlen, "cannot start worker thread: %s", strerror(rc));
            tp_stop(tp);
            return -rc;
        }
        w->started = 1;
        char name[16];
        snprintf(name, sizeof name, "kv-worker-%d", i % 10000);
        pthread_setname_np(w->th, name);
    }
    return 0;
}

static void tp_stop(void *st)
{
    struct tp_server *tp = st;
    /* release: workers that see stopping also see everything written before it */
    atomic_store_explicit(&tp->stopping, 1, memory_order_release);
    for (int i = 0; i < tp->nworkers; i++) {
        uint64_t one = 1;
        if (tp->workers[i].evfd >= 0) {
            ssize_t r = write(tp->workers[i].evfd, &one, sizeof one);
            (void)r;
        }
    }
    for (int i = 0; i < tp->nworkers; i++) {
        if (tp->workers[i].started) {
            pthread_join(tp->workers[i].th, NULL);
            tp->workers[i].started = 0;
        }
    }
    while (!list_empty(&tp->conns))
        tp_close(tp, list_entry(tp->conns.next, struct tp_conn, node));
}

static void tp_destroy(void *st)
{
    struct tp_server *tp = st;
    if (!tp)
        return;
    tp_stop(tp);
    for (int i = 0; i < tp->nworkers; i++) {
        if (tp->workers[i].evfd >= 0)
            close(tp->workers[i].evfd);
        resp_args_free(&tp->workers[i].args);
    }
    if (tp->lfd >= 0)
        close(tp->lfd);
    if (tp->epfd >= 0)
        close(tp->epfd);
    free(tp->workers);
    tcp_free(&tp->tcp);
    pthread_mutex_destroy(&tp->lock);
    free(tp);
}

const struct kv_frontend_ops fe_threadpool = {"threadpool", tp_create, tp_start, tp_stop, tp_destroy,
                                              tcp_fe_port, tcp_fe_add_stats, tcp_fe_thread_stats};
