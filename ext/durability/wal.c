/* wal.c - group-committed write-ahead log and its recovery (see wal.h).
 * Threads: any number of appenders (under w->lock, held only for a memcpy), one log
 * thread doing the I/O. Lock order: a table shard lock, then w->lock. fsync
 * ordering: a group's durable LSN is published only after its write() and
 * fdatasync() returned; a new segment's directory entry is synced (fsync of the
 * directory) before records in it can count as durable. */
#define _GNU_SOURCE
#include "durability/wal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/table.h"

#define MAX_LEN WAL_MAX_LEN
#define MAX_NOTIFY 1024
static const char SEG_MAGIC[8] = {'K', 'V', 'S', 'W', 'A', 'L', '0', '2'}; /* 02: header CRC */

struct wal {
    char *dir;
    int dirfd, fd;
    _Atomic int sync;         /* 1: fdatasync every group (disk mode, or remote mode without its peer) */
    uint32_t sync_delay_us;
    uint64_t batch_bytes;     /* async mode: write once this much is gathered ... */
    uint64_t batch_ns;        /* ... or this long after the first record of a batch */
    int ship;                 /* keep a copy of every record for a log sender */
    struct kvbuf sbuf;        /* records not yet taken by the sender (under lock) */
    uint64_t sfirst;          /* LSN of sbuf's first record */
    _Atomic uint64_t written_lsn; /* last LSN written to the segment file (not necessarily synced) */
    _Atomic uint64_t synced_lsn;  /* last LSN made durable on the local disk */
    uint64_t seg_limit, seg_size, max_pending;
    pthread_mutex_t lock;     /* guards buf, active, next_lsn, first_in_buf, stop */
    pthread_cond_t cond;      /* signalled when the active buffer becomes non-empty or on stop */
    struct kvbuf buf[2];
    int active;
    uint64_t next_lsn, appended_lsn, first_in_buf[2];
    int stop, running;
    pthread_t th;
    _Atomic uint64_t durable_lsn;
    _Atomic int failed;
    char error[256];          /* written once by the log thread before failed is set (release) */
    pthread_mutex_t notify_lock;
    int notify[MAX_NOTIFY], nnotify;
    _Atomic uint64_t groups, records, bytes, syncs, sync_ns_total, sync_ns_max, max_group;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int wal_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void seg_name(char *dst, size_t n, const char *dir, uint64_t first)
{
    snprintf(dst, n, "%s/wal-%016" PRIx64 ".log", dir, first);
}

int wal_seg_create(const char *dir, int dirfd, uint64_t first, char *err, size_t errlen)
{
    char path[4096];
    seg_name(path, sizeof path, dir, first);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        /* Recovery (which always runs first) ended before LSN first, so this file
         * holds no valid record: a segment created just before a crash. Replace it. */
        unlink(path);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot create log segment %s: %s", path, strerror(e));
        return -e;
    }
    unsigned char hdr[WAL_SEG_HDR];
    memcpy(hdr, SEG_MAGIC, 8);
    put64(hdr + 8, first);
    int rc = wal_write_all(fd, (const char *)hdr, sizeof hdr);
    if (!rc && fdatasync(fd))
        rc = -errno;
    if (!rc && fsync(dirfd))
        rc = -errno;
    if (rc) {
        snprintf(err, errlen, "cannot write log segment %s: %s", path, strerror(-rc));
        close(fd);
        return rc;
    }
    return fd;
}

/* Create the segment whose first record has LSN first; its name and header are
 * synced (file and directory) so a crash cannot lose the file holding synced records. */
