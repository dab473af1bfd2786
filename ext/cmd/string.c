/* string.c - string commands: GET, SET, MGET, MSET, INCR/DECR(BY), APPEND, STRLEN
 * (the rest are in string_ext.c and string_bits.c). A key that left memory for the
 * data file stalls the request until loaded (cmd_need_load); a key of another type
 * gets WRONGTYPE (MGET: nil, as Redis). Runs on front-end threads; arguments are
 * untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <limits.h>

#include "core/table.h"
#include "durability/bosc.h"
#include "engine/engine.h"


int c_get(struct cmd_client *c, const struct cmd_args *a)
{
    int rc = kvt_get(c->table, a->argv[1], a->argl[1], cmd_add_bulk_cb, c);
    if (rc == -ENODATA)
        return cmd_need_load(c, a->argv[1], a->argl[1]);
    if (rc == KVT_WRONGTYPE)
        return cmd_reply_err(c, ERR_WRONGTYPE);
    if (!rc)
        return resp_add_null(c->out, c->resp);
    return 0;
}

/* SET key value [NX|XX] [GET] [EX s|PX ms|EXAT ts|PXAT ms-ts|KEEPTTL] */
int c_set(struct cmd_client *c, const struct cmd_args *a)
{
    int flags = 0, get = 0, unit = 0; /* unit: 0 none, 1 EX, 2 PX, 3 EXAT, 4 PXAT */
    long long ttl = 0;
    for (int i = 3; i < a->argc; i++) {
        int next = i + 1 < a->argc;
        if (ARGIS(a, i, "NX") && !(flags & KVT_XX)) {
            flags |= KVT_NX;
        } else if (ARGIS(a, i, "XX") && !(flags & KVT_NX)) {
            flags |= KVT_XX;
        } else if (ARGIS(a, i, "GET")) {
            get = 1;
        } else if (ARGIS(a, i, "KEEPTTL") && !unit) {
            flags |= KVT_KEEPTTL;
        } else if (!(flags & KVT_KEEPTTL) && next &&
                   (ARGIS(a, i, "EX") || ARGIS(a, i, "PX") || ARGIS(a, i, "EXAT") || ARGIS(a, i, "PXAT"))) {
            int u = ARGIS(a, i, "EX") ? 1 : ARGIS(a, i, "PX") ? 2 : ARGIS(a, i, "EXAT") ? 3 : 4;
            if (unit && unit != u) /* the same option twice is fine (last wins), as in Redis */
                return cmd_reply_err(c, ERR_SYNTAX);
            unit = u;
            if (cmd_arg_ll(a, ++i, &ttl))
                return cmd_reply_err(c, ERR_INT);
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    if (c->eng->cfg.network_only)
        return cmd_reply_ok(c); /* --network-only: the network path alone is measured */
    int64_t expire = 0;
    if (unit) {
        long long mul = (unit == 1 || unit == 3) ? 1000 : 1;
        if (ttl <= 0 || ttl > LLONG_MAX / mul)
            return cmd_reply_err(c, "ERR invalid expire time in 'set' command");
        ttl *= mul;
        if (unit <= 2) {
            if (ttl > LLONG_MAX - cmd_unix_ms())
                return cmd_reply_err(c, "ERR invalid expire time in 'set' command");
            expire = cmd_unix_ms() + ttl;
        } else {
            expire = ttl;
        }
    }
    if (get)
        return cmd_set_get(c, a, flags, expire);
    int rc = kvt_set(c->table, a->argv[1], a->argl[1], a->argv[2], a->argl[2], flags, expire, NULL, NULL);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + a->argl[2]);
    return rc ? cmd_reply_ok(c) : resp_add_null(c->out, c->resp);
}

/* SET ... GET and GETSET: the old value (nil when absent) is the reply; a key of
 * another type gets WRONGTYPE and is left as it is, as Redis. */
int cmd_set_get(struct cmd_client *c, const struct cmd_args *a, int flags, int64_t expire)
{
    size_t before = c->out->len;
    int rc = kvt_set(c->table, a->argv[1], a->argl[1], a->argv[2], a->argl[2], flags, expire, cmd_add_bulk_cb, c);
    int had_old = c->out->len != before; /* the callback queued the old value */
    if (rc < 0) {
        c->out->len = before;
        if (rc == KVT_WRONGTYPE)
            return cmd_reply_err(c, ERR_WRONGTYPE);
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + a->argl[2]);
    }
    return had_old ? 0 : resp_add_null(c->out, c->resp);
}

