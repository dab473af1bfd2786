/* engine.h - the engine: what commands and front ends share of one node.
 *
 * struct kv_engine holds the node's settings (struct kv_config, owned copies),
 * the table, the durability log and the data file (not owned), client ids, and
 * the INFO registry: each owner (the engine itself, the server, every front end)
 * registers the lines it contributes to a section, and the INFO command renders
 * the sections in Redis's order. Commands reach the node only through this
 * struct, never through the server or a front end.
 * Threads: created and filled by the control thread before any front end runs;
 * afterwards read-only except the atomics (client ids).
 */
#ifndef KV_ENGINE_H
#define KV_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/kvbuf.h"
#include "core/list.h"

struct kv_table;
struct wal;
struct bosc;
struct rl_sender;
struct rl_receiver;
struct cst;
struct latmon;
struct nbd_config;

/* A node's settings, as the control plane (Python) fills them. */
struct kv_config {
    const char *bind;        /* IPv4 address to listen on, e.g. "127.0.0.1" */
    int port;                /* TCP port; 0 = any free port (the bound one: kv_engine.port) */
    int threads;             /* TCP front end threads (pollers or pool workers), >= 1 */
    int maxclients;          /* connections beyond this get an error and are closed */
    const char *requirepass; /* NULL or "" = no AUTH required */
    const char *accept;      /* "reuseport" (one listener per poller) or "handoff" (poller 0 accepts) */
    const char *poll_policy; /* "direct" (default), "strict" or "flexpoll"; see frontend/pollpolicy.h */
    const char *config_file; /* shown by INFO, may be NULL */
    const char *version;     /* kvstore version shown by INFO/HELLO */
    int tcp_backlog;
    struct wal *wal;         /* durability log (not owned) or NULL: replies then wait for
                                the LSN their request wrote or read to be durable */
    const char *durability;  /* mode name for INFO: "none", "disk", ... */
    struct rl_sender *sender;      /* remote mode's log sender, for INFO (not owned), or NULL */
    struct rl_receiver *receiver;  /* this node's log receiver, for INFO (not owned), or NULL */
    const char *arch;        /* front ends, by name: "poller", "threadpool" (paper 000's baseline),
                                "udp" or "dpdk" (pollers for TCP + that UDP front end); see
                                server/server.c */
    int network_only;        /* benchmark switch (paper 000's N row): SET answers +OK
                                without touching the table; nothing is stored */
    struct bosc *bosc;       /* data file (not owned) or NULL: with it, a request whose key
                                must be loaded, or that needs memory the flusher is freeing,
                                waits (engine/session.h) instead of failing */
    int udp_port;            /* arch udp/dpdk: UDP port (udp: 0 = any free port) */
    int udp_workers;         /* arch udp/dpdk: UDP worker threads (dpdk: lcores), >= 1 */
    int pull_cache_slots;    /* arch udp: the pull cache's XDP slots (frontend/pullcache.h), 0 = off */
    const char *dpdk_iface;  /* arch dpdk: interface of the AF_XDP port, e.g. a veth end */
    const char *dpdk_eal_args; /* arch dpdk: extra EAL arguments, space separated, or NULL */
    /* ---- clients (cmd/client.c) */
    /* ---- command statistics, slow log, latency monitor */
    long long slowlog_log_slower_than; /* us; a request at least this slow enters SLOWLOG
                                          (0: every one, -1: none) */
    long long slowlog_max_len;         /* SLOWLOG keeps the newest this many */
    int latency_monitor_threshold;     /* ms; LATENCY keeps events at least this slow (0: off) */    /* ---- TLS (tls) */
    int tls_port;                      /* RESP over TLS on bind:tls_port (0: any free port, -1: off) */
    const char *tls_cert_file;         /* PEM certificate chain and key of the server (the four */
    const char *tls_key_file;          /* strings are read while the front end is created only) */
    const char *tls_ca_cert_file;      /* PEM CA that client certificates must chain to */
    const char *tls_auth_clients;      /* "yes", "no" or "optional" (core/tls.h tls_auth_parse) */
    int tls_only;                      /* no plain listener: RESP only over TLS (Redis's port 0) */
    /* ---- node identity and empty starts (identity) */
    int loading;             /* 1: the node waits for its state (wal and bosc NULL): keyspace
                                commands get -LOADING until eng_attach (engine/loading.h) */
    /* ---- client limits: timeouts, file descriptors (limits) */
    int client_timeout_ms;   /* threadpool: a worker waits this long for a stalled client
                                (mid-request read, reply write), then closes it; 0 = forever */
    /* ---- client memory (clientmem) */
    const char *maxmemory_clients; /* "BYTES PCT": bound on all clients' memory (0: none), and the
                                      percentage of maxmemory it was given as (-1: a size) */
    const char *cobl_normal;       /* "HARD SOFT SECONDS": client-output-buffer-limit normal */
    /* ---- disk errors (diskfull) */
    /* ---- block device (nbd) */
    const struct nbd_config *nbd; /* NULL: none; else the NBD front end serves a block device
                                     over this engine (frontend/nbd.h; read, and copied, only
                                     while the front ends are created) */
    /* ---- MQTT (frontend/mqtt.h) */
    int mqtt_port;                     /* MQTT 3.1.1 on bind:mqtt_port (0: any free port, -1: off) */
    const char *mqtt_topic_prefix;     /* topic T is the stream <prefix>T */
    const char *mqtt_retained_key;     /* the hash of retained messages: field topic, value QoS + payload */
    const char *mqtt_session_prefix;   /* client C's persistent session is the string <prefix>C */
    const char *mqtt_users;            /* password file (mosquitto_passwd's format), NULL or "": none */
    int mqtt_max_packet;               /* bytes: a larger packet closes its connection */
    int mqtt_max_inflight;             /* QoS 1/2 messages sent to a client and not acknowledged */
    long long mqtt_max_queued;         /* a session's queue: QoS 0 past it dropped, QoS 1/2 publishers
                                          slowed (0: no bound) */
    int mqtt_max_sessions;             /* a CONNECT past it: CONNACK 3 (server unavailable) */
    long long mqtt_stream_maxlen;      /* MAXLEN ~ for each topic's stream (0: keep every message) */
    /* ---- cluster (cmd/cluster.c) */
    int cluster_enabled;               /* keyed commands follow the slot map (CLUSTER SETMAP) */
};

