/* info.c - the INFO command: the engine's INFO registry (engine/engine.h) renders
 * the sections asked for; this sends them as one verbatim string. Runs on a
 * front-end thread; providers read other threads' counters with relaxed atomics
 * or their components' locks (statistics may be a moment stale). */
#include "cmd/cmd_int.h"
#include "engine/engine.h"

int cmd_info(struct cmd_client *c, int argc, const char **argv, const size_t *argl)
{
    struct kvbuf b = {0};
    eng_info_render(c->eng, argc, argv, argl, &b);
    int rc = resp_add_verbatim(c->out, c->resp, b.p ? b.p : "", b.len);
    kvbuf_free(&b);
    return rc;
}
