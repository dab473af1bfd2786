/* wal_int.h - the log's insides, shared by its parts (not an interface: wal.h is):
 * wal.c (open, appends, units, close), wal_write.c (the log thread: group writes,
 * the disk-full retry) and wal_ship.c (the chunks the records live in, and the log
 * sender's view of them). */
#ifndef KV_WAL_INT_H
#define KV_WAL_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "durability/wal.h"
#include "durability/wal_notify.h"

#ifndef WAL_CHUNK_BYTES        /* (the stress test builds with small chunks: many boundaries) */
#define WAL_CHUNK_BYTES (1u << 20)
#endif
#define CHUNK_BYTES WAL_CHUNK_BYTES /* a chunk's size (a larger record gets a chunk of its own size) */
#define SYNC_SPARES 4 /* spare chunks kept in sync mode (async mode: max_spare, a batch's worth) */

/* A piece of the log's memory: whole records, appended at len. len changes under
 * w->lock while the chunk is the tail; once next is set it is final. */
struct wal_chunk {
    struct wal_chunk *next;
    size_t cap, len;
    unsigned char data[];
};

/* A place in the chunk list: before the record with LSN lsn, after bytes bytes
 * appended since the log opened. */
struct wal_pos {
    struct wal_chunk *c;
    size_t off;
    uint64_t lsn, bytes;
};

struct wal {
    char *dir;
    int dirfd, fd;
    _Atomic int sync;         /* 1: fdatasync every group (disk mode, or remote mode without its peer) */
    uint32_t sync_delay_us;
    uint64_t batch_bytes;     /* async mode: write once this much is gathered ... */
    uint64_t batch_ns;        /* ... or this long after the first record of a batch */
    int ship;                 /* a log sender reads the records too (wal_ship_peek) */
    /* The sender's wake-up (ship mode): ship_pending is 1 once a record the
     * sender may take (not inside an open unit) was appended since its last
     * wal_ship_peek; ship_idle is 1 while the sender sleeps on ship_evfd with
     * nothing in flight. An appender that raises ship_pending and sees
     * ship_idle writes ship_evfd; both sides use seq_cst (store one flag, then
     * load the other: Dekker), so either the sender sees the record before it
     * sleeps or the appender sees the sleeper. Only the edge 0 -> 1 of
     * ship_pending costs an appender anything (one load otherwise). */
    _Atomic int ship_pending, ship_idle;
    int ship_evfd;
    _Atomic uint64_t written_lsn; /* last LSN written to the segment file (not necessarily synced) */
    _Atomic uint64_t synced_lsn;  /* last LSN made durable on the local disk */
    uint64_t seg_limit, seg_size, max_pending;
    pthread_mutex_t lock;     /* guards the chunks and positions, next_lsn, total, stop, unit_* */
    pthread_cond_t cond;      /* signalled when records come for the log thread, or on stop */
    struct wal_chunk *head, *tail, *spare; /* the chunks in order (appends go to tail); spares */
    int nspare, max_spare;    /* spares kept in async mode: a batch's worth (fresh memory costs a
                               * page fault per 4 KiB); SYNC_SPARES in sync mode (wal_ship.c) */
    uint64_t total;           /* bytes appended since the log opened */
    struct wal_pos disk;      /* the log thread's cursor: what it has not written yet starts here */
    uint64_t disk_taken;      /* bytes: the end of what the log thread took (== disk.bytes when idle) */
    struct wal_pos shipc;     /* the sender's cursor (ship mode): what it has not consumed */
    uint64_t next_lsn, appended_lsn;
    int stop, running;
    /* The open unit (between its first record and its COMMIT): its first LSN,
     * where it starts, how many records it has. */
    int unit_open;
    uint64_t unit_first;
    struct wal_pos unit_pos;
    uint32_t unit_n;
    pthread_t th;
    _Atomic uint64_t durable_lsn;
    _Atomic int failed, failing;
    char error[256];          /* written once, by whoever set failing, before failed is set (release) */
    /* A write or sync that failed (ENOSPC, EIO...) and is being retried: werr is
     * its errno (0: writing works), werr_msg what failed (under lock: INFO reads
     * it); appends outside a unit are refused meanwhile. Log thread writes. */
    _Atomic int werr;
    char werr_msg[256];
    _Atomic uint64_t write_errors;
    uint64_t werr_since;      /* log thread: when the current run of failures began */
    struct wal_notify notify;
    _Atomic uint64_t groups, records, bytes, syncs, sync_ns_total, sync_ns_max, max_group;
    _Atomic uint64_t sync_hist[WAL_SYNC_BUCKETS]; /* written by the log thread only */
    struct latmon *_Atomic latmon; /* LATENCY's monitor (set by the engine while running) */
    /* The segment being written: 0 while it is appended to (it grows with each
     * group), else the size it was prepared at (written in place over zeros). */
    uint64_t seg_cap;
    _Atomic uint64_t segments, segments_prepared;
    /* The next segment, prepared ahead by the preparer thread (wal_prep.c):
     * prep is PREP_NONE, PREP_WANTED (the log thread asked) or PREP_READY
     * (prep_fd is a synced file of seg_limit zeros, PREP_NAME in dir). prep
     * changes under prep_lock; the log thread reads it without. */
    pthread_mutex_t prep_lock;
    pthread_cond_t prep_cond;
    _Atomic int prep, prep_stop;
    int prep_fd, prep_running;
    uint64_t prep_retry_ns;   /* after a failed preparation: not again before this */
    pthread_t prep_th;
};

