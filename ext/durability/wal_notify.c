/* wal_notify.c - the log's wake-up list (wal_notify.h). A subscriber that holds
 * no reply, or is awake and looks at the durable LSN itself at the end of its
 * round, wants nothing; one asleep with replies held wants the LSN of its first
 * one. So an ack wakes only the threads it releases something for, once. */
#include <errno.h>
#include <unistd.h>

#include "durability/wal_notify.h"

void wal_notify_init(struct wal_notify *nt)
{
    pthread_mutex_init(&nt->lock, NULL);
    nt->n = 0;
}

void wal_notify_destroy(struct wal_notify *nt) { pthread_mutex_destroy(&nt->lock); }

int wal_notify_add(struct wal_notify *nt, int evfd)
{
    int rc = -ENOSPC;
    pthread_mutex_lock(&nt->lock);
    if (nt->n < WAL_MAX_NOTIFY) {
        atomic_store(&nt->want[nt->n], 0);
        nt->fd[nt->n++] = evfd;
        rc = 0;
    }
    pthread_mutex_unlock(&nt->lock);
    return rc;
}

uint64_t wal_notify_want(struct wal_notify *nt, int *slot, int evfd, uint64_t lsn, _Atomic uint64_t *durable)
{
    int i = *slot;
    /* entries are only ever appended: one seen under the lock stays as it is */
    if (i < 0 || i >= WAL_MAX_NOTIFY || nt->fd[i] != evfd) { /* first call, or another log */
        pthread_mutex_lock(&nt->lock);
        int n = nt->n;
        for (i = 0; i < n && nt->fd[i] != evfd; i++)
            ;
        pthread_mutex_unlock(&nt->lock);
        if (i == n)
            return atomic_load(durable); /* not subscribed: never woken, as before */
        *slot = i;
    }
    /* Dekker with wal_notify_wake: the want is stored before the LSN is read,
     * the LSN before the wants are: either this reads the new LSN or the
     * waker reads this want. */
    atomic_store(&nt->want[i], lsn);
    return atomic_load(durable);
}

void wal_notify_wake(struct wal_notify *nt, uint64_t durable, int all)
{
    uint64_t one = 1;
    atomic_thread_fence(memory_order_seq_cst);
    pthread_mutex_lock(&nt->lock);
    for (int i = 0; i < nt->n; i++) {
        if (!all && durable < atomic_load(&nt->want[i]))
            continue; /* wants a later LSN, or nothing */
        ssize_t r = write(nt->fd[i], &one, sizeof one);
        (void)r; /* EAGAIN: the counter is already non-zero, the subscriber will wake */
    }
    pthread_mutex_unlock(&nt->lock);
}
