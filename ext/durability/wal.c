/* wal.c - group-committed write-ahead log (see wal.h); recovery is in wal_recover.c.
 * Threads: any number of appenders (under w->lock, held only for a memcpy), one log
 * thread doing the I/O, and in ship mode the log sender. Records are copied once,
 * into a list of chunks that never move (a record never spans two); the log thread
 * writes them with writev and the sender ships them with sendmsg from the same
 * memory, each with its own cursor, and a chunk is recycled once both passed it.
 * Bytes before a consumer's end (taken under w->lock) never change, so each
 * consumer reads them without the lock. Lock order: a table shard lock, then w->lock. fsync
 * ordering: a group's durable LSN is published only after its write() and
 * fdatasync() returned; a new segment's directory entry is synced (fsync of the
 * directory) before records in it can count as durable. Units: while one is open
 * (w->unit_open, under w->lock) the log thread takes no records, so
 * every group, every segment switch and every durable LSN falls between units.
 * A full or failing disk: a group whose write or sync fails is retried from
 * memory with backoff, the segment cut back to where it began each time, and
 * appends are refused meanwhile (write_group_retrying); nothing stops for good. */
#define _GNU_SOURCE
#include "durability/wal.h"
#include "durability/wal_notify.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/latmon.h"
#include "core/log.h"
#include "core/table.h"


static void fail(struct wal *w, const char *what, int e);

/* The log whose unit the calling thread is in (wal_unit_begin .. wal_unit_end),
 * so an append knows without a lock that its record belongs to a unit. */
static __thread struct wal *unit_of_thread __attribute__((tls_model("initial-exec")));

#ifndef WAL_CHUNK_BYTES        /* (the stress test builds with small chunks: many boundaries) */
#define WAL_CHUNK_BYTES (1u << 20)
#endif
#define CHUNK_BYTES WAL_CHUNK_BYTES /* a chunk's size (a larger record gets a chunk of its own size) */
#define SPARE_CHUNKS 4         /* emptied chunks kept for reuse */

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
     * wal_take_ship; ship_idle is 1 while the sender sleeps on ship_evfd with
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
    int nspare;
    uint64_t total;           /* bytes appended since the log opened */
    struct wal_pos disk;      /* the log thread's cursor: what it has not written yet starts here */
    uint64_t disk_taken;      /* bytes: the end of what the log thread took (== disk.bytes when idle) */
    struct wal_pos shipc;     /* the sender's cursor (ship mode): what it has not consumed */
    struct iovec *wiov;       /* the log thread's iovecs for a group */
    int wiov_cap;
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
};

static const uint32_t sync_bounds_us[] = WAL_SYNC_BOUNDS_US;
_Static_assert(sizeof sync_bounds_us / sizeof *sync_bounds_us == WAL_SYNC_BUCKETS - 1,
               "WAL_SYNC_BUCKETS is the number of WAL_SYNC_BOUNDS_US plus one");

uint32_t wal_sync_bound_us(int i) { return i >= 0 && i < WAL_SYNC_BUCKETS - 1 ? sync_bounds_us[i] : 0; }

