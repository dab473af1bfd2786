/* client.c - CLIENT (ID, SETNAME, GETNAME, SETINFO, INFO, LIST, KILL, HELP) and
 * MONITOR over the engine's client registry (engine.h: clients_lock, clients,
 * monitors). Threads: any front-end thread; a client's own fields are written by
 * its owner thread, other threads read them under clients_lock (the published
 * atomics relaxed). A killed connection is shutdown() under the lock and closed by
 * its owner, which leaves the registry first, so the fd is never reused under a
 * killer. MONITOR lines are formatted by the thread that ran the command and queued
 * per monitor (bounded by CMD_MONITOR_MAX); a poller's monitor is woken through
 * its eventfd and takes them itself, a thread pool's is written by the queueing
 * thread. Arguments are untrusted: counts, ids and lengths are checked. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "engine/engine.h"

static int listed(const struct cmd_client *c) { return c->reg.next && !list_empty(&c->reg); }

/* ---- the registry */

void cmd_client_register(struct cmd_client *c, int fd, int64_t now_ms)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    char ip[64] = "?";
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&sa;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
        port = ntohs(in->sin_port);
    }
    snprintf(c->laddr, sizeof c->laddr, "%s:%u", ip, port);
    c->ctime_ms = now_ms;
    atomic_store_explicit(&c->last_ms, now_ms, memory_order_relaxed);
    atomic_store_explicit(&c->multi, -1, memory_order_relaxed);
    atomic_store_explicit(&c->events, CMD_EV_READ, memory_order_relaxed);
    struct kv_engine *e = c->eng;
    pthread_mutex_lock(&e->clients_lock);
    c->fd = fd;
    c->killed = 0;
    list_add(e->clients.prev, &c->reg); /* at the tail: CLIENT LIST shows the oldest first */
    pthread_mutex_unlock(&e->clients_lock);
}

void cmd_client_unregister(struct cmd_client *c)
{
    if (!listed(c))
        return;
    struct kv_engine *e = c->eng;
    pthread_mutex_lock(&e->clients_lock);
    list_del(&c->reg);
    /* its memory leaves the sum now (freed right after): client_mem.c */
    atomic_fetch_sub_explicit(&e->mem_clients, (int64_t)atomic_load_explicit(&c->mem, memory_order_relaxed),
                              memory_order_relaxed);
    atomic_store_explicit(&c->mem, 0, memory_order_relaxed);
    atomic_fetch_sub_explicit(&e->mem_dying, c->dying, memory_order_relaxed);
    c->dying = 0;
    if (c->mon)
        cmd_monitor_end_locked(c);
    c->fd = -1;
    pthread_mutex_unlock(&e->clients_lock);
}

void cmd_client_drop_locked(struct cmd_client *c)
{
    if (c->killed)
        return;
    c->killed = 1;
    shutdown(c->fd, SHUT_RDWR);
}

/* ---- the last command's full name (CLIENT LIST's cmd, MONITOR's admin filter) */

/* Subcommands of the container commands, as Redis names them ("client|list"). */
static const char *const subcommands[] = {
    "client|caching", "client|getname", "client|getredir", "client|help", "client|id", "client|info",
    "client|kill", "client|list", "client|no-evict", "client|pause", "client|reply", "client|setinfo",
    "client|setname", "client|tracking", "client|trackinginfo", "client|unblock", "client|unpause",
    "config|get", "config|help", "config|resetstat", "config|rewrite", "config|set",
    "command|count", "command|docs", "command|getkeys", "command|getkeysandflags", "command|help",
    "command|info", "command|list", "object|encoding", "object|freq", "object|help", "object|idletime",
    "object|refcount", "memory|doctor", "memory|help", "memory|malloc-stats", "memory|purge", "memory|stats",
    "memory|usage", "slowlog|get", "slowlog|help", "slowlog|len", "slowlog|reset", "latency|doctor",
    "latency|graph", "latency|help", "latency|histogram", "latency|history", "latency|latest", "latency|reset",
    NULL};

