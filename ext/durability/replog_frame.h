/* replog_frame.h - what both sides of log replication share (replog_send.c,
 * replog_recv.c, replog_fetch.c): the frame format (ext/durability/REPLICATION.md),
 * blocking-with-deadline socket helpers and the record helpers. Internal: the
 * public interface is replog.h. Frames come from the network (untrusted):
 * rl_recv_frame checks magic, type, length and CRC32C before a payload is used. */
#ifndef KV_REPLOG_FRAME_H
#define KV_REPLOG_FRAME_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/kvbuf.h"
#include "durability/wal.h"

#define RL_MAGIC 0x5052564bu /* "KVRP" */
#define RL_VERSION 1
#define HDR 32
#define MAX_FRAME (1u << 30)
#define SEG_LIMIT (64u << 20)
#define MAX_PEERS 16
#define MAX_BATCH_BYTES (16u << 20) /* a BATCH frame stops gathering records past this */

enum { F_HELLO = 1, F_HELLO_ACK, F_BATCH, F_ACK, F_FETCH, F_FILE, F_END, F_ERROR };

struct frame {
    uint32_t type, len;
    uint64_t a, b;
};

static inline uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Wait until fd is ready for ev or the timeout (microseconds: the ship interval
 * is 100 us). Returns 1 ready, 0 timeout, -errno. */
int rl_wait_fd_us(int fd, short ev, uint64_t timeout_us);
static inline int wait_fd(int fd, short ev, int timeout_ms) { return rl_wait_fd_us(fd, ev, (uint64_t)timeout_ms * 1000); }

/* Send one frame (header and payload) within timeout_ms. Returns 0 or -errno. */
int rl_send_frame(int fd, uint32_t type, uint64_t a, uint64_t b, const void *payload, size_t len,
               int timeout_ms);
/* Read one frame; the payload replaces pl's contents. Returns 0 or -errno
 * (-EPROTO: not a frame of ours or too long, -EBADMSG: CRC mismatch). */
int rl_recv_frame(int fd, struct frame *f, struct kvbuf *pl, int timeout_ms);
/* Connect to host:port (IPv4) within timeout_ms, TCP_NODELAY, non-blocking.
 * Returns the fd or -errno (why in err). */
int rl_connect_to(const char *host, int port, int timeout_ms, char *err, size_t errlen);

/* Length of the record at p if it is intact and fits in n bytes, else 0. */
static inline size_t rec_len(const unsigned char *p, size_t n)
{
    size_t l = wal_rec_len(p, n);
    return l <= n ? l : 0;
}

static inline uint64_t rec_lsn(const unsigned char *p, size_t l) { return wal_rec_lsn(p, l); }

#endif
