/* client_mem.c - the memory of client connections: maxmemory-clients (the sum over
 * every connection; past it the clients using most memory are closed first),
 * client-output-buffer-limit normal (hard, soft + seconds), the query-buffer limit
 * counting the parser's argument array, the bound a reply is built under, and the
 * INFO fields and CONFIG parameters of all of it, as Redis 7 has them.
 * Threads: each connection's owner publishes its own memory (cmd_client_mem) into
 * the engine's relaxed atomic sum; whichever owner sees the sum past the bound
 * evicts under the registry's lock (clients_lock), shutting the chosen sockets down
 * as CLIENT KILL does (their owners close them). Memory of clients killed but not
 * yet gone (mem_dying) is not counted twice, so racing owners do not evict more
 * than needed. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/table.h"
#include "engine/engine.h"

#define RECENT_WINDOW_MS 4000          /* client_recent_max_*: the largest of the last 4-8 s */
#define TRIM_SLACK (32LL * 1024 * 1024) /* give memory back once this much of clients' has gone */
#define CONN_FIXED 1024                /* a connection's own structures besides its buffers */

static void relaxed_max(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* ---- eviction */

/* Close clients, those using most memory first, until the sum minus what is already
 * on its way out is back under the bound. Returns 1 if self was chosen (the caller
 * closes it). Caller holds clients_lock. O(clients) per eviction: it runs only past
 * the bound, and each one frees the most memory any single eviction can. */
static int evict_locked(struct kv_engine *e, struct cmd_client *self, long long max)
{
    int self_chosen = 0;
    int64_t over = atomic_load_explicit(&e->mem_clients, memory_order_relaxed) -
                   atomic_load_explicit(&e->mem_dying, memory_order_relaxed) - max;
    while (over > 0) {
        struct cmd_client *big = NULL;
        uint64_t most = 0;
        for (struct list *n = e->clients.next; n != &e->clients; n = n->next) {
            struct cmd_client *o = list_entry(n, struct cmd_client, reg);
            uint64_t m = atomic_load_explicit(&o->mem, memory_order_relaxed);
            if (!o->killed && !o->dying && m > most) {
                most = m;
                big = o;
            }
        }
        if (!big)
            break;
        big->dying = (int64_t)most;
        atomic_fetch_add_explicit(&e->mem_dying, (int64_t)most, memory_order_relaxed);
        over -= (int64_t)most;
        atomic_fetch_add_explicit(&e->evicted_clients, 1, memory_order_relaxed);
        static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
        kvlog_rated(&rate, KVLOG_WARNING, "client id=%llu addr=%s closed: clients use more memory than "
                    "maxmemory-clients (%lld bytes) and it held the most (%llu bytes)",
                    (unsigned long long)big->id, big->addr, max, (unsigned long long)most);
        if (big == self)
            self_chosen = 1;
        else
            cmd_client_drop_locked(big);
    }
    return self_chosen;
}

static int over_bound(struct kv_engine *e, long long *max)
{
    *max = atomic_load_explicit(&e->maxmemory_clients, memory_order_relaxed);
    return *max > 0 && atomic_load_explicit(&e->mem_clients, memory_order_relaxed) -
                               atomic_load_explicit(&e->mem_dying, memory_order_relaxed) > *max;
}

static int evict(struct kv_engine *e, struct cmd_client *self, long long max)
{
    pthread_mutex_lock(&e->clients_lock);
    int chosen = evict_locked(e, self, max);
    pthread_mutex_unlock(&e->clients_lock);
    return chosen;
}

/* ---- the owner's account */

static int close_for_output(struct cmd_client *c, const char *which, size_t obl, long long limit)
{
    atomic_fetch_add_explicit(&c->eng->cobl_disconnections, 1, memory_order_relaxed);
    static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
    kvlog_rated(&rate, KVLOG_WARNING, "client id=%llu addr=%s closed for overcoming of output buffer limits "
                "(%s limit %lld bytes, %zu bytes of replies unsent)", (unsigned long long)c->id, c->addr, which,
                limit, obl);
    return CMD_MEM_CLOSE;
}

int cmd_client_mem(struct cmd_client *c, int64_t now_ms, size_t qmem, size_t in_bytes, size_t obl, size_t out_bytes)
{
    struct kv_engine *e = c->eng;
    if (c->fd < 0) /* not (or no longer) registered: unregistering took its memory off the sum */
        return CMD_MEM_OK;
    uint64_t mem = CONN_FIXED + in_bytes + out_bytes;
    uint64_t old = atomic_load_explicit(&c->mem, memory_order_relaxed);
    if (mem != old) {
        atomic_store_explicit(&c->mem, mem, memory_order_relaxed);
        atomic_fetch_add_explicit(&e->mem_clients, (int64_t)(mem - old), memory_order_relaxed);
    }
    relaxed_max(&e->recent_in, in_bytes);
    relaxed_max(&e->recent_out, out_bytes);
    if ((long long)qmem > CMD_QUERYBUF_MAX) {
        atomic_fetch_add_explicit(&e->qbuf_disconnections, 1, memory_order_relaxed);
        static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
        kvlog_rated(&rate, KVLOG_WARNING, "client id=%llu addr=%s closed for overcoming of the query buffer limit "
                    "(%zu bytes buffered for one request, limit %lld)", (unsigned long long)c->id, c->addr, qmem,
                    CMD_QUERYBUF_MAX);
        return CMD_MEM_CLOSE;
    }
    long long hard = atomic_load_explicit(&e->cobl_hard, memory_order_relaxed);
    long long soft = atomic_load_explicit(&e->cobl_soft, memory_order_relaxed);
    if (hard > 0 && (long long)obl > hard)
        return close_for_output(c, "hard", obl, hard);
    if (soft > 0 && (long long)obl > soft) {
        int secs = atomic_load_explicit(&e->cobl_seconds, memory_order_relaxed);
        if (!c->soft_since_ms)
            c->soft_since_ms = now_ms;
        else if (now_ms - c->soft_since_ms >= (int64_t)secs * 1000)
            return close_for_output(c, "soft", obl, soft);
    } else {
        c->soft_since_ms = 0;
    }
    long long max;
    if (over_bound(e, &max) && evict(e, c, max))
        return CMD_MEM_CLOSE;
    return CMD_MEM_OK;
}

size_t cmd_client_reply_limit(struct cmd_client *c)
{
    struct kv_engine *e = c->eng;
    long long hard = atomic_load_explicit(&e->cobl_hard, memory_order_relaxed);
    long long max = atomic_load_explicit(&e->maxmemory_clients, memory_order_relaxed);
    size_t limit = hard > 0 ? c->out->len + (size_t)hard : 0;
    if (max <= 0 || c->datagram) /* a UDP session is no connection: its reply is one datagram */
        return limit;
    if (over_bound(e, &max) && evict(e, c, max))
        return c->out->len + 1; /* it is the one to go: nothing more is built for it */
    int64_t own = (int64_t)atomic_load_explicit(&c->mem, memory_order_relaxed);
    int64_t others = atomic_load_explicit(&e->mem_clients, memory_order_relaxed) -
                     atomic_load_explicit(&e->mem_dying, memory_order_relaxed) - own;
    /* what it may hold: the bound less the others; at least its own published memory,
     * so a client under the bound is never refused for what others hold */
    int64_t left = max - (others > 0 ? others : 0);
    if (left < own)
        left = own;
    size_t cap = (size_t)left > c->out->len ? (size_t)left : c->out->len + 1;
    return limit && limit < cap ? limit : cap;
}

void cmd_client_reply_over(struct cmd_client *c)
{
    struct kv_engine *e = c->eng;
    pthread_mutex_lock(&e->clients_lock); /* (dying is written by evicting threads) */
    int evicted = c->dying != 0;
    pthread_mutex_unlock(&e->clients_lock);
    if (evicted) /* by cmd_client_reply_limit: counted and logged there */
        return;
    long long hard = atomic_load_explicit(&e->cobl_hard, memory_order_relaxed);
    long long max = atomic_load_explicit(&e->maxmemory_clients, memory_order_relaxed);
    if (hard > 0 && (max <= 0 || hard <= max)) {
        close_for_output(c, "hard", c->out->len, hard);
        return;
    }
    atomic_fetch_add_explicit(&e->evicted_clients, 1, memory_order_relaxed);
    static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
    kvlog_rated(&rate, KVLOG_WARNING, "client id=%llu addr=%s closed: its reply alone would pass maxmemory-clients "
                "(%lld bytes)", (unsigned long long)c->id, c->addr, max);
}

void cmd_clients_cron(struct kv_engine *e, int64_t now_ms)
{
    int64_t start = atomic_load_explicit(&e->recent_window, memory_order_relaxed);
    if (now_ms - start >= RECENT_WINDOW_MS &&
        atomic_compare_exchange_strong_explicit(&e->recent_window, &start, now_ms, memory_order_relaxed,
                                                memory_order_relaxed)) {
        atomic_store_explicit(&e->recent_in_last, atomic_exchange_explicit(&e->recent_in, 0, memory_order_relaxed),
                              memory_order_relaxed);
        atomic_store_explicit(&e->recent_out_last, atomic_exchange_explicit(&e->recent_out, 0, memory_order_relaxed),
                              memory_order_relaxed);
    }
    long long max;
    if (over_bound(e, &max))
        evict(e, NULL, max);
    /* Buffers freed by clients that left go back to malloc's free lists, where the
     * next allocations of other sizes (and threads) leave them stranded: give the
     * free pages back once a large share of what clients held has gone. */
    int64_t now = atomic_load_explicit(&e->mem_clients, memory_order_relaxed);
    int64_t peak = atomic_load_explicit(&e->mem_trim_peak, memory_order_relaxed);
    if (now > peak) {
        atomic_store_explicit(&e->mem_trim_peak, now, memory_order_relaxed);
    } else if (peak - now > TRIM_SLACK && now < peak / 2 &&
               atomic_compare_exchange_strong_explicit(&e->mem_trim_peak, &peak, now, memory_order_relaxed,
                                                       memory_order_relaxed)) {
        malloc_trim(0);
    }
}

/* ---- INFO */

static uint64_t recent(_Atomic uint64_t *cur, _Atomic uint64_t *last)
{
    uint64_t a = atomic_load_explicit(cur, memory_order_relaxed), b = atomic_load_explicit(last, memory_order_relaxed);
    return a > b ? a : b;
}

static void info_clients(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    kvbuf_printf(b, "client_recent_max_input_buffer:%llu\r\nclient_recent_max_output_buffer:%llu\r\n",
                 (unsigned long long)recent(&e->recent_in, &e->recent_in_last),
                 (unsigned long long)recent(&e->recent_out, &e->recent_out_last));
}

static void info_memory(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    int64_t m = atomic_load_explicit(&e->mem_clients, memory_order_relaxed);
    kvbuf_printf(b, "mem_clients_slaves:0\r\nmem_clients_normal:%lld\r\nmaxmemory_clients:%lld\r\n",
                 (long long)(m > 0 ? m : 0), atomic_load_explicit(&e->maxmemory_clients, memory_order_relaxed));
}

static void info_stats(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    kvbuf_printf(b, "evicted_clients:%llu\r\nclient_query_buffer_limit_disconnections:%llu\r\n"
                 "client_output_buffer_limit_disconnections:%llu\r\n",
                 (unsigned long long)atomic_load_explicit(&e->evicted_clients, memory_order_relaxed),
                 (unsigned long long)atomic_load_explicit(&e->qbuf_disconnections, memory_order_relaxed),
                 (unsigned long long)atomic_load_explicit(&e->cobl_disconnections, memory_order_relaxed));
}

static void reset_stats(void *arg)
{
    struct kv_engine *e = arg;
    atomic_store_explicit(&e->evicted_clients, 0, memory_order_relaxed);
    atomic_store_explicit(&e->qbuf_disconnections, 0, memory_order_relaxed);
    atomic_store_explicit(&e->cobl_disconnections, 0, memory_order_relaxed);
}

/* ---- settings */

static uint64_t ram_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

static void set_output_limit(struct kv_engine *e, unsigned long long hard, unsigned long long soft, long long secs)
{
    atomic_store_explicit(&e->cobl_hard, (long long)hard, memory_order_relaxed);
    atomic_store_explicit(&e->cobl_soft, (long long)soft, memory_order_relaxed);
    atomic_store_explicit(&e->cobl_seconds, (int)secs, memory_order_relaxed);
}

int cmd_client_mem_register(struct kv_engine *e)
{
    /* glibc raises its mmap threshold each time a mapped block is freed, up to 32 MiB:
     * after clients with large buffers leave, the next ones' buffers come from the
     * heap, and what they free stays in the process (RSS 5x the clients' memory
     * with evictions running). Pinned at its initial 128 KiB, a buffer that large is
     * a mapping of its own (grown by mremap) and goes back to the system when freed. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    long long bytes = 0, hard = 0, soft = 0;
    int pct = -1, secs = 0;
    if (e->cfg.maxmemory_clients && sscanf(e->cfg.maxmemory_clients, "%lld %d", &bytes, &pct) != 2)
        bytes = 0, pct = -1;
    if (e->cfg.cobl_normal && sscanf(e->cfg.cobl_normal, "%lld %lld %d", &hard, &soft, &secs) != 3)
        hard = soft = secs = 0;
    atomic_store_explicit(&e->maxmemory_clients, bytes < 0 ? 0 : bytes, memory_order_relaxed);
    atomic_store_explicit(&e->maxmemory_clients_pct, pct, memory_order_relaxed);
    set_output_limit(e, (unsigned long long)(hard < 0 ? 0 : hard), (unsigned long long)(soft < 0 ? 0 : soft),
                     secs < 0 ? 0 : secs);
    int rc = eng_info_add(e, "clients", info_clients, NULL, e);
    if (!rc)
        rc = eng_info_add(e, "memory", info_memory, NULL, e);
    if (!rc)
        rc = eng_info_add(e, "stats", info_stats, reset_stats, e);
    return rc;
}

void cmd_client_mem_get(struct cmd_client *c, int which, char *dst, size_t n)
{
    struct kv_engine *e = c->eng;
    int pct = atomic_load_explicit(&e->maxmemory_clients_pct, memory_order_relaxed);
    if (which == 0 && pct >= 0)
        snprintf(dst, n, "%d%%", pct);
    else if (which == 0)
        snprintf(dst, n, "%lld", atomic_load_explicit(&e->maxmemory_clients, memory_order_relaxed));
    else /* kvstore has normal clients only: no replica or pubsub class to show */
        snprintf(dst, n, "normal %lld %lld %d", atomic_load_explicit(&e->cobl_hard, memory_order_relaxed),
                 atomic_load_explicit(&e->cobl_soft, memory_order_relaxed),
                 atomic_load_explicit(&e->cobl_seconds, memory_order_relaxed));
}

static int name_is(const char *s, size_t n, const char *name) { return strlen(name) == n && !strncasecmp(s, name, n); }

static int set_failed(struct cmd_client *c, const char *name, const char *why)
{
    return resp_add_errorf(c->out, "ERR CONFIG SET failed (possibly related to argument '%s') - %s", name, why);
}

/* maxmemory-clients: a memory value, or N% of maxmemory (of RAM when it is 0). */
static int set_maxmemory_clients(struct cmd_client *c, const char *v, size_t vlen)
{
    struct kv_engine *e = c->eng;
    unsigned long long bytes;
    int pct = -1;
    if (vlen > 1 && v[vlen - 1] == '%') {
        unsigned long long p;
        if (cmd_parse_memory(v, vlen - 1, &p) || p > 100)
            return set_failed(c, "maxmemory-clients", "argument must be a memory or percent value");
        uint64_t base = kvt_max_memory(c->table);
        pct = (int)p;
        bytes = (base ? base : ram_bytes()) / 100 * p;
    } else if (cmd_parse_memory(v, vlen, &bytes) || bytes > (unsigned long long)LLONG_MAX) {
        return set_failed(c, "maxmemory-clients", "argument must be a memory or percent value");
    }
    atomic_store_explicit(&e->maxmemory_clients, (long long)bytes, memory_order_relaxed);
    atomic_store_explicit(&e->maxmemory_clients_pct, pct, memory_order_relaxed);
    return cmd_reply_ok(c);
}

/* client-output-buffer-limit: "<class> <hard> <soft> <seconds>" groups, as Redis;
 * kvstore's clients are all of class normal, so only normal is accepted. */
static int set_output_buffer_limit(struct cmd_client *c, const char *v, size_t vlen)
{
    static const char *const name = "client-output-buffer-limit";
    char buf[256], *words[4], *save = NULL;
    if (vlen >= sizeof buf)
        return set_failed(c, name, "Wrong number of arguments in buffer limit configuration.");
    memcpy(buf, v, vlen);
    buf[vlen] = 0;
    int n = 0;
    for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
        if (n++ < 4)
            words[n - 1] = w;
    if (n != 4)
        return set_failed(c, name, "Wrong number of arguments in buffer limit configuration.");
    if (strcasecmp(words[0], "normal"))
        return set_failed(c, name, "Invalid client class specified in buffer limit configuration.");
    unsigned long long hard, soft, secs;
    if (cmd_parse_memory(words[1], strlen(words[1]), &hard) || cmd_parse_memory(words[2], strlen(words[2]), &soft) ||
        hard > (unsigned long long)LLONG_MAX || soft > (unsigned long long)LLONG_MAX)
        return set_failed(c, name, "Error in hard, soft or soft_seconds setting in buffer limit configuration.");
    char *end;
    errno = 0;
    secs = strtoull(words[3], &end, 10);
    if (*end || errno || secs > 2147483647ULL || words[3][0] == '-')
        return set_failed(c, name, "Error in hard, soft or soft_seconds setting in buffer limit configuration.");
    set_output_limit(c->eng, hard, soft, (long long)secs);
    return cmd_reply_ok(c);
}

int cmd_client_mem_set(struct cmd_client *c, const char *name, size_t nlen, const char *v, size_t vlen, int *rc)
{
    if (name_is(name, nlen, "maxmemory-clients"))
        *rc = set_maxmemory_clients(c, v, vlen);
    else if (name_is(name, nlen, "client-output-buffer-limit"))
        *rc = set_output_buffer_limit(c, v, vlen);
    else
        return 0;
    return 1;
}
