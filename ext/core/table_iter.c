/* table_iter.c - walking the keys in memory: kvt_scan (SCAN, KEYS) and
 * kvt_random_key (RANDOMKEY). Both take one shard lock at a time, like every
 * other operation, and never change anything (an expired key is skipped, not
 * reclaimed: the active expiry cycle and the next access do that).
 *
 * SCAN's guarantee comes from Redis's reversed-bit cursor (dict.c's dictScan):
 * within a shard the cursor counts up from the high bit of the bucket index,
 * so when a bucket array doubles or halves between two calls, the buckets
 * already visited map onto buckets that sort before the cursor in the new size
 * too; during an incremental rehash both arrays are visited, the larger one at
 * every expansion of the smaller's bucket. A key present in its shard for the
 * whole iteration is therefore returned at least once (maybe more than once). */
#define _GNU_SOURCE
#include <stdint.h>
#include <time.h>

#include "core/table.h"
#include "core/table_int.h"

#define CURSOR_BITS 54       /* bucket cursor bits above the shard's 8 */

static uint64_t rev64(uint64_t v)
{
    v = ((v >> 1) & 0x5555555555555555ull) | ((v & 0x5555555555555555ull) << 1);
    v = ((v >> 2) & 0x3333333333333333ull) | ((v & 0x3333333333333333ull) << 2);
    v = ((v >> 4) & 0x0f0f0f0f0f0f0f0full) | ((v & 0x0f0f0f0f0f0f0f0full) << 4);
    return __builtin_bswap64(v);
}

/* The cursor after the buckets that v & m names: the next one in reversed-bit order. */
static uint64_t next_cursor(uint64_t v, uint64_t m)
{
    v |= ~m;
    return rev64(rev64(v) + 1);
}

struct walk {
    kvt_key_fn fn;
    void *arg;
    int64_t now;
    unsigned found;
};

static void visit(struct walk *w, struct kvt_entry *e)
{
    for (; e; e = e->next) {
        if ((e->flags & E_TOMB) || (e->expire_ms && e->expire_ms <= w->now))
            continue;
        w->fn(w->arg, (const char *)e->data, e->klen, entry_type(e));
        w->found++;
    }
}

/* Visit the buckets cursor v names in shard s (locked); returns the next cursor, 0 when done. */
static uint64_t scan_step(struct shard *s, uint64_t v, struct walk *w)
{
    if (!s->size[0])
        return 0;
    if (s->rehashidx < 0) {
        uint64_t m = s->size[0] - 1;
        visit(w, s->ht[0][v & m]);
        return next_cursor(v, m);
    }
    int small = s->size[0] <= s->size[1] ? 0 : 1;
    uint64_t m0 = s->size[small] - 1, m1 = s->size[!small] - 1;
    visit(w, s->ht[small][v & m0]);
    do { /* every bucket of the larger array that the smaller's bucket expands to */
        visit(w, s->ht[!small][v & m1]);
        v = next_cursor(v, m1);
    } while (v & (m0 ^ m1));
    return v;
}

uint64_t kvt_scan(struct kv_table *t, uint64_t cursor, unsigned count, kvt_key_fn fn, void *arg)
{
    unsigned si = (unsigned)(cursor & 0xff);
    uint64_t v = (cursor >> 8) & ((1ull << CURSOR_BITS) - 1);
    struct walk w = {fn, arg, now_ms(), 0};
    uint64_t budget = (uint64_t)(count ? count : 1) * 10; /* buckets, as Redis's SCAN bounds its work */
    while (si < KVT_SHARDS && w.found < count && budget) {
        struct shard *s = &t->shards[si];
        /* An empty shard holds no key that is present for the whole scan. */
        if (!v && !atomic_load_explicit(&s->used, memory_order_relaxed)) {
            si++;
            continue;
        }
        shard_lock(s);
        do {
            v = scan_step(s, v, &w);
            budget--;
        } while (v && w.found < count && budget);
        shard_unlock(s);
        if (!v)
            si++;
    }
    return si >= KVT_SHARDS ? 0 : v << 8 | si;
}

static __thread uint64_t rnd_state;

static uint64_t rnd(void)
{
    if (!rnd_state) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rnd_state = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uintptr_t)&rnd_state ^ 1;
    }
    rnd_state ^= rnd_state << 13; /* xorshift64 */
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

/* A live key of chain e: the k-th (mod their number). Returns it or NULL. */
static struct kvt_entry *pick(struct kvt_entry *e, int64_t now, uint64_t k)
{
    unsigned n = 0;
    for (struct kvt_entry *x = e; x; x = x->next)
        n += !(x->flags & E_TOMB) && !(x->expire_ms && x->expire_ms <= now);
    if (!n)
        return NULL;
    k %= n;
    for (; e; e = e->next)
        if (!(e->flags & E_TOMB) && !(e->expire_ms && e->expire_ms <= now) && !k--)
            return e;
    return NULL;
}

/* Look for a live key in shard si: in a random bucket (exhaustive = 0) or in
 * all of them. Calls fn for it; returns 1 if found. */
static int random_in(struct kv_table *t, unsigned si, int exhaustive, int64_t now, kvt_key_fn fn, void *arg)
{
    struct shard *s = &t->shards[si];
    if (!atomic_load_explicit(&s->used, memory_order_relaxed))
        return 0;
    shard_lock(s);
    struct kvt_entry *found = NULL;
    for (int i = 0; i < 2 && !found; i++) {
        if (!s->size[i])
            continue;
        if (!exhaustive)
            found = pick(s->ht[i][rnd() & (s->size[i] - 1)], now, rnd());
        for (uint64_t b = 0; exhaustive && b < s->size[i] && !found; b++)
            found = pick(s->ht[i][b], now, rnd());
    }
    if (found)
        fn(arg, (const char *)found->data, found->klen, entry_type(found));
    shard_unlock(s);
    return found != NULL;
}

int kvt_random_key(struct kv_table *t, kvt_key_fn fn, void *arg)
{
    int64_t now = now_ms();
    /* Random shard, random bucket, random key of its chain (Redis is not
     * uniform either); then, so that a sparse table still answers, the first
     * live key from a random starting shard on. */
    for (int tries = 0; tries < 64; tries++)
        if (random_in(t, (unsigned)(rnd() % KVT_SHARDS), 0, now, fn, arg))
            return 1;
    unsigned start = (unsigned)(rnd() % KVT_SHARDS);
    for (unsigned i = 0; i < KVT_SHARDS; i++)
        if (random_in(t, (start + i) % KVT_SHARDS, 1, now, fn, arg))
            return 1;
    return 0;
}