/* Commands Redis marks admin: MONITOR never shows them. */
static const char *const admin[] = {
    "client|kill", "client|list", "client|no-evict", "client|pause", "client|unpause", "config|get",
    "config|resetstat", "config|rewrite", "config|set", "slowlog|get", "slowlog|len", "slowlog|reset",
    "latency|doctor", "latency|graph", "latency|histogram", "latency|history", "latency|latest",
    "latency|reset", "monitor", "debug", "shutdown", "save", "bgsave", "bgrewriteaof", "replicaof",
    "slaveof", "sync", "psync", "failover", NULL};

int cmd_client_is_admin(const char *full)
{
    for (int i = 0; admin[i]; i++)
        if (!strcmp(admin[i], full))
            return 1;
    return 0;
}

/* The commands with subcommands (a switch: cmd_client_note asks it for DEL and MGET too). */
static int is_container(const char *n)
{
    switch (n[0]) {
    case 'c': return !strcmp(n, "client") || !strcmp(n, "config") || !strcmp(n, "command");
    case 'o': return !strcmp(n, "object");
    case 'm': return !strcmp(n, "memory");
    case 's': return !strcmp(n, "slowlog");
    case 'l': return !strcmp(n, "latency");
    }
    return 0;
}

/* "client|list" for CLIENT LIST, the name for a plain command (or a container
 * alone), NULL for a container's unknown subcommand (Redis has no command then). */
const char *cmd_client_full_name(const struct cmd_def *d, int argc, const char **argv, const size_t *argl)
{
    if (argc < 2 || (d->arity != -2 && d->arity != -1) || !is_container(d->name))
        return d->name;
    size_t n = strlen(d->name);
    for (int i = 0; subcommands[i]; i++) {
        const char *s = subcommands[i];
        if (!strncmp(s, d->name, n) && s[n] == '|' && strlen(s + n + 1) == argl[1] &&
            !strncasecmp(s + n + 1, argv[1], argl[1]))
            return s;
    }
    return NULL;
}

void cmd_client_after(struct cmd_client *c, size_t reply_at, int argc, const size_t *argl)
{
    if (!cmd_in_multi(c)) {
        atomic_store_explicit(&c->multi, -1, memory_order_relaxed);
        atomic_store_explicit(&c->multi_mem, 0, memory_order_relaxed);
        return;
    }
    int n = atomic_load_explicit(&c->multi, memory_order_relaxed);
    if (n < 0) { /* MULTI just ran */
        atomic_store_explicit(&c->multi, 0, memory_order_relaxed);
        return;
    }
    static const char q[] = "+QUEUED\r\n";
    if (c->out->len - reply_at == sizeof q - 1 && !memcmp(c->out->p + reply_at, q, sizeof q - 1)) {
        uint64_t bytes = 0;
        for (int i = 0; i < argc; i++)
            bytes += argl[i];
        atomic_store_explicit(&c->multi, n + 1, memory_order_relaxed);
        atomic_store_explicit(&c->multi_mem, atomic_load_explicit(&c->multi_mem, memory_order_relaxed) + bytes,
                              memory_order_relaxed);
    }
}

/* ---- CLIENT INFO / LIST */

/* One client as Redis 7.0's catClientInfoString lays it out. self: the client
 * running the command (argv_mem: its arguments' bytes). Caller holds clients_lock
 * unless c is self. */
