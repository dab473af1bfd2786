/* ops.c - the operator's commands, Redis 7.0's replies: SLOWLOG GET/LEN/RESET/HELP
 * (the slow log kept by engine/cmdstats.c), LATENCY LATEST/HISTORY/RESET/DOCTOR/HELP
 * (the monitor of core/latmon.h: log syncs, flusher sweeps, slow commands) and
 * MEMORY USAGE/HELP (the table's own accounting of a key). Front-end threads;
 * arguments are untrusted: counts are parsed with Redis's rules and bounded. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/latmon.h"
#include "core/table.h"
#include "engine/cmdstats.h"
#include "engine/engine.h"

/* ---- SLOWLOG */

static const char *const slowlog_help[] = {
    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET [<count>]",
    "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
    "    Entries are made of:",
    "    id, timestamp, time in microseconds, arguments array, client IP and port,",
    "    client name",
    "LEN",
    "    Return the length of the slowlog.",
    "RESET",
    "    Reset the slowlog.",
    "HELP",
    "    Prints this help.",
};

static int slowlog_get(struct cmd_client *c, const struct cmd_args *a)
{
    long long count = 10;
    if (a->argc == 3 && (cmd_arg_ll(a, 2, &count) || count < -1))
        return cmd_reply_err(c, "ERR count should be greater than or equal to -1");
    struct cst_slow *e;
    int n = cst_slowlog_get(c->eng->stats, count, &e);
    if (n < 0)
        return cmd_reply_err(c, ERR_NOMEM);
    int rc = resp_add_array(c->out, n);
    for (int i = 0; i < n && !rc; i++) {
        resp_add_array(c->out, 6);
        resp_add_int(c->out, (long long)e[i].id);
        resp_add_int(c->out, e[i].time);
        resp_add_int(c->out, (long long)e[i].usec);
        resp_add_array(c->out, e[i].argc);
        for (int j = 0; j < e[i].argc; j++)
            resp_add_bulk(c->out, e[i].argv[j], e[i].argl[j]);
        resp_add_bulk_str(c->out, e[i].addr);
        rc = resp_add_bulk_str(c->out, e[i].name);
    }
    cst_slowlog_free(e, n);
    return rc;
}

int c_slowlog(struct cmd_client *c, const struct cmd_args *a)
{
    struct cst *st = c->eng->stats;
    if (ARGIS(a, 1, "HELP"))
        return cmd_sub_arity(c, a, 2, "slowlog|help")
                   ? CMD_REPLY_HELP(c, slowlog_help)
                   : 0;
    if (ARGIS(a, 1, "LEN"))
        return cmd_sub_arity(c, a, 2, "slowlog|len") ? resp_add_int(c->out, cst_slowlog_len(st)) : 0;
    if (ARGIS(a, 1, "RESET")) {
        if (!cmd_sub_arity(c, a, 2, "slowlog|reset"))
            return 0;
        cst_slowlog_reset(st);
        return cmd_reply_ok(c);
    }
    if (ARGIS(a, 1, "GET")) {
        if (a->argc > 3) /* Redis: arity -2 passes, the handler refuses */
            return resp_add_errorf(c->out, "ERR unknown subcommand or wrong number of arguments for '%.*s'. "
                                           "Try SLOWLOG HELP.", (int)a->argl[1], a->argv[1]);
        return slowlog_get(c, a);
    }
    return cmd_unknown_sub(c, a, "SLOWLOG");
}

/* ---- LATENCY */

static const char *const latency_help[] = {
    "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return a human readable latency analysis report.",
    "GRAPH <event>",
    "    Return an ASCII latency graph for the <event> class.",
    "HISTORY <event>",
    "    Return time-latency samples for the <event> class.",
    "LATEST",
    "    Return the latest latency samples for all events.",
    "RESET [<event> ...]",
    "    Reset latency data of one or more <event> classes.",
    "    (default: reset all data for all event classes)",
    "HISTOGRAM [COMMAND ...]",
    "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
    "    If no commands are specified then all histograms are replied.",
    "HELP",
    "    Prints this help.",
};

