/* server.h - a kvstore node's server: the engine plus the front ends its arch
 * names, created, started and stopped together.
 *
 * arch "poller": the poller front end (RESP over TCP, per-core epoll pollers);
 * "threadpool": the thread pool (paper 000's blocking baseline); "udp" and
 * "dpdk": pollers for TCP (the control path: redis-cli, INFO) plus that UDP front
 * end (frontend/udpfront.h). Front ends are found in the registry
 * (frontend/frontend.h) by name; the server never names one in code.
 * srv_* functions run on the control thread (Python); the stats getters on any.
 */
#ifndef KV_SERVER_H
#define KV_SERVER_H

#include <stddef.h>

#include "engine/engine.h"
#include "frontend/frontend.h"

struct kv_table;
struct srv;

/* Create the engine over table t (not owned) with cfg (copied) and the front ends
 * of cfg->arch, binding their sockets; nothing runs until srv_start. On failure
 * returns -errno with a message in err. */
int srv_create(struct srv **out, struct kv_table *t, const struct kv_config *cfg, char *err, size_t errlen);
int srv_start(struct srv *s, char *err, size_t errlen);
/* Stop every front end: threads joined, connections closed. Idempotent. */
void srv_stop(struct srv *s);
void srv_destroy(struct srv *s);

/* The TCP port (the one bound when cfg->port was 0). */
int srv_port(const struct srv *s);
/* The UDP front end's port (arch udp: the one bound when udp_port was 0), else cfg's. */
int srv_udp_port(const struct srv *s);
/* 1 if this build has the DPDK front end (libdpdk found at build time), else 0. */
int srv_have_dpdk(void);
/* Totals over the front ends. */
void srv_get_stats(struct srv *s, struct fe_stats *st);
/* Counters of TCP thread i (poller or pool worker): 0, or -EINVAL past the last. */
int srv_get_poller_stats(struct srv *s, int i, struct fe_thread_stats *st);

#endif
