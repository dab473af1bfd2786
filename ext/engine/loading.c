/* loading.c - a node that waits for its state (see loading.h): the texts INFO
 * and the -LOADING error show, the front ends' eventfds kept for a log attached
 * later, and eng_attach, which ends the wait. */
#define _GNU_SOURCE
#include "engine/loading.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "durability/bosc.h"
#include "durability/wal.h"
#include "engine/engine.h"

#define MAX_EVFDS 1024 /* the log's and the data file's own bound on subscribers */

struct eng_loading {
    pthread_mutex_t lock; /* guards the texts and attempts (INFO and refusals read them) */
    char waiting_for[ENG_LOADING_TEXT];
    char last_error[ENG_LOADING_TEXT];
    char node_id[33];
    uint64_t attempts;
    time_t since;      /* when the wait began (INFO loading_start_time, as Redis) */
    time_t ended;      /* when eng_attach ended it (0: not yet, or never waited) */
    int evfds[MAX_EVFDS];
    int nevfds;        /* control thread only */
};

/* INFO persistence: kvstore's lines after the engine's ("loading:" is there). A
 * waiting node shows Redis's loading_start_time and what it waits for. */
static void info_loading(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    struct eng_loading *l = e->ld;
    int loading = atomic_load_explicit(&e->loading, memory_order_acquire);
    pthread_mutex_lock(&l->lock);
    if (l->node_id[0])
        kvbuf_printf(b, "node_id:%s\r\n", l->node_id);
    if (loading)
        kvbuf_printf(b, "loading_start_time:%lld\r\nloading_waiting_for:%s\r\nloading_fetch_attempts:%llu\r\n"
                        "loading_last_error:%s\r\n",
                     (long long)l->since, l->waiting_for, (unsigned long long)l->attempts, l->last_error);
    else if (l->ended)
        kvbuf_printf(b, "loading_waited_seconds:%lld\r\nloading_fetch_attempts:%llu\r\n",
                     (long long)(l->ended - l->since), (unsigned long long)l->attempts);
    pthread_mutex_unlock(&l->lock);
}

int eng_loading_init(struct kv_engine *e)
{
    struct eng_loading *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    pthread_mutex_init(&l->lock, NULL);
    l->since = time(NULL);
    snprintf(l->waiting_for, sizeof l->waiting_for, "this node's state");
    e->ld = l;
    atomic_store_explicit(&e->loading, e->cfg.loading ? 1 : 0, memory_order_relaxed); /* before any thread */
    return eng_info_add(e, "persistence", info_loading, NULL, e);
}

void eng_loading_free(struct kv_engine *e)
{
    if (!e->ld)
        return;
    pthread_mutex_destroy(&e->ld->lock);
    free(e->ld);
    e->ld = NULL;
}

/* snprintf("%s") with CR and LF made spaces: the texts go into INFO lines and
 * error replies, which a line break would end. */
static void set_text(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src);
    for (char *p = dst; *p; p++)
        if (*p == '\r' || *p == '\n')
            *p = ' ';
}

void eng_loading_set(struct kv_engine *e, const char *waiting_for, const char *last_error, uint64_t attempts,
                     const char *node_id)
{
    struct eng_loading *l = e->ld;
    pthread_mutex_lock(&l->lock);
    if (waiting_for)
        set_text(l->waiting_for, sizeof l->waiting_for, waiting_for);
    if (last_error)
        set_text(l->last_error, sizeof l->last_error, last_error);
    if (node_id)
        set_text(l->node_id, sizeof l->node_id, node_id);
    l->attempts = attempts;
    pthread_mutex_unlock(&l->lock);
}

int eng_note_evfd(struct kv_engine *e, int evfd)
{
    struct eng_loading *l = e->ld;
    if (!l) /* an engine that never waits (no eng_loading_init): nothing attaches later */
        return 0;
    if (l->nevfds == MAX_EVFDS)
        return -ENOSPC;
    l->evfds[l->nevfds++] = evfd;
    return 0;
}

int eng_attach(struct kv_engine *e, struct wal *w, struct bosc *b, struct rl_sender *sender, char *err,
               size_t errlen)
{
    struct eng_loading *l = e->ld;
    if (!l || !atomic_load_explicit(&e->loading, memory_order_relaxed) || e->wal || e->bosc) {
        snprintf(err, errlen, "the node is not waiting for its state");
        return -EALREADY;
    }
    /* Subscribe first: a reply held for the log from the first admitted request
     * must be woken when its record becomes durable. */
    for (int i = 0; i < l->nevfds; i++) {
        int rc = 0;
        if ((b && (rc = bosc_subscribe(b, l->evfds[i])) < 0) || (w && (rc = wal_subscribe(w, l->evfds[i])) < 0)) {
            snprintf(err, errlen, "too many threads for the log's or the data file's wake-up list");
            return rc;
        }
    }
    if (w)
        wal_set_latmon(w, e->latmon);
    if (b)
        bosc_set_latmon(b, e->latmon);
    /* Plain pointer stores: keyspace commands, the only users of the log and the
     * data file on a request's path, read them after the acquire of the flag in
     * admit, which pairs with the release below. Other readers (INFO, a poller's
     * flush, which finds nothing held while loading) see NULL or the whole,
     * initialized object: aligned pointer stores are single-copy atomic on every
     * target we build for. */
    e->wal = w;
    e->bosc = b;
    e->cfg.wal = w;
    e->cfg.bosc = b;
    e->cfg.sender = sender;
    pthread_mutex_lock(&l->lock);
    l->ended = time(NULL);
    l->last_error[0] = 0;
    pthread_mutex_unlock(&l->lock);
    atomic_store_explicit(&e->loading, 0, memory_order_release);
    return 0;
}

void eng_loading_error(struct kv_engine *e, char *buf, size_t n)
{
    struct eng_loading *l = e->ld;
    pthread_mutex_lock(&l->lock);
    snprintf(buf, n, "LOADING kvstore is waiting for %s; keyspace commands are refused until it is back "
                     "(INFO persistence shows the wait)", l->waiting_for);
    pthread_mutex_unlock(&l->lock);
}