static int seg_create(struct wal *w, uint64_t first, char *err, size_t errlen)
{
    int fd = wal_seg_create(w->dir, w->dirfd, first, err, errlen);
    if (fd < 0)
        return fd;
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
    w->fd = w->dirfd = -1;
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
    atomic_init(&w->durable_lsn, w->next_lsn - 1);
    atomic_init(&w->written_lsn, w->next_lsn - 1);
    atomic_init(&w->synced_lsn, w->next_lsn - 1);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    pthread_mutex_init(&w->notify_lock, NULL);
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

int64_t wal_append(struct wal *w, int op, const void *key, uint32_t klen, const void *v1,
                   uint32_t n1, const void *v2, uint32_t n2, int64_t expire_ms)
{
    if (atomic_load_explicit(&w->failed, memory_order_relaxed))
        return -EIO;
    uint32_t vlen = n1 + n2;
    size_t rec = WAL_HDR + (size_t)klen + vlen + WAL_TRAILER;
    unsigned char hdr[WAL_HDR];
    memset(hdr, 0, sizeof hdr);
    put32(hdr + WAL_OFF_KLEN, klen);
    put32(hdr + WAL_OFF_VLEN, vlen);
    hdr[WAL_OFF_OP] = (unsigned char)op;
    put64(hdr + WAL_OFF_EXPIRE, (uint64_t)expire_ms);
    put32(hdr + WAL_OFF_HCRC, crc32c(0, hdr + WAL_OFF_KLEN, WAL_HDR - WAL_OFF_KLEN));
    /* The CRC of everything but the LSN is computed outside the lock. */
    uint32_t crc = crc32c(0, hdr + 4, WAL_HDR - 4);
    crc = crc32c(crc, key, klen);
    if (n1)
        crc = crc32c(crc, v1, n1);
    if (n2)
        crc = crc32c(crc, v2, n2);

    pthread_mutex_lock(&w->lock);
    struct kvbuf *b = &w->buf[w->active];
    if (b->len + rec > w->max_pending || kvbuf_reserve(b, rec) ||
        (w->ship && (w->sbuf.len + rec > w->max_pending || kvbuf_reserve(&w->sbuf, rec)))) {
        pthread_mutex_unlock(&w->lock);
        return -EAGAIN;
    }
    uint64_t lsn = w->next_lsn++;
    unsigned char *p = (unsigned char *)b->p + b->len;
    put64(p + rec - WAL_TRAILER, lsn);
    put32(hdr, crc32c(crc, p + rec - WAL_TRAILER, WAL_TRAILER));
    memcpy(p, hdr, WAL_HDR);
    memcpy(p + WAL_HDR, key, klen);
    if (n1)
        memcpy(p + WAL_HDR + klen, v1, n1);
    if (n2)
        memcpy(p + WAL_HDR + klen + n1, v2, n2);
    int was_empty = b->len == 0;
    if (was_empty)
        w->first_in_buf[w->active] = lsn;
    if (w->ship) {
        if (w->sbuf.len == 0)
            w->sfirst = lsn;
        memcpy(w->sbuf.p + w->sbuf.len, p, rec);
        w->sbuf.len += rec;
    }
    b->len += rec;
    w->appended_lsn = lsn;
    pthread_mutex_unlock(&w->lock);
    if (was_empty) /* the log thread sleeps only while the buffer is empty */
        pthread_cond_signal(&w->cond);
    return (int64_t)lsn;
}

int64_t wal_log_fn(void *arg, int op, const void *key, size_t klen, const void *v1, size_t n1,
                   const void *v2, size_t n2, int64_t expire_ms)
{
    return wal_append(arg, op, key, (uint32_t)klen, v1, (uint32_t)n1, v2, (uint32_t)n2, expire_ms);
}

static void notify_all(struct wal *w)
{
    uint64_t one = 1;
    pthread_mutex_lock(&w->notify_lock);
    for (int i = 0; i < w->nnotify; i++) {
        ssize_t r = write(w->notify[i], &one, sizeof one);
        (void)r; /* EAGAIN: the counter is already non-zero, the poller will wake */
    }
    pthread_mutex_unlock(&w->notify_lock);
}

static void fail(struct wal *w, const char *what, int e)
{
    snprintf(w->error, sizeof w->error, "%s: %s", what, strerror(e));
    atomic_store_explicit(&w->failed, 1, memory_order_release);
    notify_all(w);
}

static void *log_thread(void *arg)
{
    struct wal *w = arg;
    char err[256];
    for (;;) {
        pthread_mutex_lock(&w->lock);
        while (w->buf[w->active].len == 0 && !w->stop)
            pthread_cond_wait(&w->cond, &w->lock);
        /* Async mode (remote durability): gather large batches — until batch_bytes
         * or batch_ns after this batch began — unless the mode switches to sync. */
        if (!atomic_load_explicit(&w->sync, memory_order_relaxed) && !w->stop) {
            uint64_t deadline = now_ns() + w->batch_ns;
            while (!w->stop && !atomic_load_explicit(&w->sync, memory_order_relaxed) &&
                   w->buf[w->active].len < w->batch_bytes && now_ns() < deadline) {
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
        struct kvbuf *b = &w->buf[w->active];
        if (b->len == 0) { /* stop requested and nothing left */
            pthread_mutex_unlock(&w->lock);
            break;
        }
        uint64_t first = w->first_in_buf[w->active], upto = w->appended_lsn;
        uint64_t nrec = upto - first + 1;
        w->active ^= 1; /* appends continue into the other buffer meanwhile */
        pthread_mutex_unlock(&w->lock);

        int sync = atomic_load_explicit(&w->sync, memory_order_relaxed);
        if (w->seg_size >= w->seg_limit) {
            if (!sync && fdatasync(w->fd)) {
                fail(w, "log sync", errno);
                break;
            }
            if (seg_create(w, first, err, sizeof err)) {
                snprintf(w->error, sizeof w->error, "%s", err);
                atomic_store_explicit(&w->failed, 1, memory_order_release);
                notify_all(w);
                break;
            }
        }
        int rc = wal_write_all(w->fd, b->p, b->len);
        if (rc) {
            fail(w, "log write", -rc);
            break;
        }
        w->seg_size += b->len;
        atomic_store_explicit(&w->written_lsn, upto, memory_order_release); /* readable by catch-up */
        { /* every group is synced: in async mode the batches are large and rare */
            if (w->sync_delay_us)
                usleep(w->sync_delay_us);
            uint64_t t0 = now_ns();
            if (fdatasync(w->fd)) {
                fail(w, "log fdatasync", errno);
                break;
            }
            uint64_t dt = now_ns() - t0;
            atomic_fetch_add_explicit(&w->syncs, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&w->sync_ns_total, dt, memory_order_relaxed);
            if (dt > atomic_load_explicit(&w->sync_ns_max, memory_order_relaxed))
                atomic_store_explicit(&w->sync_ns_max, dt, memory_order_relaxed);
        }
        atomic_fetch_add_explicit(&w->groups, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->records, nrec, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->bytes, b->len, memory_order_relaxed);
        if (nrec > atomic_load_explicit(&w->max_group, memory_order_relaxed))
            atomic_store_explicit(&w->max_group, nrec, memory_order_relaxed);
        b->len = 0;
        kvbuf_shrink(b, 1u << 20);
        atomic_store_explicit(&w->synced_lsn, upto, memory_order_release);
        wal_publish_durable(w, upto);
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
        if (atomic_compare_exchange_weak_explicit(&w->durable_lsn, &cur, lsn, memory_order_release,
                                                  memory_order_relaxed)) {
            notify_all(w);
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

uint64_t wal_take_ship(struct wal *w, struct kvbuf *out, uint64_t *first)
{
    /* Swap, not copy: the sender's emptied buffer becomes the next ship buffer. */
    pthread_mutex_lock(&w->lock);
    struct kvbuf tmp = *out;
    tmp.len = 0;
    *out = w->sbuf;
    w->sbuf = tmp;
    *first = w->sfirst;
    uint64_t last = out->len ? w->appended_lsn : 0;
    pthread_mutex_unlock(&w->lock);
    return last;
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
    kvbuf_free(&w->buf[0]);
    kvbuf_free(&w->buf[1]);
    kvbuf_free(&w->sbuf);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->notify_lock);
    free(w->dir);
    free(w);
}

uint64_t wal_durable_lsn(struct wal *w)
{
    return atomic_load_explicit(&w->durable_lsn, memory_order_acquire);
}

int wal_failed(struct wal *w) { return atomic_load_explicit(&w->failed, memory_order_acquire); }
const char *wal_error(struct wal *w) { return wal_failed(w) ? w->error : ""; }

int wal_subscribe(struct wal *w, int evfd)
{
    pthread_mutex_lock(&w->notify_lock);
    int rc = -ENOSPC;
    if (w->nnotify < MAX_NOTIFY) {
        w->notify[w->nnotify++] = evfd;
        rc = 0;
    }
    pthread_mutex_unlock(&w->notify_lock);
    return rc;
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
    st->failed = wal_failed(w);
}

/* ---- recovery */

struct seg {
    uint64_t first;
    char name[64];
};

static int seg_cmp(const void *a, const void *b)
{
    uint64_t x = ((const struct seg *)a)->first, y = ((const struct seg *)b)->first;
    return x < y ? -1 : x > y;
}

static int list_segments(const char *dir, struct seg **out, int *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            *out = NULL;
            *n = 0;
            return 0;
        }
        return -errno;
    }
    struct seg *v = NULL;
    int cnt = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t first;
        char tail[8];
        if (strlen(de->d_name) != 24 || sscanf(de->d_name, "wal-%16" SCNx64 ".%3s", &first, tail) != 2 ||
            strcmp(tail, "log"))
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            struct seg *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
        }
        v[cnt].first = first;
        snprintf(v[cnt].name, sizeof v[cnt].name, "%s", de->d_name);
        cnt++;
    }
    closedir(d);
    qsort(v, (size_t)cnt, sizeof *v, seg_cmp);
    *out = v;
    *n = cnt;
    return 0;
}

static int read_file(const char *path, unsigned char **data, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return -e;
    }
    unsigned char *p = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!p) {
        close(fd);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, p + got, (size_t)st.st_size - got);
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(p);
            close(fd);
            return -e;
        }
        got += (size_t)r;
    }
    close(fd);
    *data = p;
    *len = got;
    return 0;
}

