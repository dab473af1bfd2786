/* bosc_flusher.c - the flusher thread: a sweep (bosc_sweep.c) when memory
 * passes HIGH_PCT, when a writer waits for room (back to back while writers
 * wait), when a DBSIZE/SAVE asks, or every flush interval with keys dirty;
 * evicts clean entries down to LOW_PCT; retries a sweep the disk refused with
 * backoff; between sweeps runs the expiry pass (bosc_expire.c).
 * bosc_kick/bosc_sync for others. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/latmon.h"
#include "core/ldu.h"
#include "core/log.h"
#include "core/table.h"
#include "durability/bosc_int.h"
#include "durability/wal.h"

/* Writers waiting for room: each forced sweep is one of them asking, and a
 * writer woken without enough room asks again at once. A run of forced sweeps
 * (none more than STALL_GAP_NS after the last) longer than a second is a stall:
 * say so once, and again when it is over. started: when this sweep began. */
struct stall_note {
    uint64_t since, last;        /* the run's first and latest forced sweep; since 0: no run */
    int noted;
};

#define STALL_GAP_NS 500000000u

static void note_stall(struct bosc *b, struct stall_note *s, int forced, uint64_t started)
{
    uint64_t now = now_ns();
    if (s->since && now - s->last > STALL_GAP_NS) { /* writers stopped asking: the run is over */
        if (s->noted)
            kvlog(KVLOG_NOTICE, "writers no longer wait for memory (after %.1f s)", (double)(s->last - s->since) / 1e9);
        *s = (struct stall_note){0};
    }
    if (!forced)
        return;
    if (!s->since)
        s->since = started;
    s->last = now;
    if (!s->noted && now - s->since > 1000000000u) {
        kvlog(KVLOG_WARNING, "writers have been waiting for memory for %.1f s (%llu bytes used, max-memory %llu): "
              "the flusher is behind", (double)(now - s->since) / 1e9, (unsigned long long)kvt_used_memory(b->t),
              (unsigned long long)kvt_max_memory(b->t));
        s->noted = 1;
    }
}

/* Evict clean keys down to LOW_PCT of the bound: when memory passes HIGH_PCT,
 * or at once when a writer waits for room (force: it may need more than the
 * room below HIGH_PCT). "Stuck" = a writer could wait forever: memory is full,
 * nothing could be evicted and nothing is dirty (the stalled writes then get
 * -OOM). Returns the bytes evicted. */
static uint64_t evict(struct bosc *b, int force)
{
    uint64_t max = kvt_max_memory(b->t);
    if (!max) {
        kvt_set_spill_stuck(b->t, 0);
        return 0;
    }
    uint64_t used = kvt_used_memory(b->t), freed = 0;
    if (force || used * 100 > max * HIGH_PCT) {
        uint64_t n = 0;
        freed = kvt_evict(b->t, max / 100 * LOW_PCT, &n);
        add(&b->st.evicted, n);
        add(&b->st.evicted_bytes, freed);
    }
    /* Stuck only after two evictions in a row found nothing (two full turns of
     * the clock each) with nothing dirty left to flush. */
    int full = kvt_used_memory(b->t) * 100 > max * 98;
    int none = full && !freed && !atomic_load(&b->q.head);
    kvt_set_spill_stuck(b->t, none && b->evict_failed);
    b->evict_failed = none;
    return freed;
}

/* A chunk of the sweep (bosc_sweep.c) is about to be settled. While writers
 * wait for room (a poller's kick, a bosc_make_room) or memory is past HIGH_PCT
 * (and above LOW_PCT), its keys are evicted as they become clean: the sweep
 * knows them, so that costs no turn of the clock over every entry (a turn per
 * chunk made the flusher's CPU per record 1.5x). The clean keys it does not
 * know are for the eviction after the sweep, as are the decision that evicting
 * is stuck (keys not settled yet are dirty, not stuck). */
int bosc_room_wanted(struct bosc *b)
{
    uint64_t max = kvt_max_memory(b->t), used = kvt_used_memory(b->t);
    if (!max || used <= max / 100 * LOW_PCT)
        return 0;
    pthread_mutex_lock(&b->lock);
    int waiting = b->kick || b->room_waiters;
    pthread_mutex_unlock(&b->lock);
    return waiting || used * 100 > max * HIGH_PCT;
}

