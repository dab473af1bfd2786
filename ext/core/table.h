/* table.h - the concurrent in-memory hash table every kvstore front end shares.
 *
 * Keys and values are binary-safe byte strings. The table is split into
 * KVT_SHARDS shards, each a chained hash table with its own mutex and its own
 * incremental rehash (two bucket arrays, a few buckets migrated per operation),
 * so there is no global lock and no resize pause. Memory is accounted exactly
 * (malloc_usable_size of every allocation, bucket arrays included) and bounded:
 * a write that would pass max_memory fails with -ENOMEM and nothing is evicted.
 *
 * Thread safety: every kvt_* function may be called from any thread at any time.
 * Callbacks (kvt_read_fn) run with the key's shard locked: they must be short and
 * must not call back into the table.
 */
#ifndef KV_TABLE_H
#define KV_TABLE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/siphash.h" /* kvt_hash, kvt_hash_keyed */

#define KVT_SHARDS 256
#define KVT_MAX_VALUE (512u * 1024 * 1024) /* Redis's proto-max-bulk-len */

struct kv_table;

/* Flags for kvt_set. */
#define KVT_NX (1 << 0)      /* only set if the key does not exist */
#define KVT_XX (1 << 1)      /* only set if the key exists */
#define KVT_KEEPTTL (1 << 2) /* keep the key's current expire time */
#define KVT_NOBOUND (1 << 3) /* the caller checked the memory bound for a whole batch (MSET) */

/* Called with a value while its shard is locked. */
typedef void (*kvt_read_fn)(void *arg, const char *val, size_t vlen);

struct kvt_stats {
    uint64_t keys;          /* live keys (expired but not yet reclaimed keys included), in
                               memory and (spill mode) in the data file */
    uint64_t entries;       /* entries in memory (spill mode: tombstones included) */
    uint64_t disk_keys;     /* keys in the data file, as of the flusher's last write */
    uint64_t expires;       /* keys with an expire time */
    uint64_t used_memory;   /* bytes allocated by the table, exact */
    uint64_t max_memory;    /* 0 = unbounded */
    uint64_t buckets;       /* bucket slots over all shards */
    uint64_t rehashing;     /* shards with a rehash in progress */
    uint64_t expired_keys;  /* keys removed because their time passed */
    uint64_t oom_rejections;/* writes refused by the memory bound */
    uint64_t hits, misses;  /* lookups that found / did not find a live key */
};

/* Durability hook. When set, every mutation is logged before it is applied,
 * with the key's shard lock held (so per-key log order is apply order): SET and
 * the results of INCR/APPEND as op 1 with the full new value (v1 then v2) and the
 * expire time, DEL as op 2, FLUSHALL as op 3 (with every shard locked). The
 * logger returns the record's LSN (> 0) or -errno; on error the mutation is not
 * applied and the operation returns that error. Expiry is not logged: replay
 * applies the absolute expire time. Entries remember the LSN that wrote them. */
typedef int64_t (*kvt_log_fn)(void *arg, int op, const void *key, size_t klen, const void *v1,
                              size_t n1, const void *v2, size_t n2, int64_t expire_ms);
void kvt_set_log(struct kv_table *t, kvt_log_fn fn, void *arg);

/* The largest LSN that the calling thread's table operations since its last
 * kvt_lsn_reset() wrote or read (0 without a logger): a reply to a request must
 * not leave before this LSN is durable, or a client could see a write that a
 * crash would undo. Thread-local, read and reset around every request: inline,
 * and in the initial-exec TLS model (a %fs-relative load instead of a call to
 * __tls_get_addr, which a shared library's default model makes each access pay;
 * 8 bytes of the static TLS surplus that glibc keeps for libraries loaded late). */
extern __thread uint64_t kvt_touched_lsn __attribute__((tls_model("initial-exec")));
static inline void kvt_lsn_reset(void) { kvt_touched_lsn = 0; }
static inline uint64_t kvt_lsn_touched(void) { return kvt_touched_lsn; }
/* The reply also depends on LSN lsn (e.g. DBSIZE on everything appended so far). */
static inline void kvt_lsn_touch(uint64_t lsn)
{
    if (lsn > kvt_touched_lsn)
        kvt_touched_lsn = lsn;
}

