/* pollpolicy.c - the EPOLLOUT interest policies (see pollpolicy.h).
 * Pure functions of per-connection state; called only by the owning poller. */
#include "pollpolicy.h"

#include <stddef.h>
#include <string.h>

static int want_out_exact(struct pp_conn *st, int pending, int spurious)
{
    (void)st;
    (void)spurious;
    return pending;
}

static const struct pp_policy policies[] = {
    {"direct", 1, want_out_exact},
    {"strict", 0, want_out_exact},
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

const char *pp_names(void) { return "direct, strict"; }
