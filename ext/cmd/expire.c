/* expire.c - a key's lifetime: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (NX, XX, GT,
 * LT), TTL, PTTL, EXPIRETIME, PEXPIRETIME, PERSIST, with Redis 7.0's replies and
 * error texts. Expire times are absolute unix ms (as Redis keeps them), read
 * against kvt_now_ms, so a restart neither shortens nor lengthens a lifetime.
 * Every change is one kvt_apply on the key: its whole state is logged (the TTL
 * with it); an expire time already past deletes the key (logged as a deletion).
 * A key that left memory is loaded first (cmd_need_load). Runs on front-end
 * threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/table.h"

enum { EXP_NX = 1, EXP_XX = 2, EXP_GT = 4, EXP_LT = 8 };

/* "ERR Unsupported option <opt>" as Redis's addReplyErrorFormat makes it: %s stops
 * at a NUL byte, CR and LF at the end are trimmed (inside, resp_add_error turns
 * them into spaces), never cut (resp_add_errorf would cut at 512 bytes). */
static int reply_unsupported(struct cmd_client *c, const char *opt, size_t n)
{
    static const char pre[] = "ERR Unsupported option ";
    n = strnlen(opt, n);
    while (n && (opt[n - 1] == '\r' || opt[n - 1] == '\n'))
        n--;
    char *msg = malloc(sizeof pre + n);
    if (!msg)
        return -ENOMEM;
    memcpy(msg, pre, sizeof pre - 1);
    memcpy(msg + sizeof pre - 1, opt, n);
    msg[sizeof pre - 1 + n] = 0;
    int rc = cmd_reply_err(c, msg);
    free(msg);
    return rc;
}

/* Redis's parseExtendedExpireArgumentsOrReply: the options after the time, checked
 * before the time itself is. Returns the EXP_* flags, or -1 with the error replied. */
static int parse_flags(struct cmd_client *c, const struct cmd_args *a)
{
    int f = 0;
    for (int i = 3; i < a->argc; i++) {
        if (ARGIS(a, i, "NX"))
            f |= EXP_NX;
        else if (ARGIS(a, i, "XX"))
            f |= EXP_XX;
        else if (ARGIS(a, i, "GT"))
            f |= EXP_GT;
        else if (ARGIS(a, i, "LT"))
            f |= EXP_LT;
        else
            return reply_unsupported(c, a->argv[i], a->argl[i]) ? -2 : -1;
    }
    if ((f & EXP_NX) && (f & (EXP_XX | EXP_GT | EXP_LT))) {
        cmd_reply_err(c, "ERR NX and XX, GT or LT options at the same time are not compatible");
        return -1;
    }
    if ((f & EXP_GT) && (f & EXP_LT)) {
        cmd_reply_err(c, "ERR GT and LT options at the same time are not compatible");
        return -1;
    }
    return f;
}

struct expire_op {
    int flags;
    int64_t when; /* the new expire time, absolute ms */
    int64_t now;
};

/* Under the key's shard lock: 1 if the expire time was set (or the key deleted
 * because it is already past), 0 if the key is absent or a condition failed. A
 * key without an expire time counts as never expiring (Redis: GT never applies
 * to it, LT always does). */
static int64_t expire_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    const struct expire_op *op = arg;
    if (!cur->exists)
        return 0;
    int64_t have = cur->expire_ms ? cur->expire_ms : -1;
    if ((op->flags & EXP_NX) && have != -1)
        return 0;
    if ((op->flags & EXP_XX) && have == -1)
        return 0;
    if ((op->flags & EXP_GT) && (have == -1 || op->when <= have))
        return 0;
    if ((op->flags & EXP_LT) && have != -1 && op->when >= have)
        return 0;
    if (op->when <= op->now) { /* Redis's checkAlreadyExpired: deleted now, reply 1 */
        ch->action = KVT_DELETE;
        return 1;
    }
    ch->action = KVT_PUT; /* the same value (same pointer): only the TTL changes */
    ch->type = cur->type;
    ch->val = cur->val;
    ch->n1 = cur->vlen;
    ch->expire_ms = op->when;
    return 1;
}

