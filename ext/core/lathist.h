/* lathist.h - the latency histogram both load generators keep (loadgen.c over TCP,
 * udpgen.c over UDP): log-linear buckets, 128 linear sub-buckets per power of two of
 * nanoseconds (< 0.4 % error at a bucket's midpoint), up to 100 s. Header-only; a
 * histogram belongs to one thread until merged. */
#ifndef KV_LATHIST_H
#define KV_LATHIST_H

#include <stdint.h>

#define SUB_BITS     7
#define HIST_MAX_NS  100000000000ull
#define HIST_LEN     (32 << SUB_BITS) /* covers msb up to 37 > log2(100 s in ns) */

static inline unsigned hist_index(uint64_t v)
{
    if (v > HIST_MAX_NS) v = HIST_MAX_NS;
    if (v < (1u << SUB_BITS)) return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    return ((msb - SUB_BITS + 1) << SUB_BITS) + (unsigned)(v >> (msb - SUB_BITS)) - (1u << SUB_BITS);
}

/* Value at rank ceil(q * total) (HdrHistogram's rule): its bucket's midpoint, capped by the exact max; in us */
static inline double percentile(const uint64_t *h, uint64_t total, double q, uint64_t max)
{
    double want = q * (double)total, v = (double)max;
    uint64_t need = (uint64_t)want, cum = 0;
    unsigned i = 0;
    if ((double)need < want || !need) need++;
    while (i < HIST_LEN - 1 && (cum += h[i]) < need) i++;
    if (i < (1u << SUB_BITS)) {
        v = i < v ? i : v;
    } else {
        unsigned shift = (i >> SUB_BITS) - 1;
        double mid = (double)((uint64_t)((i & ((1u << SUB_BITS) - 1)) + (1u << SUB_BITS)) << shift) +
                     (double)((1ull << shift) - 1) / 2.0;
        v = mid < v ? mid : v;
    }
    return v / 1000.0;
}

#endif
