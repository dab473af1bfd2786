/* nbd_conn.c - an NBD worker thread: its epoll loop, connections handed to it
 * by thread 0's accept, and connection I/O (the handshake is nbd_hs.c's).
 * One round = every ready descriptor read (all the bytes a socket has, every
 * request in them submitted), then lock grants run, one backend flush (many
 * operations per system call), then every connection's replies written with
 * writev in batches. Threads: all of this runs on the owning worker; only the
 * fd queue and the grant list are touched by others (nbd_int.h).
 * Reads untrusted bytes: proto/nbd.c parses them; option data is bounded by
 * NBD_MAX_OPT_LEN (longer options are skipped and refused), requests by
 * nbd_req.c. A malformed handshake closes only its connection; one not finished
 * NBD_HS_LIMIT_MS after the accept is closed (epoll_wait wakes each second while
 * a connection negotiates). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/net.h"
#include "core/tls.h"
#include "frontend/nbd_int.h"

#define NBD_IOV 64       /* iovecs per writev */
#define NBD_EVENTS 64    /* epoll events per round */
#define SPIN_MISSES 4    /* busy-poll windows in a row that find nothing: stop spinning */
#define SPIN_RETRY 15    /* ... then try one window in this many rounds: odd (see next_events) */

/* A client's name for log lines: ADDR:PORT over TCP; over a unix socket
 * "unix:pid PID" (SO_PEERCRED), as the address says nothing. */
static void peer_name(int fd, char *dst, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_UNIX) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
            snprintf(dst, n, "unix:pid %ld", (long)cr.pid);
        else
            snprintf(dst, n, "unix:?");
        return;
    }
    net_peer_addr(fd, dst, n);
}

/* A client on the same machine (a loopback peer) gets a bounded receive window
 * (NBD_LOOPBACK_RCVBUF; the kernel doubles it and stops autotuning). Autotuned,
 * a writing client may queue several MiB per connection, which this loop drains
 * once per round; the client, sharing our cores, then spends about twice the CPU
 * per large write in its send path (measured with fio: 27-33 -> 16-20 us per
 * 128 KiB write). A remote client keeps autotuning: a fixed 1 MiB window would
 * cap a long link to 1 MiB per round trip. */
#define NBD_LOOPBACK_RCVBUF (512 * 1024)
static void tune_socket(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on a unix socket */
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    if (getpeername(fd, (struct sockaddr *)&a, &al) == 0 && a.sin_family == AF_INET &&
        (ntohl(a.sin_addr.s_addr) >> 24) == 127) {
        int rcv = NBD_LOOPBACK_RCVBUF;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    }
}

/* ---- connections */

static void set_events(struct nbd_conn *c)
{
    if (c->closed)
        return;
    int out = c->hs_off < c->hs.len || c->out_head || c->tls_rd_wants_out;
    /* no EPOLLIN (nor EPOLLRDHUP: level-triggered, it would fire every round) while
     * input is not wanted (nor while STARTTLS's ACK is on its way: what follows it
     * is TLS) */
    int in = (!c->paused && c->phase != PH_CLOSING && (!c->tls || c->tls_on) && !c->t->draining) ||
             c->tls_wr_wants_in;
    uint32_t ev = (in ? EPOLLIN | EPOLLRDHUP : 0) | (out ? EPOLLOUT : 0);
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = &c->w};
    if (epoll_ctl(c->t->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0)
        c->events = ev;
}

void nbd_conn_want_write(struct nbd_conn *c)
{
    if (!c->out_listed) {
        c->out_listed = 1;
        c->next_out = c->t->out_list;
        c->t->out_list = c;
    }
}

static void drop_replies(struct nbd_conn *c)
{
    while (c->out_head) {
        struct nbd_req *r = c->out_head;
        c->out_head = r->next;
        nbd_req_free(c->t, r);
    }
    c->out_tail = NULL;
}

/* Close the socket now; the struct goes once no request owns operations (the
 * round's end frees it, so pointers held during this round stay valid). */
