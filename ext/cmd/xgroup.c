/* xgroup.c - consumer groups: XGROUP (CREATE, SETID, DESTROY, CREATECONSUMER,
 * DELCONSUMER, HELP), XACK, XPENDING, XCLAIM, XAUTOCLAIM. A write is one
 * kvt_xapply whose delta (core/stream.h) carries what the command decided (the
 * claims' delivery times and counts resolved), so the log replays it exactly.
 * Replies and errors are Redis 7.0's. Runs on front-end threads; arguments are
 * untrusted. */
#define _GNU_SOURCE
#include "cmd/xcmd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/kvbuf.h"

#define ERR_XGROUP_NOKEY                                                                                     \
    "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the "      \
    "MKSTREAM option to create an empty stream automatically."

/* The NOGROUP errors of XPENDING, XCLAIM and XAUTOCLAIM (key first), built in buf. */
static const char *nogroup(char *buf, size_t cap, const struct cmd_args *a)
{
    snprintf(buf, cap, "NOGROUP No such key '%.*s' or consumer group '%.*s'", (int)a->argl[1], a->argv[1],
             (int)a->argl[2], a->argv[2]);
    return buf;
}

/* ---- XGROUP */

enum { G_CREATE, G_SETID, G_DESTROY, G_CREATECONSUMER, G_DELCONSUMER };

struct xgroup {
    struct xop x;
    int sub, mkstream;
    long long entries_read;   /* -1: not given */
    char err[600];
};

static int64_t xgroup_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xgroup *t = arg;
    const struct cmd_args *a = t->x.a;
    NEED_STREAM(cur);
    if (!cur->exists && !t->mkstream)
        return xfail(&t->x, ERR_XGROUP_NOKEY);
    struct xstream *s = cur->exists ? cur->stream : NULL;
    const char *g = a->argv[3];
    size_t gl = a->argl[3];
    struct xs_group *grp = s ? xs_group_find(s, g, gl) : NULL;
    if (!grp && t->sub != G_CREATE && t->sub != G_DESTROY) {
        snprintf(t->err, sizeof t->err, "NOGROUP No such consumer group '%.*s' for key name '%.*s'", (int)gl, g,
                 (int)a->argl[2], a->argv[2]);
        return xfail(&t->x, t->err);
    }
    int64_t now = cmd_unix_ms();
    switch (t->sub) {
    case G_CREATE:
    case G_SETID: {
        struct xs_id id;
        if (a->argl[4] == 1 && a->argv[4][0] == '$') {
            id = s ? s->last_id : XS_ID_MIN;
        } else if (xs_id_parse(a->argv[4], a->argl[4], t->sub == G_CREATE, 0, &id, NULL)) {
            return xfail(&t->x, ERR_XID); /* CREATE: strict; SETID takes "-" and "+" too */
        }
        if (t->sub == G_CREATE) {
            if (grp)
                return xfail(&t->x, "BUSYGROUP Consumer Group name already exists");
            if ((!s && xd_create(d)) || xd_group(d, XOP_GCREATE, g, gl, id, t->entries_read))
                return -ENOMEM;
            return 0;
        }
        return xd_group(d, XOP_GSETID, g, gl, id, t->entries_read) ? -ENOMEM : 0;
    }
    case G_DESTROY:
        if (!grp)
            return 0;
        return xd_gdestroy(d, g, gl) ? -ENOMEM : 1;
    case G_CREATECONSUMER:
        if (xs_consumer_find(grp, a->argv[4], a->argl[4]))
            return 0;
        return xd_consumer(d, XOP_CCREATE, g, gl, a->argv[4], a->argl[4], now) ? -ENOMEM : 1;
    default: {
        struct xs_consumer *k = xs_consumer_find(grp, a->argv[4], a->argl[4]);
        if (!k)
            return 0;
        int64_t had = (int64_t)k->pending;
        return xd_consumer(d, XOP_CDELETE, g, gl, a->argv[4], a->argl[4], 0) ? -ENOMEM : had;
    }
    }
}

