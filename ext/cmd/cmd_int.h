/* cmd_int.h - what the command files share (not a public interface: only
 * the files of ext/cmd include it): the command table's types, Redis's error texts,
 * argument helpers, and every handler (the table in dispatch.c names them).
 * Handlers return 0, or -ENOMEM when even the reply could not be queued. */
#ifndef KV_CMD_INT_H
#define KV_CMD_INT_H

#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include "cmd/cmd.h"
#include "core/kvbuf.h"
#include "proto/resp.h"

#define F_WRITE (1 << 0)
#define F_READONLY (1 << 1)
#define F_NOAUTH (1 << 2)  /* allowed before AUTH */
#define F_FAST (1 << 3)
#define F_DENYOOM (1 << 4)
#define F_INTERNAL (1 << 5) /* a front end's framed operation (cmd.h's internal): unknown to RESP clients */
#define F_BLOCKING (1 << 6) /* may block the client (BLOCK): COMMAND INFO says so, as Redis does */
#define F_MOVABLEKEYS (1 << 7) /* keys not at first..last by step (found by parsing the arguments) */
#define F_CONTAINER (1 << 8) /* subcommands (OBJECT, XGROUP, XINFO): COMMAND INFO shows, as Redis 7 does, neither
                              * flags nor keys for the container (first..last still name the key, for EXEC) */

struct cmd_args {
    int argc;
    const char **argv;
    const size_t *argl;
};

typedef int (*cmd_fn)(struct cmd_client *c, const struct cmd_args *a);

struct cmd_def {
    const char *name;
    int arity; /* > 0 exact argc, < 0 at least -arity */
    int flags;
    /* Key positions, as COMMAND reports them: the first key's argument, the
     * last's (-1: the last argument, -2: the one before it), the step between
     * keys; 0 0 0 for a command without keys. EXEC loads a transaction's keys
     * from them before it runs. */
    signed char first, last, step;
    cmd_fn fn;
    const char *group, *summary, *since;
};

#define ERR_INT "ERR value is not an integer or out of range"
#define ERR_SYNTAX "ERR syntax error"
#define ERR_OOM "OOM command not allowed when used memory > 'maxmemory'."
#define ERR_BIG "ERR string exceeds maximum allowed size (proto-max-bulk-len)"

/* Argument i is the literal lit, case-insensitive. */
#define ARGIS(a, i, lit) ((a)->argl[i] == sizeof(lit) - 1 && !strncasecmp((a)->argv[i], lit, sizeof(lit) - 1))

/* ---- helpers (dispatch.c) */
static inline int cmd_reply_ok(struct cmd_client *c) { return kvbuf_append(c->out, "+OK\r\n", 5); }
static inline int cmd_reply_err(struct cmd_client *c, const char *e) { return resp_add_error(c->out, e); }
/* The error reply for a failed table write (-ENOMEM, -E2BIG, log backlog or failure). */
int cmd_reply_write_err(struct cmd_client *c, int64_t rc);
/* Redis's string2ll on argument i: 0, or -EINVAL if it is not a 64-bit decimal integer. */
int cmd_arg_ll(const struct cmd_args *a, int i, long long *v);
int64_t cmd_unix_ms(void);
/* Redis's memtoull (config.c): digits and an optional unit b, k, kb, m, mb, g, gb. 0 or -EINVAL. */
int cmd_parse_memory(const char *p, size_t n, unsigned long long *out);
/* kvt_read_fn that appends the value as a bulk string to the client's replies. */
void cmd_add_bulk_cb(void *arg, const char *v, size_t n);
int cmd_unknown_sub(struct cmd_client *c, const struct cmd_args *a, const char *cmd);
/* A HELP subcommand's reply: the lines of a static array, each a status reply. */
int cmd_reply_help(struct cmd_client *c, const char *const *lines, int n);
#define CMD_REPLY_HELP(c, lines) cmd_reply_help(c, lines, (int)(sizeof lines / sizeof *lines))
/* 1 if argc fits want (> 0 exact, < 0 at least -want), else replies Redis's arity error, 0. */
int cmd_sub_arity(struct cmd_client *c, const struct cmd_args *a, int want, const char *full);
/* key left memory for its data-file block: stall until it is loaded (or say why it cannot be). */
int cmd_need_load(struct cmd_client *c, const char *key, size_t klen);
/* 1 if a write refused for memory should wait for the flusher (stall set), else 0. */
int cmd_wait_for_memory(struct cmd_client *c, size_t need);
/* Errors of a write to key: stall for a load or for memory, or reply the error. */
int cmd_write_err_key(struct cmd_client *c, int64_t rc, const char *key, size_t klen, size_t need);