static int latency_latest(struct cmd_client *c, struct latmon_series *s)
{
    struct { int ev; struct latmon_sample last; uint32_t max; } row[LM_NEVENTS];
    int n = 0;
    for (int ev = 0; ev < LM_NEVENTS; ev++)
        if (latmon_get(c->eng->latmon, ev, s) == 0 && s->n > 0)
            row[n++] = (typeof(row[0])){ev, s->s[s->n - 1], s->max_ms};
    int rc = resp_add_array(c->out, n);
    for (int i = 0; i < n && !rc; i++) {
        resp_add_array(c->out, 4);
        resp_add_bulk_str(c->out, latmon_event_name(row[i].ev));
        resp_add_int(c->out, row[i].last.time);
        resp_add_int(c->out, row[i].last.ms);
        rc = resp_add_int(c->out, row[i].max);
    }
    return rc;
}

/* DOCTOR: Redis's report is prose about its own events; kvstore's says, for each
 * of its events, what was seen, and what the events mean. */
static int latency_doctor(struct cmd_client *c, struct latmon_series *s)
{
    struct kvbuf b = {0};
    uint32_t thr = latmon_threshold(c->eng->latmon);
    if (!thr) {
        kvbuf_printf(&b, "Latency monitoring is disabled in this kvstore instance. You may use \"CONFIG SET "
                         "latency-monitor-threshold <milliseconds>.\" in order to enable it.\n");
    } else {
        int any = 0;
        for (int ev = 0; ev < LM_NEVENTS; ev++) {
            if (latmon_get(c->eng->latmon, ev, s) || !s->n)
                continue;
            uint64_t sum = 0;
            for (int i = 0; i < s->n; i++)
                sum += s->s[i].ms;
            kvbuf_printf(&b, "%d. %s: %d latency spikes (average %llums, max %ums, latest %ums).\n", ++any,
                         latmon_event_name(ev), s->n, (unsigned long long)(sum / (uint64_t)s->n), s->max_ms,
                         s->s[s->n - 1].ms);
        }
        if (!any)
            kvbuf_printf(&b, "No latency spike of %ums or more was observed (threshold: "
                             "latency-monitor-threshold).\n", thr);
        else
            kvbuf_printf(&b, "\nlog-sync: the log's fdatasync (replies in disk mode wait for it); flusher-sweep: "
                             "a sweep writing dirty keys to the data file; command/fast-command: a command's run.\n");
    }
    int rc = resp_add_verbatim(c->out, c->resp, b.p ? b.p : "", b.len);
    kvbuf_free(&b);
    return rc;
}

static int latency_sub(struct cmd_client *c, const struct cmd_args *a, struct latmon_series *s)
{
    struct latmon *lm = c->eng->latmon;
    if (ARGIS(a, 1, "HELP"))
        return cmd_sub_arity(c, a, 2, "latency|help")
                   ? CMD_REPLY_HELP(c, latency_help)
                   : 0;
    if (ARGIS(a, 1, "LATEST"))
        return cmd_sub_arity(c, a, 2, "latency|latest") ? latency_latest(c, s) : 0;
    if (ARGIS(a, 1, "HISTORY")) {
        if (!cmd_sub_arity(c, a, 3, "latency|history"))
            return 0;
        int ev = latmon_find(a->argv[2], a->argl[2]);
        if (ev < 0 || latmon_get(lm, ev, s))
            s->n = 0; /* an event never seen: an empty array, as Redis */
        int rc = resp_add_array(c->out, s->n);
        for (int i = 0; i < s->n && !rc; i++) {
            resp_add_array(c->out, 2);
            resp_add_int(c->out, s->s[i].time);
            rc = resp_add_int(c->out, s->s[i].ms);
        }
        return rc;
    }
    if (ARGIS(a, 1, "RESET")) {
        int n = 0;
        if (a->argc == 2)
            for (int ev = 0; ev < LM_NEVENTS; ev++)
                n += latmon_reset(lm, ev);
        for (int i = 2; i < a->argc; i++)
            n += latmon_reset(lm, latmon_find(a->argv[i], a->argl[i]));
        return resp_add_int(c->out, n);
    }
    if (ARGIS(a, 1, "DOCTOR"))
        return cmd_sub_arity(c, a, 2, "latency|doctor") ? latency_doctor(c, s) : 0;
    if (ARGIS(a, 1, "GRAPH")) {
        if (!cmd_sub_arity(c, a, 3, "latency|graph"))
            return 0;
        int ev = latmon_find(a->argv[2], a->argl[2]);
        if (ev < 0 || latmon_get(lm, ev, s) || !s->n)
            return resp_add_errorf(c->out, "ERR No samples available for event '%.*s'",
                                   (int)(a->argl[2] > 128 ? 128 : a->argl[2]), a->argv[2]);
        return cmd_reply_err(c, "ERR LATENCY GRAPH is not supported by kvstore: LATENCY HISTORY <event> "
                                "gives the same samples");
    }
    if (ARGIS(a, 1, "HISTOGRAM"))
        return cmd_reply_err(c, "ERR LATENCY HISTOGRAM is not supported by kvstore: INFO latencystats gives "
                                "each command's p50, p99 and p99.9");
    return cmd_unknown_sub(c, a, "LATENCY");
}

