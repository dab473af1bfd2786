/* bosc_sweep.c - one sweep of the flusher (bosc_flusher.c): takes the dirty
 * queue, sweeps the blocks in ascending order (read, apply the keys' states in
 * LSN order, write), syncs, records the flushed LSN in the superblock and
 * deletes log segments below it. The flusher owns the free-block lists and the
 * expiry pass's bits; bucket versions are odd while written. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/latmon.h"
#include "core/ldu.h"
#include "core/table.h"
#include "durability/bosc_int.h"
#include "durability/wal.h"

/* ---- the sweep */

struct rewrite {                 /* applying a block's updates to its record stream */
    struct item *it;             /* the block's items, LSN order */
    size_t n;
    const uint64_t *tag;         /* per item: key_tag of its key (compared before the key) */
    struct kvbuf *out;
    uint8_t *present;            /* per item: its key was in the block */
    int64_t now;
    int changed, oom;
    struct bosc *b;
    uint64_t gen;
    struct sweep_ctx *c;
};

/* A word that differs between most keys of a bucket: the length and the last
 * bytes (keys of one bucket often share a prefix). Each record of a chain the
 * sweep rewrites is looked for among the bucket's dirty keys: comparing tags
 * first keeps that from reading every dirty key per record. */
static inline uint64_t key_tag(const unsigned char *key, uint32_t klen)
{
    uint64_t t = 0;
    if (klen >= 8) {
        memcpy(&t, key + klen - 8, 8); /* (a fixed size: one load, not a call) */
        return t ^ klen;
    }
    for (uint32_t i = 0; i < klen; i++)
        t = t << 8 | key[i];
    return t << 8 ^ klen;
}

static void keep_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key,
                     uint32_t klen, const unsigned char *val, uint32_t vlen, int64_t expire, int type)
{
    struct rewrite *w = arg;
    uint64_t tag = key_tag(key, klen);
    for (size_t i = 0; i < w->n; i++) {
        if (w->tag[i] != tag)
            continue;
        uint32_t ik;
        const unsigned char *k = kvt_dnode_key(w->it[i].d, &ik);
        if (ik == klen && memcmp(k, key, klen) == 0) {
            w->present[i] = 1;
            w->changed = 1; /* replaced or deleted below */
            if (type == KVT_STREAM && bosc_batches_replaced(w->c, val, vlen))
                w->oom = 1;
            return;
        }
    }
    if (expire && expire <= w->now)
        bosc_expire_found(w->b, w->gen, key, klen, expire);
    if (kvbuf_append(w->out, (const char *)rec, reclen))
        w->oom = 1;
}

static int bucket_cmp(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    return (x->bucket > y->bucket) - (x->bucket < y->bucket);
}

static int lsn_cmp(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    int nx = x->snap.kind == KVT_SNAP_NONE || x->snap.kind == KVT_SNAP_SKIP;
    int ny = y->snap.kind == KVT_SNAP_NONE || y->snap.kind == KVT_SNAP_SKIP;
    if (nx != ny)
        return nx - ny;
    return (x->snap.lsn > y->snap.lsn) - (x->snap.lsn < y->snap.lsn);
}

/* Write stream s as bucket's chain. Caller holds gen_lock and has made the
 * bucket's version odd. */
static int chain_write(struct bosc *b, uint32_t bucket, uint64_t gen, const struct kvbuf *s, uint32_t *chain,
                       size_t nchain)
{
    size_t need = s->len ? (s->len + PAYLOAD - 1) / PAYLOAD : 1;
    uint32_t *blocks = malloc(need * sizeof *blocks);
    if (!blocks)
        return -ENOMEM;
    uint32_t home = (uint32_t)home_of(b, bucket);
    int rc = 0;
    /* Copy on write, the home block too: the chain's new blocks are fresh
     * overflow blocks and the home copy that does not hold the synced chain
     * (b->slot), never the synced ones, which stay intact (and in use) until
     * the sweep is synced. A crash, even one that tears a block write (a power
     * cut), leaves the synced chain whole; the log holds what the torn sweep
     * was writing (the flushed LSN moves only after the sweep's sync). */
    size_t nfreed = b->nfreed; /* (a failed write gives back what it took: below) */
    for (size_t i = 0; i < need; i++) {
        blocks[i] = i == 0 ? home + (b->slot[bucket] ^ 1u) : bosc_blk_alloc(b);
        if (!blocks[i]) {
            for (size_t k = 1; k < i; k++)
                bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, blocks[k]);
            free(blocks);
            return -ENOSPC;
        }
    }
    for (size_t i = 1; i < nchain; i++)
        if (bosc_push_u32(&b->freed, &b->nfreed, &b->capfreed, chain[i]))
            rc = -ENOMEM; /* a leaked block, found again at the next open */
    unsigned char blk[BLK];
    /* Overflow blocks first, the home block last: a reader (or a crash) never
     * sees the home block point at a block not yet written. */
    for (size_t k = need; k-- > 0 && !rc;) {
        size_t off = k * PAYLOAD, n = s->len - off < PAYLOAD ? s->len - off : PAYLOAD;
        if (!s->len)
            n = 0;
        if (n)
            memcpy(blk + BHDR, s->p + off, n);
        rc = bosc_block_write(b, blk, blocks[k], k + 1 < need ? blocks[k + 1] : 0, gen, (uint32_t)n, home);
    }
    if (rc) {
        /* A write failed (a full disk): the synced home copy still names the
         * old chain (the bucket is not marked touched, so its copies do not
         * flip), so the old chain's blocks stay in use and the new ones go back
         * to the free list. */
        b->nfreed = nfreed;
        for (size_t i = 1; i < need; i++)
            bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, blocks[i]);
    }
    free(blocks);
    if (!rc && bosc_push_u32(&b->touched, &b->ntouched, &b->captouched, bucket))
        rc = -ENOMEM;
    return rc;
}


