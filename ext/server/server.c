/* server.c - poller threads, connections, accept (INFO is in info.c; see server.h).
 * Threads: the control thread runs srv_create/start/stop; each poller thread owns
 * its epoll fd, its listener (reuseport mode) and its connections. Cross-thread
 * state: the client count and id counter (atomics), handoff queues (mutex), and
 * per-poller stats (_Atomic, written by the owner only, read by INFO anywhere).
 * Reads untrusted bytes from sockets; the parser (resp.c) bounds them. */
#define _GNU_SOURCE
#include "server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "durability/bosc.h"
#include "cmd/cmd.h"
#ifdef KV_HAVE_DPDK
#include "frontend/dpdk.h"
#endif
#include "frontend/pollpolicy.h"
#include "proto/resp.h"
#include "core/table.h"
#include "frontend/udpsrv.h"
#include "durability/wal.h"
#include "durability/replog.h"
#include "server/server_int.h"

int64_t srv_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- connections */

static void conn_free(struct conn *c)
{
    struct poller *p = c->p;
    if (c->prev)
        c->prev->next = c->next;
    else
        p->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    kvbuf_free(&c->in);
    kvbuf_free(&c->out);
    free(c->holds);
    resp_parser_free(&c->rp);
    free(c->cl.name);
    free(c);
}

static void list_pending(struct conn *c);

static void wait_add(struct conn *c)
{
    if (c->waiting)
        return;
    c->waiting = 1;
    c->wprev = NULL;
    c->wnext = c->p->waiting;
    if (c->wnext)
        c->wnext->wprev = c;
    c->p->waiting = c;
}

static void wait_del(struct conn *c)
{
    if (!c->waiting)
        return;
    c->waiting = 0;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else
        c->p->waiting = c->wnext;
    if (c->wnext)
        c->wnext->wprev = c->wprev;
}

/* The next request waits for the data file: a key to load, or memory. Input
 * stays unparsed (EPOLLIN is dropped) until a wakeup runs it again. */
static void stall_add(struct conn *c)
{
    struct poller *p = c->p;
    struct bosc *b = p->srv->cfg.bosc;
    if (c->cl.stall == CMD_STALL_LOAD)
        bosc_request_load(b, c->cl.stall_key, c->cl.stall_klen, p->evfd); /* ENOMEM: cron retries */
    else if (c->cl.stall == CMD_STALL_MEM)
        bosc_kick(b);
    /* CMD_STALL_SYNC: requested already; every sweep wakes the pollers */
    c->cl.stall = CMD_STALL_NONE;
    if (c->stalled)
        return;
    c->stalled = 1;
    c->sprev = NULL;
    c->snext = p->stalled;
    if (c->snext)
        c->snext->sprev = c;
    p->stalled = c;
}

static void stall_del(struct conn *c)
{
    if (!c->stalled)
        return;
    c->stalled = 0;
    if (c->sprev)
        c->sprev->snext = c->snext;
    else
        c->p->stalled = c->snext;
    if (c->snext)
        c->snext->sprev = c->sprev;
}

/* End of the part of out that may be sent now: up to the first reply still
 * waiting for its LSN to become durable. */
static size_t sendable_end(struct conn *c)
{
    if (!c->hold_n)
        return c->out.len;
    uint64_t durable = wal_durable_lsn(c->p->srv->cfg.wal);
    while (c->hold_n && c->holds[c->hold_head].lsn <= durable) {
        c->hold_head++;
        c->hold_n--;
    }
    if (!c->hold_n) {
        c->hold_head = 0;
        return c->out.len;
    }
    return c->holds[c->hold_head].off;
}

/* The reply just appended at out[off..] depends on LSN need. */
static int hold_reply(struct conn *c, size_t off, uint64_t need)
{
    if (need <= c->hold_max || need <= wal_durable_lsn(c->p->srv->cfg.wal))
        return 0; /* already behind an earlier hold, or already durable */
    if (c->hold_head + c->hold_n == c->hold_cap) {
        if (c->hold_head) { /* reuse the consumed front */
            memmove(c->holds, c->holds + c->hold_head, (size_t)c->hold_n * sizeof *c->holds);
            c->hold_head = 0;
        } else {
            int cap = c->hold_cap ? c->hold_cap * 2 : 16;
            struct hold *h = realloc(c->holds, (size_t)cap * sizeof *h);
            if (!h)
                return -1;
            c->holds = h;
            c->hold_cap = cap;
        }
    }
    c->holds[c->hold_head + c->hold_n++] = (struct hold){off, need};
    c->hold_max = need;
    return 0;
}

/* Close now; the struct is freed by the end-of-round flush, so pointers held
 * while handling this round's events stay valid. */
static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    wait_del(c);
    stall_del(c);
    /* Explicitly: close() removes the fd from epoll only if no other descriptor
     * (e.g. a forked child's copy) refers to the socket; otherwise events for
     * this freed connection would keep arriving. */
    epoll_ctl(c->p->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    st_inc(&c->p->st.epoll_ctl, 1);
    close(c->fd);
    atomic_fetch_sub_explicit(&c->p->srv->clients, 1, memory_order_relaxed);
    st_inc(&c->p->st.clients, (uint64_t)-1);
    list_pending(c);
}

