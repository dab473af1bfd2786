/* bosc_io.c - the sweep's coalesced I/O (see bosc_int.h): a read window holding
 * the home copies of a run of dirty buckets, read with one pread, and a write
 * batch that writes several buckets' new chains with one pwritev per run of
 * consecutive blocks -- buffered, O_DIRECT or through io_uring (bosc_uring.c)
 * as bosc_config.io_mode says. Flusher thread only (bosc_io_open/close: the
 * opening and closing thread, the flusher not running). Copy on write and the
 * ordering rules of bosc_sweep.c's chain writes hold: new blocks go to the home
 * copy that does not hold the synced chain and to free overflow blocks;
 * overflow blocks are written before home blocks; old blocks are freed only
 * after the sweep's sync. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "durability/bosc_int.h"

/* ---- the I/O mode */

static void *blk_alloc(size_t blocks)
{
    void *p = NULL; /* 4 KiB-aligned: O_DIRECT needs it, the other modes do not mind */
    return posix_memalign(&p, BLK, blocks * BLK) ? NULL : p;
}

/* Set up mode (BOSC_IO_*) for b, whose b->fd is open: the O_DIRECT descriptor,
 * the ring. A mode this file system, kernel or build cannot do (O_DIRECT
 * refused, io_uring disabled or not built in) is left out with a warning in the
 * log: the sweep then does that part with buffered system calls, which work
 * everywhere (the mode is a matter of speed, never a reason not to start).
 * Returns 0 or -EINVAL (an unknown mode: err says so). */
int bosc_io_open(struct bosc *b, int mode, char *err, size_t errlen)
{
    struct bosc_io *io = &b->io;
    io->dfd = -1;
    /* Test hook (KVSTORE_TEST_DATAFILE_IO=0..3 in the environment): every data file
     * of the process uses that mode, so the data file's suites run under each
     * (tests/faults/test_datafile_io_modes.py). */
    const char *force = getenv("KVSTORE_TEST_DATAFILE_IO");
    if (force && *force)
        mode = atoi(force);
    if (mode & ~(BOSC_IO_DIRECT | BOSC_IO_URING)) {
        snprintf(err, errlen, "unknown data file I/O mode %d", mode);
        return -EINVAL;
    }
    io->mode = mode;
    if (mode & BOSC_IO_DIRECT) {
        io->dfd = open(b->path, O_RDWR | O_DIRECT | O_CLOEXEC);
        if (io->dfd < 0) {
            kvlog(KVLOG_WARNING, "data file %s: cannot open it with O_DIRECT (%s): its sweep reads and writes "
                  "through the page cache", b->path, strerror(errno));
            io->mode &= ~BOSC_IO_DIRECT;
        }
    }
    if (mode & BOSC_IO_URING) {
        char why[256];
        if (bosc_uring_init(b, why, sizeof why)) {
            kvlog(KVLOG_WARNING, "data file %s: %s: its sweep uses pread/pwritev", b->path, why);
            bosc_uring_exit(b);
            io->mode &= ~BOSC_IO_URING;
        }
    }
    return 0;
}

/* Undo bosc_io_open (waits for a read ahead in flight). Safe on a zeroed or
 * closed b->io (dfd -1). */
void bosc_io_close(struct bosc *b)
{
    bosc_uring_exit(b);
    if (b->io.dfd >= 0)
        close(b->io.dfd);
    b->io.dfd = -1;
}

/* The descriptor the sweep's windows and batches use. */
static int sweep_fd(const struct bosc *b) { return b->io.dfd >= 0 ? b->io.dfd : b->fd; }

/* ---- the read window */

/* Read blocks [first, first + n) (at most w->cap) into w with one call (or
 * take them from the read ahead when it read that range). Returns 0 or -errno
 * (w then holds nothing). */
int bosc_rwin_fill(struct bosc *b, struct bosc_rwin *w, uint64_t first, uint64_t n)
{
    w->n = 0;
    if (!w->cap)
        w->cap = RWIN_BLOCKS;
    if (!w->buf && !(w->buf = blk_alloc(w->cap)))
        return -ENOMEM;
    if (n > w->cap)
        n = w->cap;
    if ((b->io.mode & BOSC_IO_URING) && bosc_uring_take(b, w, first, n))
        return 0;
    int rc = pread_all(sweep_fd(b), w->buf, (size_t)n * BLK, (off_t)(first * BLK));
    if (rc)
        return rc;
    add(&b->st.blocks_read, n);
    add(&b->st.bytes_read, n * BLK);
    add(&b->st.read_calls, 1);
    w->first = first;
    w->n = n;
    return 0;
}

/* Have blocks [first, first + n) read ahead, while the sweep applies the
 * current run (no wait): with io_uring into the read-ahead buffer, buffered by
 * the kernel (posix_fadvise, a hint), O_DIRECT alone not at all. */
void bosc_rwin_advise(struct bosc *b, uint64_t first, uint64_t n)
{
    if (b->io.mode & BOSC_IO_URING)
        bosc_uring_prefetch(b, sweep_fd(b), first, n > RWIN_BLOCKS ? RWIN_BLOCKS : n);
    else if (!(b->io.mode & BOSC_IO_DIRECT))
        (void)posix_fadvise(b->fd, (off_t)(first * BLK), (off_t)(n * BLK), POSIX_FADV_WILLNEED);
}

