/* bosc_int.h - the BOSC data file's internal state and the helpers its files
 * share: bosc_block.c (blocks, superblock, free blocks), bosc_load.c (the table's
 * hooks, the loader), bosc_keys.c (the key listing the loader serves),
 * bosc_sweep.c (a sweep; bosc_batches.c its side of the batch store, whose
 * segment files are bosc_bstore.c's), bosc_flusher.c (the flusher thread: when
 * to sweep, eviction), bosc_expire.c (the expiry pass) and bosc_open.c (open,
 * scan, close, stats). Not a public interface (bosc.h is);
 * ext/bench/bosc_naive.c uses the block layout and the I/O loops. Threads and
 * locking are described in bosc_open.c's header. */
#ifndef KV_BOSC_INT_H
#define KV_BOSC_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/kvbuf.h"
#include "core/ldu.h"
#include "core/log.h"
#include "core/table.h"
#include "core/stream.h"
#include "durability/bosc.h"
#include "durability/bstore.h"

#define BLK BOSC_BLOCK
#define BHDR 40
#define PAYLOAD (BLK - BHDR)
#define FIRST_TABLE 2        /* the bucket table's pages follow the two superblock copies */
#define TAB_PER_PAGE (PAYLOAD / 8)
#define BOSC_VERSION 2       /* 2: write sequence in every block, bucket table, two home copies */
#define REC_HDR 16
#define REC_TYPE_SHIFT 30    /* a record's klen word: type << 30 | key length (< 2^30) */
#define REC_KLEN_MASK ((1u << REC_TYPE_SHIFT) - 1)
#define SB_MAGIC "KVSBOSC1"
#define BLK_MAGIC 0x3142564Bu /* "KVB1" as bytes (little-endian u32): never all zeros */
#define TAB_MAGIC 0x3254564Bu /* "KVT2": a page of the bucket table */
#define MAX_REC (512u * 1024 * 1024)
#define MAX_BLOCKS (UINT32_MAX - 1)
#define HIGH_PCT 90          /* evict when memory passes this share of the bound ... */
#define LOW_PCT 25           /* ... down to this share: room for the next batch of dirty keys.
                                Low, so most of memory can be dirty at a sweep: the records a
                                block write carries grow with the dirty share of memory (about
                                34 x dirty share x memory / file for one-block chains of
                                ~120-byte records): 60 gave ~30 % dirty, ~3 records a block */
#define MAX_SUBS 1024
#define KEYS_SLOTS BOSC_KEYS_SLOTS
#define KEYS_STEP 16         /* buckets a listing reads before the loader serves waiting loads */
#define KEYS_KEEP_MS 2000    /* a ready listing nobody took is dropped after this, when its
                                slot is wanted (the requester went away) */

struct load_req {
    struct load_req *next;
    int evfd;
    uint32_t klen;
    unsigned char key[];
};

/* A key listing (bosc_keys_request). States move FREE -> QUEUED -> RUNNING ->
 * READY -> FREE under b->lock; while RUNNING only the loader touches out, first,
 * next and rc (a cancel then only sets cancelled, the loader frees it). */
enum { KS_FREE, KS_QUEUED, KS_RUNNING, KS_READY };
struct keys_slot {
    int state, cancelled, evfd;
    uint32_t gen;                /* the ticket's upper bits: a reused slot is another ticket */
    uint32_t next, end;          /* buckets [next, end) still to read */
    uint64_t seq;                /* request order: the oldest job runs first */
    uint64_t ready_ns;
    int rc;                      /* 0, or -errno (the listing failed) */
    struct kvbuf out;            /* u32 klen | u8 type | key, ... */
};

struct item {                /* one dirty key in a sweep */
    struct kvt_dnode *d;
    uint32_t bucket;
    int nheld;
    struct ldu_node *held[2];
    struct kvt_snap snap;
    size_t voff;             /* value in the sweep's buffer */
    int written;
    uint8_t present;         /* its key was in the block before the sweep */
};

