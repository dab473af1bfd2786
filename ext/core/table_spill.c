/* table_spill.c - spill mode, the table's side of the data file (bosc.c): each
 * key's dirty node on the flusher's LDU queue, the flusher's snapshots and
 * write-backs, eviction (CLOCK) and loading keys back from their blocks.
 * Producers (writers, under the key's shard lock) and the one flusher/evictor
 * thread meet here; a node's e pointer is only touched under the shard lock.
 * Keys come from the network (untrusted) or from the data file (checksummed). */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/kvbuf.h"
#include "core/ldu.h"
#include "core/stream.h"
#include "core/table_int.h"

/* ---- dirty nodes (caller holds the shard lock) */

/* Give ne a dirty node (spill mode) unless it will inherit slot's. Called
 * before the mutation is logged, so a failed allocation changes nothing.
 * Nodes are charged without the bound: they are what lets memory be freed. */
int kvt_prep_dn(struct kv_table *t, struct kvt_entry *ne, struct kvt_entry *slot)
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

void kvt_dnode_free(struct kv_table *t, struct kvt_dnode *d)
{
    mem_uncharge(t, malloc_usable_size(d));
    free(d);
}

/* e leaves the table: a queued node stays for the consumer (which frees it),
 * an idle one is freed. The used bits only clear under this shard lock
 * (kvt_flushed), so "not queued" cannot change under us. */
void kvt_dn_detach(struct kv_table *t, struct kvt_entry *e)
{
    struct kvt_dnode *d = e->dn;
    if (!d)
        return;
    e->dn = NULL;
    d->e = NULL;
    if (!atomic_load_explicit(&d->lo.used, memory_order_relaxed))
        kvt_dnode_free(t, d);
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
    shard_lock(s);
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
            out->type = entry_type(e);
            out->expire = e->expire_ms;
            if (e->flags & E_STREAM) { /* its sealed batches by reference (each staged once), or whole */
                size_t at = val->len;
                struct xstream *x = entry_stream(e);
                x->lsn = e->lsn;
                rc = t->sp.stage_batch ? xs_encode_refs(x, val, t->sp.stage_batch, t->sp.arg) : xs_encode(x, val);
                out->vlen = (uint32_t)(val->len - at);
            } else {
                out->vlen = e->vlen;
                rc = kvbuf_append(val, entry_val(e), e->vlen);
            }
        }
        d->inflight = !rc;
    }
    if (out->kind != KVT_SNAP_SKIP)
        out->first_lsn = 0;
    shard_unlock(s);
    return rc ? -ENOMEM : 0;
}

void kvt_written(struct kv_table *t, struct kvt_dnode *d, const struct kvt_snap *snap, int was_in_block)
{
    struct shard *s = shard_of(t, d->hash);
    shard_lock(s);
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
    shard_unlock(s);
}

/* An entry eviction may drop (the clock's and a settled chunk's): not queued,
 * and its block agrees with it (a value there, or a tombstone of a key not
 * there). Shard lock held. */
static inline int evictable(const struct kvt_entry *e)
{
    unsigned od = e->flags & E_OD_MASK;
    return !e->dn && ((e->flags & E_TOMB) ? od == OD_NO : od == OD_YES);
}

static uint64_t flushed(struct kv_table *t, struct kvt_dnode *d, struct ldu_node **held, int nheld,
                        const struct kvt_snap *snap, int written, uint64_t durable, struct ldu_queue *q, int evict)
{
    uint64_t h = d->hash, freed = 0;
    struct shard *s = shard_of(t, h);
    shard_lock(s);
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
        kvt_dnode_free(t, d);
        /* Evict it now (what the clock would evict: not queued, its block holds
         * it, not used since the clock last passed: a key read or updated
         * lately stays for the clock to judge); ht[0] only, as kvt_evict (not
         * while the shard rehashes). */
        if (evict && e && evictable(e) && !(e->flags & E_REF) && s->rehashidx < 0 && s->size[0]) {
            struct kvt_entry **ref = &s->ht[0][h & (s->size[0] - 1)];
            while (*ref && *ref != e)
                ref = &(*ref)->next;
            if (*ref) {
                freed = malloc_usable_size(e);
                kvt_do_unlink(t, s, ref);
            }
        }
    }
    shard_unlock(s);
    return freed;
}

