/* bosc_naive.c - the naive baseline for BOSC's data file: random in-place record
 * updates, each a block read, modify, write and fdatasync, on BOSC's block layout
 * (durability/bosc_int.h). The file is written in full and synced before the
 * clock starts, so every update overwrites allocated blocks: no block allocation
 * or extent change (a journal commit on most filesystems) is charged to the
 * baseline. BOSC's own file is created sparse (bosc_open.c); it is on equal terms
 * in the experiment because p000_bosc_sweep preloads its keys (200 K into 16,384
 * buckets by default), which writes every home block before its clock starts.
 * One thread; the file is its own. Benchmark only. */
#define _GNU_SOURCE
#include "bench/bosc_naive.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "durability/bosc_int.h"

/* Write [0, size) of fd with zeros in 1 MiB pieces and fdatasync: real blocks, not a
 * sparse file (ftruncate) or unwritten extents (fallocate), whose first write would
 * allocate or convert. Returns 0 or -errno. */
static int preallocate(int fd, off_t size)
{
    enum { CHUNK = 1 << 20 };
    unsigned char *zero = calloc(1, CHUNK);
    if (!zero)
        return -ENOMEM;
    int rc = 0;
    for (off_t off = 0; off < size && !rc; off += CHUNK) {
        size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
        rc = pwrite_all(fd, zero, n, off);
    }
    free(zero);
    if (!rc && fdatasync(fd))
        rc = -errno;
    return rc;
}

double bosc_bench_naive(const char *path, uint32_t buckets, uint64_t n, uint32_t value_size, uint64_t seed)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = preallocate(fd, (off_t)buckets * BLK);
    if (rc) {
        close(fd);
        return rc;
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
