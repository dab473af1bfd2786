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
#include <errno.h>
#include <stdint.h>

#include "core/siphash.h" /* kvt_hash, kvt_hash_keyed */

#define KVT_SHARDS 256
#define KVT_MAX_VALUE (512u * 1024 * 1024) /* Redis's proto-max-bulk-len */

struct kv_table;

/* Value types. A key holds a string, or a hash whose value is its fields
 * encoded as one byte string (core/hashenc.h): the table stores, logs, spills
 * and accounts both alike and only keeps the type beside the value. Or a
 * stream (core/stream.h): a structure the entry points to, changed in place by
 * deltas (kvt_xapply), written whole as its bytes (xs_encode) to the data file
 * and where a command sets a whole state (COPY, RENAME). An operation meant for
 * one type on a key of another returns KVT_WRONGTYPE. */
enum { KVT_STRING = 0, KVT_HASH = 1, KVT_STREAM = 2 };
#define KVT_WRONGTYPE (-EPROTOTYPE)

/* Flags for kvt_set. */
#define KVT_NX (1 << 0)      /* only set if the key does not exist */
#define KVT_XX (1 << 1)      /* only set if the key exists */
#define KVT_KEEPTTL (1 << 2) /* keep the key's current expire time */
#define KVT_NOBOUND (1 << 3) /* the caller checked the memory bound for a whole batch (MSET) */
#define KVT_TYPE_HASH (1 << 4) /* the value is an encoded hash (log replay, data-file load) */
#define KVT_TYPE_STREAM (1 << 5) /* the value is a stream's bytes (log replay) */

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
    uint64_t batches_evicted, batches_loaded; /* stream batches that left memory and came back */
};

/* Durability hook. When set, every mutation is logged before it is applied,
 * with the key's shard lock held (so per-key log order is apply order): every
 * write (SET, INCR, APPEND, EXPIRE, HSET, ...) as KVT_LOG_SET with the key's
 * whole new state (value v1 then v2, the expire time, KVT_LOG_HASH or'ed into op
 * for a hash), a deletion (DEL, and an expiry when it happens, lazily or by the
 * active cycle) as KVT_LOG_DEL, FLUSHALL as KVT_LOG_FLUSH (with every shard
 * locked). kvt_tx_begin/kvt_tx_end bracket a unit with KVT_LOG_UNIT_BEGIN and
 * KVT_LOG_UNIT_END (no key): every record between them is applied at recovery
 * all or not at all; UNIT_END returns the LSN of the record that closes the
 * unit (0 when the unit logged nothing). The logger returns the record's LSN
 * (> 0) or -errno; on error the mutation is not applied and the operation
 * returns that error. Entries remember the LSN that wrote them. */
enum { KVT_LOG_SET = 1, KVT_LOG_DEL = 2, KVT_LOG_FLUSH = 3, KVT_LOG_UNIT_BEGIN = 4, KVT_LOG_UNIT_END = 5,
       KVT_LOG_XOP = 6 };
#define KVT_LOG_OP(op) ((op) & 0x0f)
#define KVT_LOG_HASH 0x10    /* with KVT_LOG_SET: the value is an encoded hash */
#define KVT_LOG_STREAM 0x20  /* with KVT_LOG_SET: the value is a stream's bytes (xs_encode) */
/* KVT_LOG_XOP: a change to a stream key, v1 = its delta (core/stream.h; empty
 * when only the expire time changed), expire_ms = the key's expire time after it. */
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

/* The clock every expire time is read against: unix time in ms, plus an
 * offset that tests move to make time pass (0 in service). */
int64_t kvt_now_ms(void);
void kvt_set_clock_offset(int64_t ms);

/* Create a table bounded by max_memory bytes (0 = unbounded). Returns 0 or -errno. */
int kvt_create(struct kv_table **out, uint64_t max_memory);
void kvt_destroy(struct kv_table *t);
void kvt_set_max_memory(struct kv_table *t, uint64_t max_memory);
uint64_t kvt_max_memory(struct kv_table *t);