static int apply(struct kv_table *t, int op, const unsigned char *key, uint32_t klen,
                 const unsigned char *val, uint32_t vlen, int64_t expire)
{
    if (op == WAL_SET) {
        /* Without the bound: what was accepted live (MSET checks its bound once for
         * the whole command) must replay; the bound applies to new writes. */
        int rc = kvt_set(t, key, klen, val, vlen, KVT_NOBOUND, expire, NULL, NULL);
        return rc < 0 ? rc : 0;
    }
    if (op == WAL_DEL) {
        /* blind: with a data file the key may be only in its block */
        int rc = kvt_del_blind(t, key, klen);
        return rc < 0 ? rc : 0;
    }
    kvt_flush(t);
    return 0;
}

size_t wal_rec_len(const unsigned char *p, size_t n)
{
    if (n < WAL_HDR || crc32c(0, p + WAL_OFF_KLEN, WAL_HDR - WAL_OFF_KLEN) != get32(p + WAL_OFF_HCRC))
        return 0;
    uint32_t klen = get32(p + WAL_OFF_KLEN), vlen = get32(p + WAL_OFF_VLEN);
    if (klen > MAX_LEN || vlen > MAX_LEN || p[WAL_OFF_OP] < WAL_SET || p[WAL_OFF_OP] > WAL_FLUSH)
        return 0;
    return WAL_HDR + (size_t)klen + vlen + WAL_TRAILER;
}

