/* cmd.c - command table and handlers (see cmd.h).
 * One table of {name, arity, flags, handler}; lookup is case-insensitive.
 * Error texts follow Redis 7.0 so clients and tools behave the same. Runs on
 * poller threads; all arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "durability/bosc.h"
#include "proto/resp.h"
#include "server/server.h"
#include "core/table.h"

static inline int tolower_ascii(int ch) { return ch >= 'A' && ch <= 'Z' ? ch + 32 : ch; }

#define F_WRITE (1 << 0)
#define F_READONLY (1 << 1)
#define F_NOAUTH (1 << 2)  /* allowed before AUTH */
#define F_FAST (1 << 3)
#define F_DENYOOM (1 << 4)

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
    cmd_fn fn;
    const char *group, *summary, *since;
};

static const char ERR_INT[] = "ERR value is not an integer or out of range";
static const char ERR_SYNTAX[] = "ERR syntax error";
static const char ERR_OOM[] = "OOM command not allowed when used memory > 'maxmemory'.";
static const char ERR_BIG[] = "ERR string exceeds maximum allowed size (proto-max-bulk-len)";

#define ARGIS(a, i, lit) ((a)->argl[i] == sizeof(lit) - 1 && !strncasecmp((a)->argv[i], lit, sizeof(lit) - 1))

static int reply_ok(struct cmd_client *c) { return kvbuf_append(c->out, "+OK\r\n", 5); }
static int reply_err(struct cmd_client *c, const char *e) { return resp_add_error(c->out, e); }
static int reply_write_err(struct cmd_client *c, int64_t rc);

/* Redis's string2ll on an argument. */
static int arg_ll(const struct cmd_args *a, int i, long long *v)
{
    char tmp[24];
    size_t n = a->argl[i];
    if (n == 0 || n >= sizeof tmp)
        return -1;
    memcpy(tmp, a->argv[i], n);
    tmp[n] = 0;
    if (!(tmp[0] == '-' || (tmp[0] >= '0' && tmp[0] <= '9')))
        return -1;
    if (n > 1 && (tmp[0] == '0' || (tmp[0] == '-' && tmp[1] == '0')))
        return -1;
    if (n == 1 && tmp[0] == '-')
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(tmp, &end, 10);
    if (errno || *end)
        return -1;
    *v = x;
    return 0;
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void add_bulk_cb(void *arg, const char *v, size_t n)
{
    struct cmd_client *c = arg;
    if (resp_add_bulk(c->out, v, n))
        c->close_after_reply = 1; /* could not queue the reply: drop the client */
}

/* ---- connection / server commands */

static int c_ping(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc > 2)
        return resp_add_errorf(c->out, "ERR wrong number of arguments for 'ping' command");
    if (a->argc == 2)
        return resp_add_bulk(c->out, a->argv[1], a->argl[1]);
    return kvbuf_append(c->out, "+PONG\r\n", 7);
}

static int c_echo(struct cmd_client *c, const struct cmd_args *a)
{
    return resp_add_bulk(c->out, a->argv[1], a->argl[1]);
}

static int c_quit(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    c->close_after_reply = 1;
    return reply_ok(c);
}

/* Compare in time independent of where the first difference is. */
static int secret_eq(const char *a, size_t al, const char *b, size_t bl)
{
    unsigned char d = al != bl;
    for (size_t i = 0; i < al; i++)
        d |= (unsigned char)(a[i] ^ b[i % (bl ? bl : 1)]);
    return d == 0 && al == bl;
}

/* AUTH [user] pass, shared by AUTH and HELLO. Returns 1 ok, 0 replied with an error. */
static int do_auth(struct cmd_client *c, const char *user, size_t ul, const char *pass, size_t pl)
{
    const char *req = srv_config(c->srv)->requirepass;
    if (!req || !*req) {
        if (!user) {
            reply_err(c, "ERR AUTH <password> called without any password configured for the "
                         "default user. Are you sure your configuration is correct?");
            return 0;
        }
        /* with no password, the default user accepts any password, as in Redis */
        if (ul == 7 && !memcmp(user, "default", 7))
            return 1;
    } else if ((!user || (ul == 7 && !memcmp(user, "default", 7))) &&
               secret_eq(pass, pl, req, strlen(req))) {
        c->authenticated = 1;
        return 1;
    }
    reply_err(c, "WRONGPASS invalid username-password pair or user is disabled.");
    return 0;
}

static int c_auth(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc > 3)
        return reply_err(c, ERR_SYNTAX);
    int ok = a->argc == 2 ? do_auth(c, NULL, 0, a->argv[1], a->argl[1])
                          : do_auth(c, a->argv[1], a->argl[1], a->argv[2], a->argl[2]);
    return ok ? reply_ok(c) : 0;
}

