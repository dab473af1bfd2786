/* pullcache.bpf.c - the first level of paper 004's pull cache: an XDP program that
 * answers a UDP pull of a cached sealed batch before the packet reaches the kernel's
 * network stack or kvstore (XDP_TX: the request turned into the reply in place).
 * Anything else goes on (XDP_PASS): other traffic, malformed pulls (the engine
 * counts and drops them), misses (the engine answers them: the second level).
 *
 * Compiled by clang for the BPF target when the extension is built (kvstore/_build.py),
 * embedded in it and loaded by frontend/pullcache.c, which sets the read-only
 * configuration below, sizes the slot map and fills it. Layouts: pullcache_slot.h.
 *
 * pull_bounce is the yardstick of the pull experiment: the same parsing, then the
 * request sent back at cfg.bounce_len bytes of payload with no lookup and no copy,
 * so its rate is what XDP_TX on this interface can do at that reply size;
 * pull_bounce_copy also writes that many bytes into the reply, from one buffer.
 * pass is for the other end of a veth: see there.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "bpf/udpframe.h"
#include "frontend/pullcache_slot.h"

const volatile struct pc_config cfg = {0, 1, 0};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(map_flags, BPF_F_MMAPABLE);
    __type(key, __u32);
    __type(value, struct pc_slot);
    __uint(max_entries, 1); /* set by the loader */
} slots SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __type(key, __u32);
    __type(value, __u64);
    __uint(max_entries, PC_NSTATS);
} stats SEC(".maps");

static __always_inline void count(__u32 what)
{
    __u64 *n = bpf_map_lookup_elem(&stats, &what);
    if (n)
        *n += 1;
}

/* The headers of a pull to our port: IPv4 without options, not a fragment, UDP.
 * Returns the kvstore payload's length, or -1 when the packet is not one. */
static __always_inline int pull_request(void *data, void *end)
{
    struct iphdr *ip;
    struct udphdr *udp;
    __u8 *kv = kv_frame(data, end, &ip, &udp);
    if (!kv || (ip->frag_off & bpf_htons(0x3fff)) || udp->dest != bpf_htons((__u16)cfg.port))
        return -1;
    if (kv[4] | kv[5] | kv[6] || kv[7] != PC_F_PULL) /* seq 0, flags exactly PULL */
        return -1;
    int len = (int)bpf_ntohs(udp->len) - (int)sizeof *udp;
    return len < PC_HDR ? -1 : len; /* each read below checks the packet's end itself */
}

/* Turn the request of req_len kvstore bytes in place into its reply's headers, with
 * payload bytes after the kvstore header: the packet shrunk (or grown, which needs
 * tailroom, and a veth's frames have none) to fit. Computed from the request's UDP
 * length: link-layer padding, if any, stays behind the reply. 0, or -1 without room
 * (the request is unchanged), or -2 (cannot happen: a packet too short after all). */
static __always_inline int reply_headers(struct xdp_md *ctx, int req_len, __u32 payload)
{
    if (bpf_xdp_adjust_tail(ctx, (int)(PC_HDR + payload) - req_len)) {
        count(PC_ST_NO_ROOM);
        return -1;
    }
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + sizeof *eth;
    struct udphdr *udp = (void *)ip + sizeof *ip;
    __u8 *kv = (void *)udp + sizeof *udp;
    if ((void *)(kv + PC_HDR) > end)
        return -2;
    __u8 mac[ETH_ALEN];
    __builtin_memcpy(mac, eth->h_source, ETH_ALEN);
    __builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
    __builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
    __be32 a = ip->saddr;
    ip->saddr = ip->daddr;
    ip->daddr = a;
    ip->tot_len = bpf_htons((__u16)(sizeof *ip + sizeof *udp + PC_HDR + payload));
    ip->ttl = 64;
    ip->check = 0;
    __u32 sum = 0;
    __u16 *w = (__u16 *)ip;
#pragma unroll
    for (int i = 0; i < (int)sizeof *ip / 2; i++)
        sum += w[i];
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    ip->check = (__u16)~sum;
    __be16 p = udp->source;
    udp->source = udp->dest;
    udp->dest = p;
    udp->len = bpf_htons((__u16)(sizeof *udp + PC_HDR + payload));
    udp->check = 0; /* none: allowed over IPv4 */
    kv[6] = 0;
    kv[7] = PC_F_REPLY | PC_F_PULL;
    return 0;
}