/* Create a table bounded by max_memory bytes (0 = unbounded). Returns 0 or -errno. */
int kvt_create(struct kv_table **out, uint64_t max_memory);
void kvt_destroy(struct kv_table *t);
void kvt_set_max_memory(struct kv_table *t, uint64_t max_memory);
uint64_t kvt_max_memory(struct kv_table *t);

/* Look a key up; if live, call fn(arg, value, len) under the shard lock.
 * Returns 1 found, 0 not found, -ENODATA (spill mode) not in memory and maybe in
 * its data-file block: load it (bosc) and retry. Every key operation below may
 * return -ENODATA the same way, with nothing changed, except a plain kvt_set
 * (no NX/XX/KEEPTTL/old_fn), which writes blind. */
int kvt_get(struct kv_table *t, const void *key, size_t klen, kvt_read_fn fn, void *arg);

/* Copy a value into buf (cap bytes). Returns the value length (which may be
 * larger than cap: nothing copied then, call again with a larger buffer), or
 * -ENOENT when the key is absent. */
int64_t kvt_get_copy(struct kv_table *t, const void *key, size_t klen, void *buf, size_t cap);

/* Set key to value. expire_ms: absolute unix time in ms, 0 = no expire.
 * old_fn, if not NULL, is called with the previous value (SET ... GET) before it
 * is replaced. Returns 1 set, 0 not set because of NX/XX, -ENOMEM over the memory
 * bound, -E2BIG value or key too long. */
int kvt_set(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen,
            int flags, int64_t expire_ms, kvt_read_fn old_fn, void *old_arg);

/* Delete. Returns 1 if a live key was removed, 0 otherwise, -errno if logging failed. */
int kvt_del(struct kv_table *t, const void *key, size_t klen);
/* Delete without loading (log replay; a multi-key DEL racing an eviction): a key
 * that is not in memory gets a tombstone and 0 is returned (whether the block
 * held it is not known). */
int kvt_del_blind(struct kv_table *t, const void *key, size_t klen);

/* Returns 1 if the key exists and is live. */
int kvt_exists(struct kv_table *t, const void *key, size_t klen);

/* Add delta to the decimal integer stored at key (absent = 0), store it back.
 * Returns 0 with *result set; -EINVAL value is not an integer; -ERANGE overflow;
 * -ENOMEM over the memory bound. */
int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result);

/* Append to the value (absent = empty). Returns the new length, -ENOMEM, -E2BIG. */
int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen);

/* Length of the value, 0 when absent. */
int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen);

/* Remove every key. Returns 0 or -errno if logging failed (nothing removed then). */
int kvt_flush(struct kv_table *t);

uint64_t kvt_count(struct kv_table *t);
uint64_t kvt_used_memory(struct kv_table *t);
void kvt_get_stats(struct kv_table *t, struct kvt_stats *st);

/* Background housekeeping for shards [first, first+n): finish pending rehash
 * steps and reclaim expired keys, doing at most `budget` bucket visits.
 * Called periodically by pollers (each poller owns a slice of the shards).
 * Returns the number of keys reclaimed. */
int kvt_housekeep(struct kv_table *t, unsigned first, unsigned n, unsigned budget);

/* Batched lookups (MICA-style): for a batch of keys, call stage 1 for every key
 * (pulls the shard's lock line), then stage 2 for every key (pulls the bucket
 * slot), then run the operations; their cache misses then overlap instead of
 * being paid one after another. Lock-free, never dereferences anything. */
void kvt_prefetch(struct kv_table *t, uint64_t h, int stage);

/* ---- spill mode: a data file (bosc.c) behind the table.
 *
 * Every mutation queues its key once on an LDU queue (ldu.h) for the flusher,
 * which writes the key's current state to its block and then calls
 * kvt_flushed; clean entries (in their block, durable) can be evicted
 * (kvt_evict) and are loaded back on demand (kvt_load). A deleted key that may
 * be in its block stays as a tombstone until its deletion is flushed. With the
 * memory bound reached, writes fail with -ENOMEM; the server holds them until
 * the flusher made room (kvt_spill_stuck says when waiting cannot help). */
