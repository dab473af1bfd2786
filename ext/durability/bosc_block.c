/* bosc_block.c - the data file's blocks: reading and checking them, writing them,
 * bucket chains of blocks (the key's home block and its overflow blocks), the
 * record stream they hold, the superblock and the free-block lists. The flusher
 * writes; the loader and the opening thread read. Parses untrusted bytes (the
 * file): every block is checked (magic, CRC) and every length and chain bounded. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
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
#include "core/ldu.h"
#include "core/table.h"
#include "durability/bosc_int.h"
#include "durability/wal.h"

/* ---- blocks */

int bosc_all_zero(const unsigned char *p, size_t n)
{
    static const unsigned char z[BHDR];
    return memcmp(p, z, BHDR) == 0 && (n <= BHDR || memcmp(p, p + 1, n - 1) == 0);
}

/* Check a block read from disk (magic: BLK_MAGIC or TAB_MAGIC). Returns 1
 * valid, 0 empty (all zeros), -EILSEQ damaged (why in err). */
int bosc_block_check(struct bosc *b, const unsigned char *p, uint64_t no, uint32_t magic, char *err, size_t errlen)
{
    if (bosc_all_zero(p, BLK))
        return 0;
    const char *why = NULL;
    if (get32(p) != magic)
        why = magic == BLK_MAGIC ? "bad magic (not a kvstore data block)" : "bad magic (not a bucket table page)";
    else if (crc32c(0, p + 8, BLK - 8) != get32(p + 4))
        why = "checksum mismatch";
    else if (get32(p + 8) != no)
        why = "block number mismatch (misplaced write)";
    else if (get32(p + 24) > PAYLOAD)
        why = "payload length out of range";
    if (!why)
        return 1;
    snprintf(err, errlen, "data file %s damaged: block %" PRIu64 " (offset %" PRIu64 "): %s", b->path, no,
             no * BLK, why);
    return -EILSEQ;
}

/* Fill in a block's header (the payload is in place) and its checksum. */
void bosc_block_seal(unsigned char *p, uint32_t magic, uint32_t no, uint32_t next, uint64_t gen, uint32_t used,
                     uint32_t home, uint64_t seq)
{
    put32(p, magic);
    put32(p + 8, no);
    put32(p + 12, next);
    put64(p + 16, gen);
    put32(p + 24, used);
    put32(p + 28, home);
    put64(p + 32, seq);
    if (used < PAYLOAD)
        memset(p + BHDR + used, 0, PAYLOAD - used);
    put32(p + 4, crc32c(0, p + 8, BLK - 8));
}

/* Write block no of a chain whose home copies start at home, stamped with the
 * sweep being written (b->wseq). Flusher only. */
int bosc_block_write(struct bosc *b, unsigned char *p, uint32_t no, uint32_t next, uint64_t gen,
                uint32_t used, uint32_t home)
{
    bosc_block_seal(p, BLK_MAGIC, no, next, gen, used, home, b->wseq);
    return bosc_block_put(b, p, no);
}

/* Write sealed block p as block no (one system call; the torn-write fault hook
 * applies to home blocks). Flusher only. Returns 0 or -errno. */
int bosc_block_put(struct bosc *b, const unsigned char *p, uint32_t no)
{
    add(&b->st.blocks_written, 1);
    add(&b->st.bytes_written, BLK);
    add(&b->st.write_calls, 1);
    if (b->tear_at && no < b->first_over && ++b->home_writes == b->tear_at) {
        pwrite_all(b->fd, p, BLK / 2, (off_t)no * BLK); /* the fault hook (bosc_int.h): a torn write */
        kill(getpid(), SIGKILL);
    }
    return pwrite_all(b->fd, p, BLK, (off_t)no * BLK);
}

/* Append x to a growable array. Returns 0 or -ENOMEM. */
int bosc_push_u32(uint32_t **v, size_t *n, size_t *cap, uint32_t x)
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

/* Read bucket's two home copies into two (2 * BLK bytes) and pick the one
 * holding the latest write: the valid copy with the higher sequence (the other
 * is the older write, or a write torn by a crash before its sweep was synced).
 * The pick must be at least as new as the sweep the bucket table records for
 * the bucket: an older pick means the newest copy was zeroed, damaged or
 * replaced by an older one, and the keys it held are lost. Returns the copy
 * (0, 1), 2 for an empty bucket (both copies never written), or -errno
 * (-EILSEQ with err saying which blocks and what is lost). */