/* ---- the write batch */

int bosc_wb_init(struct bosc_wbatch *wb)
{
    memset(wb, 0, sizeof *wb);
    wb->buf = blk_alloc(WB_BLOCKS);
    wb->no = malloc(WB_BLOCKS * sizeof *wb->no);
    wb->done = malloc(WB_BLOCKS);
    if (!wb->buf || !wb->no || !wb->done) {
        bosc_wb_free(wb);
        return -ENOMEM;
    }
    return 0;
}

void bosc_wb_free(struct bosc_wbatch *wb)
{
    free(wb->buf);
    free(wb->no);
    free(wb->done);
    free(wb->bk);
    memset(wb, 0, sizeof *wb);
}

/* Stage stream s as bucket's new chain (its old chain: chain[0 .. nchain)):
 * take the blocks (the home copy that does not hold the synced chain, free
 * overflow blocks), seal them into the batch, put the old overflow blocks on
 * b->freed and the bucket on b->touched. Nothing is written (a reader still
 * finds the synced chain; -E2BIG: the batch has no room for it; flush it first).
 * *out: the staged bucket, for the caller's fields. Returns 0, -ENOSPC (no
 * block to be had) or -ENOMEM, nothing staged then. */
int bosc_wb_stage(struct bosc *b, struct bosc_wbatch *wb, uint32_t bucket, uint64_t gen, const struct kvbuf *s,
                  const uint32_t *chain, size_t nchain, struct wb_bucket **out)
{
    size_t need = s->len ? (s->len + PAYLOAD - 1) / PAYLOAD : 1;
    if (wb->n + need > WB_BLOCKS)
        return -E2BIG;
    if (wb->nbk == wb->capbk) {
        size_t cap = wb->capbk ? wb->capbk * 2 : 64;
        struct wb_bucket *nb = realloc(wb->bk, cap * sizeof *nb);
        if (!nb)
            return -ENOMEM;
        wb->bk = nb;
        wb->capbk = cap;
    }
    uint32_t home = (uint32_t)home_of(b, bucket);
    size_t lo = wb->n;
    for (size_t i = 0; i < need; i++) {
        uint32_t no = i == 0 ? home + (b->slot[bucket] ^ 1u) : bosc_blk_alloc(b);
        if (!no) {
            for (size_t k = lo + 1; k < lo + i; k++)
                bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, wb->no[k]);
            return -ENOSPC;
        }
        wb->no[lo + i] = no;
    }
    struct wb_bucket *e = &wb->bk[wb->nbk];
    *e = (struct wb_bucket){.bucket = bucket, .blk_lo = lo, .blk_hi = lo + need, .freed_lo = b->nfreed};
    int rc = bosc_push_u32(&b->touched, &b->ntouched, &b->captouched, bucket);
    for (size_t i = 1; i < nchain && !rc; i++)
        rc = bosc_push_u32(&b->freed, &b->nfreed, &b->capfreed, chain[i]);
    if (rc) {
        b->nfreed = e->freed_lo;
        if (b->ntouched && b->touched[b->ntouched - 1] == bucket)
            b->ntouched--;
        for (size_t k = lo + 1; k < lo + need; k++)
            bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, wb->no[k]);
        return rc;
    }
    e->freed_hi = b->nfreed;
    for (size_t k = 0; k < need; k++) {
        unsigned char *p = wb->buf + (lo + k) * BLK;
        size_t off = k * PAYLOAD, n = s->len > off ? s->len - off : 0;
        if (n > PAYLOAD)
            n = PAYLOAD;
        if (n)
            memcpy(p + BHDR, s->p + off, n);
        bosc_block_seal(p, BLK_MAGIC, wb->no[lo + k], k + 1 < need ? wb->no[lo + k + 1] : 0, gen, (uint32_t)n,
                        home, b->wseq);
        wb->done[lo + k] = 0;
    }
    wb->n = lo + need;
    wb->nbk++;
    *out = e;
    return 0;
}

static int cmp_blk(const void *x, const void *y, void *arg)
{
    const uint32_t *no = arg;
    uint32_t a = no[*(const uint32_t *)x], c = no[*(const uint32_t *)y];
    return (a > c) - (a < c);
}

/* Write run order[i, j) (consecutive block numbers) from byte put of the run
 * on, with pwritev on fd until it is all written; each block fully written is
 * marked done. A short O_DIRECT write that ends inside a block goes on through
 * the buffered descriptor (an unaligned direct write would fail). Returns 0 or
 * -errno. */
