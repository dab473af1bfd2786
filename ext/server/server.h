/* server.h - the RESP server: per-core poller threads over one shared table.
 *
 * Each poller owns an epoll instance and the connections assigned to it; a
 * connection is only ever touched by its poller thread. Connections reach a
 * poller through its own SO_REUSEPORT listener (the kernel spreads them) or,
 * in handoff mode, from poller 0's listener through a queue + eventfd. Replies
 * are gathered per poll round and written at its end; when to keep EPOLLOUT in
 * the interest set is decided by a pluggable policy (pollpolicy.h).
 * srv_* functions are called from the control thread (Python), never from pollers,
 * except the srv_info/srv_config_* accessors used by command handlers.
 */
#ifndef KV_SERVER_H
#define KV_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"

struct kv_table;
struct srv;
struct wal;
struct rl_sender;
struct rl_receiver;

enum srv_accept_mode { SRV_ACCEPT_REUSEPORT = 0, SRV_ACCEPT_HANDOFF = 1 };
/* poller: `threads` epoll pollers (per core); threadpool: `threads` workers that
 * each serve one request at a time with blocking calls (threadpool.c); udp and
 * dpdk: the pollers serve TCP as usual (the control path: redis-cli, INFO) and
 * udp_workers threads serve UDP datagrams (udpfront.h), from kernel sockets on
 * bind:udp_port (udp, udpsrv.c) or from dpdk_iface bypassing the kernel (dpdk,
 * dpdk.c). The UDP path has the same durability and data file, and no AUTH. */
enum srv_arch { SRV_ARCH_POLLER = 0, SRV_ARCH_THREADPOOL = 1, SRV_ARCH_DPDK = 2, SRV_ARCH_UDP = 3 };

struct srv_config {
    const char *bind;        /* IPv4 address to listen on, e.g. "127.0.0.1" */
    int port;                /* 0 = any free port (see srv_port) */
    int threads;             /* poller threads, >= 1 */
    int maxclients;          /* connections beyond this get an error and are closed */
    const char *requirepass; /* NULL or "" = no AUTH required */
    int accept_mode;         /* enum srv_accept_mode */
    const char *poll_policy; /* "direct" (default), "strict" or "flexpoll"; see pollpolicy.h */
    const char *config_file; /* shown by INFO, may be NULL */
    const char *version;     /* kvstore version shown by INFO/HELLO */
    int tcp_backlog;
    struct wal *wal;         /* durability log (not owned) or NULL: replies then wait for
                                the LSN their request wrote or read to be durable */
    const char *durability;  /* mode name for INFO: "none", "disk", ... */
    struct rl_sender *sender;      /* remote mode's log sender, for INFO (not owned), or NULL */
    struct rl_receiver *receiver;  /* this node's log receiver, for INFO (not owned), or NULL */
    int arch;                /* enum srv_arch */
    int network_only;        /* benchmark switch (paper 000's N row): SET answers +OK
                                without touching the table; nothing is stored */
    struct bosc *bosc;       /* data file (not owned) or NULL: with it, a request whose key
                                must be loaded, or that needs memory the flusher is freeing,
                                waits (see cmd_client.stall) instead of failing */
    /* arch udp and dpdk */
    int udp_port;            /* UDP port of the front end (udp: 0 = any free port) */
    int udp_workers;         /* UDP worker threads (dpdk: lcores = RX/TX queue pairs), >= 1 */
    /* arch dpdk only */
    const char *dpdk_iface;  /* interface for the AF_XDP port, e.g. one end of a veth pair */
    const char *dpdk_eal_args; /* extra EAL arguments, space separated, or NULL */
};

/* Per-poller counters; each is written only by its poller. */
struct srv_poller_stats {
    uint64_t epoll_wait, epoll_ctl, reads, writes;
    uint64_t commands, accepted, clients, bytes_in, bytes_out;
};

struct srv_stats {
    uint64_t connected_clients, total_connections, rejected_connections;
    uint64_t total_commands, bytes_in, bytes_out, protocol_errors;
    int pollers;
    /* arch udp/dpdk: UDP front end counters (zero otherwise; see uf_totals);
     * udp_requests are not in total_commands */
    uint64_t udp_rx, udp_tx, udp_requests, udp_dropped, udp_tx_failed, udp_bad, udp_held, udp_stalls, udp_busy_ns;
};

/* Create a server over table t (not owned) and bind its listeners. Nothing runs
 * until srv_start. On failure returns -errno with a message in err. */
int srv_create(struct srv **out, struct kv_table *t, const struct srv_config *cfg,
               char *err, size_t errlen);
int srv_start(struct srv *s, char *err, size_t errlen);
/* Stop the pollers, close every connection, join the threads. Idempotent. */
void srv_stop(struct srv *s);
void srv_destroy(struct srv *s);

int srv_port(const struct srv *s);
/* The UDP front end's port (arch udp: the one bound, when udp_port was 0). */
int srv_udp_port(const struct srv *s);
/* 1 if this build has the DPDK front end (libdpdk found at build time), else 0. */
int srv_have_dpdk(void);
void srv_get_stats(struct srv *s, struct srv_stats *st);
int srv_get_poller_stats(struct srv *s, int i, struct srv_poller_stats *st);

/* A socket of type (SOCK_STREAM or SOCK_DGRAM, | SOCK_NONBLOCK) bound to bind_addr:*port,
 * with SO_REUSEPORT if reuseport (and SO_REUSEADDR for TCP). probe: first bind once without
 * SO_REUSEPORT, so that a port someone holds is refused rather than silently shared. *port 0
 * becomes the port the kernel picked. Returns the fd, or -errno with "cannot <what> addr:port:
 * reason" in err. Control thread (srv_create and the UDP front end's us_create). */
int srv_bind_socket(int type, const char *bind_addr, int *port, int reuseport, int probe, const char *what,
                    char *err, size_t errlen);

/* For command handlers (any poller thread). */
const struct srv_config *srv_config(const struct srv *s);
/* INFO [section ...] reply (a verbatim string in RESP3) appended to out. */
int srv_info(struct srv *s, int argc, const char **argv, const size_t *argl, int proto,
             struct kvbuf *out);
void srv_reset_stats(struct srv *s);
/* Last LSN appended to the log (0 without one): replies that summarize the whole
 * table (DBSIZE, INFO) depend on all of it. */
uint64_t srv_log_appended(struct srv *s);

#endif
