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
#include <stdint.h>

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
/* The TLS port (the one bound when cfg->tls_port was 0), or -1 when TLS is off. */
int srv_tls_port(const struct srv *s);
/* The MQTT port (the one bound when cfg->mqtt_port was 0), or -1 when MQTT is off. */
int srv_mqtt_port(const struct srv *s);
/* The UDP front end's port (arch udp: the one bound when udp_port was 0), else cfg's. */
int srv_udp_port(const struct srv *s);
/* 1 if this build has the DPDK front end (libdpdk found at build time), else 0. */
int srv_have_dpdk(void);
/* The block device served beside RESP (kv_config.nbd set), or NULL: for
 * frontend/nbd.h's nbd_port and nbd_get_stats. */
struct nbd_server;
struct nbd_server *srv_nbd(struct srv *s);
/* Totals over the front ends. */
void srv_get_stats(struct srv *s, struct fe_stats *st);
/* Counters of TCP thread i (poller or pool worker): 0, or -EINVAL past the last. */
int srv_get_poller_stats(struct srv *s, int i, struct fe_thread_stats *st);

/* A node that waits for its state (engine/loading.h; created with cfg->loading):
 * srv_set_loading updates what INFO and the -LOADING error say it waits for (NULL
 * leaves a text as it is); srv_attach ends the wait with the durability pieces
 * opened since (any may be NULL) and the node serves. Control thread.
 * srv_attach: 0 or -errno with a message in err. */
void srv_set_loading(struct srv *s, const char *waiting_for, const char *last_error, uint64_t attempts,
                     const char *node_id);
int srv_attach(struct srv *s, struct wal *w, struct bosc *b, struct rl_sender *sender, char *err, size_t errlen);

#define SRV_INFO_MAX_SECTIONS 16  /* section names srv_info takes at most */
#define SRV_INFO_MAX_NAME 32      /* bytes of one section name at most */

/* What INFO shows, without a connection (the control plane's read: the metrics
 * endpoint): the text of the sections named in `sections` (space-separated, as
 * INFO's arguments: "persistence replication", "everything", ...; NULL or "" =
 * the default set), rendered by the engine's INFO registry like the command.
 * Writes at most cap - 1 bytes and a NUL into buf and returns the whole text's
 * length: a result >= cap means buf was too small (call again with length + 1).
 * -EINVAL for cap 0, more than SRV_INFO_MAX_SECTIONS names or a name longer
 * than SRV_INFO_MAX_NAME. Any thread while the server exists. */
long srv_info(struct srv *s, const char *sections, char *buf, size_t cap);

#endif
