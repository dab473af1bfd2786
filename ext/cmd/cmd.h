/* cmd.h - the command table and handlers of the RESP front doors.
 * Handlers run on the front-end thread that owns the connection; they touch the
 * shared table only through kvt_* (which locks per shard) and the rest of the
 * node only through its engine (engine/engine.h). Arguments come from the
 * network: every handler validates counts, numbers and option combinations
 * before acting. */
#ifndef KV_CMD_H
#define KV_CMD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"
#include "core/list.h"

struct kv_engine;
struct kv_table;
struct cmd_tx;
struct cmd_monitor;

/* Per-connection state that commands read and change. */
struct cmd_client {
    uint64_t id;
    int authenticated;       /* 1 when no password is required or AUTH succeeded */
    int auth_failures;       /* failed AUTH/HELLO AUTH in a row: the connection closes at
                                CMD_AUTH_MAX_FAILURES (conn.c) */
    int resp;                /* protocol chosen with HELLO: 2 (default) or 3 */
    int close_after_reply;   /* QUIT or a protocol error: send what is queued, then close */
    char *name;              /* CLIENT SETNAME, malloc'd, NULL = none */
    struct kvbuf *out;       /* replies are appended here */
    struct kv_engine *eng;   /* the node this connection is served by */
    struct kv_table *table;  /* eng->table */
    int poller;              /* index of the owning front-end thread (CLIENT INFO) */
    char addr[64];           /* peer "ip:port" */
    /* Set by a handler (with no reply and no change made) when the request
     * must wait: CMD_STALL_LOAD for stall_key to be loaded from the data file,
     * CMD_STALL_MEM for the flusher to free memory. The server runs the same
     * request again when woken. */
    int stall;
    const char *stall_key;
    size_t stall_klen;
    uint64_t stall_ns;       /* time the runs of a stalled request took so far: statistics
                                count a request once, with all its runs (dispatch.c) */
    int blocked;             /* counted in blocked_clients (its request waits for the data file) */
    uint64_t sync_ticket;    /* CMD_STALL_SYNC: the sweep DBSIZE waits for */
    int64_t keys_ticket;     /* CMD_STALL_KEYS: the data file's key listing SCAN/KEYS wait for
                                (bosc_keys_request) */
    int evfd;                /* the session's eventfd (-1: a blocking front end, which waits in
                                ses_wait): what a command requests itself wakes it there */
    struct cmd_keys *keys;   /* SCAN, KEYS, RANDOMKEY over the data file: where the request
                                is between its runs (cmd/scan.c), NULL otherwise */
    /* A multi-key command (MGET, EXISTS, DEL) that stalled on its resume_i-th key
     * carries on from there when run again (0 = from the start): it never needs
     * all its keys in memory at once, which a small memory could not give. MGET's
     * reply so far stays in out (the front end keeps it, held like any reply). */
    int resume_i;
    long long resume_n;
    int datagram;            /* a UDP front end's session: no connection, so no MULTI/WATCH */
    int internal;            /* the front end's own framed requests run now (UDP batch appends and
                                pulls): the internal commands are found (dispatch.c) */
    int asking;              /* ASKING came: the next command may use an importing slot (cluster.c) */
    struct cmd_tx *tx;       /* MULTI's queue and WATCH's keys (multi.c), NULL until used */
    struct cmd_block *block; /* a blocking read's wait (block.c), NULL when none */
    /* CLIENT LIST/KILL and MONITOR (client.c). A TCP connection is on the engine's
     * registry (reg) from cmd_client_register to cmd_client_unregister, which its
     * owner calls before it closes fd: a killer, holding the registry's lock, may
     * shutdown() fd but never sees it reused. The atomics are written (relaxed) by
     * the owner thread and read by any thread listing clients: a moment stale at most. */
    struct list reg;
    int fd;                  /* the socket while registered, else -1 */
    int top;                 /* CMD_TOP_*: ses_run sets NEXT, so the request's own command (not the
                                ones EXEC runs, NESTED) is the one CLIENT LIST shows */
    int64_t ctime_ms;        /* connected at (CLOCK_MONOTONIC_COARSE ms) */
    char laddr[64];          /* local "ip:port" */
    struct cmd_monitor *mon; /* MONITOR mode's queue (guarded by the registry's lock), NULL otherwise */
    int killed;              /* CLIENT KILL shut it down: no longer listed (the registry's lock) */
    _Atomic(const char *) lastcmd; /* full name ("client|list") of the last command, NULL: unknown */
    _Atomic int64_t last_ms;       /* last read or write (same clock as ctime_ms) */
    _Atomic int multi;             /* commands queued since MULTI, -1 outside MULTI */
    _Atomic uint64_t multi_mem;    /* their argument bytes */
    _Atomic uint32_t qbuf, qbuf_free, obl, rbs, rbp; /* input and output buffers (cmd_client_io) */
    _Atomic int events;            /* CMD_EV_READ | CMD_EV_WRITE: what the front end waits for */
    /* Memory (client_mem.c): what the owner last published (counted in the engine's
     * mem_clients), since when its unsent replies are above the soft limit (0: they
     * are not), and what eviction counted as soon gone (clients_lock). */
    _Atomic uint64_t mem;
    int64_t soft_since_ms;
    int64_t dying;
};

