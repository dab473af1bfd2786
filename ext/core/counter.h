/* counter.h - statistics counters with one writer and any number of readers:
 * the writer adds with a relaxed load + store (no locked read-modify-write on the
 * hot path), readers load relaxed and may see a value a moment old. Header-only. */
#ifndef KV_COUNTER_H
#define KV_COUNTER_H

#include <stdatomic.h>
#include <stdint.h>

static inline void st_inc(_Atomic uint64_t *c, uint64_t d)
{
    /* single writer: a relaxed load+store is enough and avoids a locked RMW */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d, memory_order_relaxed);
}

static inline uint64_t st_get(_Atomic uint64_t *c) { return atomic_load_explicit(c, memory_order_relaxed); }

#endif
