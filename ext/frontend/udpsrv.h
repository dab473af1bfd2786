/* udpsrv.h - the kernel-socket UDP front end (--arch udp): `workers` threads, each
 * with its own SO_REUSEPORT UDP socket on bind:port (the kernel spreads senders
 * over them), taking datagrams in recvmmsg batches and answering in sendmmsg
 * batches. Framing, durability and stalls as in udpfront.h. It is the kernel's
 * best UDP path for the same request loop that --arch dpdk runs over kernel
 * bypass, so the two compare like for like. TCP is still served by the pollers.
 */
#ifndef KV_UDPSRV_H
#define KV_UDPSRV_H

#include <stddef.h>

#include "frontend/udpfront.h"

struct srv;
struct kv_table;
struct us_server;

/* Bind `workers` sockets to bind:port (port 0: any free port, see us_port).
 * Nothing is received until us_start. -errno + message in err. */
int us_create(struct us_server **out, struct srv *s, struct kv_table *t, const char *bind, int port, int workers,
              char *err, size_t errlen);
int us_start(struct us_server *u, char *err, size_t errlen);
/* Stop and join the workers. Idempotent. */
void us_stop(struct us_server *u);
void us_destroy(struct us_server *u);
int us_port(const struct us_server *u);
void us_get_totals(struct us_server *u, struct uf_totals *t);

#endif