/* ---- bosc_io.c: the sweep's coalesced I/O (flusher only)
 *
 * Read window: blocks [first, first + n) of the file, read with one pread; the
 * sweep fills it with the home copies of a run of dirty buckets and reads their
 * chains through it (bosc_chain_read_w), so a dense run costs one system call
 * instead of one per bucket (overflow blocks likewise, OV_BLOCKS at a time,
 * through a second window), and asks the kernel to read the next run ahead
 * meanwhile (posix_fadvise WILLNEED).
 * Write batch: the blocks of several buckets' new chains, sealed, written in
 * ascending block order with one pwritev per run of consecutive blocks,
 * overflow blocks before home blocks (a home copy never points at a block not
 * yet written, even when a write fails half way). Staging changes nothing a
 * reader sees; the batch's write takes b->gen_lock and makes the staged
 * buckets' versions odd only while it writes (bosc_sweep.c's batch_flush). */
#define RWIN_BLOCKS 512      /* read window: 2 MiB, 256 buckets' home pairs */
#define RWIN_GAP 2           /* a run of dirty buckets ends where this many clean buckets
                                follow each other (one alone is read for nothing, in the run) */
#define WB_BLOCKS 512        /* write batch: flushed when this many blocks are staged */
#define OV_BLOCKS 32         /* overflow reads: a missed block and up to 31 after it (a sweep
                                allocates a run's chains in ascending order, so they often
                                follow; blocks reused from the free list do not): the count
                                doubles while at least half of a read is used, else halves */

struct bosc_rwin {
    uint64_t first, n;
    uint64_t cap;            /* blocks its buffer holds (0: RWIN_BLOCKS), fixed before its first read */
    unsigned char *buf;
    uint32_t used, ahead;    /* overflow window: blocks of the last read used; the next read's size */
};

struct wb_bucket {           /* a bucket whose new chain is staged */
    uint32_t bucket, after;  /* after: its record count once written */
    size_t first_item, nitems;
    size_t blk_lo, blk_hi;   /* its blocks in the batch */
    size_t freed_lo, freed_hi; /* the old chain's blocks it put on b->freed */
    size_t dec_lo, dec_hi;   /* the batch references of the records it replaces (sweep_ctx's dec) */
    int ok;
};

struct bosc_wbatch {
    unsigned char *buf;      /* WB_BLOCKS sealed blocks, in staging order */
    uint32_t *no;            /* their block numbers */
    uint8_t *done;           /* per block: written */
    size_t n;
    struct wb_bucket *bk;
    size_t nbk, capbk;
};

/* How the sweep's I/O is done (bosc_config.io_mode, BOSC_IO_* bits). DIRECT: the
 * window reads and batch writes go through dfd, a second descriptor of the file
 * opened O_DIRECT, from 4 KiB-aligned buffers (the same file: fdatasync of b->fd
 * syncs them). Coherence with the buffered reads of loads, listings and the
 * table: Linux writes back and invalidates the page cache over a direct
 * write's range before it, and invalidates it again after it (waiting on pages
 * a buffered read is filling), so a later buffered read sees the new block;
 * a buffered read racing the write sees an odd bucket version (the batch is
 * written under it) and reads again. A direct read writes back dirty cached
 * pages of its range first. No mapping of the file exists (it would make the
 * invalidation fail). Without URING, direct mode has no read-ahead (a
 * posix_fadvise hint fills the page cache, which a direct read skips).
 * URING: ring (struct io_uring *, flusher only once started) writes a group of
 * a batch's runs with one submission and waits for all of them; the next
 * window is read into pf_buf while the current run is applied, and handed
 * over by swapping buffers when the sweep asks for that range. (On ext4,
 * which has no non-blocking buffered writes, io_uring hands each buffered
 * write to a kernel worker thread: the flusher's CPU stays, the process's
 * grows; measured in experiments/kv_datafile_io.py, as are the others.) */
