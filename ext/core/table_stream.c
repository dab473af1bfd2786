/* table_stream.c - keys whose value is a stream (core/stream.h). The entry's
 * value is the stream's pointer (E_STREAM); the stream's own memory is counted
 * beside the entry's (x->charged), synced after every change. A change is a
 * delta: decided by the command under the shard lock (kvt_xapply's fn), held
 * against the memory bound, logged (KVT_LOG_XOP), then applied with the same
 * xs_apply that log replay runs (kvt_xreplay). A whole state (COPY, RENAME, a
 * replayed KVT_LOG_SET | KVT_LOG_STREAM, a data-file load) is the stream's
 * bytes, decoded. Locking rules are table.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "core/kvbuf.h"
#include "core/stream.h"
#include "core/table.h"
#include "core/table_int.h"

#define XS_SEAL_MS 100      /* an open batch older than this is sealed at the next append */
#define XDELTA_SLACK 256    /* memory held for a delta beyond its bytes (batch headers, nodes) */

void kvt_sync_charge(struct kv_table *t, struct xstream *x)
{
    if (x->mem > x->charged)
        kvt_mem_charge(t, x->mem - x->charged, 0);
    else if (x->charged > x->mem)
        mem_uncharge(t, x->charged - x->mem);
    x->charged = x->mem;
}

void kvt_set_gone_hook(struct kv_table *t, void (*fn)(void *arg, const void *key, size_t klen), void *arg)
{
    t->gone = fn;
    t->gone_arg = arg;
}

void kvt_set_batch_hook(struct kv_table *t, kvt_batch_fn fn, void *arg)
{
    t->batch = fn;
    t->batch_arg = arg;
}

void kvt_batch_seen(struct kv_table *t, const void *key, size_t klen, const struct xs_batch *b)
{
    if (t->batch && b->sealed)
        t->batch(t->batch_arg, key, klen, b, XS_EV_SEALED);
}

/* kvt_xapply's batch events, with the key they belong to, to the batch hook. */
struct batch_relay {
    struct kv_table *t;
    const void *key;
    size_t klen;
};

static void relay(void *arg, const struct xs_batch *b, int ev)
{
    struct batch_relay *r = arg;
    r->t->batch(r->t->batch_arg, r->key, r->klen, b, ev);
}

void kvt_entry_drop_stream(struct kv_table *t, struct kvt_entry *e)
{
    if (!(e->flags & E_STREAM))
        return;
    struct xstream *x = entry_stream(e);
    if (t->gone)
        t->gone(t->gone_arg, e->data, e->klen);
    if (t->batch)
        t->batch(t->batch_arg, e->data, e->klen, NULL, XS_EV_GONE);
    mem_uncharge(t, x->charged);
    xs_free(x);
    e->flags &= ~E_STREAM;
    e->vlen = 0;
}

uint64_t kvt_stream_mem(struct kvt_entry *e)
{
    return (e->flags & E_STREAM) ? entry_stream(e)->charged : 0;
}

/* A new entry for key holding x (charged now), placed like kvt_do_store's. */
static struct kvt_entry *stream_entry(struct kv_table *t, uint64_t h, const void *key, size_t klen,
                                      struct kvt_entry *slot, int st, struct xstream *x, int bounded)
{
    struct kvt_entry *ne = kvt_entry_new_b(t, h, key, klen, &x, sizeof x, 0, bounded);
    if (!ne)
        return NULL;
    ne->flags = (slot ? slot->flags & E_OD_MASK : st == LK_NOTRES ? OD_UNK : OD_NO) | E_STREAM;
    if (kvt_prep_dn(t, ne, slot)) {
        ne->flags &= ~E_STREAM; /* x stays the caller's */
        kvt_entry_free(t, ne);
        return NULL;
    }
    return ne;
}

/* ne (a new entry) takes the key's place. */
static void place(struct kv_table *t, struct shard *s, struct kvt_entry **ref, struct kvt_entry *ne)
{
    if (ref && *ref)
        kvt_do_replace(t, s, ref, ne);
    else
        kvt_do_insert(t, s, ne);
    mark_dirty(t, ne, LDU_INSERT);
}