enum { CMD_EV_READ = 1, CMD_EV_WRITE = 2 };
enum { CMD_TOP_NONE, CMD_TOP_NEXT, CMD_TOP_RUNNING, CMD_TOP_NESTED };

/* CMD_STALL_SYNC: for a sweep of the flusher (DBSIZE counts exactly only when
 * every key's presence in its block is known); CMD_STALL_KEYS: for a listing of
 * the data file's keys (keys_ticket), which the command requested. */
/* CMD_STALL_BLOCK: a blocking read (XREAD/XREADGROUP BLOCK) waits for a write to
 * one of its keys or for its time to pass (block.c): run it again once
 * cmd_block_ready says so. */
enum { CMD_STALL_NONE, CMD_STALL_LOAD, CMD_STALL_MEM, CMD_STALL_SYNC, CMD_STALL_KEYS, CMD_STALL_BLOCK };

/* ---- blocking reads (block.c) */
struct cmd_block;
/* A request stalled with CMD_STALL_BLOCK should run again now: a key it waits on
 * was written, or its time is up (then it replies the timeout). */
int cmd_block_ready(struct cmd_client *c);
/* When its time is up (CLOCK_MONOTONIC ms), or INT64_MAX: never. */
int64_t cmd_block_deadline(struct cmd_client *c);
/* The wait ends (answered, or the connection closes): unregister and free it.
 * Idempotent. */
void cmd_block_done(struct cmd_client *c);
/* Blocking front ends (ses_wait): sleep until cmd_block_ready. 0. */
int cmd_block_sleep(struct cmd_client *c);

/* Execute one request (argc >= 1). Appends exactly one reply to c->out, or
 * none when it sets c->stall (the caller then drops any partial output).
 * Returns 0, or -ENOMEM when even the reply could not be queued. */
int cmd_dispatch(struct cmd_client *c, int argc, const char **argv, const size_t *argl);

/* Free what a client's MULTI/WATCH holds (on disconnect). */
void cmd_tx_free(struct cmd_client *c);
/* The connection is closing: release what its commands keep between the runs of
 * a request (a pending key listing, KEYS's keys so far). */
void cmd_client_release(struct cmd_client *c);
/* The request no longer waits (done, or the connection closes): blocked_clients
 * stops counting it. Idempotent; cmd_client_release calls it. */
void cmd_stats_unblock(struct cmd_client *c);

/* Register the command layer's INFO lines (blocked_clients, total_error_replies,
 * commandstats, errorstats, latencystats) with e's INFO registry, after the
 * server's own. Control thread. 0 or eng_info_add's error. */
int cmd_stats_register(struct kv_engine *e);

/* Register INFO cluster (cluster_enabled) with e's registry. Control thread. */
int cmd_cluster_register(struct kv_engine *e);

/* ---- the client registry and MONITOR (client.c) */
/* Put a TCP connection's client on the registry (CLIENT LIST, KILL). fd: its socket;
 * now_ms: CLOCK_MONOTONIC_COARSE. Owner thread; takes the registry's lock. */
void cmd_client_register(struct cmd_client *c, int fd, int64_t now_ms);
/* Take it off (and out of MONITOR mode) before its fd is closed. Idempotent. */
void cmd_client_unregister(struct cmd_client *c);
/* The front end's buffers, for CLIENT LIST: bytes of input not yet run (qbuf), room
 * left (qfree), replies not yet sent (obl), the output buffer's size (rbs); now_ms
 * is the last interaction. Owner thread; relaxed stores only. */
