/* wal.h - the write-ahead log: group-committed segment files of CRC-checked records.
 *
 * Writers (poller threads, under the key's shard lock so that per-key log order
 * is apply order) copy records once into the log's memory (chunks that never
 * move) and get an LSN; they never block on I/O. One log thread writes what came
 * since its last group with one writev() and makes it durable with one
 * fdatasync() (group commit), then publishes the
 * durable LSN and wakes, through its eventfd, each subscribed poller asleep with
 * a reply held for an LSN now durable (wal_want, wal_notify.h). Recovery
 * reads the segments back, checks every record's CRC32C and stops at the first
 * bad one. Files: <dir>/wal-<first LSN, 16 hex>.log, each opening with a 16-byte
 * header. Record layout (little-endian, offsets in the 32-byte header):
 *   0 u32 crc | 4 u32 hcrc | 8 u32 klen | 12 u32 vlen | 16 u8 op | 17 u8 type |
 *   18 u8 flags | 19 u8 zero | 20 i64 expire_ms | 28 u32 count | key | value | u64 lsn
 * type: 0 string, 1 hash (SET only); flags: WAL_F_UNIT; count: a COMMIT's number
 * of unit records, 0 otherwise (segments written before types and units had
 * zeros in bytes 17..19 and 28..31: they read as strings outside any unit).
 * hcrc = CRC32C of header bytes 8..31, so lengths can be trusted on their own
 * (a damaged length is told from a torn write without guessing); crc = CRC32C of
 * everything after it (hcrc, the rest of the header, key, value, LSN). Recovery
 * parses untrusted bytes: every length and field is bounded.
 *
 * Units (transactions): the records one thread appends between wal_unit_begin
 * and wal_unit_end (holding every shard lock of the table) carry WAL_F_UNIT and
 * are closed by a COMMIT record (no key) naming their count. Recovery applies a
 * unit at its COMMIT, all of it, or drops it when the log ends before the COMMIT.
 * The log thread never writes a group that ends inside an open unit, so the
 * durable LSN (local sync or peer ack) always lies between units: nothing that
 * trusts it (the data file's flusher, replies) sees half a unit.
 */
#ifndef KV_WAL_H
#define KV_WAL_H

#include <stddef.h>
#include <stdint.h>

struct kv_table;
struct wal;
struct kvbuf;

enum wal_op { WAL_SET = 1, WAL_DEL = 2, WAL_FLUSH = 3, WAL_COMMIT = 4, WAL_XOP = 5 };
#define WAL_HASH 0x10        /* or'ed into wal_append's op with WAL_SET: the value is an
                                encoded hash (the same bit as KVT_LOG_HASH) */
#define WAL_STREAM 0x20      /* or'ed with WAL_SET: the value is a stream's bytes (KVT_LOG_STREAM) */
/* WAL_XOP: a change to a stream key (KVT_LOG_XOP): the value is its delta
 * (core/stream.h, empty when only the expire time changed), the expire field
 * the key's expire time after it; replayed with kvt_xreplay. */
enum wal_type { WAL_T_STRING = 0, WAL_T_HASH = 1, WAL_T_STREAM = 2 };
#define WAL_F_UNIT 0x01      /* flags: the record belongs to the unit its COMMIT closes */

#define WAL_HDR 32           /* bytes before the key */
#define WAL_TRAILER 8        /* the LSN after the value */
#define WAL_OFF_HCRC 4
#define WAL_OFF_KLEN 8
#define WAL_OFF_VLEN 12
#define WAL_OFF_OP 16
#define WAL_OFF_TYPE 17
#define WAL_OFF_FLAGS 18
#define WAL_OFF_EXPIRE 20
#define WAL_OFF_COUNT 28
#define WAL_COMMIT_LEN (WAL_HDR + WAL_TRAILER)
#define WAL_MAX_LEN (512u * 1024 * 1024)

/* Length of the record starting at p if its header is intact (header CRC, a
 * known op, type and flags that op may carry, bounded lengths; a COMMIT has no
 * key or value and a count >= 1), else 0. Does not check that n bytes hold all
 * of it. */
size_t wal_rec_len(const unsigned char *p, size_t n);
/* 1 if the record of length l at p passes its whole-record CRC. */
int wal_rec_ok(const unsigned char *p, size_t l);
uint64_t wal_rec_lsn(const unsigned char *p, size_t l);
#define WAL_SEG_HDR 16       /* "KVSWAL02" + u64 first LSN */
#define WAL_SEG_MAGIC "KVSWAL02" /* a segment's first 8 bytes; 02: header CRC */
/* A segment written in place over zeros (wal_prep.c prepared it ahead, all its
 * blocks written, so a group's fdatasync flushes the data alone, no file size or
 * extent change): its records end where the zeros begin. The log thread syncs at
 * most WAL_PIECE bytes of it before it writes more, so a machine crash can leave
 * out-of-order pages only within WAL_PIECE bytes after the last good record. */