/* A bucket's items in lsn_cmp order: by insertion when there are few (a sweep
 * sorts one small group per bucket: qsort's setup cost more than the sort). */
static void sort_lsn(struct item *it, size_t n)
{
    if (n > 32) {
        qsort(it, n, sizeof *it, lsn_cmp);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        if (lsn_cmp(&it[i - 1], &it[i]) <= 0)
            continue;
        struct item t = it[i];
        size_t j = i;
        while (j > 0 && lsn_cmp(&it[j - 1], &t) > 0) {
            it[j] = it[j - 1];
            j--;
        }
        it[j] = t;
    }
}

/* Sort the sweep's items by bucket. A large sweep (a dirty share of memory:
 * items in the millions) by counting, stably (queue order within a bucket):
 * each item's place from per-bucket counts, then the items moved there in
 * place (following the permutation's cycles: 4 bytes more per item, not a
 * second array of items), instead of qsort's n log n calls of bucket_cmp and
 * its copy of the array (5 % of the flusher's CPU). A small sweep by qsort
 * (the counts are per bucket), not stably: sort_lsn then puts each bucket's
 * items in LSN order, which is the order applying them needs. */
static int sort_items(struct bosc *b, struct sweep_ctx *c)
{
    if (c->n < b->nbuckets / 8) {
        qsort(c->items, c->n, sizeof *c->items, bucket_cmp);
        return 0;
    }
    if (!c->bcount && !(c->bcount = malloc(((size_t)b->nbuckets + 1) * sizeof *c->bcount)))
        return -ENOMEM;
    if (c->capdest < c->n) {
        uint32_t *d = realloc(c->dest, c->cap * sizeof *d);
        if (!d)
            return -ENOMEM;
        c->dest = d;
        c->capdest = c->cap;
    }
    memset(c->bcount, 0, ((size_t)b->nbuckets + 1) * sizeof *c->bcount);
    for (size_t i = 0; i < c->n; i++)
        c->bcount[c->items[i].bucket + 1]++;
    for (uint32_t k = 1; k <= b->nbuckets; k++)
        c->bcount[k] += c->bcount[k - 1];
    for (size_t i = 0; i < c->n; i++)
        c->dest[i] = c->bcount[c->items[i].bucket]++;
    for (size_t i = 0; i < c->n; i++) {
        while (c->dest[i] != i) { /* put item i where it goes; the one there comes here */
            uint32_t j = c->dest[i];
            struct item t = c->items[j];
            c->items[j] = c->items[i];
            c->items[i] = t;
            c->dest[i] = c->dest[j];
            c->dest[j] = j;
        }
    }
    return 0;
}

/* Write the staged chains and settle their buckets. Only here is gen_lock
 * held and are the staged buckets' versions odd (a loader or a key listing
 * waits on an odd version: not while the sweep reads and applies the buckets
 * after them). Staging left the file as it was -- a staged chain's new blocks
 * are free blocks and the home copy a reader does not pick, the synced chain
 * intact until the sweep's sync -- so readers need not wait until now. The
 * generation is checked here, under the lock: after a FLUSHALL since the sweep
 * began nothing is written (the blocks go back, the items stay unwritten:
 * their states are gone or queued again). Settles the buckets written whole:
 * record counts, the entries' "in the block" bits. Returns 0 or -errno (err
 * set, c->write_failed: the chains not written are undone, their keys stay
 * dirty). */
