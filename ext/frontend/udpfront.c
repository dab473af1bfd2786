/* udpfront.c - one datagram's request, for both UDP front ends (see udpfront.h).
 * Parses untrusted bytes: the frame header and the RESP payload are bounded by the
 * datagram's length; the request must be exactly one RESP request. */
#include "frontend/udpfront.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durability/bosc.h"
#include "server/server.h"
#include "core/table.h"
#include "durability/wal.h"

void uf_init(struct uf_worker *w, struct srv *s, struct kv_table *t, int index, int evfd, const char *addr)
{
    memset(w, 0, sizeof *w);
    w->srv = s;
    w->evfd = evfd;
    resp_parser_init(&w->rp);
    w->cl.resp = 2;
    w->cl.out = &w->out;
    w->cl.srv = s;
    w->cl.table = t;
    w->cl.poller = index; /* CLIENT INFO: the worker's index */
    snprintf(w->cl.addr, sizeof w->cl.addr, "%s", addr);
}

void uf_free(struct uf_worker *w)
{
    resp_parser_free(&w->rp);
    kvbuf_free(&w->out);
    free(w->argv);
    free(w->argl);
    free(w->cl.name);
}

static int error_reply(struct uf_worker *w, const char *msg)
{
    w->out.len = 0;
    resp_add_error(&w->out, msg);
    w->flags = KVU_F_ERROR;
    w->need = 0;
    return UF_REPLY;
}

/* Dispatch the parsed request (again, after a stall). */
int uf_resume(struct uf_worker *w)
{
    size_t reply_at = w->out.len;
    kvt_lsn_reset();
    if (cmd_dispatch(&w->cl, w->argc, w->argv, w->argl))
        return error_reply(w, "ERR out of memory");
    uint64_t touched = kvt_lsn_touched(); /* 0 without a log */
    if (touched > w->need)
        w->need = touched; /* a multi-key reply resumed after a load depends on every run */
    if (w->cl.stall) {
        const struct srv_config *cfg = srv_config(w->srv);
        if (w->cl.stall == CMD_STALL_LOAD)
            bosc_request_load(cfg->bosc, w->cl.stall_key, w->cl.stall_klen, w->evfd); /* ENOMEM: the timed retry */
        else if (w->cl.stall == CMD_STALL_MEM)
            bosc_kick(cfg->bosc);
        /* CMD_STALL_SYNC: requested already; every sweep wakes us */
        w->cl.stall = CMD_STALL_NONE;
        if (!w->cl.resume_i) /* MGET's reply so far stays: it carries on from resume_i */
            w->out.len = reply_at;
        uf_inc(&w->st.stalls, 1);
        return UF_STALL;
    }
    uf_inc(&w->st.requests, 1);
    return UF_REPLY;
}

int uf_run(struct uf_worker *w, uint8_t *p, size_t len)
{
    if (len < KVU_HDR_LEN)
        return UF_BAD;
    if (p[6] | p[7])
        return UF_BAD; /* a reply, or a flag this version does not know */
    char *req = (char *)p + KVU_HDR_LEN;
    len -= KVU_HDR_LEN;
    const char *pass = srv_config(w->srv)->requirepass;
    w->out.len = 0;
    w->flags = 0;
    w->need = 0;
    /* A datagram is its own connection: no state survives it (AUTH, HELLO 3,
     * CLIENT SETNAME would otherwise leak to every later sender on this worker). */
    w->cl.authenticated = !(pass && *pass);
    w->cl.resp = 2;
    w->cl.close_after_reply = 0;
    w->cl.resume_i = 0;
    resp_reset(&w->rp);
    w->rp.unauth = !w->cl.authenticated;
    int rc = resp_parse(&w->rp, req, len);
    if (rc == RESP_ERROR) {
        resp_add_errorf(&w->out, "ERR Protocol error: %s", w->rp.err);
        w->flags = KVU_F_ERROR;
        return UF_REPLY;
    }
    if (rc == RESP_AGAIN || w->rp.scan != len || w->rp.argc == 0)
        return error_reply(w, rc == RESP_AGAIN ? "ERR invalid request: incomplete RESP request in datagram"
                              : w->rp.argc == 0 ? "ERR invalid request: empty request"
                                                : "ERR invalid request: more than one request in datagram");
    int argc = w->rp.argc;
    if (argc > w->argcap) {
        int cap = argc < 64 ? 64 : argc;
        const char **v = realloc(w->argv, (size_t)cap * sizeof *v);
        if (v)
            w->argv = v;
        size_t *l = v ? realloc(w->argl, (size_t)cap * sizeof *l) : NULL;
        if (!l)
            return error_reply(w, "ERR out of memory");
        w->argl = l;
        w->argcap = cap;
    }
    for (int i = 0; i < argc; i++) {
        w->argv[i] = req + w->rp.argv[i].off;
        w->argl[i] = w->rp.argv[i].len;
    }
    w->argc = argc;
    return uf_resume(w);
}

size_t uf_frame_reply(struct uf_worker *w, uint8_t *dst, const uint8_t *req, size_t room)
{
    uint16_t flags = w->flags | KVU_F_REPLY;
    size_t max = (room < KVU_MAX_PAYLOAD ? room : KVU_MAX_PAYLOAD) - KVU_HDR_LEN;
    if (w->out.len > max) {
        size_t big = w->out.len;
        w->out.len = 0;
        resp_add_errorf(&w->out, "ERR reply too large for a UDP datagram (%zu bytes, at most %zu); use TCP", big,
                        max);
        flags |= KVU_F_ERROR;
    }
    memmove(dst, req, 4); /* the id */
    dst[4] = dst[5] = 0;  /* seq 0: the whole reply is this datagram */
    dst[6] = (uint8_t)(flags >> 8);
    dst[7] = (uint8_t)flags;
    memcpy(dst + KVU_HDR_LEN, w->out.p, w->out.len);
    size_t n = KVU_HDR_LEN + w->out.len;
    kvbuf_shrink(&w->out, 64 * 1024);
    return n;
}

uint64_t uf_durable(struct uf_worker *w, int *failed)
{
    struct wal *log = srv_config(w->srv)->wal;
    *failed = log && wal_failed(log);
    return log ? wal_durable_lsn(log) : UINT64_MAX;
}

void uf_add_totals(const struct uf_stats *st, struct uf_totals *t)
{
    t->rx_packets += atomic_load_explicit(&st->rx_packets, memory_order_relaxed);
    t->tx_packets += atomic_load_explicit(&st->tx_packets, memory_order_relaxed);
    t->requests += atomic_load_explicit(&st->requests, memory_order_relaxed);
    t->dropped += atomic_load_explicit(&st->dropped, memory_order_relaxed);
    t->tx_failed += atomic_load_explicit(&st->tx_failed, memory_order_relaxed);
    t->bad_frames += atomic_load_explicit(&st->bad_frames, memory_order_relaxed);
    t->held += atomic_load_explicit(&st->held, memory_order_relaxed);
    t->stalls += atomic_load_explicit(&st->stalls, memory_order_relaxed);
    t->busy_ns += atomic_load_explicit(&st->busy_ns, memory_order_relaxed);
}