#define WAL_SEG_MAGIC_ZEROED "KVSWAL03"
#define WAL_PIECE (1u << 20)

struct wal_config {
    const char *dir;
    int sync;                /* 1: write + fdatasync every group as soon as it forms (disk mode);
                                0: gather large batches (remote mode: the peer's ack makes a
                                record durable, the local copy follows) */
    uint64_t segment_bytes;  /* start a new segment past this size (default 64 MiB) */
    uint64_t max_pending;    /* appends fail with -EAGAIN past this many bytes held (not yet written, or
                                in ship mode not yet consumed by the sender; default 256 MiB) */
    uint64_t first_lsn;      /* LSN of the next record (after recovery: last recovered + 1) */
    uint32_t sync_delay_us;  /* fault injection: sleep this long before each sync (a slow disk) */
    uint64_t batch_bytes;    /* async mode (sync = 0): write+sync once this much is gathered (16 MiB) */
    uint32_t batch_ms;       /* ... or this long after a batch began (default 1000 ms) */
    int ship;                /* a log sender reads the records too (wal_ship_peek) */
};

/* The sync-latency histogram: bucket i of wal_stats.sync_buckets counts the log
 * thread's fdatasync calls that took more than bound i-1 and at most bound i
 * (microseconds, below); the last bucket, those slower than every bound. Fixed
 * bounds, so that every node's histogram has the same buckets and they add up
 * across nodes (Prometheus's le label): from a write-cached NVMe's 50 us to a
 * stalled disk's second. */
#define WAL_SYNC_BOUNDS_US {50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000}
#define WAL_SYNC_BUCKETS 15  /* the bounds and one past the last */

struct wal_stats {
    uint64_t appended_lsn, durable_lsn, groups, records, bytes, syncs;
    uint64_t sync_ns_total, sync_ns_max, max_group_records;
    uint64_t sync_buckets[WAL_SYNC_BUCKETS]; /* per bucket, not cumulative */
    int failed;              /* the log stopped for good; see wal_error */
    uint64_t write_errors;   /* failed attempts to write or sync a group (each retried) */
    int write_error;         /* wal_write_error now: the disk refuses the log (errno), 0: it does not */
    uint64_t segments, segments_prepared; /* segments started since open; of them, prepared over zeros */
};

/* Upper bound (microseconds) of sync bucket i; 0 for the last bucket (no bound)
 * and for i out of range. */
uint32_t wal_sync_bound_us(int i);

/* Open a new segment in cfg->dir and prepare the log thread (not started). */
int wal_open(struct wal **out, const struct wal_config *cfg, char *err, size_t errlen);
int wal_start(struct wal *w);
/* Write and sync what is buffered, stop the thread, close files. */
void wal_close(struct wal *w);

/* Append a record: op is WAL_SET (| WAL_HASH), WAL_DEL or WAL_FLUSH; the value
 * is v1 followed by v2 (either may be empty), so APPEND can log old+new without
 * copying. Returns the record's LSN (> 0), -EAGAIN if the unwritten backlog is
 * over max_pending, -EIO once the log failed or while the disk refuses it
 * (wal_write_error), -EINVAL for another op.
 * Thread-safe; never blocks on I/O. Inside the calling thread's unit the record
 * joins it; a record appended by another thread while a unit is open (only a
 * FLUSHALL can be: it logs without shard locks) joins that unit too, so the
 * unit stays contiguous in the log and replays in LSN order as it happened. */
int64_t wal_append(struct wal *w, int op, const void *key, uint32_t klen, const void *v1,
                   uint32_t n1, const void *v2, uint32_t n2, int64_t expire_ms);

/* Units. wal_unit_begin marks the calling thread as inside a unit (no shared
 * state changes: the unit opens with its first record, which the caller appends
 * holding every shard lock). Returns 0, -EIO once the log failed, -EBUSY if this
 * thread is already in a unit of w (units do not nest). wal_unit_end closes it:
 * appends the COMMIT record (space for it was reserved with the unit's records,
 * so it cannot fail for want of room) and returns its LSN, or 0 when the unit
 * appended nothing (nothing is written), -EIO once the log failed (the unit is
 * abandoned: its records never become durable), -EINVAL without a unit begun.
 * The records of an open unit are neither written by the log thread nor handed
 * to the sender (wal_ship_peek) until the COMMIT is appended. */
