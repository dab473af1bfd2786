/* nbd_conn.c - an NBD worker thread: its epoll loop, connections handed to it
 * by thread 0's accept, the newstyle fixed handshake, and connection I/O.
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
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/net.h"
#include "core/tls.h"
#include "frontend/nbd_int.h"

#define NBD_IOV 64       /* iovecs per writev */
#define NBD_EVENTS 64    /* epoll events per round */
#define NBD_HS_MAX (64u << 10) /* unsent handshake bytes past which options are not read */

/* Option replies the client has not read: past NBD_HS_MAX the connection stops
 * reading (one option's replies are at most a few KiB: GO sends each
 * information item once), so a client that never reads pins no more. */
static int hs_full(const struct nbd_conn *c)
{
    return c->hs.len - c->hs_off > NBD_HS_MAX;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The connection leaves the handshake (in transmission, or closed). */
static void hs_leave(struct nbd_conn *c)
{
    if (c->in_hs) {
        c->in_hs = 0;
        c->t->hs_conns--;
    }
}

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
static void conn_close(struct nbd_conn *c)
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
    hs_leave(c);
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
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on a unix socket */
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
    c->born_ms = mono_ms();
    if (!t->hs_conns++)
        t->next_hs_sweep = c->born_ms + 1000;
    NBD_ST(t, connections, 1);
    NBD_ST(t, total_connections, 1);
    uint8_t g[NBD_GREETING_LEN];
    nbd_enc_greeting(g);
    if (kvbuf_append(&c->hs, g, sizeof g) < 0)
        conn_close(c);
    nbd_conn_want_write(c);
}

/* ---- the handshake */

/* Refused handshakes are logged at WARNING, at most 20 lines per 10 s over all
 * threads (a client may send many; kvlog_rated takes its own lock). */
static struct kvlog_rate hs_rate = KVLOG_RATE_INIT(20);

static void opt_reply(struct nbd_conn *c, uint32_t opt, uint32_t type, const void *data, uint32_t len)
{
    uint8_t h[NBD_OPT_REPLY_LEN];
    nbd_enc_opt_reply(h, opt, type, len);
    if (kvbuf_append(&c->hs, h, sizeof h) < 0 || (len && kvbuf_append(&c->hs, data, len) < 0))
        conn_close(c);
}

static void opt_error(struct nbd_conn *c, uint32_t opt, uint32_t type, const char *msg)
{
    opt_reply(c, opt, type, msg, (uint32_t)strlen(msg));
}

static uint16_t tx_flags(const struct nbd_conn *c)
{
    const struct nbd_server *s = c->t->s;
    return (uint16_t)(NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM |
                      NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO | NBD_FLAG_CAN_MULTI_CONN |
                      (s->read_only ? NBD_FLAG_READ_ONLY : 0) | (c->structured ? NBD_FLAG_SEND_DF : 0));
}

static int name_ok(const struct nbd_server *s, const char *name, size_t n)
{
    return n == 0 || (strlen(s->export_name) == n && !memcmp(s->export_name, name, n));
}

static void info_reply(struct nbd_conn *c, uint32_t opt, uint16_t type, const void *p, size_t n)
{
    uint8_t b[2 + NBD_MAX_NAME];
    nbd_put16(b, type);
    memcpy(b + 2, p, n);
    opt_reply(c, opt, NBD_REP_INFO, b, (uint32_t)(2 + n));
}

static void opt_go(struct nbd_conn *c, uint32_t opt, const uint8_t *p, uint32_t len)
{
    struct nbd_server *s = c->t->s;
    struct nbd_opt_go go;
    if (nbd_parse_opt_go(p, len, &go) < 0)
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed request");
    if (!name_ok(s, go.name, go.name_len))
        return opt_error(c, opt, NBD_REP_ERR_UNKNOWN, "no such export");
    uint8_t b[12];
    nbd_put64(b, s->size);
    nbd_put16(b + 8, tx_flags(c));
    info_reply(c, opt, NBD_INFO_EXPORT, b, 10);
    int sent = 0; /* each item once, however often asked for (64 names would be 256 KiB) */
    for (int i = 0; i < go.ninfo; i++) {
        if (go.info[i] == NBD_INFO_NAME && !(sent & 1)) {
            sent |= 1;
            info_reply(c, opt, NBD_INFO_NAME, s->export_name, strlen(s->export_name));
        } else if (go.info[i] == NBD_INFO_DESCRIPTION && !(sent & 2) && s->description && *s->description) {
            sent |= 2;
            info_reply(c, opt, NBD_INFO_DESCRIPTION, s->description, strnlen(s->description, NBD_MAX_NAME));
        }
    }
    /* always: any alignment works (min 1), block_size is what avoids a read-modify-write */
    nbd_put32(b, 1);
    nbd_put32(b + 4, s->block_size);
    nbd_put32(b + 8, NBD_MAX_PAYLOAD);
    info_reply(c, opt, NBD_INFO_BLOCK_SIZE, b, 12);
    opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
    if (opt == NBD_OPT_GO) {
        c->phase = PH_TX;
        hs_leave(c);
    }
}

