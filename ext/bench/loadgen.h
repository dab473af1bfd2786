/* loadgen.h - closed/open-loop load generator for kvstore (RESP2) and memcached text servers.
 * Called from Python through cffi: lg_run blocks the calling thread (cffi drops the GIL), never prints,
 * never exits and never calls back. Build: gcc -std=gnu11 -O2 -pthread; link with -pthread (no libm).
 * SET values are a function of the key and value_size only (not of seed), so a GET run with check=1
 * verifies the data any earlier SET run with the same value_size wrote. */
#ifndef KVSTORE_LOADGEN_H
#define KVSTORE_LOADGEN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum lg_proto { LG_PROTO_RESP = 0, LG_PROTO_MEMCACHE = 1 };

struct lg_config {
    const char *host;        /* IPv4 dotted address, e.g. "127.0.0.1" */
    int port;                /* 1..65535 */
    int threads;             /* client threads, each with its own epoll */
    int conns;               /* total connections, spread evenly over threads (>= threads) */
    int pipeline;            /* requests in flight per connection, 1..100000 */
    int value_size;          /* bytes per SET value, 1..512 MiB */
    uint64_t keyspace;       /* keys are "key:%012llu" with a number in [0, keyspace) chosen uniformly at
                                random; 1..10^12 so every key is exactly 16 bytes */
    int set_ratio, get_ratio;/* e.g. 1:0 = only SET, 0:1 only GET, 1:9 ...; >= 0, not both 0 */
    uint64_t requests;       /* stop after this many replies in total (0 = no bound); exact across threads */
    double duration;         /* stop after this many seconds (0 = no bound); at least one of requests/duration
                                must be > 0. At the deadline sending stops and in-flight replies are awaited
                                for up to 2 s */
    double rate;             /* 0 = closed loop; >0 = open loop at this many requests/s in total, latency
                                measured from each request's SCHEDULED send time (no coordinated omission) */
    int proto;               /* enum lg_proto: RESP (SET/GET multibulk) or memcached text protocol (set/get) */
    int check;               /* 1 = verify every reply: SET -> +OK / STORED; GET -> bulk of value_size bytes or
                                nil / VALUE..END with the exact bytes the value function gives for that key
                                (and, for memcached, the right key); mismatches counted in errors */
    const char *password;    /* RESP only: send AUTH first on each connection if non-NULL; a failed AUTH fails
                                the run with -EACCES. Ignored for LG_PROTO_MEMCACHE */
    int xadd;                /* RESP only, writes only (ratio N:0): each write is "XADD key * v VALUE" (a
                                stream per key) and its reply the new entry's ID (check: a bulk, not an error) */
    int batch;               /* UDP (ug_run) with xadd: messages per datagram, 1..1024 (a KVU_F_XADD frame,
                                frontend/udpfront.h: k entries "v" VALUE with consecutive IDs, one reply
                                [first ID, k]); sets then counts messages, requests datagrams */
    uint64_t pull_batches;   /* UDP (ug_run): > 0 makes every request a pull (KVU_F_PULL) of a batch number
                                in [0, pull_batches) of stream "key:..." (padded to a 1,472-byte payload, room
                                for the answer: the pull cache answers in place); hits: a batch came back
                                (check: its number and entry encoding are right), misses: none there */
    uint64_t seed;           /* key/op choice; thread i uses a stream derived from seed and i */
    volatile int *stop;      /* optional: when *stop becomes nonzero, finish promptly (within ~20 ms) and
                                return what was measured; in-flight replies are abandoned */
};

struct lg_result {
    uint64_t requests, sets, gets, hits, misses, errors;  /* errors = error replies + check mismatches
                                                             (+ protocol errors, which also fail the run) */
    uint64_t bytes_sent, bytes_received;                  /* socket payload bytes, incl. AUTH */
    double elapsed;          /* seconds from first send to last reply */
    double throughput;       /* replies per second */
    double lat_mean_us, lat_p50_us, lat_p90_us, lat_p99_us, lat_p999_us, lat_max_us;
                             /* mean and max exact; percentiles from a log-linear histogram (<0.4% error,
                                values above 100 s clamp to 100 s) */
    char first_error[128];   /* text of the first error reply or mismatch seen, "" if none */
    char error[256];         /* set when lg_run fails */
};

/* Runs one load test. Returns 0 on success, -errno on failure with out->error set: -EINVAL bad config,
 * connect errors as "connect to HOST:PORT: ..." (2 s limit), -EPROTO malformed reply, -EACCES AUTH
 * refused, -ECONNRESET server closed, -ETIMEDOUT no reply for 120 s, -ENOMEM. On a failure after the
 * load started, the counters in *out still hold what was measured. Safe to call concurrently. */
int lg_run(const struct lg_config *cfg, struct lg_result *out);

#ifdef __cplusplus
}
#endif

#endif
