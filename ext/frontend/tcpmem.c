/* tcpmem.c - a TCP connection's published state and memory (see tcpmem.h). */
#include "frontend/tcpmem.h"

#include <stdatomic.h>

#include "cmd/cmd.h"

int tcp_conn_publish(struct session *s, int64_t now_ms, const struct kvbuf *in, size_t in_off,
                     const struct resp_parser *rp, const struct kvbuf *out, size_t out_off, int events)
{
    size_t args = resp_parser_mem(rp);
    size_t holds = (size_t)s->hold_cap * sizeof *s->holds;
    ses_io(s, now_ms, in->len - in_off, in->cap - in->len, out->len - out_off, out->cap);
    atomic_store_explicit(&s->cl.events, events, memory_order_relaxed);
    return cmd_client_mem(&s->cl, now_ms, in->len - in_off + args, in->cap + args, out->len - out_off,
                          out->cap + holds) == CMD_MEM_CLOSE;
}