/* The histogram bucket of a sync that took ns nanoseconds (14 bounds: a linear scan). */
static int sync_bucket(uint64_t ns)
{
    int i = 0;
    while (i < WAL_SYNC_BUCKETS - 1 && ns > (uint64_t)sync_bounds_us[i] * 1000)
        i++;
    return i;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ chunks */

static struct wal_chunk *chunk_new(struct wal *w, size_t cap)
{
    struct wal_chunk *c;
    if (cap == CHUNK_BYTES && w->spare) {
        c = w->spare;
        w->spare = c->next;
        w->nspare--;
    } else if (!(c = malloc(sizeof *c + cap))) {
        return NULL;
    }
    c->next = NULL;
    c->cap = cap;
    c->len = 0;
    return c;
}

static void chunk_drop(struct wal *w, struct wal_chunk *c)
{
    if (c->cap == CHUNK_BYTES && w->nspare < SPARE_CHUNKS) {
        c->next = w->spare;
        w->spare = c;
        w->nspare++;
    } else {
        free(c);
    }
}

/* Where the next record goes. Caller holds w->lock. */
static inline struct wal_pos end_pos(const struct wal *w)
{
    return (struct wal_pos){w->tail, w->tail->len, w->next_lsn, w->total};
}

/* A cursor at the end of a chunk that has a successor moves to the successor's
 * start (so that the chunk behind it can go). Caller holds w->lock. */
static void pos_norm(struct wal_pos *p)
{
    while (p->off == p->c->len && p->c->next) {
        p->c = p->c->next;
        p->off = 0;
    }
}

/* Recycle the chunks both cursors passed; with nothing left to read, start the
 * tail over (an oversized one is replaced). Caller holds w->lock. */
static void recycle(struct wal *w)
{
    pos_norm(&w->disk);
    if (w->ship)
        pos_norm(&w->shipc);
    else
        w->shipc = w->disk;
    while (w->head != w->disk.c && w->head != w->shipc.c) {
        struct wal_chunk *c = w->head;
        w->head = c->next;
        chunk_drop(w, c);
    }
    if (w->disk.bytes == w->total && w->shipc.bytes == w->total && w->disk_taken == w->total &&
        !w->unit_open && w->head == w->tail) {
        if (w->tail->cap != CHUNK_BYTES) {
            struct wal_chunk *c = chunk_new(w, CHUNK_BYTES);
            if (!c)
                return;
            free(w->tail);
            w->head = w->tail = c;
        }
        w->tail->len = 0;
        w->disk.c = w->shipc.c = w->tail;
        w->disk.off = w->shipc.off = 0;
    }
}

/* Room for need bytes at the tail (a new chunk when they do not fit): the place
 * to write, or NULL without memory. Caller holds w->lock. */
static inline unsigned char *room(struct wal *w, size_t need)
{
    struct wal_chunk *c = w->tail;
    if (c->cap - c->len >= need)
        return c->data + c->len;
    struct wal_chunk *n = chunk_new(w, need > CHUNK_BYTES ? need : CHUNK_BYTES);
    if (!n)
        return NULL;
    c->next = n;
    w->tail = n;
    return n->data;
}

/* Bytes appended that a consumer has not passed yet (what max_pending bounds). */
static inline uint64_t backlog(const struct wal *w)
{
    uint64_t done = w->disk.bytes;
    if (w->ship && w->shipc.bytes < done)
        done = w->shipc.bytes;
    return w->total - done;
}

/* The records in [from, to) as iovecs into *iov (grown as needed; *cap its
 * size). Without w->lock: every chunk before to.c is final and none is recycled
 * while the caller's cursor stands at from. Returns the count, or -ENOMEM. */
static int pos_iov(struct wal_pos from, struct wal_pos to, struct iovec **iov, int *cap)
{
    int n = 0;
    for (struct wal_chunk *c = from.c;; c = c->next) {
        size_t off = c == from.c ? from.off : 0, end = c == to.c ? to.off : c->len;
        if (end > off) {
            if (n == *cap) {
                int ncap = *cap ? *cap * 2 : 16;
                struct iovec *v = realloc(*iov, (size_t)ncap * sizeof *v);
                if (!v)
                    return -ENOMEM;
                *iov = v;
                *cap = ncap;
            }
            (*iov)[n++] = (struct iovec){c->data + off, end - off};
        }
        if (c == to.c)
            return n;
    }
}

/* Create the segment whose first record has LSN first; its name and header are
 * synced (file and directory) so a crash cannot lose the file holding synced records. */
static int seg_create(struct wal *w, uint64_t first, char *err, size_t errlen)
{
    int fd = wal_seg_create(w->dir, w->dirfd, first, err, errlen);
    if (fd < 0)
        return fd;
    int rc = wal_manifest_write(w->dir, w->dirfd, first, err, errlen); /* a lost last segment shows */
    if (rc) {
        close(fd);
        return rc;
    }
    if (w->fd >= 0)
        close(w->fd);
    w->fd = fd;
    w->seg_size = WAL_SEG_HDR;
    return 0;
}

int wal_open(struct wal **out, const struct wal_config *cfg, char *err, size_t errlen)
{
    struct wal *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->fd = w->dirfd = w->ship_evfd = -1;
    w->dir = strdup(cfg->dir);
    atomic_init(&w->sync, cfg->sync);
    w->sync_delay_us = cfg->sync_delay_us;
    w->batch_bytes = cfg->batch_bytes ? cfg->batch_bytes : 16u << 20;
    w->batch_ns = (cfg->batch_ms ? cfg->batch_ms : 1000) * 1000000ull;
    w->ship = cfg->ship;
    w->seg_limit = cfg->segment_bytes ? cfg->segment_bytes : 64u << 20;
    w->max_pending = cfg->max_pending ? cfg->max_pending : 256u << 20;
    w->next_lsn = cfg->first_lsn ? cfg->first_lsn : 1;
    w->appended_lsn = w->next_lsn - 1;
    if (!(w->head = w->tail = chunk_new(w, CHUNK_BYTES))) {
        free(w->dir);
        free(w);
        return -ENOMEM;
    }
    w->disk = w->shipc = end_pos(w);
    atomic_init(&w->durable_lsn, w->next_lsn - 1);
    atomic_init(&w->written_lsn, w->next_lsn - 1);
    atomic_init(&w->synced_lsn, w->next_lsn - 1);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    wal_notify_init(&w->notify);
    if (w->ship && (w->ship_evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot create the log sender's eventfd: %s", strerror(e));
        wal_close(w);
        return -e;
    }
    if (mkdir(cfg->dir, 0755) && errno != EEXIST) {
        int e = errno;
        snprintf(err, errlen, "cannot create log directory %s: %s", cfg->dir, strerror(e));
        wal_close(w);
        return -e;
    }
    w->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->dirfd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open log directory %s: %s", cfg->dir, strerror(e));
        w->dirfd = -1;
        wal_close(w);
        return -e;
    }
    int rc = seg_create(w, w->next_lsn, err, errlen);
    if (rc) {
        wal_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* The record header for op/type/flags/count and the CRC of everything in the
 * record but its LSN (the LSN is added under the lock). */
static inline __attribute__((always_inline)) uint32_t rec_head(unsigned char *hdr, int op, int type, int flags, uint32_t count, const void *key,
                         uint32_t klen, const void *v1, uint32_t n1, const void *v2, uint32_t n2, int64_t expire_ms)
{
    memset(hdr, 0, WAL_HDR);
    put32(hdr + WAL_OFF_KLEN, klen);
    put32(hdr + WAL_OFF_VLEN, n1 + n2);
    hdr[WAL_OFF_OP] = (unsigned char)op;
    hdr[WAL_OFF_TYPE] = (unsigned char)type;
    hdr[WAL_OFF_FLAGS] = (unsigned char)flags;
    put64(hdr + WAL_OFF_EXPIRE, (uint64_t)expire_ms);
    put32(hdr + WAL_OFF_COUNT, count);
    put32(hdr + WAL_OFF_HCRC, crc32c(0, hdr + WAL_OFF_KLEN, WAL_HDR - WAL_OFF_KLEN));
    uint32_t crc = crc32c(0, hdr + 4, WAL_HDR - 4);
    crc = crc32c(crc, key, klen);
    if (n1)
        crc = crc32c(crc, v1, n1);
    if (n2)
        crc = crc32c(crc, v2, n2);
    return crc;
}

/* Copy a record to p (room() gave it: at the tail chunk's end) with the next
 * LSN: the one copy of it, which the log thread writes and the sender ships.
 * Caller holds w->lock. Returns the LSN. */
static inline __attribute__((always_inline)) uint64_t do_put(struct wal *w, unsigned char *p, unsigned char *hdr,
                                                             uint32_t crc, size_t rec, const void *key, uint32_t klen,
                                                             const void *v1, uint32_t n1, const void *v2, uint32_t n2)
{
    uint64_t lsn = w->next_lsn++;
    put64(p + rec - WAL_TRAILER, lsn);
    put32(hdr, crc32c(crc, p + rec - WAL_TRAILER, WAL_TRAILER));
    memcpy(p, hdr, WAL_HDR);
    memcpy(p + WAL_HDR, key, klen);
    if (n1)
        memcpy(p + WAL_HDR + klen, v1, n1);
    if (n2)
        memcpy(p + WAL_HDR + klen + n1, v2, n2);
    w->tail->len += rec;
    w->total += rec;
    w->appended_lsn = lsn;
    return lsn;
}

/* Records the sender may take were appended (ship mode; caller holds w->lock,
 * no unit open): raise ship_pending on its edge. Returns 1 if the sender sleeps
 * and must be woken (ship_wake, after the lock is released). */
static inline int ship_mark(struct wal *w)
{
    if (!w->ship || atomic_load_explicit(&w->ship_pending, memory_order_relaxed))
        return 0;
    atomic_store_explicit(&w->ship_pending, 1, memory_order_seq_cst); /* then look for the sleeper */
    return atomic_load_explicit(&w->ship_idle, memory_order_seq_cst);
}

static __attribute__((noinline)) void ship_wake(struct wal *w)
{
    uint64_t one = 1;
    ssize_t r = write(w->ship_evfd, &one, sizeof one);
    (void)r; /* EAGAIN: the counter is non-zero already, the sender wakes */
}

/* Append inside a unit (in_unit), or while another thread's unit is open: the
 * rare path, out of line so that the common one stays as short as before units.
 * Caller holds w->lock; this releases it. */
static __attribute__((noinline)) int64_t unit_put(struct wal *w, int in_unit, unsigned char *hdr, uint32_t crc,
                                                   size_t rec, const void *key, uint32_t klen, const void *v1,
                                                   uint32_t n1, const void *v2, uint32_t n2)
{
    if (!in_unit) {
        /* Another thread's unit is open and this record lands inside it (a
         * FLUSHALL logs without shard locks): it joins the unit, whose records
         * must be contiguous, and replays in its place in LSN order, as it was
         * applied. The header was made without the flag: set it, CRCs again. */
        hdr[WAL_OFF_FLAGS] = WAL_F_UNIT;
        crc = rec_head(hdr, hdr[WAL_OFF_OP], hdr[WAL_OFF_TYPE], WAL_F_UNIT, 0, key, klen, v1, n1, v2, n2,
                       (int64_t)get64(hdr + WAL_OFF_EXPIRE));
    }
    /* A unit's records keep room for its COMMIT after them in their chunk, so
     * closing it cannot fail (every record appended while it is open is one of
     * its records). */
    unsigned char *p;
    if (backlog(w) + rec > w->max_pending || !(p = room(w, rec + WAL_COMMIT_LEN))) {
        pthread_mutex_unlock(&w->lock);
        return -EAGAIN;
    }
    int was_empty = w->total == w->disk_taken;
    if (!w->unit_open) {
        w->unit_open = 1;
        w->unit_first = w->next_lsn;
        w->unit_pos = (struct wal_pos){w->tail, w->tail->len, w->next_lsn, w->total};
        w->unit_n = 0;
    }
    w->unit_n++;
    uint64_t lsn = do_put(w, p, hdr, crc, rec, key, klen, v1, n1, v2, n2);
    pthread_mutex_unlock(&w->lock);
    if (was_empty) /* the log thread checks for the unit's end then */
        pthread_cond_signal(&w->cond);
    return (int64_t)lsn;
}

int64_t wal_append(struct wal *w, int op, const void *key, uint32_t klen, const void *v1,
                   uint32_t n1, const void *v2, uint32_t n2, int64_t expire_ms)
{
    if (atomic_load_explicit(&w->failed, memory_order_relaxed))
        return -EIO;
    /* While the disk cannot be written new changes are refused, but a unit
     * already begun is completed (its COMMIT must follow its records): it is
     * written with the rest once the disk is back. */
    if (__builtin_expect(atomic_load_explicit(&w->werr, memory_order_relaxed) != 0, 0) && unit_of_thread != w)
        return -EIO;
    int type = WAL_T_STRING;
    if (__builtin_expect(op != WAL_SET, 0)) {
        if (op == (WAL_SET | WAL_HASH)) {
            op = WAL_SET;
            type = WAL_T_HASH;
        } else if (op != WAL_DEL && op != WAL_FLUSH) {
            return -EINVAL;
        }
    }
    /* A thread-local read, no lock: only this thread changes unit_of_thread. */
    int in_unit = unit_of_thread == w;
    size_t rec = WAL_HDR + (size_t)klen + n1 + n2 + WAL_TRAILER;
    unsigned char hdr[WAL_HDR];
    /* The CRC of everything but the LSN is computed outside the lock. */
    uint32_t crc = rec_head(hdr, op, type, in_unit ? WAL_F_UNIT : 0, 0, key, klen, v1, n1, v2, n2, expire_ms);

    pthread_mutex_lock(&w->lock);
    if (__builtin_expect(in_unit || w->unit_open, 0))
        return unit_put(w, in_unit, hdr, crc, rec, key, klen, v1, n1, v2, n2);
    unsigned char *p;
    if (backlog(w) + rec > w->max_pending || !(p = room(w, rec))) {
        pthread_mutex_unlock(&w->lock);
        return -EAGAIN;
    }
    int was_empty = w->total == w->disk_taken;
    uint64_t lsn = do_put(w, p, hdr, crc, rec, key, klen, v1, n1, v2, n2);
    int wake = ship_mark(w);
    pthread_mutex_unlock(&w->lock);
    if (was_empty) /* the log thread sleeps only while the buffer is empty */
        pthread_cond_signal(&w->cond);
    if (__builtin_expect(wake, 0))
        ship_wake(w);
    return (int64_t)lsn;
}

int wal_unit_begin(struct wal *w)
{
    if (atomic_load_explicit(&w->failed, memory_order_relaxed) || atomic_load_explicit(&w->werr, memory_order_relaxed))
        return -EIO;
    if (unit_of_thread == w)
        return -EBUSY;
    unit_of_thread = w;
    return 0;
}

int64_t wal_unit_end(struct wal *w)
{
    if (unit_of_thread != w)
        return -EINVAL;
    unit_of_thread = NULL;
    int64_t rc = 0;
    pthread_mutex_lock(&w->lock);
    if (w->unit_open) {
        if (atomic_load_explicit(&w->failed, memory_order_relaxed)) {
            rc = -EIO;
        } else {
            /* The room was reserved after every record of the unit in its chunk,
             * and only the unit's records were appended since: this finds it. */
            unsigned char *p = room(w, WAL_COMMIT_LEN);
            if (!p) {
                /* A unit left without its COMMIT may only end the log: stop it. */
                rc = -ENOMEM;
                fail(w, "closing a unit", ENOMEM);
            } else {
                unsigned char hdr[WAL_HDR];
                /* no key: any valid pointer with length 0 */
                uint32_t crc = rec_head(hdr, WAL_COMMIT, 0, 0, w->unit_n, hdr, 0, NULL, 0, NULL, 0, 0);
                rc = (int64_t)do_put(w, p, hdr, crc, WAL_COMMIT_LEN, hdr, 0, NULL, 0, NULL, 0);
            }
        }
        w->unit_open = 0;
    }
    int wake = rc > 0 && ship_mark(w); /* the unit may be shipped now */
    pthread_mutex_unlock(&w->lock);
    if (rc > 0) /* the log thread may be waiting for the unit to close */
        pthread_cond_signal(&w->cond);
    if (wake)
        ship_wake(w);
    return rc;
}

int64_t wal_log_fn(void *arg, int op, const void *key, size_t klen, const void *v1, size_t n1,
                   const void *v2, size_t n2, int64_t expire_ms)
{
    switch (KVT_LOG_OP(op)) {
    case KVT_LOG_UNIT_BEGIN:
        return wal_unit_begin(arg);
    case KVT_LOG_UNIT_END:
        return wal_unit_end(arg);
    }
    _Static_assert((int)KVT_LOG_SET == (int)WAL_SET && (int)KVT_LOG_DEL == (int)WAL_DEL &&
                   (int)KVT_LOG_FLUSH == (int)WAL_FLUSH && KVT_LOG_HASH == WAL_HASH,
                   "the table's log ops are the log's");
    return wal_append(arg, op, key, (uint32_t)klen, v1, (uint32_t)n1, v2, (uint32_t)n2, expire_ms);
}

static void fail(struct wal *w, const char *what, int e)
{
    /* The first failure names the error (the log thread, or an appender that
     * could not close a unit), once. */
    if (atomic_exchange_explicit(&w->failing, 1, memory_order_relaxed))
        return;
    snprintf(w->error, sizeof w->error, "%s: %s", what, strerror(e));
    atomic_store_explicit(&w->failed, 1, memory_order_release);
    kvlog(KVLOG_WARNING, "durability log failed (%s): writes are refused until a restart", w->error);
    wal_notify_wake(&w->notify, 0, 1);
}

/* writev() all of iov[0..n) (retrying short writes and EINTR), at most
 * WRITEV_MAX parts a call; iov is left as it was. Returns 0 or -errno. */
#define WRITEV_MAX 64
static int writev_all(int fd, const struct iovec *iov, int n)
{
    int i = 0;
    size_t skip = 0; /* bytes of iov[i] written already */
    while (i < n) {
        struct iovec cur[WRITEV_MAX];
        int k = 0;
        for (int j = i; j < n && k < WRITEV_MAX; j++, k++)
            cur[k] = j == i ? (struct iovec){(char *)iov[j].iov_base + skip, iov[j].iov_len - skip} : iov[j];
        ssize_t r = writev(fd, cur, k);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO;
        size_t left = (size_t)r;
        while (i < n && left >= iov[i].iov_len - skip) {
            left -= iov[i].iov_len - skip;
            i++;
            skip = 0;
        }
        skip += left;
    }
    return 0;
}

/* Write group (iov, len bytes; first: its first LSN) at the end of the current segment
 * (after starting a new one when it is full) and sync it. Returns 0, or -errno
 * with what failed in err; the segment is then cut back to where the group
 * began, so a retry writes the whole group again from memory (after a failed
 * fdatasync the kernel may have dropped the pages: only a new write of them
 * makes a later sync mean something). Log thread. */
static int write_group(struct wal *w, const struct iovec *iov, int niov, size_t len, uint64_t first, char *err,
                       size_t errlen)
{
    /* A failed attempt may have left part of the group: cut it first (no write
     * may land after a torn tail: O_APPEND would put it there). */
    int rc;
    if (atomic_load_explicit(&w->werr, memory_order_relaxed) && ftruncate(w->fd, (off_t)w->seg_size)) {
        rc = -errno;
        snprintf(err, errlen, "cannot cut the log segment back after a failed write: %s", strerror(-rc));
        return rc;
    }
    if (w->seg_size >= w->seg_limit) {
        if (fdatasync(w->fd)) {
            rc = -errno;
            snprintf(err, errlen, "log sync: %s", strerror(-rc));
            return rc;
        }
        if ((rc = seg_create(w, first, err, errlen)))
            return rc;
    }
    rc = writev_all(w->fd, iov, niov);
    if (rc) {
        snprintf(err, errlen, "log write: %s", strerror(-rc));
    } else {
        if (w->sync_delay_us)
            usleep(w->sync_delay_us);
        uint64_t t0 = now_ns();
        if (fdatasync(w->fd)) {
            rc = -errno;
            snprintf(err, errlen, "log fdatasync: %s", strerror(-rc));
        } else {
            uint64_t dt = now_ns() - t0;
            latmon_add(atomic_load_explicit(&w->latmon, memory_order_acquire), LM_LOG_SYNC, dt);
            atomic_fetch_add_explicit(&w->syncs, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&w->sync_ns_total, dt, memory_order_relaxed);
            if (dt > atomic_load_explicit(&w->sync_ns_max, memory_order_relaxed))
                atomic_store_explicit(&w->sync_ns_max, dt, memory_order_relaxed);
            atomic_fetch_add_explicit(&w->sync_hist[sync_bucket(dt)], 1, memory_order_relaxed);
        }
    }
    if (!rc)
        w->seg_size += len;
    else if (ftruncate(w->fd, (off_t)w->seg_size))
        (void)0; /* (the next attempt cuts first, and writes only once that worked) */
    return rc;
}

#define RETRY_FIRST_MS 10    /* backoff after a failed group write: doubling from here ... */
#define RETRY_MAX_MS 1000    /* ... to this, so writes resume within a second of the disk */

/* Write group b until it is on disk: on a failure (ENOSPC, EIO, ...) refuse
 * new appends (werr), say so in the log (rate-limited), and try again with
 * backoff, the group's records kept in memory; their replies wait meanwhile.
 * Returns 0 when written, -ECANCELED when the log was closed first (the group
 * is then lost, but none of it was acknowledged: nothing past the durable LSN
 * ever is). Log thread. */
static int write_group_retrying(struct wal *w, const struct iovec *iov, int niov, size_t len, uint64_t first)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(3);
    char err[256];
    uint32_t backoff = RETRY_FIRST_MS;
    int rc;
    while ((rc = write_group(w, iov, niov, len, first, err, sizeof err))) {
        atomic_fetch_add_explicit(&w->write_errors, 1, memory_order_relaxed);
        pthread_mutex_lock(&w->lock);
        snprintf(w->werr_msg, sizeof w->werr_msg, "%s", err);
        if (!atomic_load_explicit(&w->werr, memory_order_relaxed))
            w->werr_since = now_ns();
        atomic_store_explicit(&w->werr, -rc, memory_order_release);
        kvlog_rated(&rate, KVLOG_WARNING, "durability log cannot write (%s): writes are refused, retrying", err);
        /* wait for the backoff (appends may wake the wait: sleep out the rest) or wal_close */
        uint64_t until = now_ns() + backoff * 1000000ull;
        while (!w->stop && now_ns() < until) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t wait = until - now_ns();
            ts.tv_nsec += (long)(wait % 1000000000u);
            ts.tv_sec += (time_t)(wait / 1000000000u) + ts.tv_nsec / 1000000000;
            ts.tv_nsec %= 1000000000;
            pthread_cond_timedwait(&w->cond, &w->lock, &ts);
        }
        int stop = w->stop;
        pthread_mutex_unlock(&w->lock);
        if (stop) {
            kvlog(KVLOG_WARNING, "durability log closed while it could not write (%s): the records after LSN %" PRIu64
                  " were not written to this disk (%s)", err, wal_synced_lsn(w),
                  w->ship ? "those the peer acknowledged are in its copy: the next start fetches them"
                              : "none of them was acknowledged");
            return -ECANCELED;
        }
        backoff = backoff * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : backoff * 2;
    }
    if (atomic_load_explicit(&w->werr, memory_order_relaxed)) {
        pthread_mutex_lock(&w->lock);
        double secs = (double)(now_ns() - w->werr_since) / 1e9;
        atomic_store_explicit(&w->werr, 0, memory_order_release);
        pthread_mutex_unlock(&w->lock);
        kvlog(KVLOG_NOTICE, "durability log writable again after %.1f s: writes accepted", secs);
    }
    return 0;
}

static void *log_thread(void *arg)
{
    struct wal *w = arg;
    uint64_t deadline = 0; /* async mode: when the batch being gathered is due (0: none yet) */
    for (;;) {
        pthread_mutex_lock(&w->lock);
        /* An open unit holds the group back until its COMMIT: a group (and so
         * the durable LSN, and a segment switch) never ends inside a unit. */
        while ((w->total == w->disk_taken || w->unit_open) && !w->stop)
            pthread_cond_wait(&w->cond, &w->lock);
        /* Async mode (remote durability): gather large batches — until batch_bytes
         * or batch_ns after this batch began — unless the mode switches to sync. */
        if (!atomic_load_explicit(&w->sync, memory_order_relaxed) && !w->stop) {
            if (!deadline) /* kept across a wait for a unit: the batch stays due */
                deadline = now_ns() + w->batch_ns;
            while (!w->stop && !atomic_load_explicit(&w->sync, memory_order_relaxed) &&
                   w->total - w->disk_taken < w->batch_bytes && now_ns() < deadline) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                uint64_t wait = deadline - now_ns();
                if (wait > 50000000)
                    wait = 50000000; /* re-check the mode at least every 50 ms */
                ts.tv_nsec += (long)(wait % 1000000000u);
                ts.tv_sec += (time_t)(wait / 1000000000u) + ts.tv_nsec / 1000000000;
                ts.tv_nsec %= 1000000000;
                pthread_cond_timedwait(&w->cond, &w->lock, &ts);
            }
        }
        if (w->unit_open && !w->stop) { /* a unit opened while the batch gathered */
            pthread_mutex_unlock(&w->lock);
            continue;
        }
        if (w->total == w->disk_taken) { /* stop requested and nothing left */
            pthread_mutex_unlock(&w->lock);
            break;
        }
        pos_norm(&w->disk); /* from.c then holds what is read first: recycling stops there */
        struct wal_pos from = w->disk, to = end_pos(w);
        uint64_t first = from.lsn, upto = w->appended_lsn;
        /* Stopping inside a unit (wal_close during a transaction): its records are
         * written, but never count as durable; recovery drops them. */
        uint64_t done = w->unit_open ? w->unit_first - 1 : upto;
        uint64_t nrec = upto - first + 1;
        size_t len = (size_t)(to.bytes - from.bytes);
        deadline = 0;
        w->disk_taken = to.bytes; /* appends continue after it meanwhile */
        pthread_mutex_unlock(&w->lock);

        int niov = pos_iov(from, to, &w->wiov, &w->wiov_cap);
        if (niov < 0) {
            fail(w, "log write", ENOMEM);
            break;
        }
        if (write_group_retrying(w, w->wiov, niov, len, first)) /* stopped while the disk refused it */
            break;
        atomic_store_explicit(&w->written_lsn, done, memory_order_release); /* readable by catch-up */
        atomic_fetch_add_explicit(&w->groups, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->records, nrec, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->bytes, len, memory_order_relaxed);
        if (nrec > atomic_load_explicit(&w->max_group, memory_order_relaxed))
            atomic_store_explicit(&w->max_group, nrec, memory_order_relaxed);
        pthread_mutex_lock(&w->lock);
        w->disk = to;
        recycle(w);
        pthread_mutex_unlock(&w->lock);
        atomic_store_explicit(&w->synced_lsn, done, memory_order_release);
        wal_publish_durable(w, done);
    }
    return NULL;
}

