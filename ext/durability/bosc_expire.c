/* bosc_expire.c - expired records in the data file: a record a sweep or the
 * background pass reads whose expire time has passed becomes a logged deletion
 * (a tombstone the next sweep writes); the pass goes over the buckets that may
 * hold such records, a bounded number of blocks per turn. Flusher thread only
 * (it owns the expiry pass's per-bucket bits). Reads untrusted blocks through
 * bosc_chain_read, which checks them. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/kvbuf.h"
#include "core/table.h"
#include "durability/bosc_int.h"

/* A record whose expire time has passed (and which no state in the sweep
 * replaces): its expiry becomes a logged deletion, a tombstone the next sweep
 * writes like any DEL, so the key count stays exact and the log says when the
 * key went. The record stays until then. Not while a FLUSHALL has emptied the
 * file meanwhile (its blocks are gone already). */
int bosc_expire_found(struct bosc *b, uint64_t gen, const unsigned char *key, uint32_t klen, int64_t expire)
{
    add(&b->st.expired_found, 1);
    if (atomic_load_explicit(&b->gen, memory_order_acquire) != gen || kvt_expire_disk(b->t, key, klen, expire) <= 0)
        return 0;
    add(&b->st.expired_reclaimed, 1);
    return 1;
}

/* ---- the expiry pass */

struct pass_arg {
    struct bosc *b;
    uint64_t gen;
    int64_t now;
    int64_t next;                /* the earliest expire time the chain keeps (0: none) */
};

static void pass_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key,
                     uint32_t klen, const unsigned char *val, uint32_t vlen, int64_t expire, int type)
{
    struct pass_arg *a = arg;
    if (!expire || (expire <= a->now && bosc_expire_found(a->b, a->gen, key, klen, expire)))
        return; /* no expire time, or its deletion is recorded: the next sweep takes it */
    if (!a->next || expire < a->next)
        a->next = expire; /* (one whose deletion could not be recorded: next turn again) */
}

/* Expired records in blocks that no write touches would stay forever (a sweep
 * reads only the blocks it writes): go on from the cursor over the buckets whose
 * earliest expire time has come, reading at most pass_budget blocks, and turn
 * what expired into logged deletions for the next sweep. A file without TTLs,
 * or whose TTLs are all ahead, is never read. Flusher thread, between sweeps.
 * Returns 0 or -errno (err set: a damaged block fails the data file, as a
 * sweep's would). */
int bosc_expire_pass(struct bosc *b, struct kvbuf *stream, uint32_t **chain, size_t *nchain, size_t *capchain,
                     char *err, size_t errlen)
{
    uint32_t budget = b->pass_budget;
    int64_t now = kvt_now_ms();
    uint32_t now_s = exp_sec(now);
    for (uint32_t seen = 0; seen < b->nbuckets && budget && b->ttl_buckets; seen++) {
        uint32_t bk = b->pass_cursor;
        if (++b->pass_cursor == b->nbuckets) {
            b->pass_cursor = 0;
            add(&b->st.expire_passes, 1);
        }
        if (!b->exp_min[bk] || b->exp_min[bk] >= now_s) /* (rounded down: < is surely past) */
            continue;
        struct pass_arg a = {b, atomic_load_explicit(&b->gen, memory_order_acquire), now, 0};
        if (atomic_load_explicit(&b->nkeys[bk], memory_order_relaxed)) {
            int rc = bosc_chain_read(b, bk, a.gen, stream, chain, nchain, capchain, NULL, err, errlen);
            if (rc)
                return rc;
            add(&b->st.expire_pass_blocks, *nchain);
            budget = *nchain < budget ? budget - (uint32_t)*nchain : 0;
            if (bosc_stream_walk((unsigned char *)stream->p, stream->len, pass_rec, &a) < 0)
                return bosc_stream_damaged(b, bk, err, errlen);
        }
        b->exp_min[bk] = 0;
        b->ttl_buckets--;
        if (a.next)
            ttl_mark(b, bk, a.next);
    }
    return 0;
}
