/* pollpolicy.c - the EPOLLOUT interest policies (see pollpolicy.h).
 * Pure functions of per-connection state; called only by the owning poller. */
#include "pollpolicy.h"

#include <stddef.h>
#include <string.h>

static int want_out_exact(struct pp_conn *st, int pending, int spurious, uint32_t round)
{
    (void)st;
    (void)spurious;
    (void)round;
    return pending;
}

/* FlexPoll (paper 002): adapt the interest set to the load, in user space.
 *
 * Keeping EPOLLOUT registered on a connection with nothing to send costs one
 * spurious writable event per poll round (level-triggered epoll reports a
 * writable socket every time); dropping it and adding it back for the next
 * reply costs two epoll_ctl system calls. A spurious event is a few list
 * operations inside an epoll_wait the poller makes anyway; an epoll_ctl is a
 * system call of its own (several times the cost), so keeping pays off
 * while the gap until the next reply is short: we take PP_FLEX_ROUNDS rounds
 * as the break-even point.
 *
 * The gap is learnt per connection: a = the round of its last completed reply,
 * b = an exponentially weighted mean of the gaps between replies, in 1/16
 * rounds (weight 1/4 for the newest gap). After a reply, EPOLLOUT stays while
 * the mean gap is within the break-even point; a run of spurious rounds then
 * drops it once it reaches PP_FLEX_ROUNDS (the load went away). Under load,
 * replies follow each other within a round or two and EPOLLOUT is never
 * touched; when the load drops, the mean gap grows and the policy turns into
 * strict. Rounds, not time: a busy poller's rounds are longer, so the same
 * number of rounds covers more time exactly when more replies are in flight. */
static int want_out_flex(struct pp_conn *st, int pending, int spurious, uint32_t round)
{
    if (pending)
        return 1;
    uint32_t since = round - st->a;
    if (spurious)
        return since < PP_FLEX_ROUNDS && st->b <= PP_FLEX_ROUNDS * 16;
    /* a reply has just gone out in full (the first one has no gap to learn from) */
    uint32_t gap = !st->a ? 0 : since > 1024 ? 1024 : since;
    st->b = (st->b * 3 + gap * 16) / 4;
    st->a = round;
    return st->b <= PP_FLEX_ROUNDS * 16;
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