int kvt_do_store_stream(struct kv_table *t, struct shard *s, uint64_t h, struct kvt_entry **ref, int st,
                        const void *key, size_t klen, int keep, const void *val, size_t n, int64_t expire,
                        int bounded)
{
    struct kvt_entry *slot = ref ? *ref : NULL;
    if (keep) { /* EXPIRE, PERSIST on a stream */
        if (kvt_prep_dn(t, slot, NULL))
            return -ENOMEM;
        int64_t lsn = kvt_do_log(t, s, KVT_LOG_XOP, key, klen, NULL, 0, NULL, 0, expire);
        if (lsn < 0)
            return (int)lsn;
        cnt_add(&s->expires, (expire != 0) - (slot->expire_ms != 0));
        slot->expire_ms = expire;
        slot->lsn = (uint64_t)lsn;
        entry_stream(slot)->lsn = (uint64_t)lsn;
        mark_dirty(t, slot, LDU_INSERT);
        return 0;
    }
    struct xstream *x;
    int rc = xs_decode(val, n, &x);
    if (rc)
        return rc;
    if (kvt_mem_charge(t, x->mem, bounded)) {
        xs_free(x);
        atomic_fetch_add_explicit(&t->oom_rejections, 1, memory_order_relaxed);
        return -ENOMEM;
    }
    x->charged = x->mem;
    struct kvt_entry *ne = stream_entry(t, h, key, klen, slot, st, x, bounded);
    if (!ne) {
        mem_uncharge(t, x->charged);
        xs_free(x);
        return -ENOMEM;
    }
    int64_t lsn = kvt_do_log(t, s, KVT_LOG_SET | KVT_LOG_STREAM, key, klen, val, n, NULL, 0, expire);
    if (lsn < 0) {
        if (ne->dn)
            kvt_dnode_free(t, ne->dn);
        kvt_entry_free(t, ne); /* frees x and its charge */
        return (int)lsn;
    }
    ne->lsn = x->lsn = (uint64_t)lsn;
    ne->expire_ms = expire;
    place(t, s, ref, ne);
    return 0;
}

/* The per-thread delta buffer (kept between calls; a big delta's room is given back). */
static __thread struct kvbuf xdelta;

