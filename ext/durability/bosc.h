/* bosc.h - the BOSC data file and its flusher (paper 000, sections 2.1 and 3.3).
 *
 * The data file is an array of fixed-size blocks; a key lives in the block its
 * placement hash picks (its "bucket"), records that do not fit continue in
 * overflow blocks chained from it. Writers never touch the file: the table
 * queues each dirty key once on an LDU queue (ldu.h); the flusher thread takes
 * the queue, groups the keys by block and sweeps the blocks in ascending order
 * (read block, apply the keys' current states in LSN order, write block;
 * blocks without updates are skipped), syncs, records the flushed LSN in the
 * superblock, deletes log segments below it, and evicts clean entries when
 * memory is past its bound. Expired records it reads (in a sweep, or in a
 * gentle background pass over the buckets that may hold records with an expire
 * time) become logged deletions (kvt_expire_disk) that a later sweep writes. A
 * loader thread reads blocks for keys that left memory and lists the file's
 * keys (SCAN, KEYS). Pollers never block on either: they wait on their eventfd.
 *
 * File layout (little-endian), BOSC_BLOCK bytes per block, format version 2:
 *   blocks 0, 1  superblock slots (written alternately, the valid one with the
 *                higher sequence wins): "KVSBOSC1" | u32 crc | u32 version 2 |
 *                u64 seq | u32 block size | u32 buckets | u64 flushed LSN |
 *                u64 generation | u64 hash k0 | u64 hash k1 | u64 blocks |
 *                u64 last sweep the bucket table records
 *   blocks 2 ..  the bucket table: page p at blocks 2+2p and 2+2p+1 (two copies,
 *                written alternately); page p holds u64 entries for buckets
 *                [p*507, (p+1)*507): the sweep whose write of the bucket's chain
 *                the file last synced (0: never written)
 *   then         two home copies per bucket (b at first_home+2b and +1): a sweep
 *                writes the copy that does not hold the synced chain, so a torn
 *                write (a power cut) leaves the synced chain whole
 *   then         overflow blocks, allocated as chains need them (copy on write)
 * Block: u32 magic "KVB1" ("KVT2" for a table page) | u32 crc32c of bytes 8.. |
 *   u32 own number | u32 next block of the chain (0 = none) | u64 generation |
 *   u32 payload bytes | u32 first home copy of the chain (a table page: its page
 *   number) | u64 sweep that wrote it | payload. A bucket's chain is its home
 *   copy with the higher sweep, and every block of it carries that sweep; a
 *   chain older than the table's entry (a zeroed block, an older copy put back)
 *   is damage, reported with what is lost. A never-written block reads as zeros:
 *   an empty bucket. Blocks of an older generation (before a FLUSHALL) are
 *   empty. The payload of a chain is one stream of records
 *   u32 type << 30 | klen | u32 vlen | i64 expire ms | key | value
 *   (klen and vlen <= 512 MiB; type KVT_STRING = 0, KVT_HASH = 1, whose value
 *   is the encoded hash, or KVT_STREAM = 2, whose value is the stream's bytes
 *   (core/stream.h's xs_encode: a stream is written whole); files written before types existed hold only strings,
 *   type 0; an expire time is absolute unix ms, 0 = none).
 * Everything read from the file is untrusted: lengths and chains are bounded,
 * every block's checksum, number and owner are checked, and damage is
 * reported with the file, block and what was wrong.
 */
#ifndef KV_BOSC_H
#define KV_BOSC_H

#include <stddef.h>
#include <stdint.h>

#define BOSC_BLOCK 4096

struct kv_table;
struct wal;
struct bosc;
struct kvbuf;

struct bosc_config {
    const char *path;            /* the data file (created if absent) */
    uint32_t buckets;            /* home blocks when creating (default 65536 = 256 MiB, sparse) */
    uint32_t flush_interval_ms;  /* sweep at least this often while keys are dirty (default 1000) */
    int locked_queue;            /* 1: a mutex-protected dirty queue instead of LDU (to compare) */
    const char *log_dir;         /* log segments to delete below the flushed LSN (NULL: keep
                                    them all, as remote mode must: a peer that lost its copy
                                    of this node's log is caught up from LSN 1) */
    /* ---- issue 14b (io) */
    int io_mode;                 /* the sweep's batch writes and window reads (BOSC_IO_*):
                                    buffered (0, the page cache), O_DIRECT through a second
                                    descriptor, io_uring, or both; loads, the table and the
                                    superblock stay buffered in every mode */
    /* ---- issue 14b (chunk) */
    uint32_t sweep_chunk_pct;    /* a sweep syncs, records and settles its keys (then evicts and
                                    wakes waiting writers) a chunk of buckets at a time, each about
                                    this share of the memory bound; 0: the whole sweep at once */
    uint32_t sweep_chunk_items;  /* tests: at most this many keys a chunk instead (0: by the share) */
};

