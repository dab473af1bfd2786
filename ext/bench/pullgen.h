/* pullgen.h - the pull experiment's load generator: UDP pulls of stream batches written
 * and sent by an XDP program on this side's end of a veth pair (the kernel's test runner
 * in live-frame mode, bench/pullgen.bpf.c), answers taken and checked by a second XDP
 * program on the same interface before the network stack. Neither side of the load goes
 * through a socket, so a pull costs this side little against what the server spends on
 * it: the rates compare the server's paths, not the generator's.
 *
 * Needs root (CAP_BPF, CAP_NET_ADMIN), a kernel with live-frame test runs (5.18) and an
 * interface whose far end runs XDP (a veth delivers XDP_TX frames only to a peer whose
 * receive side has a program; the pull cache, the bounce or `pass`). Called from Python
 * through cffi like the other generators: blocks, never prints, never exits. */
#ifndef KVSTORE_PULLGEN_H
#define KVSTORE_PULLGEN_H

#include <stdint.h>

struct pg_config {
    const char *ifname;     /* this side's end of the veth pair; the sink attaches here */
    const char *dst_mac;    /* the far end's MAC address, aa:bb:cc:dd:ee:ff */
    const char *src_addr;   /* IPv4 of ifname */
    const char *dst_addr;   /* the server's IPv4 */
    int dst_port;           /* the server's UDP port */
    int src_port;           /* 0: 40000 */
    uint32_t streams;       /* keys key:000000000000 .. (1..1,000,000) */
    uint32_t batches;       /* batch numbers 0 .. batches-1, uniformly at random (>= 1) */
    uint32_t window;        /* pulls in flight at most (1..65536) */
    double warmup;          /* seconds sent before the measurement starts */
    double duration;        /* measured seconds (> 0) */
    int cpu;                /* the generator's CPU (its threads are pinned there); -1: the caller's */
    uint32_t lost_ms;       /* no answer for this long with the window full: the pulls in flight are lost (0: 200) */
    volatile int *stop;     /* set nonzero: end the measurement now, with what it has (may be NULL) */
};

struct pg_result {
    uint64_t sent;          /* pulls sent in the measured interval */
    uint64_t answered;      /* answers taken in it */
    uint64_t bad;           /* of them, not a batch or not the one asked for */
    uint64_t lost;          /* pulls written off (whole run) */
    uint64_t answer_bytes;  /* kvstore payload of the good answers */
    double elapsed;         /* the measured interval, seconds */
    double throughput;      /* answers per second */
    double lat_p50_us, lat_p99_us, lat_p999_us; /* send to answer, in the measured interval */
    int native;             /* the sink runs as native XDP */
    char error[256];
};

/* Run one load. Returns 0, or -errno with out->error set (-EINVAL a bad setting,
 * -ENOTSUP a build without libbpf or a kernel that cannot do it, -EPERM not root). */
int pg_run(const struct pg_config *cfg, struct pg_result *out);

#endif
