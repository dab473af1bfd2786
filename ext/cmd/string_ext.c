/* string_ext.c - the rest of Redis 7.0's string commands: SETNX, SETEX, PSETEX,
 * GETSET, GETDEL, GETEX, MSETNX, GETRANGE/SUBSTR, SETRANGE, INCRBYFLOAT (the bit
 * commands and LCS are in string_bits.c). Every read-modify-write is one
 * kvt_apply under the key's shard lock, so it is one logged, atomic write; MSETNX
 * is a table transaction. Runs on front-end threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/table.h"

/* ---- shared with string.c and string_bits.c (cmd_int.h) */

int cmd_apply_key(struct cmd_client *c, const struct cmd_args *a, kvt_apply_fn fn, struct cmd_op *op, size_t need,
                  int64_t *res)
{
    size_t before = c->out->len;
    int64_t rc = kvt_apply(c->table, a->argv[1], a->argl[1], fn, op);
    if (rc >= 0) {
        *res = rc;
        return 1;
    }
    c->out->len = before; /* whatever fn queued belongs to a write that did not happen */
    if (rc == CMD_OP_ERR)
        cmd_reply_err(c, op->err);
    else if (rc == KVT_WRONGTYPE)
        cmd_reply_err(c, ERR_WRONGTYPE);
    else
        cmd_write_err_key(c, rc, a->argv[1], a->argl[1], need);
    return 0;
}

int cmd_read_key(struct cmd_client *c, const struct cmd_args *a, kvt_read_fn fn, void *arg)
{
    int rc = kvt_get(c->table, a->argv[1], a->argl[1], fn, arg);
    if (rc == -ENODATA)
        cmd_need_load(c, a->argv[1], a->argl[1]);
    else if (rc == KVT_WRONGTYPE)
        cmd_reply_err(c, ERR_WRONGTYPE);
    return rc < 0 ? -1 : rc;
}

/* Redis's getExpireMillisecondsOrReply: argument i, a time in units of unit_ms
 * (1000: seconds, 1: ms), made absolute (relative: added to now) and checked. */
int cmd_expire_arg(const struct cmd_args *a, int i, int unit_ms, int relative, int64_t *ms)
{
    long long v;
    if (cmd_arg_ll(a, i, &v))
        return -EINVAL;
    if (v <= 0 || v > LLONG_MAX / unit_ms)
        return -ERANGE;
    v *= unit_ms;
    if (relative) {
        int64_t now = cmd_unix_ms();
        if (v > LLONG_MAX - now)
            return -ERANGE; /* Redis: the sum overflows to <= 0 */
        v += now;
    }
    *ms = v;
    return 0;
}

int cmd_reply_expire_err(struct cmd_client *c, int rc, const char *cmd)
{
    if (rc == -EINVAL)
        return cmd_reply_err(c, ERR_INT);
    return resp_add_errorf(c->out, "ERR invalid expire time in '%s' command", cmd);
}

/* ---- SETNX, SETEX, PSETEX, GETSET */

int c_setnx(struct cmd_client *c, const struct cmd_args *a)
{
    int rc = kvt_set(c->table, a->argv[1], a->argl[1], a->argv[2], a->argl[2], KVT_NX, 0, NULL, NULL);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + a->argl[2]);
    return resp_add_int(c->out, rc);
}

static int setex_generic(struct cmd_client *c, const struct cmd_args *a, int unit_ms, const char *cmd)
{
    int64_t expire;
    int rc = cmd_expire_arg(a, 2, unit_ms, 1, &expire);
    if (rc)
        return cmd_reply_expire_err(c, rc, cmd);
    rc = kvt_set(c->table, a->argv[1], a->argl[1], a->argv[3], a->argl[3], 0, expire, NULL, NULL);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + a->argl[3]);
    return cmd_reply_ok(c);
}

int c_setex(struct cmd_client *c, const struct cmd_args *a) { return setex_generic(c, a, 1000, "setex"); }

int c_psetex(struct cmd_client *c, const struct cmd_args *a) { return setex_generic(c, a, 1, "psetex"); }

