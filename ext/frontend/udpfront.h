/* udpfront.h - the request path of kvstore's UDP front ends, shared by --arch udp
 * (kernel sockets, recvmmsg/sendmmsg: udp.c) and --arch dpdk (kernel bypass,
 * DPDK lcores on an AF_XDP port: dpdk.c). Only how datagrams arrive and leave differs.
 *
 * Datagram framing (both directions, all fields big-endian), after the UDP header:
 *   u32 id         chosen by the client, echoed unchanged in the reply
 *   u16 seq        index of this datagram in its message; always 0 (one datagram
 *                  per request and per reply, like memcached's UDP frames with total 1)
 *   u16 flags      requests: 0, KVU_F_XADD or KVU_F_PULL (the operation below);
 *                  replies: KVU_F_REPLY | the request's operation, and KVU_F_ERROR when
 *                  the reply is an error made by the UDP front end itself (bad RESP,
 *                  reply too large)
 *   then, by flags:
 *   0              exactly one RESP request (the reply: one RESP reply);
 *   KVU_F_XADD     a batch of k messages for one stream (paper 004's batch transfer):
 *                  u16 key length, key, u16 field length, field, u16 k (1..KVU_MAX_BATCH),
 *                  then k times u16 length + message. They become k entries FIELD
 *                  message with consecutive IDs from "*", in one change and one log
 *                  record. Reply (RESP): [first ID, k], or an error (WRONGTYPE, OOM,
 *                  NOAUTH, ...);
 *   KVU_F_PULL     a pull of one batch: u16 key length, key, u64 batch number, then
 *                  optional padding (ignored): a pull padded to the size of its answer
 *                  (up to KVU_MAX_PAYLOAD) leaves the pull cache room to answer it in
 *                  place, which XDP cannot grow a packet to do on every driver. Reply:
 *                  core/stream.h's pull answer (xs_pull_encode: status, entries,
 *                  version, number, first ms, entry bytes), or a status without
 *                  entries (no such batch: u64 number asked, oldest, next; no such
 *                  stream), or a RESP error starting with '-' (WRONGTYPE, NOAUTH).
 *                  With the pull cache (pullcache.h) the kernel may answer it instead,
 *                  with the same bytes.
 * A framed request (XADD; PULL but for its padding) must fill its datagram exactly; one
 * that does not is dropped and counted (udp_bad_frames), as are datagrams with KVU_F_REPLY or any
 * other flag set (no reflection).
 * A datagram is its own connection: no AUTH (a server with requirepass answers
 * -NOAUTH), RESP2, no state kept between datagrams.
 *
 * Durability is the TCP path's, from the same runner (engine/session.h): a reply
 * leaves only once the log holds every LSN its request wrote or read
 * (uf_worker.ses.need against uf_durable), so the front end keeps built replies in
 * order until then; and a request that must wait for the data file (a key to
 * load, memory the flusher is freeing) is kept, unanswered, and run again when
 * the worker's eventfd says the data file moved on.
 * One uf_worker per thread; nothing in it is shared.
 */
#ifndef KV_UDPFRONT_H
#define KV_UDPFRONT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"
#include "engine/session.h"
#include "proto/resp.h"

#define KVU_HDR_LEN 8
#define KVU_F_REPLY 0x0001u
#define KVU_F_ERROR 0x0002u
#define KVU_F_XADD 0x0004u
#define KVU_F_PULL 0x0008u
#define KVU_MAX_PAYLOAD 1472 /* a reply: a 1500-byte MTU less IPv4 (20) and UDP (8) */
#define KVU_MAX_REQUEST 9000 /* a request (a batch of messages): a jumbo frame's payload; over
                                loopback and veth no fragment is ever sent */
#define KVU_MAX_BATCH 1024   /* messages of one KVU_F_XADD datagram */

struct kv_engine;

/* Counters of one worker: single writer (its thread), read by INFO. */
struct uf_stats {
    _Atomic uint64_t rx_packets, tx_packets, requests, dropped, tx_failed, bad_frames, held, stalls;
    _Atomic uint64_t busy_ns; /* time in loop turns that did work (a busy-polling lcore's CPU time
                                 is all of its time: this is the part that served requests) */
};

/* Sums over workers, for the front end's add_stats. dropped: not for us (ARP, IPv6, other
 * ports); bad: malformed; held: replies that waited for the log; stalls: times a
 * request had to wait for the data file (a retry that must wait again counts again). */
struct uf_totals {
    uint64_t rx_packets, tx_packets, requests, dropped, tx_failed, bad_frames, held, stalls, busy_ns;
};

struct uf_worker {
    struct kv_engine *eng;
    int evfd;                /* woken by the log and the data file (ses_subscribe'd by the owner) */
    struct session ses;      /* ses.need: LSN the reply depends on (0: none), over every run of it */
    struct kvbuf out;        /* the RESP reply being built */
    struct resp_parser rp;
    struct resp_args args;   /* the request's arguments, kept while it stalls */
    int argc;
    uint16_t flags;          /* of the reply in out */
    struct uf_stats st;
};

enum { UF_REPLY, UF_STALL, UF_BAD };

/* evfd: the worker's eventfd (subscribed with ses_subscribe). index names the worker in CLIENT INFO. */
void uf_init(struct uf_worker *w, struct kv_engine *eng, int index, int evfd, const char *addr);
void uf_free(struct uf_worker *w);

/* Run the request of the datagram payload p[0..len) (frame header + RESP).
 * UF_BAD: not a request (count it, drop it, send nothing). UF_REPLY: the reply is in
 * w->out with w->flags; it may leave once uf_durable(w) >= w->need. UF_STALL: it
 * waits for the data file (asked already); keep p unchanged, receive nothing more,
 * and call uf_resume when woken. The RESP payload is parsed in place. */
int uf_run(struct uf_worker *w, uint8_t *p, size_t len);
int uf_resume(struct uf_worker *w);

/* Write the reply frame for request payload req (its id) to dst: header + w->out,
 * or an error if the reply exceeds room. dst may be req (a reply built in place).
 * Returns the frame's length. */
size_t uf_frame_reply(struct uf_worker *w, uint8_t *dst, const uint8_t *req, size_t room);

/* Durable LSN now (UINT64_MAX without a log); *failed set if the log failed,
 * so held replies can never be sent. */
uint64_t uf_durable(struct uf_worker *w, int *failed);

void uf_add_totals(const struct uf_stats *st, struct uf_totals *t);

/* What a UDP front end (udp.c, dpdk.c) shows in INFO: its port and worker count
 * (server section) and the totals over its workers (stats section). */
struct uf_info {
    void (*totals)(void *arg, struct uf_totals *t);
    void *arg;
    const int *port;
    int workers;
};
/* Register info's INFO lines (info must outlive the engine's use of it). 0 or -errno. */
int uf_register_info(struct kv_engine *eng, struct uf_info *info);
/* Add totals u to a front end's stats (the udp_* fields). */
struct fe_stats;
void uf_add_stats(const struct uf_totals *u, struct fe_stats *st);

#endif
