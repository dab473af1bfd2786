/* clock.h - the coarse monotonic clock in milliseconds that connection bookkeeping
 * uses (idle times, handshake limits, CLIENT LIST ages): CLOCK_MONOTONIC_COARSE,
 * read through the vDSO (no system call), at the kernel tick's resolution (1-4 ms),
 * which is plenty for timeouts measured in seconds. Header-only. */
#ifndef KV_CLOCK_H
#define KV_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t kv_coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* CLOCK_MONOTONIC at full resolution (vDSO too): in ns (the block device's busy
 * poll windows) and in ms (timeouts of blocking reads, which may be a few ms). */
static inline uint64_t kv_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int64_t kv_mono_ms(void) { return (int64_t)(kv_mono_ns() / 1000000); }

#endif
