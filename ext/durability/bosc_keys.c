/* bosc_keys.c - listing the keys the data file holds (bosc_keys_request, for
 * SCAN and KEYS): a small fixed table of slots under b->lock, filled by the
 * loader thread, taken (or waited for) by the requester. The loader reads a
 * bucket's chain as a load does (seqlock on the bucket's version, the
 * generation) and keeps the unexpired records' keys; it reads KEYS_STEP buckets
 * at a time and serves waiting loads in between. Parses untrusted bytes (the
 * file) through bosc_block.c's checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/kvbuf.h"
#include "core/table.h"
#include "durability/bosc_int.h"

static int64_t ticket_of(const struct bosc *b, const struct keys_slot *k)
{
    return (int64_t)k->gen << 8 | (int64_t)(k - b->keys);
}

/* The live slot a ticket names, or NULL (unknown, released or dropped). Lock held. */
static struct keys_slot *slot_of(struct bosc *b, int64_t ticket)
{
    if (ticket <= 0 || (ticket & 0xff) >= KEYS_SLOTS)
        return NULL;
    struct keys_slot *k = &b->keys[ticket & 0xff];
    return k->state != KS_FREE && k->gen == (uint32_t)(ticket >> 8) ? k : NULL;
}

static void slot_free(struct keys_slot *k)
{
    free(k->out.p);
    memset(&k->out, 0, sizeof k->out);
    k->state = KS_FREE;
    k->cancelled = 0;
}

/* A slot for a new request: a free one, else the oldest ready one nobody took
 * for KEYS_KEEP_MS (its requester went away). Lock held. */
static struct keys_slot *slot_get(struct bosc *b)
{
    struct keys_slot *old = NULL;
    uint64_t now = now_ns();
    for (int i = 0; i < KEYS_SLOTS; i++) {
        struct keys_slot *k = &b->keys[i];
        if (k->state == KS_FREE)
            return k;
        if (k->state == KS_READY && now - k->ready_ns >= (uint64_t)KEYS_KEEP_MS * 1000000u &&
            (!old || k->ready_ns < old->ready_ns))
            old = k;
    }
    if (old) {
        slot_free(old);
        add(&b->st.key_listings_dropped, 1);
    }
    return old;
}

int64_t bosc_keys_request(struct bosc *b, uint32_t first, uint32_t n, int evfd)
{
    if (first >= b->nbuckets || n == 0 || n > BOSC_KEYS_MAX_BUCKETS)
        return -EINVAL;
    if (atomic_load(&b->failed))
        return -EIO;
    pthread_mutex_lock(&b->lock);
    struct keys_slot *k = b->stop ? NULL : slot_get(b);
    int64_t ticket = b->stop ? -ECANCELED : -EBUSY;
    if (k) {
        k->gen++;
        if (!k->gen)
            k->gen = 1; /* tickets are > 0 */
        k->state = KS_QUEUED;
        k->evfd = evfd;
        k->next = first;
        k->end = n > b->nbuckets - first ? b->nbuckets : first + n;
        k->seq = ++b->keys_seq;
        k->rc = 0;
        ticket = ticket_of(b, k);
        pthread_cond_broadcast(&b->cond); /* the loader waits on it */
    }
    pthread_mutex_unlock(&b->lock);
    return ticket;
}