/* EXPIRE and friends: the time argument in seconds (ms = 0) or ms, relative to
 * now (at = 0) or absolute. */
static int expire_generic(struct cmd_client *c, const struct cmd_args *a, int ms, int at, const char *name)
{
    int flags = parse_flags(c, a);
    if (flags < 0)
        return flags == -2 ? -ENOMEM : 0;
    long long when;
    if (cmd_arg_ll(a, 2, &when))
        return cmd_reply_err(c, ERR_INT);
    int64_t now = cmd_unix_ms();
    long long base = at ? 0 : now;
    /* Negative times are allowed (the key is deleted); only overflow of the unit
     * conversion or of the addition is an error, as in Redis. */
    if (!ms) {
        if (when > LLONG_MAX / 1000 || when < LLONG_MIN / 1000)
            return resp_add_errorf(c->out, "ERR invalid expire time in '%s' command", name);
        when *= 1000;
    }
    if (when > LLONG_MAX - base)
        return resp_add_errorf(c->out, "ERR invalid expire time in '%s' command", name);
    struct expire_op op = {flags, when + base, now};
    int64_t rc = kvt_apply(c->table, a->argv[1], a->argl[1], expire_fn, &op);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + 64);
    return resp_add_int(c->out, rc);
}

int c_expire(struct cmd_client *c, const struct cmd_args *a) { return expire_generic(c, a, 0, 0, "expire"); }
int c_pexpire(struct cmd_client *c, const struct cmd_args *a) { return expire_generic(c, a, 1, 0, "pexpire"); }
int c_expireat(struct cmd_client *c, const struct cmd_args *a) { return expire_generic(c, a, 0, 1, "expireat"); }
int c_pexpireat(struct cmd_client *c, const struct cmd_args *a) { return expire_generic(c, a, 1, 1, "pexpireat"); }

struct ttl_read {
    int exists;
    int64_t expire_ms;
};

static int64_t ttl_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct ttl_read *r = arg;
    r->exists = cur->exists;
    r->expire_ms = cur->expire_ms;
    return 0; /* a read: ch stays KVT_KEEP */
}

/* TTL, PTTL, EXPIRETIME, PEXPIRETIME: -2 absent, -1 no expire time, else the time
 * left (abs = 0, never below 0) or the absolute time, in ms or in seconds rounded
 * to the nearest (Redis's (ms + 500) / 1000). */
static int ttl_generic(struct cmd_client *c, const struct cmd_args *a, int ms, int abs)
{
    struct ttl_read r = {0, 0};
    int64_t rc = kvt_apply(c->table, a->argv[1], a->argl[1], ttl_fn, &r);
    if (rc < 0) /* a read: -ENODATA (load the key) is the only error */
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], 0);
    if (!r.exists)
        return resp_add_int(c->out, -2);
    if (!r.expire_ms)
        return resp_add_int(c->out, -1);
    long long t = abs ? r.expire_ms : r.expire_ms - cmd_unix_ms();
    if (t < 0)
        t = 0;
    return resp_add_int(c->out, ms ? t : (t + 500) / 1000);
}

int c_ttl(struct cmd_client *c, const struct cmd_args *a) { return ttl_generic(c, a, 0, 0); }
int c_pttl(struct cmd_client *c, const struct cmd_args *a) { return ttl_generic(c, a, 1, 0); }
int c_expiretime(struct cmd_client *c, const struct cmd_args *a) { return ttl_generic(c, a, 0, 1); }
int c_pexpiretime(struct cmd_client *c, const struct cmd_args *a) { return ttl_generic(c, a, 1, 1); }

/* 1 if the key's expire time was removed, 0 if it had none or is absent. */
static int64_t persist_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    if (!cur->exists || !cur->expire_ms)
        return 0;
    ch->action = KVT_PUT;
    ch->type = cur->type;
    ch->val = cur->val;
    ch->n1 = cur->vlen;
    ch->expire_ms = 0;
    return 1;
}

int c_persist(struct cmd_client *c, const struct cmd_args *a)
{
    int64_t rc = kvt_apply(c->table, a->argv[1], a->argl[1], persist_fn, NULL);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + 64);
    return resp_add_int(c->out, rc);
}