struct bosc_io {
    int mode;                /* BOSC_IO_* in effect */
    int dfd;                 /* O_DIRECT descriptor (DIRECT), else -1 */
    void *ring;              /* struct io_uring * (URING), else NULL */
    unsigned char *pf_buf;   /* the read ahead's buffer (RWIN_BLOCKS blocks) */
    uint64_t pf_first, pf_n; /* its range */
    int pf_state;            /* 0: none, 1: in flight, 2: done (pf_res) */
    int pf_res;              /* bytes read or -errno */
    uint64_t pf_wmark;       /* st.blocks_written when it was issued, moved on by the batches
                                that missed its range (UINT64_MAX: stale): it is taken only if
                                no block was written since but by those; a block written any
                                other way (a huge chain, the torn-write hook, the bucket table)
                                makes it stale */
    struct iovec *iov;       /* WB_BLOCKS iovecs for a group's runs in flight */
    uint32_t *run;           /* per run in flight: its first place in the order, then its end */
};

int bosc_io_open(struct bosc *b, int mode, char *err, size_t errlen);
void bosc_io_close(struct bosc *b);
int bosc_rwin_fill(struct bosc *b, struct bosc_rwin *w, uint64_t first, uint64_t n);
void bosc_rwin_advise(struct bosc *b, uint64_t first, uint64_t n);
int bosc_wb_init(struct bosc_wbatch *wb);
void bosc_wb_free(struct bosc_wbatch *wb);
int bosc_wb_stage(struct bosc *b, struct bosc_wbatch *wb, uint32_t bucket, uint64_t gen, const struct kvbuf *s,
                  const uint32_t *chain, size_t nchain, struct wb_bucket **out);
int bosc_wb_write(struct bosc *b, struct bosc_wbatch *wb);
void bosc_wb_undo(struct bosc *b, struct bosc_wbatch *wb);
int bosc_io_write_run(struct bosc *b, int fd, struct bosc_wbatch *wb, const uint32_t *order, size_t i, size_t j,
                      size_t put);
size_t bosc_io_run_end(const struct bosc_wbatch *wb, const uint32_t *order, size_t i, size_t hi);
/* bosc_uring.c (without liburing at build time: init fails with -EOPNOTSUPP, the rest do nothing) */
int bosc_uring_init(struct bosc *b, char *err, size_t errlen);
void bosc_uring_exit(struct bosc *b);
int bosc_uring_write_runs(struct bosc *b, int fd, struct bosc_wbatch *wb, const uint32_t *order, size_t lo, size_t hi);
void bosc_uring_prefetch(struct bosc *b, int fd, uint64_t first, uint64_t n);
int bosc_uring_take(struct bosc *b, struct bosc_rwin *w, uint64_t first, uint64_t n);

