/* siphash.c - SipHash-1-3 (Aumasson and Bernstein): the table's key hash, keyed
 * per process so clients cannot pick keys that collide, and the data file's
 * placement hash, keyed per file. The process key is drawn once, on first use
 * (pthread_once). Any thread; keys come from the network (untrusted). */
#define _GNU_SOURCE
#include "core/siphash.h"

#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static uint64_t sip_k0, sip_k1;
static pthread_once_t sip_once = PTHREAD_ONCE_INIT;

static void sip_init(void)
{
    uint64_t k[2];
    if (getrandom(k, sizeof k, 0) != sizeof k) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        k[0] = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec;
        k[1] = (uint64_t)(uintptr_t)&k ^ 0xc2b2ae3d27d4eb4fULL;
    }
    sip_k0 = k[0];
    sip_k1 = k[1];
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                           \
    do {                                                                   \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);          \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                             \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                             \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);          \
    } while (0)

uint64_t kvt_hash(const void *key, size_t len)
{
    pthread_once(&sip_once, sip_init);
    return kvt_hash_keyed(key, len, sip_k0, sip_k1);
}

uint64_t kvt_hash_keyed(const void *key, size_t len, uint64_t k0, uint64_t k1)
{
    const unsigned char *in = key;
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
    uint64_t b = (uint64_t)len << 56, m;
    const unsigned char *end = in + (len & ~(size_t)7);
    for (; in != end; in += 8) {
        memcpy(&m, in, 8); /* little-endian hosts only (x86-64, arm64) */
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    switch (len & 7) {
    case 7: b |= (uint64_t)in[6] << 48; /* fall through */
    case 6: b |= (uint64_t)in[5] << 40; /* fall through */
    case 5: b |= (uint64_t)in[4] << 32; /* fall through */
    case 4: b |= (uint64_t)in[3] << 24; /* fall through */
    case 3: b |= (uint64_t)in[2] << 16; /* fall through */
    case 2: b |= (uint64_t)in[1] << 8;  /* fall through */
    case 1: b |= (uint64_t)in[0];
    }
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}
