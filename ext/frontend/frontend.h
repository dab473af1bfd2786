/* frontend.h - the front-end registry.
 *
 * Every way into the engine (RESP over TCP by pollers or by a thread pool, RESP
 * over UDP by kernel sockets or by DPDK, ...) is one file that fills a struct
 * kv_frontend_ops and is listed in frontends[] (frontend.c), looked up by name
 * like the poll policies (pp_find). The server runs the front ends its arch names
 * through these callbacks alone. A front end parses its protocol, runs requests
 * with ses_run (engine/session.h) and registers its own INFO lines with
 * eng_info_add when created. KV_HAVE_DPDK appears only in frontend.c.
 */
#ifndef KV_FRONTEND_H
#define KV_FRONTEND_H

#include <stddef.h>
#include <stdint.h>

struct kv_engine;

/* Totals over a front end's threads (add_stats adds into these). */
struct fe_stats {
    uint64_t connected_clients, total_connections, rejected_connections;
    uint64_t total_commands, bytes_in, bytes_out, protocol_errors;
    uint64_t ops_per_sec;    /* instantaneous_ops_per_sec of its commands */
    int pollers;             /* threads with their own counters (see thread_stats) */
    /* the UDP front ends (udp_requests are not in total_commands); zero otherwise */
    uint64_t udp_rx, udp_tx, udp_requests, udp_dropped, udp_tx_failed, udp_bad, udp_held, udp_stalls, udp_busy_ns;
};

/* One TCP thread's counters (a poller's or a pool worker's). */
struct fe_thread_stats {
    uint64_t epoll_wait, epoll_ctl, reads, writes;
    uint64_t commands, accepted, clients, bytes_in, bytes_out;
};

struct kv_frontend_ops {
    const char *name;
    /* Bind its sockets and set up its threads' state over eng (settings: eng->cfg);
     * nothing runs yet. 0 or -errno with a message in err; *state for the rest. */
    int (*create)(void **state, struct kv_engine *eng, char *err, size_t errlen);
    /* Start its threads. 0 or -errno with a message (what started is stopped). */
    int (*start)(void *state, char *err, size_t errlen);
    /* Stop and join its threads, close its connections. Idempotent. */
    void (*stop)(void *state);
    /* Stop, then free everything (state may be partly created). */
    void (*destroy)(void *state);
    /* The port it serves on (the one bound when the setting was 0). */
    int (*port)(const void *state);
    /* Add its counters to st (relaxed reads; any thread). */
    void (*add_stats)(void *state, struct fe_stats *st);
    /* Counters of its TCP thread i: 0, or -EINVAL past the last. NULL: none. */
    int (*thread_stats)(void *state, int i, struct fe_thread_stats *st);
};

/* The front end of that name; NULL if unknown or not built (dpdk without libdpdk). */
const struct kv_frontend_ops *fe_find(const char *name);

extern const struct kv_frontend_ops fe_poller, fe_threadpool, fe_udp, fe_dpdk, fe_nbd;

#endif