static int batch_flush(struct bosc *b, struct sweep_ctx *c, uint64_t gen, char *err, size_t errlen)
{
    if (!c->wb.nbk)
        return 0;
    int rc = bosc_batches_commit(b, c, err, errlen);
    if (rc) { /* none of the staged chains is written: their keys stay dirty */
        for (size_t e = 0; e < c->wb.nbk; e++)
            c->wb.bk[e].ok = 0;
        bosc_wb_undo(b, &c->wb);
        c->wb.n = c->wb.nbk = 0;
        return rc;
    }
    pthread_mutex_lock(&b->gen_lock);
    if (atomic_load_explicit(&b->gen, memory_order_relaxed) != gen) {
        for (size_t e = 0; e < c->wb.nbk; e++)
            c->wb.bk[e].ok = 0;
        bosc_wb_undo(b, &c->wb);
        for (size_t e = 0; e < c->wb.nbk; e++)
            add(&b->st.records, c->wb.bk[e].nitems); /* (as sweep_bucket counts a FLUSHALL's) */
        c->wb.n = c->wb.nbk = 0;
        pthread_mutex_unlock(&b->gen_lock);
        return 0;
    }
    for (size_t e = 0; e < c->wb.nbk; e++) /* seqlock: odd while the chains are written */
        atomic_fetch_add_explicit(&b->ver[c->wb.bk[e].bucket], 1, memory_order_acq_rel);
    uint64_t t0 = now_ns();
    rc = bosc_wb_write(b, &c->wb);
    add(&b->st.io_ns, now_ns() - t0);
    if (rc)
        bosc_wb_undo(b, &c->wb);
    for (size_t e = 0; e < c->wb.nbk; e++) {
        struct wb_bucket *x = &c->wb.bk[e];
        struct item *it = c->items + x->first_item;
        if (x->ok)
            atomic_store_explicit(&b->nkeys[x->bucket], x->after, memory_order_relaxed);
        /* release: a loader that sees the even version sees the blocks' new contents */
        atomic_fetch_add_explicit(&b->ver[x->bucket], 1, memory_order_release);
        if (!x->ok)
            continue;
        bosc_batches_written(c, x->dec_lo, x->dec_hi);
        for (size_t i = 0; i < x->nitems; i++) {
            kvt_written(b->t, it[i].d, &it[i].snap, it[i].present);
            it[i].written = 1;
        }
        add(&b->st.records, x->nitems);
    }
    c->wb.n = c->wb.nbk = 0;
    pthread_mutex_unlock(&b->gen_lock);
    if (rc) {
        snprintf(err, errlen, "cannot write data file %s: %s", b->path, strerror(-rc));
        c->write_failed = 1;
    }
    return rc;
}

/* Before the sweep applies the bucket of items[i]: if the read window does not
 * hold its home copies, read those of the run of dirty buckets starting there
 * (gaps of at most RWIN_GAP buckets, RWIN_BLOCKS blocks) with one call, and
 * have the kernel read the next run ahead meanwhile. A failed read leaves the
 * window empty: the buckets are then read one by one (and the error reported). */
static void window_for(struct bosc *b, struct sweep_ctx *c, size_t i)
{
    uint64_t h = home_of(b, c->items[i].bucket);
    if (c->win.n && h >= c->win.first && h + 2 <= c->win.first + c->win.n)
        return;
    uint32_t first = c->items[i].bucket, last = first;
    size_t k = i;
    while (k < c->n && c->items[k].bucket - last <= RWIN_GAP &&
           2 * (uint64_t)(c->items[k].bucket - first) + 2 <= RWIN_BLOCKS)
        last = c->items[k++].bucket;
    c->win.n = 0;
    if (last == first)
        return; /* a lone bucket: its own read */
    uint64_t t0 = now_ns();
    (void)bosc_rwin_fill(b, &c->win, h, 2 * (uint64_t)(last - first) + 2);
    add(&b->st.io_ns, now_ns() - t0);
    if (k < c->n) { /* the next run: as far as its window will read */
        uint32_t nfirst = c->items[k].bucket, nlast = nfirst;
        for (size_t m = k; m < c->n && c->items[m].bucket - nlast <= RWIN_GAP &&
                           2 * (uint64_t)(c->items[m].bucket - nfirst) + 2 <= RWIN_BLOCKS; m++)
            nlast = c->items[m].bucket;
        bosc_rwin_advise(b, home_of(b, nfirst), 2 * (uint64_t)(nlast - nfirst) + 2);
    }
}

