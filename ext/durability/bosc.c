/* bosc.c - the BOSC data file, its flusher and its loader (see bosc.h).
 * Threads: the flusher owns the free-block lists and writes blocks; the loader
 * reads them; pollers only read nkeys[] (relaxed) through maybe_on_disk and
 * queue load requests. A bucket's version (seqlock: odd while its blocks are
 * being written) and the generation tell the loader that what it read is stale.
 * Parses untrusted bytes (the file): every length and chain is bounded. */
#define _GNU_SOURCE
#include "durability/bosc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/ldu.h"
#include "core/table.h"
#include "durability/wal.h"

#define BLK BOSC_BLOCK
#define BHDR 32
#define PAYLOAD (BLK - BHDR)
#define FIRST_HOME 2
#define REC_HDR 16
#define SB_MAGIC "KVSBOSC1"
#define BLK_MAGIC 0x3142564Bu /* "KVB1" as bytes (little-endian u32): never all zeros */
#define MAX_REC (512u * 1024 * 1024)
#define MAX_BLOCKS (UINT32_MAX - 1)
#define HIGH_PCT 90          /* evict when memory passes this share of the bound ... */
#define LOW_PCT 60           /* ... down to this share: room for the next batch of dirty keys */
#define MAX_SUBS 1024

struct load_req {
    struct load_req *next;
    int evfd;
    uint32_t klen;
    unsigned char key[];
};

struct item {                /* one dirty key in a sweep */
    struct kvt_dnode *d;
    uint32_t bucket;
    int nheld;
    struct ldu_node *held[2];
    struct kvt_snap snap;
    size_t voff;             /* value in the sweep's buffer */
    int written;
};

struct bosc {
    struct kv_table *t;
    int fd;
    char path[4096];
    char log_dir[4096];
    uint32_t nbuckets;
    uint64_t k0, k1;
    _Atomic uint64_t nblocks;     /* blocks in use by the file: the flusher grows it, the
                                     loader reads it for its bounds check (relaxed: a block
                                     past an old count is only reached through a chain
                                     whose version the loader then sees changed) */
    uint64_t sb_gen;              /* generation the newest superblock records (flusher) */
    uint64_t sb_seq;              /* flusher only */
    uint32_t interval_ms;
    _Atomic uint32_t *nkeys;      /* records per bucket chain */
    _Atomic uint32_t *ver;        /* per-bucket seqlock */
    _Atomic uint64_t gen;         /* blocks of another generation are empty */
    _Atomic uint64_t flushed_lsn;
    pthread_mutex_t gen_lock;     /* FLUSHALL's bump vs a block write: never both */
    pthread_mutex_t flush_lock;   /* FLUSHALL's log record + bump vs a sweep reading the
                                     durable LSN and the generation: one or the other.
                                     Lock order: flush_lock before gen_lock. */
    uint32_t *free_blk;           /* overflow blocks free to use (flusher) */
    size_t nfree, capfree;
    uint32_t *freed;              /* freed this sweep: reusable after its sync */
    size_t nfreed, capfreed;
    struct ldu_queue q;
    pthread_mutex_t qlock;        /* the simple queue's lock (cfg->locked_queue) */
    int locked_queue;
    struct wal *wal;
    pthread_t flusher, loader;
    int started;
    pthread_mutex_t lock;         /* guards the fields below */
    pthread_cond_t cond, done;
    int stop, kick;
    uint64_t sync_req, sync_done;
    struct load_req *lhead, *ltail;
    int subs[MAX_SUBS];
    _Atomic int nsubs;
    _Atomic int failed;
    _Atomic int sweeping;         /* a sweep holds keys taken off the queue */
    int evict_failed;             /* the last eviction found nothing to evict (flusher) */
    char error[256];
    struct {
        _Atomic uint64_t sweeps, records, blocks_read, blocks_written, bytes_written, syncs;
        _Atomic uint64_t sweep_ns, io_ns, deferred, loads, load_reads, evicted, evicted_bytes, truncated;
    } st;
    uint32_t sweep_no;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void add(_Atomic uint64_t *c, uint64_t d) { atomic_fetch_add_explicit(c, d, memory_order_relaxed); }

static void fail(struct bosc *b, const char *msg)
{
    pthread_mutex_lock(&b->lock);
    if (!atomic_load(&b->failed)) {
        snprintf(b->error, sizeof b->error, "%s", msg);
        atomic_store(&b->failed, 1);
    }
    pthread_mutex_unlock(&b->lock);
}

static uint32_t bucket_of(struct bosc *b, const void *key, size_t klen)
{
    return (uint32_t)(kvt_hash_keyed(key, klen, b->k0, b->k1) % b->nbuckets);
}

/* ---- blocks */

static int pread_all(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0) { /* past the end: zeros, as a hole reads */
            memset((char *)buf + got, 0, n - got);
            return 0;
        }
        got += (size_t)r;
    }
    return 0;
}

static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = pwrite(fd, (const char *)buf + put, n - put, off + (off_t)put);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        put += (size_t)r;
    }
    return 0;
}

static int all_zero(const unsigned char *p, size_t n)
{
    static const unsigned char z[BHDR];
    return memcmp(p, z, BHDR) == 0 && (n <= BHDR || memcmp(p, p + 1, n - 1) == 0);
}

/* Check a block read from disk. Returns 1 valid, 0 empty (all zeros), -EILSEQ
 * damaged (why in err). */
static int block_check(struct bosc *b, const unsigned char *p, uint32_t no, char *err, size_t errlen)
{
    if (all_zero(p, BLK))
        return 0;
    const char *why = NULL;
    if (get32(p) != BLK_MAGIC)
        why = "bad magic (not a kvstore data block)";
    else if (crc32c(0, p + 8, BLK - 8) != get32(p + 4))
        why = "checksum mismatch";
    else if (get32(p + 8) != no)
        why = "block number mismatch (misplaced write)";
    else if (get32(p + 24) > PAYLOAD)
        why = "payload length out of range";
    if (!why)
        return 1;
    snprintf(err, errlen, "data file %s damaged: block %" PRIu32 " (offset %" PRIu64 "): %s", b->path, no,
             (uint64_t)no * BLK, why);
    return -EILSEQ;
}