/* The input events a connection registers. Edge-triggered, EPOLLRDHUP too: a
 * read can take the peer's FIN along with the last bytes, and the EOF it leaves
 * behind is not reported again. */
static uint32_t in_events(const struct pp_policy *pol)
{
    return pol->edge ? EPOLLIN | EPOLLRDHUP : EPOLLIN;
}

static void set_interest(struct conn *c, uint32_t ev)
{
    if (ev == c->interest)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    st_inc(&c->p->st.epoll_ctl, 1);
    if (epoll_ctl(c->p->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) {
        c->interest = ev;
        if (!(ev & EPOLLOUT))
            c->writable = 0; /* the next registration reports it afresh */
    } else {
        conn_close(c);
    }
}

/* Edge-triggered registration: bytes may remain that no event will report.
 * Registering again (EPOLL_CTL_MOD, even unchanged) reports them next round. */
static void rearm_input(struct conn *c)
{
    uint32_t ev = c->interest;
    c->interest = ~0u;
    set_interest(c, ev);
}

static void update_interest(struct conn *c, int spurious)
{
    size_t end = sendable_end(c);
    int pending = c->out_off < end; /* bytes the socket could take now */
    int held = end < c->out.len;
    if (held)
        wait_add(c); /* the rest goes out when the log catches up */
    /* No EPOLLIN while input is not wanted: level-triggered epoll would report
     * it again on every round (busy loop) for bytes we refuse to read. */
    const struct pp_policy *pol = c->p->srv->policy;
    uint32_t ev = (c->paused || c->stalled || c->cl.close_after_reply) ? 0 : in_events(pol);
    if (pol->edge)
        ev |= EPOLLET;
    /* Replies held for the log leave through the log's wakeup, not EPOLLOUT: while
     * only they remain, a level-triggered EPOLLOUT would just fire every round
     * (an edge-triggered one stays as it is: it costs nothing meanwhile). */
    if (pending || !held) {
        if (pol->want_out(&c->pp, pending, spurious))
            ev |= EPOLLOUT;
    } else if (pol->edge) {
        ev |= c->interest & EPOLLOUT;
    }
    set_interest(c, ev);
    /* Edge-triggered, the EPOLLOUT a registered, writable socket gave is not given
     * again: bytes that became sendable since (the log made a held reply durable
     * after this round's write) go out at the round's end, or never. */
    if (pol->edge && pending && c->writable && (c->interest & EPOLLOUT) && !c->closed)
        list_pending(c);
}

static void list_pending(struct conn *c)
{
    if (!c->listed) {
        c->listed = 1;
        c->next_pending = c->p->pending;
        c->p->pending = c;
    }
}

static void process_input(struct conn *c);

/* Send queued replies until done or the socket is full. */
static void conn_write(struct conn *c, int spurious)
{
    struct pstats *st = &c->p->st;
    size_t end = sendable_end(c);
    while (c->out_off < end) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, end - c->out_off, MSG_NOSIGNAL);
        st_inc(&st->writes, 1);
        if (n > 0) {
            c->out_off += (size_t)n;
            st_inc(&st->bytes_out, (uint64_t)n);
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (errno == EAGAIN) {
                c->writable = 0; /* an edge-triggered EPOLLOUT reports when room returns */
                break;
            }
        } else {
            conn_close(c);
            return;
        }
    }
    if (c->out_off > BUF_KEEP && c->out_off < c->out.len && c->out_off >= c->out.len / 2) {
        /* A client that always keeps some replies unread would otherwise make
         * out grow by everything ever sent to it: drop the sent half. */
        for (int i = 0; i < c->hold_n; i++)
            c->holds[c->hold_head + i].off -= c->out_off;
        kvbuf_consume(&c->out, c->out_off);
        c->out_off = 0;
    }
    if (c->out_off == c->out.len) {
        c->out.len = c->out_off = 0;
        c->hold_max = 0;
        kvbuf_shrink(&c->out, BUF_KEEP);
        if (c->cl.close_after_reply) {
            conn_close(c);
            return;
        }
        if (c->paused) { /* backlog drained: resume buffered requests */
            c->paused = 0;
            process_input(c);
            if (c->closed)
                return;
            if (c->out.len) {
                list_pending(c);
                return;
            }
        }
    }
    update_interest(c, spurious);
}

/* Make room in the poller's scratch arrays for n argument slots. */
static int grow_args(struct poller *p, int n)
{
    if (n <= p->argcap)
        return 0;
    if (n > (1 << 29))
        return -1; /* cannot happen below QUERYBUF_MAX (>= 6 bytes an argument) */
    int cap = p->argcap ? p->argcap : 64;
    while (cap < n)
        cap *= 2;
    const char **v = realloc(p->argv, (size_t)cap * sizeof *v);
    if (!v)
        return -1;
    p->argv = v;
    size_t *l = realloc(p->argl, (size_t)cap * sizeof *l);
    if (!l)
        return -1;
    p->argl = l;
    p->argcap = cap;
    return 0;
}