int wal_rec_ok(const unsigned char *p, size_t l) { return crc32c(0, p + 4, l - 4) == get32(p); }

uint64_t wal_rec_lsn(const unsigned char *p, size_t l) { return get64(p + l - WAL_TRAILER); }

static int sync_path(const char *path, const char *dir, char *err, size_t errlen)
{
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fdatasync(fd))
        rc = -errno;
    if (fd >= 0)
        close(fd);
    int dfd = rc ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!rc && (dfd < 0 || fsync(dfd)))
        rc = -errno;
    if (dfd >= 0)
        close(dfd);
    if (rc)
        snprintf(err, errlen, "cannot sync %s: %s", path, strerror(-rc));
    return rc;
}

int wal_truncate(const char *dir, uint64_t upto)
{
    struct seg *segs = NULL;
    int nseg = 0, rc = list_segments(dir, &segs, &nseg), removed = 0;
    if (rc)
        return rc;
    /* Segment i holds LSNs [first(i), first(i+1)); the newest is the one the
     * log thread appends to and always stays. Oldest first, so a crash midway
     * leaves a suffix of the log, never a hole. */
    for (int i = 0; i + 1 < nseg && segs[i + 1].first <= upto + 1; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, segs[i].name);
        if (unlink(path) && errno != ENOENT) {
            rc = -errno;
            break;
        }
        removed++;
    }
    free(segs);
    if (removed) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return rc ? rc : removed;
}

