/* wal_prep.c - log segments prepared ahead. A group's fdatasync on a segment that
 * grows with every group also commits the file's new size and blocks (a journal
 * commit: a second device flush); written in place over blocks already written it
 * flushes the data alone. Measured on this project's machine (ext4, virtio disk,
 * 10 KB groups): 200-264 us appending, 131 us over zeros. So the preparer thread
 * (kv-walprep) writes the next segment ahead: PREP_NAME, seg_limit bytes of zeros,
 * synced; the log thread takes it (wal_seg_adopt) when its segment is full, or at
 * once while it is appending to one, and writes there in place (wal_write.c).
 *
 * A log asks for one only once its segment holds min(seg_limit / 2, 4 MiB), so a
 * small log (most tests, a quiet node) never writes 64 MiB of zeros. The zeros
 * are written a piece at a time, each pushed to the disk (sync_file_range) and
 * followed by a pause as long as it took, so the preparer takes at most half of
 * the disk from the log's syncs. A failure (a full disk) is logged; the log goes
 * on appending and asks again 30 s later. */
#define _GNU_SOURCE
#include "durability/wal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"

#define RETRY_NS (30ull * 1000000000u)
#define PAUSE_MAX_NS 20000000u /* a piece's pause: as long as its write took, at most 20 ms */

void wal_prep_path(const struct wal *w, char *dst, size_t n) { snprintf(dst, n, "%s/" PREP_NAME, w->dir); }

void wal_prep_want(struct wal *w)
{
    if (atomic_load_explicit(&w->prep, memory_order_relaxed) != PREP_NONE)
        return;
    pthread_mutex_lock(&w->prep_lock);
    if (w->prep_running && atomic_load_explicit(&w->prep, memory_order_relaxed) == PREP_NONE &&
        now_ns() >= w->prep_retry_ns) {
        atomic_store_explicit(&w->prep, PREP_WANTED, memory_order_relaxed);
        pthread_cond_signal(&w->prep_cond);
    }
    pthread_mutex_unlock(&w->prep_lock);
}

int wal_prep_take(struct wal *w)
{
    if (atomic_load_explicit(&w->prep, memory_order_acquire) != PREP_READY)
        return -1;
    pthread_mutex_lock(&w->prep_lock);
    int fd = w->prep_fd;
    w->prep_fd = -1;
    atomic_store_explicit(&w->prep, PREP_NONE, memory_order_relaxed);
    pthread_mutex_unlock(&w->prep_lock);
    return fd;
}

/* Write PREP_NAME: size bytes of zeros, synced. Returns its fd or -errno (err
 * says what failed; -ECANCELED: the log is closing). */
static int prepare(struct wal *w, uint64_t size, const unsigned char *zeros, char *err, size_t errlen)
{
    char path[4096];
    wal_prep_path(w, path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = 0;
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(-rc));
        return rc;
    }
    for (uint64_t off = 0; off < size && !rc;) {
        if (atomic_load_explicit(&w->prep_stop, memory_order_relaxed)) {
            rc = -ECANCELED;
            break;
        }
        size_t n = size - off < WAL_PIECE ? (size_t)(size - off) : WAL_PIECE;
        uint64_t t0 = now_ns();
        ssize_t r = pwrite(fd, zeros, n, (off_t)off);
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            break;
        }
        if (sync_file_range(fd, (off_t)off, r, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER)) {
            rc = -errno;
            break;
        }
        off += (uint64_t)r;
        uint64_t pause = now_ns() - t0;
        if (pause > PAUSE_MAX_NS)
            pause = PAUSE_MAX_NS;
        struct timespec ts = {0, (long)pause};
        nanosleep(&ts, NULL);
    }
    if (!rc && fdatasync(fd)) /* the blocks written and allocated for good */
        rc = -errno;
    if (rc) {
        if (rc != -ECANCELED)
            snprintf(err, errlen, "cannot prepare %s: %s", path, strerror(-rc));
        close(fd);
        unlink(path);
        return rc;
    }
    return fd;
}

void *wal_prep_thread(void *arg)
{
    struct wal *w = arg;
    unsigned char *zeros = calloc(1, WAL_PIECE);
    pthread_mutex_lock(&w->prep_lock);
    for (;;) {
        while (!atomic_load_explicit(&w->prep_stop, memory_order_relaxed) &&
               atomic_load_explicit(&w->prep, memory_order_relaxed) != PREP_WANTED)
            pthread_cond_wait(&w->prep_cond, &w->prep_lock);
        if (atomic_load_explicit(&w->prep_stop, memory_order_relaxed))
            break;
        pthread_mutex_unlock(&w->prep_lock);
        char err[512] = "out of memory";
        int fd = zeros ? prepare(w, w->seg_limit, zeros, err, sizeof err) : -ENOMEM;
        pthread_mutex_lock(&w->prep_lock);
        if (fd >= 0) {
            w->prep_fd = fd;
            atomic_store_explicit(&w->prep, PREP_READY, memory_order_release);
        } else {
            atomic_store_explicit(&w->prep, PREP_NONE, memory_order_relaxed);
            w->prep_retry_ns = now_ns() + RETRY_NS;
            if (fd != -ECANCELED)
                kvlog(KVLOG_WARNING, "durability log: %s; its segments grow as they are written (each sync "
                      "then also commits the file's size), trying again in 30 s", err);
        }
    }
    pthread_mutex_unlock(&w->prep_lock);
    free(zeros);
    return NULL;
}
