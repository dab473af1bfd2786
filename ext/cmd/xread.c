/* xread.c - XREAD and XREADGROUP (COUNT, BLOCK, NOACK, "$", ">" and history
 * reads), with Redis 7.0's replies and errors. First every key is checked in
 * argument order (its type, its group, its ID: errors come as Redis gives them,
 * before anything is served), then each stream is served: XREAD with a read under
 * the key's lock, XREADGROUP with a kvt_xapply whose delta records the delivery
 * (the group's last ID, its read counter, the pending entries), so the log
 * replays exactly what the consumer was given. With BLOCK and nothing to serve,
 * the request waits (cmd_block) and runs again when an XADD to one of its keys
 * wakes it or its time is up. Runs on front-end threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/xcmd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/kvbuf.h"

#define XREAD_BLOCKED_COUNT 1000 /* a blocked read's COUNT when none was given (Redis's) */

struct xread {
    struct xop x;
    int group;                /* XREADGROUP */
    const char *g, *cn;       /* group and consumer names */
    size_t gl, cnl;
    long long count;          /* 0: all */
    long long block_ms;       /* -1: no BLOCK */
    int noack, streams, nkeys;
    struct xs_id *ids;        /* per key: the ID to read after ("$" resolved; ">": XS_ID_MAX) */
    unsigned char *newest;    /* per key (XREADGROUP): ">" */
    int k;                    /* the key being checked or served */
    int blocked;              /* run again after a wait */
    int served;
    char err[700];
};

static const char *key_of(const struct xread *t, int k) { return t->x.a->argv[t->streams + k]; }
static size_t klen_of(const struct xread *t, int k) { return t->x.a->argl[t->streams + k]; }
static const char *id_arg(const struct xread *t, int k, size_t *n)
{
    *n = t->x.a->argl[t->streams + t->nkeys + k];
    return t->x.a->argv[t->streams + t->nkeys + k];
}

/* ---- pass 1: each key's type, group and ID, in argument order */

static int64_t check_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct xread *t = arg;
    if (t->blocked && t->group && (!cur->exists || cur->type != KVT_STREAM))
        return xfail(&t->x, "UNBLOCKED the stream key no longer exists");
    if (t->blocked && cur->exists && cur->type != KVT_STREAM)
        return 0; /* XREAD waits on: a stream may come back at the key */
    NEED_STREAM(cur);
    const struct xstream *s = cur->exists ? cur->stream : NULL;
    if (t->blocked && t->group && !xs_group_find(s, t->g, t->gl))
        return xfail(&t->x, "NOGROUP the consumer group this client was blocked on no longer exists");
    if (t->group && (!s || !xs_group_find(s, t->g, t->gl))) {
        snprintf(t->err, sizeof t->err,
                 "NOGROUP No such key '%.*s' or consumer group '%.*s' in XREADGROUP with GROUP option",
                 (int)klen_of(t, t->k), key_of(t, t->k), (int)t->gl, t->g);
        return xfail(&t->x, t->err);
    }
    size_t n;
    const char *p = id_arg(t, t->k, &n);
    if (n == 1 && p[0] == '$') {
        if (t->group)
            return xfail(&t->x, "ERR The $ ID is meaningless in the context of XREADGROUP: you want to read the "
                                "history of this consumer by specifying a proper ID, or use the > ID to get new "
                                "messages. The $ ID would just return an empty result set.");
        t->ids[t->k] = s ? s->last_id : XS_ID_MIN;
        return 0;
    }
    if (n == 1 && p[0] == '>') {
        if (!t->group)
            return xfail(&t->x, "ERR The > ID can be specified only when calling XREADGROUP using the GROUP "
                                "<group> <consumer> option.");
        t->newest[t->k] = 1;
        t->ids[t->k] = XS_ID_MAX;
        return 0;
    }
    if (xs_id_parse(p, n, 1, 0, &t->ids[t->k], NULL))
        return xfail(&t->x, ERR_XID);
    return 0;
}

/* ---- pass 2: serving */

/* The key's name, then its entries follow (RESP2: [key, entries]; RESP3: key => entries). */
static int key_head(struct xread *t)
{
    struct cmd_client *c = t->x.op.c;
    int rc = c->resp == 3 ? 0 : resp_add_array(c->out, 2);
    return rc | resp_add_bulk(c->out, key_of(t, t->k), klen_of(t, t->k));
}

/* The last live entry's ID (an empty stream has none: 0). */
static int last_live(const struct xstream *s, struct xs_id *id)
{
    struct xs_entry e;
    if (xs_last(s, &e) != 1)
        return 0;
    *id = e.id;
    return 1;
}

