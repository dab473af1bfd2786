/* nbd_netkv.c - the network backends' client (see nbd_netkv.h): one context per
 * NBD thread, `conns` connections to one KV server; a block's operations always go
 * to connection block % conns, so one thread's operations of a block stay in order.
 *
 * Requests are encoded at flush into one output buffer per connection (headers
 * copied, a PUT's block pointed at) and sent with writev, as many requests per call
 * as the iovec limit allows; replies come back in request order (RESP and meta
 * commands are both in-order protocols) and are matched against the in-flight
 * FIFO (intrusive, through op->next: no allocation per operation). A reply line is
 * bounded (NK_MAX_LINE), a payload goes straight into the GET's block (read()
 * into it when the input buffer is empty) or is skipped. A lost connection fails
 * its operations with -EIO and is reconnected in the background with backoff
 * (10 ms doubling to 1 s, a timerfd); operations submitted while it is down fail
 * at once. Completions that do not come from a reply (SYNC, failures) go through a
 * ready list and the context's eventfd, so done is never called inside submit.
 * Runs on the owning NBD thread only; open/close on the control thread.
 */
#include "frontend/nbd_netkv_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"

static struct kvlog_rate nk_rate = KVLOG_RATE_INIT(20);

/* ---------------------------------------------------------------- helpers */

uint64_t nk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void list_push(struct nk_list *l, struct nbd_kvop *op)
{
    op->next = NULL;
    if (l->tail)
        l->tail->next = op;
    else
        l->head = op;
    l->tail = op;
}

static struct nbd_kvop *list_pop(struct nk_list *l)
{
    struct nbd_kvop *op = l->head;
    if (op) {
        l->head = op->next;
        if (!l->head)
            l->tail = NULL;
        op->next = NULL;
    }
    return op;
}

static int is_internal(const struct nbd_kvop *op)
{
    return op->kind >= NK_OP_AUTH;
}

/* key = prefix + block in decimal; no snprintf on the hot path */
static int make_key(const struct nk_ctx *x, uint64_t block, char *dst)
{
    memcpy(dst, x->prefix, x->prefix_len);
    return (int)(nk_put_num(dst + x->prefix_len, block) - dst);
}

/* Make the thread's loop call on_event for the ready list. Inside on_event no
 * write is needed (it drains the list before it returns): in_event stands for
 * the signal there, so a SYNC submitted from a completion costs no system call. */
static void kick(struct nk_ctx *x)
{
    if (x->kicked || x->in_event)
        return;
    uint64_t one = 1;
    if (write(x->evfd, &one, sizeof one) == sizeof one)
        x->kicked = 1;
}

/* Complete op later (from on_event), with rc: never inside submit. */
static void complete_later(struct nk_ctx *x, struct nbd_kvop *op, int rc)
{
    op->rc = rc;
    list_push(&x->ready, op);
    kick(x);
}

static void complete_now(struct nk_ctx *x, struct nbd_kvop *op)
{
    x->pending--;
    if (op->rc < 0)
        x->st.errors++;
    op->done(op);
}

static void drain_ready(struct nk_ctx *x)
{
    struct nbd_kvop *op;
    while ((op = list_pop(&x->ready)))
        complete_now(x, op);
}

void nk_set_interest(struct nk_conn *c, uint32_t ev)
{
    if (c->fd < 0 || c->events == ev || c->ctx->epfd < 0)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = &c->w};
    if (epoll_ctl(c->ctx->epfd, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &e) == 0)
        c->events = ev;
}

void nk_conn_note(struct nk_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note, sizeof c->note, fmt, ap);
    va_end(ap);
}

const struct nk_url *nk_conn_url(const struct nk_conn *c) { return &c->ctx->url; }
uint32_t nk_conn_block_size(const struct nk_conn *c) { return c->ctx->block_size; }

/* ---------------------------------------------------------------- output */

static void arm_timer(struct nk_ctx *x);

static void *grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(p, n * elem);
    if (!q)
        abort(); /* a few KiB of headers: out of memory here is not recoverable */
    *cap = n;
    return q;
}