static int valid_client_name(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '!' || s[i] > '~')
            return 0;
    return 1;
}

static int set_name(struct cmd_client *c, const char *s, size_t n)
{
    if (!valid_client_name(s, n)) {
        reply_err(c, "ERR Client names cannot contain spaces, newlines or special characters.");
        return 0;
    }
    free(c->name);
    c->name = NULL;
    if (n) {
        c->name = malloc(n + 1);
        if (c->name) {
            memcpy(c->name, s, n);
            c->name[n] = 0;
        }
    }
    return 1;
}

static int c_hello(struct cmd_client *c, const struct cmd_args *a)
{
    int i = 1, proto = c->resp;
    if (a->argc >= 2) {
        long long ver;
        if (arg_ll(a, 1, &ver))
            return reply_err(c, "ERR Protocol version is not an integer or out of range");
        if (ver < 2 || ver > 3)
            return reply_err(c, "NOPROTO unsupported protocol version");
        proto = (int)ver;
        i = 2;
    }
    const char *name = NULL;
    size_t namel = 0;
    int auth_i = 0;
    for (; i < a->argc; i++) {
        int more = a->argc - i - 1;
        if (ARGIS(a, i, "AUTH") && more >= 2) {
            auth_i = i;
            i += 2;
        } else if (ARGIS(a, i, "SETNAME") && more >= 1) {
            name = a->argv[i + 1];
            namel = a->argl[i + 1];
            i++;
        } else {
            return resp_add_errorf(c->out, "ERR Syntax error in HELLO option '%.*s'",
                                   (int)(a->argl[i] > 128 ? 128 : a->argl[i]), a->argv[i]);
        }
    }
    if (auth_i && !do_auth(c, a->argv[auth_i + 1], a->argl[auth_i + 1], a->argv[auth_i + 2],
                           a->argl[auth_i + 2]))
        return 0;
    if (!c->authenticated)
        return reply_err(c, "NOAUTH HELLO must be called with the client already authenticated, "
                            "otherwise the HELLO AUTH <user> <pass> option can be used to "
                            "authenticate the client and select the RESP protocol version at the "
                            "same time");
    if (name && !set_name(c, name, namel))
        return 0;
    c->resp = proto;
    resp_add_map(c->out, c->resp, 7);
    resp_add_bulk_str(c->out, "server");
    resp_add_bulk_str(c->out, "kvstore");
    resp_add_bulk_str(c->out, "version");
    resp_add_bulk_str(c->out, srv_config(c->srv)->version);
    resp_add_bulk_str(c->out, "proto");
    resp_add_int(c->out, c->resp);
    resp_add_bulk_str(c->out, "id");
    resp_add_int(c->out, (long long)c->id);
    resp_add_bulk_str(c->out, "mode");
    resp_add_bulk_str(c->out, "standalone");
    resp_add_bulk_str(c->out, "role");
    resp_add_bulk_str(c->out, "master");
    resp_add_bulk_str(c->out, "modules");
    return resp_add_array(c->out, 0);
}

static int unknown_sub(struct cmd_client *c, const struct cmd_args *a, const char *cmd)
{
    return resp_add_errorf(c->out, "ERR unknown subcommand '%.*s'. Try %s HELP.",
                           (int)(a->argl[1] > 128 ? 128 : a->argl[1]), a->argv[1], cmd);
}

static int sub_arity(struct cmd_client *c, const struct cmd_args *a, int want, const char *full)
{
    if ((want > 0 && a->argc != want) || (want < 0 && a->argc < -want)) {
        resp_add_errorf(c->out, "ERR wrong number of arguments for '%s' command", full);
        return 0;
    }
    return 1;
}

