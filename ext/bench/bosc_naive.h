/* bosc_naive.h - the naive baseline BOSC is measured against (experiments/
 * p000_bosc_sweep.py): every update reads its block, changes it in place,
 * writes it back and syncs. Benchmark code, not part of the server. */
#ifndef KV_BOSC_NAIVE_H
#define KV_BOSC_NAIVE_H

#include <stdint.h>

/* Naive baseline for the experiments: n random in-place record updates, each
 * read block, modify, write block, fdatasync, on a file of `buckets` blocks that
 * is created, written in full and synced before the clock starts, so every
 * update is an overwrite (BOSC's file is sparse at creation; the experiment's
 * preload writes all its home blocks before its clock starts). Returns the seconds the n
 * updates took, or -errno. */
double bosc_bench_naive(const char *path, uint32_t buckets, uint64_t n, uint32_t value_size, uint64_t seed);

#endif