/* Look a string key up; if live, call fn(arg, value, len) under the shard lock.
 * KVT_WRONGTYPE for a key of another type.
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

/* A key's state as kvt_apply's function sees it. */
struct xstream;
struct kvbuf;
struct kvt_state {
    int exists;              /* 0: absent (or expired); the rest is then 0 */
    int type;                /* KVT_STRING, KVT_HASH, KVT_STREAM */
    const char *val;         /* valid only during the call (a stream: NULL, vlen 0) */
    size_t vlen;
    int64_t expire_ms;       /* absolute unix ms, 0 = none */
    struct xstream *stream;  /* KVT_STREAM: the stream (read it; kvt_xapply changes it) */
};
/* What kvt_apply's function wants done. Preset to KVT_KEEP. */
enum { KVT_KEEP, KVT_PUT, KVT_DELETE };
struct kvt_change {
    int action;              /* KVT_KEEP: nothing (a read); KVT_PUT: store val/type/expire_ms;
                                KVT_DELETE: remove the key. A PUT of type KVT_STREAM: val
                                NULL and n1 0 on a stream keep it (only expire_ms changes),
                                else val is a stream's bytes (xs_encode), decoded */
    int type;
    const void *val;         /* KVT_PUT: the new value, v1 then v2 (either may be empty; v1
                                may point into the state's own value, e.g. EXPIRE's) */
    size_t n1;
    const void *v2;
    size_t n2;
    int64_t expire_ms;       /* KVT_PUT: the new expire time (preset to the current one) */
    size_t extra;            /* KVT_PUT: spare bytes to reserve if a new entry is made
                                (a value that grows: APPEND, SETRANGE) */
    int nobound;             /* KVT_PUT: skip the memory bound (the caller checked it) */
};
/* The general read-modify-write: with the key's shard locked, call
 * fn(arg, &state, &change); fn decides from the state and returns a result >= 0
 * (kept for the caller) or -errno (nothing is changed, kvt_apply returns it).
 * fn must be short and must not call into the table. Then the change is logged
 * and applied. Returns fn's result, or -ENODATA (key in its data-file block:
 * load it and call again; fn was not called), or the write's error (-ENOMEM,
 * -E2BIG, the log's) after fn ran: the caller discards what fn produced. */
typedef int64_t (*kvt_apply_fn)(void *arg, const struct kvt_state *cur, struct kvt_change *ch);
int64_t kvt_apply(struct kv_table *t, const void *key, size_t klen, kvt_apply_fn fn, void *arg);

/* A change to a stream key (XADD, XGROUP, XREADGROUP, ...): with the key's
 * shard locked, fn(arg, &state, delta) reads the state (a stream, another type,
 * or absent) and appends to delta the change it decides (core/stream.h's
 * deltas; a key it creates starts with XOP_CREATE), or nothing for a read.
 * fn returns a result >= 0 (kept for the caller) or -errno (nothing changes).
 * It may update what is not logged (a consumer's seen time), and must be short.
 * A delta is then held against the memory bound (-ENOMEM, nothing changed),
 * logged (KVT_LOG_XOP) and applied (xs_apply). Returns fn's result, -ENODATA
 * (load the key first; fn not called), or the write's error. */
typedef int64_t (*kvt_xapply_fn)(void *arg, const struct kvt_state *cur, struct kvbuf *delta);
int64_t kvt_xapply(struct kv_table *t, const void *key, size_t klen, kvt_xapply_fn fn, void *arg);
/* Log replay of a KVT_LOG_XOP record with LSN lsn: applied unless the key's
 * stream already holds it (a data-file load of a later state) or the key is not
 * a stream and the delta does not create one (a later record removed it).
 * Returns 1 applied, 0 skipped, -errno. */
int kvt_xreplay(struct kv_table *t, const void *key, size_t klen, const void *delta, size_t n, int64_t expire_ms,
                uint64_t lsn);
/* Called with a key's name (its shard locked) when the stream it held is gone
 * (deleted, expired, overwritten, flushed): blocking readers of it must look
 * again. fn must be short and must not call into the table. Set before use. */
void kvt_set_gone_hook(struct kv_table *t, void (*fn)(void *arg, const void *key, size_t klen), void *arg);
/* The batch hook (the pull cache, frontend/pullcache.h): called with a stream key's
 * name, its shard locked, for each batch event of a change kvt_xapply makes
 * (core/stream.h XS_EV_*: sealed, changed, gone) and with b NULL when the whole
 * stream is gone (as the gone hook). fn must be short and must not call into the
 * table. Set before use (NULL to unset once nothing changes streams). */
struct xs_batch;
typedef void (*kvt_batch_fn)(void *arg, const void *key, size_t klen, const struct xs_batch *b, int ev);
void kvt_set_batch_hook(struct kv_table *t, kvt_batch_fn fn, void *arg);
/* A reader (kvt_apply's fn, shard locked) saw sealed batch b of key: the hook gets
 * it as XS_EV_SEALED (a pull that missed the cache fills it). */
void kvt_batch_seen(struct kv_table *t, const void *key, size_t klen, const struct xs_batch *b);

