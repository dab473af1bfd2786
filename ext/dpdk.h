/* dpdk.h - the kernel-bypass UDP front end (--arch dpdk): DPDK lcores that take
 * bursts of UDP datagrams from one port (rte_eth_rx_burst), run the RESP request
 * each carries through cmd_dispatch on the server's table, and send the reply
 * back in the same mbuf (rte_eth_tx_burst). Built only with KV_HAVE_DPDK.
 *
 * Datagram framing (both directions, all fields big-endian), after the UDP header:
 *   u32 id         chosen by the client, echoed unchanged in the reply
 *   u16 seq        index of this datagram in its message; always 0 (one datagram
 *                  per request and per reply, like memcached's UDP frames with total 1)
 *   u16 flags      KVU_F_REPLY on replies; KVU_F_ERROR when the reply is an error
 *                  made by the UDP front end itself (bad framing, reply too large)
 *   then exactly one RESP request (or one RESP reply).
 * Datagrams with KVU_F_REPLY set, or any other flag, are dropped (no reflection).
 * No authentication, no durability, one database: see srv_config.arch.
 */
#ifndef KV_DPDK_H
#define KV_DPDK_H

#include <stddef.h>
#include <stdint.h>

#define KVU_HDR_LEN 8
#define KVU_F_REPLY 0x0001u
#define KVU_F_ERROR 0x0002u

struct srv;
struct kv_table;
struct dp_port;

struct dp_stats {
    uint64_t rx_packets, tx_packets, requests, dropped, tx_failed, bad_frames;
};

/* Initialise DPDK's EAL (once per process: a second call fails with -EALREADY),
 * probe an AF_XDP port on iface and set up `lcores` RX/TX queue pairs, one per
 * worker lcore; requests run on table t (not owned). Extra EAL arguments (space separated) may be NULL. Runs on the
 * control thread; nothing is received until dp_start. -errno + message in err. */
int dp_create(struct dp_port **out, struct srv *s, struct kv_table *t, const char *iface, int lcores,
              int udp_port, const char *eal_args, char *err, size_t errlen);
/* Launch the worker lcores (each busy-polls its queue until dp_stop). */
int dp_start(struct dp_port *d, char *err, size_t errlen);
/* Stop and join the lcores. Idempotent. Control thread. */
void dp_stop(struct dp_port *d);
/* Stop, close the port, release the EAL. */
void dp_destroy(struct dp_port *d);
/* Sum of every lcore's counters (relaxed reads; any thread). */
void dp_get_stats(struct dp_port *d, struct dp_stats *st);

#endif