static int block_write(struct bosc *b, unsigned char *p, uint32_t no, uint32_t next, uint64_t gen,
                       uint32_t used, uint32_t home)
{
    put32(p, BLK_MAGIC);
    put32(p + 8, no);
    put32(p + 12, next);
    put64(p + 16, gen);
    put32(p + 24, used);
    put32(p + 28, home);
    if (used < PAYLOAD)
        memset(p + BHDR + used, 0, PAYLOAD - used);
    put32(p + 4, crc32c(0, p + 8, BLK - 8));
    add(&b->st.blocks_written, 1);
    add(&b->st.bytes_written, BLK);
    return pwrite_all(b->fd, p, BLK, (off_t)no * BLK);
}

/* Append x to a growable array. Returns 0 or -ENOMEM. */
static int push_u32(uint32_t **v, size_t *n, size_t *cap, uint32_t x)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        uint32_t *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return 0;
}

/* Read bucket's chain: its record stream into s (reset first) and its block
 * numbers into chain (home first). Blocks of another generation hold nothing
 * (their overflow blocks are still listed, to be reused or freed). Returns
 * 0 or -errno (-EILSEQ with err set). */
static int chain_read(struct bosc *b, uint32_t bucket, uint64_t gen, struct kvbuf *s, uint32_t **chain,
                      size_t *nchain, size_t *capchain, char *err, size_t errlen)
{
    unsigned char blk[BLK];
    uint32_t home = FIRST_HOME + bucket, no = home;
    int stale = 0;
    s->len = 0;
    *nchain = 0;
    for (uint64_t steps = 0; no; steps++) {
        uint64_t nb = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
        if (steps > nb || no >= nb || (no != home && no < FIRST_HOME + b->nbuckets)) {
            snprintf(err, errlen, "data file %s damaged: chain of block %" PRIu32 " leads to block %" PRIu32
                     " (out of range or a loop)", b->path, home, no);
            return -EILSEQ;
        }
        int rc = pread_all(b->fd, blk, BLK, (off_t)no * BLK);
        if (rc) {
            snprintf(err, errlen, "cannot read %s block %" PRIu32 ": %s", b->path, no, strerror(-rc));
            return rc;
        }
        add(&b->st.blocks_read, 1);
        rc = block_check(b, blk, no, err, errlen);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            if (no != home) {
                snprintf(err, errlen, "data file %s damaged: overflow block %" PRIu32 " of block %" PRIu32
                         " is empty", b->path, no, home);
                return -EILSEQ;
            }
            break;
        }
        if (get32(blk + 28) != home) {
            snprintf(err, errlen, "data file %s damaged: block %" PRIu32 " belongs to block %" PRIu32
                     ", found in the chain of block %" PRIu32, b->path, no, get32(blk + 28), home);
            return -EILSEQ;
        }
        if (push_u32(chain, nchain, capchain, no))
            return -ENOMEM;
        if (no == home)
            stale = get64(blk + 16) != gen;
        if (!stale && kvbuf_append(s, (const char *)blk + BHDR, get32(blk + 24)))
            return -ENOMEM;
        no = get32(blk + 12);
    }
    return 0;
}

/* Walk a record stream. Returns the number of records, or -EILSEQ if it is
 * malformed. fn (may be NULL) sees each record. */
typedef void (*rec_fn)(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key,
                       uint32_t klen, const unsigned char *val, uint32_t vlen, int64_t expire);
static int64_t stream_walk(const unsigned char *p, size_t n, rec_fn fn, void *arg)
{
    size_t off = 0;
    int64_t cnt = 0;
    while (off < n) {
        if (n - off < REC_HDR)
            return -EILSEQ;
        uint32_t klen = get32(p + off), vlen = get32(p + off + 4);
        if (klen > MAX_REC || vlen > MAX_REC || (uint64_t)klen + vlen > n - off - REC_HDR)
            return -EILSEQ;
        if (fn)
            fn(arg, p + off, REC_HDR + (size_t)klen + vlen, p + off + REC_HDR, klen, p + off + REC_HDR + klen,
               vlen, (int64_t)get64(p + off + 8));
        off += REC_HDR + (size_t)klen + vlen;
        cnt++;
    }
    return cnt;
}

static int stream_damaged(struct bosc *b, uint32_t bucket, char *err, size_t errlen)
{
    snprintf(err, errlen, "data file %s damaged: the records of block %" PRIu32 " are malformed", b->path,
             FIRST_HOME + bucket);
    return -EILSEQ;
}

/* ---- superblock */

static int sb_write(struct bosc *b, uint64_t flushed, uint64_t gen)
{
    unsigned char p[BLK];
    memset(p, 0, sizeof p);
    memcpy(p, SB_MAGIC, 8);
    uint64_t seq = ++b->sb_seq;
    put32(p + 12, 1);
    put64(p + 16, seq);
    put32(p + 24, BLK);
    put32(p + 28, b->nbuckets);
    put64(p + 32, flushed);
    put64(p + 40, gen);
    b->sb_gen = gen;
    put64(p + 48, b->k0);
    put64(p + 56, b->k1);
    put64(p + 64, atomic_load_explicit(&b->nblocks, memory_order_relaxed));
    put32(p + 8, crc32c(0, p + 12, BLK - 12));
    int rc = pwrite_all(b->fd, p, BLK, (off_t)(seq % 2) * BLK);
    if (!rc && fdatasync(b->fd))
        rc = -errno;
    add(&b->st.syncs, 1);
    return rc;
}

