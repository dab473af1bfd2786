/* dispatch.c - the command table, COMMAND, and cmd_dispatch (see cmd.h); the
 * helpers every handler shares. One table of {name, arity, flags, handler};
 * lookup is case-insensitive. Error texts follow Redis 7.0 so clients and tools
 * behave the same. Runs on front-end threads; all arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/table.h"
#include "durability/bosc.h"
#include "engine/engine.h"
#include "engine/loading.h"

static inline int tolower_ascii(int ch) { return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch; }

/* Redis's string2ll on an argument. */
int cmd_arg_ll(const struct cmd_args *a, int i, long long *v)
{
    char tmp[24];
    size_t n = a->argl[i];
    if (n == 0 || n >= sizeof tmp)
        return -EINVAL;
    memcpy(tmp, a->argv[i], n);
    tmp[n] = 0;
    if (!(tmp[0] == '-' || (tmp[0] >= '0' && tmp[0] <= '9')))
        return -EINVAL;
    if (n > 1 && (tmp[0] == '0' || (tmp[0] == '-' && tmp[1] == '0')))
        return -EINVAL;
    if (n == 1 && tmp[0] == '-')
        return -EINVAL;
    char *end;
    errno = 0;
    long long x = strtoll(tmp, &end, 10);
    if (errno || end != tmp + n) /* also a NUL inside the argument */
        return -EINVAL;
    *v = x;
    return 0;
}

int64_t cmd_unix_ms(void) { return kvt_now_ms(); }

void cmd_add_bulk_cb(void *arg, const char *v, size_t n)
{
    struct cmd_client *c = arg;
    if (resp_add_bulk(c->out, v, n))
        c->close_after_reply = 1; /* could not queue the reply: drop the client */
}

int cmd_unknown_sub(struct cmd_client *c, const struct cmd_args *a, const char *cmd)
{
    return resp_add_errorf(c->out, "ERR unknown subcommand '%.*s'. Try %s HELP.",
                           (int)(a->argl[1] > 128 ? 128 : a->argl[1]), a->argv[1], cmd);
}

int cmd_reply_help(struct cmd_client *c, const char *const *lines, int n)
{
    int rc = resp_add_array(c->out, n);
    for (int i = 0; i < n && !rc; i++)
        rc = resp_add_status(c->out, lines[i]);
    return rc;
}

int cmd_sub_arity(struct cmd_client *c, const struct cmd_args *a, int want, const char *full)
{
    if ((want > 0 && a->argc != want) || (want < 0 && a->argc < -want)) {
        resp_add_errorf(c->out, "ERR wrong number of arguments for '%s' command", full);
        return 0;
    }
    return 1;
}

/* ---- strings */

/* The key is not in memory but may be in its data-file block: wait for it to
 * be loaded (or report the damage that keeps it from loading). */
int cmd_need_load(struct cmd_client *c, const char *key, size_t klen)
{
    struct bosc *b = c->eng->bosc;
    if (!b)
        return cmd_reply_err(c, "ERR internal: key not resident without a data file");
    if (bosc_failed(b))
        return resp_add_errorf(c->out, "ERR %s", bosc_error(b));
    c->stall = CMD_STALL_LOAD;
    c->stall_key = key;
    c->stall_klen = klen;
    return 0;
}

/* With a data file a write that finds memory full waits for the flusher to
 * evict clean records (paper 000's NHD case), unless waiting cannot help: the
 * request alone needs a large share of the bound, or nothing is left to evict. */
int cmd_wait_for_memory(struct cmd_client *c, size_t need)
{
    uint64_t max = kvt_max_memory(c->table);
    if (!c->eng->bosc || !max || need > max / 4 || kvt_spill_stuck(c->table))
        return 0;
    c->stall = CMD_STALL_MEM;
    return 1;
}

/* Errors of a write to key (argument 1 unless given). */
int cmd_write_err_key(struct cmd_client *c, int64_t rc, const char *key, size_t klen, size_t need)
{
    if (rc == -ENODATA)
        return cmd_need_load(c, key, klen);
    if (rc == -ENOMEM && cmd_wait_for_memory(c, need))
        return 0;
    return cmd_reply_write_err(c, rc);
}

