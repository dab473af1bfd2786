/* tlsio.c - TLS on the RESP port for the pollers (see tlsio.h): the server
 * context from the tls-* settings, the TLS listeners, reads and writes with the
 * contract of read(2)/send(2), and the INFO lines. Reads untrusted bytes (the
 * TLS records, parsed by OpenSSL; the plaintext by the poller's RESP parser). */
#define _GNU_SOURCE
#include "frontend/tlsio.h"
#include "frontend/tcp.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/kvbuf.h"
#include "core/log.h"
#include "core/net.h"
#include "core/tls.h"
#include "engine/engine.h"

struct tlsio {
    struct kv_engine *eng;
    struct tls_ctx *ctx;
    int port_probed;                      /* the port is known to be ours (as tcp_listen's) */
    _Atomic uint64_t accepted, handshakes, failures;
};

static void info_server(void *arg, struct kvbuf *b)
{
    struct tlsio *io = arg;
    kvbuf_printf(b, "tls_port:%d\r\ntls_auth_clients:%s\r\n", io->eng->tls_port, io->eng->tls_auth);
}

static void info_stats(void *arg, struct kvbuf *b)
{
    struct tlsio *io = arg;
    kvbuf_printf(b, "tls_connections_received:%llu\r\ntls_handshakes:%llu\r\ntls_handshake_failures:%llu\r\n",
                 (unsigned long long)atomic_load_explicit(&io->accepted, memory_order_relaxed),
                 (unsigned long long)atomic_load_explicit(&io->handshakes, memory_order_relaxed),
                 (unsigned long long)atomic_load_explicit(&io->failures, memory_order_relaxed));
}

static void reset_stats(void *arg)
{
    struct tlsio *io = arg;
    atomic_store_explicit(&io->accepted, 0, memory_order_relaxed);
    atomic_store_explicit(&io->handshakes, 0, memory_order_relaxed);
    atomic_store_explicit(&io->failures, 0, memory_order_relaxed);
}

int tlsio_create(struct tlsio **out, struct kv_engine *eng, char *err, size_t errlen)
{
    const struct kv_config *cfg = &eng->cfg;
    *out = NULL;
    eng->tls_port = -1;
    if (cfg->tls_port < 0)
        return 0;
    if (cfg->tls_port > 65535) {
        snprintf(err, errlen, "tls-port must be between 0 and 65535, got %d", cfg->tls_port);
        return -EINVAL;
    }
    int auth = tls_auth_parse(cfg->tls_auth_clients);
    if (auth < 0) {
        snprintf(err, errlen, "tls-auth-clients: expected yes, no or optional, got '%s'", cfg->tls_auth_clients);
        return -EINVAL;
    }
    struct tlsio *io = calloc(1, sizeof *io);
    if (!io) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    io->eng = eng;
    struct tls_opts o = {.server = 1, .cert_file = cfg->tls_cert_file, .key_file = cfg->tls_key_file,
                         .ca_file = cfg->tls_ca_cert_file, .auth = (enum tls_auth)auth};
    int rc = tls_ctx_new(&io->ctx, &o, err, errlen);
    if (rc < 0) {
        free(io);
        return rc;
    }
    eng->tls_port = cfg->tls_port;
    eng->tls_auth = auth == TLS_AUTH_NO ? "no" : auth == TLS_AUTH_YES ? "yes" : "optional";
    eng_info_add(eng, "server", info_server, NULL, io);
    eng_info_add(eng, "stats", info_stats, reset_stats, io);
    *out = io;
    return 0;
}

void tlsio_free(struct tlsio *io)
{
    if (!io)
        return;
    tls_ctx_free(io->ctx);
    free(io);
}

int tlsio_listen(struct tlsio *io, int reuseport, char *err, size_t errlen)
{
    return tcp_listen_port(io->eng, &io->eng->tls_port, &io->port_probed, reuseport, "listen (TLS) on", err, errlen);
}

struct tlsio_conn *tlsio_conn_new(struct tlsio *io, int fd)
{
    struct tlsio_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->io = io;
    if (!(c->t = tls_conn_new(io->ctx, fd))) {
        free(c);
        return NULL;
    }
    atomic_fetch_add_explicit(&io->accepted, 1, memory_order_relaxed);
    return c;
}

void tlsio_conn_free(struct tlsio_conn *c)
{
    if (!c)
        return;
    tls_conn_free(c->t);
    free(c);
}

/* A connection whose handshake failed: counted and logged (rate-limited: anyone
 * can connect and send garbage), in Redis's words. */
static void handshake_failed(struct tlsio_conn *c, int fd)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(10);
    atomic_fetch_add_explicit(&c->io->failures, 1, memory_order_relaxed);
    char addr[64] = "?";
    if (kvlog_on(KVLOG_NOTICE))
        net_peer_addr(fd, addr, sizeof addr);
    kvlog_rated(&rate, KVLOG_NOTICE, "Error accepting a client connection: %s (addr=%s)", tls_conn_error(c->t),
                addr);
}

/* tls.h's code rc as read(2)/send(2)'s -1 + errno. */
static ssize_t as_syscall(struct tlsio_conn *c, int fd, ssize_t rc)
{
    if (rc >= 0)
        return rc;
    if (rc == TLS_WANT_WRITE) {
        c->want_write = 1;
        errno = EAGAIN;
        return -1;
    }
    if (rc != -EAGAIN && !c->established)
        handshake_failed(c, fd);
    errno = (int)-rc;
    return -1;
}

ssize_t tlsio_recv(struct tlsio_conn *c, int fd, void *buf, size_t room)
{
    if (!c)
        return read(fd, buf, room);
    c->want_write = 0;
    c->more = 0;
    size_t got = 0;
    /* Whole records only: each SSL_read is given room for the largest record, so
     * OpenSSL never keeps decrypted bytes that no epoll event would announce. */
    while (room - got >= TLS_RECORD_MAX) {
        ssize_t r = tls_read(c->t, (char *)buf + got, room - got);
        if (!c->established && tls_conn_ready(c->t)) {
            c->established = 1;
            atomic_fetch_add_explicit(&c->io->handshakes, 1, memory_order_relaxed);
        }
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (got) /* report the bytes; the EOF or error comes again at the next call */
            return (ssize_t)got;
        if (r == 0 && !c->established) {
            handshake_failed(c, fd);
            return 0;
        }
        return as_syscall(c, fd, r);
    }
    c->more = 1;
    return (ssize_t)got;
}

ssize_t tlsio_send(struct tlsio_conn *c, int fd, const void *buf, size_t n)
{
    if (!c)
        return send(fd, buf, n, MSG_NOSIGNAL);
    /* Writes happen only after requests were read, so after the handshake; a
     * WANT_READ here (renegotiation) cannot happen: it is refused (core/tls.c). */
    return as_syscall(c, fd, tls_write(c->t, buf, n));
}
