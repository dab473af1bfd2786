/* pullgen.bpf.c - the pull experiment's load generator, in XDP (bench/pullgen.c drives it).
 *
 * pull_gen is run by the kernel's test runner in live-frame mode on this side's end of a
 * veth pair: each run writes one pull (kvstore's UDP framing, padded to one MTU so the
 * pull cache can answer in place) into a frame and sends it with XDP_TX to the other end,
 * where the server runs. No socket, no network stack on this side: the generator costs a
 * small part of what the server's answer costs, so the server's paths (the pull cache's
 * hits, the engine's answers) are what the rates compare. At most settings.window pulls
 * are in flight; with the window full a run sends nothing.
 *
 * pull_sink is attached to the same interface and takes every answer to the generator's
 * port before the network stack: it checks it (a batch, the one asked for), counts it,
 * files its latency (the send time travels in the request's id, which every answer
 * echoes) and drops it. Other traffic goes on (ARP, among others).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "bench/pullgen_maps.h"
#include "bpf/udpframe.h"
#include "frontend/pullcache_slot.h"

const volatile struct pg_settings cfg = {};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(map_flags, BPF_F_MMAPABLE);
    __type(key, __u32);
    __type(value, struct pg_ctl);
    __uint(max_entries, 1);
} ctl SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __type(key, __u32);
    __type(value, struct pg_sink);
    __uint(max_entries, 1);
} sink SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __type(key, __u32);
    __type(value, __u64);
    __uint(max_entries, PG_HIST);
} hist SEC(".maps");

/* The sinks' answers over every CPU into c->answered_seen, their latest time into
 * c->last_seen_ns (reads of other CPUs' lines: only when the window looks full). */
static __always_inline void sum_answers(struct pg_ctl *c)
{
    __u64 n = 0, last = 0;
    for (__u32 cpu = 0; cpu < PG_MAX_CPUS; cpu++) {
        if (cpu >= cfg.ncpus)
            break;
        __u32 zero = 0;
        struct pg_sink *k = bpf_map_lookup_percpu_elem(&sink, &zero, cpu);
        if (!k)
            continue;
        n += *(volatile __u64 *)&k->answered;
        __u64 t = *(volatile __u64 *)&k->last_answer_ns;
        if (t > last)
            last = t;
    }
    c->answered_seen = n;
    if (last > c->last_seen_ns)
        c->last_seen_ns = last;
}

#define KEY_LEN 16      /* "key:" and 12 digits */
#define ANSWER_HDR 24   /* core/stream.h XS_PULL_HDR: status, 0, count, version, number, first ms */
#define ID_TIME_MASK ((1u << (32 - PG_ID_NO_BITS)) - 1)
#define ID_NO_MASK ((1u << PG_ID_NO_BITS) - 1)