int cmd_reply_write_err(struct cmd_client *c, int64_t rc)
{
    if (rc == -ENOMEM)
        return cmd_reply_err(c, ERR_OOM);
    if (rc == -E2BIG)
        return cmd_reply_err(c, ERR_BIG);
    if (rc == -EAGAIN)
        return cmd_reply_err(c, "ERR durability log backlog full (the disk cannot keep up), write refused: retry");
    char msg[300];
    if (rc == -EIO && eng_disk_refusal(c->eng, msg, sizeof msg)) /* the disk: retried, writes resume */
        return cmd_reply_err(c, msg);
    if (rc == -EIO)
        return cmd_reply_err(c, "ERR durability log failed (I/O error, see the server's log): writes refused "
                            "until restart");
    if (rc == -EDEADLK)
        return cmd_reply_err(c, "ERR FLUSHALL inside MULTI/EXEC is not supported with a data file: run it on its own");
    return resp_add_errorf(c->out, "ERR %s", strerror((int)-rc));
}

static const struct cmd_def commands[] = {
    {"get", 2, F_READONLY | F_FAST, 1, 1, 1, c_get, "string", "Returns the string value of a key.", "1.0.0"},
    {"set", -3, F_WRITE | F_DENYOOM, 1, 1, 1, c_set, "string", "Sets the string value of a key, ignoring its type.", "1.0.0"},
    {"mget", -2, F_READONLY | F_FAST, 1, -1, 1, c_mget, "string", "Atomically returns the string values of one or more keys.", "1.0.0"},
    {"mset", -3, F_WRITE | F_DENYOOM, 1, -1, 2, c_mset, "string", "Creates or modifies the string values of one or more keys.", "1.0.1"},
    {"del", -2, F_WRITE, 1, -1, 1, c_del, "generic", "Deletes one or more keys.", "1.0.0"},
    {"exists", -2, F_READONLY | F_FAST, 1, -1, 1, c_exists, "generic", "Determines whether one or more keys exist.", "1.0.0"},
    {"incr", 2, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_incr, "string", "Increments the integer value of a key by one.", "1.0.0"},
    {"decr", 2, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_decr, "string", "Decrements the integer value of a key by one.", "1.0.0"},
    {"incrby", 3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_incrby, "string", "Increments the integer value of a key by a number.", "1.0.0"},
    {"decrby", 3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_decrby, "string", "Decrements a number from the integer value of a key.", "1.0.0"},
    {"append", 3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_append, "string", "Appends a string to the value of a key.", "2.0.0"},
    {"strlen", 2, F_READONLY | F_FAST, 1, 1, 1, c_strlen, "string", "Returns the length of a string value.", "2.2.0"},
    /* string_ext.c */
    {"setnx", 3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_setnx, "string", "Set the value of a key, only if the key does not exist", "1.0.0"},
    {"setex", 4, F_WRITE | F_DENYOOM, 1, 1, 1, c_setex, "string", "Set the value and expiration of a key", "2.0.0"},
    {"psetex", 4, F_WRITE | F_DENYOOM, 1, 1, 1, c_psetex, "string", "Set the value and expiration in milliseconds of a key", "2.6.0"},
    {"getset", 3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_getset, "string", "Set the string value of a key and return its old value", "1.0.0"},
    {"getdel", 2, F_WRITE | F_FAST, 1, 1, 1, c_getdel, "string", "Get the value of a key and delete the key", "6.2.0"},
    {"getex", -2, F_WRITE | F_FAST, 1, 1, 1, c_getex, "string", "Get the value of a key and optionally set its expiration", "6.2.0"},
    {"msetnx", -3, F_WRITE | F_DENYOOM, 1, -1, 2, c_msetnx, "string", "Set multiple keys to multiple values, only if none of the keys exist", "1.0.1"},
    {"getrange", 4, F_READONLY, 1, 1, 1, c_getrange, "string", "Get a substring of the string stored at a key", "2.4.0"},
    {"substr", 4, F_READONLY, 1, 1, 1, c_getrange, "string", "Get a substring of the string stored at a key", "1.0.0"},
    {"setrange", 4, F_WRITE | F_DENYOOM, 1, 1, 1, c_setrange, "string", "Overwrite part of a string at key starting at the specified offset", "2.2.0"},
    {"incrbyfloat", 3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_incrbyfloat, "string", "Increment the float value of a key by the given amount", "2.6.0"},
    {"lcs", -3, F_READONLY, 1, 2, 1, c_lcs, "string", "Find longest common substring", "7.0.0"},
    {"setbit", 4, F_WRITE | F_DENYOOM, 1, 1, 1, c_setbit, "bitmap", "Sets or clears the bit at offset in the string value stored at key", "2.2.0"},
    {"getbit", 3, F_READONLY | F_FAST, 1, 1, 1, c_getbit, "bitmap", "Returns the bit value at offset in the string value stored at key", "2.2.0"},
    {"bitcount", -2, F_READONLY, 1, 1, 1, c_bitcount, "bitmap", "Count set bits in a string", "2.6.0"},
    {"bitpos", -3, F_READONLY, 1, 1, 1, c_bitpos, "bitmap", "Find first bit set or clear in a string", "2.8.7"},
    /* expire.c */
    {"expire", -3, F_WRITE | F_FAST, 1, 1, 1, c_expire, "generic", "Sets the expiration time of a key in seconds.", "1.0.0"},
    {"pexpire", -3, F_WRITE | F_FAST, 1, 1, 1, c_pexpire, "generic", "Sets the expiration time of a key in milliseconds.", "2.6.0"},
    {"expireat", -3, F_WRITE | F_FAST, 1, 1, 1, c_expireat, "generic", "Sets the expiration time of a key to a Unix timestamp.", "1.2.0"},
    {"pexpireat", -3, F_WRITE | F_FAST, 1, 1, 1, c_pexpireat, "generic", "Sets the expiration time of a key to a Unix milliseconds timestamp.", "2.6.0"},
    {"ttl", 2, F_READONLY | F_FAST, 1, 1, 1, c_ttl, "generic", "Returns the expiration time in seconds of a key.", "1.0.0"},
    {"pttl", 2, F_READONLY | F_FAST, 1, 1, 1, c_pttl, "generic", "Returns the expiration time in milliseconds of a key.", "2.6.0"},
    {"expiretime", 2, F_READONLY | F_FAST, 1, 1, 1, c_expiretime, "generic", "Returns the expiration time of a key as a Unix timestamp.", "7.0.0"},
    {"pexpiretime", 2, F_READONLY | F_FAST, 1, 1, 1, c_pexpiretime, "generic", "Returns the expiration time of a key as a Unix milliseconds timestamp.", "7.0.0"},
    {"persist", 2, F_WRITE | F_FAST, 1, 1, 1, c_persist, "generic", "Removes the expiration time of a key.", "2.2.0"},
    /* keys.c */
    {"keys", 2, F_READONLY, 0, 0, 0, c_keys, "generic", "Returns all key names that match a pattern.", "1.0.0"},
    {"scan", -2, F_READONLY, 0, 0, 0, c_scan, "generic", "Iterates over the key names in the database.", "2.8.0"},
    {"randomkey", 1, F_READONLY, 0, 0, 0, c_randomkey, "generic", "Returns a random key name from the database.", "1.0.0"},
    {"type", 2, F_READONLY | F_FAST, 1, 1, 1, c_type, "generic", "Determines the type of value stored at a key.", "1.0.0"},
    {"rename", 3, F_WRITE, 1, 2, 1, c_rename, "generic", "Renames a key and overwrites the destination.", "1.0.0"},
    {"renamenx", 3, F_WRITE | F_FAST, 1, 2, 1, c_renamenx, "generic", "Renames a key only when the target key name doesn't exist.", "1.0.0"},
    {"copy", -3, F_WRITE | F_DENYOOM, 1, 2, 1, c_copy, "generic", "Copies the value of a key to a new key.", "6.2.0"},
    {"unlink", -2, F_WRITE | F_FAST, 1, -1, 1, c_del, "generic", "Asynchronously deletes one or more keys.", "4.0.0"},
    {"touch", -2, F_READONLY | F_FAST, 1, -1, 1, c_exists, "generic", "Returns the number of existing keys out of those specified after updating the time they were last accessed.", "3.2.1"},
    {"object", -2, F_CONTAINER, 2, 2, 1, c_object, "generic", "A container for object introspection commands.", "2.2.3"},
    /* hash.c */
    {"hset", -4, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_hset, "hash", "Creates or modifies the value of a field in a hash.", "2.0.0"},
    {"hsetnx", 4, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_hsetnx, "hash", "Sets the value of a field in a hash only when the field doesn't exist.", "2.0.0"},
    {"hmset", -4, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_hmset, "hash", "Sets the values of multiple fields.", "2.0.0"},
    {"hget", 3, F_READONLY | F_FAST, 1, 1, 1, c_hget, "hash", "Returns the value of a field in a hash.", "2.0.0"},
    {"hmget", -3, F_READONLY | F_FAST, 1, 1, 1, c_hmget, "hash", "Returns the values of all fields in a hash.", "2.0.0"},
    {"hgetall", 2, F_READONLY, 1, 1, 1, c_hgetall, "hash", "Returns all fields and values in a hash.", "2.0.0"},
    {"hkeys", 2, F_READONLY, 1, 1, 1, c_hkeys, "hash", "Returns all fields in a hash.", "2.0.0"},
    {"hvals", 2, F_READONLY, 1, 1, 1, c_hvals, "hash", "Returns all values in a hash.", "2.0.0"},
    {"hdel", -3, F_WRITE | F_FAST, 1, 1, 1, c_hdel, "hash", "Deletes one or more fields and their values from a hash. Deletes the hash if no fields remain.", "2.0.0"},
    {"hexists", 3, F_READONLY | F_FAST, 1, 1, 1, c_hexists, "hash", "Determines whether a field exists in a hash.", "2.0.0"},
    {"hlen", 2, F_READONLY | F_FAST, 1, 1, 1, c_hlen, "hash", "Returns the number of fields in a hash.", "2.0.0"},
    {"hstrlen", 3, F_READONLY | F_FAST, 1, 1, 1, c_hstrlen, "hash", "Returns the length of the value of a field.", "3.2.0"},
    {"hincrby", 4, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_hincrby, "hash", "Increments the integer value of a field in a hash by a number. Uses 0 as initial value if the field doesn't exist.", "2.0.0"},
    {"hincrbyfloat", 4, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_hincrbyfloat, "hash", "Increments the floating point value of a field by a number. Uses 0 as initial value if the field doesn't exist.", "2.6.0"},
    {"hrandfield", -2, F_READONLY, 1, 1, 1, c_hrandfield, "hash", "Returns one or more random fields from a hash.", "6.2.0"},
    {"hscan", -3, F_READONLY, 1, 1, 1, c_hscan, "hash", "Iterates over fields and values of a hash.", "2.8.0"},
    /* xentry.c (streams) */
    {"xadd", -5, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_xadd, "stream", "Appends a new message to a stream. Creates the key if it doesn't exist.", "5.0.0"},
    {"xtrim", -4, F_WRITE, 1, 1, 1, c_xtrim, "stream", "Deletes messages from the beginning of a stream.", "5.0.0"},
    {"xlen", 2, F_READONLY | F_FAST, 1, 1, 1, c_xlen, "stream", "Return the number of messages in a stream.", "5.0.0"},
    {"xrange", -4, F_READONLY, 1, 1, 1, c_xrange, "stream", "Returns the messages from a stream within a range of IDs.", "5.0.0"},
    {"xrevrange", -4, F_READONLY, 1, 1, 1, c_xrevrange, "stream", "Returns the messages from a stream within a range of IDs in reverse order.", "5.0.0"},
    {"xdel", -3, F_WRITE | F_FAST, 1, 1, 1, c_xdel, "stream", "Returns the number of messages after removing them from a stream.", "5.0.0"},
    {"xsetid", -3, F_WRITE | F_DENYOOM | F_FAST, 1, 1, 1, c_xsetid, "stream", "An internal command for replicating stream values.", "5.0.0"},
    /* xread.c, xinfo.c */
    {"xread", -4, F_READONLY | F_BLOCKING | F_MOVABLEKEYS, 0, 0, 0, c_xread, "stream", "Returns messages from multiple streams with IDs greater than the ones requested. Blocks until a message is available otherwise.", "5.0.0"},
    {"xreadgroup", -7, F_WRITE | F_BLOCKING | F_MOVABLEKEYS, 0, 0, 0, c_xreadgroup, "stream", "Returns new or historical messages from a stream for a consumer in a group. Blocks until a message is available otherwise.", "5.0.0"},
    {"xinfo", -2, F_READONLY | F_CONTAINER, 2, 2, 1, c_xinfo, "stream", "A container for stream introspection commands.", "5.0.0"},
    /* xgroup.c */
    {"xgroup", -2, F_WRITE | F_CONTAINER, 2, 2, 1, c_xgroup, "stream", "A container for consumer groups commands.", "5.0.0"},
    {"xack", -4, F_WRITE | F_FAST, 1, 1, 1, c_xack, "stream", "Returns the number of messages that were successfully acknowledged by the consumer group member of a stream.", "5.0.0"},
    {"xpending", -3, F_READONLY, 1, 1, 1, c_xpending, "stream", "Returns the information and entries from a stream consumer group's pending entries list.", "5.0.0"},
    {"xclaim", -6, F_WRITE | F_FAST, 1, 1, 1, c_xclaim, "stream", "Changes, or acquires, ownership of a message in a consumer group, as if the message was delivered a consumer group member.", "5.0.0"},
    {"xautoclaim", -6, F_WRITE | F_FAST, 1, 1, 1, c_xautoclaim, "stream", "Changes, or acquires, ownership of messages in a consumer group, as if the messages were delivered to as consumer group member.", "6.2.0"},
    /* multi.c */
    {"multi", 1, F_FAST, 0, 0, 0, c_multi, "transactions", "Starts a transaction.", "1.2.0"},
    {"exec", 1, 0, 0, 0, 0, c_exec, "transactions", "Executes all commands in a transaction.", "1.2.0"},
    {"discard", 1, F_FAST, 0, 0, 0, c_discard, "transactions", "Discards a transaction.", "2.0.0"},
    {"watch", -2, F_FAST, 1, -1, 1, c_watch, "transactions", "Monitors changes to keys to determine the execution of a transaction.", "2.2.0"},
    {"unwatch", 1, F_FAST, 0, 0, 0, c_unwatch, "transactions", "Forgets about watched keys of a transaction.", "2.2.0"},
    {"ping", -1, F_FAST, 0, 0, 0, c_ping, "connection", "Returns the server's liveliness response.", "1.0.0"},
    {"echo", 2, F_FAST, 0, 0, 0, c_echo, "connection", "Returns the given string.", "1.0.0"},
    {"quit", -1, F_NOAUTH | F_FAST, 0, 0, 0, c_quit, "connection", "Closes the connection.", "1.0.0"},
    {"auth", -2, F_NOAUTH | F_FAST, 0, 0, 0, c_auth, "connection", "Authenticates the connection.", "1.0.0"},
    {"hello", -1, F_NOAUTH | F_FAST, 0, 0, 0, c_hello, "connection", "Handshakes with the server.", "6.0.0"},
    {"select", 2, F_FAST, 0, 0, 0, c_select, "connection", "Changes the selected database (only 0 exists).", "1.0.0"},
    {"client", -2, 0, 0, 0, 0, c_client, "connection", "A container for client connection commands.", "2.4.0"},
    {"cluster", -2, F_CONTAINER, 0, 0, 0, c_cluster, "cluster", "A container for Redis Cluster commands.", "3.0.0"},
    {"asking", 1, F_FAST, 0, 0, 0, c_asking, "cluster", "Signals that a cluster client is following an -ASK redirect.", "3.0.0"},
    {"readonly", 1, F_FAST, 0, 0, 0, c_readmode, "cluster", "Enables read-only queries for a connection to a Redis Cluster replica node.", "3.0.0"},
    {"readwrite", 1, F_FAST, 0, 0, 0, c_readmode, "cluster", "Enables read-write queries for a connection to a Redis Cluster replica node.", "3.0.0"},
    {"dbsize", 1, F_READONLY | F_FAST, 0, 0, 0, c_dbsize, "server", "Returns the number of keys in the database.", "1.0.0"},
    {"flushall", -1, F_WRITE, 0, 0, 0, c_flushall, "server", "Removes all keys from all databases.", "1.0.0"},
    {"flushdb", -1, F_WRITE, 0, 0, 0, c_flushall, "server", "Remove all keys from the current database.", "1.0.0"},
    {"info", -1, 0, 0, 0, 0, c_info, "server", "Returns information and statistics about the server.", "1.0.0"},
    {"config", -2, 0, 0, 0, 0, c_config, "server", "A container for server configuration commands.", "2.0.0"},
    {"command", -1, 0, 0, 0, 0, c_command, "server", "Returns detailed information about all commands.", "2.8.13"},
    {"time", 1, F_FAST, 0, 0, 0, c_time, "server", "Returns the server time.", "2.6.0"},
    /* client.c (CLIENT, MONITOR) */
    {"monitor", 1, 0, 0, 0, 0, c_monitor, "server", "Listens for all requests received by the server in real-time.", "1.0.0"},
    /* ops.c (SLOWLOG, LATENCY, MEMORY) */
    {"slowlog", -2, 0, 0, 0, 0, c_slowlog, "server", "A container for slow log commands.", "2.2.12"},
    {"latency", -2, 0, 0, 0, 0, c_latency, "server", "A container for latency diagnostics commands.", "2.8.13"},
    {"memory", -2, 0, 0, 0, 0, c_memory, "server", "A container for memory diagnostics commands.", "4.0.0"},
    /* Last, and found only for a front end's own framed requests (cmd_client.internal):
     * the UDP front end's batch append and pull (xentry.c). INFO commandstats counts them. */
    {"xadd-batch", -4, F_WRITE | F_DENYOOM | F_INTERNAL, 1, 1, 1, c_xadd_batch, "stream", "Appends k one-field entries (UDP batch).", "kvstore"},
    {"xpull", 3, F_READONLY | F_INTERNAL, 1, 1, 1, c_xpull, "stream", "Answers a pull of one batch (UDP).", "kvstore"},
};

