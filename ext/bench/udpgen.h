/* udpgen.h - UDP load generator for the UDP front ends (--arch udp, --arch dpdk):
 * kernel UDP sockets, sendmmsg/recvmmsg batches, several requests in flight per
 * socket, replies matched by the 8-byte frame header's id (framing in udpfront.h).
 * Called from Python through cffi like lg_run: blocks, never prints, never exits.
 * Lost datagrams are not retried: a request without a reply within timeout_ms is
 * counted in *timeouts and its slot reused. */
#ifndef KVSTORE_UDPGEN_H
#define KVSTORE_UDPGEN_H

#include <stdint.h>

#include "bench/loadgen.h"

/* Run one load as lg_run does, over UDP: cfg->conns sockets spread over cfg->threads
 * threads, cfg->pipeline requests in flight per socket (<= 4096), SET values of
 * cfg->value_size bytes (<= 1400: one datagram). cfg->proto must be RESP, cfg->rate
 * 0 and cfg->password NULL (the UDP path has no AUTH). With cfg->check, SET must
 * answer +OK and GET nil or the value this generator writes for that key
 * ('a' + (key + i) % 26 at byte i). Returns 0 or -errno with out->error set
 * (-EINVAL bad config); *timeouts gets the requests that got no reply in time. */
int ug_run(const struct lg_config *cfg, int timeout_ms, struct lg_result *out, uint64_t *timeouts);

#endif