static int sb_read(struct bosc *b, uint64_t *flushed, uint64_t *gen, char *err, size_t errlen)
{
    unsigned char p[BLK];
    int best = -1;
    for (int slot = 0; slot < 2; slot++) {
        int rc = pread_all(b->fd, p, BLK, (off_t)slot * BLK);
        if (rc) {
            snprintf(err, errlen, "cannot read %s: %s", b->path, strerror(-rc));
            return rc;
        }
        if (memcmp(p, SB_MAGIC, 8) || crc32c(0, p + 12, BLK - 12) != get32(p + 8) || get32(p + 12) != 1 ||
            get32(p + 24) != BLK || get32(p + 28) == 0)
            continue; /* a slot cut short by a crash, or never written: the other one counts */
        uint64_t seq = get64(p + 16);
        if (best >= 0 && seq <= b->sb_seq)
            continue;
        best = slot;
        b->sb_seq = seq;
        b->nbuckets = get32(p + 28);
        *flushed = get64(p + 32);
        *gen = get64(p + 40);
        b->k0 = get64(p + 48);
        b->k1 = get64(p + 56);
        atomic_store_explicit(&b->nblocks, get64(p + 64), memory_order_relaxed);
        b->sb_gen = get64(p + 40);
    }
    if (best < 0) {
        snprintf(err, errlen, "%s: no valid superblock (not a kvstore data file, or both copies damaged)", b->path);
        return -EILSEQ;
    }
    uint64_t nb = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
    if (nb < FIRST_HOME + (uint64_t)b->nbuckets || nb > MAX_BLOCKS) {
        snprintf(err, errlen, "%s: superblock damaged: %" PRIu64 " blocks for %" PRIu32 " buckets", b->path,
                 nb, b->nbuckets);
        return -EILSEQ;
    }
    return 0;
}

/* ---- free blocks (flusher) */

/* A block for a growing chain: a free one (lowest last-freed first), or a new
 * one at the end of the file. 0 if none can be had. */
static uint32_t blk_alloc(struct bosc *b)
{
    if (b->nfree)
        return b->free_blk[--b->nfree];
    uint64_t nb = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
    if (nb >= MAX_BLOCKS)
        return 0;
    atomic_store_explicit(&b->nblocks, nb + 1, memory_order_relaxed); /* the flusher is the only writer */
    return (uint32_t)nb;
}

/* ---- the table's hooks */

static int hook_maybe_on_disk(void *arg, const void *key, size_t klen)
{
    struct bosc *b = arg;
    if (atomic_load_explicit(&b->failed, memory_order_relaxed))
        return 1; /* let the load report the damage rather than answer "absent" */
    return atomic_load_explicit(&b->nkeys[bucket_of(b, key, klen)], memory_order_relaxed) != 0;
}

static void hook_flushall(void *arg, int phase)
{
    struct bosc *b = arg;
    if (phase == KVT_FLUSH_BEGIN) {
        pthread_mutex_lock(&b->flush_lock);
        return;
    }
    if (phase == KVT_FLUSH_COMMIT) {
        /* Under gen_lock no block write is in progress: every block written from
         * now on carries the new generation, every older block reads as empty. */
        pthread_mutex_lock(&b->gen_lock);
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        for (uint32_t i = 0; i < b->nbuckets; i++)
            atomic_store_explicit(&b->nkeys[i], 0, memory_order_relaxed);
        kvt_disk_keys_set(b->t, 0);
        pthread_mutex_unlock(&b->gen_lock);
    }
    pthread_mutex_unlock(&b->flush_lock);
}

static int hook_load_sync(void *arg, const void *key, size_t klen) { return bosc_load(arg, key, klen); }
static int hook_make_room(void *arg) { return bosc_sync(arg); }

/* ---- loading a key */

struct find_arg {
    const unsigned char *key;
    uint32_t klen;
    const unsigned char *val;
    uint32_t vlen;
    int64_t expire;
    int found;
};

static void find_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key, uint32_t klen,
                     const unsigned char *val, uint32_t vlen, int64_t expire)
{
    (void)rec;
    (void)reclen;
    struct find_arg *f = arg;
    if (klen == f->klen && memcmp(key, f->key, klen) == 0) {
        f->found = 1;
        f->val = val;
        f->vlen = vlen;
        f->expire = expire;
    }
}

struct valid_arg {
    struct bosc *b;
    uint32_t bucket, ver;
    uint64_t gen;
};

static int still_valid(void *arg)
{
    struct valid_arg *v = arg;
    return atomic_load_explicit(&v->b->ver[v->bucket], memory_order_acquire) == v->ver &&
           atomic_load_explicit(&v->b->gen, memory_order_acquire) == v->gen;
}

int bosc_load(struct bosc *b, const void *key, size_t klen)
{
    if (atomic_load(&b->failed))
        return -EILSEQ;
    add(&b->st.loads, 1);
    struct valid_arg v = {b, bucket_of(b, key, klen), 0, 0};
    struct kvbuf s = {0};
    uint32_t *chain = NULL;
    size_t nchain = 0, capchain = 0;
    char err[256];
    int rc;
    for (int tries = 0;; tries++) {
        /* Seqlock read: an odd version is a chain being written; wait it out. */
        v.ver = atomic_load_explicit(&b->ver[v.bucket], memory_order_acquire);
        v.gen = atomic_load_explicit(&b->gen, memory_order_acquire);
        if (v.ver & 1) {
            sched_yield();
            continue;
        }
        if (kvt_exists(b->t, key, klen) != -ENODATA) {
            rc = 0; /* loaded already (a duplicate request) or written meanwhile */
            break;
        }
        struct find_arg f = {key, (uint32_t)klen, NULL, 0, 0, 0};
        rc = 0;
        if (atomic_load_explicit(&b->nkeys[v.bucket], memory_order_relaxed)) {
            add(&b->st.load_reads, 1);
            rc = chain_read(b, v.bucket, v.gen, &s, &chain, &nchain, &capchain, err, sizeof err);
            if (!rc && stream_walk((unsigned char *)s.p, s.len, find_rec, &f) < 0)
                rc = stream_damaged(b, v.bucket, err, sizeof err);
        }
        if (rc < 0 && !still_valid(&v) && tries < 1000)
            continue; /* read while the flusher wrote it */
        if (rc < 0) {
            fail(b, err);
            break;
        }
        rc = kvt_load(b->t, key, klen, f.val, f.vlen, f.found, f.expire, still_valid, &v);
        if (rc != -EAGAIN)
            break;
    }
    free(s.p);
    free(chain);
    return rc < 0 ? rc : 0;
}

