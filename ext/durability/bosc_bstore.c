/* bstore.c - the batch store (see bstore.h): segment files of sealed stream
 * batches. The segment table is changed by the flusher only, under s->lock,
 * which readers hold while they read (a segment is not closed under them). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/log.h"
#include "durability/bstore.h"

struct seg {
    uint32_t no;
    int fd;                     /* -1: not created yet (the current segment before its first commit) */
    uint64_t synced;            /* bytes written and synced */
    int64_t live;               /* bytes the data file's records refer to */
    int retired;                /* before a FLUSHALL: deleted once its generation is recorded */
};

struct bstore {
    char dir[4096];
    int dfd;
    pthread_mutex_t lock;
    struct seg *seg;            /* by number, ascending */
    size_t n, cap;
    uint32_t cur;               /* the segment staged into (0: start a new one) */
    uint32_t next_no;
    uint64_t seg_bytes;         /* BSTORE_SEG_BYTES, or the tests' KVSTORE_TEST_BATCH_SEGMENT_BYTES */
    struct kvbuf pend;          /* staged bytes, in runs: */
    struct run {                /* bytes [at, at + len) of pend go to segment seg at off */
        uint32_t seg;
        uint64_t off, at, len, n; /* (n: batches) */
    } *runs;
    size_t nruns, capruns;
    struct bstore_stats st;     /* counters: __atomic, relaxed (read by any thread) */
};

static struct seg *find(const struct bstore *s, uint32_t no)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->seg[mid].no == no)
            return &s->seg[mid];
        if (s->seg[mid].no < no)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Append segment no (above every one known). Caller: the flusher or open. */
static struct seg *add_seg(struct bstore *s, uint32_t no, int fd, uint64_t synced)
{
    pthread_mutex_lock(&s->lock);
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        struct seg *ns = realloc(s->seg, cap * sizeof *ns);
        if (!ns) {
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        s->seg = ns;
        s->cap = cap;
    }
    struct seg *g = &s->seg[s->n++];
    *g = (struct seg){no, fd, synced, 0, 0};
    pthread_mutex_unlock(&s->lock);
    return g;
}

static int by_no(const void *a, const void *b)
{
    uint32_t x = ((const struct seg *)a)->no, y = ((const struct seg *)b)->no;
    return (x > y) - (x < y);
}

int bstore_open(struct bstore **out, const char *dir, char *err, size_t errlen)
{
    struct bstore *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    s->dfd = -1;
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    const char *small = getenv("KVSTORE_TEST_BATCH_SEGMENT_BYTES"); /* tests: segments roll and go sooner */
    s->seg_bytes = small && strtoull(small, NULL, 10) ? strtoull(small, NULL, 10) : BSTORE_SEG_BYTES;
    int rc = 0;
    if (mkdir(dir, 0700) && errno != EEXIST) {
        rc = -errno;
        snprintf(err, errlen, "cannot create the batch store %s: %s", dir, strerror(errno));
        goto fail;
    }
    if ((s->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(err, errlen, "cannot open the batch store %s: %s", dir, strerror(errno));
        goto fail;
    }
    DIR *d = fdopendir(dup(s->dfd));
    if (!d) {
        rc = -errno;
        snprintf(err, errlen, "cannot list the batch store %s: %s", dir, strerror(errno));
        goto fail;
    }
    struct dirent *de;
    while ((de = readdir(d)) && !rc) {
        unsigned no;
        char tail;
        if (strlen(de->d_name) != 12 || sscanf(de->d_name, "%8x.seg%c", &no, &tail) != 1 || !no)
            continue;
        int fd = openat(s->dfd, de->d_name, O_RDWR | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb)) {
            rc = -errno;
            snprintf(err, errlen, "cannot open %s/%s: %s", dir, de->d_name, strerror(errno));
            if (fd >= 0)
                close(fd);
            break;
        }
        if (!add_seg(s, no, fd, (uint64_t)sb.st_size)) {
            close(fd);
            rc = -ENOMEM;
        }
        if (no >= s->next_no)
            s->next_no = no + 1;
    }
    closedir(d);
    if (rc)
        goto fail;
    if (s->n > 1)
        qsort(s->seg, s->n, sizeof *s->seg, by_no);
    if (!s->next_no)
        s->next_no = 1;
    *out = s;
    return 0;
fail:
    bstore_close(s);
    return rc;
}

