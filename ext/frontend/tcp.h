/* tcp.h - what the two RESP-over-TCP front ends (poller.c, threadpool.c) share:
 * the listener, admitting a connection (maxclients, TCP_NODELAY), each thread's
 * counters and the INFO lines made from them (clients and stats totals are the
 * server's, summed from add_stats; the "pollers" section is this file's), and the
 * housekeeping every thread does once per TCP_CRON_MS.
 * Threads: tcp_init/tcp_listen/tcp_free on the control thread; the rest on the
 * front end's threads (counters: single writer, see core/counter.h).
 */
#ifndef KV_TCP_H
#define KV_TCP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/frontend.h"

#define TCP_READ_CHUNK (16 * 1024)         /* Redis PROTO_IOBUF_LEN */
#define TCP_BUF_KEEP (64 * 1024)           /* shrink idle buffers above this */
#define TCP_BUF_IDLE_MS 1000               /* ... once they held no more than it for this long */
#define TCP_CRON_MS 100
#define TCP_OPS_SAMPLES 16
#define TCP_FD_CAP_MS 10000

struct kv_engine;

/* One thread's counters: written by that thread only, read by anyone. */
struct tcp_thread {
    _Atomic uint64_t epoll_wait, epoll_ctl, reads, writes, commands, accepted, clients;
    _Atomic uint64_t bytes_in, bytes_out, protocol_errors;
} __attribute__((aligned(64)));

struct tcp_front {
    struct kv_engine *eng;
    int nthreads;
    struct tcp_thread *st;            /* nthreads of them */
    int port_probed;                  /* the port is known to be ours (see tcp_listen) */
    _Atomic uint64_t clients, total_conns, rejected;
    _Atomic uint64_t timed_out;       /* closed after --client-timeout-ms stalled (thread pool) */
    /* One spare descriptor for all the threads, reserved to shed a connection
     * when accept runs out of descriptors (tcp_accept). One, not one per thread:
     * the threads share one fd table, so the fd one thread frees can be taken by
     * another's accept; a per-thread spare lost that way left its listener with
     * connections it could never drain. Whoever holds spare_lock next takes any
     * fd freed since (-1 while none could be had). */
    pthread_mutex_t spare_lock;
    _Atomic int spare_fd;
    /* Clients connected when accept last ran out of descriptors (0: it has not
     * lately). Refusing every connection past this count (as past maxclients)
     * gives back the fd such a connection took. Thread 0's cron forgets it after
     * TCP_FD_CAP_MS while the spare is held, so a passing shortage (the log's
     * files, a peer's socket) does not lower the bound for good. */
    _Atomic uint64_t fd_cap;
    int64_t fd_cap_seen_ms;           /* thread 0: when its cron first saw fd_cap set */
    /* instantaneous_ops_per_sec: samples taken by thread 0's cron */
    uint64_t ops_last;
    int64_t ops_last_ms;
    _Atomic uint64_t ops_samples[TCP_OPS_SAMPLES];
    int ops_idx;
};

/* Counters for nthreads threads; registers the INFO "pollers" section and its
 * "stats" lines (and their CONFIG RESETSTAT). 0 or -errno with a message. */
int tcp_init(struct tcp_front *f, struct kv_engine *eng, int nthreads, char *err, size_t errlen);
void tcp_free(struct tcp_front *f);

/* A listening socket on the engine's bind address and port; the first call with
 * port 0 picks a free port, stored in eng->port for every later call (and for
 * CONFIG GET port / INFO). reuseport: SO_REUSEPORT (one listener per thread), and
 * the first such bind probes that nobody else holds the port. fd or -errno. */
int tcp_listen(struct tcp_front *f, int reuseport, char *err, size_t errlen);
/* The same for any port field of e (*port: 0 = pick, set to the bound one; *probed:
 * kept by the caller across calls); what names it in errors ("listen on"). */
int tcp_listen_port(struct kv_engine *e, int *port, int *probed, int reuseport, const char *what, char *err,
                    size_t errlen);

/* A connection just accepted: counted, and refused past maxclients (returns 0, fd
 * closed: with Redis's error if resp, else silently: the MQTT port); else
 * TCP_NODELAY set, returns 1. */
int tcp_admit(struct tcp_front *f, int fd, int resp);
/* accept4 on the listener lfd (non-blocking, close-on-exec): the fd, or -errno
 * (-EAGAIN: none pending). Out of descriptors, the spare is spent to accept the
 * pending connection and drop it with Redis's error (counted rejected), then
 * reserved again. Any thread. */
int tcp_accept(struct tcp_front *f, int lfd);
/* A connection admitted by tcp_admit is gone (its fd closed by the caller). */
void tcp_closed(struct tcp_front *f);
/* The client at addr stalled for limit_ms mid-request or with a reply it does not
 * read, and is being closed: counted (INFO stats client_timeout_disconnections)
 * and logged, rate-limited. Any front-end thread. */
void tcp_timed_out(struct tcp_front *f, const char *addr, int limit_ms);

/* Once per TCP_CRON_MS on thread idx: its slice of the table's rehash/expiry
 * housekeeping; thread 0 also samples the command rate. */
void tcp_cron(struct tcp_front *f, int idx, int64_t now_ms);

void tcp_add_stats(struct tcp_front *f, struct fe_stats *st);
int tcp_thread_stats(struct tcp_front *f, int i, struct fe_thread_stats *st);
/* The same as kv_frontend_ops callbacks (port, add_stats, thread_stats) of a front
 * end whose state begins with its struct tcp_front. */
int tcp_fe_port(const void *state);
void tcp_fe_add_stats(void *state, struct fe_stats *st);
int tcp_fe_thread_stats(void *state, int i, struct fe_thread_stats *st);

#endif
