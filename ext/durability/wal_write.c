/* wal_write.c - the log thread (see wal.c): takes what was appended since its last
 * group, writes it with writev from the chunks where the records lie (pwritev in
 * pieces over a prepared segment's zeros: write_synced), syncs it (group commit)
 * and publishes the durable LSN; a failing write is retried from memory with
 * backoff (write_group_retrying). */
#define _GNU_SOURCE
#include "durability/wal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <sys/stat.h>

#include "core/latmon.h"
#include "core/log.h"

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

/* Start the segment whose first record has LSN first: the prepared one when it
 * is ready (wal_prep.c), else a new file appended to; its name and header are
 * synced (file and directory) so a crash cannot lose the file holding synced records. */
int wal_seg_switch(struct wal *w, uint64_t first, char *err, size_t errlen)
{
    int fd = wal_prep_take(w);
    uint64_t cap = 0;
    if (fd >= 0) {
        char prep[4200];
        wal_prep_path(w, prep, sizeof prep);
        if (wal_seg_adopt(w->dir, w->dirfd, fd, prep, first, err, errlen)) {
            kvlog(KVLOG_WARNING, "durability log: %s; a new segment is appended to instead", err);
            close(fd);
            unlink(prep);
            fd = -1;
        } else {
            cap = w->seg_limit;
        }
    }
    if (fd < 0 && (fd = wal_seg_create(w->dir, w->dirfd, first, err, errlen)) < 0)
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
    w->seg_cap = cap;
    atomic_fetch_add_explicit(&w->segments, 1, memory_order_relaxed);
    if (cap)
        atomic_fetch_add_explicit(&w->segments_prepared, 1, memory_order_relaxed);
    return 0;
}

/* writev() the bytes [from, to) of the chunks (pwritev at off unless off < 0),
 * walked straight into a fixed array
 * of WRITEV_MAX parts a call (the log thread allocates nothing: no failed
 * allocation can stop it), retrying short writes and EINTR. Without w->lock: every
 * chunk before to.c is final and none is recycled while the log thread's cursor
 * stands at from. Returns 0 or -errno. */
#define WRITEV_MAX 64
static int write_chunks(int fd, struct wal_pos from, struct wal_pos to, off_t off_in_file)
{
    struct wal_chunk *c = from.c;
    size_t off = from.off; /* what is not written yet starts here */
    for (;;) {
        struct iovec iov[WRITEV_MAX];
        int k = 0;
        struct wal_chunk *d = c;
        for (size_t doff = off; k < WRITEV_MAX; d = d->next, doff = 0) {
            size_t end = d == to.c ? to.off : d->len;
            if (end > doff)
                iov[k++] = (struct iovec){d->data + doff, end - doff};
            if (d == to.c)
                break;
        }
        if (!k)
            return 0;
        ssize_t r = off_in_file < 0 ? writev(fd, iov, k) : pwritev(fd, iov, k, off_in_file);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EIO;
        if (off_in_file >= 0)
            off_in_file += r;
        for (size_t left = (size_t)r;; c = c->next, off = 0) { /* move past what was written */
            size_t end = c == to.c ? to.off : c->len;
            if (left < end - off || c == to.c) {
                off += left;
                break;
            }
            left -= end - off;
        }
    }
}

/* fdatasync the segment, counted in the stats. 0 or -errno with a message. */
static int sync_timed(struct wal *w, char *err, size_t errlen)
{
    if (w->sync_delay_us)
        usleep(w->sync_delay_us);
    uint64_t t0 = now_ns();
    if (fdatasync(w->fd)) {
        int rc = -errno;
        snprintf(err, errlen, "log fdatasync: %s", strerror(-rc));
        return rc;
    }
    uint64_t dt = now_ns() - t0;
    latmon_add(atomic_load_explicit(&w->latmon, memory_order_acquire), LM_LOG_SYNC, dt);
    atomic_fetch_add_explicit(&w->syncs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->sync_ns_total, dt, memory_order_relaxed);
    if (dt > atomic_load_explicit(&w->sync_ns_max, memory_order_relaxed))
        atomic_store_explicit(&w->sync_ns_max, dt, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->sync_hist[sync_bucket(dt)], 1, memory_order_relaxed);
    return 0;
}

/* Where the piece of [a, to) that starts at a ends: whole chunk ranges (a record
 * never spans two chunks, so a piece ends where a record does) of WAL_PIECE bytes
 * at most, or one chunk's range when that alone is larger (a chunk of one large
 * record). */
static struct wal_pos piece_end(struct wal_pos a, struct wal_pos to)
{
    size_t total = 0;
    for (struct wal_chunk *c = a.c;; c = c->next, a.off = 0) {
        size_t end = c == to.c ? to.off : c->len, n = end - a.off;
        if (total && total + n > WAL_PIECE)
            return (struct wal_pos){.c = c, .off = a.off};
        total += n;
        if (c == to.c)
            return to;
    }
}

/* Write [from, to) at the end of the current segment and sync it. Appended to a
 * growing segment: one write, one sync. Over a prepared segment's zeros: a piece
 * of WAL_PIECE bytes at most, synced before the next is written, so that pages
 * a machine crash leaves out of order lie within one piece after the last good
 * record (wal_recover.c tells such a torn piece from damage by that bound). */