static int home_pick(struct bosc *b, const struct bosc_rwin *w, uint32_t bucket, unsigned char *two,
                     uint64_t *seq, int *lost, char *err, size_t errlen)
{
    uint64_t h = home_of(b, bucket);
    if (w && h >= w->first && h + 2 <= w->first + w->n) {
        memcpy(two, w->buf + (h - w->first) * BLK, 2 * BLK); /* (counted when the window was read) */
    } else {
        uint64_t t0 = w ? now_ns() : 0; /* (a sweep's read: its I/O time) */
        int rc = pread_all(b->fd, two, 2 * BLK, (off_t)(h * BLK));
        if (w)
            add(&b->st.io_ns, now_ns() - t0);
        if (rc) {
            snprintf(err, errlen, "cannot read %s block %" PRIu64 ": %s", b->path, h, strerror(-rc));
            return rc;
        }
        add(&b->st.blocks_read, 2);
        add(&b->st.bytes_read, 2 * BLK);
        add(&b->st.read_calls, 1);
    }
    char why[2][256];
    int v[2], best = -1;
    for (int c = 0; c < 2; c++) {
        unsigned char *p = two + c * BLK;
        v[c] = bosc_block_check(b, p, h + (uint64_t)c, BLK_MAGIC, why[c], sizeof why[c]);
        if (v[c] == 1 && get32(p + 28) != h) {
            snprintf(why[c], sizeof why[c], "data file %s damaged: block %" PRIu64 " belongs to block %" PRIu32
                     ", found as a home copy of bucket %" PRIu32, b->path, h + (uint64_t)c, get32(p + 28), bucket);
            v[c] = -EILSEQ;
        }
        if (v[c] == 1 && (best < 0 || get64(p + 32) > get64(two + best * BLK + 32)))
            best = c;
    }
    if (v[0] == 1 && v[1] == 1 && get64(two + 32) == get64(two + BLK + 32)) {
        /* Each sweep has its own number and writes one copy: two copies of one
         * sweep mean the file cannot say which is newer. */
        snprintf(err, errlen, "data file %s damaged: both home copies of bucket %" PRIu32 " (blocks %" PRIu64
                 " and %" PRIu64 ") hold sweep %" PRIu64, b->path, bucket, h, h + 1, get64(two + 32));
        return -EILSEQ;
    }
    *seq = best >= 0 ? get64(two + best * BLK + 32) : 0;
    uint64_t want = atomic_load_explicit(&b->tab[bucket], memory_order_relaxed);
    int bad = v[0] < 0 ? 0 : v[1] < 0 ? 1 : -1;
    if (best < 0 && bad >= 0) {
        snprintf(err, errlen, "%s", why[bad]);
        return -EILSEQ;
    }
    if (*seq < want) {
        char found[96];
        if (best < 0)
            snprintf(found, sizeof found, "both copies are empty (zeroed)");
        else
            snprintf(found, sizeof found, "its newest copy (block %" PRIu64 ") holds sweep %" PRIu64,
                     h + (uint64_t)best, *seq);
        snprintf(err, errlen, "%s%sdata file %s damaged: bucket %" PRIu32 " (home blocks %" PRIu64 " and %" PRIu64
                 "): the bucket table records its write of sweep %" PRIu64 " but %s: a block was zeroed, damaged "
                 "or replaced by an older copy, so what sweeps %" PRIu64 "..%" PRIu64 " wrote to this bucket is lost",
                 bad >= 0 ? why[bad] : "", bad >= 0 ? "; " : "", b->path, bucket, h, h + 1, want, found,
                 *seq + 1, want);
        *lost = 1;
        return -EILSEQ;
    }
    return best >= 0 ? best : 2;
}

/* Read bucket's chain: its record stream into s (reset first) and its block
 * numbers into chain (the home copy first). Blocks of another generation hold
 * nothing (their overflow blocks are still listed, to be reused or freed). Every
 * block of a chain carries the sequence of the sweep that wrote it: an overflow
 * block from another sweep is an old copy. pick (may be NULL) gets the chain's
 * sequence and home copy. Returns 0 or -errno (-EILSEQ with err set). */
int bosc_chain_read(struct bosc *b, uint32_t bucket, uint64_t gen, struct kvbuf *s, uint32_t **chain,
               size_t *nchain, size_t *capchain, struct chain_pick *pick, char *err, size_t errlen)
{
    return bosc_chain_read_w(b, NULL, NULL, bucket, gen, s, chain, nchain, capchain, pick, err, errlen);
}

