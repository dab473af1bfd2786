/* table.c - sharded, incrementally rehashed, memory-bounded hash table.
 * Invariants: every entry and bucket array is charged to used_memory with its
 * malloc_usable_size at allocation and uncharged at free; a shard's fields are
 * only touched with its mutex held, except the _Atomic counters that INFO reads.
 * Lock order: one shard lock at a time, never nested. Keys and values come from
 * the network (untrusted): lengths are bounded by KVT_MAX_VALUE. */
#define _GNU_SOURCE
#include "core/table.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/kvbuf.h"
#include "core/ldu.h"

#define INITIAL_BUCKETS 4
#define REHASH_STEP 1        /* buckets migrated per table operation */
#define MAX_EMPTY_VISITS 10  /* per migrated bucket, as Redis's dictRehash does */

struct kvt_entry {
    struct kvt_entry *next;
    uint64_t hash;
    uint64_t lsn;            /* log record that wrote this value, 0 = none */
    int64_t expire_ms;       /* unix ms, 0 = none */
    struct kvt_dnode *dn;    /* spill mode: the key's dirty-queue node, NULL = clean */
    uint32_t klen, vlen;
    uint32_t cap;            /* bytes usable in data[] */
    uint32_t flags;          /* E_* */
    unsigned char data[];    /* key bytes, then value bytes */
};

/* Entry flags. Spill mode (a data file behind the table, see kvt_set_spill) adds
 * tombstones and knows whether the key is in its data-file block. */
#define E_TOMB 1u            /* the key is absent: a delete not yet flushed, or a
                                negative cache entry (clean, OD_NO) */
#define E_REF 2u             /* used since the evictor's clock hand last passed */
#define E_OD_MASK 12u
#define OD_NO 0u             /* not in the data file (always, without one) */
#define OD_YES 4u            /* in its block, as the flusher last wrote it */
#define OD_UNK 8u            /* unknown: written blind (without reading the block) */

/* A dirty key's node in the flusher's LDU queue. Owned by the entry (e->dn)
 * while the entry lives; an entry removed while its node is queued leaves the
 * node orphaned (e == NULL) and the consumer frees it. The key is copied so
 * the flusher can place (and for an orphan, delete) the key without the entry.
 * e is read and written only under the key's shard lock. */
struct kvt_dnode {
    struct ldu_obj lo;
    uint64_t hash;
    struct kvt_entry *e;
    uint32_t klen;
    uint32_t sweep;          /* flusher's private mark: last sweep that saw it */
    uint64_t first_lsn;      /* LSN of the first change of this dirty period (0: unlogged):
                                while the key is not written, the file lacks changes from here */
    int inflight;            /* snapshot taken, its block write not yet settled (kvt_flushed):
                                the block may hold the key even while e says OD_NO */
    unsigned char key[];
};

/* Counters read without the lock (INFO, DBSIZE) are _Atomic; the shard owner
 * updates them under the lock with relaxed stores, readers tolerate staleness. */
struct shard {
    pthread_mutex_t lock;
    struct kvt_entry **ht[2];
    uint64_t size[2];        /* power of two, 0 = array absent */
    int64_t rehashidx;       /* next ht[0] bucket to migrate, -1 = not rehashing */
    uint64_t cursor;         /* housekeeping position in ht[0] */
    _Atomic uint64_t used;   /* entries in ht[0] + ht[1] */
    _Atomic uint64_t expires;
    _Atomic uint64_t hits, misses, expired;
    uint64_t del_lsn;        /* latest logged DEL/FLUSHALL that removed keys here: a miss
                                depends on it (the key may be absent only because of it) */
    _Atomic int64_t kdelta;  /* this shard's share of the key count, beyond the data
                                file's keys: +1 per live key not in its block, -1 per
                                tombstone of a key that is (see contrib()) */
    uint64_t clock;          /* evictor's hand in ht[0] */
} __attribute__((aligned(64)));

struct kv_table {
    struct shard shards[KVT_SHARDS];
    /* The only state shared by all writers: a reservation counter. A writer adds
     * its allocation first and backs out if that passed the bound, so concurrent
     * writers can never jointly overshoot max_memory. */
    _Atomic uint64_t used_memory __attribute__((aligned(64)));
    _Atomic uint64_t max_memory;
    _Atomic uint64_t oom_rejections;
    kvt_log_fn log;          /* set before the table is shared, never changed while in use */
    void *log_arg;
    struct kvt_spill sp;     /* spill mode when sp.queue != NULL; set before use, like log */
    _Atomic int64_t disk_keys; /* keys in the data file (the flusher keeps it) */
    _Atomic uint64_t count_seq; /* seqlock, odd while the flusher moves a key's count between
                                   a shard's kdelta and disk_keys (kvt_written) */
    _Atomic int spill_stuck; /* nothing left to evict: writes get -ENOMEM instead of waiting */
    unsigned clock_shard;    /* evictor's position (evictor thread only) */
};

static __thread uint64_t touched_lsn;

void kvt_lsn_reset(void) { touched_lsn = 0; }
uint64_t kvt_lsn_touched(void) { return touched_lsn; }

static inline void touch(uint64_t lsn)
{
    if (lsn > touched_lsn)
        touched_lsn = lsn;
}

void kvt_lsn_touch(uint64_t lsn) { touch(lsn); }

void kvt_set_log(struct kv_table *t, kvt_log_fn fn, void *arg)
{
    t->log = fn;
    t->log_arg = arg;
}

/* Log a mutation (caller holds the shard lock). Returns the LSN, 0 without a logger, or -errno. */
static int64_t do_log(struct kv_table *t, int op, const void *key, size_t klen, const void *v1,
                      size_t n1, const void *v2, size_t n2, int64_t expire)
{
    if (!t->log)
        return 0;
    int64_t lsn = t->log(t->log_arg, op, key, klen, v1, n1, v2, n2, expire);
    if (lsn > 0)
        touch((uint64_t)lsn);
    return lsn;
}

/* ---- memory accounting */

