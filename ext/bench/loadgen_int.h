/* loadgen_int.h - the load generator's internal state, shared by loadgen.c (the
 * workers: connections, sending, the event loop, setup and results) and
 * loadgen_reply.c (parsing and checking RESP and memcache replies). Internal:
 * the interface is loadgen.h. Threads: a worker and its connections belong to
 * one thread; struct run is shared (atomics, and mu for the first failure). */
#ifndef KVSTORE_LOADGEN_INT_H
#define KVSTORE_LOADGEN_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "bench/loadgen.h"
#include "core/lathist.h"

#define MAX_VALUE    (512ull << 20)
#define MAX_KEYSPACE 1000000000000ull /* keys stay "key:" + exactly 12 digits, so templates are fixed */
#define MAX_LINE     8192             /* longest status/error/VALUE line accepted; rbuf is always larger */
#define LARGE_VALUE  (64u << 10)      /* above this, SET values go out from one shared buffer, not copies */
#define OUT_SOFT     (1u << 20)       /* stop queueing on a connection with this much unsent output */
#define IOV_BATCH    256
#define IDLE_NS      20000000ll       /* longest sleep, so *stop and failures are noticed promptly */
#define DRAIN_NS     2000000000ull    /* after the deadline, wait this long for in-flight replies */
#define STALL_NS     120000000000ull  /* nothing received for this long with requests out: server is dead
                                           (a data-file server whose writers wait for a whole sweep
                                           of gigabytes of dirty keys is silent for tens of seconds) */
#define CONNECT_MS   2000
#define SHOW(p, n)   (int)((n) > 80 ? 80 : (n)), (p)

enum { K_SET, K_GET };
enum { PS_LINE, PS_BULK, PS_CRLF, PS_END };
enum { RES_OK, RES_HIT, RES_MISS, RES_ERR, RES_ODD }; /* ODD: well-formed, but not what the command returns */

struct slot { uint64_t t, key; int kind; };         /* t: latency start (send or scheduled time) */
struct seg { const char *ext; size_t off, len; };   /* ext == NULL: bytes live in obuf at off */

struct conn {
    int fd, want_out, auth_pending, dirty;
    struct slot *ring; uint32_t rhead, rcount; /* queued + in flight, oldest first; replies come in order */
    char *obuf; size_t ocap, olen;     /* obuf is append-only until all sent: segments can hold offsets */
    struct seg *segs; size_t nseg, segcap, shead, sdone; /* shead/sdone: first unsent seg, bytes of it sent */
    char *rbuf; size_t rcap, rpos, rlen;
    int pst, bres, cmp, bad;           /* parser state; bad: current reply already counted as mismatch */
    uint64_t bleft, boff;
    char dig[12];                      /* key digits of the GET whose value is being compared */
};

struct run {
    const struct lg_config *cfg;
    uint64_t vsize, keyspace, deadline, chunk;
    uint32_t depth;
    int mc, check, large, bounded;
    char *filler;                      /* the key-independent part of every value */
    char *set_t, *get_t, *auth_t;      /* request templates; only key/value digits get patched */
    size_t set_len, set_key, set_val, get_len, get_key, auth_len;
    _Atomic uint64_t left;             /* request budget not yet handed to a worker */
    _Atomic int failed;
    pthread_mutex_t mu;                /* guards err/msg: the first failure wins */
    int err; char msg[256];
};

struct worker {
    struct run *r; pthread_t tid;
    int epfd, idx, nconn, sending, pwait2, rr;
    struct conn *conns;
    uint64_t rng, budget, inflight, t0, sched, last_rx;
    double interval;                   /* open loop: ns between this worker's scheduled sends */
    uint64_t requests, sets, gets, hits, misses, errors, bsent, brecv;
    uint64_t first_send, last_reply, lat_sum, lat_max, first_error_t;
    char first_error[128]; uint64_t hist[HIST_LEN];
};

static inline uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* splitmix64: one word of state, fast, and plenty for picking keys */
static inline uint64_t rnd(struct worker *w)
{
    uint64_t z = (w->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Lemire's multiply-high: uniform in [0, n) without a division */
static inline uint64_t below(struct worker *w, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)rnd(w) * n) >> 64);
}

static inline void fmt12(char *d, uint64_t k)
{
    for (int i = 10; i >= 0; i -= 2) {
        unsigned v = (unsigned)(k % 100);
        k /= 100, d[i] = (char)('0' + v / 10), d[i + 1] = (char)('0' + v % 10);
    }
}

/* The first failure of the run wins (message sanitized); returns err. */
__attribute__((format(printf, 3, 4)))
int lg_fail(struct run *r, int err, const char *fmt, ...);
/* The worker's first error reply or mismatch, kept for lg_result.first_error. */
__attribute__((format(printf, 2, 3)))
void lg_note_error(struct worker *w, const char *fmt, ...);
/* A reply that breaks the protocol: counted, noted and fails the run (-EPROTO). */
__attribute__((format(printf, 2, 3)))
int lg_proto_err(struct worker *w, const char *fmt, ...);

/* loadgen_reply.c: consume the complete replies in c's read buffer, matching
 * them in order to the requests in flight. Returns 0 or -errno (run failed). */
int lg_parse(struct worker *w, struct conn *c, uint64_t now);

#endif
