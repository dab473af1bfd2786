/* replog_gen.h - the load of the log batching experiment (paper 000's Fig. 4),
 * generated inside the node. Benchmark code (module kvstore._bench), not part of
 * the server. Called from Python through cffi: blocks, never prints. */
#ifndef KV_REPLOG_GEN_H
#define KV_REPLOG_GEN_H

#include <stdint.h>

#include "core/table.h" /* kvt_log_fn */

/* Append n records of record_bytes each (>= 41: a 16-byte key, the rest value)
 * through append(arg, ...) as fast as the log accepts them (waiting while it
 * answers -EAGAIN: its backlog bound is reached). append is the log's table
 * logger, wal_log_fn of kvstore._ext with its struct wal * as arg: this module
 * has no log code of its own, so the records go into that log and no other.
 * Returns the last LSN appended (> 0) or -errno. */
int64_t rl_generate(kvt_log_fn append, void *arg, uint64_t n, uint32_t record_bytes);

#endif