static const char *const xgroup_help[] = {
    "XGROUP <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CREATE <key> <groupname> <id|$> [option]",
    "    Create a new consumer group. Options are:",
    "    * MKSTREAM",
    "      Create the empty stream if it does not exist.",
    "    * ENTRIESREAD entries_read",
    "      Set the group's entries_read counter (internal use).",
    "CREATECONSUMER <key> <groupname> <consumer>",
    "    Create a new consumer in the specified group.",
    "DELCONSUMER <key> <groupname> <consumer>",
    "    Remove the specified consumer.",
    "DESTROY <key> <groupname>",
    "    Remove the specified group.",
    "SETID <key> <groupname> <id|$> [ENTRIESREAD entries_read]",
    "    Set the current group ID and entries_read counter.",
    "HELP",
    "    Prints this help.",
};

static int sub_syntax(struct cmd_client *c, const struct cmd_args *a, const char *cmd)
{
    return resp_add_errorf(c->out, "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try %s HELP.",
                           (int)(a->argl[1] > 128 ? 128 : a->argl[1]), a->argv[1], cmd);
}

int c_xgroup(struct cmd_client *c, const struct cmd_args *a)
{
    struct xgroup t = {.x = {{c, NULL}, a, 0}, .entries_read = -1};
    static const struct {
        const char *name, *full;
        int arity;
    } subs[] = {{"create", "xgroup|create", -5},
                {"setid", "xgroup|setid", -5},
                {"destroy", "xgroup|destroy", 4},
                {"createconsumer", "xgroup|createconsumer", 5},
                {"delconsumer", "xgroup|delconsumer", 5}};
    if (ARGIS(a, 1, "help"))
        return cmd_sub_arity(c, a, 2, "xgroup|help") ? CMD_REPLY_HELP(c, xgroup_help) : 0;
    t.sub = -1;
    for (int i = 0; i < 5; i++)
        if (a->argl[1] == strlen(subs[i].name) && !strncasecmp(a->argv[1], subs[i].name, a->argl[1]))
            t.sub = i;
    if (t.sub < 0)
        return cmd_unknown_sub(c, a, "XGROUP");
    if (!cmd_sub_arity(c, a, subs[t.sub].arity, subs[t.sub].full))
        return 0;
    if ((t.sub == G_CREATE && a->argc > 8) || (t.sub == G_SETID && a->argc != 5 && a->argc != 7))
        return sub_syntax(c, a, "XGROUP");
    for (int i = 5; i < a->argc; i++) {
        if (t.sub == G_CREATE && ARGIS(a, i, "mkstream")) {
            t.mkstream = 1;
        } else if ((t.sub == G_CREATE || t.sub == G_SETID) && ARGIS(a, i, "entriesread") && i + 1 < a->argc) {
            if (cmd_arg_ll(a, ++i, &t.entries_read))
                return cmd_reply_err(c, ERR_INT);
            if (t.entries_read < 0 && t.entries_read != -1)
                return cmd_reply_err(c, "ERR value for ENTRIESREAD must be positive or -1");
        } else {
            return sub_syntax(c, a, "XGROUP");
        }
    }
    int64_t n;
    if (!x_apply(&t.x, a->argv[2], a->argl[2], xgroup_fn, 256, &n))
        return 0;
    if (t.sub == G_CREATE || t.sub == G_SETID)
        return cmd_reply_ok(c);
    if (t.sub == G_DESTROY && n)
        cmd_stream_signal(c, a->argv[2], a->argl[2]); /* its blocked readers get NOGROUP */
    return resp_add_int(c->out, n);
}

/* ---- XACK */

struct xack {
    struct xop x;
    struct xs_id *ids;
};

static int id_order(const void *a, const void *b)
{
    return xs_cmp(*(const struct xs_id *)a, *(const struct xs_id *)b);
}