int wal_unit_begin(struct wal *w);
int64_t wal_unit_end(struct wal *w);

/* Raise the durable LSN to lsn if higher (a peer acknowledged it) and wake pollers. */
void wal_publish_durable(struct wal *w, uint64_t lsn);
/* Switch between per-group sync (1) and batched async writes (0), e.g. when the
 * replication peer is lost and comes back. */
void wal_set_sync(struct wal *w, int sync);
/* The log sender's view of the log (ship mode): the records appended since
 * its last wal_ship_consume, up to the start of an open unit (what it sees
 * always ends between units), in place in the log's memory (one copy of each
 * record serves the disk write and the sender): iov[0..n), bytes in all, LSNs
 * first..last (0, 0: none). The memory stays valid until the sender consumes
 * it. The sender thread only. */
struct iovec;
struct wal_chunk;
struct wal_ship {
    struct iovec *iov;
    int n, cap;
    size_t bytes;
    uint64_t first, last;
    /* where the view ends (private to wal.c) */
    struct wal_chunk *end_c;
    size_t end_off;
    uint64_t end_lsn, end_bytes;
};
/* Fill v with what the sender may take now (what it has not consumed: a view
 * taken before and not consumed is seen again, with what came since). Returns
 * v->last, 0 if none. */
uint64_t wal_ship_peek(struct wal *w, struct wal_ship *v);
/* The sender is done with v's records up to LSN upto (a prefix of them, or all:
 * v->last or more; none below v->first): their memory may be reused. v is empty
 * afterwards in every case (peek again for what was not consumed). */
void wal_ship_consume(struct wal *w, struct wal_ship *v, uint64_t upto);
void wal_ship_free(struct wal_ship *v);
/* The sender's sleep (ship mode). wal_ship_sleep(w, 1): the sender is about
 * to sleep with nothing in flight: returns 1 if nothing it may take was
 * appended since its last wal_ship_peek (it may then sleep: the next append it
 * may take, or a unit's COMMIT, writes 1 to wal_ship_fd, an eventfd), 0 if
 * something was (ship it, do not sleep). wal_ship_sleep(w, 0): it woke (or did
 * not sleep): appenders stop writing the eventfd, which is drained; returns 0.
 * wal_ship_fd: -1 without ship mode. The sender thread only. */
int wal_ship_fd(struct wal *w);
int wal_ship_sleep(struct wal *w, int sleep);
/* Last LSN written to the current segment file (readable, maybe not synced). */
uint64_t wal_written_lsn(struct wal *w);
/* Last LSN synced to the local disk; last LSN appended. */
uint64_t wal_synced_lsn(struct wal *w);
uint64_t wal_appended_lsn(struct wal *w);
const char *wal_dir(struct wal *w);

/* Highest LSN known durable (acquire: a reader that sees it may release replies). */
uint64_t wal_durable_lsn(struct wal *w);
int wal_failed(struct wal *w);
const char *wal_error(struct wal *w);
/* The disk refuses the log now (a write or sync failed: ENOSPC, EIO, ...): the
 * errno of the last failure, and what failed in msg (n bytes, may be NULL), or
 * 0 while writing works (without msg: one relaxed load, no lock, so every
 * write command may ask). Meanwhile the log thread retries the same group with
 * backoff (10 ms doubling to 1 s; the group's replies wait), and wal_append and
 * wal_unit_begin return -EIO except inside a unit already begun; once a retry
 * succeeds this returns 0 again and appends are accepted. Any thread. */
int wal_write_error(struct wal *w, char *msg, size_t n);
/* When the durable LSN moves on (and when the log fails) the log writes 1 to
 * each subscribed eventfd whose subscriber wants it (wal_want; by default at
 * every move). */
int wal_subscribe(struct wal *w, int evfd);
/* The subscriber of evfd (its thread only) wants a wake-up once the durable LSN
 * reaches lsn, no earlier: UINT64_MAX for none (awake, or no reply held), 0 for
 * every move. Returns the durable LSN read after the want is published: if it
 * is >= lsn already, no wake-up may come for it — look now. *slot caches
 * evfd's place (start with -1). A failure of the log wakes every subscriber. */
uint64_t wal_want(struct wal *w, int *slot, int evfd, uint64_t lsn);
void wal_get_stats(struct wal *w, struct wal_stats *st);
struct latmon;
/* Report each sync's duration to lm (core/latmon.h, event log-sync), NULL: none. Any thread. */
void wal_set_latmon(struct wal *w, struct latmon *lm);