/* Apply the items [0, n) of one bucket. Returns 0 or -errno (err set). */
static int sweep_bucket(struct bosc *b, struct sweep_ctx *c, struct item *it, size_t n, uint64_t gen,
                        char *err, size_t errlen)
{
    uint32_t bucket = it[0].bucket;
    c->vals.len = 0;
    size_t live = 0;
    /* Which states the log holds now (fresher than the sweep's D: a key changed
     * a moment ago is written once its group commit is done, not skipped). */
    uint64_t now_durable = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        it[i].written = 0;
        size_t off = c->vals.len;
        if (kvt_snapshot(b->t, it[i].d, now_durable, &c->vals, &it[i].snap))
            return -ENOMEM;
        it[i].voff = off;
        int kind = it[i].snap.kind;
        if (kind == KVT_SNAP_SKIP && it[i].snap.first_lsn && it[i].snap.first_lsn - 1 < c->flushed_bound)
            c->flushed_bound = it[i].snap.first_lsn - 1; /* the file lacks its changes from there */
        if (kind == KVT_SNAP_VALUE || kind == KVT_SNAP_DELETE)
            live++;
        else /* nothing to write (an absorbed insert, a FLUSHALL) or not yet: settled now */
            kvt_flushed(b->t, it[i].d, it[i].held, it[i].nheld, &it[i].snap, 0, 0, &b->q);
    }
    if (!live)
        return 0;
    sort_lsn(it, n); /* settled items last, updates in LSN order */
    int rc = bosc_chain_read_w(b, &c->win, &c->ovw, bucket, gen, &c->stream, &c->chain, &c->nchain, &c->capchain, NULL, err,
                               errlen);
    if (rc)
        return rc;
    if (live > c->cappresent) {
        uint8_t *p = realloc(c->present, live);
        if (p)
            c->present = p;
        uint64_t *t = realloc(c->tag, live * sizeof *t);
        if (t)
            c->tag = t;
        if (!p || !t)
            return -ENOMEM;
        c->cappresent = live;
    }
    memset(c->present, 0, live);
    for (size_t i = 0; i < live; i++) {
        uint32_t klen;
        const unsigned char *key = kvt_dnode_key(it[i].d, &klen);
        c->tag[i] = key_tag(key, klen);
    }
    c->out.len = 0;
    size_t dec_lo = c->ndec;
    struct rewrite w = {it, live, c->tag, &c->out, c->present, kvt_now_ms(), 0, 0, b, gen, c};
    int64_t before = bosc_stream_walk((unsigned char *)c->stream.p, c->stream.len, keep_rec, &w);
    if (before < 0)
        return bosc_stream_damaged(b, bucket, err, errlen);
    if (w.oom)
        return -ENOMEM;
    int64_t after = before;
    /* The latest state of each key wins: items are distinct keys (one node per key). */
    for (size_t i = 0; i < live; i++) {
        after -= c->present[i];
        if (it[i].snap.kind != KVT_SNAP_VALUE)
            continue;
        uint32_t klen;
        const unsigned char *key = kvt_dnode_key(it[i].d, &klen);
        unsigned char h[REC_HDR];
        put32(h, klen | (uint32_t)it[i].snap.type << REC_TYPE_SHIFT);
        put32(h + 4, it[i].snap.vlen);
        put64(h + 8, (uint64_t)it[i].snap.expire);
        if (it[i].snap.expire)
            ttl_mark(b, bucket, it[i].snap.expire);
        if (kvbuf_append(&c->out, (const char *)h, REC_HDR) || kvbuf_append(&c->out, (const char *)key, klen) ||
            kvbuf_append(&c->out, c->vals.p + it[i].voff, it[i].snap.vlen))
            return -ENOMEM;
        w.changed = 1;
        after++;
    }
    for (size_t i = 0; i < live; i++)
        it[i].present = c->present[i];
    size_t need = c->out.len ? (c->out.len + PAYLOAD - 1) / PAYLOAD : 1;
    if (w.changed && c->wb.n + need > WB_BLOCKS && (rc = batch_flush(b, c, gen, err, errlen)))
        return rc;
    if (atomic_load_explicit(&b->gen, memory_order_relaxed) != gen) {
        add(&b->st.records, live); /* FLUSHALL meanwhile: these states are gone or queued again */
        return 0;
    }
    if (w.changed && need <= WB_BLOCKS) {
        struct wb_bucket *x;
        rc = bosc_wb_stage(b, &c->wb, bucket, gen, &c->out, c->chain, c->nchain, &x);
        if (rc) {
            snprintf(err, errlen, "cannot write data file %s: %s", b->path, strerror(-rc));
            c->write_failed = rc != -ENOMEM;
            return rc;
        }
        x->after = (uint32_t)after;
        x->first_item = (size_t)(it - c->items);
        x->nitems = live;
        x->dec_lo = dec_lo;
        x->dec_hi = c->ndec;
        return 0; /* written and settled by batch_flush */
    }
    /* A chain longer than a batch (a huge value; the batch is empty: flushed
     * above), written on its own, as it goes; or an unchanged block, whose
     * entries learn whether their key is in it (a tombstone of a key that never
     * reached it becomes evictable). Both under gen_lock, the generation
     * checked there: no FLUSHALL between the check and the write. */
    pthread_mutex_lock(&b->gen_lock);
    if (atomic_load_explicit(&b->gen, memory_order_relaxed) != gen) {
        pthread_mutex_unlock(&b->gen_lock);
        add(&b->st.records, live);
        return 0;
    }
    if (w.changed && (rc = bosc_batches_commit(b, c, err, errlen))) {
        pthread_mutex_unlock(&b->gen_lock);
        return rc;
    }
    if (w.changed) {
        atomic_fetch_add_explicit(&b->ver[bucket], 1, memory_order_acq_rel);
        uint64_t t0 = now_ns();
        rc = chain_write(b, bucket, gen, &c->out, c->chain, c->nchain);
        if (!rc)
            bosc_batches_written(c, dec_lo, c->ndec);
        add(&b->st.io_ns, now_ns() - t0);
        if (!rc)
            atomic_store_explicit(&b->nkeys[bucket], (uint32_t)after, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->ver[bucket], 1, memory_order_release);
        if (rc) {
            pthread_mutex_unlock(&b->gen_lock);
            snprintf(err, errlen, "cannot write data file %s: %s", b->path, strerror(-rc));
            c->write_failed = rc != -ENOMEM;
            return rc;
        }
    }
    for (size_t i = 0; i < live; i++) {
        kvt_written(b->t, it[i].d, &it[i].snap, it[i].present);
        it[i].written = 1;
    }
    pthread_mutex_unlock(&b->gen_lock);
    add(&b->st.records, live);
    return 0;
}