/* ---- cluster: the slot map a cluster node serves by (cmd/cluster.c). Immutable once
 * installed; a new one replaces it whole (CLUSTER SETMAP, with an epoch not older),
 * the old one is freed some seconds later (commands read the map without a lock). */
#define KV_SLOTS_N 16384
#define KV_SLOT_NONE 0xFFFF
#define KV_CLUSTER_NODES_MAX 1024
struct kv_cnode {
    char id[41];                       /* 40 hex digits */
    char host[64];
    int port;
};
struct kv_slotmap {
    struct kv_slotmap *retired_next;   /* on the engine's list of maps replaced */
    int64_t retired_ms;                /* when (monotonic) */
    uint64_t epoch;                    /* the configuration epoch it belongs to */
    int self;                          /* this node's index in nodes, -1: not a member */
    int nnodes;
    uint16_t owner[KV_SLOTS_N];        /* node index, KV_SLOT_NONE: unassigned */
    uint16_t migrating[KV_SLOTS_N];    /* owned here, moving to that node (ASK for keys not here) */
    uint16_t importing[KV_SLOTS_N];    /* owned there, coming here (served after ASKING) */
    struct kv_cnode nodes[];
};

/* An INFO provider appends "field:value\r\n" lines of its section to out; reset
 * (may be NULL) zeroes the counters CONFIG RESETSTAT covers. Any thread. */
typedef void (*eng_info_fn)(void *arg, struct kvbuf *out);
typedef void (*eng_reset_fn)(void *arg);

#define ENG_INFO_MAX 32

struct eng_info {
    int section;             /* index into eng_info_section() */
    eng_info_fn fn;
    eng_reset_fn reset;
    void *arg;
};

