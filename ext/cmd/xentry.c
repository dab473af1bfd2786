/* xentry.c - stream entry commands: XADD, XTRIM, XLEN, XRANGE, XREVRANGE, XDEL,
 * XSETID, and what the stream command files share (xcmd.h). Each command is one
 * kvt_xapply (a write: the function reads the stream under its shard lock and
 * appends the delta it decides, IDs and trim cuts resolved, which the table logs
 * and applies) or one kvt_apply (a read, replying from the stream under the
 * lock). Replies and errors are Redis 7.0's. Runs on front-end threads;
 * arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/xcmd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/kvbuf.h"

#define XTRIM_DEFAULT_LIMIT 10000 /* ~'s LIMIT when none is given: 100 x stream-node-max-entries */

/* ---- shared (xcmd.h) */

int x_arg_id(struct cmd_client *c, const struct cmd_args *a, int i, int strict, uint64_t missing_seq,
             struct xs_id *id)
{
    if (xs_id_parse(a->argv[i], a->argl[i], strict, missing_seq, id, NULL)) {
        cmd_reply_err(c, ERR_XID);
        return -1;
    }
    return 0;
}

int x_arg_bound(struct cmd_client *c, const struct cmd_args *a, int i, int is_end, struct xs_id *id)
{
    const char *p = a->argv[i];
    size_t n = a->argl[i];
    int excl = n > 1 && p[0] == '(';
    if (xs_id_parse(p + excl, n - (size_t)excl, excl, is_end ? UINT64_MAX : 0, id, NULL)) {
        cmd_reply_err(c, ERR_XID);
        return -1;
    }
    if (excl) {
        int ok;
        *id = is_end ? xs_id_prev(*id, &ok) : xs_id_next(*id, &ok);
        if (!ok) {
            cmd_reply_err(c, is_end ? "ERR invalid end ID for the interval" : "ERR invalid start ID for the interval");
            return -1;
        }
    }
    return 0;
}

int x_add_id(struct kvbuf *out, struct xs_id id)
{
    char buf[XS_ID_STR];
    return resp_add_bulk(out, buf, (size_t)xs_id_format(id, buf));
}

int x_add_entry(struct kvbuf *out, const struct xs_entry *e)
{
    int rc = resp_add_array(out, 2) | x_add_id(out, e->id) | resp_add_array(out, 2 * (long long)e->nfields);
    const unsigned char *p = e->fields;
    struct xs_field f;
    while (!rc && xs_field_next(e, &p, &f))
        rc = resp_add_bulk(out, f.f, f.flen) | resp_add_bulk(out, f.v, f.vlen);
    return rc ? -ENOMEM : 0;
}

int x_add_null_array(struct cmd_client *c)
{
    return c->resp == 3 ? kvbuf_append(c->out, "_\r\n", 3) : kvbuf_append(c->out, "*-1\r\n", 5);
}

int x_hdr_begin(struct kvbuf *out, size_t *at)
{
    static const char room[X_HDR_ROOM];
    *at = out->len;
    return kvbuf_append(out, room, sizeof room);
}

void x_hdr_end(struct kvbuf *out, size_t at, char type, long long n)
{
    char hdr[X_HDR_ROOM];
    int hl = snprintf(hdr, sizeof hdr, "%c%lld\r\n", type, n);
    memmove(out->p + at + hl, out->p + at + X_HDR_ROOM, out->len - at - X_HDR_ROOM);
    memcpy(out->p + at, hdr, (size_t)hl);
    out->len -= X_HDR_ROOM - (size_t)hl;
}

int64_t x_add_range(struct kvbuf *out, const struct xstream *s, struct xs_id lo, struct xs_id hi, int rev,
                    long long count)
{
    size_t at;
    int rc = x_hdr_begin(out, &at);
    int64_t n = 0;
    struct xs_iter it;
    struct xs_entry e;
    xs_iter_init(&it, s, lo, hi, rev, 0);
    it.want = count > 0 ? (uint64_t)count : 0;
    while (!rc && (count < 0 || n < count)) {
        int got = xs_iter_next(&it, &e);
        if (got <= 0) {
            rc = got;
            break;
        }
        rc = x_add_entry(out, &e);
        n++;
    }
    xs_iter_done(&it);
    if (rc)
        return -ENOMEM;
    x_hdr_end(out, at, '*', n);
    return n;
}

