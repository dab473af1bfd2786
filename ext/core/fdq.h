/* fdq.h - a queue of file descriptors handed from one thread to another (a
 * poller accepting for the others in handoff mode): a mutex-guarded array, and
 * an eventfd written on every push so the receiving thread's epoll wakes. */
#ifndef KV_FDQ_H
#define KV_FDQ_H

#include <pthread.h>

struct fdq {
    pthread_mutex_t lock;    /* guards fds, len, cap */
    int *fds, len, cap;
    int evfd;                /* the receiver's eventfd (not owned) */
};

void fdq_init(struct fdq *q, int evfd);
/* Close every descriptor still queued and free the queue. */
void fdq_free(struct fdq *q);
/* Queue fd for the receiver and wake it; on ENOMEM fd is closed. Any thread. */
void fdq_push(struct fdq *q, int fd);
/* Take at most max descriptors into fds; returns how many. When more remain the
 * eventfd is written again, so the receiver comes back for them. Receiver thread. */
int fdq_take(struct fdq *q, int *fds, int max);

#endif
