/* pollpolicy.c - the EPOLLOUT interest policies (see pollpolicy.h).
 * Pure functions of per-connection state; called only by the owning poller. */
#include "pollpolicy.h"

#include <stddef.h>
#include <string.h>

static int want_out_exact(struct pp_conn *st, int pending, int spurious, uint32_t round, int idle)
{
    (void)st;
    (void)spurious;
    (void)round;
    (void)idle;
    return pending;
}

/* FlexPoll (paper 002): adapt the interest set to the load, in user space.
 *
 * strict pays two epoll_ctl system calls per reply: EPOLLOUT in, EPOLLOUT out.
 * Leaving EPOLLOUT registered instead costs one spurious writable event per
 * poll round while there is nothing to send (level-triggered epoll reports a
 * writable socket every time) — nearly free while the poller is busy anyway
 * (the event is one more entry in an epoll_wait that returns for real work),
 * but a busy loop once the poller would otherwise sleep.
 *
 * So flexpoll keeps EPOLLOUT after a reply while the load lasts: it drops it
 * when the poller's previous round read nothing (the load is gone: spurious
 * events would now be all that wakes it), or when the connection has had no
 * reply for PP_FLEX_ROUNDS rounds (this client went quiet while others keep
 * the poller busy: its spurious events would be pure overhead). Under load a
 * connection's next request follows its reply within a round or two and
 * EPOLLOUT is never touched; when the load drops the policy turns into strict.
 * a = the round of the connection's last completed reply. */
static int want_out_flex(struct pp_conn *st, int pending, int spurious, uint32_t round, int idle)
{
    if (pending)
        return 1;
    if (!spurious) { /* a reply has just gone out in full */
        st->a = round;
        return !idle;
    }
    return !idle && round - st->a < PP_FLEX_ROUNDS;
}

static const struct pp_policy policies[] = {
    {"direct", 1, want_out_exact},
    {"strict", 0, want_out_exact},
    {"flexpoll", 0, want_out_flex},
};

const struct pp_policy *pp_find(const char *name)
{
    if (!name || !*name)
        return &policies[0];
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
        if (strcmp(policies[i].name, name) == 0)
            return &policies[i];
    return NULL;
}

const char *pp_names(void) { return "direct, strict, flexpoll"; }
