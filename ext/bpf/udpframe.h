/* udpframe.h - the frame kvstore's XDP programs read (pullcache.bpf.c, and the pull
 * experiment's bench/pullgen.bpf.c): Ethernet, IPv4 without options, UDP, then the
 * kvstore frame header. BPF target only. */
#ifndef KV_BPF_UDPFRAME_H
#define KV_BPF_UDPFRAME_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#include "frontend/pullcache_slot.h"

#define FRAME (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr))

/* The kvstore header of an IPv4 (no options) UDP frame from data to end, with its
 * PC_HDR bytes inside the packet, and the frame's IP and UDP headers in *ip, *udp;
 * NULL when the packet is not such a frame. */
static __always_inline __u8 *kv_frame(void *data, void *end, struct iphdr **ip, struct udphdr **udp)
{
    struct ethhdr *eth = data;
    *ip = data + sizeof *eth;
    *udp = (void *)*ip + sizeof **ip;
    __u8 *kv = (void *)*udp + sizeof **udp;
    if ((void *)(kv + PC_HDR) > end)
        return NULL;
    if (eth->h_proto != bpf_htons(ETH_P_IP) || (*ip)->ihl != 5 || (*ip)->protocol != IPPROTO_UDP)
        return NULL;
    return kv;
}

#endif