static inline void cmd_client_io(struct cmd_client *c, int64_t now_ms, size_t qbuf, size_t qfree, size_t obl,
                                 size_t rbs)
{
    atomic_store_explicit(&c->last_ms, now_ms, memory_order_relaxed);
    atomic_store_explicit(&c->qbuf, (uint32_t)(qbuf > UINT32_MAX ? UINT32_MAX : qbuf), memory_order_relaxed);
    atomic_store_explicit(&c->qbuf_free, (uint32_t)(qfree > UINT32_MAX ? UINT32_MAX : qfree), memory_order_relaxed);
    atomic_store_explicit(&c->obl, (uint32_t)(obl > UINT32_MAX ? UINT32_MAX : obl), memory_order_relaxed);
    atomic_store_explicit(&c->rbs, (uint32_t)(rbs > UINT32_MAX ? UINT32_MAX : rbs), memory_order_relaxed);
    if (obl > atomic_load_explicit(&c->rbp, memory_order_relaxed))
        atomic_store_explicit(&c->rbp, (uint32_t)(obl > UINT32_MAX ? UINT32_MAX : obl), memory_order_relaxed);
}
/* After ses_run's cmd_dispatch of a client that used MULTI (c->tx): publish
 * CLIENT LIST's multi and multi-mem. reply_at: where the request's reply began. */
void cmd_client_after(struct cmd_client *c, size_t reply_at, int argc, const size_t *argl);
/* A thread that owns monitors woken through evfd (a poller): move their queued
 * lines into their output buffers (while those hold less than CMD_MONITOR_MAX) and
 * call ready(arg, c) for each that got some, for the front end to send them.
 * Cheap when nobody monitors. */
void cmd_monitor_take(struct kv_engine *e, int evfd, void (*ready)(void *arg, struct cmd_client *c), void *arg);
/* Monitors without an owner thread to wake (thread pool: evfd -1) are written by
 * whichever thread queues to them; what the socket did not take then goes now.
 * Any thread, from its periodic housekeeping. */
void cmd_monitor_flush(struct kv_engine *e);
/* Such a monitor's own replies: c->out goes through its queue (so they never
 * interleave with lines other threads write), and c->out is emptied. Owner thread. */
int cmd_monitor_reply(struct cmd_client *c);
#define CMD_MONITOR_MAX (16u << 20) /* a monitor this far behind is disconnected (output buffer limit) */

/* ---- client memory (client_mem.c): maxmemory-clients, client-output-buffer-limit */
#define CMD_QUERYBUF_MAX (1024LL * 1024 * 1024) /* Redis's client-query-buffer-limit: unparsed input
                                                  and its argument array, per client */
enum { CMD_MEM_OK, CMD_MEM_CLOSE };
/* The owner thread's account of its connection after it read or wrote: qmem, the
 * request in part (input not yet run plus the parser's argument array); in_bytes
 * and out_bytes, what its input and output buffers hold allocated; obl, replies
 * not yet sent. Publishes the total (INFO mem_clients_normal, eviction), checks
 * the query-buffer limit and client-output-buffer-limit normal (counted, logged),
 * and past maxmemory-clients closes the clients using most memory. Returns
 * CMD_MEM_CLOSE when this client must be closed now. Cheap when nothing is over:
 * relaxed atomics only; eviction takes the registry's lock. */
int cmd_client_mem(struct cmd_client *c, int64_t now_ms, size_t qmem, size_t in_bytes, size_t obl, size_t out_bytes);
/* The length c->out may reach while one request runs (0: no bound): its current
 * length plus the hard output limit, and no more than what maxmemory-clients leaves
 * after every other client's memory (those past it evicted first, the largest
 * first). ses_run sets out->limit from it, so a reply that would get its client
 * closed anyway (MGET of a large key 10,000 times) is never built, and clients
 * served in one poll round cannot together pass the bound by much. */
size_t cmd_client_reply_limit(struct cmd_client *c);
/* A reply stopped at that bound: counted and logged; the caller closes the client. */
void cmd_client_reply_over(struct cmd_client *c);
/* Every TCP_CRON_MS on each front-end thread: the recent-max windows of INFO, an
 * eviction a lost race may have left undone, and memory given back to the system
 * once clients that held much of it have left. */
void cmd_clients_cron(struct kv_engine *e, int64_t now_ms);
/* INFO lines (clients, memory, stats) and the bounds from e->cfg. Control thread. */
int cmd_client_mem_register(struct kv_engine *e);
/* CONFIG GET/SET of maxmemory-clients and client-output-buffer-limit: the value
 * as Redis shows it; set: 1 if name is one of them (replied), else 0. */
void cmd_client_mem_get(struct cmd_client *c, int which, char *dst, size_t n);
int cmd_client_mem_set(struct cmd_client *c, const char *name, size_t nlen, const char *v, size_t vlen, int *rc);

/* Number of top-level commands in the table (COMMAND COUNT). */
int cmd_count(void);

#endif