/* NBD_OPT_STARTTLS: ACK it in plain, then everything goes through TLS (the
 * handshake first: it runs inside the next reads). */
static void opt_starttls(struct nbd_conn *c, uint32_t opt, uint32_t len)
{
    struct nbd_server *s = c->t->s;
    if (!s->tls)
        return opt_error(c, opt, NBD_REP_ERR_POLICY, "TLS is not offered by this server (--tls off)");
    if (c->tls)
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "TLS is already on");
    if (len)
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "STARTTLS takes no data");
    if (c->in_off != c->in_len) {
        /* the client may only start TLS after the ACK: these bytes are neither */
        kvlog(KVLOG_VERBOSE, "NBD client %s: bytes after STARTTLS before its reply: closing", c->addr);
        NBD_ST(c->t, protocol_errors, 1);
        conn_close(c);
        return;
    }
    if (!(c->tls = tls_conn_new(s->tls, c->fd))) {
        kvlog(KVLOG_WARNING, "NBD client %s: out of memory for TLS: closing", c->addr);
        conn_close(c);
        return;
    }
    c->structured = 0; /* the protocol: what was agreed before TLS does not count */
    opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
}

/* One option whose data (len bytes at p) is all in. */
static void option(struct nbd_conn *c, uint32_t opt, const uint8_t *p, uint32_t len)
{
    struct nbd_server *s = c->t->s;
    if (s->tls_mode == NBD_TLS_REQUIRE && !c->tls && opt != NBD_OPT_STARTTLS && opt != NBD_OPT_ABORT) {
        /* FORCEDTLS: nothing about the export before TLS, and no transmission */
        NBD_ST(c->t, protocol_errors, 1);
        if (opt == NBD_OPT_EXPORT_NAME) { /* no error reply exists for it: the protocol says close */
            kvlog(KVLOG_VERBOSE, "NBD client %s: EXPORT_NAME before TLS (--tls require): closing", c->addr);
            conn_close(c);
            return;
        }
        return opt_error(c, opt, NBD_REP_ERR_TLS_REQD, "TLS is required: NBD_OPT_STARTTLS first (an nbds:// URL)");
    }
    switch (opt) {
    case NBD_OPT_EXPORT_NAME: {
        if (!name_ok(s, (const char *)p, len)) { /* this option has no error reply: the protocol says close */
            kvlog_rated(&hs_rate, KVLOG_WARNING, "NBD client %s: unknown export requested: closing", c->addr);
            conn_close(c);
            return;
        }
        uint8_t b[134];
        size_t n = nbd_enc_export_name_reply(b, s->size, tx_flags(c), c->no_zeroes);
        if (kvbuf_append(&c->hs, b, n) < 0)
            conn_close(c);
        c->phase = PH_TX;
        hs_leave(c);
        return;
    }
    case NBD_OPT_ABORT:
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        c->phase = PH_CLOSING;
        return;
    case NBD_OPT_LIST: {
        if (len)
            return opt_error(c, opt, NBD_REP_ERR_INVALID, "LIST takes no data");
        uint8_t b[4 + NBD_MAX_NAME];
        size_t n = strnlen(s->export_name, NBD_MAX_NAME);
        nbd_put32(b, (uint32_t)n);
        memcpy(b + 4, s->export_name, n);
        opt_reply(c, opt, NBD_REP_SERVER, b, (uint32_t)(4 + n));
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        return;
    }
    case NBD_OPT_STARTTLS:
        return opt_starttls(c, opt, len);
    case NBD_OPT_INFO:
    case NBD_OPT_GO:
        return opt_go(c, opt, p, len);
    case NBD_OPT_STRUCTURED_REPLY:
        if (len)
            return opt_error(c, opt, NBD_REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
        c->structured = 1;
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        return;
    default:
        return opt_error(c, opt, NBD_REP_ERR_UNSUP, "option not supported");
    }
}

/* One handshake step from the input: 1 progress, 0 need more bytes. */
static int handshake(struct nbd_conn *c)
{
    const uint8_t *p = c->in + c->in_off;
    size_t avail = c->in_len - c->in_off;
    if (c->phase == PH_FLAGS) {
        uint32_t flags;
        int n = nbd_parse_client_flags(p, avail, &flags);
        if (n <= 0) {
            if (n < 0) {
                kvlog_rated(&hs_rate, KVLOG_WARNING, "NBD client %s: unknown client flags %#x: closing", c->addr,
                            flags);
                NBD_ST(c->t, protocol_errors, 1);
                conn_close(c);
            }
            return 0;
        }
        c->in_off += (size_t)n;
        c->no_zeroes = !!(flags & NBD_FLAG_C_NO_ZEROES);
        c->phase = PH_OPTS;
        return 1;
    }
    if (hs_full(c)) {
        c->paused = 1; /* conn_flush resumes once the client has read its replies */
        return 0;
    }
    struct nbd_opt_hdr h;
    int n = nbd_parse_opt_hdr(p, avail, &h);
    if (n < 0) {
        kvlog_rated(&hs_rate, KVLOG_WARNING, "NBD client %s: bad option magic: closing", c->addr);
        NBD_ST(c->t, protocol_errors, 1);
        conn_close(c);
        return 0;
    }
    if (n == 0)
        return 0;
    if (h.length > NBD_MAX_OPT_LEN) {
        c->in_off += (size_t)n;
        NBD_ST(c->t, protocol_errors, 1);
        if (h.option == NBD_OPT_EXPORT_NAME) { /* no error reply exists for it */
            conn_close(c);
            return 0;
        }
        c->skip = h.length;
        opt_error(c, h.option, NBD_REP_ERR_TOO_BIG, "option data too long");
        return 1;
    }
    if (avail < (size_t)n + h.length)
        return 0;
    c->in_off += (size_t)n + h.length;
    option(c, h.option, p + n, h.length);
    return 1;
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
            if (!handshake(c))
                return;
        } else if (c->phase == PH_TX) {
            if (nbd_req_input(c) < 0)
                conn_close(c);
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
        if (f && c->in_off == c->in_len && f->h.length - c->fill_off >= NBD_IN_CAP / 2) {
            /* a large payload goes straight into its request, not through the input buffer */
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
            conn_close(c);
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                conn_close(c);
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
        conn_close(c);
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
        if (!c->closed && c->paused && c->inflight < NBD_CONN_MAX_INFLIGHT / 2 && !hs_full(c)) {
            c->paused = 0;
            struct nbd_req *tail = c->out_tail;
            process(c); /* the headers already buffered */
            if (!c->closed && !c->paused)
                conn_read(c);
            again = !c->closed && c->out_tail != tail; /* replies queued just now */
        }
        if (!c->closed && c->phase == PH_CLOSING && !c->active && !c->out_head && c->hs_off == c->hs.len)
            conn_close(c);
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
    uint64_t now = mono_ms();
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
            conn_close(c); /* freed at the round's end (conn_close lists it) */
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
    for (int64_t end = (int64_t)mono_ms() + NBD_DRAIN_MS, left;
         s->be->pending(t->be) && (left = end - (int64_t)mono_ms()) > 0;) {
        int n = epoll_wait(t->epfd, ev, NBD_EVENTS, left < 100 ? (int)left : 100);
        for (int i = 0; i < n; i++) {
            struct nbd_watch *w = ev[i].data.ptr;
            if (w->kind == NBD_WATCH_WAKE) {
                uint64_t v;
                (void)!read(t->evfd, &v, sizeof v); /* lock grants: round_end runs them */
            } else if (w->kind == NBD_WATCH_CONN) {
                struct nbd_conn *c = w->ctx;
                if (!c->closed && (ev[i].events & (EPOLLHUP | EPOLLERR)))
                    conn_close(c);
                else if (!c->closed && (ev[i].events & (EPOLLOUT | EPOLLIN)))
                    nbd_conn_want_write(c);
            } else if (w->kind != NBD_WATCH_LISTEN) {
                s->be->on_event(w->ctx, w, ev[i].events);
            }
        }
        round_end(t);
    }
}

void *nbd_thread_main(void *arg)
{
    struct nbd_thread *t = arg;
    struct nbd_server *s = t->s;
    struct epoll_event ev[NBD_EVENTS];
    while (!atomic_load_explicit(&s->stop, memory_order_acquire)) {
        int n = epoll_wait(t->epfd, ev, NBD_EVENTS, t->hs_conns ? 1000 : -1);
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
                    conn_close(c);
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
        conn_close(c);
        conn_free(c);
    }
    t->out_list = NULL;
}
