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
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ldu.h"
#include "core/table_int.h"

#define HOUSEKEEP_EXTRA_US 25000  /* per call, every 100 ms: a quarter of a thread, as Redis's cycle */
#define HOUSEKEEP_REHASH_STEP 1024  /* buckets migrated per shard and call */

__thread uint64_t kvt_touched_lsn __attribute__((tls_model("initial-exec")));
__thread int kvt_tx_held __attribute__((tls_model("initial-exec")));
__thread unsigned kvt_tx_changes;
_Atomic int64_t kvt_clock_offset;

int64_t kvt_now_ms(void) { return now_ms(); }

void kvt_set_clock_offset(int64_t ms) { atomic_store_explicit(&kvt_clock_offset, ms, memory_order_relaxed); }


void kvt_set_log(struct kv_table *t, kvt_log_fn fn, void *arg)
{
    t->log = fn;
    t->log_arg = arg;
}

int64_t kvt_do_log(struct kv_table *t, struct shard *s, int op, const void *key, size_t klen, const void *v1,
                   size_t n1, const void *v2, size_t n2, int64_t expire)
{
    kvt_tx_changes += kvt_tx_held;
    if (!t->log)
        return s ? (int64_t)++s->wseq : 0;
    int64_t lsn = t->log(t->log_arg, op, key, klen, v1, n1, v2, n2, expire);
    if (lsn > 0)
        kvt_lsn_touch((uint64_t)lsn);
    return lsn;
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
        struct kvt_entry **b = kvt_buckets_new(t, INITIAL_BUCKETS);
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
                kvt_dn_detach(t, e);
                kvt_entry_free(t, e);
                e = next;
            }
        }
        kvt_buckets_free(t, s->ht[i]);
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
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    int rc = st == LK_NOTRES ? -ENODATA : e != NULL;
    if (e) {
        cnt_add(&s->hits, 1);
        kvt_lsn_touch(e->lsn);
        if (e->flags & E_TYPED)
            rc = KVT_WRONGTYPE;
        else if (fn)
            fn(arg, entry_val(e), e->vlen);
    } else if (st == LK_ABSENT) {
        cnt_add(&s->misses, 1);
        kvt_lsn_touch(s->del_lsn);
    }
    shard_unlock(s);
    return rc;
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
    struct shard *s = kvt_lock_shard(t, h);
    int st, rc = 1;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    if (st == LK_NOTRES && (old_fn || (flags & (KVT_NX | KVT_XX | KVT_KEEPTTL)))) {
        rc = -ENODATA; /* the answer depends on the block: load it first */
        goto out;
    }
    struct kvt_entry *slot = ref ? *ref : NULL;       /* live entry or tombstone */
    struct kvt_entry *e = st == LK_LIVE ? slot : NULL; /* live entry */
    int type = (flags & KVT_TYPE_HASH) ? KVT_HASH : KVT_STRING;
    int op = KVT_LOG_SET | (type == KVT_HASH ? KVT_LOG_HASH : 0);
    if (old_fn && e) {
        kvt_lsn_touch(e->lsn);
        if (e->flags & E_TYPED) { /* SET ... GET on a hash or a stream: nothing changes */
            rc = KVT_WRONGTYPE;
            goto out;
        }
        old_fn(old_arg, entry_val(e), e->vlen);
    }
    if (!e)
        kvt_lsn_touch(s->del_lsn); /* a reply that shows the key absent depends on its deletion */
    if (((flags & KVT_NX) && e) || ((flags & KVT_XX) && !e)) {
        if (e)
            kvt_lsn_touch(e->lsn); /* the reply reveals that the key exists */
        rc = 0;
        goto out;
    }
    if (e && (flags & KVT_KEEPTTL))
        expire_ms = e->expire_ms;
    if (flags & KVT_TYPE_STREAM) { /* a stream's bytes (log replay) */
        rc = kvt_do_store_stream(t, s, h, ref, st, key, klen, 0, val, vlen, expire_ms, !(flags & KVT_NOBOUND));
        rc = rc < 0 ? rc : 1;
        goto out;
    }
    size_t need = klen + vlen;
    /* Overwrite in place when the value fits and would not waste over half the block. */
    if (slot && need <= slot->cap && slot->cap <= 2 * need + 64) {
        if (kvt_prep_dn(t, slot, NULL)) {
            rc = -ENOMEM;
            goto out;
        }
        int64_t lsn = kvt_do_log(t, s, op, key, klen, val, vlen, NULL, 0, expire_ms);
        if (lsn < 0) {
            rc = (int)lsn;
            goto out;
        }
        kvt_entry_drop_stream(t, slot); /* a stream overwritten by SET */
        kd_add(s, -contrib(slot));
        slot->flags &= ~E_TOMB;
        entry_set_type(slot, type);
        kd_add(s, contrib(slot));
        memcpy(entry_val(slot), val, vlen);
        slot->vlen = (uint32_t)vlen;
        slot->lsn = (uint64_t)lsn;
        cnt_add(&s->expires, (expire_ms != 0) - (slot->expire_ms != 0));
        slot->expire_ms = expire_ms;
        mark_dirty(t, slot, LDU_INSERT);
        goto out;
    }
    struct kvt_entry *ne = kvt_entry_new_b(t, h, key, klen, val, vlen, 0, !(flags & KVT_NOBOUND));
    if (!ne) {
        rc = -ENOMEM;
        goto out;
    }
    ne->flags = slot ? slot->flags & E_OD_MASK : st == LK_NOTRES ? OD_UNK : OD_NO;
    entry_set_type(ne, type);
    if (kvt_prep_dn(t, ne, slot)) {
        kvt_entry_free(t, ne);
        rc = -ENOMEM;
        goto out;
    }
    int64_t lsn = kvt_do_log(t, s, op, key, klen, val, vlen, NULL, 0, expire_ms);
    if (lsn < 0) {
        if (ne->dn)
            kvt_dnode_free(t, ne->dn);
        kvt_entry_free(t, ne);
        rc = (int)lsn;
        goto out;
    }
    ne->lsn = (uint64_t)lsn;
    ne->expire_ms = expire_ms;
    if (slot)
        kvt_do_replace(t, s, ref, ne);
    else
        kvt_do_insert(t, s, ne);
    mark_dirty(t, ne, LDU_INSERT);