void nbd_conn_close(struct nbd_conn *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    /* explicitly: close() drops the registration only if no other descriptor
     * refers to the socket (a forked child's copy) */
    epoll_ctl(c->t->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    tls_conn_free(c->tls); /* a close_notify if the session is up */
    c->tls = NULL;
    close(c->fd);
    c->fd = -1;
    atomic_fetch_sub_explicit(&c->t->s->clients, 1, memory_order_relaxed);
    NBD_ST(c->t, connections, (uint64_t)-1);
    nbd_hs_leave(c);
    drop_replies(c);
    if (c->filling) { /* its payload never came: it owns no operations */
        nbd_req_free(c->t, c->filling);
        c->filling = NULL;
    }
    nbd_conn_want_write(c);
}

static void conn_free(struct nbd_conn *c)
{
    list_del(&c->node);
    free(c->in);
    kvbuf_free(&c->hs);
    free(c);
}

static void conn_new(struct nbd_thread *t, int fd)
{
    struct nbd_conn *c = calloc(1, sizeof *c);
    if (c && !(c->in = malloc(NBD_IN_CAP))) {
        free(c);
        c = NULL;
    }
    if (!c) {
        kvlog(KVLOG_WARNING, "NBD: out of memory for a new connection: closed");
        close(fd);
        atomic_fetch_sub_explicit(&t->s->clients, 1, memory_order_relaxed);
        return;
    }
    c->w.kind = NBD_WATCH_CONN;
    c->w.ctx = c;
    c->t = t;
    c->fd = fd;
    c->phase = PH_FLAGS;
    tune_socket(fd);
    peer_name(fd, c->addr, sizeof c->addr);
    struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->w};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
        close(fd);
        free(c->in);
        free(c);
        atomic_fetch_sub_explicit(&t->s->clients, 1, memory_order_relaxed);
        return;
    }
    c->events = e.events;
    list_add(&t->conns, &c->node);
    c->in_hs = 1;
    c->born_ms = kv_coarse_ms();
    if (!t->hs_conns++)
        t->next_hs_sweep = c->born_ms + 1000;
    NBD_ST(t, connections, 1);
    NBD_ST(t, total_connections, 1);
    uint8_t g[NBD_GREETING_LEN];
    nbd_enc_greeting(g);
    if (kvbuf_append(&c->hs, g, sizeof g) < 0)
        nbd_conn_close(c);
    nbd_conn_want_write(c);
}

/* Everything the input holds: handshake steps, then requests. */
static void process(struct nbd_conn *c)
{
    while (!c->closed) {
        if (c->skip && c->phase != PH_TX) {
            size_t avail = c->in_len - c->in_off;
            size_t n = avail < c->skip ? avail : (size_t)c->skip;
            c->in_off += n;
            c->skip -= n;
            if (c->skip)
                return;
        }
        if (c->phase == PH_FLAGS || c->phase == PH_OPTS) {
            if (!nbd_handshake(c))
                return;
        } else if (c->phase == PH_TX) {
            if (nbd_req_input(c) < 0)
                nbd_conn_close(c);
            return;
        } else { /* closing: what else the client sends is dropped */
            c->in_off = c->in_len;
            return;
        }
    }
}

/* read(2)'s contract over the connection (TLS once it is on). A failed TLS
 * handshake or record closes only this connection (errno EPROTO), logged. */
