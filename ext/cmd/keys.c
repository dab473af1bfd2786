/* keys.c - commands on one key of any type or two keys at once: TYPE, RENAME,
 * RENAMENX, COPY, OBJECT (ENCODING, REFCOUNT, FREQ, IDLETIME, HELP), with Redis
 * 7.0's replies and error texts. RENAME, RENAMENX and COPY run inside a table
 * transaction (kvt_tx_begin: every shard locked by this thread), so they are
 * atomic and isolated and their writes are one unit of the log; a key they need
 * that left memory ends the transaction and stalls the request until it is
 * loaded (it then runs again from the start). Runs on front-end threads;
 * arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include "core/stream.h"
#include "core/table.h"

/* ---- TYPE */

int64_t cmd_peek_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct cmd_peek *p = arg;
    p->exists = cur->exists;
    p->type = cur->type;
    return 0;
}

int c_type(struct cmd_client *c, const struct cmd_args *a)
{
    struct cmd_peek p = {0, 0};
    int64_t rc = kvt_apply(c->table, a->argv[1], a->argl[1], cmd_peek_fn, &p);
    if (rc < 0) /* a read: -ENODATA (load the key) is the only error */
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], 0);
    return resp_add_status(c->out, !p.exists                ? "none"
                                   : p.type == KVT_HASH     ? "hash"
                                   : p.type == KVT_STREAM   ? "stream"
                                                            : "string");
}

/* ---- RENAME, RENAMENX, COPY */

/* The source key's whole state, copied out under its shard lock (the state's
 * value is valid only during the call). A stream is copied whole: its batches
 * out of memory come back first, as long as they take at most half of
 * --max-memory (max_gone batches). */
struct key_copy {
    int exists, type;
    int64_t expire_ms;
    struct kvbuf val;
    uint64_t max_gone;
};

static int64_t copy_out_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct key_copy *k = arg;
    k->exists = cur->exists;
    if (!cur->exists)
        return 0;
    k->type = cur->type;
    k->expire_ms = cur->expire_ms;
    k->val.len = 0;
    if (cur->type == KVT_STREAM) { /* its bytes: the destination decodes its own copy */
        if (cur->stream->ngone > k->max_gone)
            return -EFBIG;
        return xs_encode(cur->stream, &k->val); /* (batches out of memory: read back first, -ENODATA) */
    }
    return cur->vlen ? kvbuf_append(&k->val, cur->val, cur->vlen) : 0;
}

struct put_op {
    const struct key_copy *src;
    int nx; /* only if the destination does not exist */
};

/* The destination gets the source's value, type and expire time (Redis keeps
 * the TTL on RENAME and COPY). 1 written, 0 refused by nx. */
static int64_t put_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    const struct put_op *op = arg;
    if (op->nx && cur->exists)
        return 0;
    ch->action = KVT_PUT;
    ch->type = op->src->type;
    ch->val = op->src->val.p;
    ch->n1 = op->src->val.len;
    ch->expire_ms = op->src->expire_ms;
    return 1;
}

/* How a two-key command ended inside its transaction, replied after it. */
enum { MV_ERR, MV_NOKEY, MV_INT, MV_OK };
struct mv_result {
    int kind;
    int64_t v;             /* MV_INT: the integer; MV_ERR: the table's -errno */
    const char *key;       /* MV_ERR with -ENODATA or -ENOMEM: the key that needs it */
    size_t klen;
};

/* Copy (del_src = 0) or move src to dst (argv[1] -> argv[2]), under a transaction
 * the caller holds. nx: not over an existing dst. */