void kvt_flushed(struct kv_table *t, struct kvt_dnode *d, struct ldu_node **held, int nheld,
                 const struct kvt_snap *snap, int written, uint64_t durable, struct ldu_queue *q)
{
    (void)flushed(t, d, held, nheld, snap, written, durable, q, 0);
}

uint64_t kvt_flushed_evict(struct kv_table *t, struct kvt_dnode *d, struct ldu_node **held, int nheld,
                           const struct kvt_snap *snap, int written, uint64_t durable, struct ldu_queue *q)
{
    return flushed(t, d, held, nheld, snap, written, durable, q, 1);
}

/* A stream that stays in memory gives up old batches instead (shard lock held). */
static uint64_t evict_batches(struct kv_table *t, struct xstream *x)
{
    size_t n = 0, f = xs_evict(x, 4096, KVT_KEEP_TAIL, t->sp.batch_durable, t->sp.arg, &n);
    if (n) {
        kvt_sync_charge(t, x);
        atomic_fetch_add_explicit(&t->batches_evicted, n, memory_order_relaxed);
    }
    return f;
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
        shard_lock(s);
        if (s->rehashidx >= 0)
            kvt_do_rehash_step(t, s, 64); /* evict from ht[0] only: finish migrating first */
        uint64_t buckets = s->rehashidx >= 0 ? 0 : s->size[0];
        /* a slice of the shard per visit, so the lock is held briefly */
        for (uint64_t v = 0; v < buckets && v < 4096 && kvt_used_memory(t) > target; v++) {
            struct kvt_entry **ref = &s->ht[0][s->clock & (s->size[0] - 1)];
            while (*ref) {
                struct kvt_entry *e = *ref;
                int clean = evictable(e);
                if (clean && !(e->flags & E_REF)) {
                    freed += malloc_usable_size(e);
                    n++;
                    kvt_do_unlink(t, s, ref);
                } else {
                    /* the second chance is an evictable entry's: a dirty one
                     * keeps its bit for when its sweep has made it clean */
                    if (clean)
                        e->flags &= ~E_REF;
                    if ((e->flags & E_STREAM) && t->sp.batch_durable)
                        freed += evict_batches(t, entry_stream(e));
                    ref = &e->next;
                }
            }
            s->clock++;
            visited++;
        }
        visited++; /* a shard visited, even with no buckets (the loop ends) */
        shard_unlock(s);
    }
    if (evicted)
        *evicted += n;
    return freed;
}

/* key's record in its block has expired and memory has no entry for it: the
 * expiry happens now, logged as a deletion; a dirty tombstone of a key in its
 * block stands for it until a sweep removes the record (the count drops now,
 * the file's count when the record goes). Returns 1, or -errno (nothing done). */
static int expire_in_block(struct kv_table *t, struct shard *s, uint64_t h, const void *key, size_t klen)
{
    struct kvt_entry *e = kvt_entry_new_b(t, h, key, klen, NULL, 0, 0, 0);
    if (!e)
        return -ENOMEM;
    int64_t lsn = kvt_prep_dn(t, e, NULL) ? -ENOMEM : kvt_do_log(t, s, KVT_LOG_DEL, key, klen, NULL, 0, NULL, 0, 0);
    if (lsn < 0) {
        if (e->dn)
            kvt_dnode_free(t, e->dn);
        kvt_entry_free(t, e);
        return (int)lsn;
    }
    e->flags = E_REF | E_TOMB | OD_YES;
    e->lsn = (uint64_t)lsn;
    kvt_do_insert(t, s, e);
    mark_dirty(t, e, LDU_REMOVE);
    if ((uint64_t)lsn > s->del_lsn)
        s->del_lsn = (uint64_t)lsn;
    cnt_add(&s->expired, 1);
    return 1;
}

int kvt_expire_disk(struct kv_table *t, const void *key, size_t klen, int64_t expire_ms)
{
    if (!expire_ms || expire_ms > now_ms())
        return 0;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    /* maybe_on_disk under the shard lock: a FLUSHALL (which empties the file's
     * counts under every shard lock) between the flusher's read and here leaves
     * nothing to expire. */
    int rc = kvt_do_find(s, h, key, klen) || !t->sp.maybe_on_disk(t->sp.arg, key, klen)
                 ? 0
                 : expire_in_block(t, s, h, key, klen);
    shard_unlock(s);
    return rc;
}

