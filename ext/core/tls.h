/* tls.h - TLS over a connected socket (OpenSSL), independent of what the bytes
 * carry: the RESP port's pollers use the non-blocking calls, a thread that may
 * block (a replication link's sender or receiver) the blocking ones.
 *
 * A struct tls_ctx holds the certificate, key and CA of one side (server or
 * client) and is shared by every connection made from it (read-only once made:
 * any thread). A struct tls_conn belongs to the one thread that owns its socket.
 * The peer is untrusted: OpenSSL parses its records; failures come back as
 * -errno codes with the reason in tls_conn_error(). Renegotiation is refused.
 */
#ifndef KV_TLS_H
#define KV_TLS_H

#include <errno.h>
#include <stddef.h>
#include <sys/types.h>

/* tls-auth-clients (Redis's values): no = no client certificate asked for;
 * optional = one is asked for and, if sent, must verify against the CA;
 * yes = one must be sent and verify. */
enum tls_auth { TLS_AUTH_NO = 0, TLS_AUTH_YES = 1, TLS_AUTH_OPTIONAL = 2 };

/* A call that cannot go on until the socket is writable (a read can need to
 * write: the handshake's answers). -EAGAIN means: until it is readable. */
#define TLS_WANT_WRITE (-EINPROGRESS)

struct tls_ctx;
struct tls_conn;

struct tls_opts {
    int server;              /* 1: accepting side, 0: connecting side */
    const char *cert_file;   /* PEM certificate (chain); server: required; client: optional */
    const char *key_file;    /* PEM private key of cert_file */
    const char *ca_file;     /* PEM CA certificate(s) the peer's certificate must chain to;
                                server: required unless auth is TLS_AUTH_NO; client: required */
    enum tls_auth auth;      /* server: whether clients must present a certificate */
    const char *psk_file;    /* server: pre-shared keys instead of certificates, one
                                "identity:hexkey" per line (GnuTLS psktool's format, as
                                nbdkit's --tls-psk reads it); cert_file is then optional
                                and auth must be TLS_AUTH_NO (the key authenticates) */
};

/* Parse a tls-auth-clients value ("yes", "no", "optional"): the enum, or -EINVAL. */
int tls_auth_parse(const char *s);

#define TLS_PSK_MAX 64         /* bytes of one pre-shared key */
#define TLS_PSK_ID_MAX 128     /* bytes of one PSK identity (user name) */

/* A context from o's files (loaded now: a bad file fails here, not at the first
 * connection). 0 or -errno with "what: why" in err. Control thread. */
int tls_ctx_new(struct tls_ctx **out, const struct tls_opts *o, char *err, size_t errlen);
void tls_ctx_free(struct tls_ctx *c);

/* A TLS connection over the connected socket fd (not owned: the caller closes it
 * after tls_conn_free). Nothing is sent yet: the handshake runs inside the first
 * tls_handshake/tls_read/tls_write. NULL when out of memory. */
struct tls_conn *tls_conn_new(struct tls_ctx *c, int fd);
/* Free it, sending a close_notify if that can be done without blocking. NULL is fine. */
void tls_conn_free(struct tls_conn *t);

/* ---- non-blocking (the socket is O_NONBLOCK) */

/* Advance the handshake: 0 once done, -EAGAIN (wait for readable), TLS_WANT_WRITE
 * (wait for writable), or -EPROTO/-ECONNRESET/... with the reason in tls_conn_error. */
int tls_handshake(struct tls_conn *t);
/* Up to n plaintext bytes (the handshake first, if not done): > 0 bytes read,
 * 0 the peer closed (close_notify or EOF), -EAGAIN, TLS_WANT_WRITE or -errno.
 * One call returns at most one TLS record (16 KiB); with n >= TLS_RECORD_MAX,
 * nothing of that record stays buffered inside OpenSSL afterwards. */
ssize_t tls_read(struct tls_conn *t, void *buf, size_t n);
/* Up to n bytes of buf: > 0 bytes taken, -EAGAIN (wait for readable),
 * TLS_WANT_WRITE or -errno. After a WANT, call again with the same bytes (at least
 * as many; buf may have moved). */
ssize_t tls_write(struct tls_conn *t, const void *buf, size_t n);

#define TLS_RECORD_MAX 16384  /* the most plaintext one TLS record carries (RFC 8446 5.1) */

/* ---- blocking (for threads that may wait: the socket may be either mode) */

/* The handshake, waiting at most timeout_ms overall. 0 or -errno (-ETIMEDOUT). */
int tls_handshake_wait(struct tls_conn *t, int timeout_ms);
/* Exactly n bytes in or out, each wait at most timeout_ms (< 0: forever).
 * 0, -ECONNRESET (peer closed before n), -ETIMEDOUT or -errno. */
int tls_read_full(struct tls_conn *t, void *buf, size_t n, int timeout_ms);
int tls_write_all(struct tls_conn *t, const void *buf, size_t n, int timeout_ms);

/* ---- about a connection */

/* Why the last call failed ("" if it did not). */
const char *tls_conn_error(const struct tls_conn *t);
/* 1 once the handshake is done. */
int tls_conn_ready(const struct tls_conn *t);
/* The protocol ("TLSv1.3") and cipher of an established connection, "" before. */
const char *tls_conn_version(const struct tls_conn *t);
const char *tls_conn_cipher(const struct tls_conn *t);

#endif
