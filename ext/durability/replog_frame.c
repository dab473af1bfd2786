/* replog_frame.c - the frames of log replication and the socket helpers both
 * sides use: sends and receives with a deadline (non-blocking sockets, ppoll),
 * connect with a timeout. Stateless; any thread, on its own socket. Frames are
 * untrusted: magic, type, length (<= MAX_FRAME, per type) and CRC32C are checked
 * before a payload is used. */
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
#include "durability/replog_frame.h"

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

/* Send all n bytes by the absolute deadline (ms, CLOCK_MONOTONIC): a peer that
 * reads one byte a second must not keep a frame going for ever. */
static int send_all(int fd, const void *buf, size_t n, uint64_t deadline)
{
    const char *p = buf;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN)
            return -errno;
        uint64_t now = now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        int r = wait_fd(fd, POLLOUT, (int)(deadline - now));
        if (r <= 0)
            return r ? r : -ETIMEDOUT;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n, int timeout_ms)
{
    char *p = buf;
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return -errno;
        int w = wait_fd(fd, POLLIN, timeout_ms);
        if (w <= 0)
            return w ? w : -ETIMEDOUT;
    }
    return 0;
}

int rl_send_frame(int fd, uint32_t type, uint64_t a, uint64_t b, const void *payload, size_t len,
               int timeout_ms)
{
    unsigned char h[HDR];
    put32(h, RL_MAGIC);
    put32(h + 4, type);
    put32(h + 8, (uint32_t)len);
    put32(h + 12, len ? crc32c(0, payload, len) : 0);
    put64(h + 16, a);
    put64(h + 24, b);
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms; /* for the whole frame */
    int rc = send_all(fd, h, HDR, deadline);
    if (!rc && len)
        rc = send_all(fd, payload, len, deadline);
    return rc;
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
    case F_BATCH:
        return MAX_FRAME; /* a batch stops at MAX_BATCH_BYTES, but one record may be 1 GiB */
    case F_ERROR:
        return 4096;
    default: /* F_FILE: a whole segment, only ever read by a recovering node */
        return MAX_FRAME;
    }
}

/* Read one frame; the payload replaces pl's contents. */
int rl_recv_frame(int fd, struct frame *f, struct kvbuf *pl, int timeout_ms)
{
    unsigned char h[HDR];
    int rc = recv_all(fd, h, HDR, timeout_ms);
    if (rc)
        return rc;
    f->type = get32(h + 4);
    f->len = get32(h + 8);
    f->a = get64(h + 16);
    f->b = get64(h + 24);
    if (get32(h) != RL_MAGIC || f->type < F_HELLO || f->type > F_ERROR || f->len > max_len(f->type))
        return -EPROTO;
    pl->len = 0;
    if (f->len) {
        if (kvbuf_reserve(pl, f->len))
            return -ENOMEM;
        if ((rc = recv_all(fd, pl->p, f->len, timeout_ms)))
            return rc;
        pl->len = f->len;
        if (crc32c(0, pl->p, f->len) != get32(h + 12))
            return -EBADMSG;
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