#define NCOMMANDS (int)(sizeof commands / sizeof commands[0])
#define NINTERNAL 2
#define NPUBLIC (NCOMMANDS - NINTERNAL) /* what COMMAND shows and RESP clients find */

int cmd_count(void) { return NCOMMANDS; }

/* Lookup is a hash of the lower-cased name into an open-addressed index of the
 * table (built once): a request's command costs one hash and one compare, not a
 * scan of the table. Names longer than CMD_NAME_MAX are no command's. */
#define CMD_NAME_MAX 32
#define INDEX_SLOTS 1024 /* a power of two, over 4x the commands */
static uint16_t cmd_index[INDEX_SLOTS]; /* position + 1; 0 = empty */
static pthread_once_t cmd_index_once = PTHREAD_ONCE_INIT;

static uint32_t name_hash(const char *name, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)tolower_ascii((unsigned char)name[i])) * 16777619u;
    return h;
}

static void build_index(void)
{
    _Static_assert(NCOMMANDS * 4 < INDEX_SLOTS && NCOMMANDS < 65535, "cmd_index too small");
    for (int i = 0; i < NCOMMANDS; i++) {
        uint32_t at = name_hash(commands[i].name, strlen(commands[i].name)) & (INDEX_SLOTS - 1);
        while (cmd_index[at])
            at = (at + 1) & (INDEX_SLOTS - 1);
        cmd_index[at] = (uint16_t)(i + 1);
    }
}