out:
    shard_unlock(s);
    return rc;
}

int kvt_del_live(struct kv_table *t, struct shard *s, struct kvt_entry **ref, const void *key, size_t klen)
{
    if (t->sp.queue && kvt_prep_dn(t, *ref, NULL))
        return -ENOMEM; /* the tombstone's node, before anything is logged */
    int64_t lsn = kvt_do_log(t, s, KVT_LOG_DEL, key, klen, NULL, 0, NULL, 0, 0);
    if (lsn < 0)
        return (int)lsn;
    kvt_do_remove(t, s, ref, (uint64_t)lsn); /* cannot fail now: the node exists */
    if ((uint64_t)lsn > s->del_lsn)
        s->del_lsn = (uint64_t)lsn;
    return 1;
}

int kvt_del(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st, rc = 0;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    if (st == LK_LIVE)
        rc = kvt_del_live(t, s, ref, key, klen);
    else if (st == LK_NOTRES)
        rc = -ENODATA;
    else
        kvt_lsn_touch(s->del_lsn); /* "0 deleted" may rest on an earlier delete */
    shard_unlock(s);
    return rc;
}

int kvt_del_blind(struct kv_table *t, const void *key, size_t klen)
{
    if (klen > KVT_MAX_VALUE)
        return -E2BIG;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st, rc = 0;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    if (st == LK_LIVE) {
        rc = kvt_del_live(t, s, ref, key, klen);
    } else if (st == LK_NOTRES) {
        /* A tombstone of unknown standing: the flusher deletes the key from its
         * block if it is there. Charged without the bound, like replay. */
        struct kvt_entry *ne = kvt_entry_new_b(t, h, key, klen, NULL, 0, 0, 0);
        rc = !ne || kvt_prep_dn(t, ne, NULL) ? -ENOMEM : 0;
        int64_t lsn = rc ? 0 : kvt_do_log(t, s, KVT_LOG_DEL, key, klen, NULL, 0, NULL, 0, 0);
        if (rc || lsn < 0) {
            if (ne && ne->dn)
                kvt_dnode_free(t, ne->dn);
            if (ne)
                kvt_entry_free(t, ne);
            rc = rc ? rc : (int)lsn;
        } else {
            ne->flags = E_TOMB | OD_UNK;
            ne->lsn = (uint64_t)lsn;
            kvt_do_insert(t, s, ne);
            mark_dirty(t, ne, LDU_REMOVE);
            if ((uint64_t)lsn > s->del_lsn)
                s->del_lsn = (uint64_t)lsn;
        }
    }
    shard_unlock(s);
    return rc;
}

