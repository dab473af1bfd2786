/* config.c - CONFIG GET/SET/RESETSTAT/HELP: the Redis parameters clients and
 * tools ask for, answered from the engine's settings. Runs on front-end threads:
 * the settings CONFIG SET changes while they run (client-timeout-ms, maxclients)
 * are stored and read with relaxed atomics. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "core/glob.h"
#include "core/latmon.h"
#include "core/log.h"
#include "core/table.h"
#include "engine/cmdstats.h"
#include "engine/engine.h"

/* Redis's memtoull: digits then an optional unit b, k, kb, m, mb, g, gb
 * (k/m/g are powers of 1000, kb/mb/gb of 1024), case-insensitive. */
int cmd_parse_memory(const char *p, size_t n, unsigned long long *out)
{
    size_t i = 0;
    unsigned long long v = 0;
    if (n == 0 || n > 40)
        return -EINVAL;
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
        if (v > (~0ULL - 9) / 10)
            return -EINVAL;
        v = v * 10 + (unsigned)(p[i] - '0');
    }
    if (i == 0)
        return -EINVAL;
    static const struct { const char *u; unsigned long long mul; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1000}, {"kb", 1024}, {"m", 1000000}, {"mb", 1024 * 1024},
        {"g", 1000000000ULL}, {"gb", 1024ULL * 1024 * 1024}};
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
        if (strlen(units[u].u) == n - i && !strncasecmp(units[u].u, p + i, n - i)) {
            if (v > ~0ULL / units[u].mul)
                return -EINVAL;
            *out = v * units[u].mul;
            return 0;
        }
    }
    return -EINVAL;
}

/* CONFIG GET's parameters, in the order a pattern lists them: each one's value,
 * from the engine's settings. One table, so a name cannot lack its value. */
typedef void (*param_fn)(struct cmd_client *c, char *dst, size_t n);
#define PARAM_STR(fn, expr) static void fn(struct cmd_client *c, char *dst, size_t n) { snprintf(dst, n, "%s", expr); }
#define PARAM_INT(fn, expr) static void fn(struct cmd_client *c, char *dst, size_t n) { snprintf(dst, n, "%lld", (long long)(expr)); }
PARAM_STR(p_bind, c->eng->cfg.bind)
PARAM_INT(p_port, c->eng->port)
PARAM_INT(p_maxclients, __atomic_load_n(&c->eng->cfg.maxclients, __ATOMIC_RELAXED))
PARAM_INT(p_client_timeout, __atomic_load_n(&c->eng->cfg.client_timeout_ms, __ATOMIC_RELAXED))
PARAM_INT(p_maxmemory, kvt_max_memory(c->table))
PARAM_STR(p_noeviction, "noeviction")
PARAM_STR(p_requirepass, c->eng->cfg.requirepass ? c->eng->cfg.requirepass : "")
PARAM_STR(p_empty, "")
PARAM_STR(p_no, "no")
PARAM_INT(p_one, 1)
PARAM_INT(p_zero, 0)
PARAM_INT(p_threads, c->eng->cfg.threads)
PARAM_INT(p_max_bulk, RESP_MAX_BULK)
PARAM_INT(p_backlog, c->eng->cfg.tcp_backlog > 0 ? c->eng->cfg.tcp_backlog : 511)
PARAM_STR(p_poll_policy, c->eng->cfg.poll_policy)
PARAM_INT(p_slower_than, cst_slowlog_slower_than(c->eng->stats))
PARAM_INT(p_slow_max_len, cst_slowlog_max_len(c->eng->stats))
PARAM_INT(p_latency_threshold, latmon_threshold(c->eng->latmon))
PARAM_STR(p_latency_percentiles, "50 99 99.9")
PARAM_STR(p_yes, "yes")
PARAM_INT(p_tls_port, c->eng->tls_port > 0 ? c->eng->tls_port : 0) /* Redis: 0 = no TLS port */
PARAM_STR(p_tls_auth, c->eng->tls_auth ? c->eng->tls_auth : "yes")
static void p_mmc(struct cmd_client *c, char *dst, size_t n) { cmd_client_mem_get(c, 0, dst, n); }
static void p_cobl(struct cmd_client *c, char *dst, size_t n) { cmd_client_mem_get(c, 1, dst, n); }