static int64_t run(struct xop *x, const char *key, size_t klen, int64_t rc, size_t before, size_t need,
                   int64_t *res)
{
    struct cmd_client *c = x->op.c;
    if (rc >= 0 && !x->reply_oom) {
        *res = rc;
        return 1;
    }
    c->out->len = before; /* whatever fn queued belongs to a command that did not happen */
    if (x->reply_oom && rc >= 0)
        cmd_reply_err(c, ERR_NOMEM);
    else if (rc == CMD_OP_ERR)
        cmd_reply_err(c, x->op.err);
    else if (rc == KVT_WRONGTYPE)
        cmd_reply_err(c, ERR_WRONGTYPE);
    else if (rc == -E2BIG)
        cmd_reply_err(c, "ERR Elements are too large to be stored");
    else
        cmd_write_err_key(c, rc, key, klen, need);
    return 0;
}

int x_apply(struct xop *x, const char *key, size_t klen, kvt_xapply_fn fn, size_t need, int64_t *res)
{
    size_t before = x->op.c->out->len;
    int64_t rc = kvt_xapply(x->op.c->table, key, klen, fn, x);
    return (int)run(x, key, klen, rc, before, need, res);
}

int x_read(struct xop *x, const char *key, size_t klen, kvt_apply_fn fn, int64_t *res)
{
    size_t before = x->op.c->out->len;
    int64_t rc = kvt_apply(x->op.c->table, key, klen, fn, x);
    return (int)run(x, key, klen, rc, before, 0, res);
}

/* ---- XADD and XTRIM */

enum { TRIM_NONE, TRIM_MAXLEN, TRIM_MINID };

struct xadd {
    struct xop x;
    int nomkstream, strategy, approx, autoid, seq_star;
    long long maxlen, limit;
    struct xs_id minid, id;   /* id: given, then the one added */
    int idpos;
    uint64_t removed;         /* XTRIM's reply */
};

/* Redis's streamParseAddOrTrimArgsOrReply from argument 2: XADD stops at its ID
 * (x->idpos), XTRIM takes every argument. 0, or -1 with the error replied. */
static int trim_args(struct cmd_client *c, const struct cmd_args *a, int xadd, struct xadd *t)
{
    int limit_given = 0, i = 2;
    t->limit = 0;
    for (; i < a->argc; i++) {
        int more = a->argc - 1 - i;
        const char *p = a->argv[i];
        size_t n = a->argl[i];
        if (xadd && n == 1 && p[0] == '*') {
            t->autoid = 1;
            break;
        }
        if ((ARGIS(a, i, "maxlen") || ARGIS(a, i, "minid")) && more >= 1) {
            int minid = ARGIS(a, i, "minid");
            if (t->strategy)
                return cmd_reply_err(c, "ERR syntax error, MAXLEN and MINID options at the same time are not "
                                        "compatible"), -1;
            const char *nx = a->argv[i + 1];
            if (a->argl[i + 1] == 1 && (nx[0] == '~' || nx[0] == '=') && more >= 2) {
                t->approx = nx[0] == '~';
                i++;
            }
            i++;
            if (minid) {
                if (x_arg_id(c, a, i, 1, 0, &t->minid))
                    return -1;
            } else {
                if (cmd_arg_ll(a, i, &t->maxlen))
                    return cmd_reply_err(c, ERR_INT), -1;
                if (t->maxlen < 0)
                    return cmd_reply_err(c, "ERR The MAXLEN argument must be >= 0."), -1;
            }
            t->strategy = minid ? TRIM_MINID : TRIM_MAXLEN;
        } else if (ARGIS(a, i, "limit") && more >= 1) {
            if (cmd_arg_ll(a, ++i, &t->limit))
                return cmd_reply_err(c, ERR_INT), -1;
            if (t->limit < 0)
                return cmd_reply_err(c, "ERR The LIMIT argument must be >= 0."), -1;
            limit_given = 1;
        } else if (xadd && ARGIS(a, i, "nomkstream")) {
            t->nomkstream = 1;
        } else if (xadd) {
            if (xs_id_parse(p, n, 1, 0, &t->id, &t->seq_star))
                return cmd_reply_err(c, ERR_XID), -1;
            break;
        } else {
            return cmd_reply_err(c, ERR_SYNTAX), -1;
        }
    }
    t->idpos = i;
    if (t->limit && !t->strategy)
        return cmd_reply_err(c, "ERR syntax error, LIMIT cannot be used without specifying a trimming strategy"), -1;
    if (!xadd && !t->strategy)
        return cmd_reply_err(c, "ERR syntax error, XTRIM must be called with a trimming strategy"), -1;
    if (limit_given && !t->approx)
        return cmd_reply_err(c, "ERR syntax error, LIMIT cannot be used without the special ~ option"), -1;
    if (t->approx && !limit_given)
        t->limit = XTRIM_DEFAULT_LIMIT;
    return 0;
}

