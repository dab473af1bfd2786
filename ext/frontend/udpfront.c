/* udpfront.c - one datagram's request, for both UDP front ends (see udpfront.h).
 * Parses untrusted bytes: the frame header and the RESP payload are bounded by the
 * datagram's length; the request must be exactly one RESP request. */
#include "frontend/udpfront.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/counter.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "frontend/frontend.h"

void uf_init(struct uf_worker *w, struct kv_engine *eng, int index, int evfd, const char *addr)
{
    memset(w, 0, sizeof *w);
    w->eng = eng;
    w->evfd = evfd;
    resp_parser_init(&w->rp);
    ses_init(&w->ses, eng, &w->out, addr, index, evfd); /* CLIENT INFO: the worker's index */
    w->ses.cl.datagram = 1;
}

void uf_free(struct uf_worker *w)
{
    resp_parser_free(&w->rp);
    kvbuf_free(&w->out);
    resp_args_free(&w->args);
    ses_free(&w->ses);
}

static int error_reply(struct uf_worker *w, const char *msg)
{
    w->out.len = 0;
    resp_add_error(&w->out, msg);
    w->flags |= KVU_F_ERROR;
    w->ses.need = 0;
    return UF_REPLY;
}

/* Dispatch the parsed request (again, after a stall). */
int uf_resume(struct uf_worker *w)
{
    int r = ses_run(&w->ses, w->argc, w->args.argv, w->args.argl);
    if (r < 0)
        return error_reply(w, "ERR out of memory");
    if (r == SES_STALL) {
        st_inc(&w->st.stalls, 1);
        return UF_STALL;
    }
    st_inc(&w->st.requests, 1);
    return UF_REPLY;
}

/* The framed operations' arguments (udpfront.h), parsed from p[0..len) into
 * w->args: "xadd-batch" KEY FIELD V1 .. Vk, or "xpull" KEY NO. 0, or -1 malformed. */
static int parse_framed(struct uf_worker *w, uint16_t flags, const uint8_t *p, size_t len)
{
    const uint8_t *end = p + len;
    if (len < 2)
        return -1;
    size_t klen = get_be16(p);
    p += 2;
    if (klen == 0 || klen > (size_t)(end - p))
        return -1;
    const char *key = (const char *)p;
    p += klen;
    if (flags == KVU_F_PULL) {
        if (end - p < 8)
            return -1; /* what follows the number is padding (room for the answer), ignored */
        if (resp_args_reserve(&w->args, 3))
            return -1;
        w->args.argv[0] = "xpull", w->args.argl[0] = 5;
        w->args.argv[1] = key, w->args.argl[1] = klen;
        w->args.argv[2] = (const char *)p, w->args.argl[2] = 8;
        w->argc = 3;
        return 0;
    }
    if (end - p < 4)
        return -1;
    size_t flen = get_be16(p);
    p += 2;
    if (flen == 0 || flen + 2 > (size_t)(end - p))
        return -1;
    const char *field = (const char *)p;
    p += flen;
    size_t count = get_be16(p);
    p += 2;
    if (count == 0 || count > KVU_MAX_BATCH || resp_args_reserve(&w->args, (int)count + 3))
        return -1;
    w->args.argv[0] = "xadd-batch", w->args.argl[0] = 10;
    w->args.argv[1] = key, w->args.argl[1] = klen;
    w->args.argv[2] = field, w->args.argl[2] = flen;
    for (size_t i = 0; i < count; i++) {
        if (end - p < 2)
            return -1;
        size_t n = get_be16(p);
        p += 2;
        if (n > (size_t)(end - p))
            return -1;
        w->args.argv[3 + i] = (const char *)p, w->args.argl[3 + i] = n;
        p += n;
    }
    if (p != end)
        return -1;
    w->argc = (int)count + 3;
    return 0;
}