/* Delete. Returns 1 if a live key was removed, 0 otherwise, -errno if logging failed. */
int kvt_del(struct kv_table *t, const void *key, size_t klen);
/* Delete without loading (log replay; a multi-key DEL racing an eviction): a key
 * that is not in memory gets a tombstone and 0 is returned (whether the block
 * held it is not known). */
int kvt_del_blind(struct kv_table *t, const void *key, size_t klen);

/* Returns 1 if the key exists and is live. */
int kvt_exists(struct kv_table *t, const void *key, size_t klen);

/* MEMORY USAGE: the bytes the table charges for a live key (its entry as
 * allocated, key and value inside, its dirty-queue node if it has one) plus its
 * bucket slot. 0 absent, -ENODATA in its data-file block only (load it first). */
int64_t kvt_key_memory(struct kv_table *t, const void *key, size_t klen);

/* Add delta to the decimal integer stored at key (absent = 0), store it back.
 * Returns 0 with *result set; -EINVAL value is not an integer; -ERANGE overflow;
 * -ENOMEM over the memory bound; KVT_WRONGTYPE. (kvt_append and kvt_strlen
 * return KVT_WRONGTYPE the same way.) */
int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result);

/* Append to the value (absent = empty). Returns the new length, -ENOMEM, -E2BIG. */
int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen);

/* Length of the value, 0 when absent. */
int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen);

/* A version of key for WATCH: *ver changes whenever the key is written,
 * deleted or expires (it may also change when the key did not: a spurious
 * EXEC abort, never a missed one). Returns 1 exists, 0 absent, -ENODATA. */
int kvt_version(struct kv_table *t, const void *key, size_t klen, uint64_t *ver);

/* Transactions (MULTI/EXEC, and multi-key commands that must be atomic: RENAME,
 * COPY, MSETNX). kvt_tx_begin locks every shard for the calling thread; until
 * kvt_tx_end, that thread's kvt_* calls run without taking shard locks (they
 * hold them all) and no other thread reads or writes the table, so the calls in
 * between are isolated; their log records form one unit (see kvt_log_fn), so a
 * crash keeps all of them or none. kvt_tx_end unlocks; it returns the LSN that
 * closes the unit (the reply must wait for it; also touched) or 0, or -errno
 * when the log refused to close it. Not nested. kvt_tx_begin returns 0 or the
 * log's -errno (nothing locked then). */
int kvt_tx_begin(struct kv_table *t);
int64_t kvt_tx_end(struct kv_table *t);
extern __thread int kvt_tx_held __attribute__((tls_model("initial-exec")));
/* Changes made (logged, or counted without a log) since kvt_tx_begin on this thread. */
extern __thread unsigned kvt_tx_changes;

/* Iterate the keys in memory, Redis's SCAN guarantee: a key present in memory
 * for the whole iteration is returned at least once, whatever rehashing or
 * resizing happens between calls. cursor 0 starts; the next cursor is returned
 * (0: done). Visits whole buckets until about count entries were seen, calling
 * fn(arg, key, klen, type) under the shard lock for every live, unexpired key
 * (fn must be short). The cursor packs the shard (low 8 bits) and a reversed-bit
 * bucket cursor within the shard (bits 8..61); bits 62 and 63 are always 0 in a
 * cursor this returns, free for the caller (a data-file phase). */
typedef void (*kvt_key_fn)(void *arg, const char *key, size_t klen, int type);
uint64_t kvt_scan(struct kv_table *t, uint64_t cursor, unsigned count, kvt_key_fn fn, void *arg);

/* A random live key in memory: fn(arg, key, klen, type) is called for it under
 * its shard lock. Returns 1, or 0 when none was found after a bounded search. */
int kvt_random_key(struct kv_table *t, kvt_key_fn fn, void *arg);

/* Remove every key. Returns 0 or -errno if logging failed (nothing removed then);
 * -EDEADLK inside a transaction on a table with a data file (not supported). */
int kvt_flush(struct kv_table *t);

uint64_t kvt_count(struct kv_table *t);
uint64_t kvt_used_memory(struct kv_table *t);
void kvt_get_stats(struct kv_table *t, struct kvt_stats *st);