uint64_t wal_synced_lsn(struct wal *w) { return atomic_load_explicit(&w->synced_lsn, memory_order_acquire); }

uint64_t wal_appended_lsn(struct wal *w)
{
    pthread_mutex_lock(&w->lock);
    uint64_t l = w->appended_lsn;
    pthread_mutex_unlock(&w->lock);
    return l;
}

void wal_publish_durable(struct wal *w, uint64_t lsn)
{
    /* Durable = synced here or held by the peer: both are prefixes of the same
     * LSN sequence, so the larger one is durable somewhere. Monotonic max. */
    uint64_t cur = atomic_load_explicit(&w->durable_lsn, memory_order_relaxed);
    while (lsn > cur) {
        /* release: a poller that reads this LSN may tell clients their writes are safe */
        if (atomic_compare_exchange_weak_explicit(&w->durable_lsn, &cur, lsn, memory_order_seq_cst,
                                                  memory_order_relaxed)) {
            wal_notify_wake(&w->notify, lsn, 0);
            return;
        }
    }
}

void wal_set_sync(struct wal *w, int sync)
{
    atomic_store_explicit(&w->sync, sync, memory_order_relaxed);
    pthread_mutex_lock(&w->lock);
    pthread_mutex_unlock(&w->lock);
    pthread_cond_signal(&w->cond); /* a log thread gathering a batch re-checks the mode */
}

