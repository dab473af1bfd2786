/* threadpool.c - the thread-pool architecture (--arch threadpool), paper 000's
 * "LinuxTCP" baseline: a pool of worker threads, each handling one request at a
 * time with blocking calls — read the request, run it (its log record is
 * appended), wait until the log holds it, reply — before taking the next.
 *
 * Workers share one epoll instance; every connection (and the listener) is
 * registered EPOLLONESHOT, so exactly one worker owns a ready connection until
 * it re-arms it. Blocking waits are poll()/read() calls bounded by CRON_MS so a
 * stopping server is noticed. Same table, log, data file and commands as the
 * pollers; only the request-handling loop differs. Worker state: struct poller
 * (its counters, its eventfd for log and data-file wakeups). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "durability/bosc.h"
#include "server/server_int.h"
#include "core/table.h"
#include "durability/wal.h"

struct tp_conn {
    int tag;                 /* TAG_CONN */
    int fd;
    struct kvbuf in, out;
    size_t in_off;
    struct resp_parser rp;
    struct cmd_client cl;
    struct tp_conn *prev, *next; /* every connection, for closing them at stop */
};

static int stopping(struct srv *s) { return atomic_load_explicit(&s->stopping, memory_order_acquire); }

static void tp_close(struct srv *s, struct tp_conn *c)
{
    pthread_mutex_lock(&s->tp_lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->tp_conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&s->tp_lock);
    close(c->fd); /* also leaves the epoll set */
    atomic_fetch_sub_explicit(&s->clients, 1, memory_order_relaxed);
    kvbuf_free(&c->in);
    kvbuf_free(&c->out);
    resp_parser_free(&c->rp);
    free(c->cl.name);
    free(c);
}

static void tp_accept(struct poller *p)
{
    struct srv *s = p->srv;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(s->pollers[0].lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break;
        if (!srv_admit(s, fd))
            continue;
        struct tp_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            atomic_fetch_sub_explicit(&s->clients, 1, memory_order_relaxed);
            continue;
        }
        c->tag = TAG_CONN;
        c->fd = fd;
        resp_parser_init(&c->rp);
        srv_client_init(s, &c->cl, &c->out, fd);
        pthread_mutex_lock(&s->tp_lock);
        c->next = s->tp_conns;
        if (c->next)
            c->next->prev = c;
        s->tp_conns = c;
        pthread_mutex_unlock(&s->tp_lock);
        struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        st_inc(&p->st.epoll_ctl, 1);
        if (epoll_ctl(s->tp_epfd, EPOLL_CTL_ADD, fd, &e)) {
            tp_close(s, c);
            continue;
        }
        st_inc(&p->st.accepted, 1);
    }
}

/* Wait until fd is ready for ev; 0 ready, -1 stopping or error. */
static int wait_fd(struct srv *s, int fd, short ev)
{
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = ev};
        int r = poll(&pf, 1, CRON_MS);
        if (r > 0)
            return (pf.revents & (POLLERR | POLLNVAL)) ? -1 : 0;
        if ((r < 0 && errno != EINTR) || stopping(s))
            return -1;
    }
}

/* Blocking read of more input. Returns bytes read, 0 at end of stream, -1 error. */
static ssize_t tp_read(struct poller *p, struct tp_conn *c, int block)
{
    if (kvbuf_reserve(&c->in, READ_CHUNK))
        return -1;
    for (;;) {
        ssize_t n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
        st_inc(&p->st.reads, 1);
        if (n > 0) {
            c->in.len += (size_t)n;
            st_inc(&p->st.bytes_in, (uint64_t)n);
            return n;
        }
        if (n == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN || !block || wait_fd(p->srv, c->fd, POLLIN))
            return errno == EAGAIN && !block ? -2 : -1;
    }
}

static int tp_send(struct poller *p, struct tp_conn *c)
{
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + off, c->out.len - off, MSG_NOSIGNAL);
        st_inc(&p->st.writes, 1);
        if (n > 0) {
            off += (size_t)n;
            st_inc(&p->st.bytes_out, (uint64_t)n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            if (wait_fd(p->srv, c->fd, POLLOUT))
                return -1;
        } else {
            return -1;
        }
    }
    c->out.len = 0;
    kvbuf_shrink(&c->out, BUF_KEEP);
    return 0;
}

/* Block until the log holds LSN need (the worker's eventfd is woken by the log). */
static int wait_durable(struct poller *p, uint64_t need)
{
    struct wal *w = p->srv->cfg.wal;
    while (w && wal_durable_lsn(w) < need) {
        if (wal_failed(w) || stopping(p->srv))
            return -1;
        struct pollfd pf = {.fd = p->evfd, .events = POLLIN};
        if (poll(&pf, 1, CRON_MS) > 0) {
            uint64_t v;
            ssize_t r = read(p->evfd, &v, sizeof v);
            (void)r;
        }
    }
    return 0;
}