void bstore_close(struct bstore *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        if (s->seg[i].fd >= 0)
            close(s->seg[i].fd);
    if (s->dfd >= 0)
        close(s->dfd);
    free(s->seg);
    kvbuf_free(&s->pend);
    free(s->runs);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int bstore_stage(struct bstore *s, const void *p, uint32_t len, struct xs_ref *ref)
{
    struct run *r = s->nruns ? &s->runs[s->nruns - 1] : NULL;
    struct seg *g = s->cur ? find(s, s->cur) : NULL;
    if (!g || g->synced + (r ? r->len : 0) >= s->seg_bytes) { /* the next segment, a new run */
        if (s->next_no == UINT32_MAX)
            return -ENOSPC;
        if (s->nruns == s->capruns) {
            size_t cap = s->capruns ? 2 * s->capruns : 4;
            struct run *nr = realloc(s->runs, cap * sizeof *nr);
            if (!nr)
                return -ENOMEM;
            s->runs = nr;
            s->capruns = cap;
        }
        if (!add_seg(s, s->next_no, -1, 0))
            return -ENOMEM;
        s->cur = s->next_no++;
        r = NULL;
    }
    if (!r || r->seg != s->cur) {
        g = find(s, s->cur);
        r = &s->runs[s->nruns++];
        *r = (struct run){s->cur, g->synced, s->pend.len, 0, 0};
    }
    if (kvbuf_append(&s->pend, p, len)) {
        if (!r->len)
            s->nruns--;
        return -ENOMEM;
    }
    *ref = (struct xs_ref){r->seg, len, r->off + r->len, crc32c(0, p, len)};
    r->len += len;
    r->n++;
    return 0;
}

int bstore_pending(const struct bstore *s) { return s->nruns != 0; }

static int write_all(int fd, const char *p, size_t n, off_t off)
{
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Write and sync run r. 0 or -errno. */
static int commit_run(struct bstore *s, const struct run *r)
{
    struct seg *g = find(s, r->seg);
    if (g->fd < 0) {
        char name[32];
        snprintf(name, sizeof name, "%08" PRIx32 ".seg", g->no);
        int fd = openat(s->dfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            return -errno;
        if (fsync(s->dfd)) { /* its name must survive a crash with its bytes */
            int rc = -errno;
            close(fd);
            unlinkat(s->dfd, name, 0);
            return rc;
        }
        pthread_mutex_lock(&s->lock);
        g->fd = fd;
        pthread_mutex_unlock(&s->lock);
    }
    int rc = write_all(g->fd, s->pend.p + r->at, r->len, (off_t)r->off);
    if (!rc && fdatasync(g->fd))
        rc = -errno;
    if (rc)
        return rc;
    pthread_mutex_lock(&s->lock);
    g->synced = r->off + r->len;
    pthread_mutex_unlock(&s->lock);
    __atomic_fetch_add(&s->st.batches, r->n, __ATOMIC_RELAXED);
    return 0;
}

int bstore_commit(struct bstore *s)
{
    int rc = 0;
    for (size_t i = 0; i < s->nruns && !rc; i++)
        rc = commit_run(s, &s->runs[i]);
    if (rc)
        s->cur = 0; /* never appended to again: what it synced stays good (a later run: nothing) */
    s->nruns = 0;
    s->pend.len = 0;
    if (s->pend.cap > (8u << 20))
        kvbuf_free(&s->pend);
    return rc;
}

int bstore_durable(struct bstore *s, const struct xs_ref *ref)
{
    pthread_mutex_lock(&s->lock); /* (the evictor may run on another thread than the flusher) */
    const struct seg *g = ref->seg ? find(s, ref->seg) : NULL;
    int ok = g && !g->retired && g->fd >= 0 && ref->off + ref->len <= g->synced;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

void bstore_count(struct bstore *s, const struct xs_ref *ref, int add)
{
    struct seg *g = ref->seg ? find(s, ref->seg) : NULL;
    if (g) /* (relaxed: bstore_stats reads it from another thread) */
        __atomic_fetch_add(&g->live, add ? (int64_t)ref->len : -(int64_t)ref->len, __ATOMIC_RELAXED);
}

/* Delete segment i (the flusher; under s->lock). */
static void drop(struct bstore *s, size_t i)
{
    struct seg *g = &s->seg[i];
    char name[32];
    snprintf(name, sizeof name, "%08" PRIx32 ".seg", g->no);
    if (g->fd >= 0)
        close(g->fd);
    if (unlinkat(s->dfd, name, 0) && errno != ENOENT)
        kvlog(KVLOG_WARNING, "batch store %s: cannot delete %s: %s", s->dir, name, strerror(errno));
    memmove(g, g + 1, (s->n - i - 1) * sizeof *g);
    s->n--;
}

/* Delete the segments dead() says are (the flusher). Returns how many. */
static int drop_dead(struct bstore *s, int (*dead)(const struct bstore *s, const struct seg *g))
{
    int n = 0;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n;) {
        if (dead(s, &s->seg[i])) {
            drop(s, i);
            n++;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (n)
        fsync(s->dfd);
    return n;
}

/* Nothing refers to it, it takes no more batches, and it has none staged (those count as live). */
static int unreferenced(const struct bstore *s, const struct seg *g) { return g->no != s->cur && g->live <= 0; }

static int retired(const struct bstore *s, const struct seg *g)
{
    (void)s;
    return g->retired;
}

int bstore_collect(struct bstore *s) { return drop_dead(s, unreferenced); }

void bstore_retire(struct bstore *s)
{
    for (size_t i = 0; i < s->n; i++)
        s->seg[i].retired = 1;
    s->cur = 0;
    s->pend.len = 0;
    s->nruns = 0;
}

void bstore_drop_retired(struct bstore *s) { (void)drop_dead(s, retired); }

int bstore_read(struct bstore *s, const struct xs_ref *ref, void *buf)
{
    pthread_mutex_lock(&s->lock);
    struct seg *g = find(s, ref->seg);
    int rc = 0;
    if (!g || g->fd < 0) {
        rc = -ENOENT;
    } else {
        size_t got = 0;
        while (got < ref->len) {
            ssize_t r = pread(g->fd, (char *)buf + got, ref->len - got, (off_t)(ref->off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                rc = r < 0 ? -errno : -EILSEQ;
                break;
            }
            got += (size_t)r;
        }
        __atomic_fetch_add(&s->st.reads, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->lock);
    if (!rc && crc32c(0, buf, ref->len) != ref->crc)
        rc = -EILSEQ;
    return rc;
}

void bstore_stats(struct bstore *s, struct bstore_stats *out)
{
    pthread_mutex_lock(&s->lock);
#define A(f) out->f = __atomic_load_n(&s->st.f, __ATOMIC_RELAXED)
    A(batches);
    A(reads);
#undef A
    out->segments = s->n;
    out->live_bytes = out->file_bytes = 0;
    for (size_t i = 0; i < s->n; i++) {
        int64_t live = __atomic_load_n(&s->seg[i].live, __ATOMIC_RELAXED);
        out->live_bytes += live > 0 ? (uint64_t)live : 0;
        out->file_bytes += s->seg[i].synced;
    }
    pthread_mutex_unlock(&s->lock);
}
