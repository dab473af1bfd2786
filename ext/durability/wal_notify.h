/* wal_notify.h - the log's wake-up list: the eventfds of the threads that hold
 * replies for the durable LSN, each with the LSN it wants to be woken at.
 * Threads: wal_notify_add under the log's control; wal_notify_want by each
 * subscriber for its own entry; wal_notify_wake by whoever moved the LSN. */
#ifndef KV_WAL_NOTIFY_H
#define KV_WAL_NOTIFY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define WAL_MAX_NOTIFY 1024

struct wal_notify {
    pthread_mutex_t lock;
    int fd[WAL_MAX_NOTIFY], n;
    /* want[i]: fd[i] is written once the durable LSN reaches it (0: at every
     * move, UINT64_MAX: not at all) */
    _Atomic uint64_t want[WAL_MAX_NOTIFY];
};

void wal_notify_init(struct wal_notify *nt);
void wal_notify_destroy(struct wal_notify *nt);
/* 0, or -ENOSPC. The new entry wants every move. */
int wal_notify_add(struct wal_notify *nt, int evfd);
/* Publish evfd's want, then read *durable (seq_cst both): see wal_want. */
uint64_t wal_notify_want(struct wal_notify *nt, int *slot, int evfd, uint64_t lsn, _Atomic uint64_t *durable);
/* The durable LSN was stored (seq_cst) as durable: write the eventfds that want
 * it — every one if all (a failure). */
void wal_notify_wake(struct wal_notify *nt, uint64_t durable, int all);

#endif
