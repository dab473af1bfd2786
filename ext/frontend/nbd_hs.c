/* nbd_hs.c - the newstyle fixed handshake of an NBD connection: client flags,
 * then options (EXPORT_NAME, ABORT, LIST, INFO, GO, STRUCTURED_REPLY, STARTTLS)
 * until transmission. Runs on the connection's worker thread (nbd_conn.c calls
 * nbd_handshake with the bytes read). Untrusted input: proto/nbd.c parses it,
 * option data is bounded by NBD_MAX_OPT_LEN (longer options are skipped and
 * refused) and replies the client does not read stop the reading past
 * NBD_HS_MAX; a malformed handshake closes only its connection. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "core/tls.h"
#include "frontend/nbd_int.h"


/* Option replies the client has not read: past NBD_HS_MAX the connection stops
 * reading (one option's replies are at most a few KiB: GO sends each
 * information item once), so a client that never reads pins no more. */
int nbd_hs_full(const struct nbd_conn *c)
{
    return c->hs.len - c->hs_off > NBD_HS_MAX;
}

/* The connection leaves the handshake (in transmission, or closed). */
void nbd_hs_leave(struct nbd_conn *c)
{
    if (c->in_hs) {
        c->in_hs = 0;
        c->t->hs_conns--;
    }
}

/* ---- the handshake */

/* Refused handshakes are logged at WARNING, at most 20 lines per 10 s over all
 * threads (a client may send many; kvlog_rated takes its own lock). */
static struct kvlog_rate hs_rate = KVLOG_RATE_INIT(20);

static void opt_reply(struct nbd_conn *c, uint32_t opt, uint32_t type, const void *data, uint32_t len)
{
    uint8_t h[NBD_OPT_REPLY_LEN];
    nbd_enc_opt_reply(h, opt, type, len);
    if (kvbuf_append(&c->hs, h, sizeof h) < 0 || (len && kvbuf_append(&c->hs, data, len) < 0))
        nbd_conn_close(c);
}

static void opt_error(struct nbd_conn *c, uint32_t opt, uint32_t type, const char *msg)
{
    opt_reply(c, opt, type, msg, (uint32_t)strlen(msg));
}

static uint16_t tx_flags(const struct nbd_conn *c)
{
    const struct nbd_server *s = c->t->s;
    return (uint16_t)(NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM |
                      NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO | NBD_FLAG_CAN_MULTI_CONN |
                      (s->read_only ? NBD_FLAG_READ_ONLY : 0) | (c->structured ? NBD_FLAG_SEND_DF : 0));
}

static int name_ok(const struct nbd_server *s, const char *name, size_t n)
{
    return n == 0 || (strlen(s->export_name) == n && !memcmp(s->export_name, name, n));
}

static void info_reply(struct nbd_conn *c, uint32_t opt, uint16_t type, const void *p, size_t n)
{
    uint8_t b[2 + NBD_MAX_NAME];
    nbd_put16(b, type);
    memcpy(b + 2, p, n);
    opt_reply(c, opt, NBD_REP_INFO, b, (uint32_t)(2 + n));
}

static void opt_go(struct nbd_conn *c, uint32_t opt, const uint8_t *p, uint32_t len)
{
    struct nbd_server *s = c->t->s;
    struct nbd_opt_go go;
    if (nbd_parse_opt_go(p, len, &go) < 0)
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed request");
    if (!name_ok(s, go.name, go.name_len))
        return opt_error(c, opt, NBD_REP_ERR_UNKNOWN, "no such export");
    uint8_t b[12];
    nbd_put64(b, s->size);
    nbd_put16(b + 8, tx_flags(c));
    info_reply(c, opt, NBD_INFO_EXPORT, b, 10);
    int sent = 0; /* each item once, however often asked for (64 names would be 256 KiB) */
    for (int i = 0; i < go.ninfo; i++) {
        if (go.info[i] == NBD_INFO_NAME && !(sent & 1)) {
            sent |= 1;
            info_reply(c, opt, NBD_INFO_NAME, s->export_name, strlen(s->export_name));
        } else if (go.info[i] == NBD_INFO_DESCRIPTION && !(sent & 2) && s->description && *s->description) {
            sent |= 2;
            info_reply(c, opt, NBD_INFO_DESCRIPTION, s->description, strnlen(s->description, NBD_MAX_NAME));
        }
    }
    /* always: any alignment works (min 1), block_size is what avoids a read-modify-write */
    nbd_put32(b, 1);
    nbd_put32(b + 4, s->block_size);
    nbd_put32(b + 8, NBD_MAX_PAYLOAD);
    info_reply(c, opt, NBD_INFO_BLOCK_SIZE, b, 12);
    opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
    if (opt == NBD_OPT_GO) {
        c->phase = PH_TX;
        nbd_hs_leave(c);
    }
}

/* NBD_OPT_STARTTLS: ACK it in plain, then everything goes through TLS (the
 * handshake first: it runs inside the next reads). */