/* ---- handlers, by file */
/* conn.c */
int c_ping(struct cmd_client *c, const struct cmd_args *a);
int c_echo(struct cmd_client *c, const struct cmd_args *a);
int c_quit(struct cmd_client *c, const struct cmd_args *a);
int c_auth(struct cmd_client *c, const struct cmd_args *a);
int c_hello(struct cmd_client *c, const struct cmd_args *a);
int c_select(struct cmd_client *c, const struct cmd_args *a);
int c_time(struct cmd_client *c, const struct cmd_args *a);
int c_info(struct cmd_client *c, const struct cmd_args *a);
/* keyspace.c */
int c_del(struct cmd_client *c, const struct cmd_args *a);
int c_exists(struct cmd_client *c, const struct cmd_args *a);
int c_dbsize(struct cmd_client *c, const struct cmd_args *a);
int c_flushall(struct cmd_client *c, const struct cmd_args *a);
/* string.c */
int c_get(struct cmd_client *c, const struct cmd_args *a);
int c_set(struct cmd_client *c, const struct cmd_args *a);
int c_mget(struct cmd_client *c, const struct cmd_args *a);
int c_mset(struct cmd_client *c, const struct cmd_args *a);
int c_incr(struct cmd_client *c, const struct cmd_args *a);
int c_decr(struct cmd_client *c, const struct cmd_args *a);
int c_incrby(struct cmd_client *c, const struct cmd_args *a);
int c_decrby(struct cmd_client *c, const struct cmd_args *a);
int c_append(struct cmd_client *c, const struct cmd_args *a);
int c_strlen(struct cmd_client *c, const struct cmd_args *a);
/* string_ext.c (the rest of Redis's string commands) */
#define ERR_WRONGTYPE "WRONGTYPE Operation against a key holding the wrong kind of value"
#define ERR_NOMEM "ERR out of memory"
/* The head of a kvt_apply argument: fn returns CMD_OP_ERR to have err replied. */
struct cmd_op {
    struct cmd_client *c;
    const char *err;
};
#define CMD_OP_ERR (-ECANCELED) /* (errno.h) */
struct kvt_state;
struct kvt_change;
/* kvt_apply(fn, op) on argument 1's key. Returns 1 with fn's result in *res, or 0
 * when the request is answered or stalled: what fn queued on c->out is dropped and
 * the error replied (op->err, WRONGTYPE, a write error), or it waits for a load or
 * for need bytes of memory. */
int cmd_apply_key(struct cmd_client *c, const struct cmd_args *a,
                  int64_t (*fn)(void *op, const struct kvt_state *cur, struct kvt_change *ch), struct cmd_op *op,
                  size_t need, int64_t *res);
/* kvt_get on argument 1's key: 1 found (fn ran), 0 absent, or -1 when the request is
 * answered (WRONGTYPE) or stalled for a load. */
int cmd_read_key(struct cmd_client *c, const struct cmd_args *a, void (*fn)(void *arg, const char *v, size_t n),
                 void *arg);
/* SET ... GET and GETSET (string.c) on arguments 1 (key) and 2 (value): flags KVT_NX/XX/KEEPTTL. */
int cmd_set_get(struct cmd_client *c, const struct cmd_args *a, int flags, int64_t expire);
/* Argument i as an expire time in units of unit_ms (1000 or 1), relative to now or
 * absolute: 0 with the absolute ms in *ms, -EINVAL not an integer, -ERANGE not a
 * valid time; cmd_reply_expire_err replies Redis's error for cmd. */
int cmd_expire_arg(const struct cmd_args *a, int i, int unit_ms, int relative, int64_t *ms);
int cmd_reply_expire_err(struct cmd_client *c, int rc, const char *cmd);
/* MSET's and MSETNX's checks (string.c): pairs of arguments, room for them in memory.
 * 1 fine, else 0 (answered, or stalled for memory). */
int cmd_mset_check(struct cmd_client *c, const struct cmd_args *a, const char *cmd);
/* For a kvt_apply fn: PUT the key's string with bytes [off, off + n) replaced by src
 * (zero-padded past its end), built in buf (alive until kvt_apply returns), the
 * expire time kept. Returns the new length, or CMD_OP_ERR (op->err) without memory. */
int64_t cmd_put_patched(struct cmd_op *op, struct kvbuf *buf, const struct kvt_state *cur, size_t off,
                        const void *src, size_t n, struct kvt_change *ch);
/* Redis's range [*start, *end] in a sequence of len: negative indexes count from the
 * end, both clamped into it. 1 if it is not empty. */