/* A sweep failed writing or syncing (the disk is full, or failing): nothing
 * its current chunk wrote is known to be on disk, so every key it took that is
 * not settled yet -- from lo, the chunk's first item: the chunks before it are
 * synced, recorded and settled -- goes back on the queue, dirty, for the sweep
 * that retries (as a key whose block write was skipped). reached: the items
 * past the failed bucket, whose states were never taken. The blocks it wrote
 * (in the page cache, consistent with the table) are synced by the next sweep
 * before anything counts on them, even one with no keys (need_sync). */
static void requeue(struct bosc *b, struct sweep_ctx *c, size_t lo, size_t reached)
{
    uint64_t durable = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX;
    for (size_t k = lo; k < c->n; k++) {
        struct item *it = &c->items[k];
        if (k < reached && (it->snap.kind == KVT_SNAP_NONE || it->snap.kind == KVT_SNAP_SKIP))
            continue; /* settled in sweep_bucket */
        if (k >= reached)
            memset(&it->snap, 0, sizeof it->snap); /* no state taken: nothing the block holds */
        kvt_flushed(b->t, it->d, it->held, it->nheld, &it->snap, 0, durable, &b->q);
    }
    c->n = 0;
    c->need_sync = 1;
}

/* Wait (a bounded time) until the log holds LSN lsn. Returns 0, or -ETIMEDOUT. */
#define LOGGED_WAIT_MS 10000
static int wait_logged(struct bosc *b, uint64_t lsn)
{
    for (int i = 0; wal_durable_lsn(b->wal) < lsn; i++) {
        if (i >= LOGGED_WAIT_MS)
            return -ETIMEDOUT;
        usleep(1000);
    }
    return 0;
}

/* The keys of one chunk of the sweep, items [lo, hi) (whole buckets, their
 * chains written), are settled: the chains are synced, their home copies become
 * the synced ones and the bucket table records them (a sweep number of their
 * own: bosc_tab_done moves b->wseq on), the superblock write syncs the table,
 * the blocks the chains dropped are free, and the keys are marked clean (or
 * queued again). The flushed LSN moves only with the last chunk (last), once
 * every key the sweep took is settled: before it the superblock records the
 * flushed LSN it had (the log from there still holds every change). Returns 0
 * or -errno with err set: c->write_failed says the disk refused the sync or the
 * superblock (the keys not settled are queued again), else the file failed. */