/* GETSET: SET ... GET without options (the TTL goes, as with SET). */
int c_getset(struct cmd_client *c, const struct cmd_args *a) { return cmd_set_get(c, a, 0, 0); }

/* ---- GETEX, GETDEL */

enum { GX_EX = 1, GX_PX = 2, GX_EXAT = 4, GX_PXAT = 8, GX_PERSIST = 16, GX_DEL = 32 /* GETDEL */ };
#define GX_TIME (GX_EX | GX_PX | GX_EXAT | GX_PXAT)

struct getex_op {
    struct cmd_op op;
    int flags;
    int time_rc;     /* the expire argument's error: Redis reports it only for a string key */
    int64_t when;    /* the new absolute expire time */
    int64_t now;
};

static int64_t getex_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct getex_op *g = arg;
    if (!cur->exists)
        return 0;
    if (cur->type != KVT_STRING)
        return KVT_WRONGTYPE;
    if (g->time_rc) {
        g->op.err = g->time_rc == -EINVAL ? ERR_INT : "ERR invalid expire time in 'getex' command";
        return CMD_OP_ERR;
    }
    cmd_add_bulk_cb(g->op.c, cur->val, cur->vlen); /* the value, also when the key goes now */
    if ((g->flags & GX_DEL) || ((g->flags & (GX_EXAT | GX_PXAT)) && g->when <= g->now)) {
        ch->action = KVT_DELETE; /* GETDEL, or an absolute time already past: Redis deletes the key */
        return 1;
    }
    if ((g->flags & GX_TIME) || ((g->flags & GX_PERSIST) && cur->expire_ms)) {
        ch->action = KVT_PUT;
        ch->type = KVT_STRING;
        ch->val = cur->val;
        ch->n1 = cur->vlen;
        ch->expire_ms = (g->flags & GX_TIME) ? g->when : 0;
    }
    return 1;
}

static int getex_apply(struct cmd_client *c, const struct cmd_args *a, struct getex_op *g)
{
    int64_t rc;
    if (cmd_apply_key(c, a, getex_fn, &g->op, 0, &rc) && rc == 0)
        return resp_add_null(c->out, c->resp);
    return 0;
}

int c_getdel(struct cmd_client *c, const struct cmd_args *a)
{
    struct getex_op g = {{c, NULL}, GX_DEL, 0, 0, 0};
    return getex_apply(c, a, &g);
}

/* GETEX key [EX s | PX ms | EXAT ts | PXAT ms-ts | PERSIST]: options parsed as
 * Redis's parseExtendedStringArgumentsOrReply (one kind of time, repeated
 * options allowed, the last one wins). */
int c_getex(struct cmd_client *c, const struct cmd_args *a)
{
    struct getex_op g = {{c, NULL}, 0, 0, 0, 0};
    int at = 0;
    for (int i = 2; i < a->argc; i++) {
        int next = i + 1 < a->argc, f;
        if (ARGIS(a, i, "PERSIST"))
            f = GX_PERSIST;
        else if (ARGIS(a, i, "EX"))
            f = GX_EX;
        else if (ARGIS(a, i, "PX"))
            f = GX_PX;
        else if (ARGIS(a, i, "EXAT"))
            f = GX_EXAT;
        else if (ARGIS(a, i, "PXAT"))
            f = GX_PXAT;
        else
            return cmd_reply_err(c, ERR_SYNTAX);
        /* any other option already given (the same one may repeat); a time needs its value */
        if ((g.flags & (GX_TIME | GX_PERSIST) & ~f) || (f != GX_PERSIST && !next))
            return cmd_reply_err(c, ERR_SYNTAX);
        g.flags |= f;
        if (f != GX_PERSIST)
            at = ++i;
    }
    if (g.flags & GX_TIME) {
        int unit = (g.flags & (GX_EX | GX_EXAT)) ? 1000 : 1;
        g.time_rc = cmd_expire_arg(a, at, unit, (g.flags & (GX_EX | GX_PX)) != 0, &g.when);
    }
    g.now = cmd_unix_ms();
    return getex_apply(c, a, &g);
}

/* ---- MSETNX */

/* All or nothing, and isolated: the keys are checked and set inside one table
 * transaction (every shard locked, one unit in the log), so no other client sees
 * some keys set and not others, and recovery keeps all of them or none. Inside
 * EXEC the transaction is EXEC's (it already holds every shard). */
