/* stats.c - what every request feeds: command statistics (engine/cmdstats.h),
 * error kinds, the slow log and the latency monitor's command events; and the
 * INFO lines made of them (commandstats, errorstats, latencystats,
 * total_error_replies, blocked_clients). Statistic slots: a command's index in
 * the table, then Redis 7's subcommands of the container commands (counted as
 * "config|get", as Redis does). Runs on front-end threads; request path:
 * cmd_stats_ran. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/latmon.h"
#include "engine/cmdstats.h"
#include "engine/engine.h"

/* Redis 7.0's subcommands of the containers kvstore has (COMMAND's subcommand
 * lists), so a subcommand gets its own line whether kvstore supports it or not. */
static const struct container {
    const char *name;
    const char *subs[20];
} containers[] = {
    {"client", {"caching", "getname", "getredir", "help", "id", "info", "kill", "list", "no-evict", "pause",
                "reply", "setname", "tracking", "trackinginfo", "unblock", "unpause"}},
    {"config", {"get", "help", "resetstat", "rewrite", "set"}},
    {"cluster", {"countkeysinslot", "getkeysinslot", "help", "info", "keyslot", "lease", "myid", "nodes", "setmap",
                 "shards", "slots"}},
    {"command", {"count", "docs", "getkeys", "getkeysandflags", "help", "info", "list"}},
    {"object", {"encoding", "freq", "help", "idletime", "refcount"}},
    {"slowlog", {"get", "help", "len", "reset"}},
    {"latency", {"doctor", "graph", "help", "histogram", "history", "latest", "reset"}},
    {"memory", {"doctor", "help", "malloc-stats", "purge", "stats", "usage"}},
};
#define NCONTAINERS (int)(sizeof containers / sizeof containers[0])

/* Built once: command index -> its container (or -1), and each container's first sub slot. */
static struct {
    pthread_once_t once;
    int ncmd;
    signed char container[CST_SLOTS];
    int first_sub[NCONTAINERS];
    int nslots;
} map = {.once = PTHREAD_ONCE_INIT};

static void build_map(void)
{
    int n = 0;
    while (cmd_def_at(n))
        n++;
    map.ncmd = n < CST_SLOTS ? n : CST_SLOTS;
    int next = map.ncmd;
    for (int i = 0; i < map.ncmd; i++)
        map.container[i] = -1;
    for (int k = 0; k < NCONTAINERS; k++) {
        int subs = 0;
        while (subs < 20 && containers[k].subs[subs])
            subs++;
        map.first_sub[k] = next + subs <= CST_SLOTS ? next : -1; /* (no room: counted as the container) */
        if (map.first_sub[k] >= 0)
            next += subs;
        for (int i = 0; i < map.ncmd; i++)
            if (!strcmp(cmd_def_at(i)->name, containers[k].name))
                map.container[i] = (signed char)k;
    }
    map.nslots = next;
}

/* The slot a request counts in: its command, or its container's subcommand;
 * -1 for an unknown subcommand (Redis counts that only as an error). */
static int slot_of(int cmd, int argc, const char **argv, const size_t *argl)
{
    pthread_once(&map.once, build_map);
    if (cmd < 0 || cmd >= map.ncmd)
        return -1;
    int k = map.container[cmd];
    if (k < 0 || argc < 2 || map.first_sub[k] < 0)
        return cmd;
    for (int j = 0; j < 20 && containers[k].subs[j]; j++)
        if (strlen(containers[k].subs[j]) == argl[1] && !strncasecmp(containers[k].subs[j], argv[1], argl[1]))
            return map.first_sub[k] + j;
    return -1;
}

/* Name of slot i ("get", "config|get") into buf. */
static const char *slot_name(int i, char *buf, size_t n)
{
    if (i < map.ncmd)
        return cmd_def_at(i)->name;
    for (int k = 0; k < NCONTAINERS; k++)
        for (int j = 0; j < 20 && containers[k].subs[j]; j++)
            if (map.first_sub[k] + j == i) {
                snprintf(buf, n, "%s|%s", containers[k].name, containers[k].subs[j]);
                return buf;
            }
    return "?";
}