struct ldu_queue;
struct ldu_node;
struct kvbuf;
struct kvt_spill {
    struct ldu_queue *queue; /* the flusher's dirty queue */
    pthread_mutex_t *queue_lock; /* NULL: LDU, lock-free; else every queue operation takes it
                                    and removes are not absorbed (the simple queue, for comparison) */
    /* 1 if the key's block may hold it (called for keys not in memory, shard lock held) */
    int (*maybe_on_disk)(void *arg, const void *key, size_t klen);
    /* FLUSHALL, around the logging of its record: BEGIN, then COMMIT (every block
     * is empty from now on) or ABORT (the log refused it) */
    void (*flushall)(void *arg, int phase);
    int (*load_sync)(void *arg, const void *key, size_t klen); /* blocking load (kvt_load_sync) */
    int (*make_room)(void *arg);   /* blocking: sweep and evict (kvt_wait_memory) */
    void *arg;
};
enum { KVT_FLUSH_BEGIN, KVT_FLUSH_COMMIT, KVT_FLUSH_ABORT };
/* Attach (before the table is shared). */
void kvt_set_spill(struct kv_table *t, const struct kvt_spill *sp);
void kvt_disk_keys_add(struct kv_table *t, int64_t d);
void kvt_disk_keys_set(struct kv_table *t, int64_t v);
void kvt_set_spill_stuck(struct kv_table *t, int stuck);
int kvt_spill_stuck(struct kv_table *t);
/* Lock and unlock every shard: every mutation begun before has finished (and
 * queued its key). */
void kvt_barrier(struct kv_table *t);

/* The flusher's view of a queued key. */
struct kvt_dnode;
struct kvt_dnode *kvt_dnode_of(struct ldu_node *n);
const unsigned char *kvt_dnode_key(const struct kvt_dnode *d, uint32_t *klen);
uint32_t *kvt_dnode_sweep(struct kvt_dnode *d); /* a word private to the flusher */
enum { KVT_SNAP_NONE, KVT_SNAP_VALUE, KVT_SNAP_DELETE, KVT_SNAP_SKIP };
struct kvt_snap {
    int kind;                /* KVT_SNAP_*: nothing to do, write value, delete key, or skip
                                (its state is not durable yet: a later sweep writes it) */
    uint64_t lsn;            /* of the state taken */
    uint64_t first_lsn;      /* SKIP: the file lacks this key's changes from this LSN on */
    int64_t expire;
    uint32_t vlen;           /* value appended to the caller's buffer */
};
/* Take the key's current state (claims its pending marks); a state with an LSN
 * above durable is not taken (SKIP). Returns 0 or -ENOMEM. */
int kvt_snapshot(struct kv_table *t, struct kvt_dnode *d, uint64_t durable, struct kvbuf *val,
                 struct kvt_snap *out);
/* Right after the block write: the block now holds the snapshot (was_in_block:
 * it held the key before). Keeps the key count exact. */
void kvt_written(struct kv_table *t, struct kvt_dnode *d, const struct kvt_snap *snap, int was_in_block);
/* After the block write (written = 1) is synced, or when it was skipped (0):
 * mark the entry clean if the block and the log (LSN <= durable) cover it, else
 * queue it again (held[0] deferred on q); release the held nodes; free the node
 * when done with it. held: the nodes of d taken from the queue. */
void kvt_flushed(struct kv_table *t, struct kvt_dnode *d, struct ldu_node **held, int nheld,
                 const struct kvt_snap *snap, int written, uint64_t durable, struct ldu_queue *q);
/* Evict clean, unreferenced entries (CLOCK) until used memory <= target or two
 * turns of the clock found nothing more. Returns bytes freed; adds to *evicted. */
uint64_t kvt_evict(struct kv_table *t, uint64_t target, uint64_t *evicted);
/* Insert what a block holds for key (found) or says about it (absent) as a
 * clean entry, unless memory already has the key. still_valid(arg) is called
 * under the shard lock: 0 means the block changed since it was read (-EAGAIN:
 * read it again). Returns 1 inserted, 0 memory had it, -errno. */
int kvt_load(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen, int found,
             int64_t expire_ms, int (*still_valid)(void *arg), void *arg);
/* Blocking load through the spill hook (Python callers). Returns 0 or -errno. */
int kvt_load_sync(struct kv_table *t, const void *key, size_t klen);
/* After -ENOMEM (Python callers): wait for the flusher to make room. Returns 0
 * (try again) or -ENOMEM when waiting cannot help (no data file, nothing to evict). */
int kvt_wait_memory(struct kv_table *t);

#endif