/* The flusher thread's CPU time so far, for INFO (datafile_sweep_cpu_seconds). Flusher. */
static void note_cpu(struct bosc *b)
{
    struct timespec ts;
    if (!clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
        atomic_store_explicit(&b->st.flusher_cpu_ns, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                              memory_order_relaxed);
}

/* The chunk is settled: wake the writers waiting for room, who so wait for one
 * chunk, not for the whole sweep (and note the flusher's CPU so far). */
void bosc_chunk_done(struct bosc *b)
{
    note_cpu(b);
    pthread_mutex_lock(&b->lock);
    b->room_seq++;
    pthread_cond_broadcast(&b->done);
    bosc_wake_all(b);
    pthread_mutex_unlock(&b->lock);
}

#define RETRY_FIRST_MS 10    /* backoff after a sweep the disk refused: doubling from here ... */
#define RETRY_MAX_MS 1000    /* ... to this, so writes resume within a second of the disk */

/* After a sweep: a write error begins or goes on (rc, err: note it, refuse
 * writes, say so in the log, rate-limited), or ends (rc 0 after errors).
 * *since: when the run of errors began. Flusher. */
static void note_write_result(struct bosc *b, int rc, const char *err, uint64_t *since)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(3);
    if (rc) {
        atomic_fetch_add_explicit(&b->write_errors, 1, memory_order_relaxed);
        pthread_mutex_lock(&b->lock);
        snprintf(b->werr_msg, sizeof b->werr_msg, "%s", err);
        pthread_mutex_unlock(&b->lock);
        if (!atomic_exchange_explicit(&b->werr, -rc, memory_order_release))
            *since = now_ns();
        kvlog_rated(&rate, KVLOG_WARNING, "data file cannot write (%s): writes are refused, retrying", err);
    } else if (atomic_exchange_explicit(&b->werr, 0, memory_order_release)) {
        kvlog(KVLOG_NOTICE, "data file writable again after %.1f s: writes accepted",
              (double)(now_ns() - *since) / 1e9);
    }
}

int bosc_write_error(struct bosc *b, char *msg, size_t n, uint64_t *errors)
{
    int e = atomic_load_explicit(&b->werr, memory_order_relaxed); /* (every write command asks) */
    if (msg && n) {
        pthread_mutex_lock(&b->lock);
        e = atomic_load_explicit(&b->werr, memory_order_relaxed);
        snprintf(msg, n, "%s", e ? b->werr_msg : "");
        pthread_mutex_unlock(&b->lock);
    }
    if (errors)
        *errors = atomic_load_explicit(&b->write_errors, memory_order_relaxed);
    return e;
}

