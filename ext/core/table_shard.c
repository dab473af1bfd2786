/* table_shard.c - one shard of the table: entries, its two bucket arrays and the
 * incremental rehash between them, find/insert/unlink/replace, and the lookup
 * that expires keys and tells spill mode's "maybe in the data file" apart.
 * Every function here runs with the shard's mutex held (do_ prefix, as in
 * memcached) except the allocators; the memory accounting invariant is table.c's.
 * Keys come from the network (untrusted), lengths checked by the callers. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/ldu.h"
#include "core/table_int.h"

/* ---- memory accounting */

int kvt_mem_charge(struct kv_table *t, size_t n, int bounded)
{
    uint64_t max = bounded ? atomic_load_explicit(&t->max_memory, memory_order_relaxed) : 0;
    uint64_t prev = atomic_fetch_add_explicit(&t->used_memory, n, memory_order_relaxed);
    if (max && prev + n > max) {
        atomic_fetch_sub_explicit(&t->used_memory, n, memory_order_relaxed);
        return -ENOMEM;
    }
    return 0;
}

/* ---- entries */

struct kvt_entry *kvt_entry_new_b(struct kv_table *t, uint64_t h, const void *key, size_t klen,
                              const void *val, size_t vlen, size_t extra, int bounded)
{
    struct kvt_entry *e = malloc(sizeof *e + klen + vlen + extra);
    if (!e)
        return NULL;
    size_t usable = malloc_usable_size(e);
    if (kvt_mem_charge(t, usable, bounded)) {
        free(e);
        atomic_fetch_add_explicit(&t->oom_rejections, 1, memory_order_relaxed);
        errno = ENOMEM;
        return NULL;
    }
    e->next = NULL;
    e->hash = h;
    e->lsn = 0;
    e->expire_ms = 0;
    e->dn = NULL;
    e->flags = 0;
    e->klen = (uint32_t)klen;
    e->vlen = (uint32_t)vlen;
    size_t cap = usable - sizeof *e;
    e->cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
    memcpy(e->data, key, klen);
    if (vlen)
        memcpy(e->data + klen, val, vlen);
    return e;
}

void kvt_entry_free(struct kv_table *t, struct kvt_entry *e)
{
    kvt_entry_drop_stream(t, e);
    mem_uncharge(t, malloc_usable_size(e));
    free(e);
}

struct kvt_entry **kvt_buckets_new(struct kv_table *t, uint64_t n)
{
    struct kvt_entry **b = calloc(n, sizeof *b);
    if (!b)
        return NULL;
    if (kvt_mem_charge(t, malloc_usable_size(b), 1)) {
        free(b);
        return NULL;
    }
    return b;
}

void kvt_buckets_free(struct kv_table *t, struct kvt_entry **b)
{
    if (b) {
        mem_uncharge(t, malloc_usable_size(b));
        free(b);
    }
}

/* Move up to n buckets from ht[0] to ht[1]; finish the rehash when ht[0] is empty. */
void kvt_do_rehash_step(struct kv_table *t, struct shard *s, int n)
{
    int empty_visits = n * MAX_EMPTY_VISITS;
    while (n-- > 0 && s->rehashidx >= 0) {
        while ((uint64_t)s->rehashidx < s->size[0] && !s->ht[0][s->rehashidx]) {
            s->rehashidx++;
            if (--empty_visits == 0)
                return;
        }
        if ((uint64_t)s->rehashidx < s->size[0]) {
            struct kvt_entry *e = s->ht[0][s->rehashidx];
            uint64_t mask = s->size[1] - 1;
            while (e) {
                struct kvt_entry *next = e->next;
                e->next = s->ht[1][e->hash & mask];
                s->ht[1][e->hash & mask] = e;
                e = next;
            }
            s->ht[0][s->rehashidx++] = NULL;
        }
        if ((uint64_t)s->rehashidx >= s->size[0]) {
            kvt_buckets_free(t, s->ht[0]);
            set_ht0(s, s->ht[1], s->size[1]);
            s->ht[1] = NULL;
            s->size[1] = 0;
            s->rehashidx = -1;
            s->cursor = 0;
        }
    }
}

/* Start migrating to a table of n buckets. If the allocation is refused (memory
 * bound), keep the current table: longer chains, never lost data. */
void kvt_do_resize(struct kv_table *t, struct shard *s, uint64_t n)
{
    if (s->rehashidx >= 0 || n == s->size[0])
        return;
    struct kvt_entry **b = kvt_buckets_new(t, n);
    if (!b)
        return;
    s->ht[1] = b;
    s->size[1] = n;
    s->rehashidx = 0;
}

/* Link pointer to the entry with this key, or NULL. */
struct kvt_entry **kvt_do_find(struct shard *s, uint64_t h, const void *key, size_t klen)
{
    for (int i = 0; i < 2; i++) {
        if (!s->size[i])
            continue;
        struct kvt_entry **ref = &s->ht[i][h & (s->size[i] - 1)];
        for (; *ref; ref = &(*ref)->next) {
            struct kvt_entry *e = *ref;
            if (e->hash == h && e->klen == klen && memcmp(e->data, key, klen) == 0)
                return ref;
        }
        if (s->rehashidx < 0)
            break;
    }
    return NULL;
}