static int chain_walk(struct bosc *b, struct bosc_rwin *ov, uint64_t home, uint32_t no, unsigned char *blk,
                      uint64_t seq, uint64_t gen, struct kvbuf *s, uint32_t **chain, size_t *nchain,
                      size_t *capchain, struct chain_pick *pick, char *err, size_t errlen);

/* The same, the home copies taken from w when it holds them (the sweep's read
 * window, bosc_io.c; NULL: read them), overflow blocks through ov (NULL: one
 * read each; else a missed block is read with the OV_BLOCKS - 1 after it). The
 * windows hold blocks read in this sweep: the sweep writes only new blocks and
 * home copies, so a block a chain on disk uses is not written meanwhile. */
int bosc_chain_read_w(struct bosc *b, const struct bosc_rwin *w, struct bosc_rwin *ov, uint32_t bucket, uint64_t gen, struct kvbuf *s,
                      uint32_t **chain, size_t *nchain, size_t *capchain, struct chain_pick *pick, char *err,
                      size_t errlen)
{
    unsigned char two[2 * BLK], blk[BLK];
    uint64_t home = home_of(b, bucket), seq = 0;
    struct chain_pick none;
    if (!pick)
        pick = &none;
    *pick = (struct chain_pick){0};
    s->len = 0;
    *nchain = 0;
    int c = home_pick(b, w, bucket, two, &seq, &pick->lost, err, errlen);
    if (c < 0)
        return c;
    pick->seq = seq;
    pick->slot = c == 2 ? 0 : c;
    if (c == 2)
        return 0; /* an empty bucket */
    memcpy(blk, two + c * BLK, BLK);
    return chain_walk(b, ov, home, (uint32_t)(home + (uint64_t)c), blk, seq, gen, s, chain, nchain, capchain, pick,
                      err, errlen);
}

/* Open only (bosc_open.c's scan): bucket's chain through the home copy other
 * than bad, the newest, which the bucket table never recorded and whose chain
 * failed the checks (a power cut kept that home copy but not every overflow
 * block its sweep wrote before it: no sync between them). The other copy is
 * used if it is valid, or empty, and at least as new as the table records for
 * the bucket. Returns 0 with pick set, or -errno (-EILSEQ with err set). */
int bosc_chain_read_other(struct bosc *b, uint32_t bucket, uint64_t gen, int bad, struct kvbuf *s, uint32_t **chain,
                          size_t *nchain, size_t *capchain, struct chain_pick *pick, char *err, size_t errlen)
{
    unsigned char blk[BLK];
    uint64_t home = home_of(b, bucket);
    int c = !bad;
    *pick = (struct chain_pick){0};
    s->len = 0;
    *nchain = 0;
    int rc = pread_all(b->fd, blk, BLK, (off_t)((home + (uint64_t)c) * BLK));
    if (rc) {
        snprintf(err, errlen, "cannot read %s block %" PRIu64 ": %s", b->path, home + (uint64_t)c, strerror(-rc));
        return rc;
    }
    add(&b->st.blocks_read, 1);
    add(&b->st.bytes_read, BLK);
    add(&b->st.read_calls, 1);
    int v = bosc_block_check(b, blk, home + (uint64_t)c, BLK_MAGIC, err, errlen);
    if (v < 0)
        return v;
    if (v && get32(blk + 28) != home) {
        snprintf(err, errlen, "data file %s damaged: block %" PRIu64 " belongs to block %" PRIu32
                 ", found as a home copy of bucket %" PRIu32, b->path, home + (uint64_t)c, get32(blk + 28), bucket);
        return -EILSEQ;
    }
    uint64_t seq = v ? get64(blk + 32) : 0;
    uint64_t want = atomic_load_explicit(&b->tab[bucket], memory_order_relaxed);
    if (seq < want) {
        snprintf(err, errlen, "data file %s damaged: bucket %" PRIu32 "'s older home copy (block %" PRIu64
                 ") holds sweep %" PRIu64 ", the bucket table records sweep %" PRIu64, b->path, bucket,
                 home + (uint64_t)c, seq, want);
        pick->lost = 1;
        return -EILSEQ;
    }
    pick->seq = seq;
    pick->slot = c;
    if (!v)
        return 0; /* empty: a bucket the table never recorded */
    return chain_walk(b, NULL, home, (uint32_t)(home + (uint64_t)c), blk, seq, gen, s, chain, nchain, capchain, pick,
                      err, errlen);
}