int bosc_keys_take(struct bosc *b, int64_t ticket, struct kvbuf *out)
{
    pthread_mutex_lock(&b->lock);
    struct keys_slot *k = slot_of(b, ticket);
    int rc = -ESTALE;
    if (k && k->state != KS_READY) {
        rc = 0;
    } else if (k) {
        rc = k->rc;
        if (!rc)
            rc = kvbuf_append(out, k->out.p, k->out.len) ? -ENOMEM : 1;
        slot_free(k);
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

void bosc_keys_wait(struct bosc *b, int64_t ticket)
{
    pthread_mutex_lock(&b->lock);
    struct keys_slot *k;
    while ((k = slot_of(b, ticket)) && k->state != KS_READY && b->started && !b->stop)
        pthread_cond_wait(&b->keys_cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
}

void bosc_keys_cancel(struct bosc *b, int64_t ticket)
{
    pthread_mutex_lock(&b->lock);
    struct keys_slot *k = slot_of(b, ticket);
    if (k && k->state == KS_RUNNING)
        k->cancelled = 1; /* the loader has its buffer: it frees the slot after its step */
    else if (k)
        slot_free(k);
    pthread_cond_broadcast(&b->keys_cond); /* a waiter on the ticket: it is gone */
    pthread_mutex_unlock(&b->lock);
}

uint32_t bosc_buckets(struct bosc *b) { return b->nbuckets; }

/* ---- the loader's side */

/* The job to work on next: the running one, else the oldest queued. Lock held. */
struct keys_slot *bosc_keys_next(struct bosc *b)
{
    struct keys_slot *best = NULL;
    for (int i = 0; i < KEYS_SLOTS; i++) {
        struct keys_slot *k = &b->keys[i];
        if (k->state == KS_RUNNING)
            return k;
        if (k->state == KS_QUEUED && (!best || k->seq < best->seq))
            best = k;
    }
    if (best)
        best->state = KS_RUNNING;
    return best;
}

struct collect {
    struct kvbuf *out;
    int64_t now;
    int oom;
};

static void collect_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key,
                        uint32_t klen, const unsigned char *val, uint32_t vlen, int64_t expire, int type)
{
    struct collect *c = arg;
    if (expire && expire <= c->now)
        return; /* gone for a reader; the flusher reclaims the record */
    unsigned char h[5];
    put32(h, klen);
    h[4] = (unsigned char)type;
    if (kvbuf_append(c->out, h, sizeof h) || kvbuf_append(c->out, key, klen))
        c->oom = 1;
}

/* Append bucket's keys to k->out, read consistently: a chain the flusher was
 * rewriting meanwhile (the version moved) is read again. Returns 0 or -errno
 * (err set). */
static int list_bucket(struct bosc *b, struct keys_slot *k, uint32_t bucket, struct kvbuf *s, uint32_t **chain,
                       size_t *capchain, char *err, size_t errlen)
{
    size_t mark = k->out.len, nchain = 0;
    for (int tries = 0;; tries++) {
        uint32_t ver = atomic_load_explicit(&b->ver[bucket], memory_order_acquire);
        uint64_t gen = atomic_load_explicit(&b->gen, memory_order_acquire);
        if (ver & 1) {
            bosc_wait_written(b); /* being written: wait it out */
            continue;
        }
        k->out.len = mark;
        int rc = 0;
        struct collect c = {&k->out, kvt_now_ms(), 0};
        if (atomic_load_explicit(&b->nkeys[bucket], memory_order_relaxed)) {
            rc = bosc_chain_read(b, bucket, gen, s, chain, &nchain, capchain, NULL, err, errlen);
            add(&b->st.key_listing_blocks, nchain);
            if (!rc && bosc_stream_walk((unsigned char *)s->p, s->len, collect_rec, &c) < 0)
                rc = bosc_stream_damaged(b, bucket, err, errlen);
        }
        int valid = atomic_load_explicit(&b->ver[bucket], memory_order_acquire) == ver &&
                    atomic_load_explicit(&b->gen, memory_order_acquire) == gen;
        if (!valid && tries < 1000)
            continue; /* read while the flusher wrote it */
        if (!rc && c.oom)
            rc = -ENOMEM;
        if (rc)
            k->out.len = mark;
        return rc;
    }
}

/* Read up to KEYS_STEP more buckets of k (loader, unlocked: k is RUNNING), then
 * mark it ready when done or failed. */
void bosc_keys_work(struct bosc *b, struct keys_slot *k)
{
    struct kvbuf s = {0};
    uint32_t *chain = NULL;
    size_t capchain = 0;
    char err[256];
    int rc = 0;
    for (int i = 0; i < KEYS_STEP && k->next < k->end && !rc; i++)
        if (!(rc = list_bucket(b, k, k->next, &s, &chain, &capchain, err, sizeof err)))
            k->next++;
    free(s.p);
    free(chain);
    if (rc && rc != -ENOMEM)
        fail(b, err); /* damage (or a failed read) stops the data file, as a load's does */
    int evfd = -1;
    pthread_mutex_lock(&b->lock);
    if (k->cancelled) {
        slot_free(k);
        pthread_cond_broadcast(&b->keys_cond); /* the ticket is gone: its waiters return */
    } else if (rc || k->next >= k->end) {
        k->rc = rc;
        k->state = KS_READY;
        k->ready_ns = now_ns();
        evfd = k->evfd;
        add(&b->st.key_listings, 1);
        pthread_cond_broadcast(&b->keys_cond);
    }
    pthread_mutex_unlock(&b->lock);
    if (evfd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(evfd, &one, sizeof one);
        (void)w;
    }
}

/* At close (threads stopped): every slot's memory. */
void bosc_keys_free_all(struct bosc *b)
{
    for (int i = 0; i < KEYS_SLOTS; i++)
        slot_free(&b->keys[i]);
}
