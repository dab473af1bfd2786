/* tcpmem.h - what a RESP-over-TCP connection publishes after each read or write:
 * CLIENT LIST's view of its buffers and events, and its memory, which the command
 * layer (cmd/client_mem.c) sums against maxmemory-clients and checks against the
 * query-buffer and output-buffer limits. One call for the poller and the thread
 * pool alike. Owner thread only; relaxed atomics.
 */
#ifndef KV_TCPMEM_H
#define KV_TCPMEM_H

#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"
#include "engine/session.h"
#include "proto/resp.h"

/* Publish the connection's state: in holds its input from in_off on (the request
 * in part, parsed by rp), out its replies from out_off on; events CMD_EV_*.
 * Returns 1 when the connection must be closed now (a limit passed, or evicted
 * for maxmemory-clients: counted and logged already), else 0. */
int tcp_conn_publish(struct session *s, int64_t now_ms, const struct kvbuf *in, size_t in_off,
                     const struct resp_parser *rp, const struct kvbuf *out, size_t out_off, int events);

#endif