static void add_seg(struct nk_conn *c, const char *ref, size_t off, size_t len)
{
    struct nk_seg *last = c->nseg > c->seg_pos ? &c->segs[c->nseg - 1] : NULL;
    if (!ref && last && !last->ref && last->off + last->len == off &&
        !(c->nseg - 1 == c->seg_pos && c->seg_off)) {
        last->len += len; /* adjacent header bytes: one iovec */
        last->reqs += (uint32_t)c->req_start;
    } else {
        c->segs = grow(c->segs, &c->seg_cap, c->nseg + 1, sizeof *c->segs);
        c->segs[c->nseg++] = (struct nk_seg){ref, off, len, (uint32_t)c->req_start};
    }
    c->req_start = 0;
}

void nk_out_copy(struct nk_conn *c, const void *p, size_t n)
{
    c->out = grow(c->out, &c->out_cap, c->out_len + n, 1);
    memcpy(c->out + c->out_len, p, n);
    add_seg(c, NULL, c->out_len, n);
    c->out_len += n;
}

void nk_out_ref(struct nk_conn *c, const void *p, size_t n)
{
    add_seg(c, p, 0, n);
}

void nk_out_block(struct nk_conn *c, const char *hdr, size_t n, const char *block)
{
    nk_out_copy(c, hdr, n);
    nk_out_ref(c, block, c->ctx->block_size);
    nk_out_copy(c, "\r\n", 2);
}

/* Encode c's send queue into its output; the ops move to the in-flight FIFO. */
static void encode_queue(struct nk_conn *c)
{
    struct nk_ctx *x = c->ctx;
    struct nbd_kvop *op;
    char key[NK_KEY_MAX + 24];
    if (!c->inflight.head && c->sendq.head) {
        c->stall_since_ms = nk_now_ms(); /* idle until now: replies are awaited from here */
        c->seen_replies = c->replies;
    }
    while ((op = list_pop(&c->sendq))) {
        c->req_start = 1;
        int klen = 0;
        if (op->kind == NK_OP_META_GET || op->kind == NK_OP_META_SET) {
            memcpy(key, x->prefix, x->prefix_len);
            memcpy(key + x->prefix_len, NBD_META_SUFFIX, sizeof NBD_META_SUFFIX - 1);
            klen = (int)(x->prefix_len + sizeof NBD_META_SUFFIX - 1);
        } else if (!is_internal(op))
            klen = make_key(x, op->block, key);
        x->proto->encode(c, op, key, klen);
        list_push(&c->inflight, op);
    }
}

/* Send what the output holds: 0 when all is sent or the socket is full (EPOLLOUT
 * then asked for), -errno on a failed write. */
int nk_write_out(struct nk_conn *c)
{
    struct nk_ctx *x = c->ctx;
    struct iovec iov[NK_IOV];
    while (c->seg_pos < c->nseg) {
        int n = 0;
        uint64_t reqs = 0;
        for (size_t i = c->seg_pos; i < c->nseg && n < NK_IOV; i++, n++) {
            const struct nk_seg *s = &c->segs[i];
            const char *base = s->ref ? s->ref : c->out + s->off;
            size_t skip = i == c->seg_pos ? c->seg_off : 0;
            iov[n] = (struct iovec){(void *)(base + skip), s->len - skip};
            if (!skip)
                reqs += s->reqs;
        }
        /* sendmsg for MSG_NOSIGNAL: a KV server gone mid-write is EPIPE (the ops fail
         * with -EIO and the context reconnects), not a SIGPIPE that kills an embedder
         * of nbd_create that did not ignore it */
        ssize_t w = sendmsg(c->fd, &(struct msghdr){.msg_iov = iov, .msg_iovlen = (size_t)n}, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                nk_set_interest(c, EPOLLIN | EPOLLOUT);
                return 0;
            }
            return -errno;
        }
        x->cn.writev_calls++;
        x->cn.requests_sent += reqs;
        if (reqs > x->cn.max_requests_per_writev)
            x->cn.max_requests_per_writev = reqs;
        size_t left = (size_t)w;
        while (left && c->seg_pos < c->nseg) {
            struct nk_seg *s = &c->segs[c->seg_pos];
            size_t rest = s->len - c->seg_off;
            if (left >= rest) {
                left -= rest;
                c->seg_pos++;
                c->seg_off = 0;
            } else {
                c->seg_off += left;
                left = 0;
            }
        }
    }
    c->out_len = c->nseg = c->seg_pos = c->seg_off = 0;
    nk_set_interest(c, EPOLLIN);
    return 0;
}

