/* bosc_uring.c - the sweep's I/O through io_uring (--datafile-io uring, liburing):
 * a group of a write batch's runs in one submission, and the next read window
 * read ahead into a buffer of its own while the sweep applies the current run.
 * Flusher thread only (init and exit: the opening and closing thread, the
 * flusher not running). Built without liburing (KV_HAVE_URING unset), init
 * refuses the mode and the rest is never reached. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "durability/bosc_int.h"

#ifdef KV_HAVE_URING
#include <liburing.h>

/* A group of a batch (at most WB_BLOCKS runs) goes in one submission; the
 * completion queue (twice as long) holds all of them and the read ahead. */
#define RING_ENTRIES 512
#define UD_PF UINT64_MAX     /* the read ahead's completion; a write's is its run's index */

/* The ring failed in a way that leaves it unknown: stop using it (the sweep
 * goes on with plain system calls on the same descriptor). */
static void ring_broken(struct bosc *b, int rc)
{
    if (!(b->io.mode & BOSC_IO_URING))
        return;
    b->io.mode &= ~BOSC_IO_URING;
    kvlog(KVLOG_WARNING, "data file %s: io_uring failed (%s): the sweep goes on with pread/pwritev", b->path,
          strerror(-rc));
}

/* Wait for one completion. The read ahead's is recorded in b->io; a write's
 * run index and result are returned. Returns 0 or -errno (the ring broke). */