static const struct cmd_def *lookup_in(const char *name, size_t n, int internal)
{
    if (n == 0 || n > CMD_NAME_MAX)
        return NULL;
    pthread_once(&cmd_index_once, build_index);
    for (uint32_t at = name_hash(name, n) & (INDEX_SLOTS - 1); cmd_index[at]; at = (at + 1) & (INDEX_SLOTS - 1)) {
        const struct cmd_def *d = &commands[cmd_index[at] - 1];
        if (strnlen(d->name, n + 1) == n && !strncasecmp(d->name, name, n))
            return internal || d - commands < NPUBLIC ? d : NULL;
    }
    return NULL;
}

static const struct cmd_def *lookup(const char *name, size_t n) { return lookup_in(name, n, 0); }

static void add_flags(struct cmd_client *c, int f)
{
    /* in Redis 7's order */
    static const struct { int flag; const char *name; } names[] = {
        {F_WRITE, "write"}, {F_READONLY, "readonly"}, {F_DENYOOM, "denyoom"}, {F_BLOCKING, "blocking"},
        {F_FAST, "fast"}, {F_NOAUTH, "no_auth"}, {F_MOVABLEKEYS, "movablekeys"}};
    int n = 0;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        n += !!(f & names[i].flag);
    resp_add_set(c->out, c->resp, n);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (f & names[i].flag)
            resp_add_status(c->out, names[i].name);
}

