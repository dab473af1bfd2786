/* table_int.h - the table's internal structures and the helpers its files share:
 * table.c (the public operations), table_shard.c (one shard's chains and
 * rehash, caller holds the shard lock) and table_spill.c (spill mode: the data
 * file's side). Not a public interface: only those files (and the white-box
 * tests/c/table_stress.c) include it. Locking rules are in table.c's header. */
#ifndef KV_TABLE_INT_H
#define KV_TABLE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/ldu.h"
#include "core/table.h"

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
#define E_HASH 16u           /* the value is an encoded hash (KVT_HASH), else a string */
#define E_STREAM 32u         /* the value is a struct xstream * (KVT_STREAM), which the entry owns */
#define E_TYPED (E_HASH | E_STREAM) /* not a string */

static inline int entry_type(const struct kvt_entry *e)
{
    return (e->flags & E_HASH) ? KVT_HASH : (e->flags & E_STREAM) ? KVT_STREAM : KVT_STRING;
}
/* A string or a hash (a stream entry is made by table_stream.c, whose value is
 * the pointer). */
static inline void entry_set_type(struct kvt_entry *e, int type)
{
    e->flags = (e->flags & ~E_TYPED) | (type == KVT_HASH ? E_HASH : 0);
}

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
    uint64_t wseq;           /* writes counted without a logger (the versions kvt_do_log gives) */
} __attribute__((aligned(64)));

struct kv_table {
    struct shard shards[KVT_SHARDS];
    /* The only state shared by all writers: a reservation counter. A writer adds
     * its allocation first and backs out if that passed the bound, so concurrent
     * writers can never jointly overshoot max_memory. */
    _Atomic uint64_t used_memory __attribute__((aligned(64)));
    _Atomic uint64_t max_memory;
    _Atomic uint64_t oom_rejections;
    _Atomic uint64_t batches_evicted, batches_loaded; /* stream batches (table_spill.c) */
    int lazy_batches;        /* kvt_set_lazy_batches */
    kvt_log_fn log;          /* set before the table is shared, never changed while in use */
    void *log_arg;
    struct kvt_spill sp;     /* spill mode when sp.queue != NULL; set before use, like log */
    _Atomic int64_t disk_keys; /* keys in the data file (the flusher keeps it) */
    _Atomic uint64_t count_seq; /* seqlock, odd while the flusher moves a key's count between
                                   a shard's kdelta and disk_keys (kvt_written) */
    _Atomic int spill_stuck; /* nothing left to evict: writes get -ENOMEM instead of waiting */
    unsigned clock_shard;    /* evictor's position (evictor thread only) */
    void (*gone)(void *arg, const void *key, size_t klen); /* kvt_set_gone_hook */
    void *gone_arg;
    kvt_batch_fn batch;      /* kvt_set_batch_hook */
    void *batch_arg;
};

/* Shard locks. A thread inside kvt_tx_begin/kvt_tx_end holds every shard
 * lock already: its operations skip taking them. */
static inline void shard_lock(struct shard *s)
{
    if (!kvt_tx_held)
        pthread_mutex_lock(&s->lock);
}

static inline void shard_unlock(struct shard *s)
{
    if (!kvt_tx_held)
        pthread_mutex_unlock(&s->lock);
}

/* Every shard lock, in shard order (the only order any thread takes more than
 * one in): a transaction's, and FLUSHALL's around its record. */
static inline void lock_all(struct kv_table *t)
{
    for (int i = 0; i < KVT_SHARDS; i++)
        pthread_mutex_lock(&t->shards[i].lock);
}

static inline void unlock_all(struct kv_table *t)
{
    for (int i = KVT_SHARDS - 1; i >= 0; i--)
        pthread_mutex_unlock(&t->shards[i].lock);
}