/* Parse and execute every complete request in the input buffer.
 *
 * Requests are parsed in batches of up to BATCH before any runs, so the table
 * lines their keys need can be prefetched together (kvt_prefetch): with
 * pipelining a single read brings many requests, and their cache misses then
 * overlap instead of stalling one after another. Arguments of a batch point
 * into the input buffer, which does not move until the batch has run. */
static void process_input(struct conn *c)
{
    struct poller *p = c->p;
    struct kv_table *t = p->srv->table;
    while (!c->cl.close_after_reply && !c->stalled) {
        if (c->out.len - c->out_off > OUT_PAUSE) {
            /* The client sends faster than it reads: stop taking requests (and
             * drop EPOLLIN) until the replies drain, so memory stays bounded. */
            c->paused = 1;
            break;
        }
        /* Before AUTH one request at a time: AUTH changes the limits for the next. */
        int max = c->cl.authenticated ? BATCH : 1;
        int n = 0, nargs = 0, perr = 0, again = 0;
        size_t off = c->in_off;
        while (n < max) {
            /* An inline request is unescaped in place when parsed, so it must not
             * be parsed twice: it only starts a batch (and ends it), never waits in
             * one that a pause may cut short. */
            if (n > 0 && off < c->in.len && c->in.p[off] != '*')
                break;
            c->rp.unauth = !c->cl.authenticated;
            int rc = resp_parse(&c->rp, c->in.p + off, c->in.len - off);
            if (rc == RESP_AGAIN) {
                again = 1;
                break;
            }
            if (rc == RESP_ERROR) {
                perr = 1;
                break;
            }
            int argc = c->rp.argc;
            if (argc > 0) {
                if (grow_args(p, nargs + argc)) {
                    conn_close(c);
                    return;
                }
                for (int i = 0; i < argc; i++) {
                    p->argv[nargs + i] = c->in.p + off + c->rp.argv[i].off;
                    p->argl[nargs + i] = c->rp.argv[i].len;
                }
                p->batch[n].arg0 = nargs;
                p->batch[n].argc = argc;
                p->batch[n].end = off + c->rp.scan;
                nargs += argc;
                n++;
            }
            int was_inline = c->in.p[off] != '*';
            off += c->rp.scan;
            resp_reset(&c->rp);
            if (was_inline)
                break;
        }
        if (n > 1) {
            for (int i = 0; i < n; i++) {
                struct batch_req *b = &p->batch[i];
                b->h = b->argc > 1 ? kvt_hash(p->argv[b->arg0 + 1], p->argl[b->arg0 + 1]) : 0;
                if (b->argc > 1)
                    kvt_prefetch(t, b->h, 1);
            }
            for (int stage = 2; stage <= 3; stage++)
                for (int i = 0; i < n; i++)
                    if (p->batch[i].argc > 1)
                        kvt_prefetch(t, p->batch[i].h, stage);
        }
        int i = 0;
        for (; i < n; i++) {
            struct batch_req *b = &p->batch[i];
            if (c->out.len - c->out_off > OUT_PAUSE) {
                c->paused = 1;
                break;
            }
            size_t reply_at = c->out.len;
            kvt_lsn_reset();
            if (cmd_dispatch(&c->cl, b->argc, p->argv + b->arg0, p->argl + b->arg0)) {
                conn_close(c);
                return;
            }
            if (c->cl.stall) { /* runs again when the data file has what it needs */
                if (c->cl.resume_i) { /* a multi-key reply in part: keep it, held as any reply */
                    uint64_t need = kvt_lsn_touched();
                    if (need && hold_reply(c, reply_at, need)) {
                        conn_close(c);
                        return;
                    }
                } else {
                    c->out.len = reply_at;
                }
                stall_add(c);
                break;
            }
            uint64_t need = kvt_lsn_touched(); /* 0 without a log */
            if (need && hold_reply(c, reply_at, need)) {
                conn_close(c);
                return;
            }
            st_inc(&p->st.commands, 1);
            c->in_off = b->end;
            if (c->cl.close_after_reply) { /* QUIT: what follows it is not run */
                i++;
                break;
            }
        }
        if (i < n || c->paused || c->stalled || c->cl.close_after_reply) {
            /* Stopped inside the batch: what follows is parsed again later, so
             * forget any partial progress the parser made past it. */
            resp_reset(&c->rp);
            break;
        }
        c->in_off = off; /* also steps over empty requests ("*0") after the last one */
        if (perr) {
            resp_add_errorf(&c->out, "ERR %s", c->rp.err);
            st_inc(&p->st.protocol_errors, 1);
            c->cl.close_after_reply = 1;
            break;
        }
        if (again)
            break; /* the rest of the buffer is an incomplete request */
    }
    if (c->in_off == c->in.len) {
        c->in.len = c->in_off = 0;
        kvbuf_shrink(&c->in, BUF_KEEP);
    } else if (c->in_off > 0 && (c->in_off >= c->in.cap / 2 || c->in.cap - c->in.len < READ_CHUNK)) {
        /* parser offsets are relative to the request start, so moving is safe */
        kvbuf_consume(&c->in, c->in_off);
        c->in_off = 0;
    }
}