/* COMMAND reply entry: name, arity, flags, first key, last key, step, acl categories,
 * tips, key specs, subcommands (Redis 7 layout). */
static void add_info(struct cmd_client *c, const struct cmd_def *d)
{
    resp_add_array(c->out, 10);
    resp_add_bulk_str(c->out, d->name);
    int container = d->flags & F_CONTAINER;
    resp_add_int(c->out, d->arity);
    add_flags(c, container ? 0 : d->flags);
    resp_add_int(c->out, container ? 0 : d->first);
    resp_add_int(c->out, container ? 0 : d->last);
    resp_add_int(c->out, container ? 0 : d->step);
    resp_add_array(c->out, 0);
    resp_add_array(c->out, 0);
    resp_add_array(c->out, 0);
    resp_add_array(c->out, 0);
}

static void add_docs(struct cmd_client *c, const struct cmd_def *d)
{
    resp_add_bulk_str(c->out, d->name);
    resp_add_map(c->out, c->resp, 3);
    resp_add_bulk_str(c->out, "summary");
    resp_add_bulk_str(c->out, d->summary);
    resp_add_bulk_str(c->out, "since");
    resp_add_bulk_str(c->out, d->since);
    resp_add_bulk_str(c->out, "group");
    resp_add_bulk_str(c->out, d->group);
}