static ssize_t conn_recv(struct nbd_conn *c, void *buf, size_t n)
{
    if (!c->tls)
        return read(c->fd, buf, n);
    ssize_t r = tls_read(c->tls, buf, n);
    c->tls_rd_wants_out = r == TLS_WANT_WRITE;
    if (r >= 0)
        return r;
    if (r == -EAGAIN || r == TLS_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
    kvlog_rated(&rate, KVLOG_VERBOSE, "NBD client %s: %s: closing", c->addr, tls_conn_error(c->tls));
    NBD_ST(c->t, protocol_errors, 1);
    errno = r == -EPROTO ? EPROTO : (int)-r;
    return -1;
}

static void conn_read(struct nbd_conn *c)
{
    if (c->tls && !c->tls_on)
        return; /* STARTTLS's ACK is not out yet */
    for (int round = 0; round < 8 && !c->closed && !c->paused && c->phase != PH_CLOSING; round++) {
        struct nbd_req *f = c->filling;
        ssize_t n;
        size_t want;
        if (f && c->in_off == c->in_len && !c->tls && f->h.length >= NBD_IN_CAP / 2) {
            /* A large payload goes straight into its request, and only the next
             * request's header behind it into the input buffer, so the next large
             * payload goes straight into its request too: a stream of large writes
             * costs one read and no copy each. (The test is on the request's length:
             * what is left of it after a buffered read is a small tail.) Small writes
             * still arrive many per read, below. TLS reads whole records instead. */
            uint64_t rest = f->h.length - c->fill_off;
            struct iovec iov[2] = {{f->data + c->fill_off, rest}, {c->in, NBD_REQ_LEN}};
            c->in_off = c->in_len = 0;
            want = rest + NBD_REQ_LEN;
            n = readv(c->fd, iov, 2);
            if (n > 0) {
                uint64_t d = (uint64_t)n < rest ? (uint64_t)n : rest;
                c->fill_off += d;
                c->in_len = (size_t)((uint64_t)n - d);
            }
        } else if (f && c->in_off == c->in_len && f->h.length - c->fill_off >= NBD_IN_CAP / 2) {
            /* the same under TLS, without the header */
            want = f->h.length - c->fill_off;
            n = conn_recv(c, f->data + c->fill_off, want);
            if (n > 0)
                c->fill_off += (uint64_t)n;
        } else {
            if (c->in_off == c->in_len) {
                c->in_off = c->in_len = 0;
            } else if (c->in_off && c->in_len - c->in_off < NBD_IN_CAP / 2) {
                memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
                c->in_len -= c->in_off;
                c->in_off = 0;
            }
            if (c->tls && c->in_off && NBD_IN_CAP - c->in_len < TLS_RECORD_MAX) {
                /* TLS reads take whole records: a smaller room would leave plaintext inside
                 * OpenSSL, where epoll cannot see it */
                memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
                c->in_len -= c->in_off;
                c->in_off = 0;
            }
            if (c->in_len == NBD_IN_CAP || (c->tls && NBD_IN_CAP - c->in_len < TLS_RECORD_MAX))
                break; /* full and nothing parsed: the in-flight bound holds it */
            want = NBD_IN_CAP - c->in_len;
            n = conn_recv(c, c->in + c->in_len, want);
            if (n > 0)
                c->in_len += (size_t)n;
        }
        if (n == 0) {
            /* end of the client's stream (it may only have shut down its side, after
             * DISCONNECT): requests already in run and their replies still go out */
            if ((c->active || c->out_head) && !c->filling && c->phase == PH_TX) {
                c->phase = PH_CLOSING;
                nbd_conn_want_write(c);
                break;
            }
            nbd_conn_close(c);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                nbd_conn_close(c);
            break;
        }
        process(c);
        if (c->tls && !c->tls_on)
            break; /* STARTTLS: what follows its ACK is TLS */
        if ((size_t)n < want && !c->tls)
            break; /* the socket is drained: (level-triggered) epoll reports what comes next;
                      (a TLS read returns one record: read on until EAGAIN) */
    }
    set_events(c);
}

/* After a failed send: 1 to try again (EINTR), 0 to stop (EAGAIN: EPOLLOUT says
 * when there is room; anything else closed the connection). */
static int send_failed(struct nbd_conn *c)
{
    if (errno == EINTR)
        return 1;
    if (errno != EAGAIN)
        nbd_conn_close(c);
    return 0;
}

/* sendmsg(2)'s contract over the connection. TLS: the pieces are gathered into
 * the thread's buffer and written as records (a 16-byte reply header is not a
 * record of its own); after a WANT the same bytes come again from the same
 * place (the queue only grows behind them), as tls_write asks. */
static ssize_t conn_send(struct nbd_conn *c, const struct iovec *iov, int k)
{
    if (!c->tls_on) {
        struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)k};
        return sendmsg(c->fd, &m, MSG_NOSIGNAL);
    }
    struct nbd_thread *t = c->t;
    if (!t->tls_out && !(t->tls_out = malloc(NBD_TLS_OUT))) {
        errno = ENOMEM;
        return -1;
    }
    size_t total = 0;
    for (int i = 0; i < k;) {
        const uint8_t *p;
        size_t n = 0;
        if (iov[i].iov_len >= NBD_TLS_OUT / 2) { /* large: straight from where it is */
            p = iov[i].iov_base;
            n = iov[i].iov_len;
            i++;
        } else {
            for (p = t->tls_out; i < k && n + iov[i].iov_len <= NBD_TLS_OUT; i++) {
                memcpy(t->tls_out + n, iov[i].iov_base, iov[i].iov_len);
                n += iov[i].iov_len;
            }
        }
        ssize_t r = tls_write(c->tls, p, n);
        c->tls_wr_wants_in = r == -EAGAIN;
        if (r > 0) {
            total += (size_t)r;
            if ((size_t)r < n)
                break;
            continue;
        }
        if (r == -EAGAIN || r == TLS_WANT_WRITE) {
            if (total)
                break;
            errno = EAGAIN;
            return -1;
        }
        static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
        kvlog_rated(&rate, KVLOG_VERBOSE, "NBD client %s: %s: closing", c->addr, tls_conn_error(c->tls));
        errno = EPIPE;
        return -1;
    }
    return (ssize_t)total;
}