/* The trim of t on s, as a cut appended to d; keep: an ID the cut must not
 * remove (XADD's new entry when the trim leaves it), or NULL. Returns the live
 * entries it removes (of those s holds now). */
static int64_t trim_delta(const struct xadd *t, const struct xstream *s, struct kvbuf *d, const struct xs_id *keep,
                          long long maxlen)
{
    struct xs_cut cut;
    uint64_t n = xs_trim_plan(s, t->strategy == TRIM_MINID, (uint64_t)maxlen, t->minid, t->approx,
                              (uint64_t)t->limit, &cut);
    if (!n)
        return 0;
    if (cut.all && keep)
        cut = (struct xs_cut){0, *keep};
    return xd_cut(d, &cut) ? -ENOMEM : (int64_t)n;
}

const struct xstream x_empty_stream;

static int64_t xadd_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xadd *t = arg;
    const struct cmd_args *a = t->x.a;
    NEED_STREAM(cur);
    if (!cur->exists && t->nomkstream)
        return 0;
    const struct xstream *s = cur->exists ? cur->stream : &x_empty_stream;
    if (xs_cmp(s->last_id, XS_ID_MAX) == 0)
        return xfail(&t->x, "ERR The stream has exhausted the last possible ID, unable to add more items");
    int rc = xs_next_id(s, t->autoid, t->seq_star, t->id, (uint64_t)cmd_unix_ms(), &t->id);
    if (rc == XS_E_SMALL)
        return xfail(&t->x, ERR_XSMALL);
    if (rc)
        return xfail(&t->x, "ERR The stream has exhausted the last possible ID, unable to add more items");
    size_t nf = (size_t)(a->argc - t->idpos - 1) / 2;
    struct xs_field stack[16], *f = nf <= 16 ? stack : malloc(nf * sizeof *f);
    if (!f)
        return -ENOMEM;
    for (size_t i = 0; i < nf; i++) {
        int at = t->idpos + 1 + 2 * (int)i;
        f[i] = (struct xs_field){a->argv[at], a->argv[at + 1], a->argl[at], a->argl[at + 1]};
    }
    rc = (!cur->exists && xd_create(d)) || xd_add(d, t->id, f, nf) ? -ENOMEM : 0;
    if (f != stack)
        free(f);
    if (rc)
        return rc;
    if (t->strategy == TRIM_MAXLEN && t->maxlen == 0) { /* the new entry goes too */
        struct xs_cut all = {1, XS_ID_MIN};
        return xd_cut(d, &all) ? -ENOMEM : 1;
    }
    if (t->strategy == TRIM_MINID && xs_cmp(t->id, t->minid) < 0) {
        struct xs_cut all = {1, XS_ID_MIN};
        return xd_cut(d, &all) ? -ENOMEM : 1;
    }
    /* the rest is planned on the stream as it is: keeping maxlen - 1 of its entries
     * keeps maxlen with the new one */
    if (t->strategy && cur->exists && trim_delta(t, s, d, &t->id, t->maxlen - 1) < 0)
        return -ENOMEM;
    return 1;
}