int c_command(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc == 1) {
        resp_add_array(c->out, NPUBLIC);
        for (int i = 0; i < NPUBLIC; i++)
            add_info(c, &commands[i]);
        return 0;
    }
    if (ARGIS(a, 1, "COUNT"))
        return cmd_sub_arity(c, a, 2, "command|count") ? resp_add_int(c->out, NPUBLIC) : 0;
    if (ARGIS(a, 1, "INFO")) {
        if (a->argc == 2) {
            resp_add_array(c->out, NPUBLIC);
            for (int i = 0; i < NPUBLIC; i++)
                add_info(c, &commands[i]);
            return 0;
        }
        resp_add_array(c->out, a->argc - 2);
        for (int i = 2; i < a->argc; i++) {
            const struct cmd_def *d = lookup(a->argv[i], a->argl[i]);
            if (d)
                add_info(c, d);
            else
                resp_add_null(c->out, c->resp);
        }
        return 0;
    }
    if (ARGIS(a, 1, "DOCS")) {
        if (a->argc == 2) {
            resp_add_map(c->out, c->resp, NPUBLIC);
            for (int i = 0; i < NPUBLIC; i++)
                add_docs(c, &commands[i]);
            return 0;
        }
        int n = 0;
        for (int i = 2; i < a->argc; i++)
            n += lookup(a->argv[i], a->argl[i]) != NULL;
        resp_add_map(c->out, c->resp, n);
        for (int i = 2; i < a->argc; i++) {
            const struct cmd_def *d = lookup(a->argv[i], a->argl[i]);
            if (d)
                add_docs(c, d);
        }
        return 0;
    }
    if (ARGIS(a, 1, "LIST")) {
        resp_add_array(c->out, NPUBLIC);
        for (int i = 0; i < NPUBLIC; i++)
            resp_add_bulk_str(c->out, commands[i].name);
        return 0;
    }
    return cmd_unknown_sub(c, a, "COMMAND");
}