static int c_client(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "ID"))
        return sub_arity(c, a, 2, "client|id") ? resp_add_int(c->out, (long long)c->id) : 0;
    if (ARGIS(a, 1, "SETNAME")) {
        if (!sub_arity(c, a, 3, "client|setname"))
            return 0;
        return set_name(c, a->argv[2], a->argl[2]) ? reply_ok(c) : 0;
    }
    if (ARGIS(a, 1, "GETNAME")) {
        if (!sub_arity(c, a, 2, "client|getname"))
            return 0;
        return c->name ? resp_add_bulk_str(c->out, c->name) : resp_add_null(c->out, c->resp);
    }
    if (ARGIS(a, 1, "SETINFO")) /* redis-py >= 5 sends its name/version; accepted, not kept */
        return sub_arity(c, a, 4, "client|setinfo") ? reply_ok(c) : 0;
    if (ARGIS(a, 1, "INFO")) {
        char line[256];
        snprintf(line, sizeof line, "id=%llu addr=%s name=%s poller=%d\n", (unsigned long long)c->id,
                 c->addr, c->name ? c->name : "", c->poller);
        return resp_add_verbatim(c->out, c->resp, line, strlen(line));
    }
    if (ARGIS(a, 1, "HELP")) {
        static const char *help[] = {"CLIENT <subcommand> [<arg> ...]. Subcommands are:",
                                     "ID", "    Return the ID of the current connection.",
                                     "GETNAME", "    Return the name of the current connection.",
                                     "SETNAME <name>", "    Assign the name <name> to the current connection.",
                                     "INFO", "    Return information about the current connection."};
        resp_add_array(c->out, sizeof help / sizeof *help);
        for (size_t i = 0; i < sizeof help / sizeof *help; i++)
            resp_add_status(c->out, help[i]);
        return 0;
    }
    return unknown_sub(c, a, "CLIENT");
}

static int c_select(struct cmd_client *c, const struct cmd_args *a)
{
    long long db;
    if (arg_ll(a, 1, &db))
        return reply_err(c, ERR_INT);
    if (db != 0)
        return reply_err(c, "ERR DB index is out of range");
    return reply_ok(c);
}

static int c_dbsize(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    /* With a data file, a key written blind (without reading its block) counts
     * once its block has been swept: flush before counting (LDU's flush before
     * a read that needs the applied state). */
    struct bosc *b = srv_config(c->srv)->bosc;
    if (b && (c->sync_ticket || bosc_dirty(b))) {
        if (!c->sync_ticket)
            c->sync_ticket = bosc_sync_request(b);
        if (!bosc_sync_done(b, c->sync_ticket)) {
            c->stall = CMD_STALL_SYNC;
            return 0;
        }
        c->sync_ticket = 0;
    }
    kvt_lsn_touch(srv_log_appended(c->srv)); /* the count includes writes not yet durable */
    return resp_add_int(c->out, (long long)kvt_count(c->table));
}

static int c_flushall(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc > 2 || (a->argc == 2 && !ARGIS(a, 1, "ASYNC") && !ARGIS(a, 1, "SYNC")))
        return reply_err(c, ERR_SYNTAX);
    int rc = kvt_flush(c->table);
    return rc < 0 ? reply_write_err(c, rc) : reply_ok(c);
}

static int c_time(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char s[24], us[24];
    int n1 = resp_ll2str(s, tv.tv_sec), n2 = resp_ll2str(us, tv.tv_usec);
    resp_add_array(c->out, 2);
    resp_add_bulk(c->out, s, (size_t)n1);
    return resp_add_bulk(c->out, us, (size_t)n2);
}

static int c_info(struct cmd_client *c, const struct cmd_args *a)
{
    kvt_lsn_touch(srv_log_appended(c->srv)); /* key counts and memory show pending writes */
    return srv_info(c->srv, a->argc - 1, a->argv + 1, a->argl + 1, c->resp, c->out);
}

/* ---- strings */

/* The key is not in memory but may be in its data-file block: wait for it to
 * be loaded (or report the damage that keeps it from loading). */