#define BOSC_IO_BUFFERED 0
#define BOSC_IO_DIRECT 1             /* O_DIRECT (4 KiB-aligned buffers) */
#define BOSC_IO_URING 2              /* io_uring: a batch's runs in one submission, the next
                                        read window read while the current run is applied */
#define BOSC_IO_URING_DIRECT 3       /* both */

struct bosc_open_info {
    uint64_t flushed_lsn;        /* the file holds every change up to this LSN */
    uint64_t generation, buckets, blocks, disk_keys, overflow_blocks;
    double seconds;              /* time taken to open and scan */
};

struct bosc_stats {
    uint64_t sweeps, records, blocks_read, blocks_written, bytes_written, syncs;
    uint64_t sweep_ns, io_ns;          /* total sweep time; of which its reads, writes and syncs of the file */
    uint64_t deferred;                 /* keys left dirty for a later sweep */
    uint64_t loads, load_reads, evicted, evicted_bytes, truncated_segments;
    uint64_t flushed_lsn, disk_keys, buckets, blocks, queued;
    /* expired records found in the file (by sweeps and the background pass; one
     * may be counted again until the sweep that removes it) and the deletions
     * recorded for them; blocks read and whole turns over the buckets made by
     * the background expiry pass */
    uint64_t expired_found, expired_reclaimed, expire_pass_blocks, expire_passes;
    /* key listings served, blocks they read, ready ones dropped untaken */
    uint64_t key_listings, key_listing_blocks, key_listings_dropped;
    /* bytes read from the file (sweeps, loads, listings, the expiry pass); the
     * read and write system calls that moved them and bytes_written (blocks
     * per call: how well the I/O is coalesced); the flusher thread's CPU time
     * (CLOCK_THREAD_CPUTIME_ID: sweeps, evictions, expiry passes). Reads count
     * what the system calls returned: a sweep reads home copies and overflow
     * blocks in windows, so blocks_read/bytes_read include blocks read ahead
     * and not used, and the gaps of a run of home copies; the read-ahead asked
     * of the kernel (posix_fadvise) is not counted. Writes count what each call
     * wrote, a call that failed part way too. */
    uint64_t bytes_read, read_calls, write_calls, flusher_cpu_ns;
    /* ---- issue 14b (chunk): chunks of a sweep settled before the sweep's end
     * (synced, recorded, their keys clean), and keys evicted right after them */
    uint64_t sweep_chunks, chunk_evicted;
    /* the batch store (bstore.h): segment files, their bytes and the bytes the
     * records refer to, batches written and read back */
    uint64_t batch_segments, batch_file_bytes, batch_live_bytes, batches_written, batch_reads;
    int failed;
    char error[256];
};

/* Open (or create) the data file, check and scan it, and attach it to t's
 * spill hooks (table.h). Call before t is shared and before the log replays
 * into t (the replay then marks its keys dirty). Returns 0 or -errno with a
 * message in err (-EILSEQ: the file is damaged). */
int bosc_open(struct bosc **out, struct kv_table *t, const struct bosc_config *cfg,
              struct bosc_open_info *info, char *err, size_t errlen);
/* The log whose durable LSN bounds what may become clean. Set before bosc_start. */
void bosc_set_log(struct bosc *b, struct wal *w);
/* Start the flusher and loader threads. */
int bosc_start(struct bosc *b);
/* Stop the threads and detach from the table. Dirty keys stay dirty in memory
 * (the log holds them); the table must not be written meanwhile. */
void bosc_close(struct bosc *b);

/* Write 1 to evfd after every sweep, eviction and load (pollers subscribe). */
int bosc_subscribe(struct bosc *b, int evfd);
/* Ask the loader to bring key into memory; evfd gets 1 when done. Never blocks
 * on I/O. Returns 0 or -ENOMEM. */