int c_msetnx(struct cmd_client *c, const struct cmd_args *a)
{
    if (!cmd_mset_check(c, a, "msetnx"))
        return 0;
    int own = !kvt_tx_held, rc = own ? kvt_tx_begin(c->table) : 0;
    if (rc < 0)
        return cmd_reply_write_err(c, rc);
    int i, exists = 0;
    for (i = 1; i < a->argc && !exists; i += 2) {
        rc = kvt_exists(c->table, a->argv[i], a->argl[i]);
        if (rc < 0)
            break;
        exists = rc;
    }
    if (rc >= 0 && !exists) {
        for (i = 1; i < a->argc; i += 2) {
            rc = kvt_set(c->table, a->argv[i], a->argl[i], a->argv[i + 1], a->argl[i + 1], KVT_NOBOUND, 0,
                         NULL, NULL);
            if (rc < 0) /* only the log can refuse here: take back the keys set (all were absent) */
                break;
        }
        if (rc < 0)
            for (int j = 1; j < i; j += 2)
                kvt_del(c->table, a->argv[j], a->argl[j]);
    }
    int64_t end = own ? kvt_tx_end(c->table) : 0;
    if (rc == -ENODATA) /* argv[i] left memory: once it is loaded the command runs again */
        return cmd_need_load(c, a->argv[i], a->argl[i]);
    if (rc < 0)
        return cmd_reply_write_err(c, rc);
    if (end < 0) /* the log refused to close the unit: recovery drops it, so must the reply */
        return cmd_reply_write_err(c, end);
    return resp_add_int(c->out, !exists);
}

/* ---- GETRANGE, SUBSTR, SETRANGE */

struct range_arg {
    struct cmd_client *c;
    long long start, end;
};

int cmd_range(long long *start, long long *end, long long len)
{
    if (*start < 0)
        *start += len;
    if (*end < 0)
        *end += len;
    if (*start < 0)
        *start = 0;
    if (*end < 0)
        *end = 0;
    if (*end >= len)
        *end = len - 1;
    return *start <= *end;
}

static void getrange_cb(void *arg, const char *v, size_t n)
{
    struct range_arg *r = arg;
    long long start = r->start, end = r->end;
    if ((start < 0 && end < 0 && start > end) || !cmd_range(&start, &end, (long long)n))
        resp_add_bulk(r->c->out, "", 0);
    else
        cmd_add_bulk_cb(r->c, v + start, (size_t)(end - start + 1));
}

int c_getrange(struct cmd_client *c, const struct cmd_args *a)
{
    struct range_arg r = {c, 0, 0};
    if (cmd_arg_ll(a, 2, &r.start) || cmd_arg_ll(a, 3, &r.end))
        return cmd_reply_err(c, ERR_INT);
    return cmd_read_key(c, a, getrange_cb, &r) == 0 ? resp_add_bulk(c->out, "", 0) : 0;
}

struct setrange_op {
    struct cmd_op op;
    long long off;
    const char *val;
    size_t vlen;
    struct kvbuf buf; /* the new value, alive until kvt_apply returns */
};

int64_t cmd_put_patched(struct cmd_op *op, struct kvbuf *buf, const struct kvt_state *cur, size_t off,
                        const void *src, size_t n, struct kvt_change *ch)
{
    size_t olen = cur->exists ? cur->vlen : 0, nlen = off + n > olen ? off + n : olen;
    if (kvbuf_reserve(buf, nlen)) {
        op->err = ERR_NOMEM;
        return CMD_OP_ERR;
    }
    if (olen)
        memcpy(buf->p, cur->val, olen);
    if (off > olen)
        memset(buf->p + olen, 0, off - olen);
    memcpy(buf->p + off, src, n);
    ch->action = KVT_PUT; /* the expire time stays (preset) */
    ch->type = KVT_STRING;
    ch->val = buf->p;
    ch->n1 = nlen;
    return (int64_t)nlen;
}

