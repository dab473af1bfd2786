/* monitor.c - MONITOR: every command any client runs, as Redis 7.0 shows it
 * ("+<secs>.<usecs> [0 <addr>] "CMD" "arg" ...", arguments escaped like sdscatrepr,
 * AUTH's and HELLO AUTH's secrets "(redacted)", admin commands not shown).
 * Threads: the thread that ran a command formats its line and queues it to every
 * monitor under the registry's lock (engine.h clients_lock); a poller's monitor is
 * woken through its poller's eventfd and moves its queue into its own output
 * (cmd_monitor_take), a thread pool's monitor has no thread to wake and is written
 * by the queueing thread itself, non-blocking (cmd_monitor_flush sends the rest).
 * A monitor more than CMD_MONITOR_MAX behind is disconnected, as Redis does with
 * its output buffer limit. Nothing here runs while nobody monitors: cmd_dispatch
 * checks eng->nmonitors (one relaxed load) before calling cmd_monitor_feed. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "engine/engine.h"

struct cmd_monitor {
    struct list node;        /* on eng->monitors */
    struct cmd_client *c;
    int evfd;                /* the owner's eventfd, -1: written by the queueing thread */
    struct kvbuf q;          /* bytes not yet taken by the owner (or not yet sent) */
};

void cmd_monitor_end_locked(struct cmd_client *c)
{
    struct cmd_monitor *m = c->mon;
    list_del(&m->node);
    atomic_fetch_sub_explicit(&c->eng->nmonitors, 1, memory_order_relaxed);
    kvbuf_free(&m->q);
    free(m);
    c->mon = NULL;
}

size_t cmd_monitor_queued_locked(const struct cmd_client *c) { return c->mon->q.len; }

/* A thread pool's monitor: send what its socket takes now. Caller holds clients_lock. */
static void do_send(struct cmd_monitor *m)
{
    while (m->q.len && !m->c->killed) {
        ssize_t n = send(m->c->fd, m->q.p, m->q.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            kvbuf_consume(&m->q, (size_t)n);
        else if (n < 0 && errno == EINTR)
            continue;
        else if (n < 0 && errno == EAGAIN)
            break; /* the rest goes with the next line, or at the next flush */
        else
            cmd_client_drop_locked(m->c);
    }
    if (!m->q.len)
        kvbuf_shrink(&m->q, 64 * 1024);
}

/* Queue bytes to m, wake or write it. Caller holds clients_lock. */
static void do_queue(struct cmd_monitor *m, const char *p, size_t n)
{
    if (m->c->killed)
        return;
    if (m->q.len + n > CMD_MONITOR_MAX || kvbuf_append(&m->q, p, n)) {
        cmd_client_drop_locked(m->c); /* too far behind: as Redis's output buffer limit */
        return;
    }
    if (m->evfd < 0) {
        do_send(m);
    } else if (m->q.len == n) { /* was empty: the owner has nothing pending, wake it */
        uint64_t one = 1;
        ssize_t w = write(m->evfd, &one, sizeof one);
        (void)w;
    }
}

int c_monitor(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (c->datagram || c->fd < 0 || !c->reg.next)
        return cmd_reply_err(c, "ERR MONITOR needs a connection: not available over UDP");
    if (c->top == CMD_TOP_NESTED) /* EXEC runs it: Redis refuses it there */
        return cmd_reply_err(c, "ERR MONITOR isn't allowed for DENY BLOCKING client");
    if (c->mon)
        return 0; /* already monitoring: as Redis, no reply at all */
    struct cmd_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->c = c;
    m->evfd = c->evfd;
    struct kv_engine *e = c->eng;
    int rc = 0;
    pthread_mutex_lock(&e->clients_lock);
    list_add(e->monitors.prev, &m->node);
    c->mon = m;
    atomic_fetch_add_explicit(&e->nmonitors, 1, memory_order_relaxed);
    if (m->evfd < 0) /* every byte to its socket goes through the queue from now on */
        do_queue(m, "+OK\r\n", 5);
    else
        rc = cmd_reply_ok(c); /* lines queued from now on are taken after it */
    pthread_mutex_unlock(&e->clients_lock);
    return rc;
}

/* sdscatrepr: quoted, with \\ \" \n \r \t \a \b escaped and other bytes that are
 * not printable as \xHH. */
static void add_repr(struct kvbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (kvbuf_reserve(b, n * 4 + 3))
        return;
    char *p = b->p + b->len;
    *p++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        switch (ch) {
        case '\\': esc = "\\\\"; break;
        case '"': esc = "\\\""; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\a': esc = "\\a"; break;
        case '\b': esc = "\\b"; break;
        }
        if (esc) {
            *p++ = esc[0];
            *p++ = esc[1];
        } else if (ch >= 0x20 && ch < 0x7f) {
            *p++ = (char)ch;
        } else {
            *p++ = '\\';
            *p++ = 'x';
            *p++ = hex[ch >> 4];
            *p++ = hex[ch & 15];
        }
    }
    *p++ = '"';
    b->len = (size_t)(p - b->p);
}