static int64_t xack_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xack *t = arg;
    const struct cmd_args *a = t->x.a;
    NEED_STREAM(cur);
    struct xs_group *g = cur->exists ? xs_group_find(cur->stream, a->argv[2], a->argl[2]) : NULL;
    if (!g)
        return 0; /* the IDs are not even read then, as in Redis */
    size_t n = (size_t)a->argc - 3, k = 0;
    for (size_t i = 0; i < n; i++) {
        if (xs_id_parse(a->argv[3 + i], a->argl[3 + i], 1, 0, &t->ids[i], NULL))
            return xfail(&t->x, ERR_XID);
    }
    qsort(t->ids, n, sizeof *t->ids, id_order);
    for (size_t i = 0; i < n; i++)
        if ((!i || xs_cmp(t->ids[i], t->ids[i - 1])) && xs_pel_find(g, t->ids[i]))
            t->ids[k++] = t->ids[i];
    if (!k)
        return 0;
    return xd_ack(d, a->argv[2], a->argl[2], t->ids, k) ? -ENOMEM : (int64_t)k;
}

int c_xack(struct cmd_client *c, const struct cmd_args *a)
{
    struct xack t = {.x = {{c, NULL}, a, 0}};
    if (!(t.ids = malloc((size_t)(a->argc - 3) * sizeof *t.ids)))
        return cmd_reply_err(c, ERR_NOMEM);
    int64_t n;
    if (x_apply(&t.x, a->argv[1], a->argl[1], xack_fn, 64, &n))
        resp_add_int(c->out, n);
    free(t.ids);
    return 0;
}

/* ---- XPENDING */

struct xpending {
    struct xop x;
    int extended;
    long long idle, count;
    struct xs_id lo, hi;
    const char *consumer;
    size_t clen;
    char err[600];
};

static int name_order(const void *a, const void *b)
{
    const struct xs_consumer *x = *(struct xs_consumer *const *)a, *y = *(struct xs_consumer *const *)b;
    int c = memcmp(x->name, y->name, x->nlen < y->nlen ? x->nlen : y->nlen);
    return c ? c : (x->nlen > y->nlen) - (x->nlen < y->nlen);
}

static int64_t xpending_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct xpending *t = arg;
    const struct cmd_args *a = t->x.a;
    struct kvbuf *out = t->x.op.c->out;
    NEED_STREAM(cur);
    struct xs_group *g = cur->exists ? xs_group_find(cur->stream, a->argv[2], a->argl[2]) : NULL;
    if (!g)
        return xfail(&t->x, nogroup(t->err, sizeof t->err, a));
    int rc = 0;
    if (!t->extended) {
        if (!g->npel) {
            rc = resp_add_array(out, 4) | resp_add_int(out, 0) | resp_add_nil(out) | resp_add_nil(out) |
                 x_add_null_array(t->x.op.c);
        } else {
            struct xs_consumer **v = malloc(g->nconsumers * sizeof *v);
            if (!v)
                return -ENOMEM;
            size_t n = 0;
            for (struct list *l = g->consumers.next; l != &g->consumers; l = l->next) {
                struct xs_consumer *k = list_entry(l, struct xs_consumer, node);
                if (k->pending)
                    v[n++] = k;
            }
            qsort(v, n, sizeof *v, name_order);
            rc = resp_add_array(out, 4) | resp_add_int(out, (long long)g->npel) |
                 x_add_id(out, xs_pel_ceil(g, XS_ID_MIN, 0)->id) | x_add_id(out, xs_pel_last(g)->id) |
                 resp_add_array(out, (long long)n);
            for (size_t i = 0; i < n && !rc; i++) {
                char num[24];
                int l = snprintf(num, sizeof num, "%llu", (unsigned long long)v[i]->pending);
                rc = resp_add_array(out, 2) | resp_add_bulk(out, v[i]->name, v[i]->nlen) |
                     resp_add_bulk(out, num, (size_t)l);
            }
            free(v);
        }
        if (rc)
            t->x.reply_oom = 1;
        return 0;
    }
    struct xs_consumer *only = t->consumer ? xs_consumer_find(g, t->consumer, t->clen) : NULL;
    if ((t->consumer && !only) || t->count == 0)
        return resp_add_array(out, 0) ? (t->x.reply_oom = 1, 0) : 0;
    size_t at;
    rc = x_hdr_begin(out, &at);
    long long n = 0;
    int64_t now = cmd_unix_ms();
    for (struct xs_nack *k = xs_pel_ceil(g, t->lo, 0); k && !rc && n < t->count && xs_cmp(k->id, t->hi) <= 0;
         k = xs_pel_ceil(g, k->id, 1)) {
        if (only && k->owner != only)
            continue;
        int64_t idle = now - k->delivery_ms;
        if (idle < 0)
            idle = 0;
        if (t->idle && idle < t->idle)
            continue;
        rc = resp_add_array(out, 4) | x_add_id(out, k->id) | resp_add_bulk(out, k->owner->name, k->owner->nlen) |
             resp_add_int(out, idle) | resp_add_int(out, (long long)k->delivery_count);
        n++;
    }
    if (rc) {
        t->x.reply_oom = 1;
        return 0;
    }
    x_hdr_end(out, at, '*', n);
    return 0;
}