uint64_t wal_ship_peek(struct wal *w, struct wal_ship *v)
{
    /* The sender's records are the log's: v points into the chunks, which stay
     * until the sender consumed them (and the log thread wrote them). An open
     * unit's records stay behind: the peer acknowledges only whole units, and
     * what is shipped ends where the durable LSN may. */
    pthread_mutex_lock(&w->lock);
    /* Everything the sender may take is in v now: a later append raises it again
     * (an open unit left out raises it with its COMMIT). */
    atomic_store_explicit(&w->ship_pending, 0, memory_order_relaxed);
    pos_norm(&w->shipc);
    struct wal_pos from = w->shipc, to = w->unit_open ? w->unit_pos : end_pos(w);
    pthread_mutex_unlock(&w->lock);
    v->n = 0;
    v->bytes = (size_t)(to.bytes - from.bytes);
    v->end_c = to.c;
    v->end_off = to.off;
    v->end_lsn = to.lsn;
    v->end_bytes = to.bytes;
    if (!v->bytes) {
        v->first = v->last = 0;
        return 0;
    }
    int n = pos_iov(from, to, &v->iov, &v->cap);
    if (n < 0) { /* no memory for the iovecs: nothing now, the sender comes back */
        atomic_store_explicit(&w->ship_pending, 1, memory_order_relaxed);
        v->bytes = 0;
        v->first = v->last = 0;
        return 0;
    }
    v->n = n;
    v->first = from.lsn;
    v->last = to.lsn - 1;
    return v->last;
}

