/* mqtt_broker.c - the MQTT broker's shared tables (see mqtt.h): topics seen,
 * sessions by client id, each session's filters and its links to the topics
 * they match, retained messages; the tap that raises links when a topic's stream
 * is written; the INFO section. Everything here runs under the broker lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/keywait.h"
#include "core/log.h"
#include "core/siphash.h"
#include "core/stream.h"
#include "core/table.h"
#include "engine/engine.h"
#include "frontend/mqtt_int.h"
#include "frontend/poller_int.h"
#include "proto/mqtt.h"

static uint64_t hash(const void *p, size_t n) { return kvt_hash(p, n); }

/* The topic the last tap on this thread found (topics live as long as the broker),
 * and whether that write filled the queue of a session taking it at QoS 1/2. */
static __thread struct mq_topic *tapped;
static __thread int tapped_full;

/* ---- hash tables (chained through the first member) */

#define CHAIN(T) T *hnext

static int grow(void ***tab, size_t *cap, size_t n, size_t next_off, size_t h_off)
{
    if (n < *cap * 3 / 4 && *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    void **t = calloc(nc, sizeof *t);
    if (!t)
        return -ENOMEM;
    for (size_t i = 0; i < *cap; i++)
        for (void *e = (*tab)[i], *next; e; e = next) {
            next = *(void **)((char *)e + next_off);
            uint64_t h = *(uint64_t *)((char *)e + h_off);
            *(void **)((char *)e + next_off) = t[h % nc];
            t[h % nc] = e;
        }
    free(*tab);
    *tab = t;
    *cap = nc;
    return 0;
}

static struct mq_topic *topic_find(struct mq_broker *b, const char *name, size_t n, uint64_t h)
{
    if (!b->tcap)
        return NULL;
    for (struct mq_topic *t = b->topics[h % b->tcap]; t; t = t->hnext)
        if (t->h == h && t->n == n && !memcmp(t->name, name, n))
            return t;
    return NULL;
}


/* The topic, created (and linked to every session with a filter matching it) when new. */
struct mq_topic *mq_topic_get(struct mq_broker *b, const char *name, size_t n)
{
    uint64_t h = hash(name, n);
    struct mq_topic *t = topic_find(b, name, n, h);
    if (t)
        return t;
    if (grow((void ***)&b->topics, &b->tcap, b->ntopics, offsetof(struct mq_topic, hnext),
             offsetof(struct mq_topic, h)) ||
        !(t = calloc(1, sizeof *t + n + 1)))
        return NULL;
    t->h = h;
    t->n = n;
    memcpy(t->name, name, n);
    list_init(&t->links);
    t->hnext = b->topics[h % b->tcap];
    b->topics[h % b->tcap] = t;
    b->ntopics++;
    for (struct list *l = b->sessions.next; l != &b->sessions; l = l->next) {
        struct mq_sess *s = list_entry(l, struct mq_sess, node);
        int qos = -1;
        int64_t since = 0;
        for (struct mq_filter *f = s->filters; f; f = f->next)
            if (mqtt_match((const uint8_t *)f->f, f->n, (const uint8_t *)name, n) && f->qos > qos) {
                qos = f->qos;
                since = f->since_ms;
            }
        if (qos >= 0 && mq_link_add(s, t, qos, since))
            kvlog_write(KVLOG_WARNING, "mqtt: out of memory linking topic %.*s to client %.*s", (int)n, name,
                        (int)s->idlen, s->id);
    }
    return t;
}

/* ---- links */

struct mq_link *mq_link_of(struct mq_sess *s, struct mq_topic *t)
{
    for (int i = 0; i < s->nlinks; i++)
        if (s->links[i]->topic == t)
            return s->links[i];
    return NULL;
}

/* This thread's poller (NULL on other threads). */
static __thread struct mq_poller *self;

void mqtt_poller_thread(struct poller *p) { self = &p->mq; }

static void raise_link(struct mq_link *k)
{
    atomic_store_explicit(&k->dirty, 1, memory_order_release);
    struct mq_sess *s = k->sess;
    if (!atomic_exchange_explicit(&s->ready, 1, memory_order_acq_rel) && s->mp) {
        atomic_store_explicit(&s->mp->wake, 1, memory_order_release);
        if (s->mp != self) { /* its own poller looks at the flag before it sleeps */
            uint64_t one = 1;
            (void)!write(s->evfd, &one, sizeof one);
        }
    }
}

/* Link s to t (or raise the QoS of its link). Messages with IDs from since_ms on
 * are due: the subscription's time, so a topic first seen now is read from its
 * start, and an old stream only from when the filter was subscribed. */
int mq_link_add(struct mq_sess *s, struct mq_topic *t, int qos, int64_t since_ms)
{
    struct mq_link *k = mq_link_of(s, t);
    if (k) {
        k->qos = qos > k->qos ? qos : k->qos;
        return 0;
    }
    if (s->nlinks == s->caplinks) {
        int nc = s->caplinks ? s->caplinks * 2 : 8;
        struct mq_link **v = realloc(s->links, sizeof *v * (size_t)nc);
        if (!v)
            return -ENOMEM;
        s->links = v;
        s->caplinks = nc;
    }
    if (!(k = calloc(1, sizeof *k)))
        return -ENOMEM;
    k->topic = t;
    k->sess = s;
    k->qos = qos;
    /* XREAD gives IDs above this one: every ID of since_ms and later */
    k->last = since_ms > 0 ? (struct mq_id){(uint64_t)since_ms - 1, UINT64_MAX} : (struct mq_id){0, 0};
    list_add(&t->links, &k->tnode);
    s->links[s->nlinks++] = k;
    raise_link(k); /* what the stream holds since then may be due already */
    return 0;
}

/* *v -= n, not below 0 (what was in a stream before its link was made is sent but
 * was never counted); returns what is left. */
static int64_t sub_floor(_Atomic int64_t *v, int64_t n)
{
    int64_t old = atomic_load(v), left;
    do
        left = old > n ? old - n : 0;
    while (!atomic_compare_exchange_weak(v, &old, left));
    return left;
}

void mq_wake_slowed(struct mq_broker *b, struct mq_sess *s)
{
    uint64_t mask = atomic_exchange(&s->slowed, 0);
    for (int i = 0; mask; i++, mask >>= 1)
        if (mask & 1) {
            struct poller *p = atomic_load_explicit(&b->slow_p[i], memory_order_relaxed);
            atomic_store_explicit(&p->mq.wake, 1, memory_order_release);
            uint64_t one = 1;
            (void)!write(p->evfd, &one, sizeof one);
        }
}

void mq_dequeued(struct mq_broker *b, struct mq_link *k, int64_t n)
{
    sub_floor(&k->queued, n);
    struct mq_sess *s = k->sess;
    /* (seq_cst, as mq_slow's: either it sees the queue down or this sees its bit) */
    if (sub_floor(&s->queued, n) <= b->eng->cfg.mqtt_max_queued / 2 && atomic_load(&s->slowed))
        mq_wake_slowed(b, s);
}

static int queue_full(const struct mq_broker *b, const struct mq_link *k, int64_t at)
{
    return b->eng->cfg.mqtt_max_queued > 0 && k->qos > 0 && k->sess->conn && atomic_load(&k->sess->queued) > at;
}

int mq_slow(struct mq_broker *b, struct mq_conn *m)
{
    struct poller *p = m->c->p;
    int bit = p->idx % 64, slowed = 0;
    atomic_store_explicit(&b->slow_p[bit], p, memory_order_relaxed);
    pthread_mutex_lock(&b->lock);
    struct mq_topic *t = m->slowed_on;
    for (struct list *l = t->links.next; l != &t->links; l = l->next) {
        struct mq_link *k = list_entry(l, struct mq_link, tnode);
        if (k->qos > 0 && k->sess->conn) {
            atomic_fetch_or(&k->sess->slowed, (uint64_t)1 << bit); /* before the look at its queue */
            if (queue_full(b, k, b->eng->cfg.mqtt_max_queued / 2))
                slowed = 1;
        }
    }
    pthread_mutex_unlock(&b->lock);
    if (!slowed)
        m->slowed_on = NULL;
    return slowed;
}

static void link_free(struct mq_sess *s, int i)
{
    struct mq_link *k = s->links[i];
    sub_floor(&s->queued, atomic_load(&k->queued));
    list_del(&k->tnode);
    free(k);
    s->links[i] = s->links[--s->nlinks];
}

int mq_dirty_links(struct mq_broker *b, struct mq_sess *s, struct mq_link **v, int max)
{
    int n = 0;
    pthread_mutex_lock(&b->lock);
    /* round robin from where the last call stopped: with the in-flight window
     * full, the links first in the array would otherwise be served first always */
    int start = s->nlinks ? s->next_link % s->nlinks : 0;
    for (int j = 0; j < s->nlinks && n < max; j++) {
        int i = (start + j) % s->nlinks;
        if (atomic_exchange_explicit(&s->links[i]->dirty, 0, memory_order_acq_rel)) {
            v[n++] = s->links[i];
            s->next_link = i + 1;
        }
    }
    pthread_mutex_unlock(&b->lock);
    return n;
}

void mq_tap(void *arg, const void *key, size_t klen)
{
    struct mq_broker *b = arg;
    const char *name = (const char *)key + b->plen;
    size_t n = klen - b->plen;
    tapped = NULL;
    tapped_full = 0;
    if (!mqtt_topic_ok((const uint8_t *)name, n))
        return; /* a key under the prefix that no client could subscribe to */
    pthread_mutex_lock(&b->lock);
    struct mq_topic *t = mq_topic_get(b, name, n);
    if (t)
        for (struct list *l = t->links.next; l != &t->links; l = l->next) {
            struct mq_link *k = list_entry(l, struct mq_link, tnode);
            atomic_fetch_add_explicit(&k->queued, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&k->sess->queued, 1, memory_order_relaxed);
            if (queue_full(b, k, b->eng->cfg.mqtt_max_queued - 1))
                tapped_full = 1;
            raise_link(k);
        }
    pthread_mutex_unlock(&b->lock);
    tapped = t;
}

int mq_topic_claim(struct mq_topic **full)
{
    struct mq_topic *t = tapped;
    tapped = NULL;
    *full = tapped_full ? t : NULL;
    return t && !atomic_exchange_explicit(&t->indexed, 1, memory_order_relaxed);
}

/* HKEYS's and HGETALL's replies: an array (anything else -- an empty or absent hash,
 * not a hash -- holds nothing to learn), then bulk strings. */
static long long array_len(struct mq_rr *r)
{
    long long n;
    return mq_rr_int(r, '*', &n) || n < 0 ? 0 : n;
}

int mq_load_index(struct mq_broker *b, const char *p, size_t n)
{
    struct mq_rr r = {p, p + n};
    const char *name;
    size_t len;
    int rc = 0;
    pthread_mutex_lock(&b->lock);
    for (long long i = 0, count = array_len(&r); i < count && !rc && !mq_rr_bulk(&r, &name, &len); i++) {
        if (!mqtt_topic_ok((const uint8_t *)name, len))
            continue;
        struct mq_topic *t = mq_topic_get(b, name, len);
        if (t)
            atomic_store_explicit(&t->indexed, 1, memory_order_relaxed);
        else
            rc = -ENOMEM;
    }
    if (!rc)
        atomic_store(&b->indexed, 1);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int mq_load_retained(struct mq_broker *b, const char *p, size_t n)
{
    struct mq_rr r = {p, p + n};
    const char *name, *v;
    size_t len, vlen;
    int rc = 0;
    pthread_mutex_lock(&b->lock);
    for (long long i = 0, count = array_len(&r) / 2;
         i < count && !rc && !mq_rr_bulk(&r, &name, &len) && !mq_rr_bulk(&r, &v, &vlen); i++) {
        if (!mqtt_topic_ok((const uint8_t *)name, len) || vlen < 2 || (uint8_t)v[0] > 2)
            continue; /* not one this broker wrote */
        struct mq_topic *t = mq_topic_get(b, name, len);
        if (!t) {
            rc = -ENOMEM;
        } else if (!t->has_retained) { /* (one retained in this run already is newer) */
            t->retained.len = 0;
            if (kvbuf_append(&t->retained, v, vlen)) {
                rc = -ENOMEM;
            } else {
                t->has_retained = 1;
                atomic_fetch_add_explicit(&b->st.retained, 1, memory_order_relaxed);
            }
        }
    }
    if (!rc)
        atomic_store(&b->retained_loaded, 1);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

/* ---- sessions */

static struct mq_sess **sess_slot(struct mq_broker *b, const char *id, size_t n, uint64_t h)
{
    struct mq_sess **p = &b->sess[h % b->scap];
    while (*p && !((*p)->h == h && (*p)->idlen == n && !memcmp((*p)->id, id, n)))
        p = &(*p)->hnext;
    return p;
}

static void sess_end(struct mq_broker *b, struct mq_sess *s)
{
    struct mq_sess **p = sess_slot(b, s->id, s->idlen, s->h);
    if (*p == s)
        *p = s->hnext;
    list_del(&s->node);
    mq_wake_slowed(b, s);
    while (s->nlinks)
        link_free(s, 0);
    free(s->links);
    for (struct mq_filter *f = s->filters, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    for (int i = 0; i < s->nflight; i++)
        free(s->flight[i].pkt);
    free(s->flight);
    free(s->qos2_in);
    free(s);
    b->nsess--;
    atomic_fetch_sub_explicit(&b->st.sessions, 1, memory_order_relaxed);
}

int64_t mq_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mq_sess_known(struct mq_broker *b, const char *id, size_t idlen)
{
    pthread_mutex_lock(&b->lock);
    int known = b->scap && *sess_slot(b, id, idlen, hash(id, idlen)) != NULL;
    pthread_mutex_unlock(&b->lock);
    return known;
}

int mq_sess_attach(struct mq_broker *b, struct mq_conn *m, const char *id, size_t idlen, int clean, int evfd,
                   struct mq_poller *mp, const char *saved, size_t savedlen)
{
    pthread_mutex_lock(&b->lock);
    int rc;
    if (grow((void ***)&b->sess, &b->scap, b->nsess, offsetof(struct mq_sess, hnext), offsetof(struct mq_sess, h))) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t h = hash(id, idlen);
    struct mq_sess *s = *sess_slot(b, id, idlen, h);
    if (s && s->conn == m) { /* its CONNECT run again after a stall */
        rc = 1;
        goto out;
    }
    if (s && s->conn) {
        /* 3.1.4-2: the existing client is disconnected; this CONNECT waits until it is
         * gone (its poller closes it, publishes its will and wakes this one). */
        if (!atomic_exchange(&s->conn->kicked, 1))
            shutdown(s->conn->c->fd, SHUT_RDWR);
        s->waiter_mp = mp;
        s->waiter_evfd = evfd;
        rc = -EBUSY;
        goto out;
    }
    if (s && clean) {
        sess_end(b, s);
        s = NULL;
    }
    rc = s != NULL;
    if (!s) {
        if (b->nsess >= (size_t)b->eng->cfg.mqtt_max_sessions) {
            rc = -ENOSPC;
            goto out;
        }
        if (!(s = calloc(1, sizeof *s + idlen + 1))) {
            rc = -ENOMEM;
            goto out;
        }
        s->h = h;
        s->idlen = idlen;
        memcpy(s->id, id, idlen);
        s->next_id = 1;
        struct mq_sess **p = sess_slot(b, id, idlen, h);
        *p = s;
        list_add(&b->sessions, &s->node);
        b->nsess++;
        atomic_fetch_add_explicit(&b->st.sessions, 1, memory_order_relaxed);
        if (saved && !clean) {
            mq_sess_restore(b, s, saved, savedlen);
            rc = 1; /* session present: it was kept */
        }
    }
    s->clean = clean;
    s->conn = m;
    s->mp = mp;
    s->evfd = evfd;
    m->sess = s;
    /* whatever arrived while it was away is due */
    for (int i = 0; i < s->nlinks; i++)
        atomic_store_explicit(&s->links[i]->dirty, 1, memory_order_relaxed);
    atomic_store_explicit(&s->ready, 1, memory_order_release);
    atomic_store_explicit(&mp->wake, 1, memory_order_release);
out:
    pthread_mutex_unlock(&b->lock);
    return rc;
}

void mq_sess_detach(struct mq_broker *b, struct mq_conn *m)
{
    struct mq_sess *s = m->sess;
    if (!s)
        return;
    pthread_mutex_lock(&b->lock);
    s->conn = NULL;
    s->mp = NULL;
    s->evfd = -1;
    mq_wake_slowed(b, s); /* away, it slows no one */
    if (s->waiter_mp) { /* a CONNECT waits for this: its poller tries it again now */
        atomic_store_explicit(&s->waiter_mp->wake, 1, memory_order_release);
        uint64_t one = 1;
        (void)!write(s->waiter_evfd, &one, sizeof one);
        s->waiter_mp = NULL;
    }
    if (s->clean)
        sess_end(b, s);
    pthread_mutex_unlock(&b->lock);
    m->sess = NULL;
}

/* ---- subscriptions and retained messages */

/* kvt_apply's read of a stream's last ID (arg: struct mq_id *): 1 if it is a stream. */
static int64_t read_last_id(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    (void)ch;
    if (!cur->exists || cur->type != KVT_STREAM)
        return 0;
    struct mq_id *id = arg;
    id->ms = cur->stream->last_id.ms;
    id->seq = cur->stream->last_id.seq;
    return 1;
}

int mq_subscribe(struct mq_broker *b, struct mq_conn *m, const char *f, size_t n, int qos, struct kvbuf *out)
{
    struct mq_sess *s = m->sess;
    int64_t now = mq_unix_ms();
    int rc = 0;
    struct mq_topic **fresh = NULL; /* topics it matches that the session has no link to */
    struct mq_id *last = NULL;
    size_t nfresh = 0, cap = 0;
    pthread_mutex_lock(&b->lock);
    struct mq_filter *flt = s->filters;
    while (flt && !(flt->n == n && !memcmp(flt->f, f, n)))
        flt = flt->next;
    if (flt) { /* 3.8.4-3: replaces the old one (links keep their cursors) */
        flt->qos = qos;
    } else {
        if (s->nfilters >= MQ_MAX_FILTERS || !(flt = malloc(sizeof *flt + n + 1))) {
            rc = s->nfilters >= MQ_MAX_FILTERS ? -ENOSPC : -ENOMEM;
            goto out;
        }
        flt->qos = qos;
        flt->since_ms = now;
        flt->n = n;
        memcpy(flt->f, f, n);
        flt->next = s->filters;
        s->filters = flt;
        s->nfilters++;
    }
    for (size_t i = 0; i < b->tcap && !rc; i++)
        for (struct mq_topic *t = b->topics[i]; t && !rc; t = t->hnext) {
            if (!mqtt_match((const uint8_t *)f, n, (const uint8_t *)t->name, t->n))
                continue;
            struct mq_link *k = mq_link_of(s, t);
            if (!k) {
                if (nfresh == cap) {
                    size_t nc = cap ? cap * 2 : 16;
                    struct mq_topic **v = realloc(fresh, nc * sizeof *v);
                    if (!v) {
                        rc = -ENOMEM;
                        break;
                    }
                    fresh = v, cap = nc;
                }
                fresh[nfresh++] = t;
                continue;
            }
            k->qos = qos; /* its QoS: the largest its filters grant */
            for (struct mq_filter *g = s->filters; g; g = g->next)
                if (g->qos > k->qos && mqtt_match((const uint8_t *)g->f, g->n, (const uint8_t *)t->name, t->n))
                    k->qos = g->qos;
        }
    pthread_mutex_unlock(&b->lock);
    /* A new link starts after the last message its stream holds now: what was received
     * before the SUBSCRIBE is not delivered, what comes after is. Read outside the
     * broker lock (the table's hooks call the tap with a shard lock held); a stream not
     * in memory starts at the subscription's time instead. Topics are never freed. */
    last = nfresh ? calloc(nfresh, sizeof *last) : NULL;
    struct kvbuf key = {0};
    for (size_t i = 0; i < nfresh && last && !rc; i++) {
        key.len = 0;
        if (kvbuf_append(&key, b->prefix, b->plen) || kvbuf_append(&key, fresh[i]->name, fresh[i]->n)) {
            rc = -ENOMEM;
            break;
        }
        if (kvt_apply(b->eng->table, key.p, key.len, read_last_id, &last[i]) != 1)
            last[i] = (struct mq_id){(uint64_t)now - 1, UINT64_MAX};
    }
    kvbuf_free(&key);
    if (nfresh && !last)
        rc = -ENOMEM;
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < nfresh && !rc; i++) {
        struct mq_topic *t = fresh[i];
        if (mq_link_of(s, t)) /* linked meanwhile: a write made the topic's link (it has its cursor) */
            continue;
        rc = mq_link_add(s, t, qos, 0);
        struct mq_link *k = rc ? NULL : mq_link_of(s, t);
        if (k)
            k->last = last[i];
    }
    for (size_t i = 0; i < b->tcap && !rc; i++)
        for (struct mq_topic *t = b->topics[i]; t && !rc; t = t->hnext)
            if (t->has_retained && mqtt_match((const uint8_t *)f, n, (const uint8_t *)t->name, t->n)) {
                int q = t->retained.p[0] < qos ? t->retained.p[0] : qos; /* 3.3.1-6: sent with RETAIN set */
                rc = mq_send_publish(s, out, q, 1, t, (struct mq_id){0, 0}, t->retained.p + 1, t->retained.len - 1);
                if (!rc) {
                    atomic_fetch_add_explicit(&b->st.out[q], 1, memory_order_relaxed);
                } else if (rc == -EBUSY) { /* 65,535 in flight: no packet id left for it */
                    atomic_fetch_add_explicit(&b->st.dropped, 1, memory_order_relaxed);
                    rc = 0;
                }
            }
out:
    pthread_mutex_unlock(&b->lock);
    free(fresh);
    free(last);
    return rc;
}

void mq_unsubscribe(struct mq_broker *b, struct mq_sess *s, const char *f, size_t n)
{
    pthread_mutex_lock(&b->lock);
    struct mq_filter **p = &s->filters;
    while (*p && !((*p)->n == n && !memcmp((*p)->f, f, n)))
        p = &(*p)->next;
    if (*p) {
        struct mq_filter *gone = *p;
        *p = gone->next;
        free(gone);
        s->nfilters--;
        /* links no remaining filter matches go; the others take the QoS left */
        for (int i = 0; i < s->nlinks;) {
            struct mq_link *k = s->links[i];
            int qos = -1;
            for (struct mq_filter *g = s->filters; g; g = g->next)
                if (g->qos > qos && mqtt_match((const uint8_t *)g->f, g->n, (const uint8_t *)k->topic->name, k->topic->n))
                    qos = g->qos;
            if (qos < 0) {
                link_free(s, i);
            } else {
                k->qos = qos;
                i++;
            }
        }
    }
    pthread_mutex_unlock(&b->lock);
}

int mq_retain(struct mq_broker *b, const char *topic, size_t tlen, int qos, const void *payload, size_t plen)
{
    int rc = 0;
    pthread_mutex_lock(&b->lock);
    struct mq_topic *t = mq_topic_get(b, topic, tlen);
    if (!t) {
        rc = -ENOMEM;
    } else if (plen == 0) { /* 3.3.1-10: a zero-byte retained message clears it */
        if (t->has_retained)
            atomic_fetch_sub_explicit(&b->st.retained, 1, memory_order_relaxed);
        t->has_retained = 0;
        kvbuf_free(&t->retained);
    } else {
        t->retained.len = 0;
        uint8_t q = (uint8_t)qos;
        if (kvbuf_append(&t->retained, &q, 1) || kvbuf_append(&t->retained, payload, plen)) {
            rc = -ENOMEM;
        } else {
            if (!t->has_retained)
                atomic_fetch_add_explicit(&b->st.retained, 1, memory_order_relaxed);
            t->has_retained = 1;
        }
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

/* ---- INFO mqtt */

static void info(void *arg, struct kvbuf *out)
{
    struct mq_broker *b = arg;
    struct mq_stats *st = &b->st;
#define L(x) atomic_load_explicit(&(x), memory_order_relaxed)
    pthread_mutex_lock(&b->lock);
    size_t topics = b->ntopics;
    pthread_mutex_unlock(&b->lock);
    kvbuf_printf(out,
                 "mqtt_port:%d\r\nmqtt_topic_prefix:%s\r\nmqtt_connections:%llu\r\nmqtt_sessions:%llu\r\n"
                 "mqtt_topics:%zu\r\nmqtt_retained:%llu\r\n"
                 "mqtt_messages_in_qos0:%llu\r\nmqtt_messages_in_qos1:%llu\r\nmqtt_messages_in_qos2:%llu\r\n"
                 "mqtt_messages_out_qos0:%llu\r\nmqtt_messages_out_qos1:%llu\r\nmqtt_messages_out_qos2:%llu\r\n"
                 "mqtt_dropped:%llu\r\nmqtt_dropped_queue_full:%llu\r\nmqtt_publishers_slowed:%llu\r\n"
                 "mqtt_refused_connections:%llu\r\nmqtt_malformed_packets:%llu\r\n",
                 b->eng->mqtt_port, b->prefix, (unsigned long long)L(st->connections),
                 (unsigned long long)L(st->sessions), topics, (unsigned long long)L(st->retained),
                 (unsigned long long)L(st->in[0]), (unsigned long long)L(st->in[1]), (unsigned long long)L(st->in[2]),
                 (unsigned long long)L(st->out[0]), (unsigned long long)L(st->out[1]),
                 (unsigned long long)L(st->out[2]), (unsigned long long)L(st->dropped),
                 (unsigned long long)L(st->queue_dropped), (unsigned long long)L(st->slowed),
                 (unsigned long long)L(st->refused), (unsigned long long)L(st->malformed));
#undef L
}

/* ---- life */

int mqtt_create(struct mq_broker **out, struct kv_engine *eng, char *err, size_t errlen)
{
    const struct kv_config *cfg = &eng->cfg;
    struct mq_broker *b = calloc(1, sizeof *b);
    if (!b || !(b->prefix = strdup(cfg->mqtt_topic_prefix ? cfg->mqtt_topic_prefix : "mqtt:")) ||
        !(b->retained_key = strdup(cfg->mqtt_retained_key ? cfg->mqtt_retained_key : "mqtt-retained")) ||
        !(b->session_prefix = strdup(cfg->mqtt_session_prefix ? cfg->mqtt_session_prefix : "mqtt-session:"))) {
        mqtt_destroy(b);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    b->eng = eng;
    b->plen = strlen(b->prefix);
    b->rklen = strlen(b->retained_key);
    b->splen = strlen(b->session_prefix);
    pthread_mutex_init(&b->lock, NULL);
    list_init(&b->sessions);
    int rc = 0;
    if (cfg->mqtt_users && *cfg->mqtt_users && (rc = mq_users_load(cfg->mqtt_users, &b->users, err, errlen)) < 0) {
        mqtt_destroy(b);
        return rc;
    }
    rc = eng_info_add(eng, "mqtt", info, NULL, b);
    if (rc < 0) {
        snprintf(err, errlen, "cannot register INFO mqtt: %s", strerror(-rc));
        mqtt_destroy(b);
        return rc;
    }
    kw_set_tap(eng->keywait, b->prefix, b->plen, mq_tap, b);
    *out = b;
    return 0;
}

void mqtt_destroy(struct mq_broker *b)
{
    if (!b)
        return;
    if (b->eng && b->eng->keywait)
        kw_set_tap(b->eng->keywait, "", 0, NULL, NULL);
    while (!list_empty(&b->sessions))
        sess_end(b, list_entry(b->sessions.next, struct mq_sess, node));
    for (size_t i = 0; i < b->tcap; i++)
        for (struct mq_topic *t = b->topics[i], *next; t; t = next) {
            next = t->hnext;
            kvbuf_free(&t->retained);
            free(t);
        }
    free(b->topics);
    free(b->sess);
    free(b->prefix);
    free(b->retained_key);
    free(b->session_prefix);
    mq_users_free(b->users);
    pthread_mutex_destroy(&b->lock);
    free(b);
}