int uf_run(struct uf_worker *w, uint8_t *p, size_t len)
{
    if (len < KVU_HDR_LEN)
        return UF_BAD;
    uint16_t flags = get_be16(p + 6);
    if (flags && flags != KVU_F_XADD && flags != KVU_F_PULL)
        return UF_BAD; /* a reply, or a flag this version does not know */
    char *req = (char *)p + KVU_HDR_LEN;
    len -= KVU_HDR_LEN;
    const char *pass = w->eng->cfg.requirepass;
    struct cmd_client *cl = &w->ses.cl;
    w->out.len = 0;
    w->flags = flags; /* the reply's: REPLY | the request's operation */
    w->ses.need = 0;
    w->ses.again = 0;
    /* A datagram is its own connection: no state survives it (AUTH, HELLO 3,
     * CLIENT SETNAME would otherwise leak to every later sender on this worker). */
    cl->authenticated = !(pass && *pass);
    cl->resp = 2;
    cl->close_after_reply = 0;
    cl->resume_i = 0;
    cl->internal = flags != 0;
    if (flags)
        return parse_framed(w, flags, (const uint8_t *)req, len) ? UF_BAD : uf_resume(w);
    resp_reset(&w->rp);
    w->rp.unauth = !cl->authenticated;
    int rc = resp_parse(&w->rp, req, len);
    if (rc == RESP_ERROR) {
        resp_add_errorf(&w->out, "ERR Protocol error: %s", w->rp.err);
        w->flags |= KVU_F_ERROR;
        return UF_REPLY;
    }
    if (rc == RESP_AGAIN || w->rp.scan != len || w->rp.argc == 0)
        return error_reply(w, rc == RESP_AGAIN ? "ERR invalid request: incomplete RESP request in datagram"
                              : w->rp.argc == 0 ? "ERR invalid request: empty request"
                                                : "ERR invalid request: more than one request in datagram");
    int argc = w->rp.argc;
    if (resp_args_reserve(&w->args, argc))
        return error_reply(w, "ERR out of memory");
    for (int i = 0; i < argc; i++) {
        w->args.argv[i] = req + w->rp.argv[i].off;
        w->args.argl[i] = w->rp.argv[i].len;
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
    struct wal *log = w->eng->wal;
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

static void info_server(void *arg, struct kvbuf *b)
{
    struct uf_info *in = arg;
    kvbuf_printf(b, "udp_port:%d\r\nudp_workers:%d\r\n", *in->port, in->workers);
}

static void info_stats(void *arg, struct kvbuf *b)
{
    struct uf_info *in = arg;
    struct uf_totals u = {0};
    in->totals(in->arg, &u);
    kvbuf_printf(b,
                 "udp_rx_packets:%llu\r\nudp_tx_packets:%llu\r\nudp_requests:%llu\r\n"
                 "udp_dropped_not_ours:%llu\r\nudp_tx_failed:%llu\r\nudp_bad_frames:%llu\r\n"
                 "udp_held_for_log:%llu\r\nudp_stalled:%llu\r\nudp_busy_us:%llu\r\n",
                 (unsigned long long)u.rx_packets, (unsigned long long)u.tx_packets,
                 (unsigned long long)u.requests, (unsigned long long)u.dropped, (unsigned long long)u.tx_failed,
                 (unsigned long long)u.bad_frames, (unsigned long long)u.held, (unsigned long long)u.stalls,
                 (unsigned long long)(u.busy_ns / 1000));
}

int uf_register_info(struct kv_engine *eng, struct uf_info *info)
{
    int rc = eng_info_add(eng, "server", info_server, NULL, info);
    return rc < 0 ? rc : eng_info_add(eng, "stats", info_stats, NULL, info);
}

void uf_add_stats(const struct uf_totals *u, struct fe_stats *st)
{
    st->udp_rx += u->rx_packets;
    st->udp_tx += u->tx_packets;
    st->udp_requests += u->requests;
    st->udp_dropped += u->dropped;
    st->udp_tx_failed += u->tx_failed;
    st->udp_bad += u->bad_frames;
    st->udp_held += u->held;
    st->udp_stalls += u->stalls;
    st->udp_busy_ns += u->busy_ns;
}
