/* cmd.h - the command table and handlers of the RESP front doors.
 * Handlers run on the front-end thread that owns the connection; they touch the
 * shared table only through kvt_* (which locks per shard) and the rest of the
 * node only through its engine (engine/engine.h). Arguments come from the
 * network: every handler validates counts, numbers and option combinations
 * before acting. */
#ifndef KV_CMD_H
#define KV_CMD_H

#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"

struct kv_engine;
struct kv_table;
struct cmd_tx;

/* Per-connection state that commands read and change. */
struct cmd_client {
    uint64_t id;
    int authenticated;       /* 1 when no password is required or AUTH succeeded */
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
    struct cmd_tx *tx;       /* MULTI's queue and WATCH's keys (multi.c), NULL until used */
};

/* CMD_STALL_SYNC: for a sweep of the flusher (DBSIZE counts exactly only when
 * every key's presence in its block is known); CMD_STALL_KEYS: for a listing of
 * the data file's keys (keys_ticket), which the command requested. */
enum { CMD_STALL_NONE, CMD_STALL_LOAD, CMD_STALL_MEM, CMD_STALL_SYNC, CMD_STALL_KEYS };

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

/* Number of top-level commands in the table (COMMAND COUNT). */
int cmd_count(void);

#endif