static int64_t setrange_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct setrange_op *s = arg;
    if (cur->exists && cur->type != KVT_STRING)
        return KVT_WRONGTYPE;
    if (s->vlen == 0) /* nothing to write: the length as it is (0 and no key when absent) */
        return cur->exists ? (int64_t)cur->vlen : 0;
    if ((unsigned long long)s->off + s->vlen > KVT_MAX_VALUE)
        return -E2BIG;
    return cmd_put_patched(&s->op, &s->buf, cur, (size_t)s->off, s->val, s->vlen, ch);
}

int c_setrange(struct cmd_client *c, const struct cmd_args *a)
{
    struct setrange_op s = {{c, NULL}, 0, a->argv[3], a->argl[3], {0}};
    if (cmd_arg_ll(a, 2, &s.off))
        return cmd_reply_err(c, ERR_INT);
    if (s.off < 0)
        return cmd_reply_err(c, "ERR offset is out of range");
    int64_t n;
    size_t need = a->argl[1] + (s.off < KVT_MAX_VALUE ? (size_t)s.off : KVT_MAX_VALUE) + a->argl[3];
    int ok = cmd_apply_key(c, a, setrange_fn, &s.op, need, &n);
    kvbuf_free(&s.buf);
    return ok ? resp_add_int(c->out, n) : 0;
}

/* ---- INCRBYFLOAT */

/* Redis's string2ld: what strtold takes, whole (an embedded NUL too), without
 * leading space, not NaN, not an overflow nor an underflow to zero. */
int cmd_str2ld(const char *s, size_t n, long double *out)
{
    char buf[CMD_LD_CHARS];
    if (n == 0 || n >= sizeof buf)
        return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    long double v = strtold(buf, &end);
    if (isspace((unsigned char)buf[0]) || end != buf + n || errno == EINVAL || isnan(v) ||
        (errno == ERANGE && (v == HUGE_VAL || v == -HUGE_VAL || fpclassify(v) == FP_ZERO)))
        return 0;
    *out = v;
    return 1;
}

/* Redis's ld2string in LD_STR_HUMAN mode: %.17Lf, trailing zeros (and a bare
 * '.') dropped, "-0" as "0". Returns the length, 0 if it does not fit. */
size_t cmd_ld2str(char *buf, size_t cap, long double v)
{
    int n = snprintf(buf, cap, "%.17Lf", v);
    if (n < 0 || (size_t)n + 1 > cap)
        return 0;
    size_t l = (size_t)n;
    if (memchr(buf, '.', l)) {
        while (buf[l - 1] == '0')
            l--;
        if (buf[l - 1] == '.')
            l--;
    }
    if (l == 2 && buf[0] == '-' && buf[1] == '0') {
        buf[0] = '0';
        l = 1;
    }
    return l;
}

struct incrf_op {
    struct cmd_op op;
    long double incr;
    int incr_ok;
    char out[CMD_LD_CHARS];
    size_t len;
};

static int64_t incrf_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct incrf_op *f = arg;
    long double v = 0;
    if (cur->exists && cur->type != KVT_STRING)
        return KVT_WRONGTYPE;
    if ((cur->exists && !cmd_str2ld(cur->val, cur->vlen, &v)) || !f->incr_ok) {
        f->op.err = "ERR value is not a valid float";
        return CMD_OP_ERR;
    }
    v += f->incr;
    if (isnan(v) || isinf(v)) {
        f->op.err = "ERR increment would produce NaN or Infinity";
        return CMD_OP_ERR;
    }
    f->len = cmd_ld2str(f->out, sizeof f->out, v);
    ch->action = KVT_PUT; /* the expire time stays, as Redis's dbOverwrite */
    ch->type = KVT_STRING;
    ch->val = f->out;
    ch->n1 = f->len;
    return 1;
}

int c_incrbyfloat(struct cmd_client *c, const struct cmd_args *a)
{
    struct incrf_op f = {{c, NULL}, 0, 0, "", 0};
    f.incr_ok = cmd_str2ld(a->argv[2], a->argl[2], &f.incr);
    int64_t rc;
    if (!cmd_apply_key(c, a, incrf_fn, &f.op, a->argl[1] + 64, &rc))
        return 0;
    return resp_add_bulk(c->out, f.out, f.len);
}
