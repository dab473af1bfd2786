/* dpdk.h - the kernel-bypass UDP front end (--arch dpdk): DPDK lcores that take
 * bursts of UDP datagrams from one port (rte_eth_rx_burst), run the RESP request
 * each carries (udpfront.h: framing, durability, stalls) on the server's table,
 * and send the reply back in the same mbuf (rte_eth_tx_burst). Built only with
 * KV_HAVE_DPDK. mTCP, the paper's kernel-bypass TCP, is not packaged anywhere
 * usable: the fast path is UDP, as in MICA.
 */
#ifndef KV_DPDK_H
#define KV_DPDK_H

#include <stddef.h>
#include <stdint.h>

#include "frontend/udpfront.h"

struct srv;
struct kv_table;
struct dp_port;

/* Initialise DPDK's EAL (once per process: a second call fails with -EALREADY),
 * probe an AF_XDP port on iface and set up `lcores` RX/TX queue pairs, one per
 * worker lcore; requests run on table t (not owned). Extra EAL arguments (space
 * separated) may be NULL. Runs on the control thread; nothing is received until
 * dp_start. -errno + message in err. */
int dp_create(struct dp_port **out, struct srv *s, struct kv_table *t, const char *iface, int lcores,
              int udp_port, const char *eal_args, char *err, size_t errlen);
/* Launch the worker lcores (each busy-polls its queue until dp_stop). */
int dp_start(struct dp_port *d, char *err, size_t errlen);
/* Stop and join the lcores. Idempotent. Control thread. */
void dp_stop(struct dp_port *d);
/* Stop, close the port, release the EAL. */
void dp_destroy(struct dp_port *d);
/* Add every lcore's counters to t (relaxed reads; any thread). */
void dp_get_totals(struct dp_port *d, struct uf_totals *t);

#endif
