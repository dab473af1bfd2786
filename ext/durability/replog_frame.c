/* replog_frame.c - the frames of log replication and the socket helpers both
 * sides use: the link's socket I/O (rl_io_send/rl_io_recv, the only calls that
 * touch a replication socket's bytes: plain TCP, or TLS with --repl-tls, whose
 * decrypted bytes not yet asked for wait in the link's rbuf), sends and receives with a deadline
 * (non-blocking sockets, ppoll), each frame's MAC once the link is
 * authenticated, connect with a timeout. Any thread, on its own link. Frames
 * are untrusted: magic, type, length (<= MAX_FRAME, per type), CRC32C and the
 * MAC are checked before a payload is used. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "durability/wal.h"
#include "durability/replog.h"
#include "durability/replog_frame.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

/* Wait until fd is ready for ev or the timeout (microseconds: the ship interval
 * is 100 us). Returns 1 ready, 0 timeout, -errno. */
int rl_wait_fd_us(int fd, short ev, uint64_t timeout_us)
{
    struct pollfd p = {.fd = fd, .events = ev};
    struct timespec ts = {(time_t)(timeout_us / 1000000), (long)(timeout_us % 1000000) * 1000};
    int r;
    do
        r = ppoll(&p, 1, &ts, NULL);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -errno;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL | POLLHUP)) && !(p.revents & ev))
        return -ECONNRESET;
    return r;
}

void rl_link_close(struct rl_link *l)
{
    tls_conn_free(l->tls); /* close_notify if it can go without blocking */
    l->tls = NULL;
    free(l->rbuf);
    l->rbuf = NULL;
    l->roff = l->rlen = 0;
    l->want = 0;
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    EVP_MAC_CTX_free(l->mac);
    l->mac = NULL;
    OPENSSL_cleanse(l->session, sizeof l->session);
    l->authed = 0;
}

int rl_link_set_session(struct rl_link *l, const unsigned char key[RL_KEY])
{
    EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = m ? EVP_MAC_CTX_new(m) : NULL;
    EVP_MAC_free(m); /* the context keeps its own reference */
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", "SHA256", 0), OSSL_PARAM_construct_end()};
    if (!ctx || !EVP_MAC_init(ctx, key, RL_KEY, params)) {
        EVP_MAC_CTX_free(ctx);
        return -ENOMEM;
    }
    EVP_MAC_CTX_free(l->mac);
    l->mac = ctx;
    memcpy(l->session, key, RL_KEY);
    l->send_seq = l->recv_seq = 0;
    l->authed = 1;
    return 0;
}

/* The MAC of one frame: the direction (who sent it: a frame cannot be reflected
 * back to its sender) and its sequence number are covered but not sent. */
static int frame_mac_v(struct rl_link *l, int from_server, uint64_t seq, const unsigned char *h,
                       const struct iovec *pl, int npl, unsigned char out[RL_MAC])
{
    unsigned char pre[9];
    pre[0] = (unsigned char)from_server;
    put64(pre + 1, seq);
    size_t outl = 0;
    if (!EVP_MAC_init(l->mac, NULL, 0, NULL) || !EVP_MAC_update(l->mac, pre, sizeof pre) ||
        !EVP_MAC_update(l->mac, h, HDR))
        return -EIO;
    for (int i = 0; i < npl; i++)
        if (pl[i].iov_len && !EVP_MAC_update(l->mac, pl[i].iov_base, pl[i].iov_len))
            return -EIO;
    if (!EVP_MAC_final(l->mac, out, &outl, RL_MAC) || outl != RL_MAC)
        return -EIO;
    return 0;
}

static int frame_mac(struct rl_link *l, int from_server, uint64_t seq, const unsigned char *h,
                     const void *payload, size_t len, unsigned char out[RL_MAC])
{
    struct iovec v = {(void *)payload, len};
    return frame_mac_v(l, from_server, seq, h, &v, 1, out);
}