int c_xadd(struct cmd_client *c, const struct cmd_args *a)
{
    struct xadd t = {.x = {{c, NULL}, a, 0}};
    if (trim_args(c, a, 1, &t))
        return 0;
    int fields = a->argc - t.idpos - 1;
    if (fields < 2 || fields % 2)
        return resp_add_errorf(c->out, "ERR wrong number of arguments for 'xadd' command");
    if (!t.autoid && !t.seq_star && xs_is_zero(t.id))
        return cmd_reply_err(c, "ERR The ID specified in XADD must be greater than 0-0");
    size_t need = 128;
    for (int i = t.idpos + 1; i < a->argc; i++)
        need += a->argl[i] + 2;
    int64_t added;
    if (!x_apply(&t.x, a->argv[1], a->argl[1], xadd_fn, need, &added))
        return 0;
    if (!added)
        return resp_add_null(c->out, c->resp); /* NOMKSTREAM on an absent key */
    cmd_stream_signal(c, a->argv[1], a->argl[1]); /* blocked reads of the key may go on */
    return x_add_id(c->out, t.id);
}

static int64_t xtrim_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xadd *t = arg;
    NEED_STREAM(cur);
    if (!cur->exists)
        return 0;
    return trim_delta(t, cur->stream, d, NULL, t->maxlen);
}

int c_xtrim(struct cmd_client *c, const struct cmd_args *a)
{
    struct xadd t = {.x = {{c, NULL}, a, 0}};
    if (trim_args(c, a, 0, &t))
        return 0;
    int64_t n;
    return x_apply(&t.x, a->argv[1], a->argl[1], xtrim_fn, 64, &n) ? resp_add_int(c->out, n) : 0;
}

/* ---- XLEN, XRANGE, XREVRANGE */

static int64_t xlen_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    NEED_STREAM(cur);
    return cur->exists ? (int64_t)cur->stream->length : 0;
}

int c_xlen(struct cmd_client *c, const struct cmd_args *a)
{
    struct xop x = {{c, NULL}, a, 0};
    int64_t n;
    return x_read(&x, a->argv[1], a->argl[1], xlen_fn, &n) ? resp_add_int(c->out, n) : 0;
}

struct xrange {
    struct xop x;
    struct xs_id lo, hi;
    int rev;
    long long count;
};

static int64_t xrange_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct xrange *r = arg;
    struct cmd_client *c = r->x.op.c;
    NEED_STREAM(cur);
    if (!cur->exists)
        return resp_add_array(c->out, 0) ? (r->x.reply_oom = 1, 0) : 0;
    if (r->count == 0)
        return x_add_null_array(c) ? (r->x.reply_oom = 1, 0) : 0;
    if (x_add_range(c->out, cur->stream, r->lo, r->hi, r->rev, r->count) < 0)
        r->x.reply_oom = 1;
    return 0;
}