struct bosc {
    struct kv_table *t;
    int fd;
    struct bosc_io io;            /* the sweep's I/O mode (bosc_io.c) */
    char path[4096];
    char log_dir[4096];
    uint32_t nbuckets;
    uint32_t tab_pages;           /* pages of the bucket table (each kept as two copies) */
    uint64_t first_home, first_over; /* where the home copies and the overflow blocks begin */
    uint64_t k0, k1;
    /* Integrity (bosc.h): per bucket, the sweep whose write of its chain the
     * file last synced (0: never written) -- the flusher raises it after the
     * sweep's data sync, readers check every chain against it (relaxed: a
     * block read is always at least as new as the value seen) -- and which of
     * its two home copies holds that write (flusher only). Per table page, the
     * copy holding the synced page. */
    _Atomic uint64_t *tab;
    uint8_t *slot, *tslot;
    uint64_t wseq;                /* the sweep being written: every block it writes carries it (flusher) */
    uint64_t done_seq;            /* the last sweep the table and superblock record (flusher) */
    uint32_t *touched;            /* buckets this sweep wrote, ascending (flusher) */
    size_t ntouched, captouched;
    _Atomic uint64_t nblocks;     /* blocks in use by the file: the flusher grows it, the
                                     loader reads it for its bounds check (relaxed: a block
                                     past an old count is only reached through a chain
                                     whose version the loader then sees changed) */
    uint64_t sb_gen;              /* generation the newest superblock records (flusher) */
    uint64_t sb_seq;              /* flusher only */
    uint32_t interval_ms;
    _Atomic uint32_t *nkeys;      /* records per bucket chain */
    _Atomic uint32_t *ver;        /* per-bucket seqlock */
    _Atomic uint64_t gen;         /* blocks of another generation are empty */
    _Atomic uint64_t flushed_lsn;
    _Atomic uint64_t flush_lsn;   /* LSN of the FLUSH record of the generation in gen (0: none
                                     since open). A superblock may record that generation only
                                     once the log holds this record (bosc_sweep.c, settle_chunk):
                                     stored before gen is bumped (release), so a reader of gen
                                     sees this LSN or a later FLUSH's */
    pthread_mutex_t gen_lock;     /* FLUSHALL's bump vs a block write: never both */
    pthread_mutex_t flush_lock;   /* FLUSHALL's log record + bump vs a sweep reading the
                                     durable LSN and the generation: one or the other.
                                     Lock order: flush_lock before gen_lock. */
    uint32_t *free_blk;           /* overflow blocks free to use (flusher) */
    size_t nfree, capfree;
    uint32_t *freed;              /* freed this sweep: reusable after its sync */
    size_t nfreed, capfreed;
    struct ldu_queue q;
    pthread_mutex_t qlock;        /* the simple queue's lock (cfg->locked_queue) */
    int locked_queue;
    struct wal *wal;
    struct latmon *_Atomic latmon; /* LATENCY's monitor, for the sweeps (set by the engine) */
    pthread_t flusher, loader;
    int started;
    pthread_mutex_t lock;         /* guards the fields below */
    pthread_cond_t cond, done;
    int stop, kick;
    uint64_t sync_req, sync_done;
    struct load_req *lhead, *ltail;
    int subs[MAX_SUBS];
    _Atomic int nsubs;
    _Atomic int failed;
    /* A sweep's write or sync failed (ENOSPC, EIO...) and is retried with
     * backoff (bosc_sweep.c): werr its errno (0: writing works), werr_msg what
     * failed (under lock), write_errors the failed sweeps. Unlike failed, reads
     * go on. */
    _Atomic int werr;
    char werr_msg[256];
    _Atomic uint64_t write_errors;
    _Atomic int sweeping;         /* a sweep holds keys taken off the queue */
    int evict_failed;             /* the last eviction found nothing to evict (flusher) */
    /* The expiry pass (bosc_sweep.c), flusher only after open: per bucket, the
     * earliest expire time (unix s, rounded down; 0 = none) of a record its chain
     * may hold (lowered when such a record is found at open or written; set to
     * the truth when the pass reads the chain), how many buckets have one, and
     * where the pass goes on. A bucket is read only once its time has come. */
    uint32_t *exp_min;
    uint32_t ttl_buckets, pass_cursor, pass_budget;
    struct keys_slot keys[KEYS_SLOTS]; /* under lock (see struct keys_slot) */
    uint64_t keys_seq;
    pthread_cond_t keys_cond;     /* a listing became ready (bosc_keys_wait) */
    char error[256];
    struct {
        _Atomic uint64_t sweeps, records, blocks_read, blocks_written, bytes_written, syncs;
        _Atomic uint64_t sweep_ns, io_ns, deferred, loads, load_reads, evicted, evicted_bytes, truncated;
        _Atomic uint64_t expired_found, expired_reclaimed, expire_pass_blocks, expire_passes;
        _Atomic uint64_t key_listings, key_listing_blocks, key_listings_dropped;
        _Atomic uint64_t bytes_read, read_calls, write_calls, flusher_cpu_ns;
        _Atomic uint64_t chunks, chunk_evicted;
    } st;
    /* A sweep settles its keys a chunk of buckets at a time (bosc_sweep.c):
     * chunk_pct the share of the memory bound a chunk's keys take (0: the
     * whole sweep is one chunk). Under lock: room_seq counts settled chunks
     * (bosc_make_room waits for one), room_waiters the threads waiting so. */
    uint32_t chunk_pct, chunk_items;
    uint64_t room_seq;
    int room_waiters;
    uint32_t sweep_no;
    /* Fault hook for tests (KVSTORE_FAULT_TEAR_HOME_WRITE=n in the environment):
     * the n-th home-block write of this process writes half the block and the
     * process is killed, as a power cut mid-write leaves it. 0: off. Flusher only. */
    uint64_t tear_at, home_writes;
    /* The batch store (bstore.h): a stream's sealed batches, which its record
     * refers to. bs_gen: the generation its segments belong to (a sweep that
     * finds another retires them, bs_retired until a superblock records it). */
    struct bstore *bs;
    uint64_t bs_gen;
    int bs_retired;
};

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void add(_Atomic uint64_t *c, uint64_t d) { atomic_fetch_add_explicit(c, d, memory_order_relaxed); }