int bosc_request_load(struct bosc *b, const void *key, size_t klen, int evfd)
{
    struct load_req *r = malloc(sizeof *r + klen);
    if (!r)
        return -ENOMEM;
    r->next = NULL;
    r->evfd = evfd;
    r->klen = (uint32_t)klen;
    memcpy(r->key, key, klen);
    pthread_mutex_lock(&b->lock);
    if (b->ltail)
        b->ltail->next = r;
    else
        b->lhead = r;
    b->ltail = r;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

static void wake(int fd)
{
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof one);
    (void)w;
}

static void wake_all(struct bosc *b)
{
    int n = atomic_load_explicit(&b->nsubs, memory_order_acquire);
    for (int i = 0; i < n; i++)
        wake(b->subs[i]);
}

static void *loader_main(void *arg)
{
    struct bosc *b = arg;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        struct load_req *r = b->lhead;
        if (!r) {
            pthread_cond_wait(&b->cond, &b->lock);
            continue;
        }
        b->lhead = r->next;
        if (!b->lhead)
            b->ltail = NULL;
        pthread_mutex_unlock(&b->lock);
        bosc_load(b, r->key, r->klen); /* a failure is kept in b->error; the request sees it */
        wake(r->evfd);
        free(r);
        pthread_mutex_lock(&b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

/* ---- the sweep */

struct rewrite {                 /* applying a block's updates to its record stream */
    struct item *it;             /* the block's items, LSN order */
    size_t n;
    struct kvbuf *out;
    uint8_t *present;            /* per item: its key was in the block */
    int64_t now;
    int changed, oom;
    int64_t dropped;             /* expired records left out */
};

static void keep_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key,
                     uint32_t klen, const unsigned char *val, uint32_t vlen, int64_t expire)
{
    (void)val;
    (void)vlen;
    struct rewrite *w = arg;
    for (size_t i = 0; i < w->n; i++) {
        uint32_t ik;
        const unsigned char *k = kvt_dnode_key(w->it[i].d, &ik);
        if (ik == klen && memcmp(k, key, klen) == 0) {
            w->present[i] = 1;
            w->changed = 1; /* replaced or deleted below */
            return;
        }
    }
    if (expire && expire <= w->now) {
        w->changed = 1;
        w->dropped++;
        return;
    }
    if (kvbuf_append(w->out, (const char *)rec, reclen))
        w->oom = 1;
}

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int bucket_cmp(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    return (x->bucket > y->bucket) - (x->bucket < y->bucket);
}

static int lsn_cmp(const void *a, const void *b)
{
    const struct item *x = a, *y = b;
    int nx = x->snap.kind == KVT_SNAP_NONE || x->snap.kind == KVT_SNAP_SKIP;
    int ny = y->snap.kind == KVT_SNAP_NONE || y->snap.kind == KVT_SNAP_SKIP;
    if (nx != ny)
        return nx - ny;
    return (x->snap.lsn > y->snap.lsn) - (x->snap.lsn < y->snap.lsn);
}

/* Write stream s as bucket's chain. Caller holds gen_lock and has made the
 * bucket's version odd. */
static int chain_write(struct bosc *b, uint32_t bucket, uint64_t gen, const struct kvbuf *s, uint32_t *chain,
                       size_t nchain)
{
    size_t need = s->len ? (s->len + PAYLOAD - 1) / PAYLOAD : 1;
    uint32_t *blocks = malloc(need * sizeof *blocks);
    if (!blocks)
        return -ENOMEM;
    uint32_t home = FIRST_HOME + bucket;
    int rc = 0;
    /* Copy on write: the chain's new overflow blocks are fresh ones, never its
     * current ones, which stay intact (and in use) until the sweep is synced. A
     * crash before the home block is written leaves the old chain whole; one
     * after it, the new chain whole (one block write is one page: all or
     * nothing for a killed process). */
    for (size_t i = 0; i < need; i++) {
        blocks[i] = i == 0 ? home : blk_alloc(b);
        if (!blocks[i]) {
            free(blocks);
            return -ENOSPC;
        }
    }
    for (size_t i = 1; i < nchain; i++)
        if (push_u32(&b->freed, &b->nfreed, &b->capfreed, chain[i]))
            rc = -ENOMEM; /* a leaked block, found again at the next open */
    unsigned char blk[BLK];
    /* Overflow blocks first, the home block last: a reader (or a crash) never
     * sees the home block point at a block not yet written. */
    for (size_t k = need; k-- > 0 && !rc;) {
        size_t off = k * PAYLOAD, n = s->len - off < PAYLOAD ? s->len - off : PAYLOAD;
        if (!s->len)
            n = 0;
        if (n)
            memcpy(blk + BHDR, s->p + off, n);
        rc = block_write(b, blk, blocks[k], k + 1 < need ? blocks[k + 1] : 0, gen, (uint32_t)n, home);
    }
    free(blocks);
    return rc;
}

struct sweep_ctx {
    uint64_t flushed_bound;      /* the file holds every change up to here (sweep) */
    struct item *items;
    size_t n, cap;
    struct kvbuf vals, stream, out;
    uint32_t *chain;
    size_t nchain, capchain;
    uint8_t *present;
    size_t cappresent;
};

/* Apply the items [0, n) of one bucket. Returns 0 or -errno (err set). */
static int sweep_bucket(struct bosc *b, struct sweep_ctx *c, struct item *it, size_t n, uint64_t gen,
                        char *err, size_t errlen)
{
    uint32_t bucket = it[0].bucket;
    c->vals.len = 0;
    size_t live = 0;
    /* Which states the log holds now (fresher than the sweep's D: a key changed
     * a moment ago is written once its group commit is done, not skipped). */
    uint64_t now_durable = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        it[i].written = 0;
        size_t off = c->vals.len;
        if (kvt_snapshot(b->t, it[i].d, now_durable, &c->vals, &it[i].snap))
            return -ENOMEM;
        it[i].voff = off;
        int kind = it[i].snap.kind;
        if (kind == KVT_SNAP_SKIP && it[i].snap.first_lsn && it[i].snap.first_lsn - 1 < c->flushed_bound)
            c->flushed_bound = it[i].snap.first_lsn - 1; /* the file lacks its changes from there */
        if (kind == KVT_SNAP_VALUE || kind == KVT_SNAP_DELETE)
            live++;
        else /* nothing to write (an absorbed insert, a FLUSHALL) or not yet: settled now */
            kvt_flushed(b->t, it[i].d, it[i].held, it[i].nheld, &it[i].snap, 0, 0, &b->q);
    }
    if (!live)
        return 0;
    qsort(it, n, sizeof *it, lsn_cmp); /* settled items last, updates in LSN order */
    int rc = chain_read(b, bucket, gen, &c->stream, &c->chain, &c->nchain, &c->capchain, err, errlen);
    if (rc)
        return rc;
    if (live > c->cappresent) {
        uint8_t *p = realloc(c->present, live);
        if (!p)
            return -ENOMEM;
        c->present = p;
        c->cappresent = live;
    }
    memset(c->present, 0, live);
    c->out.len = 0;
    struct rewrite w = {it, live, &c->out, c->present, unix_ms(), 0, 0, 0};
    int64_t before = stream_walk((unsigned char *)c->stream.p, c->stream.len, keep_rec, &w);
    if (before < 0)
        return stream_damaged(b, bucket, err, errlen);
    if (w.oom)
        return -ENOMEM;
    int64_t after = before - w.dropped;
    /* The latest state of each key wins: items are distinct keys (one node per key). */
    for (size_t i = 0; i < live; i++) {
        after -= c->present[i];
        if (it[i].snap.kind != KVT_SNAP_VALUE)
            continue;
        uint32_t klen;
        const unsigned char *key = kvt_dnode_key(it[i].d, &klen);
        unsigned char h[REC_HDR];
        put32(h, klen);
        put32(h + 4, it[i].snap.vlen);
        put64(h + 8, (uint64_t)it[i].snap.expire);
        if (kvbuf_append(&c->out, (const char *)h, REC_HDR) || kvbuf_append(&c->out, (const char *)key, klen) ||
            kvbuf_append(&c->out, c->vals.p + it[i].voff, it[i].snap.vlen))
            return -ENOMEM;
        w.changed = 1;
        after++;
    }
    int written = 1;
    pthread_mutex_lock(&b->gen_lock);
    if (atomic_load_explicit(&b->gen, memory_order_relaxed) != gen) {
        written = 0; /* FLUSHALL meanwhile: these states are gone or queued again */
    } else {
        if (w.changed) {
            /* seqlock: odd while the chain is rewritten; release so a loader that
             * sees the even value after also sees the blocks' new contents */
            atomic_fetch_add_explicit(&b->ver[bucket], 1, memory_order_acq_rel);
            uint64_t t0 = now_ns();
            rc = chain_write(b, bucket, gen, &c->out, c->chain, c->nchain);
            add(&b->st.io_ns, now_ns() - t0);
            atomic_store_explicit(&b->nkeys[bucket], (uint32_t)after, memory_order_relaxed);
            atomic_fetch_add_explicit(&b->ver[bucket], 1, memory_order_release);
        }
        /* Unchanged blocks too: the entries learn whether their key is in the block
         * (a tombstone of a key that never reached it becomes evictable). */
        if (!rc) {
            for (size_t i = 0; i < live; i++)
                kvt_written(b->t, it[i].d, &it[i].snap, c->present[i]);
            kvt_disk_keys_add(b->t, -w.dropped); /* expired records left out */
        }
    }
    pthread_mutex_unlock(&b->gen_lock);
    if (rc) {
        snprintf(err, errlen, "cannot write data file %s: %s", b->path, strerror(-rc));
        return rc;
    }
    for (size_t i = 0; i < live; i++)
        it[i].written = written;
    add(&b->st.records, live);
    return 0;
}