static void conn_readable(struct conn *c)
{
    struct poller *p = c->p;
    if (c->cl.close_after_reply || c->paused || c->stalled) {
        /* Unread bytes: an edge-triggered registration must be made again to
         * report them, which the update that gives EPOLLIN back now does. */
        if (p->srv->policy->edge)
            c->interest &= ~(uint32_t)(EPOLLIN | EPOLLRDHUP);
        return;
    }
    if (c->in.len - c->in_off > QUERYBUF_MAX) {
        /* One request may not buffer more than this (Redis's client-query-buffer-limit):
         * a client declaring endless 512 MiB arguments is dropped. */
        conn_close(c);
        return;
    }
    /* Read at least READ_CHUNK; inside a large bulk, grow with what has already
     * arrived (geometric), never by the length the client merely declared. */
    size_t want = READ_CHUNK;
    if (c->rp.bulk > 0) {
        size_t have = c->in.len - c->in_off - c->rp.scan;
        size_t need = (size_t)c->rp.bulk + 2 > have ? (size_t)c->rp.bulk + 2 - have : 0;
        size_t cap = c->in.len > READ_CHUNK ? c->in.len : READ_CHUNK;
        want = need < cap ? need : cap;
        if (want < READ_CHUNK)
            want = READ_CHUNK;
    }
    if (kvbuf_reserve(&c->in, want)) {
        conn_close(c);
        return;
    }
    size_t room = c->in.cap - c->in.len;
    ssize_t n = read(c->fd, c->in.p + c->in.len, room);
    st_inc(&p->st.reads, 1);
    if (n < 0) {
        if (errno != EAGAIN && errno != EINTR)
            conn_close(c);
        return;
    }
    if (n == 0) {
        /* Peer closed its side: answer what it already sent, then close. */
        c->cl.close_after_reply = 1;
        if (c->out_off == c->out.len)
            conn_close(c);
        else
            list_pending(c);
        return;
    }
    c->in.len += (size_t)n;
    st_inc(&p->st.bytes_in, (uint64_t)n);
    process_input(c);
    if (c->closed)
        return;
    /* A short read emptied the socket; after a full one more may wait unreported. */
    if ((size_t)n == room && p->srv->policy->edge)
        rearm_input(c);
    if (c->out.len > c->out_off || c->cl.close_after_reply)
        list_pending(c);
}

void srv_format_addr(int fd, char *dst, size_t n)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    char ip[INET_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sin_family == AF_INET)
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    snprintf(dst, n, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
}

int srv_admit(struct srv *s, int fd)
{
    uint64_t n = atomic_fetch_add_explicit(&s->clients, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->total_conns, 1, memory_order_relaxed);
    if (n >= (uint64_t)s->cfg.maxclients) {
        static const char msg[] = "-ERR max number of clients reached\r\n";
        ssize_t w = send(fd, msg, sizeof msg - 1, MSG_NOSIGNAL);
        (void)w;
        close(fd);
        atomic_fetch_sub_explicit(&s->clients, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->rejected, 1, memory_order_relaxed);
        return 0;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 1;
}

void srv_client_init(struct srv *s, struct cmd_client *cl, struct kvbuf *out, int fd)
{
    cl->id = atomic_fetch_add_explicit(&s->next_id, 1, memory_order_relaxed) + 1;
    cl->authenticated = !(s->requirepass && *s->requirepass);
    cl->resp = 2;
    cl->out = out;
    cl->srv = s;
    cl->table = s->table;
    srv_format_addr(fd, cl->addr, sizeof cl->addr);
}

static void conn_new(struct poller *p, int fd)
{
    struct srv *s = p->srv;
    if (!srv_admit(s, fd))
        return;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        atomic_fetch_sub_explicit(&s->clients, 1, memory_order_relaxed);
        return;
    }
    c->tag = TAG_CONN;
    c->fd = fd;
    c->p = p;
    resp_parser_init(&c->rp);
    srv_client_init(s, &c->cl, &c->out, fd);
    c->cl.poller = p->idx;
    c->interest = in_events(s->policy) | (s->policy->edge ? EPOLLET : 0);
    struct epoll_event e = {.events = c->interest, .data.ptr = c};
    st_inc(&p->st.epoll_ctl, 1);
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &e)) {
        close(fd);
        atomic_fetch_sub_explicit(&s->clients, 1, memory_order_relaxed);
        resp_parser_free(&c->rp);
        free(c);
        return;
    }
    c->next = p->all;
    if (p->all)
        p->all->prev = c;
    p->all = c;
    st_inc(&p->st.accepted, 1);
    st_inc(&p->st.clients, 1);
}

static void handoff(struct poller *to, int fd)
{
    pthread_mutex_lock(&to->q_lock);
    if (to->q_len == to->q_cap) {
        int cap = to->q_cap ? to->q_cap * 2 : 64;
        int *q = realloc(to->q_fds, (size_t)cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&to->q_lock);
            close(fd);
            return;
        }
        to->q_fds = q;
        to->q_cap = cap;
    }
    to->q_fds[to->q_len++] = fd;
    pthread_mutex_unlock(&to->q_lock);
    uint64_t one = 1;
    ssize_t w = write(to->evfd, &one, sizeof one); /* wakes the target's epoll_wait */
    (void)w;
}

