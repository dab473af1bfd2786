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

/* Check a block read from disk. Returns 1 valid, 0 empty (all zeros), -EILSEQ
 * damaged (why in err). */
static int block_check(struct bosc *b, const unsigned char *p, uint32_t no, char *err, size_t errlen)
{
    if (bosc_all_zero(p, BLK))
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

int bosc_block_write(struct bosc *b, unsigned char *p, uint32_t no, uint32_t next, uint64_t gen,
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
    if (b->tear_at && no == home && ++b->home_writes == b->tear_at) {
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

/* Read bucket's chain: its record stream into s (reset first) and its block
 * numbers into chain (home first). Blocks of another generation hold nothing
 * (their overflow blocks are still listed, to be reused or freed). Returns
 * 0 or -errno (-EILSEQ with err set). */
int bosc_chain_read(struct bosc *b, uint32_t bucket, uint64_t gen, struct kvbuf *s, uint32_t **chain,
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
        if (bosc_push_u32(chain, nchain, capchain, no))
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
        if (klen > MAX_REC || vlen > MAX_REC || (uint64_t)klen + vlen > n - off - REC_HDR || type > KVT_HASH)
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
    snprintf(err, errlen, "data file %s damaged: the records of block %" PRIu32 " are malformed", b->path,
             FIRST_HOME + bucket);
    return -EILSEQ;
}

/* ---- superblock */

int bosc_sb_write(struct bosc *b, uint64_t flushed, uint64_t gen)
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

int bosc_sb_read(struct bosc *b, uint64_t *flushed, uint64_t *gen, char *err, size_t errlen)
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