int rl_tls_ctx(struct tls_ctx **out, const struct rl_tls_files *f, int server, char *err, size_t errlen)
{
    *out = NULL;
    if (!f || !f->cert_file || !*f->cert_file)
        return 0;
    /* mutual: the receiver asks for and verifies the sender's certificate, and the
     * connecting side presents one (the same files serve both roles) */
    struct tls_opts o = {.server = server, .cert_file = f->cert_file, .key_file = f->key_file,
                         .ca_file = f->ca_file, .auth = TLS_AUTH_YES};
    char why[256];
    int rc = tls_ctx_new(out, &o, why, sizeof why);
    if (rc)
        snprintf(err, errlen, "--repl-tls: %s", why);
    return rc;
}

int rl_link_use_tls(struct rl_link *l, struct tls_ctx *ctx)
{
    l->tls = tls_conn_new(ctx, l->fd);
    return l->tls ? 0 : -ENOMEM;
}

int rl_link_tls_client(struct rl_link *l, struct tls_ctx *ctx, int timeout_ms, char *err, size_t errlen)
{
    int rc = rl_link_use_tls(l, ctx);
    if (!rc)
        rc = tls_handshake_wait(l->tls, timeout_ms);
    if (rc)
        snprintf(err, errlen, "TLS handshake failed (--repl-tls): %s",
                 l->tls && *tls_conn_error(l->tls) ? tls_conn_error(l->tls) : strerror(-rc));
    return rc;
}

int rl_link_wait(struct rl_link *l, short ev, uint64_t timeout_us)
{
    if (ev == POLLIN && rl_link_pending(l))
        return 1; /* already read from the socket: a poll would not see it */
    return rl_wait_fd_us(l->fd, l->want ? l->want : ev, timeout_us);
}

/* A TLS call's "not now" as the link's: -EAGAIN, with the event it waits for. */
static long tls_again(struct rl_link *l, long r)
{
    if (r == -EAGAIN || r == TLS_WANT_WRITE) {
        l->want = r == TLS_WANT_WRITE ? POLLOUT : POLLIN;
        return -EAGAIN;
    }
    return r;
}