static void do_accept(struct poller *p)
{
    struct srv *s = p->srv;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if ((errno == EMFILE || errno == ENFILE) && p->spare_fd >= 0) {
                /* Out of descriptors: the pending connection would keep the
                 * level-triggered listener readable forever (a busy loop). Spend
                 * the spare descriptor to accept it and close it at once. */
                close(p->spare_fd);
                fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
                if (fd >= 0)
                    close(fd);
                atomic_fetch_add_explicit(&s->rejected, 1, memory_order_relaxed);
                p->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                continue;
            }
            return; /* EAGAIN: nothing more to accept */
        }
        if (s->cfg.accept_mode == SRV_ACCEPT_HANDOFF) {
            uint64_t i2 = atomic_fetch_add_explicit(&s->handoff_rr, 1, memory_order_relaxed);
            struct poller *to = &s->pollers[i2 % (uint64_t)s->npollers];
            if (to != p) {
                handoff(to, fd);
                continue;
            }
        }
        conn_new(p, fd);
    }
}

/* The log moved on (or failed): send the replies it released. */
static void release_waiting(struct poller *p)
{
    struct wal *w = p->srv->cfg.wal;
    if (!w || !p->waiting)
        return;
    int failed = wal_failed(w);
    struct conn *list = p->waiting;
    p->waiting = NULL;
    for (struct conn *c = list; c; c->waiting = 0, c = c->wnext)
        ;
    while (list) {
        struct conn *c = list;
        list = c->wnext;
        if (c->closed)
            continue;
        if (failed)
            conn_close(c); /* their writes can never be acknowledged */
        else
            conn_write(c, 0); /* re-lists itself if something is still held */
    }
}

/* The data file loaded a key or freed memory: run the stalled requests again. */
static void retry_stalled(struct poller *p)
{
    struct conn *list = p->stalled;
    p->stalled = NULL;
    for (struct conn *c = list; c; c->stalled = 0, c = c->snext)
        ;
    while (list) {
        struct conn *c = list;
        list = c->snext;
        if (c->closed)
            continue;
        process_input(c); /* may stall again */
        if (!c->closed)
            list_pending(c); /* replies out, EPOLLIN back */
    }
}

static void drain_event(struct poller *p)
{
    uint64_t v;
    ssize_t r = read(p->evfd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&p->q_lock);
    int n = p->q_len;
    int fds[64];
    /* take at most 64 per wakeup; the rest keep the eventfd readable */
    if (n > 64)
        n = 64;
    if (n) {
        memcpy(fds, p->q_fds, (size_t)n * sizeof *fds);
        memmove(p->q_fds, p->q_fds + n, (size_t)(p->q_len - n) * sizeof *fds);
    }
    p->q_len -= n;
    int more = p->q_len > 0;
    pthread_mutex_unlock(&p->q_lock);
    if (more) {
        uint64_t one = 1;
        ssize_t w = write(p->evfd, &one, sizeof one);
        (void)w;
    }
    for (int i = 0; i < n; i++)
        conn_new(p, fds[i]);
    release_waiting(p);
    retry_stalled(p);
}

void srv_cron(struct poller *p, int64_t now)
{
    struct srv *s = p->srv;
    p->last_cron = now;
    if (p->stalled)
        retry_stalled(p); /* a wakeup may be lost (a load request refused for memory) */
    /* each poller keeps its own slice of the shards rehashed and expired */
    unsigned per = (KVT_SHARDS + (unsigned)s->npollers - 1) / (unsigned)s->npollers;
    kvt_housekeep(s->table, (unsigned)p->idx * per, per, HOUSEKEEP_BUDGET);
    if (p->idx == 0) {
        uint64_t total = 0;
        for (int i = 0; i < s->npollers; i++)
            total += ld(&s->pollers[i].st.commands);
        int64_t dt = now - s->ops_last_ms;
        if (s->ops_last_ms && dt > 0)
            atomic_store_explicit(&s->ops_samples[s->ops_idx++ % OPS_SAMPLES],
                                  (total - s->ops_last) * 1000 / (uint64_t)dt, memory_order_relaxed);
        s->ops_last = total;
        s->ops_last_ms = now;
    }
}

static void flush_round(struct poller *p)
{
    const struct pp_policy *pol = p->srv->policy;
    while (p->pending) {
        struct conn *c = p->pending;
        p->pending = c->next_pending;
        c->listed = 0;
        if (c->closed) {
            conn_free(c);
            continue;
        }
        /* edge: an EPOLLOUT already reported this round for a registered
         * EPOLLOUT (writable) is the one strict would wait a round for */
        if (pol->write_at_round_end || c->cl.close_after_reply ||
            (pol->edge && c->writable && (c->interest & EPOLLOUT)))
            conn_write(c, 0);
        else
            update_interest(c, 0);
    }
}