static void move_in_tx(struct cmd_client *c, const struct cmd_args *a, int nx, int del_src, int same_is_ok,
                       struct key_copy *src, struct mv_result *r)
{
    const char *s = a->argv[1], *d = a->argv[2];
    size_t sl = a->argl[1], dl = a->argl[2];
    int64_t rc = kvt_apply(c->table, s, sl, copy_out_fn, src);
    if (rc < 0) {
        *r = (struct mv_result){MV_ERR, rc, s, sl};
        return;
    }
    if (!src->exists) {
        *r = (struct mv_result){del_src ? MV_NOKEY : MV_INT, 0, NULL, 0};
        return;
    }
    if (same_is_ok && sl == dl && !memcmp(s, d, sl)) { /* RENAME k k: nothing to do */
        *r = (struct mv_result){nx ? MV_INT : MV_OK, 0, NULL, 0};
        return;
    }
    struct put_op op = {src, nx};
    rc = kvt_apply(c->table, d, dl, put_fn, &op);
    if (rc < 0) {
        *r = (struct mv_result){MV_ERR, rc, d, dl};
        return;
    }
    if (rc == 0) { /* nx and dst exists */
        *r = (struct mv_result){MV_INT, 0, NULL, 0};
        return;
    }
    if (del_src) {
        /* src is in memory (read above; nothing can evict it while every shard is
         * held), so this cannot stall; it fails only if the log refuses it. */
        int d_rc = kvt_del(c->table, s, sl);
        if (d_rc < 0) {
            *r = (struct mv_result){MV_ERR, d_rc, NULL, 0};
            return;
        }
    }
    *r = (struct mv_result){nx || !del_src ? MV_INT : MV_OK, 1, NULL, 0};
}

/* Run move_in_tx inside a transaction (its own, unless the caller's EXEC holds
 * one already) and reply. */
static int move_generic(struct cmd_client *c, const struct cmd_args *a, int nx, int del_src, int same_is_ok)
{
    int own = !kvt_tx_held;
    if (own) {
        int rc = kvt_tx_begin(c->table);
        if (rc < 0)
            return cmd_reply_write_err(c, rc);
    }
    uint64_t max = kvt_max_memory(c->table);
    struct key_copy src = {.max_gone = max ? max / 2 / XS_BATCH_BYTES : UINT64_MAX};
    struct mv_result r;
    move_in_tx(c, a, nx, del_src, same_is_ok, &src, &r);
    int64_t end = own ? kvt_tx_end(c->table) : 0;
    size_t vlen = src.val.len;
    kvbuf_free(&src.val);
    if (r.kind == MV_ERR && r.v == -EFBIG)
        return cmd_reply_err(c, "ERR the stream is too large to copy or rename: its batches out of memory would "
                                "take more than half of --max-memory to read back");
    if (r.kind == MV_ERR)
        return r.key ? cmd_write_err_key(c, r.v, r.key, r.klen, r.klen + vlen + 64) : cmd_reply_write_err(c, r.v);
    if (end < 0) /* the log refused to close the unit: recovery drops it, so must the client */
        return cmd_reply_write_err(c, end);
    switch (r.kind) {
    case MV_NOKEY:
        return cmd_reply_err(c, "ERR no such key");
    case MV_OK:
        return cmd_reply_ok(c);
    default:
        return resp_add_int(c->out, r.v);
    }
}

int c_rename(struct cmd_client *c, const struct cmd_args *a) { return move_generic(c, a, 0, 1, 1); }

int c_renamenx(struct cmd_client *c, const struct cmd_args *a) { return move_generic(c, a, 1, 1, 1); }

/* Redis's getRangeLongFromObjectOrReply(INT_MIN, INT_MAX) on argument i. */
static int arg_int(struct cmd_client *c, const struct cmd_args *a, int i, long long *v)
{
    if (cmd_arg_ll(a, i, v)) {
        cmd_reply_err(c, ERR_INT);
        return -1;
    }
    if (*v < INT_MIN || *v > INT_MAX) {
        resp_add_errorf(c->out, "ERR value is out of range, value must between %d and %d", INT_MIN, INT_MAX);
        return -1;
    }
    return 0;
}

/* COPY source destination [DB destination-db] [REPLACE]. kvstore has one
 * database: DB 0 is accepted, any other index gets Redis's answer for a database
 * that does not exist (as redis-server with `databases 1`). */