static inline void fail(struct bosc *b, const char *msg)
{
    pthread_mutex_lock(&b->lock);
    if (!atomic_load(&b->failed)) {
        snprintf(b->error, sizeof b->error, "%s", msg);
        atomic_store(&b->failed, 1);
        kvlog(KVLOG_WARNING, "data file failed (%s): no longer read or written until a restart", msg);
    }
    pthread_mutex_unlock(&b->lock);
}

static inline uint32_t bucket_of(struct bosc *b, const void *key, size_t klen)
{
    return (uint32_t)(kvt_hash_keyed(key, klen, b->k0, b->k1) % b->nbuckets);
}

/* ---- I/O loops (also used by the naive baseline, ext/bench/bosc_naive.c) */

static inline int pread_all(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0) { /* past the end: zeros, as a hole reads */
            memset((char *)buf + got, 0, n - got);
            return 0;
        }
        got += (size_t)r;
    }
    return 0;
}

static inline int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = pwrite(fd, (const char *)buf + put, n - put, off + (off_t)put);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        put += (size_t)r;
    }
    return 0;
}

/* ---- bosc_block.c: blocks, superblock, free blocks; bosc_table.c: the bucket table
 * (each documented at its definition) */

/* Where bucket's two home copies are. */
/* A reader found a bucket's version odd (its chain is being written): wait the
 * write out, asleep. The flusher keeps a version odd only while it holds
 * gen_lock (a batch's write, a huge chain's: bosc_sweep.c), so taking the lock
 * returns once that write is done; a sched_yield loop kept the reader on a CPU
 * for the whole write. The caller holds no lock the flusher takes under
 * gen_lock (the loader none; a poller's kvt_load_sync none: the command
 * stalled first). Were a version odd without the lock held, the caller's retry
 * would only spin. */
static inline void bosc_wait_written(struct bosc *b)
{
    pthread_mutex_lock(&b->gen_lock);
    pthread_mutex_unlock(&b->gen_lock);
}

static inline uint64_t home_of(const struct bosc *b, uint32_t bucket)
{
    return b->first_home + 2 * (uint64_t)bucket;
}

/* What bosc_chain_read found: the write sequence of the chain it returned and
 * the home copy holding it (seq 0: the bucket is empty, never written). */
struct chain_pick {
    uint64_t seq;
    int slot;
    int lost;                    /* -EILSEQ because a block is older than recorded (writes lost) */
};

typedef void (*rec_fn)(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key,
                       uint32_t klen, const unsigned char *val, uint32_t vlen, int64_t expire, int type);
