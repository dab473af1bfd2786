/* keywait.c - the registry of requests waiting for keys (keywait.h): entries
 * chained per bucket of the key's hash, each bucket under its own mutex. */
#include "core/keywait.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/siphash.h"

#define KW_BUCKETS 256

struct kw_bucket {
    pthread_mutex_t m;
    struct list entries;
} __attribute__((aligned(64)));

struct kw_reg {
    struct kw_bucket b[KW_BUCKETS];
    _Atomic uint64_t count;
    /* the tap (kw_set_tap): set before threads run, read without a lock */
    const char *tap_prefix;
    size_t tap_plen;
    kw_tap_fn tap;
    void *tap_arg;
};

int kw_create(struct kw_reg **out)
{
    struct kw_reg *r = aligned_alloc(64, sizeof *r);
    if (!r)
        return -ENOMEM;
    for (int i = 0; i < KW_BUCKETS; i++) {
        pthread_mutex_init(&r->b[i].m, NULL);
        list_init(&r->b[i].entries);
    }
    atomic_init(&r->count, 0);
    r->tap = NULL;
    *out = r;
    return 0;
}

void kw_destroy(struct kw_reg *r)
{
    if (!r)
        return;
    for (int i = 0; i < KW_BUCKETS; i++)
        pthread_mutex_destroy(&r->b[i].m);
    free(r);
}

static struct kw_bucket *bucket(struct kw_reg *r, uint64_t h) { return &r->b[h % KW_BUCKETS]; }

void kw_add(struct kw_reg *r, struct kw_entry *e)
{
    e->h = kvt_hash(e->key, e->klen);
    struct kw_bucket *b = bucket(r, e->h);
    pthread_mutex_lock(&b->m);
    list_add(b->entries.prev, &e->node); /* at the end: first come, first woken */
    pthread_mutex_unlock(&b->m);
    atomic_fetch_add_explicit(&r->count, 1, memory_order_relaxed);
}

void kw_del(struct kw_reg *r, struct kw_entry *e)
{
    struct kw_bucket *b = bucket(r, e->h);
    pthread_mutex_lock(&b->m);
    int listed = !list_empty(&e->node);
    list_del(&e->node);
    pthread_mutex_unlock(&b->m);
    if (listed)
        atomic_fetch_sub_explicit(&r->count, 1, memory_order_relaxed);
}

void kw_set_tap(struct kw_reg *r, const char *prefix, size_t plen, kw_tap_fn fn, void *arg)
{
    r->tap_prefix = prefix;
    r->tap_plen = plen;
    r->tap_arg = arg;
    r->tap = fn;
}

int kw_signal(struct kw_reg *r, const void *key, size_t klen)
{
    if (r && r->tap && klen >= r->tap_plen && !memcmp(key, r->tap_prefix, r->tap_plen))
        r->tap(r->tap_arg, key, klen);
    if (!r || !atomic_load_explicit(&r->count, memory_order_relaxed))
        return 0;
    uint64_t h = kvt_hash(key, klen);
    struct kw_bucket *b = bucket(r, h);
    int n = 0;
    pthread_mutex_lock(&b->m);
    for (struct list *l = b->entries.next; l != &b->entries; l = l->next) {
        struct kw_entry *e = list_entry(l, struct kw_entry, node);
        if (e->h != h || e->klen != klen || memcmp(e->key, key, klen))
            continue;
        if (!atomic_exchange_explicit(e->ready, 1, memory_order_acq_rel) && e->evfd >= 0) {
            uint64_t one = 1;
            (void)!write(e->evfd, &one, sizeof one);
        }
        n++;
    }
    pthread_mutex_unlock(&b->m);
    return n;
}

uint64_t kw_count(struct kw_reg *r) { return r ? atomic_load_explicit(&r->count, memory_order_relaxed) : 0; }