static void add_info_line(struct kvbuf *b, struct cmd_client *c, int self, size_t argv_mem, int64_t now)
{
    char flags[8], *f = flags;
    int multi = atomic_load_explicit(&c->multi, memory_order_relaxed);
    if (c->mon)
        *f++ = 'O';
    if (multi >= 0)
        *f++ = 'x';
    if (self && c->close_after_reply)
        *f++ = 'c';
    if (f == flags)
        *f++ = 'N';
    *f = 0;
    int ev = atomic_load_explicit(&c->events, memory_order_relaxed);
    const char *events = ev == (CMD_EV_READ | CMD_EV_WRITE) ? "rw" : ev == CMD_EV_READ ? "r" : ev ? "w" : "";
    const char *cmd = atomic_load_explicit(&c->lastcmd, memory_order_relaxed);
    uint32_t qbuf = atomic_load_explicit(&c->qbuf, memory_order_relaxed);
    uint32_t qfree = atomic_load_explicit(&c->qbuf_free, memory_order_relaxed);
    uint32_t rbs = atomic_load_explicit(&c->rbs, memory_order_relaxed);
    uint64_t mmem = atomic_load_explicit(&c->multi_mem, memory_order_relaxed);
    uint64_t omem = c->mon ? cmd_monitor_queued_locked(c) : 0; /* MONITOR lines not yet taken */
    if (!self)
        argv_mem = 0; /* between requests */
    uint64_t tot = sizeof *c + (uint64_t)qbuf + qfree + rbs + argv_mem + mmem + omem;
    int64_t last = atomic_load_explicit(&c->last_ms, memory_order_relaxed);
    kvbuf_printf(b,
                 "id=%llu addr=%s laddr=%s fd=%d name=%s age=%lld idle=%lld flags=%s db=0 sub=0 psub=0 ssub=0 "
                 "multi=%d qbuf=%u qbuf-free=%u argv-mem=%zu multi-mem=%llu rbs=%u rbp=%u obl=%u oll=%d omem=%llu "
                 "tot-mem=%llu events=%s cmd=%s user=default redir=-1 resp=%d\n",
                 (unsigned long long)c->id, c->addr, c->laddr, c->fd, c->name ? c->name : "",
                 (long long)((now - c->ctime_ms) / 1000), (long long)(now > last ? (now - last) / 1000 : 0), flags,
                 multi, qbuf, qfree, argv_mem, (unsigned long long)mmem, rbs,
                 atomic_load_explicit(&c->rbp, memory_order_relaxed), atomic_load_explicit(&c->obl, memory_order_relaxed),
                 0, (unsigned long long)omem, (unsigned long long)tot, events, cmd ? cmd : "NULL", c->resp);
}

static size_t argv_bytes(const struct cmd_args *a)
{
    size_t n = 0;
    for (int i = 0; i < a->argc; i++)
        n += a->argl[i];
    return n;
}

/* Redis's client types: every kvstore client is "normal" (a monitor too, as in
 * Redis); -1 for a name Redis does not know. */
static int client_type(const char *s, size_t n)
{
    static const char *const names[] = {"normal", "slave", "replica", "pubsub", "master"};
    static const int types[] = {0, 1, 1, 2, 3};
    for (int i = 0; i < 5; i++)
        if (strlen(names[i]) == n && !strncasecmp(names[i], s, n))
            return types[i];
    return -1;
}

static int reply_unknown_type(struct cmd_client *c, const struct cmd_args *a, int i)
{
    return resp_add_errorf(c->out, "ERR Unknown client type '%.*s'", (int)(a->argl[i] > 128 ? 128 : a->argl[i]),
                           a->argv[i]);
}

static int client_list(struct cmd_client *c, const struct cmd_args *a)
{
    int type = 0, by_id = 0;
    if (a->argc == 4 && ARGIS(a, 2, "TYPE")) {
        if ((type = client_type(a->argv[3], a->argl[3])) < 0)
            return reply_unknown_type(c, a, 3);
    } else if (a->argc > 3 && ARGIS(a, 2, "ID")) {
        by_id = 1;
        for (int i = 3; i < a->argc; i++) {
            long long id;
            if (cmd_arg_ll(a, i, &id))
                return cmd_reply_err(c, "ERR Invalid client ID");
        }
    } else if (a->argc != 2) {
        return cmd_reply_err(c, ERR_SYNTAX);
    }
    struct kvbuf b = {0};
    struct kv_engine *e = c->eng;
    int64_t now = kv_coarse_ms();
    size_t argv_mem = argv_bytes(a);
    pthread_mutex_lock(&e->clients_lock);
    for (int i = by_id ? 3 : 0; type == 0 && (by_id ? i < a->argc : i == 0); i++) {
        long long id = 0;
        if (by_id)
            cmd_arg_ll(a, i, &id);
        for (struct list *n = e->clients.next; n != &e->clients; n = n->next) {
            struct cmd_client *o = list_entry(n, struct cmd_client, reg);
            if (!o->killed && (!by_id || o->id == (uint64_t)id))
                add_info_line(&b, o, o == c, argv_mem, now);
        }
    }
    pthread_mutex_unlock(&e->clients_lock);
    int rc = resp_add_verbatim(c->out, c->resp, b.p ? b.p : "", b.len);
    kvbuf_free(&b);
    return rc;
}