/* The chain whose home copy (block no, of the bucket whose first home block is
 * home, written by sweep seq) is in blk: its records into s and its blocks into
 * chain, each overflow block checked. blk is reused for them. */
static int chain_walk(struct bosc *b, struct bosc_rwin *ov, uint64_t home, uint32_t no, unsigned char *blk,
                      uint64_t seq, uint64_t gen, struct kvbuf *s, uint32_t **chain, size_t *nchain,
                      size_t *capchain, struct chain_pick *pick, char *err, size_t errlen)
{
    int stale = get64(blk + 16) != gen;
    for (uint64_t steps = 0;; steps++) {
        if (bosc_push_u32(chain, nchain, capchain, no))
            return -ENOMEM;
        if (!stale && kvbuf_append(s, (const char *)blk + BHDR, get32(blk + 24)))
            return -ENOMEM;
        no = get32(blk + 12);
        if (!no)
            return 0;
        uint64_t nb = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
        if (steps > nb || no >= nb || no < b->first_over) {
            snprintf(err, errlen, "data file %s damaged: chain of block %" PRIu64 " leads to block %" PRIu32
                     " (out of range or a loop)", b->path, home, no);
            return -EILSEQ;
        }
        int rc = 0;
        uint64_t t0 = ov ? now_ns() : 0; /* (a sweep's read: its I/O time) */
        if (ov && !(no >= ov->first && no < ov->first + ov->n)) {
            /* how far to read ahead: by how much of the last read was used */
            if (!ov->ahead || (ov->n && ov->used * 2 < ov->n))
                ov->ahead = ov->ahead > 1 ? ov->ahead / 2 : 1;
            else if (ov->n)
                ov->ahead = ov->ahead * 2 > OV_BLOCKS ? OV_BLOCKS : ov->ahead * 2;
            rc = bosc_rwin_fill(b, ov, no, nb - no < ov->ahead ? nb - no : ov->ahead);
            ov->used = 0;
        }
        if (ov)
            ov->used++;
        if (!rc && ov) {
            memcpy(blk, ov->buf + (no - ov->first) * BLK, BLK);
        } else if (!rc) {
            rc = pread_all(b->fd, blk, BLK, (off_t)no * BLK);
            add(&b->st.blocks_read, 1);
            add(&b->st.bytes_read, BLK);
            add(&b->st.read_calls, 1);
        }
        if (ov)
            add(&b->st.io_ns, now_ns() - t0);
        if (rc) {
            snprintf(err, errlen, "cannot read %s block %" PRIu32 ": %s", b->path, no, strerror(-rc));
            return rc;
        }
        rc = bosc_block_check(b, blk, no, BLK_MAGIC, err, errlen);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            snprintf(err, errlen, "data file %s damaged: overflow block %" PRIu32 " of block %" PRIu64
                     " is empty (zeroed)", b->path, no, home);
            return -EILSEQ;
        }
        if (get32(blk + 28) != home) {
            snprintf(err, errlen, "data file %s damaged: block %" PRIu32 " belongs to block %" PRIu32
                     ", found in the chain of block %" PRIu64, b->path, no, get32(blk + 28), home);
            return -EILSEQ;
        }
        if (get64(blk + 32) != seq) {
            snprintf(err, errlen, "data file %s damaged: overflow block %" PRIu32 " holds sweep %" PRIu64 ", its "
                     "chain (home block %" PRIu64 ") sweep %" PRIu64 ": an older copy of the block; the records "
                     "it held are lost", b->path, no, get64(blk + 32), home, seq);
            pick->lost = 1;
            return -EILSEQ;
        }
    }
}

/* Walk a record stream. Returns the number of records, or -EILSEQ if it is
 * malformed (a length out of range or past the stream, an unknown type). fn
 * (may be NULL) sees each record. The type sits in klen's top bits (bosc.h), so
 * files written before types existed read as strings. */
int64_t bosc_stream_walk(const unsigned char *p, size_t n, rec_fn fn, void *arg)
{
    size_t off = 0;
    int64_t cnt = 0;
    while (off < n) {
        if (n - off < REC_HDR)
            return -EILSEQ;
        uint32_t kw = get32(p + off), vlen = get32(p + off + 4);
        uint32_t klen = kw & REC_KLEN_MASK, type = kw >> REC_TYPE_SHIFT;
        if (klen > MAX_REC || vlen > MAX_REC || (uint64_t)klen + vlen > n - off - REC_HDR || type > KVT_STREAM)
            return -EILSEQ;
        if (fn)
            fn(arg, p + off, REC_HDR + (size_t)klen + vlen, p + off + REC_HDR, klen, p + off + REC_HDR + klen,
               vlen, (int64_t)get64(p + off + 8), (int)type);
        off += REC_HDR + (size_t)klen + vlen;
        cnt++;
    }
    return cnt;
}