int kvt_exists(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    kvt_lsn_touch(e ? e->lsn : s->del_lsn);
    shard_unlock(s);
    return st == LK_NOTRES ? -ENODATA : e != NULL;
}

int64_t kvt_key_memory(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    int64_t n = e ? (int64_t)(malloc_usable_size(e) + sizeof(struct kvt_entry *) + kvt_stream_mem(e)) : 0;
    if (e && e->dn)
        n += (int64_t)malloc_usable_size(e->dn);
    shard_unlock(s);
    return st == LK_NOTRES ? -ENODATA : n;
}
/* Redis's string2ll rules: optional '-', no '+', no leading zeros, no spaces. */
static int parse_ll(const char *p, size_t n, int64_t *out)
{
    if (n == 0 || n > 20)
        return -EINVAL;
    if (n == 1 && p[0] == '0') {
        *out = 0;
        return 0;
    }
    size_t i = 0;
    int neg = 0;
    if (p[0] == '-') {
        neg = 1;
        if (++i == n)
            return -EINVAL;
    }
    if (p[i] < '1' || p[i] > '9')
        return -EINVAL;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -EINVAL;
        if (v > (UINT64_MAX - (uint64_t)(p[i] - '0')) / 10)
            return -EINVAL;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (neg) {
        if (v > (uint64_t)INT64_MAX + 1)
            return -EINVAL;
        *out = (int64_t)(0 - v);
    } else {
        if (v > INT64_MAX)
            return -EINVAL;
        *out = (int64_t)v;
    }
    return 0;
}

int kvt_do_store(struct kv_table *t, struct shard *s, uint64_t h, struct kvt_entry **ref, int st,
                    const void *key, size_t klen, const void *v1, size_t n1, const void *v2, size_t n2,
                    int64_t expire, size_t extra, int type, int bounded)
{
    struct kvt_entry *slot = ref ? *ref : NULL;
    size_t vlen = n1 + n2;
    int op = KVT_LOG_SET | (type == KVT_HASH ? KVT_LOG_HASH : 0);
    if (type == KVT_STREAM) {
        int keep = st == LK_LIVE && (slot->flags & E_STREAM) && !n1 && !n2;
        if (!keep && n2)
            return -EINVAL; /* a stream's bytes come in one piece */
        return kvt_do_store_stream(t, s, h, ref, st, key, klen, keep, v1, n1, expire, bounded);
    }
    if (slot && klen + vlen <= slot->cap) {
        if (kvt_prep_dn(t, slot, NULL))
            return -ENOMEM;
        int64_t lsn = kvt_do_log(t, s, op, key, klen, v1, n1, v2, n2, expire);
        if (lsn < 0)
            return (int)lsn;
        kvt_entry_drop_stream(t, slot); /* a stream overwritten by another type */
        kd_add(s, -contrib(slot));
        slot->flags &= ~E_TOMB;
        entry_set_type(slot, type);
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
    struct kvt_entry *ne = kvt_entry_new_b(t, h, key, klen, v1, n1, n2 + extra, bounded);
    if (!ne)
        return -ENOMEM;
    if (n2)
        memcpy(entry_val(ne) + n1, v2, n2);
    ne->vlen = (uint32_t)vlen;
    ne->flags = slot ? slot->flags & E_OD_MASK : st == LK_NOTRES ? OD_UNK : OD_NO;
    entry_set_type(ne, type);
    if (kvt_prep_dn(t, ne, slot)) {
        kvt_entry_free(t, ne);
        return -ENOMEM;
    }
    int64_t lsn = kvt_do_log(t, s, op, key, klen, v1, n1, v2, n2, expire);
    if (lsn < 0) {
        if (ne->dn)
            kvt_dnode_free(t, ne->dn);
        kvt_entry_free(t, ne);
        return (int)lsn;
    }
    ne->lsn = (uint64_t)lsn;
    ne->expire_ms = expire;
    if (slot)
        kvt_do_replace(t, s, ref, ne);
    else
        kvt_do_insert(t, s, ne);
    mark_dirty(t, ne, LDU_INSERT);
    return 0;
}

int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st, rc = 0;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
    int64_t cur = 0;
    if (st == LK_NOTRES) {
        rc = -ENODATA;
        goto out;
    }
    kvt_lsn_touch(e ? e->lsn : s->del_lsn); /* an error reply reveals the current value too */
    if (e && (e->flags & E_TYPED)) {
        rc = KVT_WRONGTYPE;
        goto out;
    }
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
    rc = kvt_do_store(t, s, h, ref, st, key, klen, num, (size_t)n, NULL, 0, e ? e->expire_ms : 0, 0, KVT_STRING, 1);
    if (!rc)
        *result = cur;
out:
    shard_unlock(s);
    return rc;
}