/* Run one request, waiting (blocking) for whatever the data file must do first. */
static int run_one(struct poller *p, struct tp_conn *c, int argc, const char **argv, const size_t *argl)
{
    struct srv *s = p->srv;
    uint64_t need = 0; /* over every run: a multi-key reply resumed after a load */
    for (;;) {
        size_t reply_at = c->out.len;
        kvt_lsn_reset();
        if (cmd_dispatch(&c->cl, argc, argv, argl))
            return -1;
        if (kvt_lsn_touched() > need)
            need = kvt_lsn_touched();
        int stall = c->cl.stall;
        if (!stall)
            break;
        c->cl.stall = CMD_STALL_NONE;
        if (!c->cl.resume_i)
            c->out.len = reply_at;
        if (stall == CMD_STALL_LOAD)
            kvt_load_sync(s->table, c->cl.stall_key, c->cl.stall_klen); /* an error is reported by the retry */
        else if (stall == CMD_STALL_MEM)
            kvt_wait_memory(s->table);
        else if (s->cfg.bosc)
            bosc_sync(s->cfg.bosc);
        if (stopping(s))
            return -1;
    }
    st_inc(&p->st.commands, 1);
    return wait_durable(p, need);
}

/* Serve the requests a ready connection has, one at a time. Returns 0 to keep
 * the connection (re-armed), -1 to close it. */
static int tp_serve(struct poller *p, struct tp_conn *c)
{
    ssize_t n = tp_read(p, c, 0);
    if (n == 0 || n == -1)
        return -1;
    for (;;) {
        if (c->in_off == c->in.len) {
            c->in.len = c->in_off = 0;
            kvbuf_shrink(&c->in, BUF_KEEP);
            return 0; /* all served: wait for the next request */
        }
        c->rp.unauth = !c->cl.authenticated;
        int rc = resp_parse(&c->rp, c->in.p + c->in_off, c->in.len - c->in_off);
        if (rc == RESP_AGAIN) {
            if (c->in.len - c->in_off > QUERYBUF_MAX)
                return -1;
            n = tp_read(p, c, 1); /* a request in part: block for the rest of it */
            if (n <= 0)
                return -1;
            continue;
        }
        if (rc == RESP_ERROR) {
            resp_add_errorf(&c->out, "ERR %s", c->rp.err);
            st_inc(&p->st.protocol_errors, 1);
            tp_send(p, c);
            return -1;
        }
        int argc = c->rp.argc;
        size_t start = c->in_off;
        c->in_off += c->rp.scan;
        if (argc > 0) {
            if (argc > p->argcap) {
                int cap = argc < 64 ? 64 : argc;
                const char **v = realloc(p->argv, (size_t)cap * sizeof *v);
                size_t *l = v ? realloc(p->argl, (size_t)cap * sizeof *l) : NULL;
                if (v)
                    p->argv = v;
                if (!l)
                    return -1;
                p->argl = l;
                p->argcap = cap;
            }
            for (int i = 0; i < argc; i++) {
                p->argv[i] = c->in.p + start + c->rp.argv[i].off;
                p->argl[i] = c->rp.argv[i].len;
            }
            c->cl.poller = p->idx;
            if (run_one(p, c, argc, p->argv, p->argl) || tp_send(p, c))
                return -1;
        }
        resp_reset(&c->rp);
        if (c->cl.close_after_reply)
            return -1;
        if (c->in_off > 0 && c->in_off >= c->in.cap / 2) {
            kvbuf_consume(&c->in, c->in_off);
            c->in_off = 0;
        }
    }
}

void *tp_worker_main(void *arg)
{
    struct poller *p = arg;
    struct srv *s = p->srv;
    while (!stopping(s)) {
        struct epoll_event ev;
        int n = epoll_wait(s->tp_epfd, &ev, 1, CRON_MS);
        st_inc(&p->st.epoll_wait, 1);
        int64_t now = srv_mono_ms();
        if (now - p->last_cron >= CRON_MS)
            srv_cron(p, now);
        if (n <= 0)
            continue;
        if (ev.data.ptr == &s->tp_listener_tag) {
            tp_accept(p);
            struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = &s->tp_listener_tag};
            epoll_ctl(s->tp_epfd, EPOLL_CTL_MOD, s->pollers[0].lfd, &e);
            continue;
        }
        struct tp_conn *c = ev.data.ptr;
        if (tp_serve(p, c)) {
            tp_close(s, c);
            continue;
        }
        struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
        st_inc(&p->st.epoll_ctl, 1);
        if (epoll_ctl(s->tp_epfd, EPOLL_CTL_MOD, c->fd, &e))
            tp_close(s, c);
    }
    return NULL;
}

void tp_close_all(struct srv *s)
{
    while (s->tp_conns)
        tp_close(s, s->tp_conns);
}