void wal_ship_consume(struct wal *w, struct wal_ship *v, uint64_t upto)
{
    if (!v->bytes || upto < v->first)
        return;
    pthread_mutex_lock(&w->lock);
    if (upto >= v->last) {
        w->shipc = (struct wal_pos){v->end_c, v->end_off, v->end_lsn, v->end_bytes};
    } else { /* a prefix: walk its records (whole records, never across chunks) */
        struct wal_pos *p = &w->shipc;
        while (p->lsn <= upto && p->bytes < v->end_bytes) {
            pos_norm(p);
            const unsigned char *r = p->c->data + p->off;
            size_t l = WAL_HDR + (size_t)get32(r + WAL_OFF_KLEN) + get32(r + WAL_OFF_VLEN) + WAL_TRAILER;
            p->off += l;
            p->bytes += l;
            p->lsn++;
        }
    }
    recycle(w);
    pthread_mutex_unlock(&w->lock);
    v->bytes = 0;
    v->n = 0;
    v->first = v->last = 0;
}

void wal_ship_free(struct wal_ship *v)
{
    free(v->iov);
    *v = (struct wal_ship){0};
}

int wal_ship_fd(struct wal *w) { return w->ship_evfd; }

int wal_ship_sleep(struct wal *w, int sleep)
{
    if (!sleep) {
        atomic_store_explicit(&w->ship_idle, 0, memory_order_relaxed);
        uint64_t v;
        ssize_t r = read(w->ship_evfd, &v, sizeof v);
        (void)r; /* EAGAIN: nobody wrote it */
        return 0;
    }
    atomic_store_explicit(&w->ship_idle, 1, memory_order_seq_cst); /* then look for records */
    if (!atomic_load_explicit(&w->ship_pending, memory_order_seq_cst))
        return 1;
    atomic_store_explicit(&w->ship_idle, 0, memory_order_relaxed);
    return 0;
}