static int xrange_generic(struct cmd_client *c, const struct cmd_args *a, int rev)
{
    struct xrange r = {.x = {{c, NULL}, a, 0}, .rev = rev, .count = -1};
    /* XREVRANGE key end start */
    if (x_arg_bound(c, a, rev ? 3 : 2, 0, &r.lo) || x_arg_bound(c, a, rev ? 2 : 3, 1, &r.hi))
        return 0;
    for (int i = 4; i < a->argc; i++) {
        if (ARGIS(a, i, "count") && i + 1 < a->argc) {
            if (cmd_arg_ll(a, ++i, &r.count))
                return cmd_reply_err(c, ERR_INT);
            if (r.count < 0)
                r.count = 0;
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    int64_t n;
    x_read(&r.x, a->argv[1], a->argl[1], xrange_fn, &n);
    return 0;
}

int c_xrange(struct cmd_client *c, const struct cmd_args *a) { return xrange_generic(c, a, 0); }
int c_xrevrange(struct cmd_client *c, const struct cmd_args *a) { return xrange_generic(c, a, 1); }

/* ---- XDEL */

struct xdel {
    struct xop x;
    struct xs_id *ids;
    size_t n;
};

static int id_order(const void *a, const void *b)
{
    return xs_cmp(*(const struct xs_id *)a, *(const struct xs_id *)b);
}

static int64_t xdel_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xdel *t = arg;
    NEED_STREAM(cur);
    if (!cur->exists)
        return 0;
    size_t live = 0; /* the live ones, each once (an ID named twice is deleted once) */
    struct xs_entry e;
    for (size_t i = 0; i < t->n; i++)
        if ((!i || xs_cmp(t->ids[i], t->ids[i - 1])) && xs_lookup(cur->stream, t->ids[i], &e) == 1)
            t->ids[live++] = t->ids[i];
    if (!live)
        return 0;
    return xd_del(d, t->ids, live) ? -ENOMEM : (int64_t)live;
}

int c_xdel(struct cmd_client *c, const struct cmd_args *a)
{
    struct xdel t = {.x = {{c, NULL}, a, 0}, .n = (size_t)a->argc - 2};
    if (!(t.ids = malloc(t.n * sizeof *t.ids)))
        return cmd_reply_err(c, ERR_NOMEM);
    int64_t n = 0;
    size_t i = 0;
    for (; i < t.n; i++)
        if (xs_id_parse(a->argv[2 + i], a->argl[2 + i], 1, 0, &t.ids[i], NULL))
            break;
    if (i < t.n) /* Redis answers an absent key before it reads the IDs */
        kvt_exists(c->table, a->argv[1], a->argl[1]) ? cmd_reply_err(c, ERR_XID) : resp_add_int(c->out, 0);
    else {
        qsort(t.ids, t.n, sizeof *t.ids, id_order);
        if (x_apply(&t.x, a->argv[1], a->argl[1], xdel_fn, 64, &n))
            resp_add_int(c->out, n);
    }
    free(t.ids);
    return 0;
}

/* ---- XSETID */

struct xsetid {
    struct xop x;
    struct xs_id id, maxdel;
    long long added;          /* -1: not given */
};

static int64_t xsetid_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xsetid *t = arg;
    NEED_STREAM(cur);
    if (!cur->exists)
        return xfail(&t->x, "ERR no such key");
    const struct xstream *s = cur->stream;
    struct xs_entry last;
    if (s->length && xs_last(s, &last) == 1 && xs_cmp(t->id, last.id) < 0)
        return xfail(&t->x, "ERR The ID specified in XSETID is smaller than the target stream top item");
    if (s->length && t->added >= 0 && (uint64_t)t->added < s->length)
        return xfail(&t->x, "ERR The entries_added specified in XSETID is smaller than the target stream length");
    uint64_t added = t->added >= 0 ? (uint64_t)t->added : s->entries_added;
    struct xs_id maxdel = xs_is_zero(t->maxdel) ? s->max_deleted : t->maxdel;
    return xd_setid(d, t->id, added, maxdel) ? -ENOMEM : 0;
}

int c_xsetid(struct cmd_client *c, const struct cmd_args *a)
{
    struct xsetid t = {.x = {{c, NULL}, a, 0}, .added = -1};
    if (x_arg_id(c, a, 2, 1, 0, &t.id))
        return 0;
    for (int i = 3; i < a->argc; i++) {
        if (ARGIS(a, i, "entriesadded") && i + 1 < a->argc) {
            if (cmd_arg_ll(a, ++i, &t.added))
                return cmd_reply_err(c, ERR_INT);
            if (t.added < 0)
                return cmd_reply_err(c, "ERR entries_added must be positive");
        } else if (ARGIS(a, i, "maxdeletedid") && i + 1 < a->argc) {
            if (x_arg_id(c, a, ++i, 1, 0, &t.maxdel))
                return 0;
            if (xs_cmp(t.id, t.maxdel) < 0)
                return cmd_reply_err(c, "ERR The ID specified in XSETID is smaller than the provided "
                                        "max_deleted_entry_id");
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    int64_t n;
    return x_apply(&t.x, a->argv[1], a->argl[1], xsetid_fn, 64, &n) ? cmd_reply_ok(c) : 0;
}