/* A logger for kvt_set_log (table.h): arg is the struct wal *. KVT_LOG_SET
 * (| KVT_LOG_HASH), KVT_LOG_DEL and KVT_LOG_FLUSH append; KVT_LOG_UNIT_BEGIN and
 * KVT_LOG_UNIT_END are wal_unit_begin and wal_unit_end. */
int64_t wal_log_fn(void *arg, int op, const void *key, size_t klen, const void *v1, size_t n1,
                   const void *v2, size_t n2, int64_t expire_ms);

struct wal_recovery {
    uint64_t records, first_lsn, last_lsn, segments, bytes;
    uint64_t truncated_bytes;   /* torn tail (and unit without its COMMIT) cut from the end */
    uint64_t units, dropped_units; /* units applied (or counted); units cut short by the end */
    char problem[512];          /* what stopped the replay, "" if the log ended cleanly */
};

/* write() all n bytes (retrying short writes and EINTR). Returns 0 or -errno. */
int wal_write_all(int fd, const void *buf, size_t n);

/* Create segment <dir>/wal-<first>.log with its header, synced with its directory
 * entry (dirfd). Returns the open fd (O_APPEND) or -errno with a message. */
int wal_seg_create(const char *dir, int dirfd, uint64_t first, char *err, size_t errlen);
/* Make the prepared file tmp (fd: a synced file of zeros) segment <dir>/wal-<first>.log:
 * its header (WAL_SEG_MAGIC_ZEROED) written and synced, then renamed, the directory
 * synced. Returns 0 or -errno with a message; fd stays open either way. */
int wal_seg_adopt(const char *dir, int dirfd, int fd, const char *tmp, uint64_t first, char *err, size_t errlen);

/* Append to out the complete, valid records with from <= LSN <= upto found in
 * dir's segments, about max_bytes at most. Returns the last LSN appended (0 if
 * none) or -errno. Used to catch a replication peer up from the files. The range
 * may start or end inside a unit: the receiver stores records verbatim and
 * acknowledges only up to the last COMMIT it holds (replog_recv.c). */
int64_t wal_read_range(const char *dir, uint64_t from, uint64_t upto, size_t max_bytes, struct kvbuf *out);

/* The log's manifest (wal_manifest.c): <dir>/wal.manifest names the newest
 * segment the log created. wal_manifest_write records newest (synced, with
 * dirfd); returns 0 or -errno with a message. wal_manifest_read: 1 and
 * *newest, 0 if there is none, -EILSEQ if damaged, -errno. wal_manifest_check:
 * 0 if a segment at least as new as the one named is present (newest_present:
 * the newest segment's first LSN, nseg: how many there are) or there is no
 * manifest, else -EILSEQ (or -errno) with what is missing in err. */
int wal_manifest_write(const char *dir, int dirfd, uint64_t newest, char *err, size_t errlen);
int wal_manifest_read(const char *dir, uint64_t *newest, char *err, size_t errlen);
int wal_manifest_check(const char *dir, uint64_t newest_present, int nseg, char *err, size_t errlen);

/* Delete the segments whose records all have LSN <= upto (never the newest):
 * called once the data file holds everything up to upto. Returns the number
 * deleted or -errno. */
int wal_truncate(const char *dir, uint64_t upto);

/* Replay every segment of dir into t (t may be NULL: only check and count) (records with LSN > after_lsn), in LSN order.
 * A torn tail of the last segment (a record cut short by a crash) is reported and,
 * if repair is set, truncated away. Corruption anywhere else (a bad CRC with valid
 * data after it, a bad segment header, an LSN going backwards) stops the replay:
 * returns -EILSEQ with the place in err; nothing after it is applied.
 * A unit is applied when its COMMIT is read; a unit the log ends inside (a crash
 * before its COMMIT was written) is dropped whole, reported in rec->problem and,
 * if repair is set, truncated away with the torn tail; rec->last_lsn is then the
 * LSN before it. A COMMIT without a unit, a plain record inside a unit or a
 * COMMIT whose count disagrees with its unit is corruption (-EILSEQ). A log whose
 * first record lies inside a unit (older segments deleted) is read as it is:
 * the unit's missing records are below the first LSN.
 * When replaying (t != NULL) the first segment must start at or before
 * after_lsn + 1 (what the data file holds), or segments are missing (-EILSEQ).
 * Returns 0 (see *rec for what was recovered) or -errno. */
int wal_recover(struct kv_table *t, const char *dir, uint64_t after_lsn, int repair,
                struct wal_recovery *rec, char *err, size_t errlen);

#endif
