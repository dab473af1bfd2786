/* poller.c - the poller front end (arch poller, and the TCP side of udp/dpdk):
 * per-core epoll pollers serving RESP connections without ever blocking.
 * Threads: the control thread creates, starts and stops; each poller thread owns
 * its epoll fd, its listener (reuseport mode) and its connections, and a
 * connection is only ever touched by its poller. Connections reach a poller
 * through its own SO_REUSEPORT listener (the kernel spreads them) or, in handoff
 * mode, from poller 0's listener through a queue + eventfd. Replies are gathered
 * per poll round and written at its end; when to keep EPOLLOUT registered is the
 * poll policy's choice (pollpolicy.h). Requests run through ses_run; a reply held
 * for the log leaves when the log wakes the poller's eventfd, a stalled request
 * runs again when the data file does. Cross-thread state: the client count and
 * handoff queues (mutex), per-poller counters (single writer, read by INFO).
 * Connections from the TLS listener (tls-port) take the same path: their reads
 * and writes go through tlsio.h, which runs the handshake inside the first reads.
 * Connections from the MQTT listener (mqtt-port) carry an mq_conn: their input
 * goes to mqtt_input (frontend/mqtt.h), and the poller wakes their subscribers.
 * Reads untrusted bytes from sockets; the parsers (proto/resp.c, proto/mqtt.c) bound them. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/counter.h"
#include "core/fdq.h"
#include "core/kvbuf.h"
#include "core/list.h"
#include "core/net.h"
#include "core/table.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "frontend/frontend.h"
#include "frontend/mqtt_int.h"
#include "frontend/poller_int.h"
#include "frontend/pollpolicy.h"
#include "frontend/tcp.h"
#include "frontend/tcpmem.h"
#include "proto/resp.h"


/* ---- connections */

static void conn_free(struct conn *c)
{
    mqtt_conn_free(c);
    list_del(&c->node);
    kvbuf_free(&c->in);
    kvbuf_free(&c->out);
    resp_parser_free(&c->rp);
    ses_free(&c->ses);
    free(c);
}

static int stalled(const struct conn *c) { return !list_empty(&c->stall_node); }
/* Parked: a blocking read (XREAD BLOCK) waits for a write to its keys or its time. */
static int parked(const struct conn *c) { return stalled(c) && c->ses.stall == CMD_STALL_BLOCK; }

static void list_pending(struct conn *c);

/* The next request waits for the data file (ses_run asked it already). Input
 * stays unparsed (EPOLLIN is dropped) until a wakeup runs it again. */
static void stall_add(struct conn *c)
{
    if (!stalled(c))
        list_add(&c->p->stalled, &c->stall_node);
    int64_t d = c->ses.stall == CMD_STALL_BLOCK ? cmd_block_deadline(&c->ses.cl) : INT64_MAX;
    if (d < c->p->block_deadline)
        c->p->block_deadline = d;
}

/* End of the part of out that may be sent now: up to the first reply still
 * waiting for its LSN to become durable. */
static size_t sendable_end(struct conn *c) { return ses_sendable(&c->ses, c->out.len); }

/* Close now; the struct is freed by the end-of-round flush, so pointers held
 * while handling this round's events stay valid. */