static int settle_chunk(struct bosc *b, struct sweep_ctx *c, size_t lo, size_t hi, uint64_t gen, int last,
                        char *err, size_t errlen)
{
    int rc;
    if (b->ntouched || c->need_sync) { /* (a chunk that wrote no chain has nothing to sync) */
        uint64_t t1 = now_ns();
        if (fdatasync(b->fd)) {
            rc = -errno;
            snprintf(err, errlen, "cannot sync data file %s: %s", b->path, strerror(-rc));
            c->write_failed = 1;
            requeue(b, c, lo, hi);
            return rc;
        }
        c->need_sync = 0;
        add(&b->st.io_ns, now_ns() - t1);
        add(&b->st.syncs, 1);
    }
    /* The generation the superblock may record: a FLUSHALL's new one only once
     * the log holds its FLUSH record. Before that, a superblock with the new
     * generation would empty the file while a crash could still lose the
     * record: the restart would replay no FLUSH and miss every key the file
     * held (the FLUSHALL was never answered). Until then the superblock keeps
     * its generation and the flushed LSN stays (the log from there holds every
     * change). cur_gen and fl together: fl is its FLUSH's LSN, or a later one's. */
    uint64_t cur_gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    uint64_t fl = atomic_load_explicit(&b->flush_lsn, memory_order_acquire);
    int new_gen = b->wal && cur_gen != b->sb_gen;
    if (new_gen && b->ntouched && gen != b->sb_gen && (rc = wait_logged(b, fl))) {
        /* Chains of the new generation (states after the FLUSH, so its record
         * is durable or about to be) cannot be recorded under the old one,
         * where they read as empty: the log did not write it in time. */
        snprintf(err, errlen, "the log has not written FLUSHALL's record (LSN %llu): %s", (unsigned long long)fl,
                 strerror(-rc));
        c->write_failed = 1;
        requeue(b, c, lo, hi);
        return rc;
    }
    uint64_t rec_gen = !new_gen || wal_durable_lsn(b->wal) >= fl ? cur_gen : b->sb_gen;
    /* The chains written are synced: their home copies are the synced ones now,
     * and the bucket table records them (synced with the superblock below). */
    for (size_t k = 0; k < b->ntouched; k++)
        b->slot[b->touched[k]] ^= 1;
    if (b->ntouched && (rc = bosc_tab_write(b))) {
        snprintf(err, errlen, "cannot write the bucket table of %s: %s", b->path, strerror(-rc));
        return rc;
    }
    /* Blocks freed by this chunk are free once the chains that dropped them are synced. */
    for (size_t k = 0; k < b->nfreed; k++)
        bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, b->freed[k]);
    b->nfreed = 0;
    bosc_batches_settled(b, c); /* so do the batches that the replaced stream records alone held */
    uint64_t deferred = 0, evicted = 0, freed = 0;
    uint64_t durable_now = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX; /* >= every state written */
    /* Before the last chunk, keys left clean leave memory now if room is wanted
     * (after it, the flusher's eviction follows at once, as after a whole sweep). */
    int evict = !last && bosc_room_wanted(b);
    uint64_t low = kvt_max_memory(b->t) / 100 * LOW_PCT; /* (no further than the clock's eviction goes) */
    for (size_t k = lo; k < hi; k++) {
        struct item *it = &c->items[k];
        if (it->snap.kind == KVT_SNAP_NONE || it->snap.kind == KVT_SNAP_SKIP) {
            deferred += it->snap.kind == KVT_SNAP_SKIP;
            continue; /* settled in sweep_bucket */
        }
        if (!it->written) {
            c->any_skipped = 1;
            deferred++;
        }
        if (evict && kvt_used_memory(b->t) <= low)
            evict = 0;
        if (!evict) {
            kvt_flushed(b->t, it->d, it->held, it->nheld, &it->snap, it->written, durable_now, &b->q);
            continue;
        }
        uint64_t f = kvt_flushed_evict(b->t, it->d, it->held, it->nheld, &it->snap, it->written, durable_now, &b->q);
        freed += f;
        evicted += f != 0;
    }
    add(&b->st.deferred, deferred);
    add(&b->st.evicted, evicted);
    add(&b->st.evicted_bytes, freed);
    add(&b->st.chunk_evicted, evicted);
    /* The file now holds every change up to D, except those of keys whose state
     * was not durable yet (SKIP: the bound stops below the first change they
     * lack), unless a FLUSHALL made this sweep skip blocks: then the flushed LSN
     * stays where it was. */
    uint64_t flushed = atomic_load(&b->flushed_lsn);
    uint64_t bound = c->flushed_bound;
    if (last && !c->any_skipped && bound != UINT64_MAX && bound > flushed && rec_gen == gen && cur_gen == gen) {
        rc = bosc_sb_write(b, bound, gen);
        if (rc) { /* (the blocks are synced and their keys settled: the next sweep writes it) */
            snprintf(err, errlen, "cannot write the superblock of %s: %s", b->path, strerror(-rc));
            c->write_failed = 1;
            return rc;
        }
        atomic_store(&b->flushed_lsn, bound);
        flushed = bound;
        if (b->log_dir[0]) {
            int n = wal_truncate(b->log_dir, flushed);
            if (n > 0)
                add(&b->st.truncated, (uint64_t)n);
        }
    } else if (rec_gen != b->sb_gen || b->ntouched) {
        /* A FLUSHALL must reach the superblock even when the flushed LSN cannot
         * move (no log, blocks skipped, or a chunk before the last): its
         * generation is what empties the file. So must the bucket table's
         * sweep (it syncs the table's pages). */
        rc = bosc_sb_write(b, flushed, rec_gen);
        if (rc) {
            snprintf(err, errlen, "cannot write the superblock of %s: %s", b->path, strerror(-rc));
            c->write_failed = 1;
            requeue(b, c, hi, hi); /* the later chunks' keys (their states not taken) */
            return rc;
        }
    }
    if (b->ntouched)
        bosc_tab_done(b);
    bosc_batches_recorded(b);
    return 0;
}

