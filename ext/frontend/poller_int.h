/* poller_int.h - the poller front end's structures, shared by poller.c (the
 * poll loop and its connections) and poller_life.c (create, start, stop,
 * destroy). Ownership and threads: see poller.c's header comment. */
#ifndef KV_POLLER_INT_H
#define KV_POLLER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/fdq.h"
#include "core/kvbuf.h"
#include "core/list.h"
#include "engine/session.h"
#include "frontend/mqtt.h"
#include "frontend/pollpolicy.h"
#include "frontend/tcp.h"
#include "frontend/tlsio.h"
#include "proto/resp.h"

#define MAX_EVENTS 256
#define OUT_PAUSE (4 * 1024 * 1024)    /* stop reading a client whose unsent replies pass this */
#define BATCH 32                       /* requests parsed (and prefetched) before running them */

enum tag { TAG_CONN = 1, TAG_LISTENER, TAG_EVENT, TAG_TLS_LISTENER, TAG_MQTT_LISTENER };

/* a handed-over fd (handoff mode) accepted on the TLS listener */
#define HANDED_TLS (1 << 30)
/* ... on the MQTT listener (mqtt-port) */
#define HANDED_MQTT (1 << 29)

struct conn;
struct poller_server;

struct batch_req {
    int arg0, argc;  /* slice of the poller's argv/argl */
    size_t end;      /* input offset just past this request */
    uint64_t h;      /* hash of the first key, for prefetching */
};

struct poller {
    int idx;
    struct poller_server *ps;
    pthread_t th;
    int started;
    int epfd, lfd, evfd;
    int log_slot;                /* evfd's place in the log's wake-up list (wal_want) */
    int tls_lfd, tls_listener_tag; /* the TLS listener (tls-port) and its epoll tag, or -1 */
    int mqtt_lfd, mqtt_listener_tag; /* the MQTT listener (mqtt-port) and its epoll tag, or -1 */
    int listener_tag, event_tag; /* addresses used as epoll tags */
    struct mq_poller mq;         /* its MQTT connections (frontend/mqtt.h) */
    struct tcp_thread *st;       /* its counters (in ps->tcp) */
    struct list all;             /* every connection of this poller */
    struct list waiting;         /* connections with replies held for the log */
    struct list stalled;         /* connections whose next request waits for the data file, or
                                    (CMD_STALL_BLOCK) a blocking read parked until a write or its time */
    int64_t block_deadline;      /* the earliest parked read's time (CLOCK_MONOTONIC ms), INT64_MAX: none */
    struct list big;             /* connections with a buffer above TCP_BUF_KEEP (shrink_idle) */
    struct conn *pending;        /* connections with replies queued this round */
    struct fdq handed;           /* connections poller 0 accepted for this one (handoff mode) */
    int64_t last_cron;
    int64_t now;                 /* kv_coarse_ms() when this round's events arrived */
    /* scratch for the batch being run (process_input): requests and their arguments */
    struct batch_req batch[BATCH];
    struct resp_args args;
} __attribute__((aligned(64)));

struct poller_server {
    struct tcp_front tcp;        /* first: the tcp_fe_* callbacks take the state as one */
    struct kv_engine *eng;
    const struct pp_policy *policy;
    int handoff;                 /* accept mode handoff: poller 0 accepts, hands round-robin */
    int npollers;
    struct poller *pollers;
    struct tlsio *tls;           /* tls-port's context and counters, or NULL */
    struct mq_broker *mqtt;      /* mqtt-port's broker, or NULL */
    _Atomic int stopping;
    _Atomic uint64_t handoff_rr;
};

struct conn {
    int tag;                     /* TAG_CONN: must stay the first member */
    int fd;
    struct tlsio_conn *tls;      /* NULL: a plain TCP connection */
    struct mq_conn *mq;          /* NULL: RESP; else an MQTT connection's state (frontend/mqtt.h) */
    struct poller *p;
    struct kvbuf in;
    size_t in_off;               /* start of the request being parsed */
    struct resp_parser rp;
    struct kvbuf out;
    size_t out_off;              /* bytes of out already sent */
    struct session ses;          /* command state; ses.need: the LSN the last reply needs */
    uint32_t interest;           /* events registered with epoll */
    int writable;                /* its last event reported EPOLLOUT, and no send failed since */
    int paused;                  /* input not processed until replies drain */
    int listed;                  /* on p->pending */
    int closed;
    struct conn *next_pending;
    struct list node;            /* on p->all */
    struct pp_conn pp;
    struct list wait_node;       /* on p->waiting: replies held for the log */
    struct list stall_node;      /* on p->stalled: its next request waits for a load or for memory */
    struct list big_node;        /* on p->big */
    int64_t big_ms;              /* p->now when in or out last held more than TCP_BUF_KEEP bytes */
};

/* The poll loop of one poller (poller.c); arg: its struct poller. */
void *poller_main(void *arg);

extern const struct kv_frontend_ops fe_poller;

#endif