int kvt_load(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen, int found,
             int64_t expire_ms, int type, int (*still_valid)(void *arg), void *arg)
{
    uint64_t h = kvt_hash(key, klen);
    /* A stream is made from its bytes (and its batches read from the batch
     * store) before the shard is locked: the reads keep no other key waiting. */
    struct xstream *x = NULL;
    int rc = 0;
    if (found && type == KVT_STREAM &&
        (rc = xs_decode_from(val, vlen, t->lazy_batches ? XS_FETCH_LATER : t->sp.fetch_batch, t->sp.arg, &x)))
        return rc;
    struct shard *s = kvt_lock_shard(t, h);
    if (kvt_do_find(s, h, key, klen)) {
        rc = 0; /* written (or loaded) meanwhile: memory is newer than the block */
    } else if (!still_valid(arg)) {
        rc = -EAGAIN; /* the block changed after it was read */
    } else if (found && expire_ms && expire_ms <= now_ms() && expire_in_block(t, s, h, key, klen) > 0) {
        rc = 1; /* its time passed while it was out of memory */
    } else {
        /* A clean copy of the block's record, or a clean tombstone saying the key
         * is not there (so the next miss does not read the block again). Charged
         * without the bound: the evictor takes it back under pressure. (An expired
         * record whose deletion could not be logged reads as absent; the flusher's
         * expiry pass records it later, kvt_expire_disk.) */
        if (found && expire_ms && expire_ms <= now_ms())
            found = 0;
        if (found && x) { /* the entry holds the stream its bytes make */
            kvt_mem_charge(t, x->mem, 0);
            x->charged = x->mem;
            val = &x;
            vlen = sizeof x;
        }
        struct kvt_entry *e = kvt_entry_new_b(t, h, key, klen, found ? val : NULL, found ? vlen : 0, 0, 0);
        if (!e && x && found)
            mem_uncharge(t, x->charged);
        if (!e) {
            rc = -ENOMEM;
        } else {
            e->flags = E_REF | (found ? OD_YES : (E_TOMB | OD_NO));
            entry_set_type(e, found ? type : KVT_STRING);
            if (x && found) {
                e->flags |= E_STREAM;
                x = NULL; /* the entry's now */
            }
            e->expire_ms = found ? expire_ms : 0;
            kvt_do_insert(t, s, e);
            rc = 1;
        }
    }
    shard_unlock(s);
    xs_free(x); /* not taken (present meanwhile, stale, expired, no memory) */
    return rc;
}

void kvt_set_lazy_batches(struct kv_table *t, int lazy) { t->lazy_batches = lazy; }

#define LOAD_BATCHES 64 /* per call: ~90 KiB read before the command runs again */

int kvt_load_batches(struct kv_table *t, const void *key, size_t klen)
{
    uint64_t no[LOAD_BATCHES];
    struct xs_ref ref[LOAD_BATCHES];
    void *buf[LOAD_BATCHES] = {0};
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    size_t n = e && (e->flags & E_STREAM) && t->sp.fetch_batch ? xs_wanted(entry_stream(e), no, ref, LOAD_BATCHES)
                                                                 : 0;
    shard_unlock(s);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) /* read outside the lock: other keys do not wait */
        if (!(buf[i] = malloc(ref[i].len ? ref[i].len : 1)))
            rc = -ENOMEM;
        else
            rc = t->sp.fetch_batch(t->sp.arg, &ref[i], buf[i]);
    int back = 0;
    if (!rc && n) {
        s = kvt_lock_shard(t, h);
        e = do_live(t, s, h, key, klen, &st);
        struct xstream *x = e && (e->flags & E_STREAM) ? entry_stream(e) : NULL;
        for (size_t i = 0; x && i < n && !rc; i++) { /* each still the one read (not trimmed or changed) */
            int r = xs_restore(x, no[i], &ref[i], buf[i]);
            if (r < 0)
                rc = r;
            back += r > 0;
        }
        if (x) /* charged without the bound: the evictor takes it back under pressure */
            kvt_sync_charge(t, x);
        shard_unlock(s);
    }
    for (size_t i = 0; i < n; i++)
        free(buf[i]);
    atomic_fetch_add_explicit(&t->batches_loaded, (uint64_t)back, memory_order_relaxed);
    return rc ? rc : back;
}

size_t kvt_want_batches(struct kv_table *t, const void *key, size_t klen, size_t max)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    size_t n = e && (e->flags & E_STREAM) ? xs_want_gone(entry_stream(e), max) : 0;
    shard_unlock(s);
    return n;
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