/* Items a chunk of the sweep settles at most: about chunk_pct of the memory
 * bound, at the memory an entry takes now (table and key, what evicting it
 * frees), at least CHUNK_MIN_ITEMS (each chunk costs two syncs), or the count a
 * test set. SIZE_MAX: one chunk (no bound, or chunks off). */
#define CHUNK_MIN_ITEMS 1024
static size_t chunk_items(struct bosc *b)
{
    if (b->chunk_items)
        return b->chunk_items;
    uint64_t max = kvt_max_memory(b->t);
    if (!b->chunk_pct || !max)
        return SIZE_MAX;
    struct kvt_stats ts;
    kvt_get_stats(b->t, &ts);
    uint64_t per = ts.entries ? kvt_used_memory(b->t) / ts.entries : 0;
    if (per < 64)
        per = 64;
    uint64_t n = max / 100 * b->chunk_pct / per;
    return n < CHUNK_MIN_ITEMS ? CHUNK_MIN_ITEMS : n > SIZE_MAX ? SIZE_MAX : (size_t)n;
}

/* The item array of a sweep of much of memory (~90 bytes per dirty key, 4
 * more for the sort) is not counted against --max-memory: give it back after
 * the sweep rather than hold it between sweeps. (The sweep's peak stays.) */
#define KEEP_ITEMS 16384
static void release_items(struct sweep_ctx *c)
{
    if (c->cap <= KEEP_ITEMS)
        return;
    free(c->items);
    free(c->dest);
    c->items = NULL;
    c->dest = NULL;
    c->n = c->cap = c->capdest = 0;
}

/* One sweep: returns 0 or -errno with err set: c->write_failed says the disk
 * refused a write or sync (the keys are queued again and the flusher retries),
 * otherwise the data file is damaged or memory ran out, and the flusher stops. */
