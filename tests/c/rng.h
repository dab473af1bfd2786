/* rng.h - the C tests' deterministic PRNG (xorshift64*), seeded per thread (or per
 * stream) from one seed, so a failure is reproduced by its seed. Header-only. */
#ifndef KV_TESTS_RNG_H
#define KV_TESTS_RNG_H

#include <stdint.h>

struct rng {
    uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

static inline uint64_t rng_below(struct rng *r, uint64_t n) { return rng_next(r) % n; }

/* Stream `stream` of seed `seed`: threads get independent, reproducible sequences. */
static inline void rng_seed(struct rng *r, uint64_t seed, uint64_t stream)
{
    r->s = (seed + 1) * 0x9E3779B97F4A7C15ULL ^ (stream + 1) * 0xD1B54A32D192ED03ULL;
    if (!r->s)
        r->s = 1;
    for (int i = 0; i < 8; i++)
        rng_next(r);
}

#endif