static int64_t xread_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct xread *t = arg;
    if (t->blocked && cur->exists && cur->type != KVT_STREAM)
        return 0;
    NEED_STREAM(cur);
    struct xs_id last;
    if (!cur->exists || !last_live(cur->stream, &last) || xs_cmp(last, t->ids[t->k]) <= 0)
        return 0;
    int ok;
    struct xs_id from = xs_id_next(t->ids[t->k], &ok);
    if (key_head(t) || x_add_range(t->x.op.c->out, cur->stream, from, XS_ID_MAX, 0,
                                   t->count ? t->count : -1) < 0)
        t->x.reply_oom = 1;
    return 1;
}

/* XREADGROUP on one stream: new entries (">") or the consumer's history. */
static int64_t xreadgroup_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xread *t = arg;
    struct cmd_client *c = t->x.op.c;
    struct kvbuf *out = c->out;
    NEED_STREAM(cur);
    struct xstream *s = cur->exists ? cur->stream : NULL;
    struct xs_group *g = s ? xs_group_find(s, t->g, t->gl) : NULL;
    if (!g) { /* gone since pass 1 */
        snprintf(t->err, sizeof t->err,
                 "NOGROUP No such key '%.*s' or consumer group '%.*s' in XREADGROUP with GROUP option",
                 (int)klen_of(t, t->k), key_of(t, t->k), (int)t->gl, t->g);
        return xfail(&t->x, t->err);
    }
    struct xs_id last;
    int newest = t->newest[t->k];
    if (newest && (!s->length || !last_live(s, &last) || xs_cmp(last, g->last_id) <= 0))
        return 0; /* nothing new: not served */
    int64_t now = cmd_unix_ms();
    struct xs_consumer *k = xs_consumer_find(g, t->cn, t->cnl);
    if (k)
        k->seen_ms = now; /* not logged, as Redis does not propagate it */
    else if (xd_consumer(d, XOP_CCREATE, t->g, t->gl, t->cn, t->cnl, now))
        return -ENOMEM;
    long long max = t->count ? t->count : LLONG_MAX;
    size_t at;
    int rc = key_head(t) | x_hdr_begin(out, &at);
    long long n = 0;
    struct kvbuf ids = {0};
    if (newest) {
        int ok;
        struct xs_iter it;
        struct xs_entry e;
        xs_iter_init(&it, s, xs_id_next(g->last_id, &ok), XS_ID_MAX, 0, 0);
        it.want = t->count > 0 ? (uint64_t)t->count : 0;
        while (!rc && n < max && xs_iter_next(&it, &e) == 1) {
            rc = x_add_entry(out, &e) | kvbuf_append(&ids, &e.id, sizeof e.id);
            n++;
        }
        xs_iter_done(&it);
    } else if (k) { /* history: the consumer's pending entries after the ID */
        struct xs_entry e;
        for (struct xs_nack *nk = xs_pel_ceil(g, t->ids[t->k], 1); nk && !rc && n < max;
             nk = xs_pel_ceil(g, nk->id, 1)) {
            if (nk->owner != k)
                continue;
            if (xs_lookup(s, nk->id, &e) == 1) {
                rc = x_add_entry(out, &e) | kvbuf_append(&ids, &nk->id, sizeof nk->id);
            } else { /* deleted or trimmed since: its ID with no fields */
                rc = resp_add_array(out, 2) | x_add_id(out, nk->id) | x_add_null_array(c);
            }
            n++;
        }
    }
    if (!rc) {
        x_hdr_end(out, at, '*', n);
        size_t nid = ids.len / sizeof(struct xs_id);
        if (nid || newest)
            rc = xd_deliver(d, t->g, t->gl, t->cn, t->cnl, now,
                            (newest ? XD_NEW : 0) | (newest && t->noack ? XD_NOACK : 0),
                            (const struct xs_id *)ids.p, nid);
    }
    kvbuf_free(&ids);
    if (rc)
        t->x.reply_oom = 1;
    return 1;
}

/* ---- the command */