void kvt_do_unlink(struct kv_table *t, struct shard *s, struct kvt_entry **ref)
{
    struct kvt_entry *e = *ref;
    *ref = e->next;
    if (e->expire_ms)
        cnt_add(&s->expires, -1);
    cnt_add(&s->used, -1);
    kd_add(s, -contrib(e));
    kvt_dn_detach(t, e);
    kvt_entry_free(t, e);
}

/* The key stops existing (DEL, expiry): lsn is the delete's record (0: keep
 * e's). Without a data file, or when the key is known not to be in its block,
 * the entry goes (a pending insert of it is absorbed: it never reaches the
 * disk); otherwise it becomes a tombstone that the flusher deletes from the
 * block. Returns 0 or -ENOMEM (nothing changed). */
int kvt_do_remove(struct kv_table *t, struct shard *s, struct kvt_entry **ref, uint64_t lsn)
{
    struct kvt_entry *e = *ref;
    if (!t->sp.queue || ((e->flags & E_OD_MASK) == OD_NO && !(e->dn && e->dn->inflight))) {
        if (t->sp.queue && e->dn && !t->sp.queue_lock) /* the simple queue does not absorb */
            ldu_log(t->sp.queue, &e->dn->lo, LDU_REMOVE, 1);
        kvt_do_unlink(t, s, ref);
        return 0;
    }
    if (kvt_prep_dn(t, e, NULL))
        return -ENOMEM;
    kd_add(s, -contrib(e));
    if (e->expire_ms)
        cnt_add(&s->expires, -1);
    kvt_entry_drop_stream(t, e);
    e->flags |= E_TOMB;
    e->vlen = 0;
    e->expire_ms = 0;
    if (lsn)
        e->lsn = lsn;
    kd_add(s, contrib(e));
    mark_dirty(t, e, LDU_REMOVE);
    return 0;
}

/* Find key. *st: LK_LIVE (returned entry holds a value), LK_ABSENT (no value:
 * NULL, or a tombstone, which is returned so a write can reuse the slot), or,
 * in spill mode, LK_NOTRES: nothing in memory and the key's data-file block
 * may hold it, so it must be loaded first (kvt_load) unless the caller writes
 * blind. An entry whose time has passed is deleted (logged; removed or made a
 * tombstone). */
struct kvt_entry **kvt_do_lookup(struct kv_table *t, struct shard *s, uint64_t h, const void *key,
                             size_t klen, int *st)
{
    struct kvt_entry **ref = kvt_do_find(s, h, key, klen);
    if (ref) {
        struct kvt_entry *e = *ref;
        e->flags |= E_REF;
        if (e->flags & E_TOMB) {
            *st = LK_ABSENT;
            return ref;
        }
        if (!e->expire_ms || e->expire_ms > now_ms()) {
            *st = LK_LIVE;
            return ref;
        }
        /* Expired: the expiry happens now, and is logged as a deletion like
         * DEL's (a recovery must not bring back a key a client saw expire). */
        *st = LK_ABSENT;
        if (kvt_del_live(t, s, ref, key, klen) < 0)
            return ref; /* no memory for the tombstone, or the log refused: absent, retried later */
        cnt_add(&s->expired, 1);
        return kvt_do_find(s, h, key, klen);
    }
    if (t->sp.queue && t->sp.maybe_on_disk(t->sp.arg, key, klen)) {
        *st = LK_NOTRES;
        return NULL;
    }
    *st = LK_ABSENT;
    return NULL;
}

void kvt_do_insert(struct kv_table *t, struct shard *s, struct kvt_entry *e)
{
    int i = s->rehashidx >= 0 ? 1 : 0;
    struct kvt_entry **b = &s->ht[i][e->hash & (s->size[i] - 1)];
    e->next = *b;
    *b = e;
    cnt_add(&s->used, 1);
    if (e->expire_ms)
        cnt_add(&s->expires, 1);
    kd_add(s, contrib(e));
    uint64_t used = atomic_load_explicit(&s->used, memory_order_relaxed);
    if (s->rehashidx < 0 && used > s->size[0])
        kvt_do_resize(t, s, s->size[0] * 2);
}

/* Replace *ref's entry by ne (same key), keeping the chain. */
void kvt_do_replace(struct kv_table *t, struct shard *s, struct kvt_entry **ref,
                struct kvt_entry *ne)
{
    struct kvt_entry *old = *ref;
    ne->next = old->next;
    *ref = ne;
    cnt_add(&s->expires, (ne->expire_ms != 0) - (old->expire_ms != 0));
    kd_add(s, contrib(ne) - contrib(old));
    if (old->dn) { /* the queued node now stands for the new entry */
        ne->dn = old->dn;
        ne->dn->e = ne;
        old->dn = NULL;
    }
    kvt_entry_free(t, old);
}