static int need_load(struct cmd_client *c, const char *key, size_t klen)
{
    struct bosc *b = srv_config(c->srv)->bosc;
    if (!b)
        return reply_err(c, "ERR internal: key not resident without a data file");
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
static int wait_for_memory(struct cmd_client *c, size_t need)
{
    uint64_t max = kvt_max_memory(c->table);
    if (!srv_config(c->srv)->bosc || !max || need > max / 4 || kvt_spill_stuck(c->table))
        return 0;
    c->stall = CMD_STALL_MEM;
    return 1;
}

static int c_get(struct cmd_client *c, const struct cmd_args *a)
{
    int rc = kvt_get(c->table, a->argv[1], a->argl[1], add_bulk_cb, c);
    if (rc == -ENODATA)
        return need_load(c, a->argv[1], a->argl[1]);
    if (!rc)
        return resp_add_null(c->out, c->resp);
    return 0;
}

/* Errors of a write to key (argument 1 unless given). */
static int write_err_key(struct cmd_client *c, int64_t rc, const char *key, size_t klen, size_t need)
{
    if (rc == -ENODATA)
        return need_load(c, key, klen);
    if (rc == -ENOMEM && wait_for_memory(c, need))
        return 0;
    return reply_write_err(c, rc);
}

static int reply_write_err(struct cmd_client *c, int64_t rc)
{
    if (rc == -ENOMEM)
        return reply_err(c, ERR_OOM);
    if (rc == -E2BIG)
        return reply_err(c, ERR_BIG);
    if (rc == -EAGAIN)
        return reply_err(c, "ERR durability log backlog full (the disk cannot keep up), write refused: retry");
    if (rc == -EIO)
        return reply_err(c, "ERR durability log failed (I/O error, see the server's log): writes refused "
                            "until restart");
    return resp_add_errorf(c->out, "ERR %s", strerror((int)-rc));
}

/* SET key value [NX|XX] [GET] [EX s|PX ms|EXAT ts|PXAT ms-ts|KEEPTTL] */
static int c_set(struct cmd_client *c, const struct cmd_args *a)
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
                return reply_err(c, ERR_SYNTAX);
            unit = u;
            if (arg_ll(a, ++i, &ttl))
                return reply_err(c, ERR_INT);
        } else {
            return reply_err(c, ERR_SYNTAX);
        }
    }
    if (srv_config(c->srv)->network_only)
        return reply_ok(c); /* --network-only: the network path alone is measured */
    int64_t expire = 0;
    if (unit) {
        long long mul = (unit == 1 || unit == 3) ? 1000 : 1;
        if (ttl <= 0 || ttl > LLONG_MAX / mul)
            return reply_err(c, "ERR invalid expire time in 'set' command");
        ttl *= mul;
        if (unit <= 2) {
            if (ttl > LLONG_MAX - unix_ms())
                return reply_err(c, "ERR invalid expire time in 'set' command");
            expire = unix_ms() + ttl;
        } else {
            expire = ttl;
        }
    }
    size_t before = c->out->len;
    int rc = kvt_set(c->table, a->argv[1], a->argl[1], a->argv[2], a->argl[2], flags, expire,
                     get ? add_bulk_cb : NULL, c);
    int had_old = c->out->len != before; /* the GET callback queued the old value */
    if (rc < 0) {
        c->out->len = before;
        return write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + a->argl[2]);
    }
    if (get)
        return had_old ? 0 : resp_add_null(c->out, c->resp);
    return rc ? reply_ok(c) : resp_add_null(c->out, c->resp);
}

static int c_mget(struct cmd_client *c, const struct cmd_args *a)
{
    int i = c->resume_i;
    if (!i) {
        resp_add_array(c->out, a->argc - 1);
        i = 1;
    }
    c->resume_i = 0;
    for (; i < a->argc; i++) {
        int rc = kvt_get(c->table, a->argv[i], a->argl[i], add_bulk_cb, c);
        if (rc == -ENODATA) {
            struct bosc *b = srv_config(c->srv)->bosc;
            if (b && bosc_failed(b)) { /* this key cannot be read: its element says why */
                resp_add_errorf(c->out, "ERR %s", bosc_error(b));
                continue;
            }
            c->resume_i = i; /* the values so far stay in out */
            return need_load(c, a->argv[i], a->argl[i]);
        }
        if (!rc)
            resp_add_null(c->out, c->resp);
    }
    return 0;
}

static int c_mset(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc % 2 == 0)
        return reply_err(c, "ERR wrong number of arguments for 'mset' command");
    /* As Redis: the memory bound is checked once, for the whole command (with a
     * generous per-key overhead), then every key is set without it, so an MSET is
     * never half applied because the bound was reached halfway. */
    uint64_t max = kvt_max_memory(c->table);
    if (max) {
        uint64_t need = 0;
        for (int i = 1; i < a->argc; i += 2)
            need += a->argl[i] + a->argl[i + 1] + 64;
        if (kvt_used_memory(c->table) + need > max)
            return wait_for_memory(c, need) ? 0 : reply_err(c, ERR_OOM);
    }
    for (int i = 1; i < a->argc; i += 2) {
        int rc = kvt_set(c->table, a->argv[i], a->argl[i], a->argv[i + 1], a->argl[i + 1], KVT_NOBOUND, 0,
                         NULL, NULL);
        if (rc < 0)
            return reply_write_err(c, rc);
    }
    return reply_ok(c);
}

/* DEL (del = 1) and EXISTS: count over the keys, resumable (see resume_i). */
static int count_keys(struct cmd_client *c, const struct cmd_args *a, int del)
{
    int i = c->resume_i ? c->resume_i : 1;
    long long n = c->resume_i ? c->resume_n : 0;
    c->resume_i = 0;
    for (; i < a->argc; i++) {
        int rc = del ? kvt_del(c->table, a->argv[i], a->argl[i]) : kvt_exists(c->table, a->argv[i], a->argl[i]);
        if (rc == -ENODATA) { /* the keys before stay deleted; carry on with this one once loaded */
            int r = need_load(c, a->argv[i], a->argl[i]);
            if (c->stall) {
                c->resume_i = i;
                c->resume_n = n;
            }
            return r;
        }
        if (rc < 0)
            return reply_write_err(c, rc);
        n += rc;
    }
    return resp_add_int(c->out, n);
}