/* ---- CLIENT KILL */

struct kill_filter {
    const char *addr, *laddr;
    size_t addrl, laddrl;
    int type;                /* -1: any */
    uint64_t id;             /* 0: any */
    int skipme;
    long long maxage;        /* 0: any (Redis 7.4's MAXAGE: at least this many seconds old) */
};

/* Parse CLIENT KILL's options (from argument 2); 1, or 0 with the error replied. */
static int kill_options(struct cmd_client *c, const struct cmd_args *a, struct kill_filter *f)
{
    for (int i = 2; i < a->argc; i += 2) {
        if (i + 1 >= a->argc)
            return cmd_reply_err(c, ERR_SYNTAX), 0;
        long long v;
        if (ARGIS(a, i, "ID")) {
            if (cmd_arg_ll(a, i + 1, &v) || v < 1)
                return cmd_reply_err(c, "ERR client-id should be greater than 0"), 0;
            f->id = (uint64_t)v;
        } else if (ARGIS(a, i, "TYPE")) {
            if ((f->type = client_type(a->argv[i + 1], a->argl[i + 1])) < 0)
                return reply_unknown_type(c, a, i + 1), 0;
        } else if (ARGIS(a, i, "ADDR")) {
            f->addr = a->argv[i + 1];
            f->addrl = a->argl[i + 1];
        } else if (ARGIS(a, i, "LADDR")) {
            f->laddr = a->argv[i + 1];
            f->laddrl = a->argl[i + 1];
        } else if (ARGIS(a, i, "USER")) {
            if (!(a->argl[i + 1] == 7 && !memcmp(a->argv[i + 1], "default", 7))) /* the only user */
                return resp_add_errorf(c->out, "ERR No such user '%.*s'",
                                       (int)(a->argl[i + 1] > 128 ? 128 : a->argl[i + 1]), a->argv[i + 1]),
                       0;
        } else if (ARGIS(a, i, "SKIPME")) {
            if (ARGIS(a, i + 1, "YES"))
                f->skipme = 1;
            else if (ARGIS(a, i + 1, "NO"))
                f->skipme = 0;
            else
                return cmd_reply_err(c, ERR_SYNTAX), 0;
        } else if (ARGIS(a, i, "MAXAGE")) {
            if (cmd_arg_ll(a, i + 1, &v) || v < 1)
                return cmd_reply_err(c, "ERR maxage should be greater than 0"), 0;
            f->maxage = v;
        } else {
            return cmd_reply_err(c, ERR_SYNTAX), 0;
        }
    }
    return 1;
}

static int str_is(const char *s, const char *p, size_t n) { return strlen(s) == n && !memcmp(s, p, n); }

static int client_kill(struct cmd_client *c, const struct cmd_args *a)
{
    struct kill_filter f = {.type = -1, .skipme = 1};
    if (a->argc == 3) { /* CLIENT KILL ip:port: you may kill yourself */
        f.addr = a->argv[2];
        f.addrl = a->argl[2];
        f.skipme = 0;
    } else if (a->argc < 3) {
        return cmd_reply_err(c, ERR_SYNTAX);
    } else if (!kill_options(c, a, &f)) {
        return 0;
    }
    struct kv_engine *e = c->eng;
    int64_t now = kv_coarse_ms();
    long long killed = 0;
    int self = 0;
    pthread_mutex_lock(&e->clients_lock);
    for (struct list *n = e->clients.next; n != &e->clients; n = n->next) {
        struct cmd_client *o = list_entry(n, struct cmd_client, reg);
        if (o->killed || (f.addr && !str_is(o->addr, f.addr, f.addrl)) ||
            (f.laddr && !str_is(o->laddr, f.laddr, f.laddrl)) || (f.type > 0) || (f.id && o->id != f.id) ||
            (f.maxage && (now - o->ctime_ms) / 1000 < f.maxage) || (o == c && f.skipme))
            continue;
        if (o == c)
            self = 1;
        else
            cmd_client_drop_locked(o);
        killed++;
    }
    pthread_mutex_unlock(&e->clients_lock);
    int rc = a->argc == 3 ? (killed ? cmd_reply_ok(c) : cmd_reply_err(c, "ERR No such client"))
                          : resp_add_int(c->out, killed);
    if (self) /* after its reply, as Redis */
        c->close_after_reply = 1;
    return rc;
}

