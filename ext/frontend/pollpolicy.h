/* pollpolicy.h - how a poller maintains EPOLLOUT in its epoll interest set.
 *
 * The poller asks the policy two things: whether replies queued during a poll
 * round are written at the end of that round (or only when EPOLLOUT fires), and,
 * after every write attempt or writable event, whether the connection should
 * stay registered for EPOLLOUT. The poller compares the answer with what is
 * registered and calls epoll_ctl only on a change, so a policy's cost is exactly
 * the epoll_ctl calls its answers cause. Policies:
 *   direct - write at the end of the round; EPOLLOUT only while a short write
 *            left bytes unsent (Redis >= 3.2: no epoll_ctl in steady state);
 *   strict - never write before EPOLLOUT; add it when a reply is pending and
 *            remove it when all is sent (one or two epoll_ctl per reply);
 *   flexpoll - (paper 002) writes only on EPOLLOUT like strict, but leaves it
 *            registered after a reply while the connection's replies come more
 *            often than spurious writable events (see pollpolicy.c); its
 *            connections are registered edge-triggered, so a kept EPOLLOUT is
 *            reported with the connection's next request instead of in every
 *            poll round.
 * Per-connection policy state lives in struct pp_conn, owned by the poller thread.
 */
#ifndef KV_POLLPOLICY_H
#define KV_POLLPOLICY_H

#include <stdint.h>

struct pp_conn {
    uint32_t a, b; /* policy-private counters, zeroed when the connection opens */
};

/* flexpoll's break-even: two epoll_ctl calls (dropping EPOLLOUT, adding it for
 * the next reply) cost about as much as this many spurious writable events. */
#define PP_FLEX_SPURIOUS 8

struct pp_policy {
    const char *name;
    int write_at_round_end; /* 1: flush queued replies after each epoll_wait round */
    /* 1: connections are registered edge-triggered (EPOLLET): epoll reports a
     * change of state once, so a registered EPOLLOUT costs nothing while the
     * socket stays writable. The poller then remembers whether the socket's last
     * event said writable, and while EPOLLOUT is registered writes a reply queued
     * in a round at that round's end: the EPOLLOUT that would fire next round has
     * already been reported. Bytes left unread are not reported again, so after
     * a read that filled its buffer, or one skipped, the poller re-registers
     * (EPOLL_CTL_MOD reports what is there). */
    int edge;
    /* pending: bytes remain unsent after this step; spurious: this call follows a
     * writable event that found nothing to send and woke the poller for nothing
     * else. Returns 1 to keep/add EPOLLOUT. */
    int (*want_out)(struct pp_conn *st, int pending, int spurious);
};

/* Look a policy up by name; NULL if unknown. */
const struct pp_policy *pp_find(const char *name);
/* Comma-separated names of every policy, for error messages. */
const char *pp_names(void);

#endif