/* One sweep: returns 0 or -errno (the flusher then stops: err says why). */
static int sweep(struct bosc *b, struct sweep_ctx *c, char *err, size_t errlen)
{
    uint64_t t0 = now_ns();
    /* D and the generation together (no FLUSHALL between them), then the
     * barrier: every change with LSN <= D has queued its key. */
    pthread_mutex_lock(&b->flush_lock);
    uint64_t durable = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX;
    uint64_t gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    pthread_mutex_unlock(&b->flush_lock);
    kvt_barrier(b->t);
    if (b->locked_queue)
        pthread_mutex_lock(&b->qlock);
    struct ldu_node *list = ldu_reverse(ldu_take(&b->q));
    if (b->locked_queue)
        pthread_mutex_unlock(&b->qlock);
    b->sweep_no++;
    c->n = 0;
    for (struct ldu_node *n = list, *next; n; n = next) {
        next = n->next;
        struct kvt_dnode *d = kvt_dnode_of(n);
        uint32_t *mark = kvt_dnode_sweep(d);
        if (*mark < c->n && c->items[*mark].d == d && c->items[*mark].nheld < 2) {
            c->items[*mark].held[c->items[*mark].nheld++] = n; /* its other node */
            continue;
        }
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 1024;
            struct item *ni = realloc(c->items, cap * sizeof *ni);
            if (!ni) {
                snprintf(err, errlen, "out of memory in the flusher");
                return -ENOMEM;
            }
            c->items = ni;
            c->cap = cap;
        }
        uint32_t klen;
        const unsigned char *key = kvt_dnode_key(d, &klen);
        struct item *it = &c->items[c->n];
        memset(it, 0, sizeof *it);
        it->d = d;
        it->bucket = bucket_of(b, key, klen);
        it->held[0] = n;
        it->nheld = 1;
        *mark = (uint32_t)c->n++;
    }
    if (c->n > 1)
        qsort(c->items, c->n, sizeof *c->items, bucket_cmp); /* the sweep goes up the file */
    int rc = 0, any_skipped = 0;
    c->flushed_bound = durable;
    size_t i = 0;
    while (i < c->n && !rc) {
        size_t j = i;
        while (j < c->n && c->items[j].bucket == c->items[i].bucket)
            j++;
        rc = sweep_bucket(b, c, c->items + i, j - i, gen, err, errlen);
        i = j;
    }
    if (rc)
        return rc;
    if (c->n) {
        uint64_t t1 = now_ns();
        if (fdatasync(b->fd)) {
            snprintf(err, errlen, "cannot sync data file %s: %s", b->path, strerror(errno));
            return -errno;
        }
        add(&b->st.io_ns, now_ns() - t1);
        add(&b->st.syncs, 1);
    }
    /* Blocks freed by this sweep are free once the chains that dropped them are synced. */
    for (size_t k = 0; k < b->nfreed; k++)
        push_u32(&b->free_blk, &b->nfree, &b->capfree, b->freed[k]);
    b->nfreed = 0;
    uint64_t deferred = 0;
    uint64_t durable_now = b->wal ? wal_durable_lsn(b->wal) : UINT64_MAX; /* >= every state written */
    for (size_t k = 0; k < c->n; k++) {
        struct item *it = &c->items[k];
        if (it->snap.kind == KVT_SNAP_NONE || it->snap.kind == KVT_SNAP_SKIP) {
            deferred += it->snap.kind == KVT_SNAP_SKIP;
            continue; /* settled in sweep_bucket */
        }
        if (!it->written) {
            any_skipped = 1;
            deferred++;
        }
        kvt_flushed(b->t, it->d, it->held, it->nheld, &it->snap, it->written, durable_now, &b->q);
    }
    add(&b->st.deferred, deferred);
    /* The file now holds every change up to D, except those of keys whose state
     * was not durable yet (SKIP: the bound stops below the first change they
     * lack), unless a FLUSHALL made this sweep skip blocks: then the flushed LSN
     * stays where it was. */
    uint64_t flushed = atomic_load(&b->flushed_lsn);
    uint64_t bound = c->flushed_bound;
    uint64_t cur_gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    if (!any_skipped && bound != UINT64_MAX && bound > flushed && cur_gen == gen) {
        rc = sb_write(b, bound, gen);
        if (rc) {
            snprintf(err, errlen, "cannot write the superblock of %s: %s", b->path, strerror(-rc));
            return rc;
        }
        atomic_store(&b->flushed_lsn, bound);
        flushed = bound;
        if (b->log_dir[0]) {
            int n = wal_truncate(b->log_dir, flushed);
            if (n > 0)
                add(&b->st.truncated, (uint64_t)n);
        }
    } else if (cur_gen != b->sb_gen) {
        /* A FLUSHALL must reach the superblock even when the flushed LSN cannot
         * move (no log, or blocks skipped): its generation is what empties the file. */
        rc = sb_write(b, flushed, cur_gen);
        if (rc) {
            snprintf(err, errlen, "cannot write the superblock of %s: %s", b->path, strerror(-rc));
            return rc;
        }
    }
    add(&b->st.sweeps, 1);
    add(&b->st.sweep_ns, now_ns() - t0);
    return 0;
}