/* Arguments Redis hides: AUTH's, and HELLO's AUTH user and password. */
static int redacted(const struct cmd_def *d, int argc, const char **argv, const size_t *argl, int i)
{
    if (d->fn == c_auth)
        return i >= 1;
    if (d->fn != c_hello)
        return 0;
    for (int j = 2; j < argc - 2; j++) /* HELLO <protover> [AUTH user pass] [SETNAME name] */
        if (argl[j] == 4 && !strncasecmp(argv[j], "AUTH", 4) && (i == j + 1 || i == j + 2))
            return 1;
    return 0;
}

void cmd_monitor_feed(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv, const size_t *argl)
{
    if (c->stall) /* it runs again when what it waits for is there; shown then */
        return;
    const char *full = cmd_client_full_name(d, argc, argv, argl);
    if (!full || cmd_client_is_admin(full))
        return; /* an unknown subcommand ran nothing; admin commands are not shown */
    static __thread struct kvbuf line;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    line.len = 0;
    kvbuf_printf(&line, "+%ld.%06ld [0 %s] ", (long)tv.tv_sec, (long)tv.tv_usec, c->addr);
    for (int i = 0; i < argc; i++) {
        if (redacted(d, argc, argv, argl, i))
            add_repr(&line, "(redacted)", 10);
        else
            add_repr(&line, argv[i], argl[i]);
        kvbuf_append(&line, i + 1 < argc ? " " : "\r\n", i + 1 < argc ? 1 : 2);
    }
    struct kv_engine *e = c->eng;
    pthread_mutex_lock(&e->clients_lock);
    for (struct list *n = e->monitors.next; n != &e->monitors; n = n->next)
        do_queue(list_entry(n, struct cmd_monitor, node), line.p, line.len);
    pthread_mutex_unlock(&e->clients_lock);
    kvbuf_shrink(&line, 64 * 1024);
}

void cmd_monitor_take(struct kv_engine *e, int evfd, void (*ready)(void *arg, struct cmd_client *c), void *arg)
{
    if (!atomic_load_explicit(&e->nmonitors, memory_order_relaxed))
        return;
    pthread_mutex_lock(&e->clients_lock);
    for (struct list *n = e->monitors.next; n != &e->monitors; n = n->next) {
        struct cmd_monitor *m = list_entry(n, struct cmd_monitor, node);
        struct cmd_client *c = m->c;
        if (m->evfd != evfd || !m->q.len || c->killed ||
            atomic_load_explicit(&c->obl, memory_order_relaxed) >= CMD_MONITOR_MAX)
            continue; /* a full one takes the rest at a later cron, or is dropped meanwhile */
        if (kvbuf_append(c->out, m->q.p, m->q.len)) {
            cmd_client_drop_locked(c);
            continue;
        }
        m->q.len = 0;
        kvbuf_shrink(&m->q, 64 * 1024);
        ready(arg, c);
    }
    pthread_mutex_unlock(&e->clients_lock);
}

void cmd_monitor_flush(struct kv_engine *e)
{
    if (!atomic_load_explicit(&e->nmonitors, memory_order_relaxed))
        return;
    pthread_mutex_lock(&e->clients_lock);
    for (struct list *n = e->monitors.next; n != &e->monitors; n = n->next) {
        struct cmd_monitor *m = list_entry(n, struct cmd_monitor, node);
        if (m->evfd < 0)
            do_send(m);
    }
    pthread_mutex_unlock(&e->clients_lock);
}

int cmd_monitor_reply(struct cmd_client *c)
{
    struct kv_engine *e = c->eng;
    pthread_mutex_lock(&e->clients_lock);
    if (c->mon)
        do_queue(c->mon, c->out->p, c->out->len);
    int dropped = c->killed;
    pthread_mutex_unlock(&e->clients_lock);
    c->out->len = 0;
    return dropped ? -EPIPE : 0;
}
