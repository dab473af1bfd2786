/* server_int.h - the server's internal structures, shared by server.c (pollers,
 * connections) and info.c (INFO). Not a public interface: only those two files
 * include it. Threads and ownership are described in server.c's header. */
#ifndef KV_SERVER_INT_H
#define KV_SERVER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cmd/cmd.h"
#include "core/kvbuf.h"
#include "frontend/pollpolicy.h"
#include "proto/resp.h"
#include "server/server.h"

#define MAX_EVENTS 256
#define READ_CHUNK (16 * 1024)         /* Redis PROTO_IOBUF_LEN */
#define OUT_PAUSE (4 * 1024 * 1024)    /* stop reading a client whose unsent replies pass this */
#define BUF_KEEP (64 * 1024)           /* shrink idle buffers above this */
#define CRON_MS 100
#define HOUSEKEEP_BUDGET 64
#define OPS_SAMPLES 16
#define QUERYBUF_MAX (1024LL * 1024 * 1024) /* unparsed input one client may buffer */
#define BATCH 32                       /* requests parsed (and prefetched) before running them */

enum tag { TAG_CONN = 1, TAG_LISTENER, TAG_EVENT };

struct pstats { /* one writer (the poller), any reader */
    _Atomic uint64_t epoll_wait, epoll_ctl, reads, writes, commands, accepted, clients;
    _Atomic uint64_t bytes_in, bytes_out, protocol_errors;
};

struct conn;
struct dp_port;

struct batch_req {
    int arg0, argc;  /* slice of the poller's argv/argl */
    size_t end;      /* input offset just past this request */
    uint64_t h;      /* hash of the first key, for prefetching */
};

struct poller {
    int idx;
    struct srv *srv;
    pthread_t th;
    int started;
    int epfd, lfd, evfd;
    int spare_fd;                /* reserved descriptor for shedding connections at EMFILE */
    int listener_tag, event_tag; /* addresses used as epoll tags */
    struct conn *all;            /* every connection of this poller (doubly linked) */
    struct conn *waiting;        /* connections with replies held for the log (doubly linked) */
    struct conn *stalled;        /* connections whose next request waits for the data file */
    struct conn *pending;        /* connections with replies queued this round */
    pthread_mutex_t q_lock;      /* guards q_fds: fds handed over by another poller */
    int *q_fds, q_len, q_cap;
    int64_t last_cron;
    /* scratch for the batch being run (process_input): requests and their arguments */
    struct batch_req batch[BATCH];
    const char **argv;
    size_t *argl;
    int argcap;
    struct pstats st;
} __attribute__((aligned(64)));

struct conn {
    int tag;                     /* TAG_CONN: must stay the first member */
    int fd;
    struct poller *p;
    struct kvbuf in;
    size_t in_off;               /* start of the request being parsed */
    struct resp_parser rp;
    struct kvbuf out;
    size_t out_off;              /* bytes of out already sent */
    struct cmd_client cl;
    uint32_t interest;           /* events registered with epoll */
    int writable;                /* its last event reported EPOLLOUT, and no send failed since */
    int paused;                  /* input not processed until replies drain */
    int listed;                  /* on p->pending */
    int closed;
    struct conn *next_pending;
    struct conn *prev, *next;
    struct pp_conn pp;
    /* Replies held until the log makes what they depend on durable: from
     * holds[i].off on, out waits for LSN holds[i].lsn (offsets and LSNs ascend). */
    struct hold { size_t off; uint64_t lsn; } *holds;
    int hold_head, hold_n, hold_cap;
    uint64_t hold_max;
    int waiting;                 /* on the poller's waiting list */
    struct conn *wprev, *wnext;
    int stalled;                 /* its next request waits for a load or for memory (stall list) */
    struct conn *sprev, *snext;
};

struct srv {
    struct srv_config cfg;
    char *bind, *requirepass, *config_file, *version, *durability; /* owned copies */
    struct kv_table *table;
    const struct pp_policy *policy;
    int port;
    int port_probed;
    int npollers;
    struct poller *pollers;
    _Atomic int stopping;
    _Atomic uint64_t clients, next_id, total_conns, rejected, handoff_rr;
    time_t start_time;
    /* instantaneous_ops_per_sec: samples taken by poller 0's cron */
    uint64_t ops_last;
    int64_t ops_last_ms;
    _Atomic uint64_t ops_samples[OPS_SAMPLES];
    int ops_idx;
    /* --arch threadpool: the workers' shared epoll set (connections EPOLLONESHOT)
     * and every connection, for closing them at stop (threadpool.c) */
    int tp_epfd;
    int tp_listener_tag;
    pthread_mutex_t tp_lock;
    struct tp_conn *tp_conns;
    struct dp_port *dpdk;        /* --arch dpdk: the kernel-bypass UDP front end (dpdk.c), else NULL */
    struct us_server *udp;       /* --arch udp: the kernel-socket UDP front end (udpsrv.c), else NULL */
};

/* Shared by server.c (pollers) and threadpool.c (workers). */
int64_t srv_mono_ms(void);
void srv_cron(struct poller *p, int64_t now);
void srv_format_addr(int fd, char *dst, size_t n);
/* A new client connection: counted, and refused with Redis's error past maxclients
 * (returns 0, fd closed); TCP_NODELAY set. Then its command state. */
int srv_admit(struct srv *s, int fd);
void srv_client_init(struct srv *s, struct cmd_client *cl, struct kvbuf *out, int fd);
void *tp_worker_main(void *arg);
void tp_close_all(struct srv *s);

static inline void st_inc(_Atomic uint64_t *c, uint64_t d)
{
    /* single writer: a relaxed load+store is enough and avoids a locked RMW */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d, memory_order_relaxed);
}

static inline uint64_t ld(_Atomic uint64_t *c) { return atomic_load_explicit(c, memory_order_relaxed); }

#endif