/* Evict clean keys down to LOW_PCT of the bound: when memory passes HIGH_PCT,
 * or at once when a writer waits for room (force: it may need more than the
 * room below HIGH_PCT). "Stuck" = a writer could wait forever: memory is full,
 * nothing could be evicted and nothing is dirty (the stalled writes then get
 * -OOM). */
static void evict(struct bosc *b, int force)
{
    uint64_t max = kvt_max_memory(b->t);
    if (!max) {
        kvt_set_spill_stuck(b->t, 0);
        return;
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
}

static void *flusher_main(void *arg)
{
    struct bosc *b = arg;
    struct sweep_ctx c = {0};
    char err[256];
    uint64_t last = now_ns();
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        uint64_t max = kvt_max_memory(b->t);
        /* (no sweep for pressure that evicting cannot relieve: that would spin) */
        int pressure = max && kvt_used_memory(b->t) * 100 > max * HIGH_PCT && !kvt_spill_stuck(b->t);
        int due = now_ns() - last >= (uint64_t)b->interval_ms * 1000000u;
        int dirty = atomic_load_explicit(&b->q.head, memory_order_relaxed) != NULL;
        int behind = b->wal && wal_durable_lsn(b->wal) > atomic_load(&b->flushed_lsn);
        if (!(b->kick || b->sync_req > b->sync_done || pressure || (due && (dirty || behind)))) {
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
        int forced = b->kick; /* a writer waits for room */
        b->kick = 0;
        pthread_mutex_unlock(&b->lock);
        /* Evict before the sweep too: the clean keys of the last sweep make room for
         * the writers while this one runs (it may take a while), not only after. */
        if (!atomic_load(&b->failed))
            evict(b, forced);
        atomic_store(&b->sweeping, 1);
        int rc = atomic_load(&b->failed) ? -EIO : sweep(b, &c, err, sizeof err);
        atomic_store(&b->sweeping, 0);
        if (rc && !atomic_load(&b->failed))
            fail(b, err);
        if (!rc)
            evict(b, forced);
        else
            kvt_set_spill_stuck(b->t, 1); /* writes get an error instead of waiting forever */
        last = now_ns();
        wake_all(b);
        pthread_mutex_lock(&b->lock);
        b->sync_done = req;
        pthread_cond_broadcast(&b->done);
        if (rc) /* a failed data file: stay idle until stopped */
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

/* ---- open, scan, close */

static int create_file(struct bosc *b, uint32_t buckets, char *err, size_t errlen)
{
    uint64_t k[2];
    if (getrandom(k, sizeof k, 0) != sizeof k) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return -errno;
    }
    b->k0 = k[0];
    b->k1 = k[1];
    b->nbuckets = buckets;
    atomic_store(&b->nblocks, FIRST_HOME + (uint64_t)buckets);
    b->sb_seq = 0;
    if (ftruncate(b->fd, (off_t)((FIRST_HOME + (uint64_t)buckets) * BLK))) { /* sparse: empty buckets cost no disk */
        snprintf(err, errlen, "cannot size %s: %s", b->path, strerror(errno));
        return -errno;
    }
    int rc = sb_write(b, 0, 1);
    if (rc) {
        snprintf(err, errlen, "cannot write %s: %s", b->path, strerror(-rc));
        return rc;
    }
    /* the file's name must survive a crash too */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", b->path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* Read every chain: per-bucket record counts and the free overflow blocks. */
static int scan(struct bosc *b, uint64_t gen, struct bosc_open_info *info, char *err, size_t errlen)
{
    uint64_t nb = atomic_load(&b->nblocks);
    uint8_t *used = calloc((nb + 7) / 8, 1);
    struct kvbuf s = {0};
    uint32_t *chain = NULL;
    size_t nchain = 0, capchain = 0;
    int rc = used ? 0 : -ENOMEM;
    int64_t total = 0;
    for (uint32_t bk = 0; bk < b->nbuckets && !rc; bk++) {
        /* Skip holes cheaply: a bucket never written is a hole in the sparse file. */
        off_t home = (off_t)(FIRST_HOME + (uint64_t)bk) * BLK;
        off_t data = lseek(b->fd, home, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break; /* nothing but holes from here on */
        if (data > home) {
            uint64_t skip = (uint64_t)(data - home) / BLK;
            if (skip) {
                bk += (uint32_t)(skip - 1 < b->nbuckets ? skip - 1 : b->nbuckets);
                continue;
            }
        }
        rc = chain_read(b, bk, gen, &s, &chain, &nchain, &capchain, err, errlen);
        if (rc)
            break;
        int64_t cnt = stream_walk((unsigned char *)s.p, s.len, NULL, NULL);
        if (cnt < 0) {
            rc = stream_damaged(b, bk, err, errlen);
            break;
        }
        atomic_store_explicit(&b->nkeys[bk], (uint32_t)cnt, memory_order_relaxed);
        total += cnt;
        for (size_t i = 1; i < nchain; i++) {
            if (used[chain[i] / 8] & (1u << (chain[i] % 8))) {
                snprintf(err, errlen, "data file %s damaged: block %" PRIu32 " is in two chains", b->path,
                         chain[i]);
                rc = -EILSEQ;
                break;
            }
            used[chain[i] / 8] |= (uint8_t)(1u << (chain[i] % 8));
            info->overflow_blocks++;
        }
    }
    for (uint64_t no = FIRST_HOME + (uint64_t)b->nbuckets; no < nb && !rc; no++)
        if (!(used[no / 8] & (1u << (no % 8))) && push_u32(&b->free_blk, &b->nfree, &b->capfree, (uint32_t)no))
            rc = -ENOMEM;
    free(used);
    free(s.p);
    free(chain);
    info->disk_keys = (uint64_t)total;
    kvt_disk_keys_set(b->t, total);
    return rc;
}

int bosc_open(struct bosc **out, struct kv_table *t, const struct bosc_config *cfg,
              struct bosc_open_info *info, char *err, size_t errlen)
{
    uint64_t t0 = now_ns();
    memset(info, 0, sizeof *info);
    struct bosc *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->t = t;
    b->fd = -1;
    snprintf(b->path, sizeof b->path, "%s", cfg->path);
    snprintf(b->log_dir, sizeof b->log_dir, "%s", cfg->log_dir ? cfg->log_dir : "");
    b->interval_ms = cfg->flush_interval_ms ? cfg->flush_interval_ms : 1000;
    pthread_mutex_init(&b->lock, NULL);
    pthread_mutex_init(&b->gen_lock, NULL);
    pthread_mutex_init(&b->flush_lock, NULL);
    pthread_mutex_init(&b->qlock, NULL);
    b->locked_queue = cfg->locked_queue;
    pthread_cond_init(&b->cond, NULL);
    pthread_cond_init(&b->done, NULL);
    ldu_queue_init(&b->q);
    int rc = 0;
    uint64_t flushed = 0, gen = 1;
    b->fd = open(cfg->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct stat st;
    if (b->fd < 0 || fstat(b->fd, &st)) {
        rc = -errno;
        snprintf(err, errlen, "cannot open data file %s: %s", cfg->path, strerror(errno));
        goto fail;
    }
    unsigned char first[2 * BLK];
    int fresh = st.st_size == 0;
    if (!fresh && st.st_size >= (off_t)sizeof first && !pread_all(b->fd, first, sizeof first, 0))
        fresh = all_zero(first, sizeof first); /* created, crashed before its superblock */
    if (fresh) {
        uint32_t buckets = cfg->buckets ? cfg->buckets : 65536;
        if (buckets > MAX_BLOCKS / 2) {
            snprintf(err, errlen, "data file buckets %" PRIu32 " out of range (1..%u)", buckets, MAX_BLOCKS / 2);
            rc = -EINVAL;
            goto fail;
        }
        rc = create_file(b, buckets, err, errlen);
    } else {
        rc = sb_read(b, &flushed, &gen, err, errlen);
        /* Chains may use blocks past the count the superblock recorded (a sweep
         * that grew the file, then a crash before the next superblock): the file
         * size says how far blocks were written. */
        uint64_t on_disk = (uint64_t)st.st_size / BLK;
        if (!rc && on_disk > MAX_BLOCKS)
            on_disk = MAX_BLOCKS;
        /* never past the end of the file either: a damaged count must not make
         * the scan walk (or allocate for) blocks that do not exist */
        if (!rc && on_disk >= FIRST_HOME + (uint64_t)b->nbuckets)
            atomic_store(&b->nblocks, on_disk);
    }
    if (rc)
        goto fail;
    b->nkeys = calloc(b->nbuckets, sizeof *b->nkeys);
    b->ver = calloc(b->nbuckets, sizeof *b->ver);
    if (!b->nkeys || !b->ver) {
        rc = -ENOMEM;
        snprintf(err, errlen, "out of memory for %" PRIu32 " buckets", b->nbuckets);
        goto fail;
    }
    atomic_store(&b->gen, gen);
    atomic_store(&b->flushed_lsn, flushed);
    rc = scan(b, gen, info, err, errlen);
    if (rc)
        goto fail;
    struct kvt_spill sp = {&b->q, b->locked_queue ? &b->qlock : NULL, hook_maybe_on_disk, hook_flushall,
                           hook_load_sync, hook_make_room, b};
    kvt_set_spill(t, &sp);
    info->flushed_lsn = flushed;
    info->generation = gen;
    info->buckets = b->nbuckets;
    info->blocks = atomic_load(&b->nblocks);
    info->seconds = (double)(now_ns() - t0) / 1e9;
    *out = b;
    return 0;
fail:
    if (b->fd >= 0)
        close(b->fd);
    free(b->nkeys);
    free(b->ver);
    free(b->free_blk);
    free(b);
    return rc;
}

void bosc_set_log(struct bosc *b, struct wal *w)
{
    b->wal = w;
}

int bosc_start(struct bosc *b)
{
    if (pthread_create(&b->flusher, NULL, flusher_main, b))
        return -EAGAIN;
    if (pthread_create(&b->loader, NULL, loader_main, b)) {
        pthread_mutex_lock(&b->lock);
        b->stop = 1;
        pthread_cond_broadcast(&b->cond);
        pthread_mutex_unlock(&b->lock);
        pthread_join(b->flusher, NULL);
        return -EAGAIN;
    }
    b->started = 1;
    return 0;
}

int bosc_subscribe(struct bosc *b, int evfd)
{
    int n = atomic_load(&b->nsubs);
    if (n >= MAX_SUBS)
        return -ENOSPC;
    b->subs[n] = evfd;
    atomic_store_explicit(&b->nsubs, n + 1, memory_order_release);
    return 0;
}

void bosc_close(struct bosc *b)
{
    if (!b)
        return;
    if (b->started) {
        pthread_mutex_lock(&b->lock);
        b->stop = 1;
        pthread_cond_broadcast(&b->cond);
        pthread_cond_broadcast(&b->done);
        pthread_mutex_unlock(&b->lock);
        pthread_join(b->flusher, NULL);
        pthread_join(b->loader, NULL);
    }
    /* Hand every queued node back to its entry (still dirty: the log has it),
     * free the orphans, then detach: the table works on without a data file. */
    struct ldu_node *list = ldu_take(&b->q);
    for (struct ldu_node *n = list, *next; n; n = next) {
        next = n->next;
        struct kvt_snap none = {.kind = KVT_SNAP_NONE};
        kvt_flushed(b->t, kvt_dnode_of(n), &n, 1, &none, 0, 0, &b->q);
    }
    for (struct ldu_node *n = ldu_take(&b->q), *next; n; n = next) { /* what those re-queued */
        next = n->next;
        ldu_release(ldu_obj_of(n), n);
    }
    struct kvt_spill none = {0};
    kvt_set_spill(b->t, &none);
    kvt_disk_keys_set(b->t, 0);
    for (struct load_req *r = b->lhead, *next; r; r = next) {
        next = r->next;
        free(r);
    }
    close(b->fd);
    free(b->nkeys);
    free(b->ver);
    free(b->free_blk);
    free(b->freed);
    pthread_mutex_destroy(&b->lock);
    pthread_mutex_destroy(&b->gen_lock);
    pthread_mutex_destroy(&b->flush_lock);
    pthread_mutex_destroy(&b->qlock);
    pthread_cond_destroy(&b->cond);
    pthread_cond_destroy(&b->done);
    free(b);
}

int bosc_failed(struct bosc *b) { return atomic_load(&b->failed); }
const char *bosc_error(struct bosc *b) { return b->error; }

void bosc_get_stats(struct bosc *b, struct bosc_stats *st)
{
    memset(st, 0, sizeof *st);
#define L(f) atomic_load_explicit(&b->st.f, memory_order_relaxed)
    st->sweeps = L(sweeps);
    st->records = L(records);
    st->blocks_read = L(blocks_read);
    st->blocks_written = L(blocks_written);
    st->bytes_written = L(bytes_written);
    st->syncs = L(syncs);
    st->sweep_ns = L(sweep_ns);
    st->io_ns = L(io_ns);
    st->deferred = L(deferred);
    st->loads = L(loads);
    st->load_reads = L(load_reads);
    st->evicted = L(evicted);
    st->evicted_bytes = L(evicted_bytes);
    st->truncated_segments = L(truncated);
#undef L
    st->flushed_lsn = atomic_load(&b->flushed_lsn);
    st->buckets = b->nbuckets;
    st->blocks = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
    st->queued = atomic_load_explicit(&b->q.pushes, memory_order_relaxed);
    struct kvt_stats ts;
    kvt_get_stats(b->t, &ts);
    st->disk_keys = ts.disk_keys;
    pthread_mutex_lock(&b->lock);
    st->failed = atomic_load(&b->failed);
    snprintf(st->error, sizeof st->error, "%s", b->error);
    pthread_mutex_unlock(&b->lock);
}

/* ---- the naive baseline */

double bosc_bench_naive(const char *path, uint32_t buckets, uint64_t n, uint32_t value_size, uint64_t seed)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)buckets * BLK)) {
        close(fd);
        return -errno;
    }
    unsigned char blk[BLK];
    uint64_t x = seed | 1;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        off_t off = (off_t)(x % buckets) * BLK;
        if (pread_all(fd, blk, BLK, off))
            break;
        size_t at = (x >> 32) % (PAYLOAD - value_size - REC_HDR);
        memset(blk + BHDR + at, (int)(i & 0xff), value_size); /* the record's new value */
        if (pwrite_all(fd, blk, BLK, off) || fdatasync(fd))
            break;
    }
    double s = (double)(now_ns() - t0) / 1e9;
    close(fd);
    return s;
}