int c_xpending(struct cmd_client *c, const struct cmd_args *a)
{
    struct xpending t = {.x = {{c, NULL}, a, 0}};
    if (a->argc != 3 && (a->argc < 6 || a->argc > 9))
        return cmd_reply_err(c, ERR_SYNTAX);
    if (a->argc > 3) {
        int i = 3;
        t.extended = 1;
        if (ARGIS(a, 3, "idle")) {
            if (cmd_arg_ll(a, 4, &t.idle))
                return cmd_reply_err(c, ERR_INT);
            if (a->argc < 8)
                return cmd_reply_err(c, ERR_SYNTAX);
            i = 5;
        }
        if (cmd_arg_ll(a, i + 2, &t.count))
            return cmd_reply_err(c, ERR_INT);
        if (t.count < 0)
            t.count = 0;
        if (x_arg_bound(c, a, i, 0, &t.lo) || x_arg_bound(c, a, i + 1, 1, &t.hi))
            return 0;
        if (i + 3 < a->argc) {
            t.consumer = a->argv[i + 3];
            t.clen = a->argl[i + 3];
        }
    }
    int64_t n;
    x_read(&t.x, a->argv[1], a->argl[1], xpending_fn, &n);
    return 0;
}

/* ---- XCLAIM and XAUTOCLAIM */

struct xclaim {
    struct xop x;
    int autoclaim, justid, force;
    long long minidle, retrycount, count;
    int64_t deliverytime;
    struct xs_id lastid, start;
    int has_lastid, nids, idpos;
    struct xd_claim *items;   /* the claims, in order */
    struct xs_id *gone;       /* pending entries whose stream entry is gone: removed */
    size_t nitems, ngone;
    struct xs_id cursor;      /* XAUTOCLAIM's next start */
    char err[600];
};

/* The pending entry's state as the claims made so far leave it (an ID named twice). */
static const struct xd_claim *claimed_before(const struct xclaim *t, struct xs_id id)
{
    for (size_t i = t->nitems; i-- > 0;)
        if (!xs_cmp(t->items[i].id, id))
            return &t->items[i];
    return NULL;
}

/* Claim id (pending as nk, or NULL with force) for the consumer; 1 claimed, 0 not. */
static int claim_one(struct xclaim *t, struct xs_id id, const struct xs_nack *nk, int64_t now, int force)
{
    const struct xd_claim *before = claimed_before(t, id);
    int64_t when = before ? before->delivery_ms : nk ? nk->delivery_ms : 0;
    uint64_t count = before ? before->delivery_count : nk ? nk->delivery_count : 1;
    int owned = before || nk;
    if (owned && t->minidle > 0 && now - when < t->minidle)
        return 0;
    struct xd_claim *it = &t->items[t->nitems++];
    it->id = id;
    it->delivery_ms = t->autoclaim ? now : t->deliverytime;
    it->delivery_count = t->retrycount >= 0 ? (uint64_t)t->retrycount : t->justid ? count : count + 1;
    it->force = force && !owned;
    return 1;
}

