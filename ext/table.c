/* table.c - sharded, incrementally rehashed, memory-bounded hash table.
 * Invariants: every entry and bucket array is charged to used_memory with its
 * malloc_usable_size at allocation and uncharged at free; a shard's fields are
 * only touched with its mutex held, except the _Atomic counters that INFO reads.
 * Lock order: one shard lock at a time, never nested. Keys and values come from
 * the network (untrusted): lengths are bounded by KVT_MAX_VALUE. */
#define _GNU_SOURCE
#include "table.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define INITIAL_BUCKETS 4
#define REHASH_STEP 1        /* buckets migrated per table operation */
#define MAX_EMPTY_VISITS 10  /* per migrated bucket, as Redis's dictRehash does */

struct kvt_entry {
    struct kvt_entry *next;
    uint64_t hash;
    uint64_t lsn;            /* log record that wrote this value, 0 = none */
    int64_t expire_ms;       /* unix ms, 0 = none */
    uint32_t klen, vlen;
    uint32_t cap;            /* bytes usable in data[] */
    unsigned char data[];    /* key bytes, then value bytes */
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

/* ---- hashing: SipHash-1-3, keyed per process so clients cannot pick colliding keys */

static uint64_t sip_k0, sip_k1;
static pthread_once_t sip_once = PTHREAD_ONCE_INIT;

static void sip_init(void)
{
    uint64_t k[2];
    if (getrandom(k, sizeof k, 0) != sizeof k) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        k[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec;
        k[1] = (uint64_t)(uintptr_t)&k ^ 0xc2b2ae3d27d4eb4fULL;
    }
    sip_k0 = k[0];
    sip_k1 = k[1];
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                           \
    do {                                                                   \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);          \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                             \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                             \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);          \
    } while (0)