int bosc_stream_damaged(struct bosc *b, uint32_t bucket, char *err, size_t errlen)
{
    snprintf(err, errlen, "data file %s damaged: the records of block %" PRIu64 " are malformed", b->path,
             home_of(b, bucket));
    return -EILSEQ;
}

/* ---- superblock */

int bosc_sb_write(struct bosc *b, uint64_t flushed, uint64_t gen)
{
    unsigned char p[BLK];
    memset(p, 0, sizeof p);
    memcpy(p, SB_MAGIC, 8);
    uint64_t seq = ++b->sb_seq;
    put32(p + 12, BOSC_VERSION);
    put64(p + 16, seq);
    put32(p + 24, BLK);
    put32(p + 28, b->nbuckets);
    put64(p + 32, flushed);
    put64(p + 40, gen);
    uint64_t old_gen = b->sb_gen;
    b->sb_gen = gen;
    put64(p + 48, b->k0);
    put64(p + 56, b->k1);
    put64(p + 64, atomic_load_explicit(&b->nblocks, memory_order_relaxed));
    put64(p + 72, b->done_seq);
    put32(p + 8, crc32c(0, p + 12, BLK - 12));
    int rc = pwrite_all(b->fd, p, BLK, (off_t)(seq % 2) * BLK);
    if (!rc && fdatasync(b->fd))
        rc = -errno;
    add(&b->st.syncs, 1);
    if (rc) {
        /* The slot just written may be torn: the retry writes the same slot
         * again, never the other one, which holds the last good superblock. */
        b->sb_seq--;
        b->sb_gen = old_gen;
    }
    return rc;
}

int bosc_sb_read(struct bosc *b, uint64_t *flushed, uint64_t *gen, char *err, size_t errlen)
{
    unsigned char p[BLK];
    int best = -1, old = 0;
    for (int slot = 0; slot < 2; slot++) {
        int rc = pread_all(b->fd, p, BLK, (off_t)slot * BLK);
        if (rc) {
            snprintf(err, errlen, "cannot read %s: %s", b->path, strerror(-rc));
            return rc;
        }
        if (!memcmp(p, SB_MAGIC, 8) && crc32c(0, p + 12, BLK - 12) == get32(p + 8) && get32(p + 12) != BOSC_VERSION)
            old = (int)get32(p + 12);
        if (memcmp(p, SB_MAGIC, 8) || crc32c(0, p + 12, BLK - 12) != get32(p + 8) || get32(p + 12) != BOSC_VERSION ||
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
        b->done_seq = get64(p + 72);
    }
    if (best < 0 && old) {
        snprintf(err, errlen, "%s: data file format version %d, this kvstore reads version %d (every block "
                 "carries its write sequence, checked against a bucket table, and two copies of each home block "
                 "survive a torn write): read it with the kvstore that wrote it, or rebuild this node from its "
                 "peer (move the data directory away, start with --from-peer)", b->path, old, BOSC_VERSION);
        return -EPROTO;
    }
    if (best < 0) {
        snprintf(err, errlen, "%s: no valid superblock (not a kvstore data file, or both copies damaged)", b->path);
        return -EILSEQ;
    }
    int rc = bosc_layout(b, err, errlen);
    if (rc)
        return rc;
    uint64_t nb = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
    if (nb < b->first_over || nb > MAX_BLOCKS) {
        snprintf(err, errlen, "%s: superblock damaged: %" PRIu64 " blocks for %" PRIu32 " buckets", b->path,
                 nb, b->nbuckets);
        return -EILSEQ;
    }
    return 0;
}

/* ---- free blocks (flusher) */

/* A block for a growing chain: a free one (lowest last-freed first), or a new
 * one at the end of the file. 0 if none can be had. */
uint32_t bosc_blk_alloc(struct bosc *b)
{
    if (b->nfree)
        return b->free_blk[--b->nfree];
    uint64_t nb = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
    if (nb >= MAX_BLOCKS)
        return 0;
    atomic_store_explicit(&b->nblocks, nb + 1, memory_order_relaxed); /* the flusher is the only writer */
    return (uint32_t)nb;
}