int bosc_sweep(struct bosc *b, struct sweep_ctx *c, char *err, size_t errlen)
{
    uint64_t t0 = now_ns(), counted = t0; /* counted: sweep time up to here is in the stats */
    /* A sweep the disk failed may have written blocks (and synced them) under
     * b->wseq without reaching bosc_tab_done: this one takes a new number, or a
     * bucket it writes again would hold two home copies of one sweep and the
     * older could be picked as the newer. */
    if (c->write_failed)
        b->wseq++;
    c->write_failed = 0;
    /* D and the generation together (no FLUSHALL between them), then the
     * barrier: every change with LSN <= D has queued its key. */
    pthread_mutex_lock(&b->flush_lock);
    uint64_t durable = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX;
    uint64_t gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    pthread_mutex_unlock(&b->flush_lock);
    bosc_batches_begin(b, c, gen);
    kvt_barrier(b->t);
    if (b->locked_queue)
        pthread_mutex_lock(&b->qlock);
    /* Newest first, as taken: a second walk to reverse the list cost 7 % of the
     * flusher (a cache miss per node); the items are put in queue order below. */
    struct ldu_node *list = ldu_take(&b->q);
    if (b->locked_queue)
        pthread_mutex_unlock(&b->qlock);
    int rc = 0;
    b->sweep_no++;
    b->ntouched = 0; /* (a sweep that failed may have written some: they are written again) */
    /* Nor are the blocks a failed sweep put on freed free: the chains that
     * dropped them were not synced as the buckets' chains (their copies did
     * not flip), so the synced chains still use them. They leak until the next
     * open's scan finds them unused; freeing them at this sweep's sync had a
     * later chain reuse a block a bucket's recorded chain still names. */
    b->nfreed = 0;
    c->n = 0;
    for (struct ldu_node *n = list, *next; n; n = next) {
        next = n->next;
        struct kvt_dnode *d = kvt_dnode_of(n);
        uint32_t *mark = kvt_dnode_sweep(d);
        if (*mark < c->n && c->items[*mark].d == d && c->items[*mark].nheld < 2) {
            c->items[*mark].held[c->items[*mark].nheld++] = n; /* its other node */
            continue;
        }
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 1024;
            struct item *ni = realloc(c->items, cap * sizeof *ni);
            if (!ni) {
                snprintf(err, errlen, "out of memory in the flusher");
                return -ENOMEM;
            }
            c->items = ni;
            c->cap = cap;
        }
        uint32_t klen;
        const unsigned char *key = kvt_dnode_key(d, &klen);
        struct item *it = &c->items[c->n];
        memset(it, 0, sizeof *it);
        it->d = d;
        it->bucket = bucket_of(b, key, klen);
        it->held[0] = n;
        it->nheld = 1;
        *mark = (uint32_t)c->n++;
    }
    /* Queue order (oldest first), as the sort keeps it within a bucket: the
     * items reversed, and a key's two nodes (an LDU object has two) put back in
     * the order queued (held[0] the older: kvt_flushed defers it). */
    for (size_t i = 0, j = c->n ? c->n - 1 : 0; i < j; i++, j--) {
        struct item t = c->items[i];
        c->items[i] = c->items[j];
        c->items[j] = t;
    }
    for (size_t i = 0; i < c->n; i++)
        if (c->items[i].nheld == 2) {
            struct ldu_node *t = c->items[i].held[0];
            c->items[i].held[0] = c->items[i].held[1];
            c->items[i].held[1] = t;
        }
    if (c->n > 1 && (rc = sort_items(b, c))) { /* the sweep goes up the file */
        snprintf(err, errlen, "out of memory in the flusher");
        return rc; /* (nothing taken yet is lost: the same as a failed allocation above) */
    }
    c->any_skipped = 0;
    c->flushed_bound = durable;
    size_t i = 0, lo = 0, chunk = chunk_items(b);
    c->win.n = c->ovw.n = 0;
    while (i < c->n && !rc) {
        size_t j = i;
        while (j < c->n && c->items[j].bucket == c->items[i].bucket)
            j++;
        window_for(b, c, i);
        rc = sweep_bucket(b, c, c->items + i, j - i, gen, err, errlen);
        i = j;
        if (rc || i - lo < chunk || i == c->n)
            continue;
        /* A chunk's buckets are applied: write what is staged, then sync,
         * record and settle them, so their keys can be evicted now, not at the
         * end of the sweep. */
        if ((rc = batch_flush(b, c, gen, err, errlen)))
            break;
        if ((rc = settle_chunk(b, c, lo, i, gen, 0, err, errlen)))
            return rc; /* (what was not settled is queued again, or the file failed) */
        lo = i;
        c->ovw.n = 0; /* (the blocks it read may be reused now: never read through it again) */
        add(&b->st.chunks, 1);
        uint64_t now = now_ns(); /* (a sweep of gigabytes runs for many seconds: INFO counts it as it goes) */
        add(&b->st.sweep_ns, now - counted);
        counted = now;
        bosc_chunk_done(b);
    }
    /* the last batch (after an error too: what is staged is written or undone) */
    int frc = batch_flush(b, c, gen, err, errlen);
    if (!rc)
        rc = frc;
    if (rc) {
        if (c->write_failed)
            requeue(b, c, lo, i);
        return rc;
    }
    if ((rc = settle_chunk(b, c, lo, c->n, gen, 1, err, errlen)))
        return rc;
    uint64_t end = now_ns(), took = end - t0;
    add(&b->st.sweeps, 1);
    add(&b->st.sweep_ns, end - counted);
    latmon_add(atomic_load_explicit(&b->latmon, memory_order_acquire), LM_FLUSHER_SWEEP, took);
    kvlog(took > 2000000000u ? KVLOG_NOTICE : KVLOG_DEBUG, "data file sweep: %zu keys in %.3f s%s", c->n,
          (double)took / 1e9, took > 2000000000u ? " (slow: the disk is behind)" : "");
    release_items(c);
    return 0;
}