static int write_synced(struct wal *w, struct wal_pos from, struct wal_pos to, char *err, size_t errlen)
{
    int rc;
    if (!w->seg_cap) {
        if ((rc = write_chunks(w->fd, from, to, -1)))
            snprintf(err, errlen, "log write: %s", strerror(-rc));
        return rc ? rc : sync_timed(w, err, errlen);
    }
    off_t off = (off_t)w->seg_size;
    while (from.c != to.c || from.off != to.off) {
        struct wal_pos b = piece_end(from, to);
        if ((rc = write_chunks(w->fd, from, b, off))) {
            snprintf(err, errlen, "log write: %s", strerror(-rc));
            return rc;
        }
        if ((rc = sync_timed(w, err, errlen)))
            return rc;
        for (struct wal_chunk *c = from.c;; c = c->next, from.off = 0) { /* off += the piece's bytes */
            off += (off_t)((c == b.c ? b.off : c->len) - from.off);
            if (c == b.c)
                break;
        }
        from = b;
    }
    return 0;
}

/* Write group [from, to) (len bytes; first: its first LSN) at the end of the current segment
 * (after starting a new one when it is full, or when a prepared one is ready
 * and the group does not fit, or the current one grows) and sync it. Returns 0,
 * or -errno with what failed in err; a growing segment is then cut back to where
 * the group began, so a retry writes the whole group again from memory (after a
 * failed fdatasync the kernel may have dropped the pages: only a new write of
 * them makes a later sync mean something); over a prepared segment the retry
 * writes the same bytes at the same place. Log thread. */
static int write_group(struct wal *w, struct wal_pos from, struct wal_pos to, size_t len, uint64_t first,
                       char *err, size_t errlen)
{
    /* A failed attempt may have left part of the group: cut it first (no write
     * may land after a torn tail: O_APPEND would put it there). */
    int rc;
    if (!w->seg_cap && atomic_load_explicit(&w->werr, memory_order_relaxed) && ftruncate(w->fd, (off_t)w->seg_size)) {
        rc = -errno;
        snprintf(err, errlen, "cannot cut the log segment back after a failed write: %s", strerror(-rc));
        return rc;
    }
    int ready = atomic_load_explicit(&w->prep, memory_order_acquire) == PREP_READY;
    if (w->seg_size >= w->seg_limit || (ready && (!w->seg_cap || w->seg_size + len > w->seg_cap))) {
        if (fdatasync(w->fd)) {
            rc = -errno;
            snprintf(err, errlen, "log sync: %s", strerror(-rc));
            return rc;
        }
        if ((rc = wal_seg_switch(w, first, err, errlen)))
            return rc;
    }
    rc = write_synced(w, from, to, err, errlen);
    if (!rc) {
        w->seg_size += len;
        if (w->seg_size >= (w->seg_limit / 2 < (4u << 20) ? w->seg_limit / 2 : (4u << 20)))
            wal_prep_want(w); /* the next segment (wal_prep.c) */
    } else if (!w->seg_cap && ftruncate(w->fd, (off_t)w->seg_size)) {
        (void)0; /* (the next attempt cuts first, and writes only once that worked) */
    }
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
static int write_group_retrying(struct wal *w, struct wal_pos from, struct wal_pos to, size_t len, uint64_t first)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(3);
    char err[256];
    uint32_t backoff = RETRY_FIRST_MS;
    int rc;
    while ((rc = write_group(w, from, to, len, first, err, sizeof err))) {
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

void *wal_log_thread(void *arg)
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
        wal_pos_norm(&w->disk); /* from.c then holds what is read first: recycling stops there */
        struct wal_pos from = w->disk, to = wal_end_pos(w);
        uint64_t first = from.lsn, upto = w->appended_lsn;
        /* Stopping inside a unit (wal_close during a transaction): its records are
         * written, but never count as durable; recovery drops them. */
        uint64_t done = w->unit_open ? w->unit_first - 1 : upto;
        uint64_t nrec = upto - first + 1;
        size_t len = (size_t)(to.bytes - from.bytes);
        deadline = 0;
        w->disk_taken = to.bytes; /* appends continue after it meanwhile */
        pthread_mutex_unlock(&w->lock);

        if (write_group_retrying(w, from, to, len, first)) /* stopped while the disk refused it */
            break;
        atomic_store_explicit(&w->written_lsn, done, memory_order_release); /* readable by catch-up */
        atomic_fetch_add_explicit(&w->groups, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->records, nrec, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->bytes, len, memory_order_relaxed);
        if (nrec > atomic_load_explicit(&w->max_group, memory_order_relaxed))
            atomic_store_explicit(&w->max_group, nrec, memory_order_relaxed);
        pthread_mutex_lock(&w->lock);
        w->disk = to;
        wal_recycle(w);
        pthread_mutex_unlock(&w->lock);
        atomic_store_explicit(&w->synced_lsn, done, memory_order_release);
        wal_publish_durable(w, done);
    }
    return NULL;
}