static int64_t xclaim_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xclaim *t = arg;
    const struct cmd_args *a = t->x.a;
    struct cmd_client *c = t->x.op.c;
    NEED_STREAM(cur);
    struct xstream *s = cur->exists ? cur->stream : NULL;
    struct xs_group *g = s ? xs_group_find(s, a->argv[2], a->argl[2]) : NULL;
    if (!g)
        return xfail(&t->x, nogroup(t->err, sizeof t->err, a));
    int64_t now = cmd_unix_ms();
    struct xs_entry e;
    t->nitems = t->ngone = 0;
    if (!t->autoclaim) {
        /* XCLAIM's options, now that the key and group are known (Redis's order) */
        if (cmd_arg_ll(a, 4, &t->minidle))
            return xfail(&t->x, "ERR Invalid min-idle-time argument for XCLAIM");
        if (t->minidle < 0)
            t->minidle = 0;
        int i = 5;
        for (; i < a->argc; i++) {
            struct xs_id tmp;
            if (xs_id_parse(a->argv[i], a->argl[i], 1, 0, &tmp, NULL))
                break;
        }
        t->idpos = i;
        t->deliverytime = -1;
        t->retrycount = -1;
        for (; i < a->argc; i++) {
            int more = a->argc - i - 1;
            long long v;
            if (ARGIS(a, i, "force")) {
                t->force = 1;
            } else if (ARGIS(a, i, "justid")) {
                t->justid = 1;
            } else if (ARGIS(a, i, "idle") && more) {
                if (cmd_arg_ll(a, ++i, &v))
                    return xfail(&t->x, "ERR Invalid IDLE option argument for XCLAIM");
                t->deliverytime = now - v;
            } else if (ARGIS(a, i, "time") && more) {
                if (cmd_arg_ll(a, ++i, &v))
                    return xfail(&t->x, "ERR Invalid TIME option argument for XCLAIM");
                t->deliverytime = v;
            } else if (ARGIS(a, i, "retrycount") && more) {
                if (cmd_arg_ll(a, ++i, &v))
                    return xfail(&t->x, "ERR Invalid RETRYCOUNT option argument for XCLAIM");
                t->retrycount = v;
            } else if (ARGIS(a, i, "lastid") && more) {
                if (xs_id_parse(a->argv[i + 1], a->argl[i + 1], 1, 0, &t->lastid, NULL))
                    return xfail(&t->x, ERR_XID);
                i++;
                t->has_lastid = 1;
            } else {
                snprintf(t->err, sizeof t->err, "ERR Unrecognized XCLAIM option '%.*s'", (int)a->argl[i], a->argv[i]);
                return xfail(&t->x, t->err);
            }
        }
        if (t->deliverytime < 0 || t->deliverytime > now)
            t->deliverytime = now;
        if (!(t->items = calloc((size_t)(t->idpos - 5) + 1, sizeof *t->items)) ||
            !(t->gone = calloc((size_t)(t->idpos - 5) + 1, sizeof *t->gone)))
            return -ENOMEM;
        if (t->has_lastid && xs_cmp(t->lastid, g->last_id) > 0 &&
            xd_group(d, XOP_GSETID, a->argv[2], a->argl[2], t->lastid, g->entries_read))
            return -ENOMEM;
        for (i = 5; i < t->idpos; i++) {
            struct xs_id id;
            xs_id_parse(a->argv[i], a->argl[i], 1, 0, &id, NULL);
            const struct xs_nack *nk = xs_pel_find(g, id);
            if (xs_lookup(s, id, &e) != 1) {
                if (nk || claimed_before(t, id))
                    t->gone[t->ngone++] = id;
                continue;
            }
            if (!nk && !claimed_before(t, id) && !t->force)
                continue;
            claim_one(t, id, nk, now, t->force);
        }
    } else {
        size_t cap = (size_t)(t->count < (long long)g->npel ? t->count : (long long)g->npel) + 1;
        if (!(t->items = calloc(cap, sizeof *t->items)) || !(t->gone = calloc(cap, sizeof *t->gone)))
            return -ENOMEM;
        long long attempts = t->count * 10, left = t->count;
        struct xs_nack *nk = xs_pel_ceil(g, t->start, 0);
        while (attempts-- && left && nk) {
            if (xs_lookup(s, nk->id, &e) != 1) {
                t->gone[t->ngone++] = nk->id;
                left--;
            } else if (claim_one(t, nk->id, nk, now, 0)) {
                left--;
            }
            nk = xs_pel_ceil(g, nk->id, 1);
        }
        t->cursor = nk ? nk->id : XS_ID_MIN;
    }
    if (t->ngone && xd_ack(d, a->argv[2], a->argl[2], t->gone, t->ngone))
        return -ENOMEM;
    if (t->nitems) {
        if (!xs_consumer_find(g, a->argv[3], a->argl[3]) &&
            xd_consumer(d, XOP_CCREATE, a->argv[2], a->argl[2], a->argv[3], a->argl[3], now))
            return -ENOMEM;
        if (xd_claim(d, a->argv[2], a->argl[2], a->argv[3], a->argl[3], now, t->items, t->nitems))
            return -ENOMEM;
    }
    /* the reply, from the stream as it is (claims change no entry) */
    struct kvbuf *out = c->out;
    int rc = 0;
    if (t->autoclaim)
        rc = resp_add_array(out, 3) | x_add_id(out, t->cursor);
    rc |= resp_add_array(out, (long long)t->nitems);
    for (size_t i = 0; i < t->nitems && !rc; i++) {
        if (t->justid)
            rc = x_add_id(out, t->items[i].id);
        else
            rc = xs_lookup(s, t->items[i].id, &e) == 1 ? x_add_entry(out, &e) : -ENOMEM;
    }
    if (t->autoclaim) {
        rc |= resp_add_array(out, (long long)t->ngone);
        for (size_t i = 0; i < t->ngone && !rc; i++)
            rc = x_add_id(out, t->gone[i]);
    }
    if (rc)
        t->x.reply_oom = 1;
    return 0;
}

