/* fdq.c - descriptors handed between threads (see fdq.h). */
#include "core/fdq.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void wake(int evfd)
{
    uint64_t one = 1;
    ssize_t w = write(evfd, &one, sizeof one);
    (void)w;
}

void fdq_init(struct fdq *q, int evfd)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->lock, NULL);
    q->evfd = evfd;
}

void fdq_free(struct fdq *q)
{
    for (int i = 0; i < q->len; i++)
        close(q->fds[i]);
    free(q->fds);
    q->fds = NULL;
    q->len = q->cap = 0;
    pthread_mutex_destroy(&q->lock);
}

void fdq_push(struct fdq *q, int fd)
{
    pthread_mutex_lock(&q->lock);
    if (q->len == q->cap) {
        int cap = q->cap ? q->cap * 2 : 64;
        int *a = realloc(q->fds, (size_t)cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&q->lock);
            close(fd);
            return;
        }
        q->fds = a;
        q->cap = cap;
    }
    q->fds[q->len++] = fd;
    pthread_mutex_unlock(&q->lock);
    wake(q->evfd);
}

int fdq_take(struct fdq *q, int *fds, int max)
{
    pthread_mutex_lock(&q->lock);
    int n = q->len < max ? q->len : max;
    if (n) { /* an empty queue may have no array yet */
        memcpy(fds, q->fds, (size_t)n * sizeof *fds);
        memmove(q->fds, q->fds + n, (size_t)(q->len - n) * sizeof *fds);
        q->len -= n;
    }
    int more = q->len > 0;
    pthread_mutex_unlock(&q->lock);
    if (more)
        wake(q->evfd);
    return n;
}