int cmd_range(long long *start, long long *end, long long len);
/* INCRBYFLOAT's and HINCRBYFLOAT's numbers: Redis's string2ld on bytes (1 a float,
 * 0 not) and its human-friendly ld2string (the length written, 0 if cap is too
 * small); CMD_LD_CHARS (Redis's MAX_LONG_DOUBLE_CHARS) bounds both. */
#define CMD_LD_CHARS (5 * 1024)
int cmd_str2ld(const char *s, size_t n, long double *out);
size_t cmd_ld2str(char *buf, size_t cap, long double v);
int c_setnx(struct cmd_client *c, const struct cmd_args *a);
int c_setex(struct cmd_client *c, const struct cmd_args *a);
int c_psetex(struct cmd_client *c, const struct cmd_args *a);
int c_getset(struct cmd_client *c, const struct cmd_args *a);
int c_getdel(struct cmd_client *c, const struct cmd_args *a);
int c_getex(struct cmd_client *c, const struct cmd_args *a);
int c_msetnx(struct cmd_client *c, const struct cmd_args *a);
int c_getrange(struct cmd_client *c, const struct cmd_args *a);
int c_setrange(struct cmd_client *c, const struct cmd_args *a);
int c_incrbyfloat(struct cmd_client *c, const struct cmd_args *a);
/* string_bits.c */
int c_setbit(struct cmd_client *c, const struct cmd_args *a);
int c_getbit(struct cmd_client *c, const struct cmd_args *a);
int c_bitcount(struct cmd_client *c, const struct cmd_args *a);
int c_bitpos(struct cmd_client *c, const struct cmd_args *a);
int c_lcs(struct cmd_client *c, const struct cmd_args *a);
/* expire.c (expiry and TTL) */
int c_expire(struct cmd_client *c, const struct cmd_args *a);
int c_pexpire(struct cmd_client *c, const struct cmd_args *a);
int c_expireat(struct cmd_client *c, const struct cmd_args *a);
int c_pexpireat(struct cmd_client *c, const struct cmd_args *a);
int c_ttl(struct cmd_client *c, const struct cmd_args *a);
int c_pttl(struct cmd_client *c, const struct cmd_args *a);
int c_expiretime(struct cmd_client *c, const struct cmd_args *a);
int c_pexpiretime(struct cmd_client *c, const struct cmd_args *a);
int c_persist(struct cmd_client *c, const struct cmd_args *a);
/* keys.c (SCAN, KEYS, TYPE, RENAME, COPY, OBJECT, ...) */
struct kvt_state;
struct kvt_change;
/* kvt_apply_fn that only reads whether a key exists and its type (TYPE, and SCAN's
 * check of a key the data file listed). */
struct cmd_peek {
    int exists, type;
};
int64_t cmd_peek_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch);
int c_type(struct cmd_client *c, const struct cmd_args *a);
int c_rename(struct cmd_client *c, const struct cmd_args *a);
int c_renamenx(struct cmd_client *c, const struct cmd_args *a);
int c_copy(struct cmd_client *c, const struct cmd_args *a);
int c_object(struct cmd_client *c, const struct cmd_args *a);
/* scan.c (iterating the keyspace, memory and data file) */
int c_scan(struct cmd_client *c, const struct cmd_args *a);
int c_keys(struct cmd_client *c, const struct cmd_args *a);
int c_randomkey(struct cmd_client *c, const struct cmd_args *a);
/* xentry.c (streams) */
int c_xadd(struct cmd_client *c, const struct cmd_args *a);
/* The UDP front end's framed operations (frontend/udpfront.h), internal commands:
 * xadd-batch KEY FIELD V1 .. Vk appends k entries of one field with consecutive
 * IDs in one change; xpull KEY NO (8 bytes, big-endian) answers a batch pull. */
int c_xadd_batch(struct cmd_client *c, const struct cmd_args *a);
int c_xpull(struct cmd_client *c, const struct cmd_args *a);
int c_xtrim(struct cmd_client *c, const struct cmd_args *a);
int c_xlen(struct cmd_client *c, const struct cmd_args *a);
int c_xrange(struct cmd_client *c, const struct cmd_args *a);
int c_xrevrange(struct cmd_client *c, const struct cmd_args *a);
int c_xdel(struct cmd_client *c, const struct cmd_args *a);
int c_xsetid(struct cmd_client *c, const struct cmd_args *a);
/* block.c: a blocking read's wait. cmd_block_of: the wait of this request when it
 * runs again after one (its IDs as its first run resolved them), else NULL; the
 * wait's flag is lowered first, so a write while it looks wakes it again.
 * cmd_can_block: not inside EXEC, not a datagram. cmd_block_wait: stall the
 * request until one of the nkeys keys at argv[first..] is written or block_ms
 * pass (0: no end); ids are kept for the next run. 0 or -ENOMEM.
 * cmd_block_expired: its time is up. cmd_stream_signal: key was written, its
 * waiters may run. */