static int parse(struct cmd_client *c, const struct cmd_args *a, struct xread *t)
{
    for (int i = 1; i < a->argc; i++) {
        int more = a->argc - i - 1;
        if (ARGIS(a, i, "block") && more) {
            if (cmd_arg_ll(a, ++i, &t->block_ms))
                return cmd_reply_err(c, "ERR timeout is not an integer or out of range"), -1;
            if (t->block_ms < 0)
                return cmd_reply_err(c, "ERR timeout is negative"), -1;
        } else if (ARGIS(a, i, "count") && more) {
            if (cmd_arg_ll(a, ++i, &t->count))
                return cmd_reply_err(c, ERR_INT), -1;
            if (t->count < 0)
                t->count = 0;
        } else if (ARGIS(a, i, "streams") && more) {
            int rest = a->argc - i - 1;
            if (rest % 2)
                return cmd_reply_err(c, "ERR Unbalanced XREAD list of streams: for each stream key an ID or '$' "
                                        "must be specified."), -1;
            t->streams = i + 1;
            t->nkeys = rest / 2;
            break;
        } else if (ARGIS(a, i, "group") && more >= 2) {
            if (!t->group)
                return cmd_reply_err(c, "ERR The GROUP option is only supported by XREADGROUP. You called XREAD "
                                        "instead."), -1;
            t->g = a->argv[i + 1];
            t->gl = a->argl[i + 1];
            t->cn = a->argv[i + 2];
            t->cnl = a->argl[i + 2];
            i += 2;
        } else if (ARGIS(a, i, "noack")) {
            if (!t->group)
                return cmd_reply_err(c, "ERR The NOACK option is only supported by XREADGROUP. You called XREAD "
                                        "instead."), -1;
            t->noack = 1;
        } else {
            return cmd_reply_err(c, ERR_SYNTAX), -1;
        }
    }
    if (!t->streams)
        return cmd_reply_err(c, ERR_SYNTAX), -1;
    if (t->group && !t->g)
        return cmd_reply_err(c, "ERR Missing GROUP option for XREADGROUP"), -1;
    return 0;
}

static int xread_generic(struct cmd_client *c, const struct cmd_args *a, int group)
{
    struct xread t = {.x = {{c, NULL}, a, 0}, .group = group, .block_ms = -1};
    if (parse(c, a, &t))
        return 0;
    struct cmd_block *blk = cmd_block_of(c, a);
    t.blocked = blk != NULL;
    t.ids = calloc((size_t)t.nkeys, sizeof *t.ids);
    t.newest = calloc((size_t)t.nkeys, 1);
    if (!t.ids || !t.newest) {
        free(t.ids);
        free(t.newest);
        return cmd_reply_err(c, ERR_NOMEM);
    }
    int64_t r;
    for (t.k = 0; t.k < t.nkeys; t.k++) {
        if (!x_read(&t.x, key_of(&t, t.k), klen_of(&t, t.k), check_fn, &r))
            goto out;
        if (blk) /* run again after a wait: the IDs the first run resolved ("$": the last ID then) */
            t.ids[t.k] = blk->ids[t.k];
    }
    size_t at;
    if (x_hdr_begin(c->out, &at)) {
        cmd_reply_err(c, ERR_NOMEM);
        goto out;
    }
    if (blk && t.count == 0)
        t.count = XREAD_BLOCKED_COUNT;
    for (t.k = 0; t.k < t.nkeys; t.k++) {
        size_t before = c->out->len;
        int ok = group ? x_apply(&t.x, key_of(&t, t.k), klen_of(&t, t.k), xreadgroup_fn, 256, &r)
                       : x_read(&t.x, key_of(&t, t.k), klen_of(&t, t.k), xread_fn, &r);
        if (!ok) { /* an error (now after at: the partial reply goes) or a stall */
            size_t err = c->out->len - before;
            memmove(c->out->p + at, c->out->p + before, err);
            c->out->len = at + err;
            goto out;
        }
        t.served += r > 0;
    }
    if (t.served) {
        x_hdr_end(c->out, at, c->resp == 3 ? '%' : '*', t.served);
        goto out;
    }
    c->out->len = at;
    /* nothing to serve */
    if (t.block_ms < 0 || !cmd_can_block(c) || (blk && cmd_block_expired(blk))) {
        x_add_null_array(c);
        goto out;
    }
    if (cmd_block_wait(c, a, t.streams, t.nkeys, t.ids, t.block_ms))
        cmd_reply_err(c, ERR_NOMEM);
out:
    /* answered (served, timed out, an error): the wait ends; stalled (for its keys, or
     * for a key to load from the data file): it goes on */
    if (c->stall == CMD_STALL_NONE)
        cmd_block_done(c);
    free(t.ids);
    free(t.newest);
    return 0;
}

int c_xread(struct cmd_client *c, const struct cmd_args *a) { return xread_generic(c, a, 0); }
int c_xreadgroup(struct cmd_client *c, const struct cmd_args *a) { return xread_generic(c, a, 1); }