static int claim_run(struct cmd_client *c, const struct cmd_args *a, struct xclaim *t)
{
    int64_t n;
    x_apply(&t->x, a->argv[1], a->argl[1], xclaim_fn, 256, &n);
    free(t->items);
    free(t->gone);
    return 0;
}

int c_xclaim(struct cmd_client *c, const struct cmd_args *a)
{
    struct xclaim t = {.x = {{c, NULL}, a, 0}};
    return claim_run(c, a, &t);
}

#define XAUTOCLAIM_MAX_COUNT (LONG_MAX / 16)

int c_xautoclaim(struct cmd_client *c, const struct cmd_args *a)
{
    struct xclaim t = {.x = {{c, NULL}, a, 0}, .autoclaim = 1, .count = 100, .retrycount = -1};
    if (cmd_arg_ll(a, 4, &t.minidle))
        return cmd_reply_err(c, "ERR Invalid min-idle-time argument for XAUTOCLAIM");
    if (t.minidle < 0)
        t.minidle = 0;
    if (x_arg_bound(c, a, 5, 0, &t.start))
        return 0;
    for (int i = 6; i < a->argc; i++) {
        if (ARGIS(a, i, "count") && i + 1 < a->argc) {
            if (cmd_arg_ll(a, ++i, &t.count) || t.count < 1 || t.count > XAUTOCLAIM_MAX_COUNT)
                return cmd_reply_err(c, "ERR COUNT must be > 0");
        } else if (ARGIS(a, i, "justid")) {
            t.justid = 1;
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    return claim_run(c, a, &t);
}