int c_latency(struct cmd_client *c, const struct cmd_args *a)
{
    struct latmon_series *s = malloc(sizeof *s); /* 1.3 KB: not on a front end's stack */
    if (!s)
        return cmd_reply_err(c, ERR_NOMEM);
    int rc = latency_sub(c, a, s);
    free(s);
    return rc;
}

/* ---- MEMORY */

static const char *const memory_help[] = {
    "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DOCTOR",
    "    Return memory problems reports.",
    "MALLOC-STATS",
    "    Return internal statistics report from the memory allocator.",
    "PURGE",
    "    Attempt to purge dirty pages for reclamation by the allocator.",
    "STATS",
    "    Return information about the memory usage of the server.",
    "USAGE <key> [SAMPLES <count>]",
    "    Return memory in bytes used by <key> and its value. Nested values are",
    "    sampled up to <count> times (default: 5, 0 means sample all).",
    "HELP",
    "    Prints this help.",
};

/* MEMORY USAGE key [SAMPLES n]: what the table charges for the key (its entry with
 * key and value, a dirty key's queue node, its bucket slot). SAMPLES is checked
 * as Redis checks it and otherwise moot: a hash is one allocation, measured whole.
 * A key only in its data-file block is loaded first, as a read would. */
static int memory_usage(struct cmd_client *c, const struct cmd_args *a)
{
    for (int j = 3; j < a->argc; j++) {
        long long samples;
        if (ARGIS(a, j, "SAMPLES") && j + 1 < a->argc) {
            if (cmd_arg_ll(a, j + 1, &samples))
                return cmd_reply_err(c, ERR_INT);
            if (samples < 0)
                return cmd_reply_err(c, ERR_SYNTAX);
            j++;
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    int64_t n = kvt_key_memory(c->table, a->argv[2], a->argl[2]);
    if (n < 0)
        return cmd_write_err_key(c, n, a->argv[2], a->argl[2], 0);
    return n ? resp_add_int(c->out, n) : resp_add_null(c->out, c->resp);
}

int c_memory(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "HELP"))
        return cmd_sub_arity(c, a, 2, "memory|help")
                   ? CMD_REPLY_HELP(c, memory_help)
                   : 0;
    if (ARGIS(a, 1, "USAGE"))
        return cmd_sub_arity(c, a, -3, "memory|usage") ? memory_usage(c, a) : 0;
    if (ARGIS(a, 1, "MALLOC-STATS")) /* Redis's reply when built with libc's malloc, as kvstore is */
        return cmd_sub_arity(c, a, 2, "memory|malloc-stats")
                   ? resp_add_bulk_str(c->out, "Stats not supported for the current allocator")
                   : 0;
    if (ARGIS(a, 1, "PURGE")) /* Redis with libc: nothing to purge */
        return cmd_sub_arity(c, a, 2, "memory|purge") ? cmd_reply_ok(c) : 0;
    if (ARGIS(a, 1, "STATS") || ARGIS(a, 1, "DOCTOR"))
        return resp_add_errorf(c->out, "ERR MEMORY %s is not supported by kvstore: INFO memory gives used_memory "
                                       "and maxmemory, MEMORY USAGE a key's bytes",
                               ARGIS(a, 1, "STATS") ? "STATS" : "DOCTOR");
    return cmd_unknown_sub(c, a, "MEMORY");
}