void *bosc_flusher_main(void *arg)
{
    struct bosc *b = arg;
    struct sweep_ctx c = {0};
    c.ovw.cap = OV_BLOCKS; /* (overflow reads are at most OV_BLOCKS) */
    char err[256];
    if (bosc_wb_init(&c.wb)) {
        fail(b, "out of memory for the flusher's write batch");
        kvt_set_spill_stuck(b->t, 1);
    }
    uint64_t last = now_ns(), last_pass = last;
    uint64_t retry_at = 0, werr_since = 0; /* while the disk refuses: the next sweep's earliest time */
    uint32_t backoff = RETRY_FIRST_MS;
    struct stall_note stall = {0};
    uint64_t interval_ns = (uint64_t)b->interval_ms * 1000000u;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        /* The expiry pass, once per interval while some bucket may hold a
         * record with an expire time (its deletions make the next sweep due). */
        if (b->ttl_buckets && now_ns() - last_pass >= interval_ns && !b->kick && b->sync_req == b->sync_done &&
            !atomic_load(&b->failed)) {
            pthread_mutex_unlock(&b->lock);
            int rc = bosc_expire_pass(b, &c.stream, &c.chain, &c.nchain, &c.capchain, err, sizeof err);
            if (rc && rc != -ENOMEM) { /* (out of memory: the next pass tries again) */
                fail(b, err);
                kvt_set_spill_stuck(b->t, 1);
            }
            last_pass = now_ns();
            note_cpu(b);
            pthread_mutex_lock(&b->lock);
            continue;
        }
        uint64_t max = kvt_max_memory(b->t);
        /* (no sweep for pressure that evicting cannot relieve: that would spin) */
        int pressure = max && kvt_used_memory(b->t) * 100 > max * HIGH_PCT && !kvt_spill_stuck(b->t);
        int due = now_ns() - last >= interval_ns;
        int dirty = atomic_load_explicit(&b->q.head, memory_order_relaxed) != NULL;
        int behind = b->wal && wal_durable_lsn(b->wal) > atomic_load(&b->flushed_lsn);
        /* While the disk refuses, only a sync request (DBSIZE) tries before the backoff is out. */
        int backing_off = retry_at && now_ns() < retry_at && b->sync_req == b->sync_done;
        int retry = retry_at && !backing_off; /* (its keys are dirty: due or not, try again now) */
        int wanted = retry || b->kick || b->sync_req > b->sync_done || pressure || (due && (dirty || behind));
        if (backing_off || !wanted) {
            note_stall(b, &stall, 0, 0); /* nobody asks now: has the run ended? */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 10 * 1000000; /* look at memory pressure every 10 ms */
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&b->cond, &b->lock, &ts);
            continue;
        }
        uint64_t req = b->sync_req;
        int forced = b->kick || b->room_waiters; /* a writer waits for room (a poller's kick, or blocked in bosc_make_room) */
        /* wanted for room only (a writer waits, or memory passed HIGH_PCT): no
         * sweep if evicting clean keys makes it (below) */
        int room_only = !retry && req == b->sync_done && !(due && (dirty || behind));
        b->kick = 0;
        pthread_mutex_unlock(&b->lock);
        uint64_t started = now_ns();
        /* Evict before the sweep too: the clean keys of the last sweep make room for
         * the writers while this one runs (it may take a while), not only after. */
        uint64_t freed = atomic_load(&b->failed) ? 0 : evict(b, forced);
        /* A writer's kick skips the sweep only if evicting freed something: one
         * that needs more than the room below HIGH_PCT (a large value) would
         * otherwise kick again and again, each eviction freeing nothing (what
         * is left is dirty), until the flush interval came. */
        if (room_only && !atomic_load(&b->failed) && max && kvt_used_memory(b->t) * 100 <= max * HIGH_PCT &&
            (!forced || freed)) {
            /* Evicting made the room: the dirty keys wait until memory is full
             * again, so the next sweep carries most of memory (records per block
             * written), not the few keys written during the last sweep. */
            note_stall(b, &stall, forced, started);
            note_cpu(b); /* (the eviction's CPU too) */
            pthread_mutex_lock(&b->lock);
            bosc_wake_all(b);
            continue;
        }
        atomic_store(&b->sweeping, 1);
        int was_failed = atomic_load(&b->failed);
        int rc = was_failed ? -EIO : bosc_sweep(b, &c, err, sizeof err);
        atomic_store(&b->sweeping, 0);
        if (rc && !was_failed && c.write_failed) { /* the disk: keys stay dirty, the sweep is tried again */
            note_write_result(b, rc, err, &werr_since);
            retry_at = now_ns() + backoff * 1000000ull;
            backoff = backoff * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : backoff * 2;
        } else if (rc && !atomic_load(&b->failed)) {
            fail(b, err);
        } else if (!rc && retry_at) {
            note_write_result(b, 0, NULL, &werr_since);
            retry_at = 0;
            backoff = RETRY_FIRST_MS;
        }
        if (!rc)
            evict(b, forced);
        else
            kvt_set_spill_stuck(b->t, 1); /* writes get an error instead of waiting forever */
        last = now_ns();
        note_stall(b, &stall, forced, started);
        note_cpu(b);
        pthread_mutex_lock(&b->lock);
        b->sync_done = req;
        pthread_cond_broadcast(&b->done);
        /* after sync_done: a DBSIZE woken here finds its sweep done (before, it slept
         * again until the next cron tick) */
        bosc_wake_all(b);
        if (rc && atomic_load(&b->failed)) /* a failed data file: stay idle until stopped */
            while (!b->stop && b->sync_req == b->sync_done)
                pthread_cond_wait(&b->cond, &b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    free(c.items);
    free(c.vals.p);
    free(c.stream.p);
    free(c.out.p);
    free(c.chain);
    free(c.present);
    free(c.tag);
    free(c.dec);
    free(c.dest);
    free(c.bcount);
    free(c.win.buf);
    free(c.ovw.buf);
    bosc_wb_free(&c.wb);
    return NULL;
}

void bosc_kick(struct bosc *b)
{
    pthread_mutex_lock(&b->lock);
    b->kick = 1;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

uint64_t bosc_sync_request(struct bosc *b)
{
    pthread_mutex_lock(&b->lock);
    uint64_t want = ++b->sync_req;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
    return want;
}

int bosc_sync_done(struct bosc *b, uint64_t ticket)
{
    pthread_mutex_lock(&b->lock);
    int done = b->sync_done >= ticket || !b->started || b->stop;
    pthread_mutex_unlock(&b->lock);
    return done;
}

int bosc_make_room(void *arg)
{
    struct bosc *b = arg;
    pthread_mutex_lock(&b->lock);
    uint64_t want = ++b->sync_req, room = b->room_seq;
    b->room_waiters++;
    pthread_cond_broadcast(&b->cond);
    while (b->started && !b->stop && b->sync_done < want && b->room_seq == room)
        pthread_cond_wait(&b->done, &b->lock);
    b->room_waiters--;
    pthread_mutex_unlock(&b->lock);
    return atomic_load(&b->failed) ? -EIO : 0;
}

int bosc_dirty(struct bosc *b)
{
    return atomic_load_explicit(&b->q.head, memory_order_relaxed) != NULL ||
           atomic_load_explicit(&b->sweeping, memory_order_relaxed);
}

int bosc_sync(struct bosc *b)
{
    pthread_mutex_lock(&b->lock);
    uint64_t want = ++b->sync_req;
    pthread_cond_broadcast(&b->cond);
    while (b->started && !b->stop && b->sync_done < want)
        pthread_cond_wait(&b->done, &b->lock);
    pthread_mutex_unlock(&b->lock);
    return atomic_load(&b->failed) ? -EIO : 0;
}