static const struct param {
    const char *name;
    param_fn value;
} params[] = {
    {"bind", p_bind},           {"port", p_port},         {"maxclients", p_maxclients},
    {"maxmemory", p_maxmemory}, {"maxmemory-policy", p_noeviction}, {"requirepass", p_requirepass},
    {"save", p_empty},          {"appendonly", p_no},     {"databases", p_one},
    {"timeout", p_zero},        {"io-threads", p_threads}, {"proto-max-bulk-len", p_max_bulk},
    {"tcp-backlog", p_backlog}, {"poll-policy", p_poll_policy}, {"threads", p_threads},
    {"slowlog-log-slower-than", p_slower_than}, {"slowlog-max-len", p_slow_max_len},
    {"latency-monitor-threshold", p_latency_threshold}, {"latency-tracking", p_yes},
    {"latency-tracking-info-percentiles", p_latency_percentiles},
    {"tls-port", p_tls_port}, {"tls-auth-clients", p_tls_auth},
    {"maxmemory-clients", p_mmc}, {"client-output-buffer-limit", p_cobl},
    {"client-timeout-ms", p_client_timeout},
};

/* Descriptors the server keeps besides its clients': kvstore/server.py's FD_RESERVE
 * plus 4 per front-end thread (epoll, eventfd, listener, spare), as it counts them
 * when it fits maxclients to RLIMIT_NOFILE at start. */
#define FD_RESERVE 64
#define FD_PER_THREAD 4

/* How many clients the open-file limit holds, after raising it towards
 * maxclients + the reserve as far as allowed (the hard limit too when privileged),
 * as Redis's adjustOpenFilesLimit does on CONFIG SET maxclients. */
static long long clients_fd_limit_holds(struct kv_engine *e, long long maxclients)
{
    long long reserve = FD_RESERVE + (long long)FD_PER_THREAD * e->cfg.threads;
    rlim_t need = (rlim_t)(maxclients + reserve);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return 0;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        struct rlimit up = {need, rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? rl.rlim_max : need};
        if (setrlimit(RLIMIT_NOFILE, &up)) { /* unprivileged: up to the hard limit */
            up.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
            up.rlim_max = rl.rlim_max;
            if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                rl.rlim_cur = up.rlim_cur;
        } else {
            rl.rlim_cur = up.rlim_cur;
        }
    }
    long long holds = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need ? maxclients
                                                                           : (long long)rl.rlim_cur - reserve;
    return holds < 0 ? 0 : holds > INT_MAX ? INT_MAX : holds; /* (maxclients is an int) */
}

/* CONFIG SET maxclients: refused, with Redis's error text, when the open-file limit
 * cannot hold that many clients (the setting is left as it was); the connections
 * already open beyond a lowered maxclients stay, as in Redis. */
static int set_maxclients(struct cmd_client *c, long long v)
{
    long long holds = clients_fd_limit_holds(c->eng, v);
    if (holds < v) {
        static struct kvlog_rate rate = KVLOG_RATE_INIT(5);
        kvlog_rated(&rate, KVLOG_WARNING, "CONFIG SET maxclients %lld refused: the open-file limit holds %lld "
                    "clients (raise it, e.g. LimitNOFILE or ulimit -n)", v, holds);
        return resp_add_errorf(c->out, "ERR CONFIG SET failed (possibly related to argument 'maxclients') - The "
                                       "operating system is not able to handle the specified number of clients, "
                                       "try with %lld", holds);
    }
    __atomic_store_n(&c->eng->cfg.maxclients, (int)v, __ATOMIC_RELAXED); /* v <= holds <= INT_MAX */
    return cmd_reply_ok(c);
}

/* CONFIG SET of the statistics' integer parameters: Redis's messages for a value
 * that is not an integer or out of [lo, hi]. 1 if name was one of them (answered). */