/* Send handshake bytes, then replies, until done or the socket is full. */
static void conn_write(struct nbd_conn *c)
{
again:
    while (c->hs_off < c->hs.len) {
        struct iovec one = {c->hs.p + c->hs_off, c->hs.len - c->hs_off};
        ssize_t n = conn_send(c, &one, 1);
        if (n < 0) {
            if (send_failed(c))
                continue;
            if (c->hs_off >= NBD_HS_MAX) { /* a slow reader: what it read goes, the buffer stays bounded */
                memmove(c->hs.p, c->hs.p + c->hs_off, c->hs.len - c->hs_off);
                c->hs.len -= c->hs_off;
                c->hs_off = 0;
            }
            return;
        }
        c->hs_off += (size_t)n;
    }
    c->hs.len = c->hs_off = 0;
    if (c->tls && !c->tls_on) {
        /* STARTTLS's ACK is out: TLS from here (the client's hello is read next) */
        c->tls_on = 1;
        conn_read(c);
        if (c->closed)
            return;
        goto again; /* (what the client sent already may have been answered) */
    }
    if (c->phase == PH_TX && c->hs.p)
        kvbuf_free(&c->hs); /* the handshake is over: its buffer is not needed again */
    while (c->out_head) {
        struct iovec iov[NBD_IOV];
        int k = 0;
        uint64_t total = 0;
        for (struct nbd_req *r = c->out_head; r && k < NBD_IOV - 1; r = r->next) {
            if (r->sent < r->hdr_len)
                iov[k++] = (struct iovec){r->hdr + r->sent, r->hdr_len - r->sent};
            uint64_t d = r->sent > r->hdr_len ? r->sent - r->hdr_len : 0;
            if (r->data_len > d)
                iov[k++] = (struct iovec){r->data + d, r->data_len - d};
            total += r->hdr_len + r->data_len - r->sent;
        }
        ssize_t n = conn_send(c, iov, k);
        if (n < 0) {
            if (send_failed(c))
                continue;
            return;
        }
        uint64_t left = (uint64_t)n;
        while (c->out_head) {
            struct nbd_req *r = c->out_head;
            uint64_t rest = r->hdr_len + r->data_len - r->sent;
            if (left < rest) {
                r->sent += left;
                break;
            }
            left -= rest;
            c->out_head = r->next;
            if (!c->out_head)
                c->out_tail = NULL;
            nbd_req_free(c->t, r);
        }
        if ((uint64_t)n < total)
            return; /* the socket took part of it: full (EPOLLOUT says when it has room) */
    }
}

/* The round's end for one connection: write, resume input the in-flight bound
 * held, close after DISCONNECT / ABORT, free a closed one nobody uses. While
 * here it stays marked as listed, so that a close or a reply queued meanwhile
 * does not list it a second time (it would be freed twice). */
static void conn_flush(struct nbd_conn *c)
{
    int again = 0;
    if (!c->closed) {
        conn_write(c);
        if (!c->closed && c->paused && c->inflight < NBD_CONN_MAX_INFLIGHT / 2 && !nbd_hs_full(c)) {
            c->paused = 0;
            struct nbd_req *tail = c->out_tail;
            process(c); /* the headers already buffered */
            if (!c->closed && !c->paused)
                conn_read(c);
            again = !c->closed && c->out_tail != tail; /* replies queued just now */
        }
        if (!c->closed && c->phase == PH_CLOSING && !c->active && !c->out_head && c->hs_off == c->hs.len)
            nbd_conn_close(c);
        set_events(c);
    }
    if (c->closed && !c->active) {
        conn_free(c);
        return;
    }
    c->out_listed = 0;
    if (again)
        nbd_conn_want_write(c);
}

