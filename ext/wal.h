/* wal.h - the write-ahead log: group-committed segment files of CRC-checked records.
 *
 * Writers (poller threads, under the key's shard lock so that per-key log order
 * is apply order) append records into an in-memory buffer and get an LSN; they
 * never block on I/O. One log thread swaps the buffer, writes it with one write()
 * and makes it durable with one fdatasync() (group commit), then publishes the
 * durable LSN and wakes every subscribed poller through its eventfd. Recovery
 * reads the segments back, checks every record's CRC32C and stops at the first
 * bad one. Files: <dir>/wal-<first LSN, 16 hex>.log, each opening with a 16-byte
 * header. Record layout (little-endian):
 *   u32 crc | u32 klen | u32 vlen | u8 op | u8 pad[3] | i64 expire_ms | key | value | u64 lsn
 * crc = CRC32C of everything after it. Recovery parses untrusted bytes: every
 * length is bounded.
 */
#ifndef KV_WAL_H
#define KV_WAL_H

#include <stddef.h>
#include <stdint.h>

struct kv_table;
struct wal;

enum wal_op { WAL_SET = 1, WAL_DEL = 2, WAL_FLUSH = 3 };

#define WAL_HDR 32           /* bytes before the key: crc, klen, vlen, op, pad, expire... */
#define WAL_TRAILER 8        /* the LSN after the value */
#define WAL_SEG_HDR 16       /* "KVSWAL01" + u64 first LSN */

struct wal_config {
    const char *dir;
    int sync;                /* 1: fdatasync every group before it counts as durable */
    uint64_t segment_bytes;  /* start a new segment past this size (default 64 MiB) */
    uint64_t max_pending;    /* appends fail with -EAGAIN past this many unwritten bytes (default 256 MiB) */
    uint64_t first_lsn;      /* LSN of the next record (after recovery: last recovered + 1) */
    uint32_t sync_delay_us;  /* fault injection: sleep this long before each sync (a slow disk) */
};

struct wal_stats {
    uint64_t appended_lsn, durable_lsn, groups, records, bytes, syncs;
    uint64_t sync_ns_total, sync_ns_max, max_group_records;
    int failed;              /* an I/O error stopped the log; see wal_error */
};

/* Open a new segment in cfg->dir and prepare the log thread (not started). */
int wal_open(struct wal **out, const struct wal_config *cfg, char *err, size_t errlen);
int wal_start(struct wal *w);
/* Write and sync what is buffered, stop the thread, close files. */
void wal_close(struct wal *w);

/* Append a record; the value is v1 followed by v2 (either may be empty), so
 * APPEND can log old+new without copying. Returns the record's LSN (> 0),
 * -EAGAIN if the unwritten backlog is over max_pending, -EIO once the log failed.
 * Thread-safe; never blocks on I/O. */
int64_t wal_append(struct wal *w, int op, const void *key, uint32_t klen, const void *v1,
                   uint32_t n1, const void *v2, uint32_t n2, int64_t expire_ms);

/* Highest LSN known durable (acquire: a reader that sees it may release replies). */
uint64_t wal_durable_lsn(struct wal *w);
int wal_failed(struct wal *w);
const char *wal_error(struct wal *w);
/* After every group the log thread writes 1 to each subscribed eventfd. */
int wal_subscribe(struct wal *w, int evfd);
void wal_get_stats(struct wal *w, struct wal_stats *st);

/* A logger for kvt_set_log (table.h): arg is the struct wal *. */
int64_t wal_log_fn(void *arg, int op, const void *key, size_t klen, const void *v1, size_t n1,
                   const void *v2, size_t n2, int64_t expire_ms);

struct wal_recovery {
    uint64_t records, first_lsn, last_lsn, segments, bytes;
    uint64_t truncated_bytes;   /* torn tail cut from the last segment */
    char problem[512];          /* what stopped the replay, "" if the log ended cleanly */
};

/* Replay every segment of dir into t (records with LSN > after_lsn), in LSN order.
 * A torn tail of the last segment (a record cut short by a crash) is reported and,
 * if repair is set, truncated away. Corruption anywhere else (a bad CRC with valid
 * data after it, a bad segment header, an LSN going backwards) stops the replay:
 * returns -EILSEQ with the place in err; nothing after it is applied.
 * Returns 0 (see *rec for what was recovered) or -errno. */
int wal_recover(struct kv_table *t, const char *dir, uint64_t after_lsn, int repair,
                struct wal_recovery *rec, char *err, size_t errlen);

#endif