int c_copy(struct cmd_client *c, const struct cmd_args *a)
{
    int replace = 0;
    for (int i = 3; i < a->argc; i++) {
        if (ARGIS(a, i, "REPLACE")) {
            replace = 1;
        } else if (ARGIS(a, i, "DB") && i + 1 < a->argc) {
            long long db;
            if (arg_int(c, a, ++i, &db))
                return 0;
            if (db != 0)
                return cmd_reply_err(c, "ERR DB index is out of range");
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    if (a->argl[1] == a->argl[2] && !memcmp(a->argv[1], a->argv[2], a->argl[1]))
        return cmd_reply_err(c, "ERR source and destination objects are the same");
    return move_generic(c, a, !replace, 0, 0);
}

/* ---- OBJECT */

/* What OBJECT reports of a value, by Redis's rules (tryObjectEncoding) applied to
 * the value as it is now: a string of at most 20 bytes that is a 64-bit integer
 * in canonical form is "int" (and, from 0 to 9999, one of Redis's shared
 * integers: refcount INT_MAX, as Redis with maxmemory-policy noeviction, which
 * kvstore reports); else up to 44 bytes "embstr", else "raw". Redis also keeps a
 * value "raw" after APPEND, SETRANGE or SETBIT edited it in place; kvstore keeps
 * no such history and answers what a SET of the same bytes would give.
 * A hash is "listpack": kvstore keeps every hash as one encoded byte string,
 * whatever its size (Redis converts to "hashtable" past hash-max-listpack-entries
 * 128 fields or hash-max-listpack-value 64 bytes, and never back). A stream is
 * "stream", as in Redis. */
enum { ENC_NONE, ENC_INT, ENC_SHARED_INT, ENC_EMBSTR, ENC_RAW, ENC_LISTPACK, ENC_STREAM };

static int64_t encoding_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    if (!cur->exists)
        return ENC_NONE;
    if (cur->type == KVT_HASH)
        return ENC_LISTPACK;
    if (cur->type == KVT_STREAM)
        return ENC_STREAM;
    const char *v = cur->val;
    size_t n = cur->vlen;
    if (n <= 20) {
        struct cmd_args one = {1, &v, &n};
        long long x;
        if (!cmd_arg_ll(&one, 0, &x))
            return x >= 0 && x < 10000 ? ENC_SHARED_INT : ENC_INT;
    }
    return n <= 44 ? ENC_EMBSTR : ENC_RAW;
}

static const char *const object_help[] = {
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
};

/* OBJECT ENCODING|REFCOUNT|FREQ|IDLETIME key: an absent key is a null reply for
 * every one (Redis looks the key up first). FREQ: Redis's error when no LFU
 * policy is set (kvstore has none). IDLETIME: kvstore does not track access
 * times, and says so instead of inventing a number. */
static int object_key(struct cmd_client *c, const struct cmd_args *a, const char *sub)
{
    if (!cmd_sub_arity(c, a, 3, sub))
        return 0;
    int64_t enc = kvt_apply(c->table, a->argv[2], a->argl[2], encoding_fn, NULL);
    if (enc < 0)
        return cmd_write_err_key(c, enc, a->argv[2], a->argl[2], 0);
    if (enc == ENC_NONE)
        return resp_add_null(c->out, c->resp);
    if (!strcmp(sub, "object|encoding")) {
        static const char *const names[] = {"", "int", "int", "embstr", "raw", "listpack", "stream"};
        return resp_add_bulk_str(c->out, names[enc]);
    }
    if (!strcmp(sub, "object|refcount"))
        return resp_add_int(c->out, enc == ENC_SHARED_INT ? INT_MAX : 1);
    if (!strcmp(sub, "object|freq"))
        return cmd_reply_err(c, "ERR An LFU maxmemory policy is not selected, access frequency not tracked. "
                                "Please note that when switching between policies at runtime LRU and LFU data "
                                "will take some time to adjust.");
    return cmd_reply_err(c, "ERR OBJECT IDLETIME is not supported by kvstore: it does not track access times");
}

int c_object(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "HELP")) {
        if (!cmd_sub_arity(c, a, 2, "object|help"))
            return 0;
        return CMD_REPLY_HELP(c, object_help);
    }
    if (ARGIS(a, 1, "ENCODING"))
        return object_key(c, a, "object|encoding");
    if (ARGIS(a, 1, "REFCOUNT"))
        return object_key(c, a, "object|refcount");
    if (ARGIS(a, 1, "FREQ"))
        return object_key(c, a, "object|freq");
    if (ARGIS(a, 1, "IDLETIME"))
        return object_key(c, a, "object|idletime");
    return cmd_unknown_sub(c, a, "OBJECT");
}