const struct cmd_def *cmd_def_at(int i) { return i >= 0 && i < NCOMMANDS ? &commands[i] : NULL; }

/* While the node waits for its state (engine/loading.h): the commands Redis 7
 * flags "loading" (connection, introspection, configuration, transactions'
 * framing); every command that reads or writes keys is refused, and so is PING,
 * as Redis does: a health check sees a node that is up but not ready. */
static int allowed_while_loading(const struct cmd_def *d)
{
    static const cmd_fn ok[] = {c_quit, c_auth, c_hello, c_select, c_client, c_info, c_config, c_command,
                                c_time, c_monitor, c_slowlog, c_latency, c_multi, c_exec, c_discard, c_watch, c_unwatch};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (d->fn == ok[i])
            return 1;
    return 0;
}

/* What comes before a handler: 1 to run d; 0 when the request is answered
 * already (*rc): an unknown command, one refused (*rejected: arity, NOAUTH,
 * LOADING), or queued by MULTI. */
static int admit(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv, const size_t *argl,
                 int *rejected, int *rc)
{
    cmd_client_note(c, d, argc, argv, argl); /* CLIENT LIST's cmd (client.c) */
    if (!d) {
        /* Redis: "unknown command '<name>', with args beginning with: '<a1>' '<a2>' "
         * where the argument list stops once it reaches 128 bytes. */
        char args[300];
        size_t len = 0;
        args[0] = 0;
        for (int i = 1; i < argc && len < 128; i++) {
            int room = 128 - (int)len;
            int n = snprintf(args + len, sizeof args - len, "'%.*s' ",
                             (int)argl[i] < room ? (int)argl[i] : room, argv[i]);
            if (n < 0)
                break;
            len += (size_t)n;
        }
        cmd_multi_flag(c);
        *rc = resp_add_errorf(c->out, "ERR unknown command '%.*s', with args beginning with: %s",
                              (int)(argl[0] > 128 ? 128 : argl[0]), argv[0], args);
        return 0;
    }
    *rejected = 1;
    if ((d->arity > 0 && argc != d->arity) || (d->arity < 0 && argc < -d->arity)) {
        if (d->fn == c_exec) { /* as Redis: a refused EXEC ends the transaction */
            cmd_multi_discard(c);
            *rc = cmd_reply_err(c, "EXECABORT Transaction discarded because of: wrong number of arguments "
                                   "for 'exec' command");
            return 0;
        }
        cmd_multi_flag(c);
        *rc = resp_add_errorf(c->out, "ERR wrong number of arguments for '%s' command", d->name);
        return 0;
    }
    if (!c->authenticated && !(d->flags & F_NOAUTH)) {
        *rc = cmd_reply_err(c, "NOAUTH Authentication required.");
        return 0;
    }
    /* acquire: pairs with eng_attach's release, so a command admitted after the
     * wait sees the log and the data file it attached */
    if (atomic_load_explicit(&c->eng->loading, memory_order_acquire) && !allowed_while_loading(d)) {
        char msg[ENG_LOADING_TEXT + 160];
        eng_loading_error(c->eng, msg, sizeof msg);
        cmd_multi_flag(c); /* as Redis: a refused command inside MULTI makes EXEC fail */
        *rc = cmd_reply_err(c, msg);
        return 0;
    }
    /* As Redis: write commands are refused while the disk refuses the log or
     * the data file (inside MULTI too: the transaction is flagged), and so is
     * PING, so that a health check sees the node cannot take writes; reads and
     * INFO (persistence says what is wrong) still answer. */
    char derr[300];
    if ((d->flags & F_WRITE || d->fn == c_ping) && eng_disk_refusal(c->eng, derr, sizeof derr)) {
        cmd_multi_flag(c);
        *rc = cmd_reply_err(c, derr);
        return 0;
    }
    /* A cluster node serves the keys of its own slots (before MULTI queues: as Redis,
     * a redirected command inside MULTI makes EXEC fail) */
    if (c->eng->cfg.cluster_enabled && !c->internal && !cmd_cluster_route(c, d, argc, argv, argl, rc)) {
        cmd_multi_flag(c);
        return 0;
    }
    *rejected = 0;
    /* As Redis: inside MULTI everything queues but the transaction's own commands and QUIT. */
    if (cmd_in_multi(c) && d->fn != c_exec && d->fn != c_discard && d->fn != c_multi && d->fn != c_watch &&
        d->fn != c_quit) {
        *rc = cmd_multi_queue(c, d, argc, argv, argl);
        return 0;
    }
    return 1;
}