/* Encode and send c's queue (when it is up). A write error marks it broken: it is
 * reset from the event loop, not here (flush may run inside a completion). */
void nk_flush_conn(struct nk_conn *c)
{
    if (c->state != NK_UP || c->broken || (!c->sendq.head && c->seg_pos == c->nseg))
        return;
    encode_queue(c);
    if (!c->ctx->timer_at)
        arm_timer(c->ctx); /* the stall check */
    if (c->events & EPOLLOUT)
        return; /* the socket is full: EPOLLOUT sends the rest */
    int rc = nk_write_out(c);
    if (rc < 0) {
        nk_conn_note(c, "write: %s", strerror(-rc));
        c->broken = 1;
        kick(c->ctx);
    }
}

/* ---------------------------------------------------------------- connections */

/* The timer's next deadline: the earliest reconnect, and while requests are in
 * flight a stall check every NK_STALL_MS / 4. An earlier deadline already armed is
 * kept; timer_at is 0 while disarmed. */
static void arm_timer(struct nk_ctx *x)
{
    uint64_t now = nk_now_ms(), next = 0;
    for (int i = 0; i < x->nconns; i++) {
        const struct nk_conn *c = &x->conns[i];
        uint64_t t = c->state == NK_DOWN         ? c->next_try_ms
                     : c->state == NK_CONNECTING ? c->stall_since_ms + NK_OPEN_TIMEOUT_MS
                     : c->inflight.head          ? now + NK_STALL_MS / 4
                                                 : 0;
        if (t && (!next || t < next))
            next = t;
    }
    if (!next || x->tfd < 0 || (x->timer_at && x->timer_at <= next))
        return;
    uint64_t in = next > now ? next - now : 1;
    struct itimerspec its = {.it_value = {(time_t)(in / 1000), (long)(in % 1000) * 1000000}};
    if (timerfd_settime(x->tfd, 0, &its, NULL) == 0)
        x->timer_at = next;
}

/* Close c and fail everything it owns with -EIO (internal requests are dropped);
 * schedule its reconnect. */