int bosc_request_load(struct bosc *b, const void *key, size_t klen, int evfd);
/* Load key now (blocking). Returns 0 or -errno (-EILSEQ: damaged block). */
int bosc_load(struct bosc *b, const void *key, size_t klen);
/* A writer waits for memory: sweep and evict now. */
void bosc_kick(struct bosc *b);
/* Sweep now and wait until it is done (tests, shutdown). Returns 0 or -errno. */
int bosc_sync(struct bosc *b);

/* The same without waiting: a ticket, done when a sweep that started after the
 * request has finished (pollers are woken then). */
uint64_t bosc_sync_request(struct bosc *b);
int bosc_sync_done(struct bosc *b, uint64_t ticket);
/* 1 if changes wait for the flusher. */
int bosc_dirty(struct bosc *b);

/* Listing the keys that live in the file (SCAN and KEYS: a key that left
 * memory exists only in its block). bosc_keys_request asks the loader thread
 * for the keys of home buckets [first, first + n) (their whole chains; records
 * whose expire time has passed by kvt_now_ms() are left out; first + n past
 * the last bucket stops at it); evfd (>= 0) gets 1 when the answer is ready.
 * Returns a ticket (> 0) or -errno: -EINVAL (first >= bosc_buckets, n == 0 or
 * n > BOSC_KEYS_MAX_BUCKETS), -EBUSY (BOSC_KEYS_SLOTS listings are pending or
 * ready and young: try later), -EIO (the data file failed: bosc_error).
 * Never blocks on I/O. The listing is what the file holds: a key deleted or
 * rewritten in memory since its last sweep is listed as the file has it, so
 * check each listed key against the table.
 * bosc_keys_take: 0 not ready yet; 1 ready: the keys were appended to out as
 * records u32 klen | u8 type (KVT_STRING, KVT_HASH, KVT_STREAM) | key (host order, as
 * every u32 here), and the ticket is released; -errno, the ticket released:
 * -EILSEQ a damaged block (see bosc_error), -ENOMEM, -ESTALE an unknown ticket
 * or one dropped untaken (below).
 * bosc_keys_wait blocks until the ticket is ready or unknown (blocking front
 * ends); bosc_keys_cancel releases a ticket its requester no longer wants (a
 * client gone): the work stops at its next step and its memory is freed.
 * Bounds: at most BOSC_KEYS_SLOTS tickets exist at once, each holding the keys
 * of at most BOSC_KEYS_MAX_BUCKETS buckets' chains; a ready answer nobody took
 * within 2 s is dropped when a new request wants its slot, so a requester that
 * went away without cancelling holds memory only until then. The loader serves
 * waiting loads between every 16 buckets of a listing (GETs do not wait behind it).
 * bosc_buckets: the number of home buckets (the listing's cursor range). */
#define BOSC_KEYS_SLOTS 64
#define BOSC_KEYS_MAX_BUCKETS 1024
int64_t bosc_keys_request(struct bosc *b, uint32_t first, uint32_t n, int evfd);
int bosc_keys_take(struct bosc *b, int64_t ticket, struct kvbuf *out);
void bosc_keys_wait(struct bosc *b, int64_t ticket);
void bosc_keys_cancel(struct bosc *b, int64_t ticket);
uint32_t bosc_buckets(struct bosc *b);

int bosc_failed(struct bosc *b);
const char *bosc_error(struct bosc *b);
/* The disk refuses the data file now (a sweep's block write, sync or
 * superblock write failed: ENOSPC, EIO, ...): the errno of the last failure
 * and what failed in msg (n bytes, may be NULL); 0 while writing works. The
 * flusher keeps the keys dirty and sweeps again with backoff (10 ms doubling to
 * 1 s; DBSIZE's sync request tries at once); reads and loads go on meanwhile
 * (bosc_failed stays 0). *errors (may be NULL): failed sweeps so far. Any thread. */
int bosc_write_error(struct bosc *b, char *msg, size_t n, uint64_t *errors);
void bosc_get_stats(struct bosc *b, struct bosc_stats *st);
struct latmon;
/* Report each sweep's duration to lm (core/latmon.h, event flusher-sweep), NULL: none. Any thread. */
void bosc_set_latmon(struct bosc *b, struct latmon *lm);

#endif