int cmd_key_range(const struct cmd_def *d, int argc, int *first, int *last)
{
    if (!d->first || d->first >= argc)
        return 0;
    *first = d->first;
    *last = d->last >= 0 ? d->last : argc + d->last;
    if (*last >= argc)
        *last = argc - 1;
    return *last >= *first;
}

/* Statistics (cmd/stats.c) see every request: its time is the handler's alone
 * (two reads of the monotonic clock), so parsing, queueing and waiting for the
 * log are not in it, as in Redis's call(). */
int cmd_dispatch(struct cmd_client *c, int argc, const char **argv, const size_t *argl)
{
    const struct cmd_def *d = lookup_in(argv[0], argl[0], c->internal);
    size_t at = c->out->len;
    int rejected = 0, rc = 0;
    if (!admit(c, d, argc, argv, argl, &rejected, &rc)) {
        cmd_stats_refused(c, d ? (int)(d - commands) : -1, rejected, at, argc, argv, argl);
        return rc;
    }
    struct cmd_args a = {argc, argv, argl};
    uint64_t t0 = cmd_stats_clock();
    rc = d->fn(c, &a);
    cmd_stats_ran(c, (int)(d - commands), cmd_stats_clock() - t0, at, argc, argv, argl);
    CMD_MONITOR_FEED(c, d, argc, argv, argl); /* MONITOR (monitor.c): one relaxed load while nobody monitors */
    return rc;
}