uint64_t cmd_stats_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* vDSO: no system call */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void gauge_add(_Atomic int64_t *g, int64_t d)
{
    atomic_store_explicit(g, atomic_load_explicit(g, memory_order_relaxed) + d, memory_order_relaxed);
}

void cmd_stats_unblock(struct cmd_client *c)
{
    if (!c->blocked)
        return;
    c->blocked = 0;
    struct cst_block *b = cst_block(c->eng->stats);
    if (b)
        gauge_add(&b->blocked, -1);
}

/* The error reply at out offset at, if the reply is one: its text after '-'. */
static const char *error_at(struct cmd_client *c, size_t at, size_t *n)
{
    if (c->out->len <= at || c->out->p[at] != '-')
        return NULL;
    *n = c->out->len - at - 1;
    return c->out->p + at + 1;
}

/* Refusals a handler makes before doing anything (Redis makes them before calling
 * it, and counts them as rejected, not failed): a subcommand's arity, OOM. */
static int is_rejection(const char *e, size_t n)
{
    static const char arity[] = "ERR wrong number of arguments";
    return (n >= sizeof arity - 1 && !memcmp(e, arity, sizeof arity - 1)) || (n >= 4 && !memcmp(e, "OOM ", 4));
}

/* The slow log's copy of the arguments hides secrets, as Redis's redaction does:
 * AUTH's arguments and HELLO's after AUTH. */
static void slowlog_push(struct cmd_client *c, const struct cmd_def *d, uint64_t us, int argc, const char **argv,
                         const size_t *argl)
{
    const char *av[CST_SLOW_ARGS];
    size_t al[CST_SLOW_ARGS];
    int n = argc < CST_SLOW_ARGS ? argc : CST_SLOW_ARGS, redact = 0;
    for (int i = 0; i < n; i++) {
        av[i] = argv[i];
        al[i] = argl[i];
        if (redact || (i > 0 && d->fn == c_auth)) {
            av[i] = "(redacted)";
            al[i] = 10;
        } else if (d->fn == c_hello && al[i] == 4 && !strncasecmp(av[i], "AUTH", 4)) {
            redact = 1; /* the user and the password that follow */
        }
    }
    /* (past 32 arguments the 32nd becomes their count: argv[31..] is not read) */
    cst_slowlog_push(c->eng->stats, argc, av, al, us, c->addr, c->name);
}

void cmd_stats_ran(struct cmd_client *c, int cmd, uint64_t ns, size_t at, int argc, const char **argv,
                   const size_t *argl)
{
    struct kv_engine *e = c->eng;
    struct cst_block *b = cst_block(e->stats);
    if (!b)
        return;
    if (c->stall) { /* it runs again: counted then, with this run's time */
        c->stall_ns += ns;
        if (!c->blocked) {
            c->blocked = 1;
            gauge_add(&b->blocked, 1);
        }
        return;
    }
    if (c->blocked) {
        c->blocked = 0;
        gauge_add(&b->blocked, -1);
    }
    ns += c->stall_ns;
    c->stall_ns = 0;
    size_t n = 0;
    const char *err = error_at(c, at, &n);
    int rejected = err && is_rejection(err, n);
    if (err)
        cst_error(e->stats, b, err, n);
    int slot = slot_of(cmd, argc, argv, argl);
    if (slot >= 0)
        cst_count(b, slot, ns, err != NULL, rejected);
    if (rejected)
        return;
    const struct cmd_def *d = cmd_def_at(cmd);
    long long slower = cst_slowlog_slower_than(e->stats);
    if (slower >= 0 && ns / 1000 >= (uint64_t)slower && d->fn != c_exec) /* EXEC: its commands are logged */
        slowlog_push(c, d, ns / 1000, argc, argv, argl);
    latmon_add(e->latmon, (d->flags & F_FAST) ? LM_FAST_COMMAND : LM_COMMAND, ns);
}

void cmd_stats_refused(struct cmd_client *c, int cmd, int rejected, size_t at, int argc, const char **argv,
                       const size_t *argl)
{
    size_t n = 0;
    const char *err = error_at(c, at, &n);
    if (!err)
        return; /* queued */
    struct cst_block *b = cst_block(c->eng->stats);
    if (!b)
        return;
    cst_error(c->eng->stats, b, err, n);
    int slot = rejected ? slot_of(cmd, argc, argv, argl) : -1;
    if (slot >= 0)
        cst_count(b, slot, 0, 0, 1);
}