static void *poller_main(void *arg)
{
    struct poller *p = arg;
    struct srv *s = p->srv;
    struct epoll_event ev[MAX_EVENTS];
    int edge = s->policy->edge;
    while (!atomic_load_explicit(&s->stopping, memory_order_acquire)) {
        int n = epoll_wait(p->epfd, ev, MAX_EVENTS, CRON_MS);
        st_inc(&p->st.epoll_wait, 1);
        for (int i = 0; i < n; i++) {
            int *tag = ev[i].data.ptr;
            if (*tag == TAG_LISTENER) {
                do_accept(p);
            } else if (*tag == TAG_EVENT) {
                drain_event(p);
            } else {
                struct conn *c = (struct conn *)tag;
                uint32_t e = ev[i].events;
                if ((e & EPOLLERR) || ((e & EPOLLHUP) && (c->paused || c->stalled || c->cl.close_after_reply)))
                    conn_close(c); /* reported whatever the interest set: never ignore them */
                else if (e & (EPOLLIN | EPOLLHUP))
                    conn_readable(c);
                if (edge && (e & EPOLLRDHUP) && !c->closed && !c->cl.close_after_reply &&
                    (c->interest & EPOLLIN))
                    rearm_input(c); /* the EOF, if the last read took it, is read next round */
                if (!c->closed && (e & EPOLLOUT)) {
                    c->writable = 1;
                    /* Queued replies go out now, or at the round's end if listed.
                     * Edge-triggered, a writable report riding on a read woke
                     * nothing by itself: not spurious. */
                    int none = c->out_off == c->out.len;
                    if (!c->listed && !(edge && none && (e & EPOLLIN)))
                        conn_write(c, none);
                }
            }
        }
        flush_round(p);
        int64_t now = srv_mono_ms();
        if (now - p->last_cron >= CRON_MS)
            srv_cron(p, now);
    }
    for (struct conn *c = p->all; c; c = c->next)
        conn_close(c);
    flush_round(p); /* frees them all */
    return NULL;
}

/* ---- listeners and lifecycle */

int srv_bind_socket(int type, const char *bind_addr, int *port, int reuseport, int probe, const char *what,
                    char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "invalid bind address '%s': expected an IPv4 address such as 127.0.0.1", bind_addr);
        return -EINVAL;
    }
    int stream = (type & 0xf) == SOCK_STREAM; /* TCP: SO_REUSEADDR, or TIME_WAIT blocks a restart */
    int fd = -1, one = 1;
    if (probe) {
        /* SO_REUSEPORT would let us silently join another server's port (same
         * uid) and split its traffic. A plain bind first fails if anyone holds it. */
        fd = socket(AF_INET, (type & 0xf) | SOCK_CLOEXEC, 0);
        if (fd < 0)
            goto err;
        if (stream)
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa))
            goto err;
        close(fd);
    }
    fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto err;
    if (stream)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one))
        goto err;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa))
        goto err;
    if (*port == 0) { /* later sockets must share the port the kernel picked */
        socklen_t sl = sizeof sa;
        getsockname(fd, (struct sockaddr *)&sa, &sl);
        *port = ntohs(sa.sin_port);
    }
    return fd;
err:;
    int e = errno;
    snprintf(err, errlen, "cannot %s %s:%d: %s", what, bind_addr, *port, strerror(e));
    if (fd >= 0)
        close(fd);
    return -e;
}