struct cmd_block {
    int nkeys;
    struct xs_id *ids;
    int64_t deadline_ms;     /* CLOCK_MONOTONIC ms, INT64_MAX: none */
    _Atomic int ready;
    int own_fd;              /* a blocking front end's eventfd, else -1 */
    struct kw_entry *entries;
    char *keys;              /* the keys' bytes, which entries point into */
};
struct xs_id;
struct cmd_block *cmd_block_of(struct cmd_client *c, const struct cmd_args *a);
int cmd_can_block(struct cmd_client *c);
int cmd_block_wait(struct cmd_client *c, const struct cmd_args *a, int first, int nkeys, const struct xs_id *ids,
                   long long block_ms);
int cmd_block_expired(const struct cmd_block *b);
void cmd_stream_signal(struct cmd_client *c, const char *key, size_t klen);
/* xread.c */
int c_xread(struct cmd_client *c, const struct cmd_args *a);
int c_xreadgroup(struct cmd_client *c, const struct cmd_args *a);
int c_xinfo(struct cmd_client *c, const struct cmd_args *a);
/* xgroup.c */
int c_xgroup(struct cmd_client *c, const struct cmd_args *a);
int c_xack(struct cmd_client *c, const struct cmd_args *a);
int c_xpending(struct cmd_client *c, const struct cmd_args *a);
int c_xclaim(struct cmd_client *c, const struct cmd_args *a);
int c_xautoclaim(struct cmd_client *c, const struct cmd_args *a);
/* hash.c */
int c_hset(struct cmd_client *c, const struct cmd_args *a);
int c_hsetnx(struct cmd_client *c, const struct cmd_args *a);
int c_hmset(struct cmd_client *c, const struct cmd_args *a);
int c_hget(struct cmd_client *c, const struct cmd_args *a);
int c_hmget(struct cmd_client *c, const struct cmd_args *a);
int c_hgetall(struct cmd_client *c, const struct cmd_args *a);
int c_hkeys(struct cmd_client *c, const struct cmd_args *a);
int c_hvals(struct cmd_client *c, const struct cmd_args *a);
int c_hdel(struct cmd_client *c, const struct cmd_args *a);
int c_hexists(struct cmd_client *c, const struct cmd_args *a);
int c_hlen(struct cmd_client *c, const struct cmd_args *a);
int c_hstrlen(struct cmd_client *c, const struct cmd_args *a);
int c_hincrby(struct cmd_client *c, const struct cmd_args *a);
int c_hincrbyfloat(struct cmd_client *c, const struct cmd_args *a);
int c_hrandfield(struct cmd_client *c, const struct cmd_args *a);
int c_hscan(struct cmd_client *c, const struct cmd_args *a);
/* multi.c (MULTI, EXEC, DISCARD, WATCH, UNWATCH) */
/* dispatch.c: the key arguments of d called with argc arguments, [*first, *last] by d's
 * step (movable keys not included: those of XREAD/XREADGROUP are found by parsing). 0 if
 * it names none. */
int cmd_key_range(const struct cmd_def *d, int argc, int *first, int *last);
/* scan.c: the keys (in memory and in the data file) that hash to a cluster slot:
 * at most max of them replied (stalling for the data file's listings as KEYS does),
 * or with max < 0 their number. */
int cmd_keys_in_slot(struct cmd_client *c, int slot, long long max);
/* cluster.c */
int c_cluster(struct cmd_client *c, const struct cmd_args *a);
int c_asking(struct cmd_client *c, const struct cmd_args *a);
int c_readmode(struct cmd_client *c, const struct cmd_args *a);
/* A cluster node's admission of d (admit, with cluster_enabled): 1 if this node
 * serves it; else 0 with the redirection or refusal replied (*rc: its result). */
int cmd_cluster_route(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv,
                      const size_t *argl, int *rc);