/* ---- the thread */

static void accept_all(struct nbd_thread *t, int lfd)
{
    struct nbd_server *s = t->s;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN) {
                static struct kvlog_rate rate = KVLOG_RATE_INIT(5);
                kvlog_rated(&rate, KVLOG_WARNING, "NBD: accept failed: %s", strerror(errno));
            }
            return;
        }
        if (atomic_fetch_add_explicit(&s->clients, 1, memory_order_relaxed) >= s->max_clients) {
            atomic_fetch_sub_explicit(&s->clients, 1, memory_order_relaxed);
            NBD_ST(t, rejected_connections, 1);
            close(fd);
            continue;
        }
        /* round robin: fio's jobs (and multi-conn clients) spread over the threads */
        struct nbd_thread *to = &s->th[s->rr++ % (unsigned)s->threads];
        if (to == t)
            conn_new(t, fd);
        else
            fdq_push(&to->q, fd);
    }
}

static void on_wake(struct nbd_thread *t)
{
    uint64_t v;
    (void)!read(t->evfd, &v, sizeof v);
    int fds[64];
    int n = fdq_take(&t->q, fds, 64);
    for (int i = 0; i < n; i++)
        conn_new(t, fds[i]);
}

/* Close the connections still negotiating NBD_HS_LIMIT_MS after their accept:
 * without it, clients that connect and say nothing hold every client slot. */
static void hs_sweep(struct nbd_thread *t)
{
    uint64_t now = kv_coarse_ms();
    if (!t->hs_conns || now < t->next_hs_sweep)
        return;
    t->next_hs_sweep = now + 1000;
    static struct kvlog_rate rate = KVLOG_RATE_INIT(20);
    for (struct list *n = t->conns.next; n != &t->conns; n = n->next) {
        struct nbd_conn *c = (struct nbd_conn *)((char *)n - offsetof(struct nbd_conn, node));
        if (c->in_hs && !c->closed && now - c->born_ms >= NBD_HS_LIMIT_MS) {
            kvlog_rated(&rate, KVLOG_WARNING, "NBD client %s: handshake not finished within %u s: closing", c->addr,
                        NBD_HS_LIMIT_MS / 1000);
            NBD_ST(t, protocol_errors, 1);
            nbd_conn_close(c); /* freed at the round's end (conn_close lists it) */
        }
    }
}

static void round_end(struct nbd_thread *t)
{
    for (int i = 0; i < 64; i++) {
        nbd_req_run_grants(t);
        if (t->dirty) {
            t->dirty = 0;
            t->s->be->flush(t->be);
            continue;
        }
        if (!t->out_list && !t->ready)
            break;
        while (t->out_list) {
            struct nbd_conn *c = t->out_list;
            t->out_list = c->next_out;
            conn_flush(c);
        }
    }
    /* Work left after the last pass (a flush's completions queued replies or
     * grants, or submitted more): a connection waiting for those replies may
     * have no event registered that would come, so the thread wakes itself and
     * the next round goes on at once. */
    if (t->dirty || t->ready || t->out_list) {
        uint64_t one = 1;
        (void)!write(t->evfd, &one, sizeof one);
    }
}

/* Stopping: no more input, no new connections; the backend's operations in
 * flight (its pending count) finish and their replies go out, for at most
 * NBD_DRAIN_MS. What is still in flight then is dropped with its connection
 * (nbd_destroy frees it). */
static void drain(struct nbd_thread *t)
{
    struct nbd_server *s = t->s;
    t->draining = 1;
    for (struct list *n = t->conns.next; n != &t->conns; n = n->next)
        set_events((struct nbd_conn *)((char *)n - offsetof(struct nbd_conn, node)));
    round_end(t);
    struct epoll_event ev[NBD_EVENTS];
    for (int64_t end = kv_coarse_ms() + NBD_DRAIN_MS, left;
         s->be->pending(t->be) && (left = end - kv_coarse_ms()) > 0;) {
        int n = epoll_wait(t->epfd, ev, NBD_EVENTS, left < 100 ? (int)left : 100);
        for (int i = 0; i < n; i++) {
            struct nbd_watch *w = ev[i].data.ptr;
            if (w->kind == NBD_WATCH_WAKE) {
                uint64_t v;
                (void)!read(t->evfd, &v, sizeof v); /* lock grants: round_end runs them */
            } else if (w->kind == NBD_WATCH_CONN) {
                struct nbd_conn *c = w->ctx;
                if (!c->closed && (ev[i].events & (EPOLLHUP | EPOLLERR)))
                    nbd_conn_close(c);
                else if (!c->closed && (ev[i].events & (EPOLLOUT | EPOLLIN)))
                    nbd_conn_want_write(c);
            } else if (w->kind != NBD_WATCH_LISTEN) {
                s->be->on_event(w->ctx, w, ev[i].events);
            }
        }
        round_end(t);
    }
}