static int make_listener(struct srv *s, int reuseport, char *err, size_t errlen)
{
    int picked = s->port == 0;
    int fd = srv_bind_socket(SOCK_STREAM | SOCK_NONBLOCK, s->bind, &s->port, reuseport,
                             reuseport && s->port != 0 && !s->port_probed, "listen on", err, errlen);
    if (fd < 0)
        return fd;
    /* probed, or the kernel gave us a free port: nobody else holds it */
    s->port_probed |= reuseport || picked;
    if (listen(fd, s->cfg.tcp_backlog > 0 ? s->cfg.tcp_backlog : 511)) {
        int e = errno;
        snprintf(err, errlen, "cannot listen on %s:%d: %s", s->bind, s->port, strerror(e));
        close(fd);
        return -e;
    }
    return fd;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int srv_create(struct srv **out, struct kv_table *t, const struct srv_config *cfg, char *err,
               size_t errlen)
{
    int rc = -EINVAL;
    if (cfg->threads < 1 || cfg->threads > 1024) {
        snprintf(err, errlen, "threads must be between 1 and 1024, got %d", cfg->threads);
        return -EINVAL;
    }
    if (cfg->port < 0 || cfg->port > 65535) {
        snprintf(err, errlen, "port must be between 0 and 65535, got %d", cfg->port);
        return -EINVAL;
    }
    if (cfg->maxclients < 1) {
        snprintf(err, errlen, "maxclients must be at least 1, got %d", cfg->maxclients);
        return -EINVAL;
    }
    const struct pp_policy *pol = pp_find(cfg->poll_policy);
    if (!pol) {
        snprintf(err, errlen, "unknown poll policy '%s': expected one of %s", cfg->poll_policy,
                 pp_names());
        return -EINVAL;
    }
    struct srv *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->cfg = *cfg;
    s->bind = strdup(cfg->bind ? cfg->bind : "127.0.0.1");
    s->requirepass = dup_or_null(cfg->requirepass);
    s->config_file = dup_or_null(cfg->config_file);
    s->version = strdup(cfg->version ? cfg->version : "0");
    s->durability = strdup(cfg->durability ? cfg->durability : "none");
    s->cfg.durability = s->durability;
    s->cfg.bind = s->bind;
    s->cfg.requirepass = s->requirepass;
    s->cfg.config_file = s->config_file;
    s->cfg.version = s->version;
    s->cfg.poll_policy = pol->name;
    s->policy = pol;
    s->table = t;
    s->port = cfg->port;
    s->npollers = cfg->threads;
    s->start_time = time(NULL);
    s->tp_epfd = -1;
    pthread_mutex_init(&s->tp_lock, NULL);
    s->tp_listener_tag = TAG_LISTENER;
    int pool = cfg->arch == SRV_ARCH_THREADPOOL;
    if (pool && (s->tp_epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        goto fail;
    }
    s->pollers = aligned_alloc(64, sizeof *s->pollers * (size_t)s->npollers);
    if (!s->pollers) {
        rc = -ENOMEM;
        goto fail;
    }
    memset(s->pollers, 0, sizeof *s->pollers * (size_t)s->npollers);
    for (int i = 0; i < s->npollers; i++) /* so a failed create never closes fd 0 */
        s->pollers[i].epfd = s->pollers[i].lfd = s->pollers[i].evfd = s->pollers[i].spare_fd = -1;
    for (int i = 0; i < s->npollers; i++) {
        struct poller *p = &s->pollers[i];
        p->idx = i;
        p->srv = s;
        p->lfd = p->evfd = -1;
        p->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        p->listener_tag = TAG_LISTENER;
        p->event_tag = TAG_EVENT;
        pthread_mutex_init(&p->q_lock, NULL);
        /* a worker of the pool waits on its eventfd alone; a poller has it in its epoll set */
        p->epfd = pool ? -1 : epoll_create1(EPOLL_CLOEXEC);
        p->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if ((!pool && p->epfd < 0) || p->evfd < 0) {
            rc = -errno;
            snprintf(err, errlen, "epoll/eventfd: %s", strerror(errno));
            goto fail;
        }
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &p->event_tag};
        if (!pool)
            epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->evfd, &e);
        if (cfg->bosc && bosc_subscribe(cfg->bosc, p->evfd)) {
            snprintf(err, errlen, "too many pollers for the data file's wakeups");
            rc = -ENOSPC;
            goto fail;
        }
        if (cfg->wal && wal_subscribe(cfg->wal, p->evfd)) {
            snprintf(err, errlen, "too many pollers for the log's wake-up list");
            goto fail;
        }
        if (i == 0 || (!pool && cfg->accept_mode == SRV_ACCEPT_REUSEPORT)) {
            p->lfd = make_listener(s, !pool && cfg->accept_mode == SRV_ACCEPT_REUSEPORT, err, errlen);
            if (p->lfd < 0) {
                rc = p->lfd;
                goto fail;
            }
            struct epoll_event le = {.events = EPOLLIN, .data.ptr = &p->listener_tag};
            if (pool) { /* one worker at a time accepts, then re-arms it */
                le.events |= EPOLLONESHOT;
                le.data.ptr = &s->tp_listener_tag;
            }
            epoll_ctl(pool ? s->tp_epfd : p->epfd, EPOLL_CTL_ADD, p->lfd, &le);
        }
    }
    if (cfg->arch == SRV_ARCH_UDP) {
        rc = us_create(&s->udp, s, t, s->bind, cfg->udp_port, cfg->udp_workers, err, errlen);
        if (rc < 0)
            goto fail;
    }
    if (cfg->arch == SRV_ARCH_DPDK) {
#ifdef KV_HAVE_DPDK
        rc = dp_create(&s->dpdk, s, t, cfg->dpdk_iface, cfg->udp_workers, cfg->udp_port, cfg->dpdk_eal_args,
                       err, errlen);
        if (rc < 0)
            goto fail;
#else
        snprintf(err, errlen, "kvstore was built without DPDK (libdpdk-dev not found at build time)");
        rc = -ENOTSUP;
        goto fail;
#endif
    }
    *out = s;
    return 0;
fail:
    srv_destroy(s);
    return rc;
}

int srv_start(struct srv *s, char *err, size_t errlen)
{
    for (int i = 0; i < s->npollers; i++) {
        struct poller *p = &s->pollers[i];
        int rc = pthread_create(&p->th, NULL, s->cfg.arch == SRV_ARCH_THREADPOOL ? tp_worker_main : poller_main, p);
        if (rc) {
            snprintf(err, errlen, "cannot start poller thread: %s", strerror(rc));
            srv_stop(s);
            return -rc;
        }
        p->started = 1;
        char name[16];
        snprintf(name, sizeof name, s->cfg.arch == SRV_ARCH_THREADPOOL ? "kv-worker-%d" : "kv-poller-%d",
                 i % 10000);
        pthread_setname_np(p->th, name);
    }
    if (s->udp) {
        int rc = us_start(s->udp, err, errlen);
        if (rc < 0) {
            srv_stop(s);
            return rc;
        }
    }
#ifdef KV_HAVE_DPDK
    if (s->dpdk) {
        int rc = dp_start(s->dpdk, err, errlen);
        if (rc < 0) {
            srv_stop(s);
            return rc;
        }
    }
#endif
    return 0;
}