int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
    size_t oldlen = e ? e->vlen : 0;
    int64_t rc;
    if (st == LK_NOTRES) {
        rc = -ENODATA;
        goto out;
    }
    kvt_lsn_touch(e ? e->lsn : s->del_lsn);
    if (e && (e->flags & E_TYPED)) {
        rc = KVT_WRONGTYPE;
        goto out;
    }
    if (oldlen + vlen > KVT_MAX_VALUE) {
        rc = -E2BIG;
        goto out;
    }
    /* A grown value gets room to spare so repeated APPENDs are amortized O(1). */
    size_t extra = !e ? 0 : oldlen + vlen < 1024 * 1024 ? oldlen + vlen : 1024 * 1024;
    rc = kvt_do_store(t, s, h, ref, st, key, klen, e ? entry_val(e) : NULL, oldlen, val, vlen,
                  e ? e->expire_ms : 0, extra, KVT_STRING, 1);
    if (!rc)
        rc = (int64_t)(oldlen + vlen);
out:
    shard_unlock(s);
    return rc;
}

int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    /* (int64_t): with a uint32_t arm the ?: would turn KVT_WRONGTYPE into 4294967205 */
    int64_t n = !e ? 0 : (e->flags & E_TYPED) ? KVT_WRONGTYPE : (int64_t)e->vlen;
    kvt_lsn_touch(e ? e->lsn : s->del_lsn);
    shard_unlock(s);
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
                    kvt_do_unlink(t, s, ref);
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
    /* Inside a transaction with a data file the file's FLUSHALL hook would take
     * its locks after the shard locks, the opposite of the flusher's order. */
    if (kvt_tx_held && t->sp.queue)
        return -EDEADLK;
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
            shard_lock(s);
            do_clear(t, s);
            set_ht0(s, fresh, INITIAL_BUCKETS);
            shard_unlock(s);
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
    /* FLUSH is logged with every shard locked (as a transaction holds them), so
     * it never lands inside a transaction's unit: an EXEC is wholly before or
     * wholly after it, live as in a replay. Lock order: the data file's flush
     * lock (BEGIN), then the shards; the generation bump (COMMIT) takes the
     * lock the flusher holds around its own shard locking, so the shards are
     * released before it. */
    if (t->sp.queue)
        t->sp.flushall(t->sp.arg, KVT_FLUSH_BEGIN, 0);
    if (!kvt_tx_held)
        lock_all(t);
    int64_t f = t->log ? kvt_do_log(t, NULL, KVT_LOG_FLUSH, NULL, 0, NULL, 0, NULL, 0, 0) : 0;
    if (!kvt_tx_held)
        unlock_all(t);
    if (t->sp.queue)
        t->sp.flushall(t->sp.arg, f < 0 ? KVT_FLUSH_ABORT : KVT_FLUSH_COMMIT, f < 0 ? 0 : (uint64_t)f);
    if (f < 0)
        return (int)f;
    uint64_t upto = t->log ? (uint64_t)f : UINT64_MAX;
    for (int i = 0; i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        shard_lock(s);
        do_clear_before(t, s, upto);
        if (t->sp.queue)
            do_forget_disk(s);
        if ((uint64_t)f > s->del_lsn)
            s->del_lsn = (uint64_t)f;
        shard_unlock(s);
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
        shard_lock(s);
        st->buckets += s->size[0] + s->size[1];
        st->rehashing += s->rehashidx >= 0;
        shard_unlock(s);
    }
    st->keys = kvt_count(t);
    st->disk_keys = (uint64_t)atomic_load_explicit(&t->disk_keys, memory_order_relaxed);
    st->used_memory = kvt_used_memory(t);
    st->max_memory = atomic_load_explicit(&t->max_memory, memory_order_relaxed);
    st->oom_rejections = atomic_load_explicit(&t->oom_rejections, memory_order_relaxed);
    st->batches_evicted = atomic_load_explicit(&t->batches_evicted, memory_order_relaxed);
    st->batches_loaded = atomic_load_explicit(&t->batches_loaded, memory_order_relaxed);
}

