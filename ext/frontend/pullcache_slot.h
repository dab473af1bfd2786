/* pullcache_slot.h - what the pull cache's XDP program (ext/bpf/pullcache.bpf.c)
 * and the engine (frontend/pullcache.c) share: the slot of the BPF array map, the
 * slot a pull maps to, the pull datagram's layout and the program's counters.
 * Included by both C compilers (the kernel's BPF target and the host's), so only
 * fixed-width types from <linux/types.h>.
 *
 * A slot holds one sealed batch's pull answer (core/stream.h xs_pull_encode) for
 * (key, batch number). The engine writes it, the program reads it, with no lock
 * between them: a sequence number, odd while the engine writes, tells the program
 * a slot it read in the middle of a write (it drops that reply, the client asks
 * again). Writers (the engine's threads) take the slot by moving seq from even to
 * odd with a compare-and-swap. x86-64 keeps stores in order and loads in order,
 * which this relies on (the engine adds compiler barriers; the program reads
 * seq with volatile loads before and after the copy).
 */
#ifndef KV_PULLCACHE_SLOT_H
#define KV_PULLCACHE_SLOT_H

#include <linux/types.h>

#define PC_KEY_MAX 64     /* longer stream names are not cached: their pulls go to the engine */
#define PC_REPLY_MAX 1440 /* kvstore header (8) + this = 1448, within a 1472-byte UDP payload */

struct pc_slot {
    __u32 seq;             /* odd: being written */
    __u16 klen;            /* 0: empty */
    __u16 len;             /* bytes of reply */
    __u64 no;              /* the batch's number */
    __u8 key[PC_KEY_MAX];  /* zero-padded: the program compares it 8 bytes at a time */
    __u8 reply[PC_REPLY_MAX];
    __u8 pad[16];          /* to 1536 bytes: slots never share a cache line */
};

/* The pull request after the UDP header: the 8-byte kvstore frame header (id,
 * seq 0, flags PC_F_PULL), u16 key length (1..PC_KEY_MAX here; longer keys are
 * the engine's), the key, u64 batch number, padding; all big-endian. The reply
 * replaces the request in its buffer, so a pull padded to its answer's size is one
 * the program can answer (it shrinks the packet; growing needs tailroom). */
#define PC_F_REPLY 0x0001
#define PC_F_PULL 0x0008
#define PC_HDR 8

/* The key's hash, word by word: its 64-bit words in memory order (the program and the
 * engine run on the same machine), the last one zero-padded. The program reads the words
 * straight from the packet, so a key costs it one load per 8 bytes. */
#define PC_HASH_SEED 0x9e3779b97f4a7c15ULL
static inline __u64 pc_hash_word(__u64 h, __u64 w)
{
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    return h ^ (h >> 32);
}

/* The slot of (key, batch number): the key's hash, mixed, picks where the stream's
 * batches start; its batches follow one another from there, around the map. A stream's
 * recent batches (what pulls ask for: consumers near the tail) sit side by side, so
 * they share pages and the program's copies touch few of them, and a stream never
 * evicts its own batches until it has more than the map holds (batch n + slots
 * replaces batch n: the older one). */
static inline __u64 pc_index(__u64 key_hash, __u64 no, __u32 nslots)
{
    __u64 h = key_hash;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return (h % nslots + no % nslots) % nslots;
}

/* The program's settings, written by the loader before it loads it (its .rodata). */
struct pc_config {
    __u32 port;            /* the UDP front end's */
    __u32 nslots;          /* the slot map's entries */
    __u32 bounce_len;      /* pull_bounce's reply payload after the kvstore header */
};

/* The program's counters (a per-CPU array, summed by the engine for INFO). */
enum { PC_ST_HITS, PC_ST_MISSES, PC_ST_TORN, PC_ST_NO_ROOM, PC_ST_BOUNCED, PC_NSTATS };

#endif
