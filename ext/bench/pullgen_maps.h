/* pullgen_maps.h - what the pull generator's XDP programs (bench/pullgen.bpf.c) and
 * their driver (bench/pullgen.c) share: the settings, the control block and the
 * latency histogram. Included by both C compilers (the kernel's BPF target and the
 * host's), so only fixed-width types from <linux/types.h>.
 *
 * The control block is one element of a BPF array that the driver maps into its
 * memory: the generator counts in it, the driver reads it while they run and writes
 * `stop`. The generator runs on one CPU (its threads are pinned there and a program run
 * is never preempted), so it adds to its counters without atomics; the sink counts per
 * CPU.
 */
#ifndef KV_PULLGEN_MAPS_H
#define KV_PULLGEN_MAPS_H

#include <linux/types.h>

/* Bytes the generator moves the frame's start by before writing it: a frame handed
 * back to the kernel's test runner with only its length changed (the server shrinks
 * an answer in place) would otherwise be sent again at that length. */
#define PG_SLACK 4
#define PG_PULL_PAYLOAD 1472  /* a pull's UDP payload: padded to one MTU, room for any answer */
#define PG_HIST 4096          /* latency buckets of 1,024 ns; the last holds everything slower */
#define PG_ID_NO_BITS 12      /* the request id: send time (1,024 ns units) << 12 | batch number's low bits */

struct pg_settings {
    __u8 dst_mac[6], src_mac[6];
    __be32 saddr, daddr;      /* network order */
    __be16 sport, dport;
    __be16 ip_check;          /* the IPv4 header's checksum: every field is fixed */
    __u16 pad;
    __u32 streams;            /* keys key:000000000000 .. key:<streams-1> (kvstore bench's names) */
    __u32 batches;            /* batch numbers 0 .. batches-1, uniformly at random */
    __u32 window;             /* pulls in flight at most */
    __u32 ncpus;              /* CPUs whose sink counters the generator sums (<= PG_MAX_CPUS) */
    __u64 lost_after_ns;      /* no answer for this long with the window full: the pulls in flight are lost */
};

struct pg_ctl {              /* the generator's (and the driver's stop) */
    __u64 sent;
    __u64 held;               /* runs that sent nothing (window full, or stopped) */
    __u64 lost;               /* pulls written off (no answer within lost_after_ns) */
    __u64 lost_events;
    __u64 answered_seen;      /* the sinks' answers when it last summed them */
    __u64 last_seen_ns;       /* their latest answer's time then */
    __u64 stop;               /* driver: nonzero, send nothing more */
};

/* Per CPU (the sink runs where answers arrive): no line shared with the generator is
 * written per answer; the generator sums them only when its window looks full. */
struct pg_sink {
    __u64 answered;
    __u64 bad;                /* answers that are not a batch, or not the one asked */
    __u64 answer_bytes;       /* kvstore payload bytes of good answers */
    __u64 last_answer_ns;
};

#define PG_MAX_CPUS 64

#endif