/* Log a mutation of a key in shard s (caller holds its lock; NULL for
 * FLUSHALL; in table.c). Returns the LSN, or -errno. Without a logger it
 * returns the shard's next write number instead (0 for FLUSHALL): entries then
 * still carry a version that changes on every write (kvt_version). */
int64_t kvt_do_log(struct kv_table *t, struct shard *s, int op, const void *key, size_t klen, const void *v1,
                   size_t n1, const void *v2, size_t n2, int64_t expire);

/* ---- memory accounting and counters */

/* Add n bytes to the count; bounded: refused (-ENOMEM, nothing added) if that
 * passes max_memory. In table_shard.c. */
int kvt_mem_charge(struct kv_table *t, size_t n, int bounded);

static inline void mem_uncharge(struct kv_table *t, size_t n)
{
    atomic_fetch_sub_explicit(&t->used_memory, n, memory_order_relaxed);
}

static inline void cnt_add(_Atomic uint64_t *c, int64_t d)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
                          memory_order_relaxed);
}

/* kvt_now_ms: the wall clock plus the tests' offset, read from clock id. */
extern _Atomic int64_t kvt_clock_offset;
static inline int64_t wall_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 +
           atomic_load_explicit(&kvt_clock_offset, memory_order_relaxed);
}

static inline int64_t now_ms(void) { return wall_ms(CLOCK_REALTIME); }

/* The same at the kernel tick's resolution (1-4 ms), a quarter of the cost: for
 * ages measured in tens of milliseconds (a stream batch's seal age). */
static inline int64_t now_coarse_ms(void) { return wall_ms(CLOCK_REALTIME_COARSE); }

static inline char *entry_val(struct kvt_entry *e) { return (char *)e->data + e->klen; }

/* ---- stream entries (table_stream.c): the value is the stream's pointer */

struct xstream;
static inline struct xstream *entry_stream(struct kvt_entry *e)
{
    struct xstream *x;
    memcpy(&x, entry_val(e), sizeof x);
    return x;
}
/* The key's state as kvt_apply's and kvt_xapply's functions see it (e NULL: absent). */
static inline struct kvt_state entry_state(struct kvt_entry *e)
{
    if (!e)
        return (struct kvt_state){0};
    if (e->flags & E_STREAM)
        return (struct kvt_state){1, KVT_STREAM, NULL, 0, e->expire_ms, entry_stream(e)};
    return (struct kvt_state){1, entry_type(e), entry_val(e), e->vlen, e->expire_ms, NULL};
}
/* Free e's stream (if it holds one) and give back its memory: the entry is
 * then an empty string (it is being freed, overwritten or made a tombstone). */
void kvt_entry_drop_stream(struct kv_table *t, struct kvt_entry *e);
/* Store a stream under the key whose lookup gave ref/st: keep (non-NULL: the
 * live stream entry *ref keeps its stream, only expire changes; logged as an
 * XOP with no delta) or the stream decoded from bytes [val, val + n) (logged as
 * KVT_LOG_SET | KVT_LOG_STREAM). Returns 0 or -errno (-EBADMSG: bad bytes). */
int kvt_do_store_stream(struct kv_table *t, struct shard *s, uint64_t h, struct kvt_entry **ref, int st,
                        const void *key, size_t klen, int keep, const void *val, size_t n, int64_t expire,
                        int bounded);
/* The memory a stream's entry holds beyond the entry itself. */
uint64_t kvt_stream_mem(struct kvt_entry *e);
/* ---- spill mode: the key count and the dirty queue */

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

/* ---- shard internals (caller holds s->lock), in table_shard.c */

/* ht[0]/size[0] are also read without the lock by kvt_prefetch, which only feeds
 * the values to prefetch instructions (never dereferences them). Writers use
 * relaxed atomic stores so those reads are not data races; plain reads under the
 * lock stay plain. */
