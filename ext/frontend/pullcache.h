/* pullcache.h - the first level of paper 004's pull cache, for the UDP front end
 * (--arch udp, --pull-cache-slots N): an XDP program on the interface of the front
 * end's address answers pulls of recently sealed batches from a BPF array map of
 * N slots before the kernel's network stack sees them (ext/bpf/pullcache.bpf.c);
 * a pull it cannot answer reaches the front end, which answers from the stream
 * (the second level) and fills the slot.
 *
 * The engine keeps the slots exact: through the table's batch hook it fills a
 * slot when a batch is sealed or pulled, writes it again when an entry of the batch
 * is deleted (its version moves) and empties it when the batch or the whole stream
 * goes (trim, DEL, FLUSHALL, expiry, overwrite) — under the key's shard lock,
 * before the change's reply, so a pull answered after a change never gets the
 * batch as it was before it. Stream names longer than PC_KEY_MAX are not cached.
 *
 * The program is attached through a BPF link owned by this process: if kvstore
 * dies, the kernel detaches it (no stale cache answering for a dead server).
 * Native XDP when the driver has it (veth), generic otherwise (lo).
 * Threads: the hook runs on any thread that changes a stream; pc_stats anywhere.
 */
#ifndef KV_PULLCACHE_H
#define KV_PULLCACHE_H

#include <stddef.h>
#include <stdint.h>

struct kv_table;
struct pull_cache;

#define PC_MAX_SLOTS (1u << 20)

/* 1 when this build has the XDP program (clang and libbpf were found). */
int pc_available(void);

/* Load the program with slots slots, attach it to the interface that holds the IPv4
 * address bind_addr (not a wildcard), answering pulls to UDP port, and hook the
 * table. 0, or -errno with the reason in err. */
int pc_open(struct pull_cache **out, struct kv_table *t, const char *bind_addr, int port, uint32_t slots,
            char *err, size_t errlen);
/* Unhook, detach, free. NULL is fine. Call after every thread that changes streams stopped. */
void pc_close(struct pull_cache *pc);

struct pc_stats {
    uint64_t hits, misses, torn, no_room; /* the program's: answered, passed on, dropped mid-write, no tailroom */
    uint64_t fills, invalidations;        /* the engine's: slots written, slots emptied */
    uint32_t slots;
    int native;                           /* 1 native XDP, 0 generic */
    char ifname[16];
};
void pc_get_stats(struct pull_cache *pc, struct pc_stats *out);

/* One of the object's other programs attached on interface ifname until pc_prog_detach
 * or the process's end: "pull_bounce", the pull experiment's packet-rate yardstick
 * (pulls to port come back with bounce_len bytes of payload, no lookup),
 * "pull_bounce_copy" (the same with the payload written from one buffer), or "pass",
 * for the client's end of a veth pair (a veth hands frames sent back with XDP_TX on to
 * its peer only when the peer's receive side runs XDP: GRO alone was not enough on
 * kernel 6.18). NULL with err on failure. */
struct pc_prog;
struct pc_prog *pc_prog_attach(const char *ifname, const char *program, int port, uint32_t bounce_len, char *err,
                               size_t errlen);
/* Pulls pull_bounce (or pull_bounce_copy) sent back. */
uint64_t pc_prog_bounced(struct pc_prog *p);
void pc_prog_detach(struct pc_prog *p);

#endif