int bosc_io_write_run(struct bosc *b, int fd, struct bosc_wbatch *wb, const uint32_t *order, size_t i, size_t j,
                      size_t put)
{
    struct iovec iov[64];
    int cnt = (int)(j - i), first = (int)(put / BLK);
    for (size_t k = i; k < j; k++)
        iov[k - i] = (struct iovec){wb->buf + (size_t)order[k] * BLK, BLK};
    for (int k = 0; k < first; k++)
        wb->done[order[i + (size_t)k]] = 1;
    off_t off = (off_t)wb->no[order[i]] * BLK;
    size_t total = (j - i) * BLK;
    while (put < total) {
        if (put % BLK) { /* a short write inside a block: go on from there */
            size_t in = put % BLK;
            iov[first].iov_base = wb->buf + (size_t)order[i + (size_t)first] * BLK + in;
            iov[first].iov_len = BLK - in;
            fd = b->fd;
        }
        ssize_t r = pwritev(fd, iov + first, cnt - first, off + (off_t)put);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        add(&b->st.write_calls, 1);
        add(&b->st.bytes_written, (uint64_t)r); /* (per call: a run that fails half way counts what it wrote) */
        put += (size_t)r;
        while (first < cnt && put >= (size_t)(first + 1) * BLK) { /* whole blocks are written */
            wb->done[order[i + (size_t)first++]] = 1;
            add(&b->st.blocks_written, 1);
        }
    }
    return 0;
}

/* The end of the run of consecutive block numbers starting at order[i] (at
 * most 64 blocks, below hi). */
size_t bosc_io_run_end(const struct bosc_wbatch *wb, const uint32_t *order, size_t i, size_t hi)
{
    size_t j = i + 1;
    while (j < hi && j - i < 64 && wb->no[order[j]] == wb->no[order[j - 1]] + 1)
        j++;
    return j;
}

/* Write blocks order[lo, hi) (ascending numbers): one pwritev per run of
 * consecutive numbers, or (io_uring) every run in one submission, waiting for
 * all. Returns 0 or -errno at the first failure. */
static int write_runs(struct bosc *b, struct bosc_wbatch *wb, const uint32_t *order, size_t lo, size_t hi)
{
    if (b->io.mode & BOSC_IO_URING)
        return bosc_uring_write_runs(b, sweep_fd(b), wb, order, lo, hi);
    for (size_t i = lo; i < hi;) {
        size_t j = bosc_io_run_end(wb, order, i, hi);
        int rc = bosc_io_write_run(b, sweep_fd(b), wb, order, i, j, 0);
        if (rc)
            return rc;
        i = j;
    }
    return 0;
}

/* Write the staged blocks: overflow blocks first, then home blocks, each group
 * in ascending order (with the torn-write fault hook on, one at a time in
 * staging order, as bosc_block_put does it). Marks each staged bucket ok when
 * all its blocks are written. Returns 0 or the first -errno (the buckets not ok
 * are for bosc_wb_undo). */
int bosc_wb_write(struct bosc *b, struct bosc_wbatch *wb)
{
    int rc = 0;
    if (b->tear_at) {
        for (size_t e = 0; e < wb->nbk && !rc; e++) /* overflow first, the home block last */
            for (size_t k = wb->bk[e].blk_hi; k-- > wb->bk[e].blk_lo && !rc;)
                if (!(rc = bosc_block_put(b, wb->buf + k * BLK, wb->no[k])))
                    wb->done[k] = 1;
    } else if (wb->n) {
        uint32_t order[WB_BLOCKS];
        for (size_t k = 0; k < wb->n; k++)
            order[k] = (uint32_t)k;
        qsort_r(order, wb->n, sizeof *order, cmp_blk, wb->no);
        size_t homes = 0; /* home blocks lie below the overflow blocks */
        while (homes < wb->n && wb->no[order[homes]] < b->first_over)
            homes++;
        rc = write_runs(b, wb, order, homes, wb->n);
        if (!rc)
            rc = write_runs(b, wb, order, 0, homes);
    }
    for (size_t e = 0; e < wb->nbk; e++) {
        struct wb_bucket *x = &wb->bk[e];
        x->ok = 1;
        for (size_t k = x->blk_lo; k < x->blk_hi; k++)
            x->ok &= wb->done[k];
    }
    return rc;
}

/* After a failed bosc_wb_write: every staged bucket not ok gives its new
 * blocks back, its old ones stay in use (off b->freed) and it is not touched
 * (its copies do not flip). Its home copy was not written whole: the synced
 * copy stays the one a reader picks. */
void bosc_wb_undo(struct bosc *b, struct bosc_wbatch *wb)
{
    size_t w = wb->nbk ? wb->bk[0].freed_lo : b->nfreed, r = w;
    for (size_t e = 0; e < wb->nbk; e++) {
        struct wb_bucket *x = &wb->bk[e];
        if (x->ok) {
            for (r = x->freed_lo; r < x->freed_hi; r++)
                b->freed[w++] = b->freed[r];
            continue;
        }
        for (size_t k = x->blk_lo + 1; k < x->blk_hi; k++)
            bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, wb->no[k]);
        for (size_t t = b->ntouched; t-- > 0;)
            if (b->touched[t] == x->bucket) {
                memmove(b->touched + t, b->touched + t + 1, (b->ntouched - t - 1) * sizeof *b->touched);
                b->ntouched--;
                break;
            }
    }
    if (wb->nbk)
        b->nfreed = w;
}