int bosc_all_zero(const unsigned char *p, size_t n);
int bosc_block_check(struct bosc *b, const unsigned char *p, uint64_t no, uint32_t magic, char *err,
                     size_t errlen);
void bosc_block_seal(unsigned char *p, uint32_t magic, uint32_t no, uint32_t next, uint64_t gen, uint32_t used,
                     uint32_t home, uint64_t seq);
int bosc_block_write(struct bosc *b, unsigned char *p, uint32_t no, uint32_t next, uint64_t gen,
                uint32_t used, uint32_t home);
int bosc_block_put(struct bosc *b, const unsigned char *p, uint32_t no);
int bosc_push_u32(uint32_t **v, size_t *n, size_t *cap, uint32_t x);
int bosc_chain_read(struct bosc *b, uint32_t bucket, uint64_t gen, struct kvbuf *s, uint32_t **chain,
               size_t *nchain, size_t *capchain, struct chain_pick *pick, char *err, size_t errlen);
int bosc_chain_read_other(struct bosc *b, uint32_t bucket, uint64_t gen, int bad, struct kvbuf *s, uint32_t **chain,
                          size_t *nchain, size_t *capchain, struct chain_pick *pick, char *err, size_t errlen);
int bosc_chain_read_w(struct bosc *b, const struct bosc_rwin *w, struct bosc_rwin *ov, uint32_t bucket, uint64_t gen, struct kvbuf *s,
                      uint32_t **chain, size_t *nchain, size_t *capchain, struct chain_pick *pick, char *err,
                      size_t errlen);
int64_t bosc_stream_walk(const unsigned char *p, size_t n, rec_fn fn, void *arg);
int bosc_stream_damaged(struct bosc *b, uint32_t bucket, char *err, size_t errlen);
int bosc_layout(struct bosc *b, char *err, size_t errlen);
int bosc_tab_read(struct bosc *b, char *err, size_t errlen);
int bosc_tab_write(struct bosc *b);
void bosc_tab_done(struct bosc *b);
int bosc_sb_write(struct bosc *b, uint64_t flushed, uint64_t gen);
int bosc_sb_read(struct bosc *b, uint64_t *flushed, uint64_t *gen, char *err, size_t errlen);
uint32_t bosc_blk_alloc(struct bosc *b);

/* ---- bosc_load.c: the table's hooks (struct kvt_spill) and the loader thread */

int bosc_hook_maybe_on_disk(void *arg, const void *key, size_t klen);
void bosc_hook_flushall(void *arg, int phase, uint64_t lsn);
int bosc_hook_load_sync(void *arg, const void *key, size_t klen);
int bosc_hook_stage_batch(void *arg, struct xs_batch *xb);
int bosc_hook_fetch_batch(void *arg, const struct xs_ref *ref, void *buf);
int bosc_hook_batch_durable(void *arg, const struct xs_ref *ref);
/* xs_refs's callback: ref counts towards its segment's live bytes (arg: the bosc). */
void bosc_count_refs(void *arg, const struct xs_ref *ref);
void bosc_wake_all(struct bosc *b);
void *bosc_loader_main(void *arg);

/* ---- bosc_keys.c: the key listing (called by the loader, b->lock held; the
 * work itself runs unlocked) */

struct keys_slot *bosc_keys_next(struct bosc *b);
void bosc_keys_work(struct bosc *b, struct keys_slot *k);
void bosc_keys_free_all(struct bosc *b);

/* ---- bosc_open.c / bosc_sweep.c: bucket may hold a record that expires at
 * expire_ms (flusher only, or the opening thread before it starts) */

static inline uint32_t exp_sec(int64_t expire_ms)
{
    int64_t s = expire_ms / 1000;
    return s < 1 ? 1 : s > UINT32_MAX ? UINT32_MAX : (uint32_t)s;
}