static int c_del(struct cmd_client *c, const struct cmd_args *a) { return count_keys(c, a, 1); }
static int c_exists(struct cmd_client *c, const struct cmd_args *a) { return count_keys(c, a, 0); }

static int incr_generic(struct cmd_client *c, const struct cmd_args *a, long long delta)
{
    int64_t v;
    int rc = kvt_incrby(c->table, a->argv[1], a->argl[1], delta, &v);
    if (rc == -EINVAL)
        return reply_err(c, ERR_INT);
    if (rc == -ERANGE)
        return reply_err(c, "ERR increment or decrement would overflow");
    if (rc < 0)
        return write_err_key(c, rc, a->argv[1], a->argl[1], a->argl[1] + 24);
    return resp_add_int(c->out, v);
}

static int c_incr(struct cmd_client *c, const struct cmd_args *a) { return incr_generic(c, a, 1); }
static int c_decr(struct cmd_client *c, const struct cmd_args *a) { return incr_generic(c, a, -1); }

static int c_incrby(struct cmd_client *c, const struct cmd_args *a)
{
    long long d;
    if (arg_ll(a, 2, &d))
        return reply_err(c, ERR_INT);
    return incr_generic(c, a, d);
}

static int c_decrby(struct cmd_client *c, const struct cmd_args *a)
{
    long long d;
    if (arg_ll(a, 2, &d))
        return reply_err(c, ERR_INT);
    if (d == LLONG_MIN)
        return reply_err(c, "ERR decrement would overflow");
    return incr_generic(c, a, -d);
}

static int c_append(struct cmd_client *c, const struct cmd_args *a)
{
    int64_t n = kvt_append(c->table, a->argv[1], a->argl[1], a->argv[2], a->argl[2]);
    return n < 0 ? write_err_key(c, n, a->argv[1], a->argl[1], a->argl[1] + a->argl[2]) : resp_add_int(c->out, n);
}

static int c_strlen(struct cmd_client *c, const struct cmd_args *a)
{
    int64_t n = kvt_strlen(c->table, a->argv[1], a->argl[1]);
    return n == -ENODATA ? need_load(c, a->argv[1], a->argl[1]) : resp_add_int(c->out, n);
}

/* ---- CONFIG */

static const char *cfg_params[] = {"bind", "port", "maxclients", "maxmemory", "maxmemory-policy",
                                   "requirepass", "save", "appendonly", "databases", "timeout",
                                   "io-threads", "proto-max-bulk-len", "tcp-backlog", "poll-policy",
                                   "threads"};

/* Redis's memtoull: digits then an optional unit b, k, kb, m, mb, g, gb
 * (k/m/g are powers of 1000, kb/mb/gb of 1024), case-insensitive. */
static int parse_memory(const char *p, size_t n, unsigned long long *out)
{
    size_t i = 0;
    unsigned long long v = 0;
    if (n == 0 || n > 40)
        return -1;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        if (v > (~0ULL - 9) / 10)
            return -1;
        v = v * 10 + (unsigned)(p[i] - '0');
    }
    if (i == 0)
        return -1;
    static const struct { const char *u; unsigned long long mul; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1000}, {"kb", 1024}, {"m", 1000000}, {"mb", 1024 * 1024},
        {"g", 1000000000ULL}, {"gb", 1024ULL * 1024 * 1024}};
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
        if (strlen(units[u].u) == n - i && !strncasecmp(units[u].u, p + i, n - i)) {
            if (v > ~0ULL / units[u].mul)
                return -1;
            *out = v * units[u].mul;
            return 0;
        }
    }
    return -1;
}