int64_t kvt_xapply(struct kv_table *t, const void *key, size_t klen, kvt_xapply_fn fn, void *arg)
{
    if (klen > KVT_MAX_VALUE)
        return -E2BIG;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    int64_t rc;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    if (st == LK_NOTRES) {
        rc = -ENODATA;
        goto out;
    }
    struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
    struct kvt_state cur = entry_state(e);
    struct xstream *x = cur.stream;
    kvt_lsn_touch(e ? e->lsn : s->del_lsn);
    xdelta.len = 0;
    xs_missed = 0;
    rc = fn(arg, &cur, &xdelta);
    if (xs_missed) { /* a batch it read is out of memory: its decision is void, load it first */
        rc = -ENODATA;
        goto out;
    }
    if (rc < 0 || !xdelta.len) {
        cnt_add(e ? &s->hits : &s->misses, 1);
        goto out;
    }
    if (e && !x) {
        rc = KVT_WRONGTYPE; /* fn should have said so */
        goto out;
    }
    size_t hold = xdelta.len + XDELTA_SLACK;
    if (kvt_mem_charge(t, hold, 1)) {
        atomic_fetch_add_explicit(&t->oom_rejections, 1, memory_order_relaxed);
        rc = -ENOMEM;
        goto out;
    }
    struct kvt_entry *slot = ref ? *ref : NULL, *ne = NULL;
    if (!e) {
        struct xstream *none = NULL;
        if (!(ne = stream_entry(t, h, key, klen, slot, st, none, 1))) {
            mem_uncharge(t, hold);
            rc = -ENOMEM;
            goto out;
        }
        ne->flags &= ~E_STREAM; /* until the delta made its stream */
    } else if (kvt_prep_dn(t, e, NULL)) {
        mem_uncharge(t, hold);
        rc = -ENOMEM;
        goto out;
    }
    int64_t lsn = kvt_do_log(t, s, KVT_LOG_XOP, key, klen, xdelta.p, xdelta.len, NULL, 0, e ? e->expire_ms : 0);
    if (lsn < 0) {
        if (ne) {
            if (ne->dn)
                kvt_dnode_free(t, ne->dn);
            kvt_entry_free(t, ne);
        }
        mem_uncharge(t, hold);
        rc = lsn;
        goto out;
    }
    struct batch_relay br = {t, key, klen};
    const struct xs_watch w = {relay, &br};
    if (t->batch)
        xs_watch = &w;
    int ar = xs_apply(&x, xdelta.p, xdelta.len, now_coarse_ms(), XS_SEAL_MS);
    xs_watch = NULL;
    mem_uncharge(t, hold);
    if (x) {
        x->lsn = (uint64_t)lsn;
        kvt_sync_charge(t, x);
    }
    if (ne) {
        if (!x) { /* a delta with no CREATE on an absent key: fn's mistake */
            if (ne->dn)
                kvt_dnode_free(t, ne->dn);
            kvt_entry_free(t, ne);
            rc = -EINVAL;
            goto out;
        }
        memcpy(entry_val(ne), &x, sizeof x);
        ne->flags |= E_STREAM;
        ne->lsn = (uint64_t)lsn;
        place(t, s, ref, ne);
    } else {
        e->lsn = (uint64_t)lsn;
        mark_dirty(t, e, LDU_INSERT);
    }
    if (ar)
        rc = ar; /* logged but not (wholly) applied: only out of memory can do this */
out:
    if (xdelta.cap > 1 << 20)
        kvbuf_free(&xdelta);
    shard_unlock(s);
    return rc;
}

int kvt_xreplay(struct kv_table *t, const void *key, size_t klen, const void *delta, size_t n, int64_t expire_ms,
                uint64_t lsn)
{
    uint64_t h = kvt_hash(key, klen);
    int rc = 0;
    for (int tries = 0;; tries++) {
        struct shard *s = kvt_lock_shard(t, h);
        int st;
        struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
        if (st == LK_NOTRES) {
            shard_unlock(s);
            if (tries || (rc = kvt_load_sync(t, key, klen)) < 0)
                return rc < 0 ? rc : -ENODATA;
            continue;
        }
        struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
        struct xstream *x = e && (e->flags & E_STREAM) ? entry_stream(e) : NULL;
        int creates = n && *(const unsigned char *)delta == XOP_CREATE;
        if ((e && !x) || (x && x->lsn >= lsn) || (!e && !creates)) {
            shard_unlock(s);
            return 0;
        }
        struct kvt_entry *ne = NULL;
        if ((!e && !(ne = stream_entry(t, h, key, klen, ref ? *ref : NULL, st, NULL, 0))) ||
            (e && kvt_prep_dn(t, e, NULL))) {
            shard_unlock(s);
            return -ENOMEM;
        }
        if (ne)
            ne->flags &= ~E_STREAM;
        rc = n ? xs_apply(&x, delta, n, now_coarse_ms(), XS_SEAL_MS) : 0;
        if (x) {
            x->lsn = lsn;
            kvt_sync_charge(t, x);
        }
        struct kvt_entry *held = ne ? ne : e;
        if (ne && x) {
            memcpy(entry_val(ne), &x, sizeof x);
            ne->flags |= E_STREAM;
            ne->expire_ms = expire_ms;
            ne->lsn = lsn;
            place(t, s, ref, ne);
        } else if (ne) {
            if (ne->dn)
                kvt_dnode_free(t, ne->dn);
            kvt_entry_free(t, ne);
        } else {
            cnt_add(&s->expires, (expire_ms != 0) - (held->expire_ms != 0));
            held->expire_ms = expire_ms;
            held->lsn = lsn;
            mark_dirty(t, held, LDU_INSERT);
        }
        shard_unlock(s);
        return rc < 0 ? rc : 1;
    }
}