uint64_t kvt_hash(const void *key, size_t len)
{
    pthread_once(&sip_once, sip_init);
    const unsigned char *in = key;
    uint64_t v0 = 0x736f6d6570736575ULL ^ sip_k0, v1 = 0x646f72616e646f6dULL ^ sip_k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ sip_k0, v3 = 0x7465646279746573ULL ^ sip_k1;
    uint64_t b = (uint64_t)len << 56, m;
    const unsigned char *end = in + (len & ~(size_t)7);
    for (; in != end; in += 8) {
        memcpy(&m, in, 8); /* little-endian hosts only (x86-64, arm64) */
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    switch (len & 7) {
    case 7: b |= (uint64_t)in[6] << 48; /* fall through */
    case 6: b |= (uint64_t)in[5] << 40; /* fall through */
    case 5: b |= (uint64_t)in[4] << 32; /* fall through */
    case 4: b |= (uint64_t)in[3] << 24; /* fall through */
    case 3: b |= (uint64_t)in[2] << 16; /* fall through */
    case 2: b |= (uint64_t)in[1] << 8;  /* fall through */
    case 1: b |= (uint64_t)in[0];
    }
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
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
    entry_free(t, e);
}

/* Like do_find, but an entry whose time has passed is removed and not returned. */
static struct kvt_entry **do_find_live(struct kv_table *t, struct shard *s, uint64_t h,
                                       const void *key, size_t klen)
{
    struct kvt_entry **ref = do_find(s, h, key, klen);
    if (ref && (*ref)->expire_ms && (*ref)->expire_ms <= now_ms()) {
        do_unlink(t, s, ref);
        cnt_add(&s->expired, 1);
        return NULL;
    }
    return ref;
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
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    if (ref) {
        cnt_add(&s->hits, 1);
        touch((*ref)->lsn);
        if (fn)
            fn(arg, entry_val(*ref), (*ref)->vlen);
    } else {
        cnt_add(&s->misses, 1);
        touch(s->del_lsn);
    }
    pthread_mutex_unlock(&s->lock);
    return ref != NULL;
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
    kvt_get(t, key, klen, copy_out, &c);
    return c.len;
}

int kvt_set(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen,
            int flags, int64_t expire_ms, kvt_read_fn old_fn, void *old_arg)
{
    if (klen > KVT_MAX_VALUE || vlen > KVT_MAX_VALUE)
        return -E2BIG;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    struct kvt_entry *e = ref ? *ref : NULL;
    int rc = 1;
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
    if (e && need <= e->cap && e->cap <= 2 * need + 64) {
        int64_t lsn = do_log(t, 1, key, klen, val, vlen, NULL, 0, expire_ms);
        if (lsn < 0) {
            rc = (int)lsn;
            goto out;
        }
        memcpy(entry_val(e), val, vlen);
        e->vlen = (uint32_t)vlen;
        e->lsn = (uint64_t)lsn;
        cnt_add(&s->expires, (expire_ms != 0) - (e->expire_ms != 0));
        e->expire_ms = expire_ms;
        goto out;
    }
    struct kvt_entry *ne = entry_new_b(t, h, key, klen, val, vlen, 0, !(flags & KVT_NOBOUND));
    if (!ne) {
        rc = -ENOMEM;
        goto out;
    }
    int64_t lsn = do_log(t, 1, key, klen, val, vlen, NULL, 0, expire_ms);
    if (lsn < 0) {
        entry_free(t, ne);
        rc = (int)lsn;
        goto out;
    }
    ne->lsn = (uint64_t)lsn;
    ne->expire_ms = expire_ms;
    if (e)
        do_replace(t, s, ref, ne);
    else
        do_insert(t, s, ne);
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int kvt_del(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    int rc = ref != NULL;
    if (ref) {
        int64_t lsn = do_log(t, 2, key, klen, NULL, 0, NULL, 0, 0);
        if (lsn < 0) {
            rc = (int)lsn;
        } else {
            do_unlink(t, s, ref);
            if ((uint64_t)lsn > s->del_lsn)
                s->del_lsn = (uint64_t)lsn;
        }
    } else {
        touch(s->del_lsn); /* "0 deleted" may rest on an earlier delete */
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int kvt_exists(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    int found = ref != NULL;
    touch(ref ? (*ref)->lsn : s->del_lsn);
    pthread_mutex_unlock(&s->lock);
    return found;
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

int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    struct kvt_entry *e = ref ? *ref : NULL;
    int64_t cur = 0;
    int rc = 0;
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
    if (e && klen + (size_t)n <= e->cap) {
        int64_t lsn = do_log(t, 1, key, klen, num, (size_t)n, NULL, 0, e->expire_ms);
        if (lsn < 0) {
            rc = (int)lsn;
            goto out;
        }
        memcpy(entry_val(e), num, (size_t)n);
        e->vlen = (uint32_t)n;
        e->lsn = (uint64_t)lsn;
    } else {
        struct kvt_entry *ne = entry_new(t, h, key, klen, num, (size_t)n, 0);
        if (!ne) {
            rc = -ENOMEM;
            goto out;
        }
        int64_t lsn = do_log(t, 1, key, klen, num, (size_t)n, NULL, 0, e ? e->expire_ms : 0);
        if (lsn < 0) {
            entry_free(t, ne);
            rc = (int)lsn;
            goto out;
        }
        ne->lsn = (uint64_t)lsn;
        if (e) {
            ne->expire_ms = e->expire_ms; /* INCR keeps the TTL, as in Redis */
            do_replace(t, s, ref, ne);
        } else {
            do_insert(t, s, ne);
        }
    }
    *result = cur;
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    struct kvt_entry *e = ref ? *ref : NULL;
    size_t oldlen = e ? e->vlen : 0;
    int64_t rc;
    touch(e ? e->lsn : s->del_lsn);
    if (oldlen + vlen > KVT_MAX_VALUE) {
        rc = -E2BIG;
        goto out;
    }
    if (e && klen + oldlen + vlen <= e->cap) {
        int64_t lsn = do_log(t, 1, key, klen, entry_val(e), oldlen, val, vlen, e->expire_ms);
        if (lsn < 0) {
            rc = lsn;
            goto out;
        }
        memcpy(entry_val(e) + oldlen, val, vlen);
        e->vlen = (uint32_t)(oldlen + vlen);
        e->lsn = (uint64_t)lsn;
    } else if (e) {
        /* Grow with room to spare so repeated APPENDs are amortized O(1). */
        size_t extra = oldlen + vlen < 1024 * 1024 ? oldlen + vlen : 1024 * 1024;
        struct kvt_entry *ne = entry_new(t, h, key, klen, entry_val(e), oldlen, vlen + extra);
        if (!ne) {
            rc = -ENOMEM;
            goto out;
        }
        int64_t lsn = do_log(t, 1, key, klen, entry_val(e), oldlen, val, vlen, e->expire_ms);
        if (lsn < 0) {
            entry_free(t, ne);
            rc = lsn;
            goto out;
        }
        memcpy(entry_val(ne) + oldlen, val, vlen);
        ne->vlen = (uint32_t)(oldlen + vlen);
        ne->expire_ms = e->expire_ms;
        ne->lsn = (uint64_t)lsn;
        do_replace(t, s, ref, ne);
    } else {
        struct kvt_entry *ne = entry_new(t, h, key, klen, val, vlen, 0);
        if (!ne) {
            rc = -ENOMEM;
            goto out;
        }
        int64_t lsn = do_log(t, 1, key, klen, val, vlen, NULL, 0, 0);
        if (lsn < 0) {
            entry_free(t, ne);
            rc = lsn;
            goto out;
        }
        ne->lsn = (uint64_t)lsn;
        do_insert(t, s, ne);
    }
    rc = (int64_t)(oldlen + vlen);
out:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = lock_shard(t, h);
    struct kvt_entry **ref = do_find_live(t, s, h, key, klen);
    int64_t n = ref ? (*ref)->vlen : 0;
    touch(ref ? (*ref)->lsn : s->del_lsn);
    pthread_mutex_unlock(&s->lock);
    return n;
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

int kvt_flush(struct kv_table *t)
{
    if (!t->log) {
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
    int64_t f = do_log(t, 3, NULL, 0, NULL, 0, NULL, 0, 0);
    if (f < 0)
        return (int)f;
    for (int i = 0; i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        pthread_mutex_lock(&s->lock);
        do_clear_before(t, s, (uint64_t)f);
        if ((uint64_t)f > s->del_lsn)
            s->del_lsn = (uint64_t)f;
        pthread_mutex_unlock(&s->lock);
    }
    return 0;
}

uint64_t kvt_count(struct kv_table *t)
{
    uint64_t n = 0;
    for (int i = 0; i < KVT_SHARDS; i++)
        n += atomic_load_explicit(&t->shards[i].used, memory_order_relaxed);
    return n;
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
        st->keys += atomic_load_explicit(&s->used, memory_order_relaxed);
        st->expires += atomic_load_explicit(&s->expires, memory_order_relaxed);
        st->hits += atomic_load_explicit(&s->hits, memory_order_relaxed);
        st->misses += atomic_load_explicit(&s->misses, memory_order_relaxed);
        st->expired_keys += atomic_load_explicit(&s->expired, memory_order_relaxed);
        pthread_mutex_lock(&s->lock);
        st->buckets += s->size[0] + s->size[1];
        st->rehashing += s->rehashidx >= 0;
        pthread_mutex_unlock(&s->lock);
    }
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
                    if ((*ref)->expire_ms && (*ref)->expire_ms <= now) {
                        do_unlink(t, s, ref);
                        cnt_add(&s->expired, 1);
                        reclaimed++;
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