long rl_io_send(struct rl_link *l, const void *buf, size_t n, int more)
{
    l->want = 0;
    if (l->tls)
        return tls_again(l, (long)tls_write(l->tls, buf, n));
    ssize_t w;
    do
        w = send(l->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
    while (w < 0 && errno == EINTR);
    if (w < 0 && errno == EAGAIN)
        l->want = POLLOUT;
    return w < 0 ? -errno : (long)w;
}

long rl_io_sendv(struct rl_link *l, const struct iovec *iov, int n)
{
    l->want = 0;
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    ssize_t w;
    do
        w = sendmsg(l->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    if (w < 0 && errno == EAGAIN)
        l->want = POLLOUT;
    return w < 0 ? -errno : (long)w;
}

/* TLS: a read takes a whole record from OpenSSL (n >= TLS_RECORD_MAX leaves
 * nothing decrypted inside it), so every byte read but not yet taken is in rbuf,
 * where rl_link_pending sees it; a large read goes straight to the caller. */
static long tls_recv(struct rl_link *l, void *buf, size_t n)
{
    if (!rl_link_pending(l)) {
        if (n >= TLS_RECORD_MAX)
            return tls_again(l, (long)tls_read(l->tls, buf, n));
        if (!l->rbuf && !(l->rbuf = malloc(TLS_RECORD_MAX)))
            return -ENOMEM;
        long r = tls_again(l, (long)tls_read(l->tls, l->rbuf, TLS_RECORD_MAX));
        if (r <= 0)
            return r;
        l->roff = 0;
        l->rlen = (size_t)r;
    }
    size_t k = rl_link_pending(l) < n ? rl_link_pending(l) : n;
    memcpy(buf, l->rbuf + l->roff, k);
    l->roff += k;
    return (long)k;
}

long rl_io_recv(struct rl_link *l, void *buf, size_t n)
{
    l->want = 0;
    if (l->tls)
        return tls_recv(l, buf, n);
    ssize_t r;
    do
        r = recv(l->fd, buf, n, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    if (r < 0 && errno == EAGAIN)
        l->want = POLLIN;
    return r < 0 ? -errno : (long)r;
}

/* Send iov[0..n) whole by the absolute deadline (ms, CLOCK_MONOTONIC): a peer
 * that reads one byte a second must not keep a frame going for ever. Plain TCP
 * gathers the parts into one sendmsg; TLS writes them one by one (each its own
 * record). iov is consumed as it is sent. */
static int send_all(struct rl_link *l, struct iovec *iov, int n, uint64_t deadline)
{
    while (n) {
        if (!iov->iov_len) { /* a part sent whole, or empty */
            iov++;
            n--;
            continue;
        }
        long w = l->tls ? rl_io_send(l, iov->iov_base, iov->iov_len, 0) : rl_io_sendv(l, iov, n);
        if (w > 0) {
            size_t k = (size_t)w;
            while (k >= iov->iov_len) { /* w <= the bytes left: stops inside the list */
                k -= iov->iov_len;
                iov++;
                n--;
                if (!n)
                    return 0;
            }
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= k;
            continue;
        }
        if (w != -EAGAIN)
            return w ? (int)w : -EIO;
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        int r = rl_link_wait(l, POLLOUT, (deadline - now) * 1000);
        if (r <= 0)
            return r ? r : -ETIMEDOUT;
    }
    return 0;
}

static int recv_all(struct rl_link *l, void *buf, size_t n, int timeout_ms)
{
    char *p = buf;
    while (n) {
        long r = rl_io_recv(l, p, n);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return -ECONNRESET;
        if (r != -EAGAIN)
            return (int)r;
        int w = rl_link_wait(l, POLLIN, (uint64_t)timeout_ms * 1000);
        if (w <= 0)
            return w ? w : -ETIMEDOUT;
    }
    return 0;
}

#define SMALL_FRAME 4096 /* TLS: a frame up to this size is sent as one record */

int rl_send_framev(struct rl_link *l, uint32_t type, uint64_t a, uint64_t b, const struct iovec *pl, int npl,
                   int timeout_ms)
{
    if (npl < 0 || npl > RL_FRAME_IOV)
        return -E2BIG;
    unsigned char h[HDR], mac[RL_MAC];
    size_t len = 0;
    uint32_t crc = 0;
    for (int i = 0; i < npl; i++) {
        len += pl[i].iov_len;
        if (pl[i].iov_len)
            crc = crc32c(crc, pl[i].iov_base, pl[i].iov_len);
    }
    put32(h, RL_MAGIC);
    put32(h + 4, type);
    put32(h + 8, (uint32_t)len);
    put32(h + 12, len ? crc : 0);
    put64(h + 16, a);
    put64(h + 24, b);
    if (l->authed && frame_mac_v(l, l->server, l->send_seq, h, pl, npl, mac))
        return -EIO;
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms; /* for the whole frame */
    if (l->tls && HDR + len + RL_MAC <= SMALL_FRAME) {
        /* one TLS record (one write, one MAC check at the peer), not three */
        unsigned char one[SMALL_FRAME];
        size_t off = HDR;
        memcpy(one, h, HDR);
        for (int i = 0; i < npl; i++) {
            if (pl[i].iov_len)
                memcpy(one + off, pl[i].iov_base, pl[i].iov_len);
            off += pl[i].iov_len;
        }
        if (l->authed)
            memcpy(one + off, mac, RL_MAC);
        struct iovec v = {one, HDR + len + (l->authed ? RL_MAC : 0)};
        int rc = send_all(l, &v, 1, deadline);
        l->send_seq += l->authed && !rc;
        return rc;
    }
    /* Header, payload parts and MAC: on plain TCP in one sendmsg (a batch is one
     * system call), the payload sent from the caller's memory as it is. */
    struct iovec iov[RL_FRAME_IOV + 2];
    iov[0] = (struct iovec){h, HDR};
    for (int i = 0; i < npl; i++)
        iov[1 + i] = pl[i];
    iov[1 + npl] = (struct iovec){mac, l->authed ? RL_MAC : 0};
    int rc = send_all(l, iov, npl + 2, deadline);
    l->send_seq += l->authed && !rc;
    return rc;
}

int rl_send_frame(struct rl_link *l, uint32_t type, uint64_t a, uint64_t b, const void *payload, size_t len,
                  int timeout_ms)
{
    struct iovec v = {(void *)payload, len};
    return rl_send_framev(l, type, a, b, &v, 1, timeout_ms);
}

void rl_send_error(struct rl_link *l, const char *msg)
{
    if (l->tls && !tls_conn_ready(l->tls))
        return; /* no TLS session to say it in (and a write would wait on the stranger's handshake) */
    size_t n = strlen(msg);
    rl_send_frame(l, F_ERROR, 0, 0, msg, n < 4096 ? n : 4096, 1000);
}

/* The largest payload each frame type may carry: checked before any allocation. */
static uint32_t max_len(uint32_t type)
{
    switch (type) {
    case F_HELLO:
    case F_FETCH:
    case F_END:
        return 16;
    case F_HELLO_ACK:
    case F_ACK:
        return 0;
    case F_AUTH_HELLO:
        return 16 + RL_NONCE;
    case F_AUTH_CHALLENGE:
        return RL_NONCE;
    case F_AUTH_PROOF:
        return RL_MAC;
    case F_BATCH:
        return MAX_FRAME; /* a batch stops at MAX_BATCH_BYTES, but one record may be 1 GiB */
    case F_ERROR:
        return 4096;
    default: /* F_FILE: a whole segment, only ever read by a recovering node */
        return MAX_FRAME;
    }
}

int rl_parse_header(const unsigned char *h, struct frame *f)
{
    f->type = get32(h + 4);
    f->len = get32(h + 8);
    f->a = get64(h + 16);
    f->b = get64(h + 24);
    if (get32(h) != RL_MAGIC || f->type < F_HELLO || f->type > F_LAST || f->len > max_len(f->type))
        return -EPROTO;
    return 0;
}

/* Read one frame; the payload replaces pl's contents. Before the handshake is
 * done only its own frames (and ERROR) are read: no payload of a data frame is
 * allocated for an unauthenticated peer. */
int rl_recv_frame(struct rl_link *l, struct frame *f, struct kvbuf *pl, int timeout_ms)
{
    unsigned char h[HDR];
    int rc = recv_all(l, h, HDR, timeout_ms);
    if (rc)
        return rc;
    if ((rc = rl_parse_header(h, f)))
        return rc;
    int handshake = f->type >= F_AUTH_HELLO || f->type == F_ERROR;
    if (l->authed ? f->type >= F_AUTH_HELLO : !handshake)
        return -EPROTO;
    pl->len = 0;
    if (f->len) {
        if (kvbuf_reserve(pl, f->len))
            return -ENOMEM;
        if ((rc = recv_all(l, pl->p, f->len, timeout_ms)))
            return rc;
        pl->len = f->len;
        if (crc32c(0, pl->p, f->len) != get32(h + 12))
            return -EBADMSG;
    }
    if (l->authed) {
        unsigned char got[RL_MAC], want[RL_MAC];
        if ((rc = recv_all(l, got, RL_MAC, timeout_ms)))
            return rc;
        if (frame_mac(l, !l->server, l->recv_seq, h, pl->p, f->len, want))
            return -EIO;
        if (CRYPTO_memcmp(got, want, RL_MAC))
            return -EACCES;
        l->recv_seq++;
    }
    return 0;
}

int rl_connect_to(const char *host, int port, int timeout_ms, char *err, size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "peer address '%s' is not an IPv4 address", host);
        return -EINVAL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS) {
        rc = -errno;
    } else {
        int w = wait_fd(fd, POLLOUT, timeout_ms);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (w <= 0)
            rc = w ? w : -ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr)
            rc = -(soerr ? soerr : errno);
    }
    if (rc) {
        snprintf(err, errlen, "cannot connect to peer %s:%d: %s", host, port, strerror(-rc));
        close(fd);
        return rc;
    }
    return fd;
}