int wal_recover(struct kv_table *t, const char *dir, uint64_t after_lsn, int repair,
                struct wal_recovery *rec, char *err, size_t errlen)
{
    memset(rec, 0, sizeof *rec);
    struct seg *segs = NULL;
    int nseg = 0, rc = list_segments(dir, &segs, &nseg);
    if (rc) {
        snprintf(err, errlen, "cannot list log directory %s: %s", dir, strerror(-rc));
        return rc;
    }
    uint64_t prev = 0;
    rc = 0;
    for (int si = 0; si < nseg && !rc; si++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, segs[si].name);
        unsigned char *d = NULL;
        size_t len = 0;
        rc = read_file(path, &d, &len);
        if (rc) {
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(-rc));
            break;
        }
        rec->segments++;
        int last = si == nseg - 1;
        if (len < WAL_SEG_HDR || memcmp(d, SEG_MAGIC, 8) || get64(d + 8) != segs[si].first) {
            if (last && len < WAL_SEG_HDR) { /* created, crashed before its header was written */
                snprintf(rec->problem, sizeof rec->problem, "%s: empty segment (header cut short), ignored", path);
                free(d);
                break;
            }
            snprintf(err, errlen, "%s: bad segment header: not a kvstore log segment or corrupt", path);
            free(d);
            rc = -EILSEQ;
            break;
        }
        if (t && si == 0 && segs[0].first > after_lsn + 1) {
            snprintf(err, errlen,
                     "%s: the log starts at LSN %" PRIu64 " but the data file holds only up to LSN %" PRIu64
                     ": segments are missing", path, segs[0].first, after_lsn);
            free(d);
            rc = -EILSEQ;
            break;
        }
        size_t off = WAL_SEG_HDR;
        while (off < len) {
            size_t left = len - off;
            const unsigned char *p = d + off;
            /* What a crash can leave at the end of the last segment: a record
             * cut short, or zeros where a write did not reach. The header CRC makes
             * the lengths trustworthy, so these are told apart from damage with
             * data after it without guessing. */
            const char *why = NULL;
            int torn = 0;
            uint32_t klen = 0, vlen = 0;
            size_t recl = wal_rec_len(p, left);
            if (left < WAL_HDR) {
                why = "record header cut short";
                torn = last;
            } else if (!recl) {
                why = "damaged record header";
                size_t nz = len; /* a header written in part, zeros after it */
                while (nz > off && d[nz - 1] == 0)
                    nz--;
                /* ... or the damage is in the final record: the file ends with the
                 * trailer (LSN) that record would carry, so nothing follows it. */
                torn = last && (nz < off + WAL_HDR ||
                                (left >= WAL_HDR + WAL_TRAILER && get64(d + len - WAL_TRAILER) == prev + 1));
            } else if (recl > left) {
                why = "record cut short";
                torn = last;
            } else if (!wal_rec_ok(p, recl)) {
                why = "CRC mismatch";
                /* the final record, partly written: nothing but zeros after it */
                size_t z = off + recl;
                while (z < len && d[z] == 0)
                    z++;
                torn = last && z == len;
            } else {
                klen = get32(p + WAL_OFF_KLEN);
                vlen = get32(p + WAL_OFF_VLEN);
            }
            if (why) {
                if (torn) {
                    rec->truncated_bytes = left;
                    snprintf(rec->problem, sizeof rec->problem,
                             "torn tail in %s at offset %zu (%s): %zu bytes after LSN %" PRIu64 " %s",
                             path, off, why, left, prev, repair ? "truncated" : "ignored");
                    if (repair && truncate(path, (off_t)off)) {
                        snprintf(err, errlen, "cannot truncate %s: %s", path, strerror(errno));
                        rc = -errno;
                    }
                    if (repair && !rc)
                        rc = sync_path(path, dir, err, errlen);
                } else {
                    snprintf(err, errlen,
                             "log corrupt in %s at offset %zu (%s) after LSN %" PRIu64
                             ": %zu bytes follow that cannot be trusted; nothing after it was applied",
                             path, off, why, prev, left);
                    rc = -EILSEQ;
                }
                break;
            }
            uint64_t lsn = wal_rec_lsn(p, recl);
            /* LSNs are consecutive across segments, and a segment's first record is
             * the LSN its header names: a missing segment or record is a gap. */
            uint64_t want = off == WAL_SEG_HDR ? segs[si].first : prev + 1;
            if (lsn != want || (prev && lsn != prev + 1)) {
                snprintf(err, errlen,
                         "log corrupt in %s at offset %zu: LSN %" PRIu64 " where %" PRIu64
                         " was expected (a segment or records are missing)", path, off, lsn,
                         prev ? prev + 1 : want);
                rc = -EILSEQ;
                break;
            }
            prev = lsn;
            if (lsn > after_lsn) {
                int arc = t ? apply(t, p[WAL_OFF_OP], p + WAL_HDR, klen, p + WAL_HDR + klen, vlen,
                                    (int64_t)get64(p + WAL_OFF_EXPIRE))
                            : 0;
                if (arc) {
                    snprintf(err, errlen, "cannot apply LSN %" PRIu64 " from %s: %s (raise --max-memory?)",
                             lsn, path, strerror(-arc));
                    rc = arc;
                    break;
                }
                if (!rec->first_lsn)
                    rec->first_lsn = lsn;
                rec->last_lsn = lsn;
                rec->records++;
            }
            rec->bytes += recl;
            off += recl;
        }
        /* What is replayed counts as durable from now on, but a crash between a
         * group's write() and its fdatasync() leaves records that were never
         * acknowledged and maybe never synced: make them durable before use. */
        if (!rc && repair)
            rc = sync_path(path, dir, err, errlen);
        free(d);
    }
    if (!rec->last_lsn)
        rec->last_lsn = prev > after_lsn ? prev : after_lsn;
    free(segs);
    return rc;
}