static void conn_reset(struct nk_conn *c, const char *why)
{
    struct nk_ctx *x = c->ctx;
    if (c->fd >= 0) {
        if (c->events && x->epfd >= 0)
            epoll_ctl(x->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    kvlog_rated(&nk_rate, KVLOG_WARNING, "blockdev: backend %s (thread %d, connection %d) lost: %s%s%s", x->name,
                x->thread, c->idx, why, c->note[0] ? ": " : "", c->note);
    c->note[0] = 0;
    c->fd = -1;
    c->events = 0;
    c->state = NK_DOWN;
    c->broken = c->fail_rc = 0;
    struct nbd_kvop *op;
    while ((op = list_pop(&c->inflight)))
        if (!is_internal(op))
            complete_later(x, op, -EIO);
    while ((op = list_pop(&c->sendq)))
        if (!is_internal(op))
            complete_later(x, op, -EIO);
    c->out_len = c->nseg = c->seg_pos = c->seg_off = 0;
    c->in_pos = c->in_len = 0;
    c->rstate = NK_R_LINE;
    c->next_try_ms = nk_now_ms() + c->backoff_ms;
    c->backoff_ms = c->backoff_ms * 2 > NK_BACKOFF_MAX_MS ? NK_BACKOFF_MAX_MS : c->backoff_ms * 2;
    arm_timer(x);
}

/* Start a non-blocking connect: 0 (c is CONNECTING or UP), or -errno. */
int nk_conn_start(struct nk_conn *c)
{
    struct nk_ctx *x = c->ctx;
    int fd = socket(x->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->events = 0;
    c->stall_since_ms = nk_now_ms(); /* a connect that hangs is given up (timer_event) */
    if (connect(fd, (struct sockaddr *)&x->addr, x->addrlen) == 0) {
        c->state = NK_UP;
    } else if (errno == EINPROGRESS) {
        c->state = NK_CONNECTING;
    } else {
        int e = -errno;
        close(fd);
        c->fd = -1;
        return e;
    }
    return 0;
}

void nk_queue_internal(struct nk_conn *c, int kind)
{
    struct nbd_kvop *op = &c->iops[kind - NK_OP_AUTH];
    *op = (struct nbd_kvop){.kind = kind};
    list_push(&c->sendq, op);
}

/* c's connect finished: its greeting goes first, before what queued meanwhile. */
void nk_conn_up(struct nk_conn *c)
{
    struct nk_list waiting = c->sendq;
    c->sendq = (struct nk_list){0};
    c->state = NK_UP;
    c->ctx->proto->greet(c);
    if (waiting.head) {
        if (c->sendq.tail)
            c->sendq.tail->next = waiting.head;
        else
            c->sendq.head = waiting.head;
        c->sendq.tail = waiting.tail;
    }
    if (c->up_once)
        c->ctx->st.reconnects++;
    c->up_once = 1;
}

/* ---------------------------------------------------------------- input */

/* The oldest request in flight got its whole reply. 1 when parsing must stop
 * (c was broken by what the completion did, or an internal request failed). */
static int reply_done(struct nk_conn *c)
{
    struct nk_ctx *x = c->ctx;
    struct nbd_kvop *op = list_pop(&c->inflight);
    x->cn.replies++;
    c->replies++;
    if (is_internal(op)) {
        if (op->rc < 0) {
            c->fail_rc = op->kind == NK_OP_AUTH ? -EACCES : op->rc;
            c->broken = 1;
            return 1;
        }
        return 0;
    }
    if (op->rc == 0)
        c->backoff_ms = NK_BACKOFF_MIN_MS;
    else
        kvlog_rated(&nk_rate, KVLOG_WARNING, "blockdev: backend %s: block %llu: %s", x->name,
                    (unsigned long long)op->block, c->note[0] ? c->note : strerror(-op->rc));
    c->note[0] = 0;
    complete_now(x, op);
    return c->broken;
}

/* Parse what the input buffer holds: 0 (more input needed or parsing stopped by
 * broken), or -EPROTO with c->note saying why. */
static int parse(struct nk_conn *c)
{
    struct nk_ctx *x = c->ctx;
    while (!c->broken) {
        size_t avail = c->in_len - c->in_pos;
        char *p = c->in + c->in_pos;
        if (c->rstate == NK_R_LINE) {
            char *nl = memchr(p, '\n', avail);
            if (!nl) {
                if (avail > NK_MAX_LINE) {
                    nk_conn_note(c, "reply line longer than %d bytes", NK_MAX_LINE);
                    return -EPROTO;
                }
                return 0;
            }
            size_t len = (size_t)(nl - p);
            if (!len || p[len - 1] != '\r' || len > NK_MAX_LINE) {
                nk_conn_note(c, "malformed reply line");
                return -EPROTO;
            }
            struct nbd_kvop *op = c->inflight.head;
            if (!op) {
                nk_conn_note(c, "a reply to no request");
                return -EPROTO;
            }
            p[len - 1] = 0;
            c->in_pos += len + 1;
            op->rc = 0;
            int r = x->proto->line(c, op, p, len - 1);
            if (r == NK_LINE_BAD) {
                if (!c->note[0])
                    nk_conn_note(c, "unexpected reply \"%.64s\"", p);
                return -EPROTO;
            }
            if (r == NK_LINE_DONE) {
                if (reply_done(c))
                    return 0;
                continue;
            }
            c->pay_len = c->pay_left = (size_t)r;
            c->pay_dst = NULL;
            if (op->kind == NBD_KV_GET && op->rc == 0) {
                if ((size_t)r == x->block_size)
                    c->pay_dst = op->buf;
                else {
                    op->rc = -EIO;
                    kvlog_rated(&nk_rate, KVLOG_WARNING,
                                "blockdev: backend %s: block %llu has %d bytes, not %u: read fails with EIO",
                                x->name, (unsigned long long)op->block, r, x->block_size);
                }
            } else if (is_internal(op) && x->scratch && (size_t)r < NK_SCRATCH) {
                c->pay_dst = x->scratch;
                x->scratch[r] = 0;
            } else if (is_internal(op)) {
                op->rc = -EIO;
                nk_conn_note(c, "reply of %d bytes is too long", r);
            }
            c->rstate = r ? NK_R_PAYLOAD : NK_R_TRAIL;
            c->trail = 0;
        } else if (c->rstate == NK_R_PAYLOAD) {
            if (!avail)
                return 0;
            size_t k = avail < c->pay_left ? avail : c->pay_left;
            if (c->pay_dst) {
                memcpy(c->pay_dst, p, k);
                c->pay_dst += k;
            }
            c->pay_left -= k;
            c->in_pos += k;
            if (!c->pay_left)
                c->rstate = NK_R_TRAIL;
        } else {
            for (; c->trail < 2 && c->in_pos < c->in_len; c->trail++, c->in_pos++)
                if (c->in[c->in_pos] != "\r\n"[c->trail]) {
                    nk_conn_note(c, "payload not followed by CRLF");
                    return -EPROTO;
                }
            if (c->trail < 2)
                return 0;
            c->rstate = NK_R_LINE;
            if (reply_done(c))
                return 0;
        }
    }
    return 0;
}

/* Read and parse what c's socket has: 0, or -errno (-ECONNRESET at EOF). */
int nk_read_in(struct nk_conn *c)
{
    struct nk_ctx *x = c->ctx;
    for (;;) {
        ssize_t n;
        size_t want;
        if (c->rstate == NK_R_PAYLOAD && c->pay_dst && c->in_pos == c->in_len && c->pay_left >= 512) {
            /* the block straight from the socket; what follows it into the buffer */
            c->in_pos = c->in_len = 0;
            struct iovec iov[2] = {{c->pay_dst, c->pay_left}, {c->in, NK_INBUF}};
            want = c->pay_left + NK_INBUF;
            n = readv(c->fd, iov, 2);
            if (n > 0) {
                size_t direct = (size_t)n < c->pay_left ? (size_t)n : c->pay_left;
                c->pay_dst += direct;
                c->pay_left -= direct;
                x->cn.zero_copy_bytes += direct;
                c->in_len = (size_t)n - direct;
                if (!c->pay_left)
                    c->rstate = NK_R_TRAIL;
            }
        } else {
            if (c->in_pos) {
                memmove(c->in, c->in + c->in_pos, c->in_len - c->in_pos);
                c->in_len -= c->in_pos;
                c->in_pos = 0;
            }
            want = NK_INBUF - c->in_len;
            n = read(c->fd, c->in + c->in_len, want);
            if (n > 0)
                c->in_len += (size_t)n;
        }
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
        }
        x->cn.reads++;
        int rc = parse(c);
        if (rc < 0)
            return rc;
        if (c->broken || c->state != NK_UP || (size_t)n < want)
            return 0; /* level-triggered: epoll says when there is more */
    }
}

/* ---------------------------------------------------------------- events */

static void conn_event(struct nk_conn *c, uint32_t events)
{
    if (c->state == NK_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err) {
            conn_reset(c, strerror(err));
            return;
        }
        nk_conn_up(c);
        nk_set_interest(c, EPOLLIN);
        nk_flush_conn(c);
        return;
    }
    if (c->state != NK_UP)
        return;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
        int rc = nk_read_in(c);
        if (rc < 0) {
            conn_reset(c, rc == -ECONNRESET ? "connection closed by the server" : strerror(-rc));
            return;
        }
    }
    if (!c->broken && (events & EPOLLOUT) && c->state == NK_UP) {
        int rc = nk_write_out(c);
        if (rc < 0) {
            conn_reset(c, strerror(-rc));
            return;
        }
        nk_flush_conn(c); /* what was submitted while the socket was full */
    }
    if (c->broken)
        conn_reset(c, "failed");
}