int srv_have_dpdk(void)
{
#ifdef KV_HAVE_DPDK
    return 1;
#else
    return 0;
#endif
}

void srv_stop(struct srv *s)
{
    /* release: pollers that see stopping also see everything written before it */
    atomic_store_explicit(&s->stopping, 1, memory_order_release);
    for (int i = 0; s->pollers && i < s->npollers; i++) {
        uint64_t one = 1;
        if (s->pollers[i].evfd >= 0) {
            ssize_t w = write(s->pollers[i].evfd, &one, sizeof one);
            (void)w;
        }
    }
    for (int i = 0; s->pollers && i < s->npollers; i++) {
        if (s->pollers[i].started) {
            pthread_join(s->pollers[i].th, NULL);
            s->pollers[i].started = 0;
        }
    }
    tp_close_all(s); /* the pool's connections (pollers close their own) */
    us_stop(s->udp);
#ifdef KV_HAVE_DPDK
    dp_stop(s->dpdk);
#endif
}

void srv_destroy(struct srv *s)
{
    if (!s)
        return;
    srv_stop(s);
    for (int i = 0; s->pollers && i < s->npollers; i++) {
        struct poller *p = &s->pollers[i];
        if (p->lfd >= 0)
            close(p->lfd);
        if (p->evfd >= 0)
            close(p->evfd);
        if (p->epfd >= 0)
            close(p->epfd);
        if (p->spare_fd >= 0)
            close(p->spare_fd);
        for (int j = 0; j < p->q_len; j++)
            close(p->q_fds[j]);
        free(p->q_fds);
        free(p->argv);
        free(p->argl);
        pthread_mutex_destroy(&p->q_lock);
    }
    free(s->pollers);
    us_destroy(s->udp);
#ifdef KV_HAVE_DPDK
    dp_destroy(s->dpdk);
#endif
    if (s->tp_epfd >= 0)
        close(s->tp_epfd);
    pthread_mutex_destroy(&s->tp_lock);
    free(s->bind);
    free(s->requirepass);
    free(s->config_file);
    free(s->version);
    free(s->durability);
    free(s);
}

int srv_port(const struct srv *s) { return s->port; }
int srv_udp_port(const struct srv *s) { return s->udp ? us_port(s->udp) : s->cfg.udp_port; }

uint64_t srv_log_appended(struct srv *s) { return s->cfg.wal ? wal_appended_lsn(s->cfg.wal) : 0; }
const struct srv_config *srv_config(const struct srv *s) { return &s->cfg; }

int srv_get_poller_stats(struct srv *s, int i, struct srv_poller_stats *st)
{
    if (i < 0 || i >= s->npollers)
        return -EINVAL;
    struct pstats *p = &s->pollers[i].st;
    st->epoll_wait = ld(&p->epoll_wait);
    st->epoll_ctl = ld(&p->epoll_ctl);
    st->reads = ld(&p->reads);
    st->writes = ld(&p->writes);
    st->commands = ld(&p->commands);
    st->accepted = ld(&p->accepted);
    st->clients = ld(&p->clients);
    st->bytes_in = ld(&p->bytes_in);
    st->bytes_out = ld(&p->bytes_out);
    return 0;
}

void srv_get_stats(struct srv *s, struct srv_stats *st)
{
    memset(st, 0, sizeof *st);
    st->pollers = s->npollers;
    st->connected_clients = atomic_load_explicit(&s->clients, memory_order_relaxed);
    st->total_connections = ld(&s->total_conns);
    st->rejected_connections = ld(&s->rejected);
    for (int i = 0; i < s->npollers; i++) {
        struct pstats *p = &s->pollers[i].st;
        st->total_commands += ld(&p->commands);
        st->bytes_in += ld(&p->bytes_in);
        st->bytes_out += ld(&p->bytes_out);
        st->protocol_errors += ld(&p->protocol_errors);
    }
    struct uf_totals u;
    memset(&u, 0, sizeof u);
    us_get_totals(s->udp, &u);
#ifdef KV_HAVE_DPDK
    dp_get_totals(s->dpdk, &u);
#endif
    st->udp_rx = u.rx_packets;
    st->udp_tx = u.tx_packets;
    st->udp_requests = u.requests;
    st->udp_dropped = u.dropped;
    st->udp_tx_failed = u.tx_failed;
    st->udp_bad = u.bad_frames;
    st->udp_held = u.held;
    st->udp_stalls = u.stalls;
    st->udp_busy_ns = u.busy_ns;
}

void srv_reset_stats(struct srv *s)
{
    /* Only the counters INFO presents as totals since reset; each poller is the
     * single writer of its stats, so a concurrent increment may be lost: fine for
     * statistics, as in Redis's CONFIG RESETSTAT. */
    for (int i = 0; i < s->npollers; i++) {
        struct pstats *p = &s->pollers[i].st;
        atomic_store_explicit(&p->epoll_wait, 0, memory_order_relaxed);
        atomic_store_explicit(&p->epoll_ctl, 0, memory_order_relaxed);
        atomic_store_explicit(&p->reads, 0, memory_order_relaxed);
        atomic_store_explicit(&p->writes, 0, memory_order_relaxed);
    }
}