static void cfg_value(struct cmd_client *c, const char *name, char *dst, size_t n)
{
    const struct srv_config *cfg = srv_config(c->srv);
    struct kvt_stats st;
    if (!strcmp(name, "bind")) snprintf(dst, n, "%s", cfg->bind);
    else if (!strcmp(name, "port")) snprintf(dst, n, "%d", srv_port(c->srv));
    else if (!strcmp(name, "maxclients")) snprintf(dst, n, "%d", cfg->maxclients);
    else if (!strcmp(name, "maxmemory")) {
        kvt_get_stats(c->table, &st);
        snprintf(dst, n, "%llu", (unsigned long long)st.max_memory);
    } else if (!strcmp(name, "maxmemory-policy")) snprintf(dst, n, "noeviction");
    else if (!strcmp(name, "requirepass")) snprintf(dst, n, "%s", cfg->requirepass ? cfg->requirepass : "");
    else if (!strcmp(name, "save")) snprintf(dst, n, "%s", "");
    else if (!strcmp(name, "appendonly")) snprintf(dst, n, "no");
    else if (!strcmp(name, "databases")) snprintf(dst, n, "1");
    else if (!strcmp(name, "timeout")) snprintf(dst, n, "0");
    else if (!strcmp(name, "io-threads") || !strcmp(name, "threads")) snprintf(dst, n, "%d", cfg->threads);
    else if (!strcmp(name, "proto-max-bulk-len")) snprintf(dst, n, "%lld", (long long)RESP_MAX_BULK);
    else if (!strcmp(name, "tcp-backlog")) snprintf(dst, n, "%d", cfg->tcp_backlog > 0 ? cfg->tcp_backlog : 511);
    else if (!strcmp(name, "poll-policy")) snprintf(dst, n, "%s", cfg->poll_policy);
    else dst[0] = 0;
}

static int c_config(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "GET")) {
        if (!sub_arity(c, a, -3, "config|get"))
            return 0;
        /* Each parameter once; named as the client spelled it when it asked by
         * exact name, as Redis 7 does, by its own name when a pattern matched. */
        enum { NP = sizeof cfg_params / sizeof *cfg_params };
        int from_arg[NP];
        int count = 0;
        for (int j = 0; j < NP; j++)
            from_arg[j] = -1;
        for (int i = 2; i < a->argc; i++) {
            int pattern = memchr(a->argv[i], '*', a->argl[i]) || memchr(a->argv[i], '?', a->argl[i]) ||
                          memchr(a->argv[i], '[', a->argl[i]);
            for (int j = 0; j < NP; j++) {
                if (from_arg[j] != -1)
                    continue;
                if (pattern ? cmd_glob_match(a->argv[i], a->argl[i], cfg_params[j], strlen(cfg_params[j]), 1)
                            : (a->argl[i] == strlen(cfg_params[j]) &&
                               !strncasecmp(a->argv[i], cfg_params[j], a->argl[i]))) {
                    from_arg[j] = pattern ? -2 : i;
                    count++;
                }
            }
        }
        resp_add_map(c->out, c->resp, count);
        for (int i = 2; i <= a->argc; i++) { /* exact names in the order asked, then patterns */
            int want = i < a->argc ? i : -2;
            for (int j = 0; j < NP; j++) {
                if (from_arg[j] != want)
                    continue;
                char v[128];
                cfg_value(c, cfg_params[j], v, sizeof v);
                if (from_arg[j] >= 0)
                    resp_add_bulk(c->out, a->argv[i], a->argl[i]);
                else
                    resp_add_bulk_str(c->out, cfg_params[j]);
                resp_add_bulk_str(c->out, v);
            }
        }
        return 0;
    }
    if (ARGIS(a, 1, "SET")) {
        if (!sub_arity(c, a, -4, "config|set"))
            return 0;
        if (a->argc == 4 && ARGIS(a, 2, "maxmemory")) {
            unsigned long long v;
            if (parse_memory(a->argv[3], a->argl[3], &v))
                return resp_add_errorf(c->out, "ERR CONFIG SET failed (possibly related to argument "
                                               "'maxmemory') - argument must be a memory value");
            kvt_set_max_memory(c->table, v);
            return reply_ok(c);
        }
        return resp_add_errorf(c->out, "ERR Unknown option or number of arguments for CONFIG SET - '%.*s'",
                               (int)(a->argl[2] > 128 ? 128 : a->argl[2]), a->argv[2]);
    }
    if (ARGIS(a, 1, "RESETSTAT")) {
        srv_reset_stats(c->srv);
        return reply_ok(c);
    }
    if (ARGIS(a, 1, "HELP")) {
        resp_add_array(c->out, 4);
        resp_add_status(c->out, "CONFIG <subcommand> [<arg> ...]. Subcommands are:");
        resp_add_status(c->out, "GET <pattern>");
        resp_add_status(c->out, "SET maxmemory <bytes>");
        return resp_add_status(c->out, "RESETSTAT");
    }
    return unknown_sub(c, a, "CONFIG");
}

/* ---- the table */

static int c_command(struct cmd_client *c, const struct cmd_args *a);