uint64_t wal_written_lsn(struct wal *w)
{
    return atomic_load_explicit(&w->written_lsn, memory_order_acquire);
}

const char *wal_dir(struct wal *w) { return w->dir; }

int wal_start(struct wal *w)
{
    int rc = pthread_create(&w->th, NULL, log_thread, w);
    if (rc)
        return -rc;
    pthread_setname_np(w->th, "kv-wal");
    w->running = 1;
    return 0;
}

void wal_close(struct wal *w)
{
    if (!w)
        return;
    if (unit_of_thread == w) /* closed inside a unit: a later log at this address is not in it */
        unit_of_thread = NULL;
    if (w->running) {
        pthread_mutex_lock(&w->lock);
        w->stop = 1;
        pthread_mutex_unlock(&w->lock);
        pthread_cond_signal(&w->cond);
        pthread_join(w->th, NULL);
        w->running = 0;
    }
    if (w->fd >= 0) {
        fdatasync(w->fd);
        close(w->fd);
    }
    if (w->dirfd >= 0)
        close(w->dirfd);
    if (w->ship_evfd >= 0)
        close(w->ship_evfd);
    for (struct wal_chunk *c = w->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    for (struct wal_chunk *c = w->spare, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(w->wiov);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    wal_notify_destroy(&w->notify);
    free(w->dir);
    free(w);
}

uint64_t wal_durable_lsn(struct wal *w)
{
    return atomic_load_explicit(&w->durable_lsn, memory_order_acquire);
}

int wal_failed(struct wal *w) { return atomic_load_explicit(&w->failed, memory_order_acquire); }

int wal_write_error(struct wal *w, char *msg, size_t n)
{
    if (!msg || !n) /* every write command asks: one relaxed load, not the appenders' lock */
        return atomic_load_explicit(&w->werr, memory_order_relaxed);
    pthread_mutex_lock(&w->lock);
    int e = atomic_load_explicit(&w->werr, memory_order_relaxed);
    if (msg && n)
        snprintf(msg, n, "%s", e ? w->werr_msg : "");
    pthread_mutex_unlock(&w->lock);
    return e;
}
const char *wal_error(struct wal *w) { return wal_failed(w) ? w->error : ""; }

int wal_subscribe(struct wal *w, int evfd) { return wal_notify_add(&w->notify, evfd); }

uint64_t wal_want(struct wal *w, int *slot, int evfd, uint64_t lsn)
{
    return wal_notify_want(&w->notify, slot, evfd, lsn, &w->durable_lsn);
}

void wal_set_latmon(struct wal *w, struct latmon *lm)
{
    atomic_store_explicit(&w->latmon, lm, memory_order_release);
}

void wal_get_stats(struct wal *w, struct wal_stats *st)
{
    pthread_mutex_lock(&w->lock);
    st->appended_lsn = w->appended_lsn;
    pthread_mutex_unlock(&w->lock);
    st->durable_lsn = wal_durable_lsn(w);
    st->groups = atomic_load_explicit(&w->groups, memory_order_relaxed);
    st->records = atomic_load_explicit(&w->records, memory_order_relaxed);
    st->bytes = atomic_load_explicit(&w->bytes, memory_order_relaxed);
    st->syncs = atomic_load_explicit(&w->syncs, memory_order_relaxed);
    st->sync_ns_total = atomic_load_explicit(&w->sync_ns_total, memory_order_relaxed);
    st->sync_ns_max = atomic_load_explicit(&w->sync_ns_max, memory_order_relaxed);
    st->max_group_records = atomic_load_explicit(&w->max_group, memory_order_relaxed);
    for (int i = 0; i < WAL_SYNC_BUCKETS; i++)
        st->sync_buckets[i] = atomic_load_explicit(&w->sync_hist[i], memory_order_relaxed);
    st->failed = wal_failed(w);
    st->write_errors = atomic_load_explicit(&w->write_errors, memory_order_relaxed);
    st->write_error = atomic_load_explicit(&w->werr, memory_order_relaxed);
}
