/* nbd_netkv_int.h - the network backends' client, private: the context and its
 * connections, shared by nbd_netkv.c (I/O, events) and nbd_netkv_open.c (URL,
 * open, close). Owned by one NBD thread (see nbd_netkv.c).
 */
#ifndef KV_NBD_NETKV_INT_H
#define KV_NBD_NETKV_INT_H

#include <netinet/in.h>
#include <sys/socket.h>

#include "frontend/nbd_netkv.h"

#define NK_INBUF (64 * 1024)       /* input buffer per connection */
#define NK_MAX_LINE 1024           /* longest reply line accepted */
#define NK_SCRATCH (64 * 1024)     /* an internal request's payload (INFO) */
#define NK_KEY_MAX 512
#define NK_IOV 1024                /* iovecs per writev (IOV_MAX on Linux) */
#define NK_OPEN_TIMEOUT_MS 5000    /* connect and the first requests at open */
#define NK_BACKOFF_MIN_MS 10
#define NK_BACKOFF_MAX_MS 1000
#define NK_NINTERNAL 6
#ifndef NK_STALL_MS
#define NK_STALL_MS 30000          /* no reply for this long with requests in flight: reset */
#endif

enum { NK_DOWN, NK_CONNECTING, NK_UP };
enum { NK_R_LINE, NK_R_PAYLOAD, NK_R_TRAIL };

struct nk_list {
    struct nbd_kvop *head, *tail;
};

/* A piece of the output: ref (external memory) or, when ref is NULL, out + off. */
struct nk_seg {
    const char *ref;
    size_t off, len;
    uint32_t reqs;            /* requests whose first byte is in this piece */
};

struct nk_ctx;

struct nk_conn {
    struct nbd_watch w;       /* first: the watch's address is the connection's */
    struct nk_ctx *ctx;
    int idx, fd, state;
    int broken;               /* a write failed: reset at the next event */
    int fail_rc;              /* why an internal request failed (-EACCES: AUTH refused) */
    int up_once;              /* was up before (a later connect is a reconnect) */
    uint32_t events;          /* epoll interest registered (0: not registered) */
    struct nk_list sendq;     /* submitted, not yet encoded */
    struct nk_list inflight;  /* encoded, replies awaited in order */
    char *out;                /* header bytes of the encoded requests */
    size_t out_len, out_cap;
    struct nk_seg *segs;
    size_t nseg, seg_cap, seg_pos, seg_off; /* write position: segs[seg_pos] + seg_off */
    int req_start;            /* the next byte added starts a request */
    char *in;                 /* NK_INBUF */
    size_t in_pos, in_len;
    int rstate;
    char *pay_dst;            /* where the payload goes (NULL: skipped) */
    size_t pay_left, pay_len;
    int trail;                /* bytes of the "\r\n" after a payload seen */
    uint64_t replies, seen_replies; /* replies parsed; as of the last stall check */
    uint64_t stall_since_ms;  /* when the oldest unanswered wait began (see NK_STALL_MS) */
    uint64_t next_try_ms;
    unsigned backoff_ms;
    struct nbd_kvop iops[NK_NINTERNAL]; /* internal requests, by kind - NK_OP_AUTH */
    char note[256];           /* why the last reply was refused */
};

struct nk_ctx {
    const struct nk_proto *proto;
    struct nk_url url;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char name[NK_HOST_MAX + 32]; /* scheme://host:port for messages */
    char *prefix;
    size_t prefix_len;
    uint32_t block_size;
    int thread, epfd, nconns;
    struct nk_conn *conns;
    int evfd, tfd, kicked, in_event;
    uint64_t timer_at;        /* the timerfd's deadline (CLOCK_MONOTONIC ms), 0: disarmed */
    struct nbd_watch evw, tw;
    struct nk_list ready;     /* completed without a reply, done not yet called */
    char *scratch;            /* NK_SCRATCH, while open runs */
    uint64_t pending;
    struct nbd_backend_stats st;
    struct nk_counters cn;
};

uint64_t nk_now_ms(void);
void nk_set_interest(struct nk_conn *c, uint32_t ev);
/* Send what c's output holds: 0 (all sent, or EPOLLOUT asked for), or -errno. */
int nk_write_out(struct nk_conn *c);
/* Encode and send c's queue when it is up (a failed write marks it broken). */
void nk_flush_conn(struct nk_conn *c);
/* Start a non-blocking connect: 0 (c CONNECTING or UP), or -errno. */
int nk_conn_start(struct nk_conn *c);
/* c is connected: its greeting is queued first. */
void nk_conn_up(struct nk_conn *c);
/* Read and parse what c's socket has: 0, or -errno (-ECONNRESET at EOF). */
int nk_read_in(struct nk_conn *c);

#endif