static int mem_charge(struct kv_table *t, size_t n, int bounded)
{
    uint64_t max = bounded ? atomic_load_explicit(&t->max_memory, memory_order_relaxed) : 0;
    uint64_t prev = atomic_fetch_add_explicit(&t->used_memory, n, memory_order_relaxed);
    if (max && prev + n > max) {
        atomic_fetch_sub_explicit(&t->used_memory, n, memory_order_relaxed);
        return -ENOMEM;
    }
    return 0;
}

static void mem_uncharge(struct kv_table *t, size_t n)
{
    atomic_fetch_sub_explicit(&t->used_memory, n, memory_order_relaxed);
}

static inline void cnt_add(_Atomic uint64_t *c, int64_t d)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
                          memory_order_relaxed);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- entries */

static struct kvt_entry *entry_new_b(struct kv_table *t, uint64_t h, const void *key, size_t klen,
                                     const void *val, size_t vlen, size_t extra, int bounded)
{
    struct kvt_entry *e = malloc(sizeof *e + klen + vlen + extra);
    if (!e)
        return NULL;
    size_t usable = malloc_usable_size(e);
    if (mem_charge(t, usable, bounded)) {
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

static struct kvt_entry *entry_new(struct kv_table *t, uint64_t h, const void *key, size_t klen,
                                   const void *val, size_t vlen, size_t extra)
{
    return entry_new_b(t, h, key, klen, val, vlen, extra, 1);
}

static void entry_free(struct kv_table *t, struct kvt_entry *e)
{
    mem_uncharge(t, malloc_usable_size(e));
    free(e);
}

static inline char *entry_val(struct kvt_entry *e) { return (char *)e->data + e->klen; }

/* ---- spill mode: dirty nodes and the key count */

/* The entry's share of the key count beyond the data file's own keys. */
static inline int64_t contrib(const struct kvt_entry *e)
{
    unsigned od = e->flags & E_OD_MASK;
    if (e->flags & E_TOMB)
        return od == OD_YES ? -1 : 0;
    return od == OD_YES ? 0 : 1;
}

static inline void kd_add(struct shard *s, int64_t d)
{
    atomic_store_explicit(&s->kdelta, atomic_load_explicit(&s->kdelta, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

/* Give ne a dirty node (spill mode) unless it will inherit slot's. Called
 * before the mutation is logged, so a failed allocation changes nothing.
 * Nodes are charged without the bound: they are what lets memory be freed. */
static int prep_dn(struct kv_table *t, struct kvt_entry *ne, struct kvt_entry *slot)
{
    if (!t->sp.queue || ne->dn || (slot && slot->dn))
        return 0;
    struct kvt_dnode *d = malloc(sizeof *d + ne->klen);
    if (!d)
        return -ENOMEM;
    atomic_fetch_add_explicit(&t->used_memory, malloc_usable_size(d), memory_order_relaxed);
    ldu_obj_init(&d->lo);
    d->hash = ne->hash;
    d->e = ne;
    d->klen = ne->klen;
    d->sweep = 0;
    d->inflight = 0;
    d->first_lsn = 0;
    memcpy(d->key, ne->data, ne->klen);
    ne->dn = d;
    return 0;
}

static void dnode_free(struct kv_table *t, struct kvt_dnode *d)
{
    mem_uncharge(t, malloc_usable_size(d));
    free(d);
}

/* e leaves the table: a queued node stays for the consumer (which frees it),
 * an idle one is freed. The used bits only clear under this shard lock
 * (kvt_flushed), so "not queued" cannot change under us. */
static void dn_detach(struct kv_table *t, struct kvt_entry *e)
{
    struct kvt_dnode *d = e->dn;
    if (!d)
        return;
    e->dn = NULL;
    d->e = NULL;
    if (!atomic_load_explicit(&d->lo.used, memory_order_relaxed))
        dnode_free(t, d);
}

/* Queue e's key for the flusher: op LDU_INSERT for a value, LDU_REMOVE for a
 * tombstone (never absorbed here: the block may hold the key). */
static inline void mark_dirty(struct kv_table *t, struct kvt_entry *e, int op)
{
    if (!t->sp.queue)
        return;
    if (!e->dn->first_lsn)
        e->dn->first_lsn = e->lsn;
    if (t->sp.queue_lock) { /* the simple mutex-protected queue LDU is measured against */
        pthread_mutex_lock(t->sp.queue_lock);
        ldu_log(t->sp.queue, &e->dn->lo, op, 0);
        pthread_mutex_unlock(t->sp.queue_lock);
    } else {
        ldu_log(t->sp.queue, &e->dn->lo, op, 0);
    }
}

/* ---- shard internals (caller holds s->lock) */

/* ht[0]/size[0] are also read without the lock by kvt_prefetch, which only feeds
 * the values to prefetch instructions (never dereferences them). Writers use
 * relaxed atomic stores so those reads are not data races; plain reads under the
 * lock stay plain. */
static inline void set_ht0(struct shard *s, struct kvt_entry **b, uint64_t size)
{
    __atomic_store_n(&s->ht[0], b, __ATOMIC_RELAXED);
    __atomic_store_n(&s->size[0], size, __ATOMIC_RELAXED);
}

static struct kvt_entry **buckets_new(struct kv_table *t, uint64_t n)
{
    struct kvt_entry **b = calloc(n, sizeof *b);
    if (!b)
        return NULL;
    if (mem_charge(t, malloc_usable_size(b), 1)) {
        free(b);
        return NULL;
    }
    return b;
}

static void buckets_free(struct kv_table *t, struct kvt_entry **b)
{
    if (b) {
        mem_uncharge(t, malloc_usable_size(b));
        free(b);
    }
}

/* Move up to n buckets from ht[0] to ht[1]; finish the rehash when ht[0] is empty. */
static void do_rehash_step(struct kv_table *t, struct shard *s, int n)
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
            buckets_free(t, s->ht[0]);
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
static void do_resize(struct kv_table *t, struct shard *s, uint64_t n)
{
    if (s->rehashidx >= 0 || n == s->size[0])
        return;
    struct kvt_entry **b = buckets_new(t, n);
    if (!b)
        return;
    s->ht[1] = b;
    s->size[1] = n;
    s->rehashidx = 0;
}

/* Link pointer to the entry with this key, or NULL. */
static struct kvt_entry **do_find(struct shard *s, uint64_t h, const void *key, size_t klen)
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

static void do_unlink(struct kv_table *t, struct shard *s, struct kvt_entry **ref)
{
    struct kvt_entry *e = *ref;
    *ref = e->next;
    if (e->expire_ms)
        cnt_add(&s->expires, -1);
    cnt_add(&s->used, -1);
    kd_add(s, -contrib(e));
    dn_detach(t, e);
    entry_free(t, e);
}

/* The key stops existing (DEL, expiry): lsn is the delete's record (0: keep
 * e's). Without a data file, or when the key is known not to be in its block,
 * the entry goes (a pending insert of it is absorbed: it never reaches the
 * disk); otherwise it becomes a tombstone that the flusher deletes from the
 * block. Returns 0 or -ENOMEM (nothing changed). */
static int do_remove(struct kv_table *t, struct shard *s, struct kvt_entry **ref, uint64_t lsn)
{
    struct kvt_entry *e = *ref;
    if (!t->sp.queue || ((e->flags & E_OD_MASK) == OD_NO && !(e->dn && e->dn->inflight))) {
        if (t->sp.queue && e->dn && !t->sp.queue_lock) /* the simple queue does not absorb */
            ldu_log(t->sp.queue, &e->dn->lo, LDU_REMOVE, 1);
        do_unlink(t, s, ref);
        return 0;
    }
    if (prep_dn(t, e, NULL))
        return -ENOMEM;
    kd_add(s, -contrib(e));
    if (e->expire_ms)
        cnt_add(&s->expires, -1);
    e->flags |= E_TOMB;
    e->vlen = 0;
    e->expire_ms = 0;
    if (lsn)
        e->lsn = lsn;
    kd_add(s, contrib(e));
    mark_dirty(t, e, LDU_REMOVE);
    return 0;
}

enum { LK_LIVE, LK_ABSENT, LK_NOTRES };

/* Find key. *st: LK_LIVE (returned entry holds a value), LK_ABSENT (no value:
 * NULL, or a tombstone, which is returned so a write can reuse the slot), or,
 * in spill mode, LK_NOTRES: nothing in memory and the key's data-file block
 * may hold it, so it must be loaded first (kvt_load) unless the caller writes
 * blind. An entry whose time has passed is removed (or made a tombstone). */
static struct kvt_entry **do_lookup(struct kv_table *t, struct shard *s, uint64_t h, const void *key,
                                    size_t klen, int *st)
{
    struct kvt_entry **ref = do_find(s, h, key, klen);
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
        cnt_add(&s->expired, 1);
        *st = LK_ABSENT;
        if (do_remove(t, s, ref, 0))
            return ref; /* no memory for the tombstone yet: treated as absent, retried later */
        return do_find(s, h, key, klen);
    }
    if (t->sp.queue && t->sp.maybe_on_disk(t->sp.arg, key, klen)) {
        *st = LK_NOTRES;
        return NULL;
    }
    *st = LK_ABSENT;
    return NULL;
}

/* do_lookup for readers: the live entry or NULL; *st as do_lookup. */
static inline struct kvt_entry *do_live(struct kv_table *t, struct shard *s, uint64_t h, const void *key,
                                        size_t klen, int *st)
{
    struct kvt_entry **ref = do_lookup(t, s, h, key, klen, st);
    return *st == LK_LIVE ? *ref : NULL;
}

static void do_insert(struct kv_table *t, struct shard *s, struct kvt_entry *e)
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
        do_resize(t, s, s->size[0] * 2);
}

/* Replace *ref's entry by ne (same key), keeping the chain. */
static void do_replace(struct kv_table *t, struct shard *s, struct kvt_entry **ref,
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
    entry_free(t, old);
}

static inline struct shard *shard_of(struct kv_table *t, uint64_t h)
{
    return &t->shards[h >> 56]; /* top bits pick the shard, low bits the bucket */
}

static struct shard *lock_shard(struct kv_table *t, uint64_t h)
{
    struct shard *s = shard_of(t, h);
    pthread_mutex_lock(&s->lock);
    if (s->rehashidx >= 0)
        do_rehash_step(t, s, REHASH_STEP);
    return s;
}

/* ---- public API */

int kvt_create(struct kv_table **out, uint64_t max_memory)
{
    struct kv_table *t = aligned_alloc(64, (sizeof *t + 63) & ~(size_t)63);
    if (!t)
        return -ENOMEM;
    memset(t, 0, sizeof *t);
    atomic_init(&t->max_memory, max_memory);
    for (int i = 0; i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        pthread_mutex_init(&s->lock, NULL);
        s->rehashidx = -1;
        struct kvt_entry **b = buckets_new(t, INITIAL_BUCKETS);
        if (!b) {
            kvt_destroy(t);
            return -ENOMEM;
        }
        set_ht0(s, b, INITIAL_BUCKETS);
    }
    *out = t;
    return 0;
}

static void do_clear(struct kv_table *t, struct shard *s)
{
    for (int i = 0; i < 2; i++) {
        for (uint64_t j = 0; j < s->size[i]; j++) {
            struct kvt_entry *e = s->ht[i][j];
            while (e) {
                struct kvt_entry *next = e->next;
                dn_detach(t, e);
                entry_free(t, e);
                e = next;
            }
        }
        buckets_free(t, s->ht[i]);
    }
    set_ht0(s, NULL, 0);
    s->ht[1] = NULL;
    s->size[1] = 0;
    s->rehashidx = -1;
    s->cursor = 0;
    atomic_store_explicit(&s->used, 0, memory_order_relaxed);
    atomic_store_explicit(&s->expires, 0, memory_order_relaxed);
    atomic_store_explicit(&s->kdelta, 0, memory_order_relaxed);
}

void kvt_destroy(struct kv_table *t)
{
    if (!t)
        return;
    for (int i = 0; i < KVT_SHARDS; i++) {
        do_clear(t, &t->shards[i]);
        pthread_mutex_destroy(&t->shards[i].lock);
    }
    free(t);
}

void kvt_set_max_memory(struct kv_table *t, uint64_t max_memory)
{
    atomic_store_explicit(&t->max_memory, max_memory, memory_order_relaxed);
}

uint64_t kvt_max_memory(struct kv_table *t)
{
    return atomic_load_explicit(&t->max_memory, memory_order_relaxed);
}

int kvt_get(struct kv_table *t, const void *key, size_t klen, kvt_read_fn fn, void *arg)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    if (e) {
        cnt_add(&s->hits, 1);
        touch(e->lsn);
        if (fn)
            fn(arg, entry_val(e), e->vlen);
    } else if (st == LK_ABSENT) {
        cnt_add(&s->misses, 1);
        touch(s->del_lsn);
    }
    pthread_mutex_unlock(&s->lock);
    return st == LK_NOTRES ? -ENODATA : e != NULL;
}

struct copy_arg {
    void *buf;
    size_t cap;
    int64_t len;
};

static void copy_out(void *arg, const char *val, size_t vlen)
{
    struct copy_arg *c = arg;
    c->len = (int64_t)vlen;
    if (vlen <= c->cap)
        memcpy(c->buf, val, vlen);
}

int64_t kvt_get_copy(struct kv_table *t, const void *key, size_t klen, void *buf, size_t cap)
{
    struct copy_arg c = {buf, cap, -ENOENT};
    int rc = kvt_get(t, key, klen, copy_out, &c);
    return rc < 0 ? rc : c.len;
}

int kvt_set(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen,
            int flags, int64_t expire_ms, kvt_read_fn old_fn, void *old_arg)
{
    if (klen > KVT_MAX_VALUE || vlen > KVT_MAX_VALUE)
        return -E2BIG;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st, rc = 1;
    struct kvt_entry **ref = do_lookup(t, s, h, key, klen, &st);
    if (st == LK_NOTRES && (old_fn || (flags & (KVT_NX | KVT_XX | KVT_KEEPTTL)))) {
        rc = -ENODATA; /* the answer depends on the block: load it first */
        goto out;
    }
    struct kvt_entry *slot = ref ? *ref : NULL;       /* live entry or tombstone */
    struct kvt_entry *e = st == LK_LIVE ? slot : NULL; /* live entry */
    if (old_fn && e) {
        touch(e->lsn);
        old_fn(old_arg, entry_val(e), e->vlen);
    }
    if (!e)
        touch(s->del_lsn); /* a reply that shows the key absent depends on its deletion */
    if (((flags & KVT_NX) && e) || ((flags & KVT_XX) && !e)) {
        if (e)
            touch(e->lsn); /* the reply reveals that the key exists */
        rc = 0;
        goto out;
    }
    if (e && (flags & KVT_KEEPTTL))
        expire_ms = e->expire_ms;
    size_t need = klen + vlen;
    /* Overwrite in place when the value fits and would not waste over half the block. */
    if (slot && need <= slot->cap && slot->cap <= 2 * need + 64) {
        if (prep_dn(t, slot, NULL)) {
            rc = -ENOMEM;
            goto out;
        }
        int64_t lsn = do_log(t, 1, key, klen, val, vlen, NULL, 0, expire_ms);
        if (lsn < 0) {
            rc = (int)lsn;
            goto out;
        }
        kd_add(s, -contrib(slot));
        slot->flags &= ~E_TOMB;
        kd_add(s, contrib(slot));
        memcpy(entry_val(slot), val, vlen);
        slot->vlen = (uint32_t)vlen;
        slot->lsn = (uint64_t)lsn;
        cnt_add(&s->expires, (expire_ms != 0) - (slot->expire_ms != 0));
        slot->expire_ms = expire_ms;
        mark_dirty(t, slot, LDU_INSERT);
        goto out;
    }
    struct kvt_entry *ne = entry_new_b(t, h, key, klen, val, vlen, 0, !(flags & KVT_NOBOUND));
    if (!ne) {
        rc = -ENOMEM;
        goto out;
    }
    ne->flags = slot ? slot->flags & E_OD_MASK : st == LK_NOTRES ? OD_UNK : OD_NO;
    if (prep_dn(t, ne, slot)) {
        entry_free(t, ne);
        rc = -ENOMEM;
        goto out;
    }
    int64_t lsn = do_log(t, 1, key, klen, val, vlen, NULL, 0, expire_ms);
    if (lsn < 0) {
        if (ne->dn)
            dnode_free(t, ne->dn);
        entry_free(t, ne);
        rc = (int)lsn;
        goto out;
    }
    ne->lsn = (uint64_t)lsn;
    ne->expire_ms = expire_ms;
    if (slot)
        do_replace(t, s, ref, ne);
    else
        do_insert(t, s, ne);
    mark_dirty(t, ne, LDU_INSERT);
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Delete a live entry: log it, then remove it. */
static int del_live(struct kv_table *t, struct shard *s, struct kvt_entry **ref, const void *key, size_t klen)
{
    if (t->sp.queue && prep_dn(t, *ref, NULL))
        return -ENOMEM; /* the tombstone's node, before anything is logged */
    int64_t lsn = do_log(t, 2, key, klen, NULL, 0, NULL, 0, 0);
    if (lsn < 0)
        return (int)lsn;
    do_remove(t, s, ref, (uint64_t)lsn); /* cannot fail now: the node exists */
    if ((uint64_t)lsn > s->del_lsn)
        s->del_lsn = (uint64_t)lsn;
    return 1;
}

int kvt_del(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st, rc = 0;
    struct kvt_entry **ref = do_lookup(t, s, h, key, klen, &st);
    if (st == LK_LIVE)
        rc = del_live(t, s, ref, key, klen);
    else if (st == LK_NOTRES)
        rc = -ENODATA;
    else
        touch(s->del_lsn); /* "0 deleted" may rest on an earlier delete */
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int kvt_del_blind(struct kv_table *t, const void *key, size_t klen)
{
    if (klen > KVT_MAX_VALUE)
        return -E2BIG;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st, rc = 0;
    struct kvt_entry **ref = do_lookup(t, s, h, key, klen, &st);
    if (st == LK_LIVE) {
        rc = del_live(t, s, ref, key, klen);
    } else if (st == LK_NOTRES) {
        /* A tombstone of unknown standing: the flusher deletes the key from its
         * block if it is there. Charged without the bound, like replay. */
        struct kvt_entry *ne = entry_new_b(t, h, key, klen, NULL, 0, 0, 0);
        rc = !ne || prep_dn(t, ne, NULL) ? -ENOMEM : 0;
        int64_t lsn = rc ? 0 : do_log(t, 2, key, klen, NULL, 0, NULL, 0, 0);
        if (rc || lsn < 0) {
            if (ne && ne->dn)
                dnode_free(t, ne->dn);
            if (ne)
                entry_free(t, ne);
            rc = rc ? rc : (int)lsn;
        } else {
            ne->flags = E_TOMB | OD_UNK;
            ne->lsn = (uint64_t)lsn;
            do_insert(t, s, ne);
            mark_dirty(t, ne, LDU_REMOVE);
            if ((uint64_t)lsn > s->del_lsn)
                s->del_lsn = (uint64_t)lsn;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int kvt_exists(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    touch(e ? e->lsn : s->del_lsn);
    pthread_mutex_unlock(&s->lock);
    return st == LK_NOTRES ? -ENODATA : e != NULL;
}
/* Redis's string2ll rules: optional '-', no '+', no leading zeros, no spaces. */
static int parse_ll(const char *p, size_t n, int64_t *out)
{
    if (n == 0 || n > 20)
        return -1;
    if (n == 1 && p[0] == '0') {
        *out = 0;
        return 0;
    }
    size_t i = 0;
    int neg = 0;
    if (p[0] == '-') {
        neg = 1;
        if (++i == n)
            return -1;
    }
    if (p[i] < '1' || p[i] > '9')
        return -1;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        if (v > (UINT64_MAX - (uint64_t)(p[i] - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return -1;
        *out = (int64_t)(0 - v);
    } else {
        if (v > INT64_MAX)
            return -1;
        *out = (int64_t)v;
    }
    return 0;
}

/* Store v1+v2 under a key whose lookup gave ref/st (INCR, APPEND): in place
 * when it fits the slot (a live entry or a tombstone), else in a new entry
 * with `extra` spare bytes. v1 may be the slot's own value. Returns 0 or -errno. */
static int do_store(struct kv_table *t, struct shard *s, uint64_t h, struct kvt_entry **ref, int st,
                    const void *key, size_t klen, const void *v1, size_t n1, const void *v2, size_t n2,
                    int64_t expire, size_t extra)
{
    struct kvt_entry *slot = ref ? *ref : NULL;
    size_t vlen = n1 + n2;
    if (slot && klen + vlen <= slot->cap) {
        if (prep_dn(t, slot, NULL))
            return -ENOMEM;
        int64_t lsn = do_log(t, 1, key, klen, v1, n1, v2, n2, expire);
        if (lsn < 0)
            return (int)lsn;
        kd_add(s, -contrib(slot));
        slot->flags &= ~E_TOMB;
        kd_add(s, contrib(slot));
        if (n1 && v1 != entry_val(slot))
            memmove(entry_val(slot), v1, n1);
        if (n2)
            memcpy(entry_val(slot) + n1, v2, n2);
        slot->vlen = (uint32_t)vlen;
        slot->lsn = (uint64_t)lsn;
        cnt_add(&s->expires, (expire != 0) - (slot->expire_ms != 0));
        slot->expire_ms = expire;
        mark_dirty(t, slot, LDU_INSERT);
        return 0;
    }
    struct kvt_entry *ne = entry_new(t, h, key, klen, v1, n1, n2 + extra);
    if (!ne)
        return -ENOMEM;
    if (n2)
        memcpy(entry_val(ne) + n1, v2, n2);
    ne->vlen = (uint32_t)vlen;
    ne->flags = slot ? slot->flags & E_OD_MASK : st == LK_NOTRES ? OD_UNK : OD_NO;
    if (prep_dn(t, ne, slot)) {
        entry_free(t, ne);
        return -ENOMEM;
    }
    int64_t lsn = do_log(t, 1, key, klen, v1, n1, v2, n2, expire);
    if (lsn < 0) {
        if (ne->dn)
            dnode_free(t, ne->dn);
        entry_free(t, ne);
        return (int)lsn;
    }
    ne->lsn = (uint64_t)lsn;
    ne->expire_ms = expire;
    if (slot)
        do_replace(t, s, ref, ne);
    else
        do_insert(t, s, ne);
    mark_dirty(t, ne, LDU_INSERT);
    return 0;
}

int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st, rc = 0;
    struct kvt_entry **ref = do_lookup(t, s, h, key, klen, &st);
    struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
    int64_t cur = 0;
    if (st == LK_NOTRES) {
        rc = -ENODATA;
        goto out;
    }
    touch(e ? e->lsn : s->del_lsn); /* an error reply reveals the current value too */
    if (e && parse_ll(entry_val(e), e->vlen, &cur)) {
        rc = -EINVAL;
        goto out;
    }
    if ((delta < 0 && cur < INT64_MIN - delta) || (delta > 0 && cur > INT64_MAX - delta)) {
        rc = -ERANGE;
        goto out;
    }
    cur += delta;
    char num[24];
    int n = snprintf(num, sizeof num, "%lld", (long long)cur);
    /* INCR keeps the TTL, as in Redis */
    rc = do_store(t, s, h, ref, st, key, klen, num, (size_t)n, NULL, 0, e ? e->expire_ms : 0, 0);
    if (!rc)
        *result = cur;
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st;
    struct kvt_entry **ref = do_lookup(t, s, h, key, klen, &st);
    struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
    size_t oldlen = e ? e->vlen : 0;
    int64_t rc;
    if (st == LK_NOTRES) {
        rc = -ENODATA;
        goto out;
    }
    touch(e ? e->lsn : s->del_lsn);
    if (oldlen + vlen > KVT_MAX_VALUE) {
        rc = -E2BIG;
        goto out;
    }
    /* A grown value gets room to spare so repeated APPENDs are amortized O(1). */
    size_t extra = !e ? 0 : oldlen + vlen < 1024 * 1024 ? oldlen + vlen : 1024 * 1024;
    rc = do_store(t, s, h, ref, st, key, klen, e ? entry_val(e) : NULL, oldlen, val, vlen,
                  e ? e->expire_ms : 0, extra);
    if (!rc)
        rc = (int64_t)(oldlen + vlen);
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    int64_t n = e ? e->vlen : 0;
    touch(e ? e->lsn : s->del_lsn);
    pthread_mutex_unlock(&s->lock);
    return st == LK_NOTRES ? -ENODATA : n;
}

/* Remove the shard's entries written before LSN upto (all, without a logger). */
static void do_clear_before(struct kv_table *t, struct shard *s, uint64_t upto)
{
    for (int i = 0; i < 2; i++) {
        for (uint64_t j = 0; j < s->size[i]; j++) {
            struct kvt_entry **ref = &s->ht[i][j];
            while (*ref) {
                if ((*ref)->lsn < upto)
                    do_unlink(t, s, ref);
                else
                    ref = &(*ref)->next;
            }
        }
    }
}

/* After FLUSHALL emptied the data file: no entry's key is in a block any more. */
static void do_forget_disk(struct shard *s)
{
    for (int i = 0; i < 2; i++)
        for (uint64_t j = 0; j < s->size[i]; j++)
            for (struct kvt_entry *e = s->ht[i][j]; e; e = e->next) {
                kd_add(s, -contrib(e));
                e->flags &= ~E_OD_MASK;
                kd_add(s, contrib(e));
            }
}

int kvt_flush(struct kv_table *t)
{
    if (!t->log && !t->sp.queue) {
        for (int i = 0; i < KVT_SHARDS; i++) {
            /* The fresh bucket array is charged without the bound: a flush must
             * work even when max_memory was lowered below usage or concurrent
             * writers took the room it frees. It is the shard's minimum footprint. */
            struct kvt_entry **fresh = calloc(INITIAL_BUCKETS, sizeof *fresh);
            if (!fresh)
                return -ENOMEM;
            atomic_fetch_add_explicit(&t->used_memory, malloc_usable_size(fresh), memory_order_relaxed);
            struct shard *s = &t->shards[i];
            pthread_mutex_lock(&s->lock);
            do_clear(t, s);
            set_ht0(s, fresh, INITIAL_BUCKETS);
            pthread_mutex_unlock(&s->lock);
        }
        return 0;
    }
    /* Logged: the FLUSH record gets LSN F first; then each shard drops what was
     * written before F. A write logged after F survives here exactly as it does
     * in a replay (FLUSH, then the write), whichever shard order we take. Entries
     * without an LSN (replayed before the log was attached) predate F. */
    /* Spill mode: the data file's generation is bumped together with the logging
     * of FLUSH (one critical section the flusher also takes to read the durable
     * LSN and the generation), so no sweep can record "flushed up to F" with the
     * old generation. From the bump on every block reads as empty, so what
     * survives below is known not to be in a block. */
    if (t->sp.queue)
        t->sp.flushall(t->sp.arg, KVT_FLUSH_BEGIN);
    int64_t f = t->log ? do_log(t, 3, NULL, 0, NULL, 0, NULL, 0, 0) : 0;
    if (t->sp.queue)
        t->sp.flushall(t->sp.arg, f < 0 ? KVT_FLUSH_ABORT : KVT_FLUSH_COMMIT);
    if (f < 0)
        return (int)f;
    uint64_t upto = t->log ? (uint64_t)f : UINT64_MAX;
    for (int i = 0; i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        pthread_mutex_lock(&s->lock);
        do_clear_before(t, s, upto);
        if (t->sp.queue)
            do_forget_disk(s);
        if ((uint64_t)f > s->del_lsn)
            s->del_lsn = (uint64_t)f;
        pthread_mutex_unlock(&s->lock);
    }
    return 0;
}

uint64_t kvt_count(struct kv_table *t)
{
    /* Seqlock read: a sum taken while the flusher moved a key between the file's
     * count and a shard's could count it twice or not at all; try again then (a
     * bounded number of times: the flusher moves keys in bursts with gaps). */
    int64_t n = 0;
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t s1 = atomic_load_explicit(&t->count_seq, memory_order_acquire);
        if (s1 & 1)
            continue;
        n = atomic_load_explicit(&t->disk_keys, memory_order_relaxed);
        for (int i = 0; i < KVT_SHARDS; i++)
            n += atomic_load_explicit(&t->shards[i].kdelta, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&t->count_seq, memory_order_relaxed) == s1)
            break;
    }
    return n > 0 ? (uint64_t)n : 0;
}

uint64_t kvt_used_memory(struct kv_table *t)
{
    return atomic_load_explicit(&t->used_memory, memory_order_relaxed);
}

void kvt_get_stats(struct kv_table *t, struct kvt_stats *st)
{
    memset(st, 0, sizeof *st);
    for (int i = 0; i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        st->entries += atomic_load_explicit(&s->used, memory_order_relaxed);
        st->expires += atomic_load_explicit(&s->expires, memory_order_relaxed);
        st->hits += atomic_load_explicit(&s->hits, memory_order_relaxed);
        st->misses += atomic_load_explicit(&s->misses, memory_order_relaxed);
        st->expired_keys += atomic_load_explicit(&s->expired, memory_order_relaxed);
        pthread_mutex_lock(&s->lock);
        st->buckets += s->size[0] + s->size[1];
        st->rehashing += s->rehashidx >= 0;
        pthread_mutex_unlock(&s->lock);
    }
    st->keys = kvt_count(t);
    st->disk_keys = (uint64_t)atomic_load_explicit(&t->disk_keys, memory_order_relaxed);
    st->used_memory = kvt_used_memory(t);
    st->max_memory = atomic_load_explicit(&t->max_memory, memory_order_relaxed);
    st->oom_rejections = atomic_load_explicit(&t->oom_rejections, memory_order_relaxed);
}

int kvt_housekeep(struct kv_table *t, unsigned first, unsigned n, unsigned budget)
{
    int reclaimed = 0;
    int64_t now = now_ms();
    for (unsigned i = first; i < first + n && i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        pthread_mutex_lock(&s->lock);
        if (s->rehashidx >= 0) {
            do_rehash_step(t, s, 16);
        } else {
            uint64_t used = atomic_load_explicit(&s->used, memory_order_relaxed);
            if (s->size[0] > INITIAL_BUCKETS && used < s->size[0] / 8) {
                uint64_t want = INITIAL_BUCKETS;
                while (want < used)
                    want *= 2;
                do_resize(t, s, want);
            }
        }
        if (s->rehashidx < 0 && atomic_load_explicit(&s->expires, memory_order_relaxed)) {
            for (unsigned v = 0; v < budget && s->size[0]; v++) {
                struct kvt_entry **ref = &s->ht[0][s->cursor];
                while (*ref) {
                    struct kvt_entry *e = *ref;
                    if (e->expire_ms && e->expire_ms <= now && !do_remove(t, s, ref, 0)) {
                        cnt_add(&s->expired, 1);
                        reclaimed++;
                        if (*ref == e) /* became a tombstone in place */
                            ref = &e->next;
                    } else {
                        ref = &(*ref)->next;
                    }
                }
                s->cursor = (s->cursor + 1) & (s->size[0] - 1);
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
    return reclaimed;
}

void kvt_prefetch(struct kv_table *t, uint64_t h, int stage)
{
    struct shard *s = shard_of(t, h);
    if (stage == 1) {
        __builtin_prefetch(s, 1, 3); /* the lock and the table pointers share this line */
        return;
    }
    if (stage == 3) {
        /* The chain's first entry: reading the slot needs the lock (the array may
         * be freed by a finishing rehash); its line is cached after stage 2. */
        pthread_mutex_lock(&s->lock);
        if (s->size[0]) {
            struct kvt_entry *e = s->ht[0][h & (s->size[0] - 1)];
            if (e) {
                __builtin_prefetch(e, 0, 3);
                __builtin_prefetch((char *)e + 64, 0, 3);
            }
        }
        pthread_mutex_unlock(&s->lock);
        return;
    }
    /* Possibly stale (a rehash may finish meanwhile): only ever prefetched, and a
     * prefetch of any address is harmless. */
    struct kvt_entry **b = __atomic_load_n(&s->ht[0], __ATOMIC_RELAXED);
    uint64_t size = __atomic_load_n(&s->size[0], __ATOMIC_RELAXED);
    if (b && size)
        __builtin_prefetch(&b[h & (size - 1)], 0, 3);
}

/* ---- spill mode: the data file's side (see table.h) */

void kvt_set_spill(struct kv_table *t, const struct kvt_spill *sp)
{
    t->sp = *sp;
}

void kvt_disk_keys_add(struct kv_table *t, int64_t d)
{
    atomic_fetch_add_explicit(&t->disk_keys, d, memory_order_relaxed);
}

void kvt_disk_keys_set(struct kv_table *t, int64_t v)
{
    atomic_store_explicit(&t->disk_keys, v, memory_order_relaxed);
}

void kvt_set_spill_stuck(struct kv_table *t, int stuck)
{
    atomic_store_explicit(&t->spill_stuck, stuck, memory_order_relaxed);
}

int kvt_spill_stuck(struct kv_table *t)
{
    return atomic_load_explicit(&t->spill_stuck, memory_order_relaxed);
}

struct kvt_dnode *kvt_dnode_of(struct ldu_node *n)
{
    return (struct kvt_dnode *)((char *)ldu_obj_of(n) - offsetof(struct kvt_dnode, lo));
}

const unsigned char *kvt_dnode_key(const struct kvt_dnode *d, uint32_t *klen)
{
    *klen = d->klen;
    return d->key;
}

uint32_t *kvt_dnode_sweep(struct kvt_dnode *d) { return &d->sweep; }

int kvt_snapshot(struct kv_table *t, struct kvt_dnode *d, uint64_t durable, struct kvbuf *val,
                 struct kvt_snap *out)
{
    struct shard *s = shard_of(t, d->hash);
    pthread_mutex_lock(&s->lock);
    struct kvt_entry *e = d->e;
    /* Claim both marks now: whatever was logged so far is covered by this
     * snapshot; a mark set after this means a newer change (kvt_flushed). */
    ldu_claim(&d->lo.node[LDU_INSERT]);
    ldu_claim(&d->lo.node[LDU_REMOVE]);
    int rc = 0;
    memset(out, 0, sizeof *out);
    if (!e) {
        /* Orphan: its key was removed while known not to be in its block (an
         * absorbed insert) or by FLUSHALL (the block generation changed): nothing to write. */
        out->kind = KVT_SNAP_NONE;
    } else if (e->lsn > durable) {
        /* Not yet durable in the log: the file never gets a change the log could
         * still lose (write-ahead), so the key waits for a later sweep. */
        out->kind = KVT_SNAP_SKIP;
        out->lsn = e->lsn;
        out->first_lsn = d->first_lsn;
    } else {
        out->lsn = e->lsn;
        if ((e->flags & E_TOMB) || (e->expire_ms && e->expire_ms <= now_ms())) {
            out->kind = KVT_SNAP_DELETE;
        } else {
            out->kind = KVT_SNAP_VALUE;
            out->expire = e->expire_ms;
            out->vlen = e->vlen;
            rc = kvbuf_append(val, entry_val(e), e->vlen);
        }
        d->inflight = !rc;
    }
    if (out->kind != KVT_SNAP_SKIP)
        out->first_lsn = 0;
    pthread_mutex_unlock(&s->lock);
    return rc ? -ENOMEM : 0;
}

void kvt_written(struct kv_table *t, struct kvt_dnode *d, const struct kvt_snap *snap, int was_in_block)
{
    struct shard *s = shard_of(t, d->hash);
    pthread_mutex_lock(&s->lock);
    struct kvt_entry *e = d->e;
    int in_block = snap->kind == KVT_SNAP_VALUE;
    /* The block now holds exactly the snapshot: the entry's share of the count
     * and the file's count move together, so DBSIZE never counts a key twice. */
    atomic_fetch_add_explicit(&t->count_seq, 1, memory_order_acq_rel); /* odd: moving */
    if (e) {
        kd_add(s, -contrib(e));
        e->flags = (e->flags & ~E_OD_MASK) | (in_block ? OD_YES : OD_NO);
        kd_add(s, contrib(e));
    }
    atomic_fetch_add_explicit(&t->disk_keys, in_block - was_in_block, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->count_seq, 1, memory_order_release); /* even: done */
    pthread_mutex_unlock(&s->lock);
}

void kvt_flushed(struct kv_table *t, struct kvt_dnode *d, struct ldu_node **held, int nheld,
                 const struct kvt_snap *snap, int written, uint64_t durable, struct ldu_queue *q)
{
    struct shard *s = shard_of(t, d->hash);
    pthread_mutex_lock(&s->lock);
    struct kvt_entry *e = d->e;
    d->inflight = 0;
    int marked = atomic_load_explicit(&d->lo.node[0].mark, memory_order_relaxed) ||
                 atomic_load_explicit(&d->lo.node[1].mark, memory_order_relaxed);
    /* Clean: the block holds the entry's current state, and that state is
     * durable in the log (a value ahead of the log must stay dirty: evicted and
     * loaded back it could be read, then lost with the log tail in a crash). */
    int clean = e && written && !marked && e->lsn == snap->lsn && snap->lsn <= durable;
    if (e && written && !clean)
        d->first_lsn = snap->lsn + 1; /* the block holds everything up to the snapshot */
    if (e && !clean && nheld > 0) {
        if (t->sp.queue_lock)
            pthread_mutex_lock(t->sp.queue_lock);
        ldu_defer(q, held[0]); /* its used bit stays ours: pushed exactly once */
        if (t->sp.queue_lock)
            pthread_mutex_unlock(t->sp.queue_lock);
        held++;
        nheld--;
    }
    /* Producers only run under this lock, so no reuse can race these releases. */
    for (int i = 0; i < nheld; i++)
        ldu_release(&d->lo, held[i]);
    if (!atomic_load_explicit(&d->lo.used, memory_order_relaxed) && (!e || clean)) {
        if (e)
            e->dn = NULL;
        dnode_free(t, d);
    }
    pthread_mutex_unlock(&s->lock);
}

uint64_t kvt_evict(struct kv_table *t, uint64_t target, uint64_t *evicted)
{
    uint64_t freed = 0, n = 0, total = 0, visited = 0;
    for (int i = 0; i < KVT_SHARDS; i++) /* a racy count: only bounds the loop */
        total += __atomic_load_n(&t->shards[i].size[0], __ATOMIC_RELAXED);
    /* Two full turns of the clock at most: the first may only clear reference bits. */
    while (visited <= 2 * total + KVT_SHARDS && kvt_used_memory(t) > target) {
        struct shard *s = &t->shards[t->clock_shard];
        t->clock_shard = (t->clock_shard + 1) % KVT_SHARDS;
        pthread_mutex_lock(&s->lock);
        if (s->rehashidx >= 0)
            do_rehash_step(t, s, 64); /* evict from ht[0] only: finish migrating first */
        uint64_t buckets = s->rehashidx >= 0 ? 0 : s->size[0];
        /* a slice of the shard per visit, so the lock is held briefly */
        for (uint64_t v = 0; v < buckets && v < 4096 && kvt_used_memory(t) > target; v++) {
            struct kvt_entry **ref = &s->ht[0][s->clock & (s->size[0] - 1)];
            while (*ref) {
                struct kvt_entry *e = *ref;
                unsigned od = e->flags & E_OD_MASK;
                int evictable = !e->dn && ((e->flags & E_TOMB) ? od == OD_NO : od == OD_YES);
                if (evictable && !(e->flags & E_REF)) {
                    freed += malloc_usable_size(e);
                    n++;
                    do_unlink(t, s, ref);
                } else {
                    e->flags &= ~E_REF;
                    ref = &e->next;
                }
            }
            s->clock++;
            visited++;
        }
        visited++; /* a shard visited, even with no buckets (the loop ends) */
        pthread_mutex_unlock(&s->lock);
    }
    if (evicted)
        *evicted += n;
    return freed;
}

int kvt_load(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen, int found,
             int64_t expire_ms, int (*still_valid)(void *arg), void *arg)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    int rc = 0;
    if (do_find(s, h, key, klen)) {
        rc = 0; /* written (or loaded) meanwhile: memory is newer than the block */
    } else if (!still_valid(arg)) {
        rc = -EAGAIN; /* the block changed after it was read */
    } else {
        /* A clean copy of the block's record, or a clean tombstone saying the key
         * is not there (so the next miss does not read the block again). Charged
         * without the bound: the evictor takes it back under pressure. */
        if (found && expire_ms && expire_ms <= now_ms())
            found = 0;
        struct kvt_entry *e = entry_new_b(t, h, key, klen, found ? val : NULL, found ? vlen : 0, 0, 0);
        if (!e) {
            rc = -ENOMEM;
        } else {
            e->flags = E_REF | (found ? OD_YES : (E_TOMB | OD_NO));
            e->expire_ms = found ? expire_ms : 0;
            do_insert(t, s, e);
            rc = 1;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int kvt_load_sync(struct kv_table *t, const void *key, size_t klen)
{
    return t->sp.load_sync ? t->sp.load_sync(t->sp.arg, key, klen) : 0;
}

int kvt_wait_memory(struct kv_table *t)
{
    if (!t->sp.queue || !t->sp.make_room || kvt_spill_stuck(t))
        return -ENOMEM;
    return t->sp.make_room(t->sp.arg);
}

void kvt_barrier(struct kv_table *t)
{
    for (int i = 0; i < KVT_SHARDS; i++) {
        pthread_mutex_lock(&t->shards[i].lock);
        pthread_mutex_unlock(&t->shards[i].lock);
    }
}
