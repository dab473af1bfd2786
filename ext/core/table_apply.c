/* table_apply.c - the table's general operations over one key and over all of
 * them: kvt_apply (a command's read-modify-write under the key's shard lock,
 * so every command that changes a key is one atomic, logged write), kvt_version
 * (WATCH), and transactions (kvt_tx_begin/kvt_tx_end: every shard locked by
 * one thread, its log records one unit). Locking rules are in table.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>

#include "core/table.h"
#include "core/stream.h"
#include "core/table_int.h"

int64_t kvt_apply(struct kv_table *t, const void *key, size_t klen, kvt_apply_fn fn, void *arg)
{
    if (klen > KVT_MAX_VALUE)
        return -E2BIG;
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    int64_t rc;
    struct kvt_entry **ref = kvt_do_lookup(t, s, h, key, klen, &st);
    if (st == LK_NOTRES) {
        rc = -ENODATA; /* the answer depends on the block: load it first */
        goto out;
    }
    struct kvt_entry *e = st == LK_LIVE ? *ref : NULL;
    struct kvt_state cur = entry_state(e);
    /* Whatever fn decides, its result reveals the key's state (or absence). */
    kvt_lsn_touch(e ? e->lsn : s->del_lsn);
    struct kvt_change ch = {.action = KVT_KEEP, .type = cur.type, .expire_ms = cur.expire_ms};
    xs_missed = 0;
    rc = fn(arg, &cur, &ch);
    if (xs_missed) { /* a stream batch it read is out of memory: its answer is void, load it first */
        rc = -ENODATA;
        goto out;
    }
    if (rc < 0 || ch.action == KVT_KEEP) {
        cnt_add(e ? &s->hits : &s->misses, 1); /* a read: keyspace_hits/misses, as Redis counts them */
        goto out;
    }
    if (ch.action == KVT_DELETE) {
        if (e) {
            int d = kvt_del_live(t, s, ref, key, klen);
            if (d < 0)
                rc = d;
        }
        goto out;
    }
    if (ch.n1 > KVT_MAX_VALUE || ch.n2 > KVT_MAX_VALUE || ch.n1 + ch.n2 > KVT_MAX_VALUE) {
        rc = -E2BIG;
        goto out;
    }
    int w = kvt_do_store(t, s, h, ref, st, key, klen, ch.val, ch.n1, ch.v2, ch.n2, ch.expire_ms, ch.extra,
                         ch.type, !ch.nobound);
    if (w < 0)
        rc = w;
out:
    shard_unlock(s);
    return rc;
}

int kvt_version(struct kv_table *t, const void *key, size_t klen, uint64_t *ver)
{
    uint64_t h = kvt_hash(key, klen);
    struct shard *s = kvt_lock_shard(t, h);
    int st;
    struct kvt_entry *e = do_live(t, s, h, key, klen, &st);
    /* A live key: the LSN (or, without a log, the shard's write count) that
     * wrote it. An absent key: the shard's latest deletion, so a key created
     * and deleted again in between reads as changed (as may an unrelated
     * deletion in the same shard: a spurious abort, never a missed one). */
    *ver = e ? e->lsn : s->del_lsn;
    kvt_lsn_touch(*ver);
    shard_unlock(s);
    return st == LK_NOTRES ? -ENODATA : e != NULL;
}

int kvt_tx_begin(struct kv_table *t)
{
    if (t->log) {
        int64_t rc = t->log(t->log_arg, KVT_LOG_UNIT_BEGIN, NULL, 0, NULL, 0, NULL, 0, 0);
        if (rc < 0)
            return (int)rc;
    }
    lock_all(t);
    kvt_tx_held = 1;
    kvt_tx_changes = 0;
    return 0;
}

int64_t kvt_tx_end(struct kv_table *t)
{
    int64_t lsn = 0;
    if (t->log) {
        /* Still holding every shard: no record of another thread can land
         * between the unit's records and the one that closes it. */
        lsn = t->log(t->log_arg, KVT_LOG_UNIT_END, NULL, 0, NULL, 0, NULL, 0, 0);
        if (lsn > 0)
            kvt_lsn_touch((uint64_t)lsn);
    }
    kvt_tx_held = 0;
    unlock_all(t);
    return lsn;
}