static inline void set_ht0(struct shard *s, struct kvt_entry **b, uint64_t size)
{
    __atomic_store_n(&s->ht[0], b, __ATOMIC_RELAXED);
    __atomic_store_n(&s->size[0], size, __ATOMIC_RELAXED);
}

static inline struct shard *shard_of(struct kv_table *t, uint64_t h)
{
    return &t->shards[h >> 56]; /* top bits pick the shard, low bits the bucket */
}

enum { LK_LIVE, LK_ABSENT, LK_NOTRES };

/* Each documented at its definition. */
struct kvt_entry *kvt_entry_new_b(struct kv_table *t, uint64_t h, const void *key, size_t klen,
                              const void *val, size_t vlen, size_t extra, int bounded);
void kvt_entry_free(struct kv_table *t, struct kvt_entry *e);
struct kvt_entry **kvt_buckets_new(struct kv_table *t, uint64_t n);
void kvt_buckets_free(struct kv_table *t, struct kvt_entry **b);
void kvt_do_rehash_step(struct kv_table *t, struct shard *s, int n);
void kvt_do_resize(struct kv_table *t, struct shard *s, uint64_t n);
struct kvt_entry **kvt_do_find(struct shard *s, uint64_t h, const void *key, size_t klen);
void kvt_do_unlink(struct kv_table *t, struct shard *s, struct kvt_entry **ref);
int kvt_do_remove(struct kv_table *t, struct shard *s, struct kvt_entry **ref, uint64_t lsn);
struct kvt_entry **kvt_do_lookup(struct kv_table *t, struct shard *s, uint64_t h, const void *key,
                             size_t klen, int *st);
void kvt_do_insert(struct kv_table *t, struct shard *s, struct kvt_entry *e);
void kvt_do_replace(struct kv_table *t, struct shard *s, struct kvt_entry **ref, struct kvt_entry *ne);
/* Lock the key's shard (and move its rehash on by a step): on every operation,
 * so inline. */
static inline struct shard *kvt_lock_shard(struct kv_table *t, uint64_t h)
{
    struct shard *s = shard_of(t, h);
    shard_lock(s);
    if (s->rehashidx >= 0)
        kvt_do_rehash_step(t, s, REHASH_STEP);
    return s;
}

/* kvt_do_lookup for readers: the live entry or NULL; *st as kvt_do_lookup. */
static inline struct kvt_entry *do_live(struct kv_table *t, struct shard *s, uint64_t h, const void *key,
                                        size_t klen, int *st)
{
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, st);
    return *st == LK_LIVE ? *ref : NULL;
}

/* Store v1+v2 (of type) under a key whose lookup gave ref/st (INCR, APPEND,
 * kvt_apply): in place when it fits the slot (a live entry or a tombstone),
 * else in a new entry with `extra` spare bytes (charged against the bound if
 * bounded). v1 may be the slot's own value. Returns 0 or -errno. In table.c. */
int kvt_do_store(struct kv_table *t, struct shard *s, uint64_t h, struct kvt_entry **ref, int st,
                 const void *key, size_t klen, const void *v1, size_t n1, const void *v2, size_t n2,
                 int64_t expire, size_t extra, int type, int bounded);
/* Delete the live entry *ref: log it, then remove it. 1, or -errno. In table.c. */
int kvt_del_live(struct kv_table *t, struct shard *s, struct kvt_entry **ref, const void *key, size_t klen);

/* ---- spill mode: dirty nodes, in table_spill.c (caller holds the shard lock) */

int kvt_prep_dn(struct kv_table *t, struct kvt_entry *ne, struct kvt_entry *slot);
void kvt_dnode_free(struct kv_table *t, struct kvt_dnode *d);
void kvt_dn_detach(struct kv_table *t, struct kvt_entry *e);

/* Bring the table's count of stream x's memory up to date (never refused: the
 * bound was checked before the change, or the memory is the evictor's to take). */
struct xstream;
void kvt_sync_charge(struct kv_table *t, struct xstream *x);

#endif