/* The next round's events. After a round that did work (worked), with
 * busy_poll_ns set, the sockets are polled without sleeping for up to that
 * long first: at queue depth 1 the client's next request (or a network
 * backend's reply) comes a few microseconds after our write, sooner than a
 * sleep and a wake-up. Each empty poll yields the core: a client or backend on
 * the same machine that wants it runs first (spinning without the yield took
 * their core: a kvstore-node backend's random reads fell to a third).
 * Adaptive: after SPIN_MISSES windows in a row that found nothing the thread
 * sleeps at once, and tries a window again one round in SPIN_RETRY, so a
 * client that is idle or slower than the window costs no CPU. SPIN_RETRY is
 * odd: an I/O through a network backend is two rounds (the client's request,
 * the backend's reply), and with an even count every retry fell on the same
 * one: when that was the wait for a client slower than the window (nbdfuse),
 * no retry ever hit and polling stayed off for good, though it would have
 * caught every backend reply (QD1 through FUSE flipped between ~100 and
 * ~130 us from run to run). */
static int next_events(struct nbd_thread *t, struct epoll_event *ev, int worked)
{
    uint64_t window = t->s->busy_poll_ns;
    if (window && worked &&
        (t->spin_misses < SPIN_MISSES || ++t->spin_rounds % SPIN_RETRY == 0)) {
        uint64_t end = kv_mono_ns() + window;
        do {
            int n = epoll_wait(t->epfd, ev, NBD_EVENTS, 0);
            if (n) {
                if (n > 0)
                    t->spin_misses = 0, t->spin_rounds = 0;
                return n;
            }
            sched_yield();
        } while (kv_mono_ns() < end);
        if (t->spin_misses < SPIN_MISSES)
            t->spin_misses++;
    }
    return epoll_wait(t->epfd, ev, NBD_EVENTS, t->hs_conns ? 1000 : -1);
}

void *nbd_thread_main(void *arg)
{
    struct nbd_thread *t = arg;
    struct nbd_server *s = t->s;
    struct epoll_event ev[NBD_EVENTS];
    int n = 0;
    while (!atomic_load_explicit(&s->stop, memory_order_acquire)) {
        n = next_events(t, ev, n > 0);
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            struct nbd_watch *w = ev[i].data.ptr;
            switch (w->kind) {
            case NBD_WATCH_LISTEN: accept_all(t, (int)(intptr_t)w->ctx); break;
            case NBD_WATCH_WAKE: on_wake(t); break;
            case NBD_WATCH_CONN: {
                struct nbd_conn *c = w->ctx;
                if (c->closed)
                    break;
                if (c->tls_wr_wants_in && (ev[i].events & EPOLLIN))
                    nbd_conn_want_write(c); /* a TLS write waited for this */
                if (ev[i].events & (EPOLLIN | EPOLLRDHUP))
                    conn_read(c);
                else if (ev[i].events & (EPOLLHUP | EPOLLERR))
                    nbd_conn_close(c);
                else if (c->tls_rd_wants_out && (ev[i].events & EPOLLOUT))
                    conn_read(c); /* the TLS handshake waited for room */
                if (!c->closed && (ev[i].events & EPOLLOUT))
                    nbd_conn_want_write(c);
                break;
            }
            default: s->be->on_event(w->ctx, w, ev[i].events); break;
            }
        }
        hs_sweep(t);
        round_end(t);
    }
    drain(t);
    return NULL;
}

void nbd_conn_free_all(struct nbd_thread *t)
{
    while (!list_empty(&t->conns)) {
        struct nbd_conn *c = (struct nbd_conn *)((char *)t->conns.next - offsetof(struct nbd_conn, node));
        nbd_conn_close(c);
        conn_free(c);
    }
    t->out_list = NULL;
}