int c_multi(struct cmd_client *c, const struct cmd_args *a);
int c_exec(struct cmd_client *c, const struct cmd_args *a);
int c_discard(struct cmd_client *c, const struct cmd_args *a);
int c_watch(struct cmd_client *c, const struct cmd_args *a);
int c_unwatch(struct cmd_client *c, const struct cmd_args *a);
/* Between MULTI and EXEC: commands are queued (cmd_multi_queue) instead of run. */
int cmd_in_multi(const struct cmd_client *c);
/* A command was refused while queueing: EXEC will abort (no-op outside MULTI). */
void cmd_multi_flag(struct cmd_client *c);
/* End the transaction, if one is open, and forget the watched keys. */
void cmd_multi_discard(struct cmd_client *c);
int cmd_multi_queue(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv, const size_t *argl);
/* client.c (CLIENT, MONITOR) */
int c_client(struct cmd_client *c, const struct cmd_args *a);
int c_monitor(struct cmd_client *c, const struct cmd_args *a);
/* Callers of these *_locked hold the engine's clients_lock. */
/* Disconnect c (another client): shutdown() its socket; its owner sees end of
 * stream, leaves the registry and closes it. The lock keeps the fd c's meanwhile. */
void cmd_client_drop_locked(struct cmd_client *c);
/* cmd_client_full_name: Redis's name of command d as run with argv ("client|list");
 * NULL for a container's unknown subcommand. */
int cmd_client_is_admin(const char *full_name);
/* monitor.c: c leaves MONITOR mode; bytes queued to c's monitor not yet taken. */
void cmd_monitor_end_locked(struct cmd_client *c);
size_t cmd_monitor_queued_locked(const struct cmd_client *c);
/* CLIENT SETNAME and HELLO SETNAME: 1, or 0 with the error replied. */
int cmd_client_setname(struct cmd_client *c, const char *s, size_t n);
/* cmd_dispatch, right after the lookup: the request's command (d NULL: unknown) for
 * CLIENT LIST's cmd field; not for the commands EXEC runs (Redis shows "exec").
 * Inline and a handful of instructions: only a possible container command (arity
 * -1 or -2 with a subcommand) looks its full name up. */
const char *cmd_client_full_name(const struct cmd_def *d, int argc, const char **argv, const size_t *argl);
static inline void cmd_client_note(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv,
                                   const size_t *argl)
{
    if (c->top != CMD_TOP_NEXT) {
        c->top = CMD_TOP_NESTED; /* EXEC runs it (or a caller other than ses_run) */
        return;
    }
    c->top = CMD_TOP_RUNNING;
    const char *full = d ? d->name : NULL;
    if (d && argc >= 2 && (d->arity == -2 || d->arity == -1))
        full = cmd_client_full_name(d, argc, argv, argl);
    atomic_store_explicit(&c->lastcmd, full, memory_order_relaxed);
}
/* cmd_dispatch, after the handler ran d: MONITOR's feed. Zero cost while nobody
 * monitors: one relaxed load of e->nmonitors (engine/engine.h); a monitor that
 * attaches meanwhile misses at most the commands running as it does. */
void cmd_monitor_feed(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv, const size_t *argl);
#define CMD_MONITOR_FEED(c, d, argc, argv, argl)                                                                  \
    do {                                                                                                          \
        if (__builtin_expect(atomic_load_explicit(&(c)->eng->nmonitors, memory_order_relaxed) != 0, 0))           \
            cmd_monitor_feed(c, d, argc, argv, argl);                                                             \
    } while (0)
/* ops.c (SLOWLOG, LATENCY, MEMORY) */
int c_slowlog(struct cmd_client *c, const struct cmd_args *a);
int c_latency(struct cmd_client *c, const struct cmd_args *a);
int c_memory(struct cmd_client *c, const struct cmd_args *a);
/* stats.c (the statistics every request feeds, and their INFO lines) */
/* The command table's entry i, NULL past the last (dispatch.c). */
const struct cmd_def *cmd_def_at(int i);
/* The clock requests are timed with (ns, monotonic). */
uint64_t cmd_stats_clock(void);
/* Command cmd (its table index) ran for ns and its reply starts at out offset at:
 * count it (or, stalled, remember its time until it runs again), its error,
 * and put it in the slow log and the latency monitor if it was that slow. */
void cmd_stats_ran(struct cmd_client *c, int cmd, uint64_t ns, size_t at, int argc, const char **argv,
                   const size_t *argl);
/* A request answered without running (cmd -1: unknown; rejected: refused for arity or
 * AUTH, counted on the command; else queued by MULTI): count its error, if any. */
void cmd_stats_refused(struct cmd_client *c, int cmd, int rejected, size_t at, int argc, const char **argv,
                       const size_t *argl);
/* INFO lines the command layer adds to a section (after the engine's providers). */
/* config.c */
int c_config(struct cmd_client *c, const struct cmd_args *a);
/* dispatch.c */
int c_command(struct cmd_client *c, const struct cmd_args *a);
/* info.c: the INFO reply for sections argv[0..argc) (all when argc == 0) */
int cmd_info(struct cmd_client *c, int argc, const char **argv, const size_t *argl);

#endif