static const struct cmd_def commands[] = {
    {"get", 2, F_READONLY | F_FAST, c_get, "string", "Returns the string value of a key.", "1.0.0"},
    {"set", -3, F_WRITE | F_DENYOOM, c_set, "string", "Sets the string value of a key, ignoring its type.", "1.0.0"},
    {"mget", -2, F_READONLY | F_FAST, c_mget, "string", "Atomically returns the string values of one or more keys.", "1.0.0"},
    {"mset", -3, F_WRITE | F_DENYOOM, c_mset, "string", "Creates or modifies the string values of one or more keys.", "1.0.1"},
    {"del", -2, F_WRITE, c_del, "generic", "Deletes one or more keys.", "1.0.0"},
    {"exists", -2, F_READONLY | F_FAST, c_exists, "generic", "Determines whether one or more keys exist.", "1.0.0"},
    {"incr", 2, F_WRITE | F_DENYOOM | F_FAST, c_incr, "string", "Increments the integer value of a key by one.", "1.0.0"},
    {"decr", 2, F_WRITE | F_DENYOOM | F_FAST, c_decr, "string", "Decrements the integer value of a key by one.", "1.0.0"},
    {"incrby", 3, F_WRITE | F_DENYOOM | F_FAST, c_incrby, "string", "Increments the integer value of a key by a number.", "1.0.0"},
    {"decrby", 3, F_WRITE | F_DENYOOM | F_FAST, c_decrby, "string", "Decrements a number from the integer value of a key.", "1.0.0"},
    {"append", 3, F_WRITE | F_DENYOOM, c_append, "string", "Appends a string to the value of a key.", "2.0.0"},
    {"strlen", 2, F_READONLY | F_FAST, c_strlen, "string", "Returns the length of a string value.", "2.2.0"},
    {"ping", -1, F_FAST, c_ping, "connection", "Returns the server's liveliness response.", "1.0.0"},
    {"echo", 2, F_FAST, c_echo, "connection", "Returns the given string.", "1.0.0"},
    {"quit", -1, F_NOAUTH | F_FAST, c_quit, "connection", "Closes the connection.", "1.0.0"},
    {"auth", -2, F_NOAUTH | F_FAST, c_auth, "connection", "Authenticates the connection.", "1.0.0"},
    {"hello", -1, F_NOAUTH | F_FAST, c_hello, "connection", "Handshakes with the server.", "6.0.0"},
    {"select", 2, F_FAST, c_select, "connection", "Changes the selected database (only 0 exists).", "1.0.0"},
    {"client", -2, 0, c_client, "connection", "A container for client connection commands.", "2.4.0"},
    {"dbsize", 1, F_READONLY | F_FAST, c_dbsize, "server", "Returns the number of keys in the database.", "1.0.0"},
    {"flushall", -1, F_WRITE, c_flushall, "server", "Removes all keys from all databases.", "1.0.0"},
    {"flushdb", -1, F_WRITE, c_flushall, "server", "Remove all keys from the current database.", "1.0.0"},
    {"info", -1, 0, c_info, "server", "Returns information and statistics about the server.", "1.0.0"},
    {"config", -2, 0, c_config, "server", "A container for server configuration commands.", "2.0.0"},
    {"command", -1, 0, c_command, "server", "Returns detailed information about all commands.", "2.8.13"},
    {"time", 1, F_FAST, c_time, "server", "Returns the server time.", "2.6.0"},
};
#define NCOMMANDS (int)(sizeof commands / sizeof commands[0])

int cmd_count(void) { return NCOMMANDS; }

static const struct cmd_def *lookup(const char *name, size_t n)
{
    if (n == 0)
        return NULL;
    int first = tolower_ascii((unsigned char)name[0]);
    for (int i = 0; i < NCOMMANDS; i++)
        if (commands[i].name[0] == first && strlen(commands[i].name) == n &&
            !strncasecmp(commands[i].name, name, n))
            return &commands[i];
    return NULL;
}

static void add_flags(struct cmd_client *c, int f)
{
    int n = !!(f & F_WRITE) + !!(f & F_READONLY) + !!(f & F_NOAUTH) + !!(f & F_FAST) + !!(f & F_DENYOOM);
    resp_add_set(c->out, c->resp, n);
    if (f & F_WRITE) resp_add_status(c->out, "write");
    if (f & F_READONLY) resp_add_status(c->out, "readonly");
    if (f & F_DENYOOM) resp_add_status(c->out, "denyoom");
    if (f & F_NOAUTH) resp_add_status(c->out, "no_auth");
    if (f & F_FAST) resp_add_status(c->out, "fast");
}

/* COMMAND reply entry: name, arity, flags, first key, last key, step, acl categories,
 * tips, key specs, subcommands (Redis 7 layout). */