/* ---- CLIENT */

static int valid_client_name(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '!' || s[i] > '~')
            return 0;
    return 1;
}

int cmd_client_setname(struct cmd_client *c, const char *s, size_t n)
{
    if (!valid_client_name(s, n)) {
        cmd_reply_err(c, "ERR Client names cannot contain spaces, newlines or special characters.");
        return 0;
    }
    char *name = NULL;
    if (n && (name = malloc(n + 1))) {
        memcpy(name, s, n);
        name[n] = 0;
    }
    /* other threads read the name while listing clients */
    pthread_mutex_lock(&c->eng->clients_lock);
    char *old = c->name;
    c->name = name;
    pthread_mutex_unlock(&c->eng->clients_lock);
    free(old);
    return 1;
}

static int client_help(struct cmd_client *c)
{
    static const char *const help[] = {
        "CLIENT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GETNAME", "    Return the name of the current connection.",
        "ID", "    Return the ID of the current connection.",
        "INFO", "    Return information about the current client connection.",
        "KILL <ip:port>", "    Kill connection made from <ip:port>.",
        "KILL <option> <value> [<option> <value> [...]]", "    Kill connections. Options are:",
        "    * ADDR (<ip:port>|<unixsocket>:0)", "      Kill connections made from the specified address",
        "    * LADDR (<ip:port>|<unixsocket>:0)", "      Kill connections made to specified local address",
        "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)", "      Kill connections by type.",
        "    * USER <username>", "      Kill connections authenticated by <username>.",
        "    * SKIPME (YES|NO)", "      Skip killing current connection (default: yes).",
        "    * ID <client-id>", "      Kill connections by client id.",
        "    * MAXAGE <maxage>", "      Kill connections older than the specified age (seconds).",
        "LIST [options ...]", "    Return information about client connections. Options:",
        "    * TYPE (NORMAL|MASTER|REPLICA|PUBSUB)", "      Return clients of specified type.",
        "    * ID <client-id> [<client-id> ...]", "      Return clients of specified IDs only.",
        "SETINFO <option> <value>", "    Accepted for clients that send their name and version; not kept.",
        "SETNAME <name>", "    Assign the name <name> to the current connection.",
        "HELP", "    Prints this help."};
    return CMD_REPLY_HELP(c, help);
}

int c_client(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "ID"))
        return cmd_sub_arity(c, a, 2, "client|id") ? resp_add_int(c->out, (long long)c->id) : 0;
    if (ARGIS(a, 1, "SETNAME")) {
        if (!cmd_sub_arity(c, a, 3, "client|setname"))
            return 0;
        return cmd_client_setname(c, a->argv[2], a->argl[2]) ? cmd_reply_ok(c) : 0;
    }
    if (ARGIS(a, 1, "GETNAME")) {
        if (!cmd_sub_arity(c, a, 2, "client|getname"))
            return 0;
        return c->name ? resp_add_bulk_str(c->out, c->name) : resp_add_null(c->out, c->resp);
    }
    if (ARGIS(a, 1, "SETINFO")) /* redis-py >= 5 sends its name/version; accepted, not kept */
        return cmd_sub_arity(c, a, 4, "client|setinfo") ? cmd_reply_ok(c) : 0;
    if (ARGIS(a, 1, "INFO")) {
        if (!cmd_sub_arity(c, a, 2, "client|info"))
            return 0;
        struct kvbuf b = {0};
        add_info_line(&b, c, 1, argv_bytes(a), kv_coarse_ms()); /* own fields: no lock needed */
        int rc = resp_add_verbatim(c->out, c->resp, b.p, b.len);
        kvbuf_free(&b);
        return rc;
    }
    if (ARGIS(a, 1, "LIST"))
        return client_list(c, a);
    if (ARGIS(a, 1, "KILL"))
        return client_kill(c, a);
    if (ARGIS(a, 1, "HELP"))
        return cmd_sub_arity(c, a, 2, "client|help") ? client_help(c) : 0;
    return cmd_unknown_sub(c, a, "CLIENT");
}