/* ---- INFO */

static void info_commandstats(struct cst *st, struct kvbuf *b)
{
    char name[64];
    for (int i = 0; i < map.nslots; i++) {
        struct cst_slot s;
        cst_sum_slot(st, i, &s);
        uint64_t calls = s.calls, usec = s.ns / 1000;
        if (!calls && !s.rejected && !s.failed)
            continue;
        kvbuf_printf(b, "cmdstat_%s:calls=%llu,usec=%llu,usec_per_call=%.2f,rejected_calls=%llu,failed_calls=%llu\r\n",
                     slot_name(i, name, sizeof name), (unsigned long long)calls, (unsigned long long)usec,
                     calls ? (double)usec / (double)calls : 0.0, (unsigned long long)s.rejected,
                     (unsigned long long)s.failed);
    }
}

static void info_latencystats(struct cst *st, struct kvbuf *b)
{
    char name[64];
    uint64_t *h = malloc(CST_HLEN * sizeof *h);
    if (!h)
        return;
    for (int i = 0; i < map.nslots; i++) {
        uint64_t total = cst_sum_hist(st, i, h);
        if (!total)
            continue;
        /* Redis's default latency-tracking-info-percentiles: 50 99 99.9, in us */
        kvbuf_printf(b, "latency_percentiles_usec_%s:p50=%.3f,p99=%.3f,p99.9=%.3f\r\n", slot_name(i, name, sizeof name),
                     (double)cst_hist_quantile(h, total, 0.50) / 1000.0,
                     (double)cst_hist_quantile(h, total, 0.99) / 1000.0,
                     (double)cst_hist_quantile(h, total, 0.999) / 1000.0);
    }
    free(h);
}

/* The providers of the command layer's INFO lines, registered with the engine's
 * INFO registry (cmd_stats_register) so that INFO and the control plane's srv_info
 * render the same lines. arg is the engine. */
static void info_clients(void *arg, struct kvbuf *b)
{
    /* requests waiting for the data file (a key to load, memory the flusher frees,
     * a sweep, a key listing); replies held for the log's sync are not counted */
    kvbuf_printf(b, "blocked_clients:%lld\r\n", (long long)cst_blocked(((struct kv_engine *)arg)->stats));
}

static void info_stats(void *arg, struct kvbuf *b)
{
    kvbuf_printf(b, "total_error_replies:%llu\r\n",
                 (unsigned long long)cst_total_errors(((struct kv_engine *)arg)->stats));
}

static void info_errorstats(void *arg, struct kvbuf *b)
{
    uint64_t n;
    const char *kind;
    for (int i = 0; (kind = cst_errkind(((struct kv_engine *)arg)->stats, i, &n)); i++)
        if (n)
            kvbuf_printf(b, "errorstat_%s:count=%llu\r\n", kind, (unsigned long long)n);
}

static void info_commandstats_fn(void *arg, struct kvbuf *b)
{
    pthread_once(&map.once, build_map);
    info_commandstats(((struct kv_engine *)arg)->stats, b);
}

static void info_latencystats_fn(void *arg, struct kvbuf *b)
{
    pthread_once(&map.once, build_map);
    info_latencystats(((struct kv_engine *)arg)->stats, b);
}

int cmd_stats_register(struct kv_engine *e)
{
    int rc = cmd_client_mem_register(e); /* client_recent_max_* come before blocked_clients */
    if (!rc)
        rc = eng_info_add(e, "clients", info_clients, NULL, e);
    if (!rc)
        rc = eng_info_add(e, "stats", info_stats, NULL, e);
    if (!rc)
        rc = eng_info_add(e, "commandstats", info_commandstats_fn, NULL, e);
    if (!rc)
        rc = eng_info_add(e, "errorstats", info_errorstats, NULL, e);
    if (!rc)
        rc = eng_info_add(e, "latencystats", info_latencystats_fn, NULL, e);
    return rc;
}