SEC("xdp")
int pull_cache(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    int len = pull_request(data, end);
    if (len < 0)
        return XDP_PASS;
    __u8 *p = data + FRAME + PC_HDR;
    if ((void *)(p + 2) > end)
        return XDP_PASS;
    __u32 klen = (__u32)p[0] << 8 | p[1];
    if (klen == 0 || klen > PC_KEY_MAX || (__u32)len < PC_HDR + 2 + klen + 8)
        return XDP_PASS; /* malformed or a long name: the engine's */
    __u8 *kp = p + 2;
    __u64 key[PC_KEY_MAX / 8], h = PC_HASH_SEED;
#pragma unroll
    for (__u32 i = 0; i < PC_KEY_MAX / 8; i++) { /* 8 bytes at a time, the last word masked */
        if (i * 8 >= klen)
            break;
        if ((void *)(kp + i * 8 + 8) > end) /* within the packet: the batch number follows the key */
            return XDP_PASS;
        __u64 w = *(__u64 *)(kp + i * 8);
        __u32 left = klen - i * 8;
        if (left < 8)
            w &= (1ULL << (left * 8)) - 1;
        key[i] = w;
        h = pc_hash_word(h, w);
    }
    __u8 *nb = kp + klen;
    if ((void *)(nb + 8) > end)
        return XDP_PASS;
    __u64 no = __builtin_bswap64(*(__u64 *)nb);
    __u32 idx = (__u32)pc_index(h, no, cfg.nslots);
    struct pc_slot *s = bpf_map_lookup_elem(&slots, &idx);
    if (!s)
        return XDP_PASS;
    __u32 seq = *(volatile __u32 *)&s->seq;
    if ((seq & 1) || s->klen != klen || s->no != no) {
        count(PC_ST_MISSES);
        return XDP_PASS;
    }
#pragma unroll
    for (__u32 i = 0; i < PC_KEY_MAX / 8; i++) {
        if (i * 8 >= klen)
            break;
        if (*(__u64 *)(s->key + i * 8) != key[i]) {
            count(PC_ST_MISSES);
            return XDP_PASS;
        }
    }
    __u32 rlen = s->len;
    if (rlen == 0 || rlen > PC_REPLY_MAX) {
        count(PC_ST_MISSES);
        return XDP_PASS;
    }
    int rc = reply_headers(ctx, len, rlen); /* a pull padded to its answer's size only shrinks */
    if (rc)
        return rc == -1 ? XDP_PASS : XDP_DROP; /* no room: the engine answers the request, unchanged */
    if (bpf_xdp_store_bytes(ctx, FRAME + PC_HDR, s->reply, rlen))
        return XDP_DROP;
    __asm__ __volatile__("" ::: "memory");
    if (*(volatile __u32 *)&s->seq != seq) { /* written meanwhile: the copy may mix two batches */
        count(PC_ST_TORN);
        return XDP_DROP;
    }
    count(PC_ST_HITS);
    return XDP_TX;
}

/* The request sent back at cfg.bounce_len bytes of payload; with copy, those bytes written
 * from slot 0 (one hot buffer): what turning a pull around costs when the answer's bytes
 * are put in the frame, as every answer's are, with no lookup. */
static __always_inline int bounce(struct xdp_md *ctx, int copy)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    int len = pull_request(data, end);
    if (len < 0)
        return XDP_PASS;
    __u32 blen = cfg.bounce_len, zero = 0;
    if (blen > PC_REPLY_MAX)
        blen = PC_REPLY_MAX;
    int rc = reply_headers(ctx, len, blen);
    if (rc)
        return rc == -1 ? XDP_PASS : XDP_DROP;
    if (copy && blen) {
        struct pc_slot *s = bpf_map_lookup_elem(&slots, &zero);
        if (!s || bpf_xdp_store_bytes(ctx, FRAME + PC_HDR, s->reply, blen))
            return XDP_DROP;
    }
    count(PC_ST_BOUNCED);
    return XDP_TX;
}

SEC("xdp")
int pull_bounce(struct xdp_md *ctx)
{
    return bounce(ctx, 0);
}

SEC("xdp")
int pull_bounce_copy(struct xdp_md *ctx)
{
    return bounce(ctx, 1);
}

/* Nothing but XDP_PASS: on the far end of a veth it makes the kernel deliver what
 * pull_cache and pull_bounce send back with XDP_TX (a veth passes such frames on to
 * a peer whose receive side runs XDP). */
SEC("xdp")
int pass(struct xdp_md *ctx)
{
    return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