static int reap(struct bosc *b, uint64_t *ud, int *res)
{
    struct io_uring_cqe *cqe;
    int rc;
    do
        rc = io_uring_wait_cqe(b->io.ring, &cqe);
    while (rc == -EINTR);
    if (rc)
        return rc;
    *ud = io_uring_cqe_get_data64(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(b->io.ring, cqe);
    if (*ud == UD_PF) {
        b->io.pf_state = 2;
        b->io.pf_res = *res;
    }
    return 0;
}

static int submit(struct io_uring *r)
{
    int s;
    do
        s = io_uring_submit(r);
    while (s == -EINTR);
    return s;
}

/* Wait until no read ahead is in flight. Returns 0 or -errno. */
static int pf_settle(struct bosc *b)
{
    uint64_t ud;
    int res, rc = 0;
    while (b->io.pf_state == 1 && !(rc = reap(b, &ud, &res)))
        ;
    return rc;
}

int bosc_uring_init(struct bosc *b, char *err, size_t errlen)
{
    struct bosc_io *io = &b->io;
    struct io_uring *r = calloc(1, sizeof *r);
    void *pf = NULL;
    io->iov = malloc(WB_BLOCKS * sizeof *io->iov);
    io->run = malloc(2 * WB_BLOCKS * sizeof *io->run);
    if (!r || !io->iov || !io->run || posix_memalign(&pf, BLK, (size_t)RWIN_BLOCKS * BLK)) {
        free(r);
        snprintf(err, errlen, "out of memory setting up io_uring");
        return -ENOMEM;
    }
    io->pf_buf = pf;
    int rc = io_uring_queue_init(RING_ENTRIES, r, 0);
    if (rc < 0) {
        free(r);
        snprintf(err, errlen, "cannot set up io_uring: %s", strerror(-rc));
        return rc;
    }
    io->ring = r;
    return 0;
}

void bosc_uring_exit(struct bosc *b)
{
    struct bosc_io *io = &b->io;
    if (io->ring) {
        (void)pf_settle(b); /* the kernel must not write into pf_buf once it is freed */
        io_uring_queue_exit(io->ring);
        free(io->ring);
    }
    io->ring = NULL;
    free(io->pf_buf);
    free(io->iov);
    free(io->run);
    io->pf_buf = NULL;
    io->iov = NULL;
    io->run = NULL;
    io->pf_state = 0;
}

/* Write blocks order[lo, hi) (ascending numbers): every run of consecutive
 * numbers one writev, all submitted at once, then wait for all. A run that
 * failed or was written short is (re)written with pwritev from where it
 * stopped, so ENOSPC and EIO come back as from the plain path. Returns 0 or
 * the first -errno; every block fully written is marked done. */
int bosc_uring_write_runs(struct bosc *b, int fd, struct bosc_wbatch *wb, const uint32_t *order, size_t lo, size_t hi)
{
    struct bosc_io *io = &b->io;
    struct io_uring *r = io->ring;
    size_t nrun = 0, at = 0, queued = 0, submitted = 0;
    int rc = 0, s;
    uint64_t mark = atomic_load_explicit(&b->st.blocks_written, memory_order_relaxed);
    if (io->pf_wmark != mark)
        io->pf_wmark = UINT64_MAX; /* a block was written another way since the read ahead was issued */
    for (size_t i = lo; i < hi;) {
        size_t j = bosc_io_run_end(wb, order, i, hi);
        uint64_t no = wb->no[order[i]];
        if (io->pf_state && no < io->pf_first + io->pf_n && no + (j - i) > io->pf_first)
            io->pf_wmark = UINT64_MAX; /* the read ahead's range is written: what it read is old */
        struct io_uring_sqe *sqe = io_uring_get_sqe(r);
        if (!sqe) {
            if ((s = submit(r)) < 0) {
                rc = s;
                break;
            }
            submitted += (size_t)s;
            sqe = io_uring_get_sqe(r);
        }
        if (!sqe) {
            rc = -EBUSY;
            break;
        }
        for (size_t k = i; k < j; k++)
            io->iov[at + k - i] = (struct iovec){wb->buf + (size_t)order[k] * BLK, BLK};
        io_uring_prep_writev(sqe, fd, io->iov + at, (unsigned)(j - i), (off_t)no * BLK);
        io_uring_sqe_set_data64(sqe, nrun);
        io->run[2 * nrun] = (uint32_t)i;
        io->run[2 * nrun + 1] = (uint32_t)j;
        nrun++;
        queued++;
        at += j - i;
        i = j;
    }
    if (!rc && submitted < queued) {
        if ((s = submit(r)) < 0)
            rc = s;
        else
            submitted += (size_t)s;
    }
    if (submitted < queued) {
        /* Some writes are left in the submission queue: the ring is no longer
         * known, nothing more goes through it. What was submitted is reaped
         * below; the caller undoes the buckets not written whole. */
        ring_broken(b, rc ? rc : -EBUSY);
        if (!rc)
            rc = -EIO;
    }
    for (size_t got = 0; got < submitted;) {
        uint64_t ud;
        int res, e = reap(b, &ud, &res);
        if (e) { /* cannot wait: the buffers may still be written from; stop here */
            ring_broken(b, e);
            return e;
        }
        if (ud == UD_PF)
            continue;
        got++;
        size_t i = io->run[2 * ud], j = io->run[2 * ud + 1], put = res > 0 ? (size_t)res : 0;
        if (res >= 0) {
            add(&b->st.write_calls, 1);
            add(&b->st.bytes_written, (uint64_t)res);
            for (size_t k = i; k < j && put >= (k - i + 1) * BLK; k++) {
                wb->done[order[k]] = 1;
                add(&b->st.blocks_written, 1);
            }
        }
        if (put < (j - i) * BLK) { /* failed or short: the plain way, from where it stopped */
            int w = bosc_io_write_run(b, fd, wb, order, i, j, put - put % BLK);
            if (w && !rc)
                rc = w;
        }
    }
    if (io->pf_wmark != UINT64_MAX) /* only this batch wrote, away from the read ahead */
        io->pf_wmark = atomic_load_explicit(&b->st.blocks_written, memory_order_relaxed);
    return rc;
}

/* Read blocks [first, first + n) into the read-ahead buffer, not waiting. A
 * read ahead still in flight is waited for and dropped first. */
void bosc_uring_prefetch(struct bosc *b, int fd, uint64_t first, uint64_t n)
{
    struct bosc_io *io = &b->io;
    int rc = pf_settle(b);
    io->pf_state = 0;
    if (rc) {
        ring_broken(b, rc);
        return;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(io->ring);
    if (!sqe)
        return;
    io_uring_prep_read(sqe, fd, io->pf_buf, (unsigned)(n * BLK), (off_t)(first * BLK));
    io_uring_sqe_set_data64(sqe, UD_PF);
    if ((rc = submit(io->ring)) != 1) {
        ring_broken(b, rc < 0 ? rc : -EBUSY);
        return;
    }
    io->pf_first = first;
    io->pf_n = n;
    io->pf_state = 1;
    io->pf_wmark = atomic_load_explicit(&b->st.blocks_written, memory_order_relaxed);
}

/* If the read ahead read [first, first + n) and no block of it was written
 * since, wait for it and hand it to w (the buffers swap). Returns 1 if w now
 * holds the range, 0 if the caller must read it. */
int bosc_uring_take(struct bosc *b, struct bosc_rwin *w, uint64_t first, uint64_t n)
{
    struct bosc_io *io = &b->io;
    if (!io->pf_state || io->pf_first != first || n > io->pf_n || w->cap != RWIN_BLOCKS)
        return 0;
    uint64_t t0 = now_ns();
    int rc = pf_settle(b);
    add(&b->st.io_ns, now_ns() - t0);
    io->pf_state = 0;
    if (rc) {
        ring_broken(b, rc);
        return 0;
    }
    if (io->pf_wmark != atomic_load_explicit(&b->st.blocks_written, memory_order_relaxed) ||
        io->pf_res < (int)(n * BLK))
        return 0; /* stale, failed or short (past the end): read it the plain way */
    unsigned char *t = w->buf;
    w->buf = io->pf_buf;
    io->pf_buf = t;
    add(&b->st.blocks_read, io->pf_n);
    add(&b->st.bytes_read, (uint64_t)io->pf_res);
    add(&b->st.read_calls, 1);
    w->first = first;
    w->n = n;
    return 1;
}

#else /* no liburing at build time */

int bosc_uring_init(struct bosc *b, char *err, size_t errlen)
{
    snprintf(err, errlen, "this build has no io_uring (liburing-dev was not installed when kvstore was built)");
    return -EOPNOTSUPP;
}

void bosc_uring_exit(struct bosc *b) { (void)b; }

int bosc_uring_write_runs(struct bosc *b, int fd, struct bosc_wbatch *wb, const uint32_t *order, size_t lo, size_t hi)
{
    return -EOPNOTSUPP;
}

void bosc_uring_prefetch(struct bosc *b, int fd, uint64_t first, uint64_t n) {}

int bosc_uring_take(struct bosc *b, struct bosc_rwin *w, uint64_t first, uint64_t n) { return 0; }

#endif
