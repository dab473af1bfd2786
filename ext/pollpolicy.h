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
 *   flexpoll - (paper 002) writes like strict, but leaves EPOLLOUT registered
 *            after a reply while the poller is busy: it follows the load
 *            instead of re-registering per reply (see pollpolicy.c).
 * Per-connection policy state lives in struct pp_conn, owned by the poller thread.
 */
#ifndef KV_POLLPOLICY_H
#define KV_POLLPOLICY_H

#include <stdint.h>

struct pp_conn {
    uint32_t a, b; /* policy-private counters, zeroed when the connection opens */
};

/* flexpoll keeps EPOLLOUT at most this many poll rounds after a connection's last
 * reply, and not once a poll round has read nothing. (32 rounds both ways, tried
 * on this machine: fewer epoll_ctl, but the busy polling between a client's
 * requests costs more than they save when clients share the cores.) */
#define PP_FLEX_ROUNDS 8

struct pp_policy {
    const char *name;
    int write_at_round_end; /* 1: flush queued replies after each epoll_wait round */
    /* pending: bytes remain unsent after this step; spurious: this call follows a
     * writable event that found nothing to send; round: the poller's epoll_wait
     * count (its clock); idle: the poller's previous round read nothing.
     * Returns 1 to keep/add EPOLLOUT. */
    int (*want_out)(struct pp_conn *st, int pending, int spurious, uint32_t round, int idle);
};

/* Look a policy up by name; NULL if unknown. */
const struct pp_policy *pp_find(const char *name);
/* Comma-separated names of every policy, for error messages. */
const char *pp_names(void);

#endif