static inline void ttl_mark(struct bosc *b, uint32_t bucket, int64_t expire_ms)
{
    uint32_t s = exp_sec(expire_ms);
    if (!b->exp_min[bucket])
        b->ttl_buckets++;
    if (!b->exp_min[bucket] || s < b->exp_min[bucket])
        b->exp_min[bucket] = s;
}

/* ---- bosc_expire.c: expired records found in the file (flusher only) */

int bosc_expire_found(struct bosc *b, uint64_t gen, const unsigned char *key, uint32_t klen, int64_t expire);
int bosc_expire_pass(struct bosc *b, struct kvbuf *stream, uint32_t **chain, size_t *nchain, size_t *capchain,
                     char *err, size_t errlen);

/* ---- bosc_sweep.c: one sweep; bosc_flusher.c: the flusher thread */

struct sweep_ctx {
    uint64_t flushed_bound;      /* the file holds every change up to here (sweep) */
    int write_failed;            /* the last sweep failed writing or syncing (the disk): retried */
    int need_sync;               /* blocks written by a failed sweep are not known synced */
    int any_skipped;             /* a key of this sweep was not written: the flushed LSN stays */
    struct item *items;
    size_t n, cap;
    struct kvbuf vals, stream, out;
    uint32_t *chain;
    size_t nchain, capchain;
    uint8_t *present;
    uint64_t *tag;               /* per live item of a bucket: key_tag */
    size_t cappresent;
    uint32_t *dest;              /* per item: its place sorted by bucket (counting sort) */
    size_t capdest;
    uint32_t *bcount;            /* per bucket: items (counting sort), b->nbuckets + 1 */
    struct bosc_rwin win;        /* the home copies of the current run of dirty buckets */
    struct bosc_rwin ovw;        /* overflow blocks read ahead (OV_BLOCKS) */
    struct bosc_wbatch wb;       /* staged chains (bosc_io.c) */
    /* The batch references of the stream records the chunk's chains replace:
     * taken off their segments' live bytes once the chains are synced and
     * recorded (only those of chains written: ok). */
    struct bs_dec {
        struct xs_ref ref;
        int ok;
    } *dec;
    size_t ndec, capdec;
};

int bosc_sweep(struct bosc *b, struct sweep_ctx *c, char *err, size_t errlen);

/* ---- bosc_batches.c: the sweep's side of the batch store. At a sweep's start
 * (retires the segments if gen is a FLUSHALL's); a stream record a chain
 * replaces (its references noted: 0 or -ENOMEM); the chain
 * holding the notes [lo, hi) is written; the staged batches written and synced
 * before any chain (0, or -errno with err set and c->write_failed); a chunk
 * settled (the written chains' replaced references leave their segments, those
 * with none left go); the superblock written (a FLUSHALL's retired segments go
 * once its generation is recorded). */
void bosc_batches_begin(struct bosc *b, struct sweep_ctx *c, uint64_t gen);
int bosc_batches_replaced(struct sweep_ctx *c, const void *val, uint32_t vlen);
void bosc_batches_written(struct sweep_ctx *c, size_t lo, size_t hi);
int bosc_batches_commit(struct bosc *b, struct sweep_ctx *c, char *err, size_t errlen);
void bosc_batches_settled(struct bosc *b, struct sweep_ctx *c);
void bosc_batches_recorded(struct bosc *b);
void *bosc_flusher_main(void *arg);
/* Before a chunk of the sweep is settled: 1 if its keys left clean should
 * leave memory at once (writers wait for room, or memory is past HIGH_PCT);
 * after: wake the writers waiting for room. Flusher. */
int bosc_room_wanted(struct bosc *b);
void bosc_chunk_done(struct bosc *b);
/* The table's make_room hook: ask for a sweep and wait until it settled a
 * chunk (or finished). Returns 0 or -EIO (the data file failed). */
int bosc_make_room(void *arg);

#endif
