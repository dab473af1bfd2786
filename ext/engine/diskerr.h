/* diskerr.h - the node's disk write state, for commands and INFO: whether the
 * durability log or the data file cannot be written now (a full or failing
 * disk: each retries by itself, wal.h's wal_write_error and bosc.h's
 * bosc_write_error), the MISCONF error that refuses writes meanwhile (Redis's
 * "-MISCONF Errors writing to the AOF file: <strerror>"), and INFO
 * persistence's lines for it. Any thread; reads atomics and short locks only.
 */
#ifndef KV_DISKERR_H
#define KV_DISKERR_H

#include <stddef.h>

struct kv_engine;
struct kvbuf;

/* 1 if writes must be refused now, with the error reply's text (no '-', no
 * CRLF) in msg (n bytes), e.g. "MISCONF Errors writing to the durability log:
 * No space left on device ..."; 0 while the log and the data file (those the
 * node has) can be written. */
int eng_disk_refusal(struct kv_engine *e, char *msg, size_t n);

/* An eng_info_fn (arg: the engine) for INFO persistence: Redis's
 * aof_last_write_status (ok|err: the log, kvstore's AOF) and kvstore's
 * log_write_status, log_write_error, log_write_errors, datafile_write_status,
 * datafile_write_error, datafile_write_errors. */
void eng_disk_info(void *arg, struct kvbuf *out);

#endif