static void opt_starttls(struct nbd_conn *c, uint32_t opt, uint32_t len)
{
    struct nbd_server *s = c->t->s;
    if (!s->tls)
        return opt_error(c, opt, NBD_REP_ERR_POLICY, "TLS is not offered by this server (--tls off)");
    if (c->tls)
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "TLS is already on");
    if (len)
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "STARTTLS takes no data");
    if (c->in_off != c->in_len) {
        /* the client may only start TLS after the ACK: these bytes are neither */
        kvlog(KVLOG_VERBOSE, "NBD client %s: bytes after STARTTLS before its reply: closing", c->addr);
        NBD_ST(c->t, protocol_errors, 1);
        nbd_conn_close(c);
        return;
    }
    if (!(c->tls = tls_conn_new(s->tls, c->fd))) {
        kvlog(KVLOG_WARNING, "NBD client %s: out of memory for TLS: closing", c->addr);
        nbd_conn_close(c);
        return;
    }
    c->structured = 0; /* the protocol: what was agreed before TLS does not count */
    opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
}

/* One option whose data (len bytes at p) is all in. */
static void option(struct nbd_conn *c, uint32_t opt, const uint8_t *p, uint32_t len)
{
    struct nbd_server *s = c->t->s;
    if (s->tls_mode == NBD_TLS_REQUIRE && !c->tls && opt != NBD_OPT_STARTTLS && opt != NBD_OPT_ABORT) {
        /* FORCEDTLS: nothing about the export before TLS, and no transmission */
        NBD_ST(c->t, protocol_errors, 1);
        if (opt == NBD_OPT_EXPORT_NAME) { /* no error reply exists for it: the protocol says close */
            kvlog(KVLOG_VERBOSE, "NBD client %s: EXPORT_NAME before TLS (--tls require): closing", c->addr);
            nbd_conn_close(c);
            return;
        }
        return opt_error(c, opt, NBD_REP_ERR_TLS_REQD, "TLS is required: NBD_OPT_STARTTLS first (an nbds:// URL)");
    }
    switch (opt) {
    case NBD_OPT_EXPORT_NAME: {
        if (!name_ok(s, (const char *)p, len)) { /* this option has no error reply: the protocol says close */
            kvlog_rated(&hs_rate, KVLOG_WARNING, "NBD client %s: unknown export requested: closing", c->addr);
            nbd_conn_close(c);
            return;
        }
        uint8_t b[134];
        size_t n = nbd_enc_export_name_reply(b, s->size, tx_flags(c), c->no_zeroes);
        if (kvbuf_append(&c->hs, b, n) < 0)
            nbd_conn_close(c);
        c->phase = PH_TX;
        nbd_hs_leave(c);
        return;
    }
    case NBD_OPT_ABORT:
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        c->phase = PH_CLOSING;
        return;
    case NBD_OPT_LIST: {
        if (len)
            return opt_error(c, opt, NBD_REP_ERR_INVALID, "LIST takes no data");
        uint8_t b[4 + NBD_MAX_NAME];
        size_t n = strnlen(s->export_name, NBD_MAX_NAME);
        nbd_put32(b, (uint32_t)n);
        memcpy(b + 4, s->export_name, n);
        opt_reply(c, opt, NBD_REP_SERVER, b, (uint32_t)(4 + n));
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        return;
    }
    case NBD_OPT_STARTTLS:
        return opt_starttls(c, opt, len);
    case NBD_OPT_INFO:
    case NBD_OPT_GO:
        return opt_go(c, opt, p, len);
    case NBD_OPT_STRUCTURED_REPLY:
        if (len)
            return opt_error(c, opt, NBD_REP_ERR_INVALID, "STRUCTURED_REPLY takes no data");
        c->structured = 1;
        opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
        return;
    default:
        return opt_error(c, opt, NBD_REP_ERR_UNSUP, "option not supported");
    }
}

/* One handshake step from the input: 1 progress, 0 need more bytes. */
int nbd_handshake(struct nbd_conn *c)
{
    const uint8_t *p = c->in + c->in_off;
    size_t avail = c->in_len - c->in_off;
    if (c->phase == PH_FLAGS) {
        uint32_t flags;
        int n = nbd_parse_client_flags(p, avail, &flags);
        if (n <= 0) {
            if (n < 0) {
                kvlog_rated(&hs_rate, KVLOG_WARNING, "NBD client %s: unknown client flags %#x: closing", c->addr,
                            flags);
                NBD_ST(c->t, protocol_errors, 1);
                nbd_conn_close(c);
            }
            return 0;
        }
        c->in_off += (size_t)n;
        c->no_zeroes = !!(flags & NBD_FLAG_C_NO_ZEROES);
        c->phase = PH_OPTS;
        return 1;
    }
    if (nbd_hs_full(c)) {
        c->paused = 1; /* conn_flush resumes once the client has read its replies */
        return 0;
    }
    struct nbd_opt_hdr h;
    int n = nbd_parse_opt_hdr(p, avail, &h);
    if (n < 0) {
        kvlog_rated(&hs_rate, KVLOG_WARNING, "NBD client %s: bad option magic: closing", c->addr);
        NBD_ST(c->t, protocol_errors, 1);
        nbd_conn_close(c);
        return 0;
    }
    if (n == 0)
        return 0;
    if (h.length > NBD_MAX_OPT_LEN) {
        c->in_off += (size_t)n;
        NBD_ST(c->t, protocol_errors, 1);
        if (h.option == NBD_OPT_EXPORT_NAME) { /* no error reply exists for it */
            nbd_conn_close(c);
            return 0;
        }
        c->skip = h.length;
        opt_error(c, h.option, NBD_REP_ERR_TOO_BIG, "option data too long");
        return 1;
    }
    if (avail < (size_t)n + h.length)
        return 0;
    c->in_off += (size_t)n + h.length;
    option(c, h.option, p + n, h.length);
    return 1;
}