int64_t wal_read_range(const char *dir, uint64_t from, uint64_t upto, size_t max_bytes, struct kvbuf *out)
{
    struct seg *segs = NULL;
    int nseg = 0, rc = list_segments(dir, &segs, &nseg);
    if (rc)
        return rc;
    int si = nseg - 1;
    while (si > 0 && segs[si].first > from)
        si--;
    uint64_t last = 0;
    size_t taken = 0;
    for (; si >= 0 && si < nseg && last < upto && taken < max_bytes; si++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, segs[si].name);
        unsigned char *d = NULL;
        size_t len = 0;
        if ((rc = read_file(path, &d, &len)))
            break;
        size_t off = WAL_SEG_HDR;
        while (off + WAL_HDR + WAL_TRAILER <= len && taken < max_bytes) {
            const unsigned char *p = d + off;
            size_t recl = wal_rec_len(p, len - off);
            if (!recl || recl > len - off || !wal_rec_ok(p, recl))
                break; /* the end of what is written (or a torn tail) */
            uint64_t lsn = wal_rec_lsn(p, recl);
            if (lsn > upto || (last && lsn != last + 1))
                break; /* never hand out a gap */
            if (lsn >= from) {
                if (kvbuf_append(out, p, recl)) {
                    rc = -ENOMEM;
                    break;
                }
                taken += recl;
                last = lsn;
            }
            off += recl;
        }
        free(d);
        if (rc)
            break;
    }
    free(segs);
    return rc ? rc : (int64_t)last;
}
