/* bosc_naive.c - the naive baseline for BOSC's data file: random in-place record
 * updates, each a block read, modify, write and fdatasync, on BOSC's block layout
 * (durability/bosc_int.h). One thread; the file is its own. Benchmark only. */
#define _GNU_SOURCE
#include "bench/bosc_naive.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "durability/bosc_int.h"

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
