/* pollpolicy.c - the EPOLLOUT interest policies (see pollpolicy.h).
 * Pure functions of per-connection state; called only by the owning poller. */
#include "frontend/pollpolicy.h"

#include <stddef.h>
#include <string.h>

static int want_out_exact(struct pp_conn *st, int pending, int spurious)
{
    (void)st;
    (void)spurious;
    return pending;
}

/* FlexPoll (paper 002): adapt the interest set to the load, in user space.
 *
 * strict pays two epoll_ctl system calls per reply: EPOLLOUT in, EPOLLOUT out.
 * Leaving EPOLLOUT registered instead costs the spurious writable events that
 * arrive before the connection's next reply. The policy measures that cost per
 * connection instead of assuming it: it keeps the mean cost of the recent gaps
 * between replies, and keeps EPOLLOUT after a reply while that mean is below
 * what dropping it at once costs (the epoll_ctl pair, worth PP_FLEX_SPURIOUS
 * spurious events). A low mean is a high observed probability that the next
 * writable event has a reply to carry. Within a gap it drops EPOLLOUT after
 * PP_FLEX_SPURIOUS spurious events: so long a gap has cost what the epoll_ctl
 * pair would have, and counts double (it pays the pair too). A gap without
 * EPOLLOUT is not seen: it counts just under the break-even, so that after a
 * few replies the connection tries keeping EPOLLOUT again and follows a change
 * of its load. Busy connections never touch EPOLLOUT; one whose writable
 * events are mostly spurious turns into strict.
 *
 * With the edge-triggered registration the poller uses for this policy (see
 * pollpolicy.h) a writable event that comes with a request costs nothing and is
 * not spurious; only bare writable edges are, which steady request-reply
 * traffic does not cause: the mean stays 0 and EPOLLOUT stays registered.
 * a = the current gap's cost so far; b = the mean cost of a gap x 16 (moving
 * average, the newest gap weighing 1/4). */
static int want_out_flex(struct pp_conn *st, int pending, int spurious)
{
    const uint32_t even = PP_FLEX_SPURIOUS;
    if (pending)
        return 1;
    if (spurious) {
        if (st->a < even && ++st->a == even)
            st->a = 2 * even; /* dropped: the next reply pays the epoll_ctl pair too */
        return st->a < even;
    }
    /* A reply has just gone out in full: the gap before it is over. */
    st->b = st->b - st->b / 4 + st->a * 16 / 4;
    if (st->b < even * 16) {
        st->a = 0;
        return 1;
    }
    st->a = even - 1; /* the next gap goes unseen */
    return 0;
}

static const struct pp_policy policies[] = {
    {"direct", 1, 0, want_out_exact},
    {"strict", 0, 0, want_out_exact},
    {"flexpoll", 0, 1, want_out_flex},
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