enum { PREP_NONE, PREP_WANTED, PREP_READY };
#define PREP_NAME "wal-prepared.tmp"

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Where the next record goes. Caller holds w->lock. */
static inline struct wal_pos wal_end_pos(const struct wal *w)
{
    return (struct wal_pos){w->tail, w->tail->len, w->next_lsn, w->total};
}

/* A new chunk of cap bytes (a spare when it is of the usual size), or NULL.
 * Caller holds w->lock. */
struct wal_chunk *wal_chunk_new(struct wal *w, size_t cap);

/* Room for need bytes at the tail (a new chunk when they do not fit): the place
 * to write, or NULL without memory. Caller holds w->lock. */
static inline unsigned char *wal_room(struct wal *w, size_t need)
{
    struct wal_chunk *c = w->tail;
    if (c->cap - c->len >= need)
        return c->data + c->len;
    struct wal_chunk *n = wal_chunk_new(w, need > CHUNK_BYTES ? need : CHUNK_BYTES);
    if (!n)
        return NULL;
    c->next = n;
    w->tail = n;
    return n->data;
}

/* Bytes appended that a consumer has not passed yet (what max_pending bounds). */
static inline uint64_t wal_backlog(const struct wal *w)
{
    uint64_t done = w->disk.bytes;
    if (w->ship && w->shipc.bytes < done)
        done = w->shipc.bytes;
    return w->total - done;
}

void wal_pos_norm(struct wal_pos *p);
void wal_recycle(struct wal *w);

/* Stop the log for good: the first failure names the error (what: e). */
void wal_fail(struct wal *w, const char *what, int e);
/* Start the segment whose first record has LSN first (synced with its name and
 * the manifest) and write there from now on. 0 or -errno with a message. */
int wal_seg_switch(struct wal *w, uint64_t first, char *err, size_t errlen);
/* The log thread (wal_write.c). */
void *wal_log_thread(void *arg);
/* The preparer thread (wal_prep.c); the log thread asks it for the next segment
 * (wal_prep_want) and takes it when ready (wal_prep_take: its fd, or -1). */
void *wal_prep_thread(void *arg);
void wal_prep_want(struct wal *w);
int wal_prep_take(struct wal *w);
/* <dir>/PREP_NAME into dst. */
void wal_prep_path(const struct wal *w, char *dst, size_t n);

#endif
