/* frontend.c - the table of front ends (see frontend.h). */
#include "frontend/frontend.h"

#include <string.h>

static const struct kv_frontend_ops *const frontends[] = {
    &fe_poller,
    &fe_threadpool,
    &fe_udp,
    &fe_nbd, /* not an arch's: server.c adds it when kv_config.nbd is set */
#ifdef KV_HAVE_DPDK
    &fe_dpdk,
#endif
};

const struct kv_frontend_ops *fe_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof frontends / sizeof frontends[0]; i++)
        if (!strcmp(frontends[i]->name, name))
            return frontends[i];
    return NULL;
}