SEC("xdp")
int pull_gen(struct xdp_md *ctx)
{
    __u32 zero = 0;
    struct pg_ctl *c = bpf_map_lookup_elem(&ctl, &zero);
    if (!c)
        return XDP_ABORTED;
    if (*(volatile __u64 *)&c->stop) {
        c->held++;
        return XDP_DROP;
    }
    __s64 inflight = (__s64)(c->sent - c->answered_seen - c->lost);
    if (inflight >= (__s64)cfg.window) {
        sum_answers(c);
        inflight = (__s64)(c->sent - c->answered_seen - c->lost);
    }
    if (inflight < 0) { /* answers to pulls written off came after all: they were late, not lost */
        c->lost += inflight;
        inflight = 0;
    }
    if (inflight >= (__s64)cfg.window) {
        __u64 now = bpf_ktime_get_ns();
        if ((__s64)(now - c->last_seen_ns) > (__s64)cfg.lost_after_ns) { /* write them off */
            c->lost += inflight;
            c->lost_events++;
            c->last_seen_ns = now;
        }
        c->held++;
        return XDP_DROP;
    }
    if (bpf_xdp_adjust_head(ctx, PG_SLACK))
        return XDP_ABORTED;
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + sizeof *eth;
    struct udphdr *udp = (void *)ip + sizeof *ip;
    __u8 *kv = (void *)udp + sizeof *udp;
    if ((void *)(kv + PC_HDR + 2 + KEY_LEN + 8) > end)
        return XDP_ABORTED;
#pragma unroll
    for (int i = 0; i < ETH_ALEN; i++) { /* byte by byte: cfg is volatile, a memcpy would fold it */
        eth->h_dest[i] = cfg.dst_mac[i];
        eth->h_source[i] = cfg.src_mac[i];
    }
    eth->h_proto = bpf_htons(ETH_P_IP);
    ip->version = 4;
    ip->ihl = 5;
    ip->tos = 0;
    ip->tot_len = bpf_htons(sizeof *ip + sizeof *udp + PG_PULL_PAYLOAD);
    ip->id = 0;
    ip->frag_off = 0;
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->check = cfg.ip_check;
    ip->saddr = cfg.saddr;
    ip->daddr = cfg.daddr;
    udp->source = cfg.sport;
    udp->dest = cfg.dport;
    udp->len = bpf_htons(sizeof *udp + PG_PULL_PAYLOAD);
    udp->check = 0;
    __u32 s = bpf_get_prandom_u32() % cfg.streams;
    __u64 no = bpf_get_prandom_u32() % cfg.batches;
    __u32 id = (__u32)(bpf_ktime_get_ns() >> 10) << PG_ID_NO_BITS | ((__u32)no & ID_NO_MASK);
    kv[0] = id >> 24, kv[1] = id >> 16, kv[2] = id >> 8, kv[3] = id;
    kv[4] = 0, kv[5] = 0, kv[6] = 0, kv[7] = PC_F_PULL;
    __u8 *k = kv + PC_HDR;
    k[0] = 0, k[1] = KEY_LEN;
    k[2] = 'k', k[3] = 'e', k[4] = 'y', k[5] = ':';
#pragma unroll
    for (int i = 11; i >= 0; i--) {
        k[6 + i] = '0' + s % 10;
        s /= 10;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        k[2 + KEY_LEN + i] = (__u8)(no >> (8 * (7 - i)));
    c->sent++;
    return XDP_TX;
}

static __always_inline __u64 be64_at(const __u8 *p)
{
    __u64 v = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

SEC("xdp")
int pull_sink(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct iphdr *ip;
    struct udphdr *udp;
    __u8 *kv = kv_frame(data, end, &ip, &udp);
    if (!kv || udp->dest != cfg.sport || udp->source != cfg.dport)
        return XDP_PASS;
    __u32 zero = 0;
    struct pg_sink *c = bpf_map_lookup_elem(&sink, &zero);
    if (!c)
        return XDP_DROP;
    __u64 now_ns = bpf_ktime_get_ns();
    __u32 now = (__u32)(now_ns >> 10);
    __u32 id = (__u32)kv[0] << 24 | (__u32)kv[1] << 16 | (__u32)kv[2] << 8 | kv[3];
    int len = (int)bpf_ntohs(udp->len) - (int)sizeof *udp;
    __u8 *a = kv + PC_HDR;
    int good = 0;
    if ((void *)(a + ANSWER_HDR) <= end && len >= PC_HDR + ANSWER_HDR && (kv[7] & PC_F_REPLY) && (kv[7] & PC_F_PULL) &&
        (a[0] == 0 || a[0] == 1)) { /* XS_PULL_SEALED, XS_PULL_OPEN */
        __u64 no = be64_at(a + 8);
        good = no < cfg.batches && ((__u32)no & ID_NO_MASK) == (id & ID_NO_MASK);
    }
    c->answered++;
    if (good)
        c->answer_bytes += len - PC_HDR;
    else
        c->bad++;
    c->last_answer_ns = now_ns;
    __u32 bucket = (now - (id >> PG_ID_NO_BITS)) & ID_TIME_MASK;
    if (bucket >= PG_HIST)
        bucket = PG_HIST - 1;
    __u64 *n = bpf_map_lookup_elem(&hist, &bucket);
    if (n)
        *n += 1;
    return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