static void timer_event(struct nk_ctx *x)
{
    uint64_t ticks;
    if (read(x->tfd, &ticks, sizeof ticks) < 0) {
        /* spurious: nothing to do */
    }
    uint64_t now = nk_now_ms();
    x->timer_at = 0;
    for (int i = 0; i < x->nconns; i++) {
        struct nk_conn *c = &x->conns[i];
        if (c->state == NK_CONNECTING && now - c->stall_since_ms >= NK_OPEN_TIMEOUT_MS) {
            nk_conn_note(c, "no answer within %d ms", NK_OPEN_TIMEOUT_MS);
            conn_reset(c, "connect timed out");
        }
        if (c->state == NK_UP && c->inflight.head) {
            /* a server that stopped answering (hung, or a network that drops
               everything) must not hold the device's I/O forever */
            if (c->replies != c->seen_replies) {
                c->seen_replies = c->replies;
                c->stall_since_ms = now;
            } else if (now - c->stall_since_ms >= NK_STALL_MS) {
                nk_conn_note(c, "%llu requests unanswered for %d ms", (unsigned long long)x->pending, NK_STALL_MS);
                conn_reset(c, "the server stopped answering");
            }
        }
        if (c->state != NK_DOWN || c->next_try_ms > now)
            continue;
        int rc = nk_conn_start(c);
        if (rc < 0) {
            nk_conn_note(c, "%s", strerror(-rc));
            conn_reset(c, "connect failed");
            continue;
        }
        if (c->state == NK_UP) {
            nk_conn_up(c);
            nk_set_interest(c, EPOLLIN);
            nk_flush_conn(c);
        } else {
            nk_set_interest(c, EPOLLOUT);
        }
    }
    arm_timer(x);
}