int c_mget(struct cmd_client *c, const struct cmd_args *a)
{
    int i = c->resume_i;
    if (!i) {
        resp_add_array(c->out, a->argc - 1);
        i = 1;
    }
    c->resume_i = 0;
    for (; i < a->argc; i++) {
        int rc = kvt_get(c->table, a->argv[i], a->argl[i], cmd_add_bulk_cb, c);
        if (rc == -ENODATA) {
            struct bosc *b = c->eng->bosc;
            if (b && bosc_failed(b)) { /* this key cannot be read: its element says why */
                resp_add_errorf(c->out, "ERR %s", bosc_error(b));
                continue;
            }
            c->resume_i = i; /* the values so far stay in out */
            return cmd_need_load(c, a->argv[i], a->argl[i]);
        }
        if (rc != 1) /* absent, or not a string */
            resp_add_null(c->out, c->resp);
    }
    return 0;
}

/* As Redis: the memory bound is checked once, for the whole command (with a
 * generous per-key overhead), then every key is set without it, so an MSET (or
 * MSETNX) is never half applied because the bound was reached halfway. */
int cmd_mset_check(struct cmd_client *c, const struct cmd_args *a, const char *cmd)
{
    if (a->argc % 2 == 0) {
        resp_add_errorf(c->out, "ERR wrong number of arguments for '%s' command", cmd);
        return 0;
    }
    uint64_t max = kvt_max_memory(c->table);
    if (!max)
        return 1;
    uint64_t need = 0;
    for (int i = 1; i < a->argc; i += 2)
        need += a->argl[i] + a->argl[i + 1] + 64;
    if (kvt_used_memory(c->table) + need <= max)
        return 1;
    if (!cmd_wait_for_memory(c, need))
        cmd_reply_err(c, ERR_OOM);
    return 0;
}

int c_mset(struct cmd_client *c, const struct cmd_args *a)
{
    if (!cmd_mset_check(c, a, "mset"))
        return 0;
    for (int i = 1; i < a->argc; i += 2) {
        int rc = kvt_set(c->table, a->argv[i], a->argl[i], a->argv[i + 1], a->argl[i + 1], KVT_NOBOUND, 0,
                         NULL, NULL);
        if (rc < 0)
            return cmd_reply_write_err(c, rc);
    }
    return cmd_reply_ok(c);
}

static int incr_generic(struct cmd_client *c, const struct cmd_args *a, long long delta)
{
    int64_t v;
    int rc = kvt_incrby(c->table, a->argv[1], a->argl[1], delta, &v);
    if (rc == -EINVAL)
        return cmd_reply_err(c, ERR_INT);
    if (rc == -ERANGE)
        return cmd_reply_err(c, "ERR increment or decrement would overflow");
    if (rc == KVT_WRONGTYPE)
        return cmd_reply_err(c, ERR_WRONGTYPE);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + 24);
    return resp_add_int(c->out, v);
}

int c_incr(struct cmd_client *c, const struct cmd_args *a) { return incr_generic(c, a, 1); }

int c_decr(struct cmd_client *c, const struct cmd_args *a) { return incr_generic(c, a, -1); }

int c_incrby(struct cmd_client *c, const struct cmd_args *a)
{
    long long d;
    if (cmd_arg_ll(a, 2, &d))
        return cmd_reply_err(c, ERR_INT);
    return incr_generic(c, a, d);
}

int c_decrby(struct cmd_client *c, const struct cmd_args *a)
{
    long long d;
    if (cmd_arg_ll(a, 2, &d))
        return cmd_reply_err(c, ERR_INT);
    if (d == LLONG_MIN)
        return cmd_reply_err(c, "ERR decrement would overflow");
    return incr_generic(c, a, -d);
}

int c_append(struct cmd_client *c, const struct cmd_args *a)
{
    int64_t n = kvt_append(c->table, a->argv[1], a->argl[1], a->argv[2], a->argl[2]);
    if (n == KVT_WRONGTYPE)
        return cmd_reply_err(c, ERR_WRONGTYPE);
    return n < 0 ? cmd_write_err_key(c, n, a->argv[1], a->argl[1], a->argl[1] + a->argl[2]) : resp_add_int(c->out, n);
}

int c_strlen(struct cmd_client *c, const struct cmd_args *a)
{
    int64_t n = kvt_strlen(c->table, a->argv[1], a->argl[1]);
    if (n == -ENODATA)
        return cmd_need_load(c, a->argv[1], a->argl[1]);
    return n == KVT_WRONGTYPE ? cmd_reply_err(c, ERR_WRONGTYPE) : resp_add_int(c->out, n);
}