static int set_stat_param(struct cmd_client *c, const struct cmd_args *a, int *rc)
{
    static const struct { const char *name; long long lo, hi; } ints[] = {
        {"slowlog-log-slower-than", -1, 9223372036854775807LL},
        {"slowlog-max-len", 0, 10000}, /* (bounded: each entry may hold 4 KB of arguments) */
        {"latency-monitor-threshold", 0, 2147483647LL},
        {"client-timeout-ms", 0, 3600000}, /* --client-timeout-ms's bounds */
        {"maxclients", 1, 4294967295LL},   /* Redis's (an unsigned int) */
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if (a->argl[2] != strlen(ints[i].name) || strncasecmp(a->argv[2], ints[i].name, a->argl[2]))
            continue;
        long long v;
        if (cmd_arg_ll(a, 3, &v))
            *rc = resp_add_errorf(c->out, "ERR CONFIG SET failed (possibly related to argument '%s') - argument "
                                          "couldn't be parsed into an integer", ints[i].name);
        else if (v < ints[i].lo || v > ints[i].hi)
            *rc = resp_add_errorf(c->out, "ERR CONFIG SET failed (possibly related to argument '%s') - argument "
                                          "must be between %lld and %lld inclusive", ints[i].name, ints[i].lo,
                                  ints[i].hi);
        else if (i == 4)
            *rc = set_maxclients(c, v);
        else {
            if (i == 0)
                cst_slowlog_set_slower_than(c->eng->stats, v);
            else if (i == 1)
                cst_slowlog_set_max_len(c->eng->stats, v);
            else if (i == 2)
                latmon_set_threshold(c->eng->latmon, (uint32_t)v);
            else /* the thread pool's next wait uses it */
                __atomic_store_n(&c->eng->cfg.client_timeout_ms, (int)v, __ATOMIC_RELAXED);
            *rc = cmd_reply_ok(c);
        }
        return 1;
    }
    return 0;
}
#define NPARAMS (int)(sizeof params / sizeof params[0])

int c_config(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "GET")) {
        if (!cmd_sub_arity(c, a, -3, "config|get"))
            return 0;
        /* Each parameter once; named as the client spelled it when it asked by
         * exact name, as Redis 7 does, by its own name when a pattern matched. */
        enum { NP = NPARAMS };
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
                const char *name = params[j].name;
                if (pattern ? glob_match(a->argv[i], a->argl[i], name, strlen(name), 1)
                            : (a->argl[i] == strlen(name) && !strncasecmp(a->argv[i], name, a->argl[i]))) {
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
                params[j].value(c, v, sizeof v);
                if (from_arg[j] >= 0)
                    resp_add_bulk(c->out, a->argv[i], a->argl[i]);
                else
                    resp_add_bulk_str(c->out, params[j].name);
                resp_add_bulk_str(c->out, v);
            }
        }
        return 0;
    }
    if (ARGIS(a, 1, "SET")) {
        if (!cmd_sub_arity(c, a, -4, "config|set"))
            return 0;
        if (a->argc == 4 && ARGIS(a, 2, "maxmemory")) {
            unsigned long long v;
            if (cmd_parse_memory(a->argv[3], a->argl[3], &v))
                return resp_add_errorf(c->out, "ERR CONFIG SET failed (possibly related to argument "
                                               "'maxmemory') - argument must be a memory value");
            kvt_set_max_memory(c->table, v);
            return cmd_reply_ok(c);
        }
        int rc;
        if (a->argc == 4 && set_stat_param(c, a, &rc))
            return rc;
        if (a->argc == 4 && cmd_client_mem_set(c, a->argv[2], a->argl[2], a->argv[3], a->argl[3], &rc))
            return rc;
        return resp_add_errorf(c->out, "ERR Unknown option or number of arguments for CONFIG SET - '%.*s'",
                               (int)(a->argl[2] > 128 ? 128 : a->argl[2]), a->argv[2]);
    }
    if (ARGIS(a, 1, "RESETSTAT")) {
        eng_reset_stats(c->eng);
        return cmd_reply_ok(c);
    }
    if (ARGIS(a, 1, "HELP")) {
        static const char *const help[] = {
            "CONFIG <subcommand> [<arg> ...]. Subcommands are:", "GET <pattern>",
            "SET maxmemory|maxmemory-clients|client-output-buffer-limit|slowlog-log-slower-than|slowlog-max-len|"
            "latency-monitor-threshold|client-timeout-ms|maxclients <value>", "RESETSTAT"};
        return CMD_REPLY_HELP(c, help);
    }
    return cmd_unknown_sub(c, a, "CONFIG");
}