/* Reclaim expired keys in `budget` buckets of s from its cursor on (locked).
 * Adds to *seen the keys with an expire time looked at; returns those reclaimed. */
static unsigned expire_buckets(struct kv_table *t, struct shard *s, unsigned budget, int64_t now, unsigned *seen)
{
    unsigned reclaimed = 0;
    for (unsigned v = 0; v < budget && s->size[0]; v++) {
        struct kvt_entry **ref = &s->ht[0][s->cursor];
        while (*ref) {
            struct kvt_entry *e = *ref;
            *seen += e->expire_ms != 0;
            if (e->expire_ms && e->expire_ms <= now && !(e->flags & E_TOMB) &&
                kvt_del_live(t, s, ref, e->data, e->klen) > 0) {
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
    return reclaimed;
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int kvt_housekeep(struct kv_table *t, unsigned first, unsigned n, unsigned budget)
{
    int reclaimed = 0;
    int64_t now = now_ms();
    /* The active expiry cycle, adaptive like Redis's: every shard gets `budget`
     * buckets; while more than a quarter of the keys with a TTL it meets have
     * expired, a shard gets more rounds, until this call has spent
     * HOUSEKEEP_EXTRA_US (25 ms every 100 ms cron tick: about a quarter of a
     * thread goes to reclaiming a backlog; every shard still gets its first
     * round). */
    int64_t deadline = mono_us() + HOUSEKEEP_EXTRA_US;
    for (unsigned i = first; i < first + n && i < KVT_SHARDS; i++) {
        struct shard *s = &t->shards[i];
        shard_lock(s);
        if (s->rehashidx >= 0) {
            /* Finish rehashes quickly (a shard of 4,096 buckets in a few ticks):
             * the expiry below waits for them, and after a fill every shard
             * grows at about the same time. */
            kvt_do_rehash_step(t, s, HOUSEKEEP_REHASH_STEP);
        } else {
            uint64_t used = atomic_load_explicit(&s->used, memory_order_relaxed);
            if (s->size[0] > INITIAL_BUCKETS && used < s->size[0] / 8) {
                uint64_t want = INITIAL_BUCKETS;
                while (want < used)
                    want *= 2;
                kvt_do_resize(t, s, want);
            }
        }
        if (s->rehashidx < 0 && atomic_load_explicit(&s->expires, memory_order_relaxed)) {
            for (int round = 0; round < 16; round++) {
                unsigned seen = 0, got = expire_buckets(t, s, budget, now, &seen);
                reclaimed += (int)got;
                if (got * 4 <= seen || mono_us() > deadline || s->rehashidx >= 0)
                    break;
            }
        }
        shard_unlock(s);
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
        shard_lock(s);
        if (s->size[0]) {
            struct kvt_entry *e = s->ht[0][h & (s->size[0] - 1)];
            if (e) {
                __builtin_prefetch(e, 0, 3);
                __builtin_prefetch((char *)e + 64, 0, 3);
            }
        }
        shard_unlock(s);
        return;
    }
    /* Possibly stale (a rehash may finish meanwhile): only ever prefetched, and a
     * prefetch of any address is harmless. */
    struct kvt_entry **b = __atomic_load_n(&s->ht[0], __ATOMIC_RELAXED);
    uint64_t size = __atomic_load_n(&s->size[0], __ATOMIC_RELAXED);
    if (b && size)
        __builtin_prefetch(&b[h & (size - 1)], 0, 3);
}
