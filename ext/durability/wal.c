/* wal.c - group-committed write-ahead log (see wal.h); recovery is in wal_recover.c.
 * Threads: any number of appenders (under w->lock, held only for a memcpy), one log
 * thread doing the I/O, and in ship mode the log sender. Records are copied once,
 * into a list of chunks that never move (a record never spans two); the log thread
 * writes them with writev and the sender ships them with sendmsg from the same
 * memory, each with its own cursor, and a chunk is recycled once both passed it.
 * Bytes before a consumer's end (taken under w->lock) never change, so each
 * consumer reads them without the lock (the chunks and the sender's view:
 * wal_ship.c; the log thread: wal_write.c). Lock order: a table shard lock, then
 * w->lock. fsync ordering: a group's durable LSN is published only after its write() and
 * fdatasync() returned; a new segment's directory entry is synced (fsync of the
 * directory) before records in it can count as durable. Units: while one is open
 * (w->unit_open, under w->lock) the log thread takes no records, so
 * every group, every segment switch and every durable LSN falls between units.
 * A full or failing disk: a group whose write or sync fails is retried from
 * memory with backoff, the segment cut back to where it began each time (a
 * prepared one is written over at the same place), and appends are refused
 * meanwhile (write_group_retrying); nothing stops for good. Segments are appended
 * to until a thread has prepared the next one over zeros (wal_prep.c). */
#define _GNU_SOURCE
#include "durability/wal_int.h"

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

/* The log whose unit the calling thread is in (wal_unit_begin .. wal_unit_end),
 * so an append knows without a lock that its record belongs to a unit. */
static __thread struct wal *unit_of_thread __attribute__((tls_model("initial-exec")));

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
    /* What a batch holds (async mode gathers batch_bytes before writing), and a few more. */
    w->max_spare = (int)((w->batch_bytes < (256u << 20) ? w->batch_bytes : (256u << 20)) / CHUNK_BYTES) + 4;
    if (!(w->head = w->tail = wal_chunk_new(w, CHUNK_BYTES))) {
        free(w->dir);
        free(w);
        return -ENOMEM;
    }
    w->disk = w->shipc = wal_end_pos(w);
    atomic_init(&w->durable_lsn, w->next_lsn - 1);
    atomic_init(&w->written_lsn, w->next_lsn - 1);
    atomic_init(&w->synced_lsn, w->next_lsn - 1);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    pthread_mutex_init(&w->prep_lock, NULL);
    pthread_cond_init(&w->prep_cond, NULL);
    w->prep_fd = -1;
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
    char prep[4200];
    wal_prep_path(w, prep, sizeof prep);
    unlink(prep); /* prepared by an earlier run (it holds no record) */
    int rc = wal_seg_switch(w, w->next_lsn, err, errlen);
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
    if (klen) /* a FLUSH's key may be NULL */
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
    if (wal_backlog(w) + rec > w->max_pending || !(p = wal_room(w, rec + WAL_COMMIT_LEN))) {
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
        } else if (op == (WAL_SET | WAL_STREAM)) {
            op = WAL_SET;
            type = WAL_T_STREAM;
        } else if (op != WAL_DEL && op != WAL_FLUSH && op != WAL_XOP) {
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
    if (wal_backlog(w) + rec > w->max_pending || !(p = wal_room(w, rec))) {
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
            unsigned char *p = wal_room(w, WAL_COMMIT_LEN);
            if (!p) {
                /* A unit left without its COMMIT may only end the log: stop it. */
                rc = -ENOMEM;
                wal_fail(w, "closing a unit", ENOMEM);
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
                   (int)KVT_LOG_FLUSH == (int)WAL_FLUSH && KVT_LOG_HASH == WAL_HASH &&
                   KVT_LOG_STREAM == WAL_STREAM, "the table's log ops are the log's");
    if (KVT_LOG_OP(op) == KVT_LOG_XOP)
        op = WAL_XOP;
    return wal_append(arg, op, key, (uint32_t)klen, v1, (uint32_t)n1, v2, (uint32_t)n2, expire_ms);
}

void wal_fail(struct wal *w, const char *what, int e)
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

uint64_t wal_written_lsn(struct wal *w)
{
    return atomic_load_explicit(&w->written_lsn, memory_order_acquire);
}

const char *wal_dir(struct wal *w) { return w->dir; }

int wal_start(struct wal *w)
{
    /* the preparer first: the log thread reads prep_running (wal_prep_want) */
    if (!pthread_create(&w->prep_th, NULL, wal_prep_thread, w)) { /* without it: segments grow */
        pthread_setname_np(w->prep_th, "kv-walprep");
        w->prep_running = 1;
    }
    int rc = pthread_create(&w->th, NULL, wal_log_thread, w);
    if (rc)
        return -rc; /* (wal_close stops the preparer) */
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
    if (w->prep_running) {
        pthread_mutex_lock(&w->prep_lock);
        atomic_store_explicit(&w->prep_stop, 1, memory_order_relaxed);
        pthread_cond_signal(&w->prep_cond);
        pthread_mutex_unlock(&w->prep_lock);
        pthread_join(w->prep_th, NULL);
        w->prep_running = 0;
    }
    if (w->prep_fd >= 0) { /* prepared, not used */
        char prep[4200];
        wal_prep_path(w, prep, sizeof prep);
        close(w->prep_fd);
        unlink(prep);
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
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->prep_lock);
    pthread_cond_destroy(&w->prep_cond);
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
    st->segments = atomic_load_explicit(&w->segments, memory_order_relaxed);
    st->segments_prepared = atomic_load_explicit(&w->segments_prepared, memory_order_relaxed);
}