static void add_info(struct cmd_client *c, const struct cmd_def *d)
{
    int keys = (d->flags & (F_WRITE | F_READONLY)) && strcmp(d->name, "flushall") &&
               strcmp(d->name, "flushdb") && strcmp(d->name, "dbsize");
    int last = !keys ? 0 : (d->arity < 0 && strcmp(d->name, "set") ? -1 : 1);
    int step = !keys ? 0 : (!strcmp(d->name, "mset") ? 2 : 1);
    resp_add_array(c->out, 10);
    resp_add_bulk_str(c->out, d->name);
    resp_add_int(c->out, d->arity);
    add_flags(c, d->flags);
    resp_add_int(c->out, keys);
    resp_add_int(c->out, last);
    resp_add_int(c->out, step);
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

static int c_command(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc == 1) {
        resp_add_array(c->out, NCOMMANDS);
        for (int i = 0; i < NCOMMANDS; i++)
            add_info(c, &commands[i]);
        return 0;
    }
    if (ARGIS(a, 1, "COUNT"))
        return sub_arity(c, a, 2, "command|count") ? resp_add_int(c->out, NCOMMANDS) : 0;
    if (ARGIS(a, 1, "INFO")) {
        if (a->argc == 2) {
            resp_add_array(c->out, NCOMMANDS);
            for (int i = 0; i < NCOMMANDS; i++)
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
            resp_add_map(c->out, c->resp, NCOMMANDS);
            for (int i = 0; i < NCOMMANDS; i++)
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
        resp_add_array(c->out, NCOMMANDS);
        for (int i = 0; i < NCOMMANDS; i++)
            resp_add_bulk_str(c->out, commands[i].name);
        return 0;
    }
    return unknown_sub(c, a, "COMMAND");
}

int cmd_dispatch(struct cmd_client *c, int argc, const char **argv, const size_t *argl)
{
    const struct cmd_def *d = lookup(argv[0], argl[0]);
    struct cmd_args a = {argc, argv, argl};
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
        return resp_add_errorf(c->out, "ERR unknown command '%.*s', with args beginning with: %s",
                               (int)(argl[0] > 128 ? 128 : argl[0]), argv[0], args);
    }
    if ((d->arity > 0 && argc != d->arity) || (d->arity < 0 && argc < -d->arity))
        return resp_add_errorf(c->out, "ERR wrong number of arguments for '%s' command", d->name);
    if (!c->authenticated && !(d->flags & F_NOAUTH))
        return reply_err(c, "NOAUTH Authentication required.");
    return d->fn(c, &a);
}

/* ---- glob matching for CONFIG GET (same semantics as Redis's stringmatchlen) */

int cmd_glob_match(const char *p, size_t plen, const char *s, size_t slen, int nocase)
{
    while (plen && slen) {
        switch (*p) {
        case '*':
            while (plen > 1 && p[1] == '*') {
                p++;
                plen--;
            }
            if (plen == 1)
                return 1;
            for (size_t i = 0; i <= slen; i++)
                if (cmd_glob_match(p + 1, plen - 1, s + i, slen - i, nocase))
                    return 1;
            return 0;
        case '?':
            s++;
            slen--;
            break;
        case '[': {
            p++;
            plen--;
            int neg = plen && *p == '^';
            if (neg) {
                p++;
                plen--;
            }
            int match = 0;
            while (plen && *p != ']') {
                if (*p == '\\' && plen >= 2) {
                    p++;
                    plen--;
                    if (*p == *s)
                        match = 1;
                } else if (plen >= 3 && p[1] == '-') {
                    char lo = p[0], hi = p[2], ch = *s;
                    if (lo > hi) {
                        char t = lo;
                        lo = hi;
                        hi = t;
                    }
                    if (nocase) {
                        lo = (char)tolower_ascii(lo);
                        hi = (char)tolower_ascii(hi);
                        ch = (char)tolower_ascii(ch);
                    }
                    if (ch >= lo && ch <= hi)
                        match = 1;
                    p += 2;
                    plen -= 2;
                } else if (nocase ? tolower_ascii(*p) == tolower_ascii(*s) : *p == *s) {
                    match = 1;
                }
                p++;
                plen--;
            }
            if (!plen) /* unterminated class: treat like Redis, as the end */
                return 0;
            if (neg)
                match = !match;
            if (!match)
                return 0;
            s++;
            slen--;
            break;
        }
        case '\\':
            if (plen >= 2) {
                p++;
                plen--;
            }
            /* fall through */
        default:
            if (nocase ? tolower_ascii(*p) != tolower_ascii(*s) : *p != *s)
                return 0;
            s++;
            slen--;
            break;
        }
        p++;
        plen--;
    }
    while (plen && *p == '*') {
        p++;
        plen--;
    }
    return plen == 0 && slen == 0;
}