static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    list_del(&c->wait_node);
    list_del(&c->stall_node);
    list_del(&c->big_node);
    /* Explicitly: close() removes the fd from epoll only if no other descriptor
     * (e.g. a forked child's copy) refers to the socket; otherwise events for
     * this freed connection would keep arriving. */
    epoll_ctl(c->p->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    st_inc(&c->p->st->epoll_ctl, 1);
    if (c->mq)
        mqtt_closed(c); /* its will, its session (before the fd can be reused) */
    ses_disconnect(&c->ses); /* before close: a CLIENT KILL must never see the fd reused */
    tlsio_conn_free(c->tls); /* its close_notify before close: never into a reused fd */
    c->tls = NULL;
    close(c->fd);
    tcp_closed(&c->p->ps->tcp);
    st_inc(&c->p->st->clients, (uint64_t)-1);
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
    st_inc(&c->p->st->epoll_ctl, 1);
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

/* A buffer that grew past TCP_BUF_KEEP keeps its size while its connection keeps
 * using it, and shrinks once it has held no more than that for TCP_BUF_IDLE_MS
 * (shrink_idle, from the cron). Shrinking whenever it drained instead cost every
 * batch of large replies (32 pipelined 4 KiB GETs: 132 KB) a realloc down and two
 * back up: glibc serves these sizes with mmap, so each was an mremap, and every
 * page of the regrown buffer a fresh page fault (a 1-poller node serving such
 * GETs: 0.5 page faults and 0.09 mremap per GET, twice the CPU per GET). */
static void note_big(struct conn *c)
{
    if (c->in.len <= TCP_BUF_KEEP && c->out.len <= TCP_BUF_KEEP)
        return;
    c->big_ms = c->p->now;
    if (list_empty(&c->big_node))
        list_add(&c->p->big, &c->big_node);
}

/* CLIENT LIST's view of the connection (relaxed stores); a large buffer noted. */
static void publish(struct conn *c)
{
    note_big(c);
    if (tcp_conn_publish(&c->ses, c->p->now, &c->in, c->in_off, &c->rp, &c->out, c->out_off,
                         (c->interest & EPOLLIN ? CMD_EV_READ : 0) | (c->interest & EPOLLOUT ? CMD_EV_WRITE : 0)))
        conn_close(c); /* a memory limit passed (tcpmem.h) */
}

static void update_interest(struct conn *c, int spurious)
{
    size_t end = sendable_end(c);
    int pending = c->out_off < end; /* bytes the socket could take now */
    int held = end < c->out.len;
    if (held)
        if (list_empty(&c->wait_node)) /* the rest goes out when the log catches up */
            list_add(&c->p->waiting, &c->wait_node);
    /* No EPOLLIN while input is not wanted: level-triggered epoll would report
     * it again on every round (busy loop) for bytes we refuse to read. */
    const struct pp_policy *pol = c->p->ps->policy;
    /* A parked read keeps EPOLLRDHUP: a client gone while it waits is closed then. */
    uint32_t ev = (c->paused || c->ses.cl.close_after_reply) ? 0
                  : parked(c)                                ? EPOLLRDHUP
                  : stalled(c)                               ? 0
                                                             : in_events(pol);
    if (pol->edge)
        ev |= EPOLLET;
    /* Replies held for the log leave through the log's wakeup, not EPOLLOUT: while
     * only they remain, a level-triggered EPOLLOUT would just fire every round
     * (an edge-triggered one stays as it is: it costs nothing meanwhile). */
    if (pending || !held || tlsio_want_write(c->tls)) {
        if (pol->want_out(&c->pp, pending, spurious) || tlsio_want_write(c->tls))
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
    publish(c);
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
static void conn_readable(struct conn *c);

/* Send queued replies until done or the socket is full. */
static void conn_write(struct conn *c, int spurious)
{
    struct tcp_thread *st = c->p->st;
    if (tlsio_want_write(c->tls)) { /* a TLS handshake waited for room: go on with it */
        conn_readable(c);
        if (c->closed)
            return;
    }
    size_t end = sendable_end(c);
    while (c->out_off < end) {
        ssize_t n = tlsio_send(c->tls, c->fd, c->out.p + c->out_off, end - c->out_off);
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
    if (c->out_off > TCP_BUF_KEEP && c->out_off < c->out.len && c->out_off >= c->out.len / 2) {
        /* A client that always keeps some replies unread would otherwise make
         * out grow by everything ever sent to it: drop the sent half. */
        ses_consumed(&c->ses, c->out_off);
        kvbuf_consume(&c->out, c->out_off);
        c->out_off = 0;
    }
    if (c->out_off == c->out.len) {
        note_big(c); /* (how much this drained batch held) */
        c->out.len = c->out_off = 0;
        if (c->ses.cl.close_after_reply) {
            conn_close(c);
            return;
        }
        if (c->mq && !c->paused) { /* room for the messages an MQTT subscriber waits for */
            mqtt_drained(c);
            if (c->closed)
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

/* Parse and execute every complete request in the input buffer.
 *
 * Requests are parsed in batches of up to BATCH before any runs, so the table
 * lines their keys need can be prefetched together (kvt_prefetch): with
 * pipelining a single read brings many requests, and their cache misses then
 * overlap instead of stalling one after another. Arguments of a batch point
 * into the input buffer, which does not move until the batch has run. */
static void process_input(struct conn *c)
{
    if (c->mq) {
        mqtt_input(c);
        return;
    }
    struct poller *p = c->p;
    struct kv_table *t = p->ps->eng->table;
    while (!c->ses.cl.close_after_reply && !stalled(c)) {
        if (c->out.len - c->out_off > OUT_PAUSE) {
            /* The client sends faster than it reads: stop taking requests (and
             * drop EPOLLIN) until the replies drain, so memory stays bounded. */
            c->paused = 1;
            break;
        }
        /* Before AUTH one request at a time: AUTH changes the limits for the next. */
        int max = c->ses.cl.authenticated ? BATCH : 1;
        int n = 0, nargs = 0, perr = 0, again = 0;
        size_t off = c->in_off;
        while (n < max) {
            /* An inline request is unescaped in place when parsed, so it must not
             * be parsed twice: it only starts a batch (and ends it), never waits in
             * one that a pause may cut short. */
            if (n > 0 && off < c->in.len && c->in.p[off] != '*')
                break;
            c->rp.unauth = !c->ses.cl.authenticated;
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
                if (resp_args_reserve(&p->args, nargs + argc)) {
                    conn_close(c);
                    return;
                }
                for (int i = 0; i < argc; i++) {
                    p->args.argv[nargs + i] = c->in.p + off + c->rp.argv[i].off;
                    p->args.argl[nargs + i] = c->rp.argv[i].len;
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
                b->h = b->argc > 1 ? kvt_hash(p->args.argv[b->arg0 + 1], p->args.argl[b->arg0 + 1]) : 0;
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
            int r = ses_run(&c->ses, b->argc, p->args.argv + b->arg0, p->args.argl + b->arg0);
            /* a reply (or a multi-key reply in part, kept over a stall) waits for its LSN */
            if (r < 0 || (c->out.len > reply_at && ses_hold(&c->ses, reply_at, c->ses.need))) {
                conn_close(c);
                return;
            }
            if (r == SES_STALL) { /* runs again when the data file has what it needs */
                stall_add(c);
                break;
            }
            st_inc(&p->st->commands, 1);
            c->in_off = b->end;
            if (c->ses.cl.close_after_reply) { /* QUIT: what follows it is not run */
                i++;
                break;
            }
        }
        if (i < n || c->paused || stalled(c) || c->ses.cl.close_after_reply) {
            /* Stopped inside the batch: what follows is parsed again later, so
             * forget any partial progress the parser made past it. */
            resp_reset(&c->rp);
            break;
        }
        c->in_off = off; /* also steps over empty requests ("*0") after the last one */
        if (perr) {
            resp_add_errorf(&c->out, "ERR %s", c->rp.err);
            st_inc(&p->st->protocol_errors, 1);
            c->ses.cl.close_after_reply = 1;
            break;
        }
        if (again)
            break; /* the rest of the buffer is an incomplete request */
    }
    if (c->in_off == c->in.len) {
        note_big(c);
        c->in.len = c->in_off = 0;
    } else if (c->in_off > 0 && (c->in_off >= c->in.cap / 2 || c->in.cap - c->in.len < TCP_READ_CHUNK)) {
        /* parser offsets are relative to the request start, so moving is safe */
        kvbuf_consume(&c->in, c->in_off);
        c->in_off = 0;
    }
}

static void conn_readable(struct conn *c)
{
    struct poller *p = c->p;
    if (c->ses.cl.close_after_reply || c->paused || stalled(c)) {
        /* Unread bytes: an edge-triggered registration must be made again to
         * report them, which the update that gives EPOLLIN back now does. */
        if (p->ps->policy->edge)
            c->interest &= ~(uint32_t)(EPOLLIN | EPOLLRDHUP);
        return;
    }
    /* The query-buffer limit (its argument array counted) is checked by publish, after each read. */
    /* Read at least TCP_READ_CHUNK; inside a large bulk, grow with what has already
     * arrived (geometric), never by the length the client merely declared. */
    size_t want = TCP_READ_CHUNK;
    if (c->rp.bulk > 0) {
        size_t have = c->in.len - c->in_off - c->rp.scan;
        size_t need = (size_t)c->rp.bulk + 2 > have ? (size_t)c->rp.bulk + 2 - have : 0;
        size_t cap = c->in.len > TCP_READ_CHUNK ? c->in.len : TCP_READ_CHUNK;
        want = need < cap ? need : cap;
        if (want < TCP_READ_CHUNK)
            want = TCP_READ_CHUNK;
    }
    if (kvbuf_reserve(&c->in, want)) {
        conn_close(c);
        return;
    }
    size_t room = c->in.cap - c->in.len;
    ssize_t n = tlsio_recv(c->tls, c->fd, c->in.p + c->in.len, room);
    st_inc(&p->st->reads, 1);
    if (n < 0) {
        if (errno != EAGAIN && errno != EINTR)
            conn_close(c);
        else if (tlsio_want_write(c->tls)) /* a handshake's flight waits for room: EPOLLOUT */
            update_interest(c, 0);
        return;
    }
    if (n == 0) {
        /* Peer closed its side: answer what it already sent, then close. */
        c->ses.cl.close_after_reply = 1;
        if (c->out_off == c->out.len)
            conn_close(c);
        else
            list_pending(c);
        return;
    }
    c->in.len += (size_t)n;
    st_inc(&p->st->bytes_in, (uint64_t)n);
    process_input(c);
    if (c->closed)
        return;
    /* A short read emptied the socket; after a full one more may wait unreported. */
    if (((size_t)n == room || tlsio_more(c->tls)) && p->ps->policy->edge)
        rearm_input(c);
    if (c->out.len > c->out_off || c->ses.cl.close_after_reply)
        list_pending(c);
    publish(c);
}

static void conn_new(struct poller *p, int fd, int tls, int mqtt)
{
    struct poller_server *ps = p->ps;
    if (!tcp_admit(&ps->tcp, fd, !mqtt))
        return;
    struct conn *c = calloc(1, sizeof *c);
    if (c && tls && !(c->tls = tlsio_conn_new(ps->tls, fd))) {
        free(c);
        c = NULL;
    }
    if (!c) {
        close(fd);
        tcp_closed(&ps->tcp);
        return;
    }
    c->tag = TAG_CONN;
    c->fd = fd;
    c->p = p;
    resp_parser_init(&c->rp);
    char addr[64];
    net_peer_addr(fd, addr, sizeof addr);
    ses_init(&c->ses, ps->eng, &c->out, addr, p->idx, p->evfd);
    c->interest = in_events(ps->policy) | (ps->policy->edge ? EPOLLET : 0);
    struct epoll_event e = {.events = c->interest, .data.ptr = c};
    st_inc(&p->st->epoll_ctl, 1);
    if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &e)) {
        tlsio_conn_free(c->tls);
        close(fd);
        tcp_closed(&ps->tcp);
        resp_parser_free(&c->rp);
        ses_free(&c->ses);
        free(c);
        return;
    }
    list_init(&c->wait_node);
    list_init(&c->stall_node);
    list_init(&c->big_node);
    list_add(&p->all, &c->node);
    ses_connect(&c->ses, fd, p->now);
    st_inc(&p->st->accepted, 1);
    st_inc(&p->st->clients, 1);
    if (mqtt && mqtt_conn_new(ps->mqtt, c))
        conn_close(c); /* (out of memory) */
}

static void do_accept(struct poller *p, int lfd, int tls, int mqtt)
{
    struct poller_server *ps = p->ps;
    for (int i = 0; i < 64; i++) {
        int fd = tcp_accept(&ps->tcp, lfd);
        if (fd < 0)
            return; /* -EAGAIN: nothing more to accept */
        if (ps->handoff) {
            uint64_t i2 = atomic_fetch_add_explicit(&ps->handoff_rr, 1, memory_order_relaxed);
            struct poller *to = &ps->pollers[i2 % (uint64_t)ps->npollers];
            if (to != p) {
                fdq_push(&to->handed, tls ? fd | HANDED_TLS : mqtt ? fd | HANDED_MQTT : fd);
                continue;
            }
        }
        conn_new(p, fd, tls, mqtt);
    }
}

/* The log moved on (or failed): send the replies it released. */
static void release_waiting(struct poller *p)
{
    struct wal *w = p->ps->eng->wal;
    if (!w || list_empty(&p->waiting))
        return;
    int failed = wal_failed(w);
    struct list l;
    list_move_all(&l, &p->waiting);
    while (!list_empty(&l)) {
        struct conn *c = list_entry(l.next, struct conn, wait_node);
        list_del(&c->wait_node);
        if (failed)
            conn_close(c); /* their writes can never be acknowledged */
        else
            conn_write(c, 0); /* re-lists itself if something is still held */
    }
}

/* The data file loaded a key or freed memory: run the stalled requests again;
 * a parked read only once a key it waits on was written or its time is up. */
static void retry_stalled(struct poller *p)
{
    struct list l;
    list_move_all(&l, &p->stalled);
    p->block_deadline = INT64_MAX;
    while (!list_empty(&l)) {
        struct conn *c = list_entry(l.next, struct conn, stall_node);
        list_del(&c->stall_node);
        if (c->ses.stall == CMD_STALL_BLOCK && !cmd_block_ready(&c->ses.cl)) {
            stall_add(c); /* still waiting */
            continue;
        }
        process_input(c); /* may stall again */
        if (!c->closed)
            list_pending(c); /* replies out, EPOLLIN back */
    }
}

/* A monitor's lines were moved into its output: send them this round. */
static void monitor_ready(void *arg, struct cmd_client *cl)
{
    (void)arg;
    list_pending(list_entry(cl, struct conn, ses.cl));
}

static void drain_event(struct poller *p)
{
    uint64_t v;
    ssize_t r = read(p->evfd, &v, sizeof v);
    (void)r;
    int fds[64]; /* at most 64 per wakeup; fdq_take wakes us again for the rest */
    int n = fdq_take(&p->handed, fds, 64);
    for (int i = 0; i < n; i++)
        conn_new(p, fds[i] & ~(HANDED_TLS | HANDED_MQTT), !!(fds[i] & HANDED_TLS), !!(fds[i] & HANDED_MQTT));
    release_waiting(p);
    retry_stalled(p);
    if (p->ps->mqtt)
        mqtt_wakeups(p); /* subscribers whose topics were written */
    cmd_monitor_take(p->ps->eng, p->evfd, monitor_ready, p); /* lines other threads queued */
}

/* Before sleeping: the log wakes this poller only once its first held reply is
 * durable (awake, it looks here at each round's end and is not woken). Returns
 * 1 if that is so already: the replies went out, look again without sleeping. */
static int log_arm(struct poller *p, struct wal *w)
{
    uint64_t want = UINT64_MAX;
    for (struct list *n = p->waiting.next; n != &p->waiting; n = n->next) {
        struct session *s = &list_entry(n, struct conn, wait_node)->ses;
        uint64_t l = s->hold_n ? s->holds[s->hold_head].lsn : 0;
        want = l < want ? l : want;
    }
    if (wal_want(w, &p->log_slot, p->evfd, want) < want)
        return 0;
    release_waiting(p);
    return 1;
}

/* Give back the memory of buffers past TCP_BUF_KEEP that held no more than it for
 * TCP_BUF_IDLE_MS (see note_big): idle clients keep TCP_BUF_KEEP each at most. A
 * stalled connection is left as it is (its request is run again from its input). */
static void shrink_idle(struct poller *p)
{
    for (struct list *n = p->big.next, *next; n != &p->big; n = next) {
        next = n->next;
        struct conn *c = list_entry(n, struct conn, big_node);
        if (p->now - c->big_ms < TCP_BUF_IDLE_MS || stalled(c))
            continue;
        kvbuf_shrink(&c->in, TCP_BUF_KEEP);  /* (each only if it holds no more than that) */
        kvbuf_shrink(&c->out, TCP_BUF_KEEP);
        if (c->in.cap <= TCP_BUF_KEEP && c->out.cap <= TCP_BUF_KEEP)
            list_del(&c->big_node);
        publish(c); /* its memory, for CLIENT LIST and maxmemory-clients */
    }
}

static void flush_round(struct poller *p)
{
    const struct pp_policy *pol = p->ps->policy;
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
        if (pol->write_at_round_end || c->ses.cl.close_after_reply ||
            (pol->edge && c->writable && (c->interest & EPOLLOUT)))
            conn_write(c, 0);
        else
            update_interest(c, 0);
    }
}

/* For the MQTT protocol (frontend/mqtt_int.h) */
void pconn_close(struct conn *c) { conn_close(c); }
void pconn_stall(struct conn *c) { stall_add(c); }
void pconn_pending(struct conn *c) { list_pending(c); }
int pconn_stalled(const struct conn *c) { return stalled(c); }

void *poller_main(void *arg)
{
    struct poller *p = arg;
    struct poller_server *ps = p->ps;
    struct epoll_event ev[MAX_EVENTS];
    int edge = ps->policy->edge;
    p->log_slot = -1;
    if (ps->mqtt)
        mqtt_poller_thread(p);
    while (!atomic_load_explicit(&ps->stopping, memory_order_acquire)) {
        struct wal *w = ps->eng->wal;
        int released = w && log_arm(p, w);
        int timeout = released ? 0 : TCP_CRON_MS;
        if (ps->mqtt && atomic_load_explicit(&p->mq.wake, memory_order_relaxed))
            timeout = 0; /* sessions this thread's own writes raised (the cron's too) */
        if (p->block_deadline != INT64_MAX && !released) { /* a parked read's time */
            int64_t left = p->block_deadline - kv_mono_ms();
            timeout = left <= 0 ? 0 : left < timeout ? (int)left : timeout;
        }
        int n = epoll_wait(p->epfd, ev, MAX_EVENTS, timeout);
        if (w)
            wal_want(w, &p->log_slot, p->evfd, UINT64_MAX); /* awake: no wake-ups */
        st_inc(&p->st->epoll_wait, 1);
        p->now = kv_coarse_ms();
        for (int i = 0; i < n; i++) {
            int *tag = ev[i].data.ptr;
            if (*tag == TAG_LISTENER || *tag == TAG_TLS_LISTENER || *tag == TAG_MQTT_LISTENER) {
                do_accept(p, *tag == TAG_LISTENER ? p->lfd : *tag == TAG_TLS_LISTENER ? p->tls_lfd : p->mqtt_lfd,
                          *tag == TAG_TLS_LISTENER, *tag == TAG_MQTT_LISTENER);
            } else if (*tag == TAG_EVENT) {
                drain_event(p);
            } else {
                struct conn *c = (struct conn *)tag;
                uint32_t e = ev[i].events;
                if ((e & EPOLLERR) || ((e & EPOLLHUP) && (c->paused || stalled(c) || c->ses.cl.close_after_reply)) ||
                    ((e & EPOLLRDHUP) && parked(c)))
                    conn_close(c); /* reported whatever the interest set: never ignore them */
                else if (e & (EPOLLIN | EPOLLHUP))
                    conn_readable(c);
                if (edge && (e & EPOLLRDHUP) && !c->closed && !c->ses.cl.close_after_reply &&
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
        if (p->block_deadline != INT64_MAX && kv_mono_ms() >= p->block_deadline)
            retry_stalled(p); /* parked reads whose time is up reply now */
        if (ps->mqtt)
            mqtt_wakeups(p); /* subscribers this round's writes raised */
        flush_round(p);
        if (p->now - p->last_cron >= TCP_CRON_MS) {
            p->last_cron = p->now;
            if (!list_empty(&p->stalled))
                retry_stalled(p); /* a wakeup may be lost (a load request refused for memory) */
            cmd_monitor_take(ps->eng, p->evfd, monitor_ready, p); /* a full monitor's rest */
            tcp_cron(&ps->tcp, p->idx, p->now);
            if (ps->mqtt)
                mqtt_cron(p); /* keep-alive, takeovers */
            shrink_idle(p);
            cmd_clients_cron(ps->eng, p->now); /* recent-max windows, eviction, memory given back */
        }
    }
    for (struct list *n = p->all.next; n != &p->all; n = n->next)
        conn_close(list_entry(n, struct conn, node));
    flush_round(p); /* frees them all */
    return NULL;
}