/* Background housekeeping for shards [first, first+n): finish pending rehash
 * steps and reclaim expired keys (each logged as a deletion), doing at most
 * `budget` bucket visits per shard. Called periodically by pollers (each poller
 * owns a slice of the shards): the active expiry cycle. Returns the number of
 * keys reclaimed. */
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
struct xs_batch;
struct xs_ref;
struct kvt_spill {
    struct ldu_queue *queue; /* the flusher's dirty queue */
    pthread_mutex_t *queue_lock; /* NULL: LDU, lock-free; else every queue operation takes it
                                    and removes are not absorbed (the simple queue, for comparison) */
    /* 1 if the key's block may hold it (called for keys not in memory, shard lock held) */
    int (*maybe_on_disk)(void *arg, const void *key, size_t klen);
    /* FLUSHALL, around the logging of its record: BEGIN, then COMMIT (every block
     * is empty from now on) or ABORT (the log refused it); lsn: at COMMIT, the
     * FLUSH record's LSN (appended, not yet durable; 0 without a log) */
    void (*flushall)(void *arg, int phase, uint64_t lsn);
    int (*load_sync)(void *arg, const void *key, size_t klen); /* blocking load (kvt_load_sync) */
    int (*make_room)(void *arg);   /* blocking: sweep and evict (kvt_wait_memory) */
    void *arg;
    /* a stream's sealed batches as references into the data file's batch store
     * (NULL: written whole): the flusher's snapshot gives each one a reference
     * (stream.h's xs_stage_fn), a load reads them back (xs_fetch_fn) */
    int (*stage_batch)(void *arg, struct xs_batch *b);
    int (*fetch_batch)(void *arg, const struct xs_ref *ref, void *buf);
    /* 1 if ref's bytes are durable in the batch store: the batch may leave memory (the evictor's) */
    int (*batch_durable)(void *arg, const struct xs_ref *ref);
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
    int type;                /* VALUE: KVT_STRING, KVT_HASH */
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
/* The same, and an entry it leaves clean is evicted at once (the flusher's
 * chunk makes room for waiting writers without a turn of the clock over every
 * entry). Returns the bytes freed (0: not evicted). */
uint64_t kvt_flushed_evict(struct kv_table *t, struct kvt_dnode *d, struct ldu_node **held, int nheld,
                           const struct kvt_snap *snap, int written, uint64_t durable, struct ldu_queue *q);
/* Evict clean, unreferenced entries (CLOCK) until used memory <= target or two
 * turns of the clock found nothing more; a stream's entry that stays gives up
 * its sealed batches that are durable in the batch store and were not read
 * since the last turn (xs_evict: never its first live batch, nor its last
 * KVT_KEEP_TAIL). Returns bytes freed; adds to *evicted (keys). */
#define KVT_KEEP_TAIL 4
uint64_t kvt_evict(struct kv_table *t, uint64_t target, uint64_t *evicted);
/* Insert what a block holds for key (found) or says about it (absent) as a
 * clean entry, unless memory already has the key. still_valid(arg) is called
 * under the shard lock: 0 means the block changed since it was read (-EAGAIN:
 * read it again). Returns 1 inserted, 0 memory had it, -errno. */
int kvt_load(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen, int found,
             int64_t expire_ms, int type, int (*still_valid)(void *arg), void *arg);
/* A stream is loaded with its sealed batches gone (read when wanted) once the
 * loader runs; before (log replay) whole. Set by the data file. */
void kvt_set_lazy_batches(struct kv_table *t, int lazy);
/* Key's stream is in memory: read back the batches its readers wanted (up to a
 * bounded number per call, outside the shard lock) through the spill hook.
 * Returns how many came back, 0 (none wanted, or not a stream in memory), or
 * -errno (a read failed: -ENOENT, -EILSEQ, -EIO; or -EBADMSG, -ENOMEM). */
int kvt_load_batches(struct kv_table *t, const void *key, size_t klen);
/* Key holds a stream in memory with batches out of memory: mark them all wanted
 * (none if more than max). Returns how many are out (0: none, or no such stream). */
size_t kvt_want_batches(struct kv_table *t, const void *key, size_t klen, size_t max);
/* The flusher found key's record in its block expired (at expire_ms): unless
 * memory holds a state of the key, record the expiry as a logged deletion (a
 * tombstone the next sweep removes from the block, counted like any delete).
 * Returns 1 if a deletion was recorded, 0 if memory rules the key, -errno. */
int kvt_expire_disk(struct kv_table *t, const void *key, size_t klen, int64_t expire_ms);
/* Blocking load through the spill hook (Python callers). Returns 0 or -errno. */
int kvt_load_sync(struct kv_table *t, const void *key, size_t klen);
/* After -ENOMEM (Python callers): wait for the flusher to make room. Returns 0
 * (try again) or -ENOMEM when waiting cannot help (no data file, nothing to evict). */
int kvt_wait_memory(struct kv_table *t);

#endif