struct kw_reg;
struct kv_engine {
    struct kv_config cfg;    /* strings are owned copies */
    struct kv_table *table;  /* not owned */
    struct wal *wal;         /* cfg.wal */
    struct bosc *bosc;       /* cfg.bosc */
    int port;                /* TCP port bound by the RESP front end (set before threads start) */
    time_t start_time;
    _Atomic uint64_t next_client_id;
    struct eng_info info[ENG_INFO_MAX];
    int ninfo;
    /* ---- clients (cmd/client.c) */
    /* The client registry: every TCP connection of every front end (UDP sessions
     * are not clients), for CLIENT LIST/KILL and MONITOR. clients_lock guards both
     * lists, each listed client's name, fd and monitor queue; nothing else is
     * taken while it is held except the kernel's (send, shutdown, eventfd write). */
    pthread_mutex_t clients_lock;
    struct list clients;        /* struct cmd_client.reg, oldest first */
    struct list monitors;       /* struct cmd_monitor.node, in MONITOR order */
    _Atomic int nmonitors;      /* length of monitors: the one relaxed load per command
                                   that makes MONITOR free while nobody monitors */
    /* ---- command statistics, slow log, latency monitor */
    struct cst *stats;       /* engine/cmdstats.h: per-thread counters, error kinds, slow log */
    struct latmon *latmon;   /* core/latmon.h: fed by the log's sync, the flusher, slow commands */
    struct kw_reg *keywait;  /* core/keywait.h: blocking reads waiting for their keys (cmd/block.c) */    /* ---- TLS (tls) */
    int tls_port;            /* the TLS port bound (cfg.tls_port, or the one picked for 0); -1 off */
    int mqtt_port;           /* the MQTT port bound (cfg.mqtt_port, or the one picked for 0); -1 off */
    const char *tls_auth;    /* tls-auth-clients as a static string ("yes", "no", "optional") */
    /* ---- node identity and empty starts (identity) */
    _Atomic int loading;     /* 1 while the node waits for its state (engine/loading.h): admit
                                loads it (acquire) before a keyspace command reads wal/bosc */
    struct eng_loading *ld;  /* what it waits for, for INFO and the -LOADING error */
    /* ---- client limits: timeouts, file descriptors (limits) */
    _Atomic uint64_t auth_denied; /* failed AUTH/HELLO AUTH (INFO stats acl_access_denied_auth) */
    /* ---- client memory (clientmem) */
    /* Every TCP connection's memory, summed from what each owner thread publishes,
     * the bounds CONFIG SET changes, and the counters INFO shows (cmd/client_mem.c).
     * Relaxed atomics; mem_dying (killed for memory, not yet gone) written under clients_lock. */
    _Atomic int64_t mem_clients;
    _Atomic long long maxmemory_clients;   /* bytes, 0 = no bound */
    _Atomic int maxmemory_clients_pct;     /* given as a percentage of maxmemory (-1: a size) */
    _Atomic long long cobl_hard, cobl_soft; /* client-output-buffer-limit normal, bytes (0: none) */
    _Atomic int cobl_seconds;
    _Atomic uint64_t evicted_clients, cobl_disconnections, qbuf_disconnections;
    _Atomic uint64_t recent_in, recent_out, recent_in_last, recent_out_last; /* largest buffers seen, this
                                                                             window and the last */
    _Atomic int64_t recent_window;         /* when the current window began (ms) */
    _Atomic int64_t mem_trim_peak;         /* mem_clients' peak since memory was last given back */
    _Atomic int64_t mem_dying;
    /* ---- disk errors (diskfull) */
    /* ---- cluster (cmd/cluster.c) */
    struct kv_slotmap *_Atomic slotmap; /* NULL until the control plane sets one */
    pthread_mutex_t slotmap_lock;      /* replacing it; the retired list */
    struct kv_slotmap *retired;
    _Atomic int64_t lease_until_ms;    /* monotonic: keyed commands are served until then
                                          (CLUSTER LEASE; fencing of a node cut off) */
};

/* Copy cfg (its strings too) into a new engine over table t (not owned) and register
 * the engine's own INFO sections (memory, persistence, replication, cpu, keyspace).
 * Control thread. 0 or -errno with a message in err. */
int eng_create(struct kv_engine **out, struct kv_table *t, const struct kv_config *cfg, char *err, size_t errlen);
void eng_destroy(struct kv_engine *e);

/* Register an INFO provider for section (one of eng_info_section()). Providers of a
 * section run in registration order. Control thread, before front ends run.
 * 0, -EINVAL (unknown section) or -ENOSPC. */
int eng_info_add(struct kv_engine *e, const char *section, eng_info_fn fn, eng_reset_fn reset, void *arg);
/* Name of INFO section i in Redis's order, lower case; NULL past the last. */
const char *eng_info_section(int i);
/* Append to out the INFO text of the sections named by argv[0..argc) (INFO's
 * arguments, any case: section names, "all", "default", "everything"; none = the
 * default set): each wanted section's "# Name" header and its providers' lines,
 * in Redis's order, sections separated by an empty line. A section without providers
 * (blockdev on a node without a block device) is left out. The one renderer of
 * INFO: the command (cmd/info.c) and srv_info (the control plane's read, without
 * a connection) both call it. Any thread (providers read counters relaxed or
 * under their components' locks). */
void eng_info_render(struct kv_engine *e, int argc, const char **argv, const size_t *argl, struct kvbuf *out);
/* CONFIG RESETSTAT: every provider's reset. Any thread. */
void eng_reset_stats(struct kv_engine *e);

/* A new client id (1, 2, ...). Any thread. */
uint64_t eng_client_id(struct kv_engine *e);
/* Last LSN appended to the log (0 without one): replies that summarize the whole
 * table (DBSIZE, INFO) depend on all of it. While the disk refuses the log
 * (wal_write_error), its durable LSN instead: they answer without waiting for
 * the disk. Any thread. */
uint64_t eng_log_appended(const struct kv_engine *e);

/* A full or failing disk (the log's wal_write_error, the data file's
 * bosc_write_error: each retries by itself). eng_disk_refusal: 1 if writes
 * must be refused now, with the error reply's text (no '-', no CRLF) in msg (n
 * bytes): Redis's "MISCONF Errors writing to the AOF file: <strerror>" naming
 * kvstore's file ("durability log" or "data file") and saying that writes
 * resume by themselves; 0 while the node's log and data file can be written.
 * eng_disk_info: an eng_info_fn (arg: the engine) for INFO persistence: with a
 * log, Redis's aof_last_write_status (ok|err: the log is kvstore's AOF) and
 * log_write_status, log_write_error, log_write_errors; with a data file,
 * datafile_write_status, datafile_write_error, datafile_write_errors. Any
 * thread (atomics and short locks). */
int eng_disk_refusal(struct kv_engine *e, char *msg, size_t n);
void eng_disk_info(void *arg, struct kvbuf *out);

#endif