void nk_on_event(void *ctx, struct nbd_watch *w, uint32_t events)
{
    struct nk_ctx *x = ctx;
    x->in_event = 1;
    if (w == &x->evw) {
        uint64_t v;
        if (read(x->evfd, &v, sizeof v) < 0) {
            /* already drained */
        }
        x->kicked = 0;
        for (int i = 0; i < x->nconns; i++)
            if (x->conns[i].broken)
                conn_reset(&x->conns[i], "failed");
    } else if (w == &x->tw) {
        timer_event(x);
    } else {
        conn_event((struct nk_conn *)w, events);
    }
    drain_ready(x);
    x->in_event = 0;
    for (int i = 0; i < x->nconns; i++)
        if (x->conns[i].broken) /* a write failed in a completion: reset from the next event */
            kick(x);
}

/* ---------------------------------------------------------------- submit */

int nk_submit(void *ctx, struct nbd_kvop *op)
{
    struct nk_ctx *x = ctx;
    if (op->kind == NBD_KV_SYNC) {
        /* kvstore (disk/remote) answers a write once it is durable; Redis and
           memcached cannot make a write durable on request: nothing to wait for */
        x->pending++;
        complete_later(x, op, 0);
        return 0;
    }
    if (op->kind != NBD_KV_GET && op->kind != NBD_KV_PUT && op->kind != NBD_KV_DEL)
        return -EINVAL;
    struct nk_conn *c = &x->conns[op->block % (uint64_t)x->nconns];
    x->pending++;
    if (c->state == NK_DOWN) {
        complete_later(x, op, -EIO);
        return 0;
    }
    list_push(&c->sendq, op);
    return 0;
}

void nk_flush(void *ctx)
{
    struct nk_ctx *x = ctx;
    for (int i = 0; i < x->nconns; i++)
        nk_flush_conn(&x->conns[i]);
}

uint64_t nk_pending(void *ctx)
{
    return ((struct nk_ctx *)ctx)->pending;
}

void nk_add_stats(void *ctx, struct nbd_backend_stats *st)
{
    struct nk_ctx *x = ctx;
    st->errors += x->st.errors;
    st->reconnects += x->st.reconnects;
}

void nk_get_counters(void *ctx, struct nk_counters *out)
{
    *out = ((struct nk_ctx *)ctx)->cn;
}


